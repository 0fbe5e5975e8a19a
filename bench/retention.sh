#!/bin/bash
# Retention at volume: saturated linear load while dwarf.maintain() archives
# closed flows every few seconds, until the archive holds STEPS_TARGET step rows.
#
#   bench/retention.sh                     # as root; 10 M archived step rows, ~15-25 min
#   STEPS_TARGET=300000 RESULTS=/tmp/r bench/retention.sh     # a quick check
#
# On a fresh throwaway cluster (initdb defaults, its own data directory under
# WORK and its own unix socket; shared_preload_libraries = 'dwarf',
# max_worker_processes = 32, fsync and synchronous_commit on) with
# ALTER DATABASE bench SET dwarf.archive_after = ARCHIVE_AFTER:
#
#  1. main: bench/dwarf-bench, open loop unpaced (-arrival-rate 0) with
#     MAX_OUTSTANDING flows in flight, 10-step no-op flows; a loop in its own
#     session calls SELECT dwarf.maintain() every MAINTAIN_EVERY s.  Every
#     SAMPLE_EVERY s one CSV row.  Ends when the maintain passes have moved
#     STEPS_TARGET step rows (sum of their moved_steps) or after TIME_LIMIT s.
#  2. history, under load: dwarf.history() of HISTORY_FLOWS archived flows
#     picked at random over the archive's id range, each timed by psql.
#  3. WAL with the archive on: WAL_SECONDS more of the same (load + maintain),
#     after a CHECKPOINT; WAL = pg_current_wal_lsn() difference.
#  4. WAL with the archive off: the maintain loop stopped, a CHECKPOINT, then
#     WAL_SECONDS of the same load alone.  Ratio on/off, same run, same tables.
#  5. history once more with the load stopped; final counts; server log check.
#
# Steps/s come from the workers' counters (sum of dwarf.worker_stats().steps);
# dwarf-bench's own steps_s counts rows in dwarf.step and so misses the rows
# maintain moves away: ignore it here.  Writes, under RESULTS (bench/results):
#   retention-TAG.csv            one row per sample (columns below)
#   retention-TAG.txt            the summary (also on stdout)
#   retention-TAG-raw.txt        driver output, maintain passes, history timings, server log lines
# and CHART (bench/charts/retention.svg): throughput and live-table size over the run.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
DWARF_TREE=${DWARF_TREE:-$HERE/..}		# the tree the installed dwarf was built from
BENCH=${BENCH:-$DWARF_TREE/bench/dwarf-bench}
WORK=${WORK:-/var/tmp/dwarf-retention}
PORT=${PORT:-5493}
STEPS_TARGET=${STEPS_TARGET:-10000000}
TIME_LIMIT=${TIME_LIMIT:-1800}			# main phase, seconds at most
ARCHIVE_AFTER=${ARCHIVE_AFTER:-10 s}
MAINTAIN_EVERY=${MAINTAIN_EVERY:-5}
SAMPLE_EVERY=${SAMPLE_EVERY:-10}
CONCURRENCY=${CONCURRENCY:-4}			# creator connections of the driver
PER_TXN=${PER_TXN:-20}					# flows each creator makes per transaction
MAX_OUTSTANDING=${MAX_OUTSTANDING:-4000}	# flows in flight
STEPS=${STEPS:-10}
EDGE_SECONDS=${EDGE_SECONDS:-60}		# "first minute" and "last minute" windows
WAL_SECONDS=${WAL_SECONDS:-120}
HISTORY_FLOWS=${HISTORY_FLOWS:-200}
RESULTS=${RESULTS:-$HERE/results}
CHART=${CHART:-$HERE/charts/retention.svg}
TAG=${TAG:-$(date -u +%Y%m%d-%H%M)}
KEEP=${KEEP:-0}							# 1: leave the cluster (stopped) in WORK
EXTRA_CONF=${EXTRA_CONF:-}				# more postgresql.conf lines, e.g. "max_wal_size = 8GB"

CSV=$RESULTS/retention-$TAG.csv
SUMMARY=$RESULTS/retention-$TAG.txt
RAW=$RESULTS/retention-$TAG-raw.txt
SOCK=$WORK/sock
DATA=$WORK/data
LOG=$WORK/server.log
TCK=$(getconf CLK_TCK)

die() { echo "retention: $*" >&2; exit 1; }

