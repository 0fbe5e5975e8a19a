#!/bin/bash
# The step log over a long run (issue 25's second target): saturated 10-step
# no-op load while dwarf.maintain() archives every closed flow once a minute
# (dwarf.archive_after = 0), then the same load without maintain.
#
#   bench/steplog-soak.sh PREFIX TREE          # as root; DURATION + RUN_ALONE + ~2 min
#   DURATION=240 RUN_ALONE=60 TAG=x bench/steplog-soak.sh PREFIX TREE    # a short check
#
# PREFIX: a relocated copy of PostgreSQL 15 with TREE's dwarf installed into it
# (as /work/tools/ptest.sh makes /opt/pg-NAME); TREE: the built source tree (its
# bench/dwarf-bench defines the graph).  Target: WAL per step with maintain
# <= 1.2x the run alone; steps/s of the last 5 minutes within 10% of the first
# 5; the live tables' size flat; beside the one-row durable commit ceiling at
# 32 clients measured in the same run.
#
# A fresh throwaway cluster, run as the postgres OS user on a unix socket
# under WORK (/var/tmp/soak-steplog, port 5497): initdb defaults plus
# shared_preload_libraries = dwarf, max_worker_processes = 32, fsync and
# synchronous_commit on, dwarf.workers = 2, dwarf.batch_size = 512,
# dwarf.archive_after = '0', log_autovacuum_min_duration = 0 (every
# autovacuum pass is counted from the log), EXTRA_CONF lines.  In order:
#
#  1. ceiling: pgbench bench/pgbench/reference.sql, REF_CLIENTS (32) clients,
#     REF_SECONDS (30) s, -M prepared (dwarf_bench.ref from dwarf-bench).
#  2. soak, DURATION (1800) s: the load (below) and a loop in its own session
#     calling SELECT dwarf.maintain() at every MAINTAIN_EVERY (60) s mark from
#     the start: a plain loop rather than pg_cron, with cron's behaviour (a pass
#     that overruns its minute makes the loop skip to the next mark, no
#     catch-up).  After each pass it reads the WAL position and the steps done,
#     so that WAL per step with maintain is measured over whole maintain cycles
#     (first pass's end to last pass's end: the same backlog waits at both).
#  3. alone, RUN_ALONE (300) s: the load goes on, maintain is no longer called.
#     WAL per step = LSN difference / steps over the phase.
#  4. the load stopped, its open flows waited for, the ceiling again; the
#     ratio uses the mean of the two.
#
# The load: pgbench bench/pgbench/create_capped.sql, CLIENTS (4) clients each
# creating PER_TXN (200) bench_linear_10 flows per transaction while fewer than
# CAP (4000) flows are open, else waiting 10 ms.  Bulk creates under a cap keep
# both workers' batches full (hundreds of ready steps each) with a bounded
# backlog; dwarf.run from 32 clients holds at most 32 flows in flight, which
# leaves the workers' batches short and measures the round trips instead.
#
# Every SAMPLE (10) s a CSV row: steps and flows closed per second
# (dwarf.graph_stats: committed counters, which count on when flows are
# archived), open flows, WAL (pg_current_wal_lsn) per step, checkpoints,
# pg_total_relation_size of dwarf.flow and dwarf.step_log with every partition
# attached to them (pg_partition_tree: the table itself when not partitioned),
# live and dead tuples and autovacuum passes of each (pg_stat_user_tables,
# summed over partitions), the archive's bytes (dwarf.storage), the last
# maintain pass (dwarf.maintain_log), CPU of the server and of everything else.
#
# Output under RESULTS (bench/results): steplog-soak-TAG.csv (the samples),
# steplog-soak-TAG.txt (the summary, also on stdout), steplog-soak-TAG-raw.txt
# (maintain passes, pgbench output, the server log's autovacuum, checkpoint and
# error lines).  The cluster is removed at the end (KEEP=1 leaves it stopped).
set -euo pipefail

PREFIX=${1:-${PREFIX:-}}
TREE=${2:-${TREE:-}}
DURATION=${DURATION:-1800}
RUN_ALONE=${RUN_ALONE:-300}
SAMPLE=${SAMPLE:-10}
MAINTAIN_EVERY=${MAINTAIN_EVERY:-60}
CLIENTS=${CLIENTS:-4}
PER_TXN=${PER_TXN:-200}
CAP=${CAP:-4000}
REF_CLIENTS=${REF_CLIENTS:-32}
REF_SECONDS=${REF_SECONDS:-30}
PORT=${PORT:-5497}
WORK=${WORK:-/var/tmp/soak-steplog}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-$HERE/results}
TAG=${TAG:-$(date -u +%Y%m%d-%H%M)}
KEEP=${KEEP:-0}
EXTRA_CONF=${EXTRA_CONF:-}
GRAPH=bench_linear_10
TCK=$(getconf CLK_TCK)