# The chart, from a CSV of this script: steps/s and archived rows; live
# tables' size and rows; CPU of the server and of everything else.
draw_chart() {			# csv chart title-tag
	local dat
	dat=$(mktemp)
	awk -F, 'NR > 1 { print $1 / 60, $3, ($12 + $13) / 1048576, $11 / 1000, $20 / 1e6, $22, $24 }' "$1" >"$dat"
	local marks
	marks=$(awk -F, 'NR > 1 && $2 != last { if (NR > 2) printf "set arrow from first %.3f, graph 0 to first %.3f, graph 1 nohead dt 2; set label \"%s\" at first %.3f, graph 0.93 left offset 0.3,0 font \",9\"; ", $1 / 60, $1 / 60, $2, $1 / 60; last = $2 }' "$1")
	gnuplot -e "set terminal svg size 1000,900 dynamic noenhanced font 'sans,11'; set output '$2';
		set multiplot layout 3,1 title 'dwarf: saturated 10-step linear load, dwarf.maintain() every $MAINTAIN_EVERY s, archive_after $ARCHIVE_AFTER ($3)';
		set grid; set key inside top left opaque font ',9'; set xlabel 'minutes since start'; set xrange [0:*];
		set lmargin at screen 0.08; set rmargin at screen 0.91;
		$marks
		set ylabel 'steps/s'; set yrange [0:*]; set y2label 'archived step rows (millions)'; set y2range [0:*]; set y2tics; set ytics nomirror;
		plot '$dat' using 1:2 with linespoints pt 7 ps 0.4 title 'steps/s',
		     '' using 1:5 axes x1y2 with lines lw 2 title 'archived step rows (M)';
		set ylabel 'MB'; set y2label 'live step rows (thousands)';
		plot '' using 1:3 with linespoints pt 7 ps 0.4 title 'dwarf.flow + dwarf.step MB',
		     '' using 1:4 axes x1y2 with lines title 'live dwarf.step rows (k)';
		unset y2label; unset y2tics; set ytics mirror; set ylabel 'CPU cores (of 2)'; set yrange [0:2];
		plot '' using 1:6 with lines title 'this server', '' using 1:7 with lines title 'other load';
		unset multiplot"
	rm -f "$dat"
}

if [[ -n ${CHART_ONLY:-} ]]; then		# CHART_ONLY=results/retention-TAG.csv: redraw only
	draw_chart "$CHART_ONLY" "$CHART" "$(basename "$CHART_ONLY" .csv | sed 's/^retention-//')"
	echo "wrote $CHART"
	exit 0
fi

[[ $(id -u) == 0 ]] || die "run as root (the server runs as postgres; CPU is read from /proc)"
[[ -x $BENCH ]] || die "$BENCH missing: make -C $DWARF_TREE bench/dwarf-bench"
command -v gnuplot >/dev/null || die "gnuplot missing (scripts/deps.sh)"
[[ -x $PGBIN/initdb ]] || die "$PGBIN: no initdb"
[[ ! -e $SOCK/.s.PGSQL.$PORT ]] || die "a server already listens on $SOCK port $PORT"
mkdir -p "$RESULTS" "$(dirname "$CHART")"