die() { echo "steplog-soak: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root (the server runs as postgres; CPU is read from /proc)"
[[ -n $PREFIX && -n $TREE ]] || die "usage: bench/steplog-soak.sh PREFIX TREE"
PGBIN=$PREFIX/usr/lib/postgresql/15/bin
[[ -x $PGBIN/postgres ]] || die "$PREFIX: no usr/lib/postgresql/15/bin/postgres"
LIB=$("$PGBIN/pg_config" --pkglibdir)
[[ $LIB == "$PREFIX"/* ]] || die "$PREFIX: pg_config --pkglibdir is $LIB, not inside the copy"
cmp -s "$TREE/dwarf.so" "$LIB/dwarf.so" || die "$LIB/dwarf.so is not $TREE/dwarf.so: install the tree into the copy"
[[ -x $TREE/bench/dwarf-bench ]] || die "$TREE/bench/dwarf-bench missing: make -C $TREE"
for v in DURATION RUN_ALONE SAMPLE MAINTAIN_EVERY CLIENTS PER_TXN CAP REF_CLIENTS REF_SECONDS; do
	[[ ${!v} =~ ^[0-9]+$ ]] && ((${!v} > 0)) || die "$v is ${!v}, not a positive integer"
done
((DURATION >= 4 * SAMPLE)) || die "DURATION ($DURATION) is under 4 samples of $SAMPLE s"

# The windows compared: the first and last EDGE s of the soak (5 minutes, or
# a quarter of a short run), and the size's flatness over the last FLAT s
# (20 minutes, or what follows the first EDGE in a short run)
EDGE=$((DURATION / 4 < 300 ? DURATION / 4 : 300))
FLAT=$((DURATION - EDGE < 1200 ? DURATION - EDGE : 1200))

SOCK=$WORK/sock
DATA=$WORK/data
LOG=$WORK/server.log
CSV=$RESULTS/steplog-soak-$TAG.csv
SUMMARY=$RESULTS/steplog-soak-$TAG.txt
RAW=$RESULTS/steplog-soak-$TAG-raw.txt
[[ ! -e $SOCK/.s.PGSQL.$PORT ]] || die "a server already listens on $SOCK port $PORT"
mkdir -p "$RESULTS"
rm -rf "$WORK"
mkdir -p "$WORK" "$SOCK"
chown postgres: "$WORK" "$SOCK"
chmod 755 "$WORK"
export PGHOST=$SOCK PGPORT=$PORT PGUSER=postgres PGDATABASE=bench
q() { timeout 300 "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

LOAD=
MAINT=
STARTED=0
cleanup() {
	[[ -n $LOAD ]] && kill "$LOAD" 2>/dev/null || true
	[[ -n $MAINT ]] && kill "$MAINT" 2>/dev/null || true
	wait 2>/dev/null || true
	if [[ $STARTED == 1 ]]; then
		runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1 || true
	fi
	[[ $KEEP == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "$*" | tee -a "$SUMMARY"; }
: >"$SUMMARY"
: >"$RAW"

# ---------------------------------------------------------------- the cluster
runuser -u postgres -- "$PGBIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$SOCK'
shared_preload_libraries = 'dwarf'
max_worker_processes = 32
fsync = on
synchronous_commit = on
dwarf.workers = 2
dwarf.batch_size = 512
dwarf.archive_after = '0'
log_autovacuum_min_duration = 0
log_checkpoints = on
$EXTRA_CONF
CONF
: >"$LOG"
chown postgres: "$LOG"
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
STARTED=1
PM=$(head -1 "$DATA/postmaster.pid")
q -d postgres -c "CREATE DATABASE bench"
q -c "CREATE EXTENSION dwarf"
for _ in $(seq 1 100); do
	[[ $(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = 'bench'") \
		== "$(q -c "SHOW dwarf.workers")" ]] && break
	sleep 0.1
done
"$TREE/bench/dwarf-bench" -dsn "host=$SOCK port=$PORT dbname=bench user=postgres" \
	-workload linear -steps 10 -reference -setup-only >>"$RAW" 2>&1
q -c "SELECT dwarf.maintain()" >/dev/null		# the partitions it makes ahead, before the clock starts

say "step log soak, $(date -u '+%Y-%m-%d %H:%M:%S') UTC"
say "server: $("$PGBIN/postgres" --version); dwarf.so md5 $(md5sum <"$LIB/dwarf.so" | cut -c1-12) from $TREE at" \
	"$(git -C "$TREE" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$TREE" diff --quiet HEAD -- src sql 2>/dev/null || echo ' (src/sql modified, or not a git tree)')"
say "settings: $(q -c "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings
	WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'max_worker_processes', 'max_wal_size',
	               'checkpoint_timeout', 'autovacuum', 'dwarf.workers', 'dwarf.batch_size', 'dwarf.archive_after',
	               'dwarf.retention')")"
say "load: pgbench create_capped.sql, $CLIENTS clients x $PER_TXN $GRAPH flows per transaction, at most ~$CAP open;" \
	"soak $DURATION s with dwarf.maintain() every $MAINTAIN_EVERY s (a loop), then $RUN_ALONE s without; a sample every $SAMPLE s"
say "machine: $(nproc) CPUs, load average at start $(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------- helpers
# CPU ticks of the postmaster and its children, alive or reaped by it
server_ticks() {
	{ cat /proc/[0-9]*/stat 2>/dev/null || true; } | sed -E 's/ \(.*\) / X /' |
		awk -v pm="$1" '$1 == pm || $4 == pm {t += $14 + $15 + $16 + $17} END {print t + 0}'
}
proc_ticks() { { cat "/proc/$1/stat" 2>/dev/null || true; } | sed -E 's/ \(.*\) / X /' | awk '{t += $14 + $15} END {print t + 0}'; }
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }

# The ceiling: one durable one-row UPDATE per transaction at REF_CLIENTS clients
reference() {			# label
	local r
	r=$(timeout $((REF_SECONDS + 60)) "$PGBIN/pgbench" -n -M prepared -f "$HERE/pgbench/reference.sql" \
		-c "$REF_CLIENTS" -j 2 -T "$REF_SECONDS" 2>&1) || { echo "$r" >>"$RAW"; echo "nan"; return; }
	printf '== reference (%s)\n%s\n' "$1" "$r" >>"$RAW"
	awk '/^tps = .*without initial connection time/ {print int($3 + 0.5)}' <<<"$r"
}

GS="(SELECT steps_run AS steps, flows_completed + flows_failed + flows_cancelled AS closed,
            flows_created - flows_completed - flows_failed - flows_cancelled AS open
       FROM dwarf.graph_stats WHERE graph = '$GRAPH')"
# one table with every partition attached to it: bytes, leaves, and pg_stat_user_tables' sums
# (pg_partition_tree of a table that is neither partitioned nor a partition is empty)
TABLE_SQL() {
	echo "(SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0) AS bytes, count(*) FILTER (WHERE t.isleaf) AS leaves,
	        coalesce(sum(s.n_live_tup), 0) AS live, coalesce(sum(s.n_dead_tup), 0) AS dead,
	        coalesce(sum(s.autovacuum_count), 0) AS av,
	        coalesce(extract(epoch FROM max(s.last_autovacuum))::numeric(16,1)::text, '') AS last_av
	   FROM (SELECT relid, isleaf FROM pg_partition_tree('$1')
	         UNION ALL SELECT '$1'::regclass, true WHERE NOT EXISTS (SELECT FROM pg_partition_tree('$1'))) t
	   LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid)"
}
SAMPLE_SQL="SELECT extract(epoch FROM clock_timestamp())::numeric(16,3), coalesce(g.steps, 0), coalesce(g.closed, 0),
	coalesce(g.open, 0), pg_current_wal_lsn() - '0/0'::pg_lsn,
	(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
	f.bytes, s.bytes, s.leaves, f.live + s.live, f.dead, s.dead, f.av, s.av, s.last_av,
	(SELECT coalesce((j->>'archive_flow_bytes')::bigint, 0) + coalesce((j->>'archive_step_bytes')::bigint, 0)
	   FROM (SELECT to_jsonb(v) AS j FROM dwarf.storage v) x),
	(SELECT count(*) FROM dwarf.maintain_log WHERE started_at >= to_timestamp(:t0)),
	coalesce(round(extract(epoch FROM m.took) * 1000)::text, ''), coalesce(m.result->>'moved_steps', ''),
	coalesce(m.result->>'more', '')
  FROM $(TABLE_SQL dwarf.flow) f, $(TABLE_SQL dwarf.step_log) s
  LEFT JOIN $GS g ON true
  LEFT JOIN (SELECT * FROM dwarf.maintain_log WHERE started_at >= to_timestamp(:t0)
              ORDER BY started_at DESC LIMIT 1) m ON true"

echo "t_s,phase,steps,steps_s,flows_closed_s,open_flows,wal_bytes,wal_bytes_per_step,checkpoints,live_flow_bytes,live_step_bytes,live_bytes,live_step_partitions,live_tuples,flow_dead_tuples,step_dead_tuples,flow_autovacuums,step_autovacuums,step_last_autovacuum_t,archive_bytes,maintain_passes,last_pass_ms,last_pass_moved_steps,last_pass_more,server_cores,other_cores,loadavg1" >"$CSV"

T0=
BASE=
PREV=
PREV_SRV=0 PREV_LOAD=0 PREV_MACH=0
# one CSV row: sample PHASE (the first call only sets the baseline)
sample() {
	local row srv ld mach
	row=$(q -F, -v t0="${T0:-0}" <<<"$SAMPLE_SQL")
	srv=$(server_ticks "$PM")
	ld=$([[ -n $LOAD ]] && proc_ticks "$LOAD" || echo 0)
	mach=$(machine_ticks)
	if [[ -n $PREV ]]; then
		awk -F, -v OFS=, -v t0="$T0" -v phase="$1" -v prev="$PREV" -v base="$BASE" -v tck="$TCK" \
			-v srv=$((srv - PREV_SRV)) -v ld=$((ld - PREV_LOAD)) -v mach=$((mach - PREV_MACH)) \
			-v la="$(cut -d' ' -f1 /proc/loadavg)" '
			{
				split(prev, p, ","); split(base, b, ",")
				dt = $1 - p[1]; steps = $2 - p[2]
				other = (mach - srv - ld) / tck / dt
				if (other < 0) other = 0
				printf "%.1f,%s,%.0f,%.0f,%.0f,%d,%.0f,%s,%d,%.0f,%.0f,%.0f,%d,%.0f,%.0f,%.0f,%d,%d,%s,%.0f,%d,%s,%s,%s,%.2f,%.2f,%s\n",
					$1 - t0, phase, $2 - b[2], steps / dt, ($3 - p[3]) / dt, $4, $5 - b[5],
					(steps > 0 ? sprintf("%.1f", ($5 - p[5]) / steps) : ""), $6 - b[6],
					$7, $8, $7 + $8, $9, $10, $11, $12, $13, $14, ($15 == "" ? "" : sprintf("%.1f", $15 - t0)),
					$16, $17, $18, $19, $20, srv / tck / dt, other, la
			}' <<<"$row" >>"$CSV"
	else
		BASE=$row
	fi
	PREV=$row
	PREV_SRV=$srv PREV_LOAD=$ld PREV_MACH=$mach
}
# sleep to the next SAMPLE mark since T0
tick() {
	sleep "$(awk -v t0="$T0" -v now="$(date +%s.%N)" -v e="$SAMPLE" 'BEGIN {n = int((now - t0) / e) + 1; print t0 + n * e - now}')"
}
elapsed() { awk -v t0="$T0" -v now="$(date +%s.%N)" 'BEGIN {printf "%d", now - t0}'; }

# dwarf.maintain() at every MAINTAIN_EVERY mark up to DURATION; after each
# pass one line in WORK/maintain.log: "k start_t end_t wall_ms took_ms
# moved_steps more wal_bytes steps" (took_ms and the rest of the result as
# the pass returned them, empty if it has no such key)
start_maintain() {
	(
		trap 'exit 0' TERM
		k=1
		while :; do
			now=$(date +%s.%N)
			k=$(awk -v t0="$T0" -v now="$now" -v e="$MAINTAIN_EVERY" -v k="$k" 'BEGIN {n = int((now - t0) / e + 0.999999); print (n > k ? n : k)}')
			((k * MAINTAIN_EVERY <= DURATION)) || exit 0
			sleep "$(awk -v t0="$T0" -v now="$(date +%s.%N)" -v at=$((k * MAINTAIN_EVERY)) 'BEGIN {d = t0 + at - now; print (d > 0 ? d : 0)}')"
			s=$(date +%s.%N)
			if r=$(q -F' ' -c "SELECT coalesce(r->>'took_ms', '-'), coalesce(r->>'moved_steps', '-'), coalesce(r->>'more', '-')
					FROM (SELECT dwarf.maintain() AS r) x" 2>&1); then
				e=$(date +%s.%N)
				after=$(q -F' ' -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, coalesce(g.steps, 0) FROM (SELECT 1) one LEFT JOIN $GS g ON true")
				echo "$k $(awk -v t0="$T0" -v s="$s" -v e="$e" 'BEGIN {printf "%.1f %.1f %.0f", s - t0, e - t0, (e - s) * 1000}') $r $after" >>"$WORK/maintain.log"
			else
				echo "$k ERROR $(tr '\n' ' ' <<<"$r")" >>"$WORK/maintain.log"
			fi
			k=$((k + 1))
		done
	) &
	MAINT=$!
}

# ---------------------------------------------------------------- 1. ceiling
REF1=$(reference before)
say "ceiling before: $REF1 tps (reference.sql, $REF_CLIENTS clients, $REF_SECONDS s)"

# ---------------------------------------------------------------- 2. soak
T0=$(date +%s.%N)
sample soak
"$PGBIN/pgbench" -n -M prepared -f "$HERE/pgbench/create_capped.sql" -D per_txn="$PER_TXN" -D cap="$CAP" \
	-c "$CLIENTS" -j 2 -T $((DURATION + RUN_ALONE + 600)) >"$WORK/load.out" 2>&1 &
LOAD=$!
start_maintain
while (($(elapsed) < DURATION)); do
	tick
	kill -0 "$LOAD" 2>/dev/null || die "the load exited: $(tail -5 "$WORK/load.out")"
	sample soak
done
while kill -0 "$MAINT" 2>/dev/null; do		# the last pass, if still under way
	tick
	sample soak-tail
done
wait "$MAINT" || true
MAINT=
say "soak ended after $(elapsed) s"

# ---------------------------------------------------------------- 3. alone
ALONE0=$(elapsed)
while (($(elapsed) < ALONE0 + RUN_ALONE)); do
	tick
	kill -0 "$LOAD" 2>/dev/null || die "the load exited: $(tail -5 "$WORK/load.out")"
	sample alone
done

# ---------------------------------------------------------------- 4. stop, ceiling
kill "$LOAD" 2>/dev/null || true		# (SIGINT is ignored by a background job)
wait "$LOAD" 2>/dev/null || true
LOAD=
OPEN=
for _ in $(seq 1 600); do
	OPEN=$(q -c "SELECT coalesce(g.open, 0) FROM (SELECT 1) one LEFT JOIN $GS g ON true")
	((OPEN <= 0)) && break
	sleep 0.5
done
say "load stopped; open flows after the drain: $OPEN"
# the second ceiling on a quiet server: no checkpoint or autovacuum of the run's tables under way
q -c "CHECKPOINT"
for _ in $(seq 1 600); do
	AVW=$(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
	((AVW == 0)) && break
	sleep 0.5
done
((AVW == 0)) || say "autovacuum workers still running after 300 s: $AVW"
REF2=$(reference after)
say "ceiling after: $REF2 tps"

# ---------------------------------------------------------------- raw output
{
	echo "== maintain passes: k start_t end_t wall_ms took_ms moved_steps more wal_bytes steps"
	cat "$WORK/maintain.log" 2>/dev/null || true
	echo "== load (pgbench create_capped.sql)"; cat "$WORK/load.out"
	echo "== server log: autovacuum passes per table"
	{ grep -oE 'automatic vacuum of table "[^"]+"' "$LOG" || true; } | sort | uniq -c | sort -rn
	echo "== server log: autovacuum and checkpoint lines"
	grep -E 'automatic vacuum of table|checkpoint complete|checkpoints are occurring' -A2 "$LOG" || true
	echo "== server log: ERROR, FATAL, PANIC, WARNING lines (grouped)"
	{ grep -E 'ERROR|FATAL|PANIC|WARNING' "$LOG" || true; } | sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //' |
		sort | uniq -c | sort -rn | head -30
} >>"$RAW"

# ---------------------------------------------------------------- summary
# the live tables and their partitions, if any: every dwarf.step* or dwarf.flow* but the archive's
AV_STEP=$({ grep -oE 'automatic vacuum of table "bench\.dwarf\.step[^"]*"' "$LOG" || true; } | grep -v "step_archive\|step_log_archive" | grep -c . || true)
AV_FLOW=$({ grep -oE 'automatic vacuum of table "bench\.dwarf\.flow[^"]*"' "$LOG" || true; } | grep -v flow_archive | grep -c . || true)
ERRS=$({ grep -E 'ERROR|PANIC' "$LOG" || true; } | grep -c . || true)
REF=$(awk -v a="$REF1" -v b="$REF2" 'BEGIN {printf "%d", (a + b) / 2 + 0.5}')

awk -F, -v dur="$DURATION" -v edge="$EDGE" -v flat="$FLAT" -v ref="$REF" -v cap="$CAP" -v mlog="$WORK/maintain.log" '
	function nearest(x,   i, best, bd, d) {	# the soak sample nearest time x
		best = 0
		for (i = 1; i <= n; i++) {
			if (ph[i] != "soak" && ph[i] != "start") continue
			d = (t[i] - x) ^ 2
			if (best == 0 || d < bd) { best = i; bd = d }
		}
		return best
	}
	function sortn(a, m,   i, j, v) {		# sorts a[1..m] ascending (mawk has no asort)
		for (i = 2; i <= m; i++) {
			v = a[i]
			for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]
			a[j + 1] = v
		}
	}
	function rate(a, b) { return (t[b] > t[a]) ? (st[b] - st[a]) / (t[b] - t[a]) : 0 }
	function walps(a, b) { return (st[b] > st[a]) ? (wal[b] - wal[a]) / (st[b] - st[a]) : 0 }
	function cpu(lo, hi, phase,   i, c, s) {	# server CPU us per step over rows lo < t <= hi of a phase
		for (i = 2; i <= n; i++)
			if (ph[i] == phase && t[i] > lo && t[i] <= hi) { c += srv[i] * (t[i] - t[i - 1]); s += st[i] - st[i - 1] }
		return s > 0 ? c * 1e6 / s : 0
	}
	NR == 1 { next }
	{
		n++; t[n] = $1; ph[n] = $2; st[n] = $3; open[n] = $6; wal[n] = $7; ck[n] = $9; live[n] = $12
		parts[n] = $13; fdead[n] = $15; sdead[n] = $16; fav[n] = $17; sav[n] = $18; srv[n] = $25; oth[n] = $26
	}
	END {
		# row 0: the baseline (t = 0, nothing counted yet)
		t[0] = 0; st[0] = 0; wal[0] = 0; ph[0] = "start"
		a0 = 0; a1 = nearest(edge); b0 = nearest(dur - edge); b1 = nearest(dur)
		r1 = rate(a0, a1); r2 = rate(b0, b1)
		printf "steps/s, first %d s (t = %d-%d): %.0f; last %d s (t = %d-%d): %.0f; ratio last/first %.3f (target 0.90-1.10)\n",
			edge, t[a0], t[a1], r1, edge, t[b0], t[b1], r2, (r1 > 0 ? r2 / r1 : 0)
		printf "steps/s over the soak (t = 0-%d): %.0f\n", t[b1], rate(0, b1)
		# WAL per step with maintain: whole cycles, first pass end to last pass end (from the maintain log)
		np = 0
		while ((getline line < mlog) > 0) {
			split(line, f, " ")
			if (f[2] == "ERROR") { perr++; continue }
			np++; pend[np] = f[3]; pms[np] = f[4]; ptook[np] = f[5]; pmoved[np] = f[6]; pmore[np] = f[7]
			pwal[np] = f[8]; psteps[np] = f[9]
			if (f[7] == "true") more++
			moved += f[6]
		}
		if (np >= 2 && psteps[np] > psteps[1]) {
			wm = (pwal[np] - pwal[1]) / (psteps[np] - psteps[1])
			printf "WAL/step with maintain, %d whole cycles (pass 1 end t = %.0f to pass %d end t = %.0f): %.1f B\n",
				np - 1, pend[1], np, pend[np], wm
		} else
			printf "WAL/step with maintain: fewer than 2 passes, no whole cycle\n"
		printf "WAL/step over the soak t = 0-%d (the backlog at its end not yet archived): %.1f B\n", t[b1], walps(0, b1)
		# the run alone
		for (i = 1; i <= n; i++) if (ph[i] == "alone") { if (!al0) al0 = i; al1 = i }
		if (al0 > 1) {
			al0--				# the phase starts at the sample before its first row
			wa = walps(al0, al1)
			printf "run alone (t = %d-%d, no maintain): %.0f steps/s, WAL/step %.1f B, checkpoints %d\n",
				t[al0], t[al1], rate(al0, al1), wa, ck[al1] - ck[al0]
			if (wm > 0 && wa > 0) {
				printf "WAL/step ratio, with maintain / alone: %.3f (target <= 1.2)\n", wm / wa
				# the ratio holds only if the passes kept up: what they moved in those cycles
				for (i = 2; i <= np; i++) cmoved += pmoved[i]
				cran = psteps[np] - psteps[1]
				printf "steps moved by passes 2-%d / steps run in those cycles: %.3f", np, cmoved / cran
				if (cmoved > 0)
					printf "; WAL of the archive per step moved (the run taken at the run alone at %.1f B/step): %.1f B, so run + archive if every step were moved: %.3fx the run alone",
						wa, ((pwal[np] - pwal[1]) - wa * cran) / cmoved, (wa + ((pwal[np] - pwal[1]) - wa * cran) / cmoved) / wa
				printf "\n"
			}
		}
		printf "checkpoints during the soak: %d\n", ck[b1]
		# live tables
		lo = -1; hi = 0
		for (i = 1; i <= b1; i++)
			if (t[i] >= dur - flat) { if (lo < 0 || live[i] < lo) lo = live[i]; if (live[i] > hi) hi = live[i] }
		printf "live dwarf.flow + dwarf.step over the last %d s of the soak: min %.1f MB, max %.1f MB (max/min %.2f); at t = %d: %.1f MB, at the end of the soak %.1f MB, at the end of the run alone %.1f MB\n",
			flat, lo / 1048576, hi / 1048576, (lo > 0 ? hi / lo : 0), t[a1], live[a1] / 1048576, live[b1] / 1048576, live[n] / 1048576
		printf "live step partitions (leaves of pg_partition_tree; 1 = not partitioned): %d at the start, %d at the end of the soak\n", parts[1], parts[b1]
		mx = 0; for (i = 1; i <= b1; i++) if (sdead[i] > mx) mx = sdead[i]
		printf "dead tuples in the live step log, max during the soak %d, at its end %d; in dwarf.flow at its end %d\n", mx, sdead[b1], fdead[b1]
		printf "autovacuum passes by the end of the soak (pg_stat_user_tables, summed over the partitions attached then): step log %d, flow table %d\n", sav[b1], fav[b1]
		# maintain
		if (np > 0) {
			for (i = 1; i <= np; i++) { tk[i] = (ptook[i] == "-" ? pms[i] : ptook[i]) + 0 }
			sortn(tk, np)
			printf "maintain passes: %d (%d errors), took median %.0f ms, max %.0f ms; moved %d steps; %d passes left more for the next\n",
				np, perr, tk[int((np + 1) / 2)], tk[np], moved, more
		}
		# open flows: saturation
		k = 0; for (i = 1; i <= b1; i++) { o[++k] = open[i]; if (open[i] >= cap / 2) full++ }
		sortn(o, k)
		printf "open flows during the soak: median %d (cap %d); samples with at least half the cap open: %d of %d\n", o[int((k + 1) / 2)], cap, full, k
		printf "server CPU per step: soak %.1f us, run alone %.1f us\n", cpu(0, t[b1], "soak"), (al0 ? cpu(t[al0], t[al1], "alone") : 0)
		mo = 0; for (i = 1; i <= n; i++) mo += oth[i]; printf "other load (not this server or its load driver), mean: %.2f cores\n", mo / n
		if (ref > 0) {
			printf "ceiling (mean of before and after): %d tps; steps/s / ceiling: first %.2fx, last %.2fx, soak %.2fx, run alone %.2fx\n",
				ref, r1 / ref, r2 / ref, rate(0, b1) / ref, (al0 ? rate(al0, al1) / ref : 0)
		}
	}' "$CSV" | tee -a "$SUMMARY"
say "autovacuum passes from the server log, whole run: live step log $AV_STEP, dwarf.flow $AV_FLOW (per table: $RAW)"
say "server log ERROR/PANIC lines: $ERRS"
say "samples: $CSV"