rm -rf "$WORK"
mkdir -p "$WORK" "$SOCK"
chown postgres: "$WORK" "$SOCK"
chmod 755 "$WORK"
export PGHOST=$SOCK PGPORT=$PORT PGUSER=postgres PGDATABASE=bench
q() { timeout 300 "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

DRIVER=
MAINT=
STARTED=0
cleanup() {
	[[ -n $DRIVER ]] && kill "$DRIVER" 2>/dev/null || true
	[[ -n $MAINT ]] && kill "$MAINT" 2>/dev/null || true
	wait 2>/dev/null || true
	if [[ $STARTED == 1 ]]; then
		runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1 || true
	fi
	[[ $KEEP == 1 ]] || rm -rf "$DATA"
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
$EXTRA_CONF
CONF
: >"$LOG"
chown postgres: "$LOG"
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
STARTED=1
PM=$(head -1 "$DATA/postmaster.pid")
q -d postgres -c "CREATE DATABASE bench"
q -d postgres -c "ALTER DATABASE bench SET dwarf.archive_after = '$ARCHIVE_AFTER'"
q -c "CREATE EXTENSION dwarf"
for _ in $(seq 1 100); do
	[[ $(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = 'bench'") \
		== "$(q -c "SHOW dwarf.workers")" ]] && break
	sleep 0.1
done
"$BENCH" -workload linear -steps "$STEPS" -setup-only >>"$RAW" 2>&1
q -c "SELECT dwarf.maintain()" >/dev/null		# today's and the next days' partitions

DSO=$("$PGBIN/pg_config" --pkglibdir)/dwarf.so
DSO_MD5=$(md5sum <"$DSO" | cut -c1-12)
EXT_SQL=$("$PGBIN/pg_config" --sharedir)/extension/dwarf--0.1.sql
say "retention at volume, $(date -u '+%Y-%m-%d %H:%M:%S') UTC"
say "server: $("$PGBIN/postgres" --version); dwarf.so $(stat -c '%y' "$DSO" | cut -c1-19) md5 $DSO_MD5" \
	"($( [[ -f $DWARF_TREE/dwarf.so ]] && cmp -s "$DSO" "$DWARF_TREE/dwarf.so" && echo "same as the tree's build" || echo "NOT the tree's build"));" \
	"extension SQL $(cmp -s "$EXT_SQL" "$DWARF_TREE/sql/dwarf--0.1.sql" && echo "same as the tree's" || echo "NOT the tree's");" \
	"tree $DWARF_TREE at $(if [[ -f $DWARF_TREE/.commit ]]; then echo "$(cut -c1-7 "$DWARF_TREE/.commit") (git archive)";
		else git -C "$DWARF_TREE" rev-parse --short HEAD 2>/dev/null || echo '?';
			git -C "$DWARF_TREE" diff --quiet HEAD -- src sql 2>/dev/null || echo ' (src/sql modified)'; fi | tr -d '\n')"
say "settings: $(q -c "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings
	WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'max_worker_processes', 'max_wal_size',
	               'checkpoint_timeout', 'dwarf.workers', 'dwarf.batch_size', 'dwarf.archive_after', 'dwarf.retention')")"
say "load: $STEPS-step no-op flows, dwarf-bench open loop unpaced, $CONCURRENCY creators of $PER_TXN flows per transaction, at most $MAX_OUTSTANDING in flight;" \
	"dwarf.maintain() every $MAINTAIN_EVERY s; target $STEPS_TARGET archived step rows or $TIME_LIMIT s"
say "machine: $(nproc) CPUs, load average at start $(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------- sampling
# CPU ticks of the postmaster and its children, alive or reaped by it
server_ticks() {
	{ cat /proc/[0-9]*/stat 2>/dev/null || true; } | sed -E 's/ \(.*\) / X /' |
		awk -v pm="$1" '$1 == pm || $4 == pm {t += $14 + $15 + $16 + $17} END {print t + 0}'
}
proc_ticks() { { cat "/proc/$1/stat" 2>/dev/null || true; } | sed -E 's/ \(.*\) / X /' | awk '{t += $14 + $15} END {print t + 0}'; }
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }

SAMPLE_SQL="SELECT extract(epoch FROM clock_timestamp())::numeric(16,3),
	(SELECT coalesce(sum(steps), 0) FROM dwarf.worker_stats()),
	(SELECT coalesce(sum(flows_closed), 0) FROM dwarf.worker_stats()),
	(SELECT last_value FROM dwarf.step_seq),
	pg_current_wal_lsn() - '0/0'::pg_lsn,
	(SELECT wal_fpi FROM pg_stat_wal),
	(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
	(SELECT count(*) FROM dwarf.flow),
	(SELECT count(*) FROM dwarf.flow WHERE status = 'running'),
	(SELECT count(*) FROM dwarf.step),
	pg_total_relation_size('dwarf.flow'),
	(SELECT live_step_bytes FROM dwarf.storage),
	(SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
	  WHERE relid IN (SELECT relid FROM pg_partition_tree('dwarf.step_log'))),
	(SELECT count(*) FROM dwarf.maintain_log),
	(SELECT coalesce(sum((result->>'moved_flows')::bigint), 0) FROM dwarf.maintain_log),
	(SELECT coalesce(sum((result->>'moved_steps')::bigint), 0) FROM dwarf.maintain_log),
	(SELECT coalesce(round(extract(epoch FROM took) * 1000), 0) FROM dwarf.maintain_log ORDER BY started_at DESC LIMIT 1),
	(SELECT coalesce(bool_or((result->>'more')::boolean), false) FROM dwarf.maintain_log),
	(SELECT archive_flow_bytes + archive_step_bytes FROM dwarf.storage)"

echo "t_s,phase,steps_s,step_rows_s,flows_s,wal_bytes_per_step,fpi_per_step,checkpoints,live_flows,running,live_steps,live_flow_bytes,live_step_bytes,step_dead_tup,maintain_passes,passes_in_interval,max_pass_ms_in_interval,last_pass_ms,archived_flows,archived_steps,archive_bytes,server_cores,driver_cores,other_cores,loadavg1" >"$CSV"

T0=
PREV=
PREV_SRV=0 PREV_DRV=0 PREV_MACH=0
SAMPLE=
# one row: sample <phase>; sets SAMPLE to the raw query row
sample() {
	local row srv drv mach la
	row=$(q -F, -c "$SAMPLE_SQL")
	srv=$(server_ticks "$PM")
	drv=$([[ -n $DRIVER ]] && proc_ticks "$DRIVER" || echo 0)
	mach=$(machine_ticks)
	la=$(cut -d' ' -f1 /proc/loadavg)
	if [[ -z $T0 ]]; then
		T0=${row%%,*}
	fi
	if [[ -n $PREV ]]; then
		# max pass duration among the passes that ended in the interval
		local prev_t=${PREV%%,*} maxms
		maxms=$(q -c "SELECT coalesce(round(max(extract(epoch FROM took)) * 1000), 0), count(*) FROM dwarf.maintain_log
			WHERE started_at + took > to_timestamp($prev_t)")
		awk -F, -v OFS=, -v t0="$T0" -v phase="$1" -v prev="$PREV" -v tck="$TCK" -v mx="$maxms" \
			-v srv=$((srv - PREV_SRV)) -v drv=$((drv - PREV_DRV)) -v mach=$((mach - PREV_MACH)) -v la="$la" '
			{
				split(prev, p, ",")
				dt = $1 - p[1]
				steps = $2 - p[2]
				split(mx, m, "|")
				other = (mach - srv - drv) / tck / dt
				if (other < 0) other = 0
				printf "%.1f,%s,%.0f,%.0f,%.0f,%.0f,%.3f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.2f,%.2f,%.2f,%s\n",
					$1 - t0, phase, steps / dt, ($4 - p[4]) / dt, ($3 - p[3]) / dt,
					(steps > 0 ? ($5 - p[5]) / steps : 0), (steps > 0 ? ($6 - p[6]) / steps : 0),
					$7 - p[7], $8, $9, $10, $11, $12, $13, $14, m[2], m[1], $17, $15, $16, $19,
					srv / tck / dt, drv / tck / dt, other, la
			}' <<<"$row" >>"$CSV"
	fi
	PREV=$row
	PREV_SRV=$srv PREV_DRV=$drv PREV_MACH=$mach
	SAMPLE=$row
}
field() { cut -d, -f"$1" <<<"$SAMPLE"; }	# of the last sample: 2 steps, 5 wal, 16 archived steps, 18 more

# sleep to the next tick of SAMPLE_EVERY since T0
tick() {
	local now next
	now=$(date +%s.%N)
	next=$(awk -v t0="$T0" -v now="$now" -v e="$SAMPLE_EVERY" 'BEGIN {n = int((now - t0) / e) + 1; print t0 + n * e - now}')
	sleep "$next"
}
elapsed() { awk -v t0="$T0" -v now="$(date +%s.%N)" 'BEGIN {printf "%d", now - t0}'; }

start_maintain() {
	(
		trap 'exit 0' TERM
		while [[ ! -e $WORK/stop-maintain ]]; do
			s=$(date +%s.%N)
			r=$(q -c "SELECT dwarf.maintain()" 2>&1) || r="ERROR: $r"
			echo "$(date -u +%T) $r" >>"$WORK/maintain.log"
			sleep "$(awk -v s="$s" -v now="$(date +%s.%N)" -v e="$MAINTAIN_EVERY" 'BEGIN {d = s + e - now; print (d > 0 ? d : 0)}')"
		done
	) &
	MAINT=$!
}
stop_maintain() {			# lets the pass under way finish
	touch "$WORK/stop-maintain"
	wait "$MAINT" 2>/dev/null || true
	MAINT=
}

# history of HISTORY_FLOWS random archived flows, each timed by psql
history_latency() {			# label [PGOPTIONS]
	local PGOPTIONS=${2:-}
	export PGOPTIONS
	local ids=$WORK/ids-$1 script=$WORK/history-$1.sql out=$WORK/history-$1.out
	q -c "SELECT (SELECT a.id FROM dwarf.flow_archive a WHERE a.id >= r.x ORDER BY a.id LIMIT 1)
		FROM (SELECT m.lo + (random() * (m.hi - m.lo))::bigint AS x
		        FROM generate_series(1, $HISTORY_FLOWS), (SELECT min(id) AS lo, max(id) AS hi FROM dwarf.flow_archive) m) r" >"$ids"
	{
		echo '\timing on'
		while read -r id; do echo "SELECT * FROM dwarf.history($id) \\g /dev/null"; done <"$ids"
	} >"$script"
	q -f "$script" >"$out"
	local rows
	rows=$(q -c "SELECT count(*) FROM dwarf.step_archive WHERE flow_id IN ($(paste -sd, "$ids"))")
	echo "history ($1): $(wc -l <"$ids") flows, $rows archived step rows" >>"$RAW"
	sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$out" | sort -g | awk -v label="$1" -v rows="$rows" '
		{ v[NR] = $1; s += $1 }
		END {
			if (NR == 0) { print label ": no timings"; exit }
			i50 = int(0.50 * NR + 0.5); i95 = int(0.95 * NR + 0.5)
			if (i50 < 1) i50 = 1; if (i95 < 1) i95 = 1
			printf "%s|%d|%.2f|%.2f|%.2f|%.2f|%.2f|%d\n", label, NR, v[1], v[i50], s / NR, v[i95], v[NR], rows
		}'
}

# the read dwarf_internal.flow_steps() makes for an archived flow, with its plan
explain_archived() {		# label
	local id
	id=$(head -1 "$WORK/ids-$1")
	{
		echo "== plan ($1) of the archive read in dwarf_internal.flow_steps($id) (enable_seqscan off, as the function sets)"
		q -c "SET enable_seqscan = off" -c "EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM dwarf.step_all s WHERE s.flow_id = $id"
		echo "== EXPLAIN ANALYZE SELECT * FROM dwarf.history($id) ($1)"
		q -c "EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM dwarf.history($id)"
	} >>"$WORK/explain.txt" 2>&1
}

# ---------------------------------------------------------------- 1. main
say ""
say "phase 1 (main): load + maintain every $MAINTAIN_EVERY s until $STEPS_TARGET archived step rows"
DRIVER_SECONDS=$((TIME_LIMIT + 2 * WAL_SECONDS + 600))
"$BENCH" -workload linear -steps "$STEPS" \
	-concurrency "$CONCURRENCY" -per-txn "$PER_TXN" -arrival-rate 0 -max-outstanding "$MAX_OUTSTANDING" \
	-warmup 0 -window "$DRIVER_SECONDS" -stats-interval 30 -timeout 60 \
	-label retention >"$WORK/driver.out" 2>"$WORK/driver.err" &
DRIVER=$!
sample main
start_maintain
while :; do
	tick
	sample main
	(( $(field 16) >= STEPS_TARGET )) && { REASON="target reached"; break; }
	(( $(elapsed) >= TIME_LIMIT )) && { REASON="time limit ($TIME_LIMIT s) reached"; break; }
	kill -0 "$DRIVER" 2>/dev/null || die "the driver exited: $(tail -5 "$WORK/driver.err")"
done
MAIN_END=$(tail -1 "$CSV" | cut -d, -f1)
say "main phase ended after $MAIN_END s: $REASON, $(field 16) step rows archived by the passes"

# ---------------------------------------------------------------- 2. history under load
H1=$(history_latency under-load)
explain_archived under-load

# ---------------------------------------------------------------- 3, 4. WAL on / off
# sets WAL_RESULT; runs in this shell (sample keeps state), not in $(...)
wal_window() {			# phase
	q -c "CHECKPOINT"
	local a b end
	tick
	sample "$1"
	a=$SAMPLE
	end=$(( $(elapsed) + WAL_SECONDS ))
	while (( $(elapsed) < end - 1 )); do
		tick
		sample "$1"
	done
	b=$SAMPLE
	WAL_RESULT=$(awk -F, -v p="$1" -v a="$a" '{
		split(a, x, ",")
		s = $2 - x[2]; w = $5 - x[5]; f = $6 - x[6]
		printf "%s|%d|%.0f|%.1f|%.4f|%.0f|%d\n", p, s, w, w / s, f / s, s / ($1 - x[1]), $7 - x[7] }' <<<"$b")
}
wal_window wal-on
W_ON=$WAL_RESULT
stop_maintain
wal_window wal-off
W_OFF=$WAL_RESULT

# ---------------------------------------------------------------- 5. quiet history, final
kill "$DRIVER" 2>/dev/null || true
wait "$DRIVER" 2>/dev/null || true
DRIVER=
sleep 2
H2=$(history_latency idle)
explain_archived idle
# diagnostic, not the product as shipped: the same with parallel query off in the session
H3=$(history_latency idle-no-parallel "-c max_parallel_workers_per_gather=0")
q -c "VACUUM ANALYZE dwarf.step_log_archive, dwarf.flow_archive"
FINAL=$(q -F'|' -c "SELECT (SELECT count(*) FROM dwarf.step_archive), (SELECT count(*) FROM dwarf.flow_archive),
	(SELECT count(*) FROM dwarf.step), (SELECT count(*) FROM dwarf.flow),
	(SELECT pg_size_pretty(archive_flow_bytes + archive_step_bytes) FROM dwarf.storage),
	(SELECT archive_steps_estimate FROM dwarf.storage),
	(SELECT count(*) FROM dwarf.maintain_log WHERE (result->>'more')::boolean),
	(SELECT round(max(extract(epoch FROM took)) * 1000) FROM dwarf.maintain_log),
	(SELECT count(*) FROM dwarf.flow WHERE status <> 'completed'),
	(SELECT round(sum((result->>'moved_steps')::numeric) / nullif(sum(extract(epoch FROM took)), 0))
	   FROM dwarf.maintain_log WHERE (result->>'moved_steps')::bigint > 0),
	(SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM took)) * 1000)
	   FROM dwarf.maintain_log WHERE (result->>'moved_steps')::bigint > 0)")

# ---------------------------------------------------------------- raw output
{
	echo "== driver stdout"; cat "$WORK/driver.out"
	echo "== driver stderr"; cat "$WORK/driver.err"
	echo "== maintain passes (time UTC, result)"; cat "$WORK/maintain.log"
	echo "== history timings"; for f in "$WORK"/history-*.out; do echo "-- $f"; cat "$f"; done
	cat "$WORK/explain.txt"
	echo "== server log: ERROR, FATAL, PANIC, WARNING lines (grouped)"
	{ grep -E 'ERROR|FATAL|PANIC|WARNING' "$LOG" || true; } | sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //' | sort | uniq -c | sort -rn | head -30 || true
	echo "== server log: checkpoints and autovacuum"; grep -cE 'checkpoint (starting|complete)' "$LOG" || true
} >>"$RAW"

# ---------------------------------------------------------------- summary
say ""
say "samples: $CSV"
awk -F, -v edge="$EDGE_SECONDS" -v first=10 -v main_end="$MAIN_END" '
	NR == 1 || $2 != "main" { next }
	{ n++; t[n] = $1; s[n] = $3; o[n] = $24; la[n] = $25; ar[n] = $20; lf[n] = $12; ls[n] = $13; lr[n] = $11; c[n] = $22 }
	END {
		for (i = 1; i <= n; i++) {
			if (t[i] > first && t[i] <= first + edge) { a += s[i]; ao += o[i]; ac += c[i]; an++; aar = ar[i] }
			if (t[i] > main_end - edge) { b += s[i]; bo += o[i]; bc += c[i]; bn++; if (!bar0) bar0 = ar[i - 1] }
			if (t[i] > 120) { if (lf[i] + ls[i] > mx) { mx = lf[i] + ls[i]; mxr = lr[i] } }
		}
		if (an == 0 || bn == 0) { print "too few samples for the throughput ratio"; exit }
		printf "throughput|%.0f|%.2f|%d|%.0f|%.2f|%d|%d|%.3f|%.1f|%.1f\n", a / an, ao / an, aar, b / bn, bo / bn, bar0, ar[n], (b / bn) / (a / an),
			ac / a * 1e6, bc / b * 1e6
		printf "live|%.1f|%d|%.1f|%d\n", mx / 1048576, mxr, (lf[n] + ls[n]) / 1048576, lr[n]
	}' "$CSV" >"$WORK/agg"
IFS='|' read -r _ E_RATE E_OTHER E_AR L_RATE L_OTHER L_AR0 L_AR RATIO E_CPU L_CPU <<<"$(grep ^throughput "$WORK/agg" || echo)"
IFS='|' read -r _ LIVE_MAX_MB LIVE_MAX_ROWS LIVE_END_MB LIVE_END_ROWS <<<"$(grep ^live "$WORK/agg" || echo)"
IFS='|' read -r _ ON_STEPS ON_WAL ON_BPS ON_FPI ON_RATE ON_CKPT <<<"$W_ON"
IFS='|' read -r _ OFF_STEPS OFF_WAL OFF_BPS OFF_FPI OFF_RATE OFF_CKPT <<<"$W_OFF"
IFS='|' read -r F_STEPS F_FLOWS F_LSTEPS F_LFLOWS F_ASIZE F_AEST F_MORE F_MAXPASS F_NOTDONE F_MOVERATE F_MEDPASS <<<"$FINAL"
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }'; }

say "(1) throughput, steps/s (workers' counters), mean of the ${EDGE_SECONDS}-s windows:"
say "    empty tables (t $((10))-$((10 + EDGE_SECONDS)) s, archive then $E_AR step rows): $E_RATE steps/s, other load $E_OTHER cores"
say "    at volume (last $EDGE_SECONDS s of the main phase, archive $L_AR0-$L_AR step rows): $L_RATE steps/s, other load $L_OTHER cores"
say "    ratio at volume / empty: $RATIO ($(pct "$L_RATE" "$E_RATE")), target within 10%"
say "    server CPU per step (postmaster and children, maintain included): empty $E_CPU us, at volume $L_CPU us" \
	"($(pct "$L_CPU" "$E_CPU")); steps/s follow the CPU the other load leaves, CPU per step less so"
say "(2) live tables (dwarf.flow + dwarf.step, pg_total_relation_size) after the first 2 min: max $LIVE_MAX_MB MB" \
	"($LIVE_MAX_ROWS step rows then), at the end of the main phase $LIVE_END_MB MB ($LIVE_END_ROWS step rows)"
say "    that is $(awk -v r="$LIVE_END_ROWS" -v s="$L_RATE" 'BEGIN { printf "%.0f", r / s }') s of steps at the last minute's rate"
say "    maintain (passes that moved something): median $F_MEDPASS ms, longest $F_MAXPASS ms, $F_MOVERATE step rows moved per second of pass;" \
	"passes that stopped early (more: true) $F_MORE"
say "(3) dwarf.history(flow) of random archived flows, psql round trip, ms:"
for h in "$H1" "$H2" "$H3"; do
	IFS='|' read -r lab n mn med mean p95 mx rows <<<"$h"
	say "    $lab: $n calls ($rows step rows), min $mn, median $med, mean $mean, p95 $p95, max $mx (target < 20)"
done
say "(4) WAL per step, ${WAL_SECONDS}-s windows after a CHECKPOINT each, same tables:"
say "    archive on  (load + maintain): $ON_BPS B/step, $ON_FPI FPI/step, $ON_STEPS steps ($ON_RATE steps/s), $ON_CKPT checkpoints after the first"
say "    archive off (load alone):      $OFF_BPS B/step, $OFF_FPI FPI/step, $OFF_STEPS steps ($OFF_RATE steps/s), $OFF_CKPT checkpoints after the first"
say "    ratio on/off: $(awk -v a="$ON_BPS" -v b="$OFF_BPS" 'BEGIN { printf "%.2f", a / b }'), target < 2"
say "final: archive $F_STEPS step rows / $F_FLOWS flows ($F_ASIZE; storage estimate $F_AEST), live $F_LSTEPS steps / $F_LFLOWS flows;" \
	"flows not completed: $F_NOTDONE; driver errors: $(grep -c . "$WORK/driver.err" || true) stderr lines"
say "server log, ERROR/FATAL/PANIC/WARNING before the shutdown (\"connection to client lost\": the driver, stopped by kill):"
{ grep -E 'ERROR|FATAL|PANIC|WARNING' "$LOG" || true; } | sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //' | sort | uniq -c | sort -rn | head -10 |
	while read -r line; do say "    $line"; done
say "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
say "raw: $RAW"

# ---------------------------------------------------------------- chart
draw_chart "$CSV" "$CHART" "$TAG"
say "chart: $CHART"
