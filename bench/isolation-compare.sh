#!/bin/bash
# Two builds of dwarf on this machine, measured in one run, alternating
# BASE, NEW, BASE, NEW... (ROUNDS rounds) so that drift shows.
#
#   bench/isolation-compare.sh BASE_PREFIX BASE_TREE NEW_PREFIX NEW_TREE
#   (or the same names as environment variables)
#
# A prefix is a relocated copy of the PostgreSQL 15 installation with that
# tree's dwarf installed into it (see "Isolation: before and after" in
# bench/README.md); a tree is the built source (its bench/dwarf-bench is used).
# Run as root: servers run as the postgres OS user, one at a time, on a unix
# socket under WORK; CPU figures are read from /proc.
#
# Each (round, build) gets a fresh cluster: shared_preload_libraries = dwarf,
# max_worker_processes = 32, fsync and synchronous_commit on, the rest at
# PostgreSQL's and dwarf's defaults; a build with the step log in segments
# (dwarf.segment) gets one dwarf.maintain() pass after CREATE EXTENSION,
# which makes the first two (16,384 flow ids each).  On it:
#   1. speed: FLOWS (8000) 10-step no-op linear flows (bench_linear_10, as
#      defined by bench/dwarf-bench) created in one transaction, then waited
#      for (a warm-up burst of WARM flows first, a CHECKPOINT before each
#      measured one; BURSTS measured bursts).  steps/s = steps / (last
#      finished_at - the create's commit); WAL = LSN difference / steps;
#      CPU = the postmaster and all its children, from /proc, per step;
#      ROLES (1): the flows' owners.  1: the superuser creates them all, one
#      statement.  2 (or more, up to 26): non-superuser roles bench_a,
#      bench_b... each with its own bench_linear_10 (the same definition) and
#      what a flow owner needs (USAGE on schemas dwarf and dwarf_bench, EXECUTE
#      on dwarf.create, dwarf.define and dwarf_bench.noop); the burst is still
#      one transaction, in which the superuser does SET LOCAL ROLE to each role
#      in turn and creates ROLE_CHUNK (100) flows as it, so the owners
#      alternate every ROLE_CHUNK flows in creation (and id) order, each role
#      owning an equal share when FLOWS / ROLE_CHUNK divides by ROLES; the
#      warm-up burst likewise.  The rest (ceiling, dwarf.run, time) runs as the
#      superuser whatever ROLES says;
#   2. the ceiling: pgbench, bench/pgbench/reference.sql (one durable one-row
#      UPDATE per transaction), REF_CLIENTS (4) clients, REF_SECONDS (10) s,
#      once before the measured bursts and once after; ratio = steps/s over
#      the mean of the two;
#   3. dwarf.run under pgbench (RUN=0 skips it): bench/pgbench/run_linear.sql
#      at 1 client and at RUN_CLIENTS (32), bench/pgbench/run_fanout.sql at
#      RUN_CLIENTS, RUN_SECONDS (10) s each, each next to reference.sql at the
#      same client count (order: reference 1, linear 1, linear 32,
#      reference 32, fan-out 32); steps/s = tps x steps per flow (10; the
#      fan-out's width + 2, width read from run_fanout.sql); ratio = steps/s
#      over the reference's tps at the same client count; mean latency is
#      pgbench's "latency average"; server CPU per dwarf.run call and per step
#      and WAL per step as for the bursts (flows and steps counted in
#      dwarf.flow and dwarf.step); pgbench's own output in WORK/out;
#   4. bench/slow-steps.sh (the time target).
# Prints progress per (round, build), then the tables and what the server
# logs said before each shutdown.
# About 110-150 s per (round, build); raw output and server logs in WORK/out.
set -euo pipefail
BASE_PREFIX=${1:-${BASE_PREFIX:-/var/tmp/pg-base}}
BASE_TREE=${2:-${BASE_TREE:-/var/tmp/dwarf-base}}
NEW_PREFIX=${3:-${NEW_PREFIX:-/var/tmp/pg-new}}
NEW_TREE=${4:-${NEW_TREE:-/var/tmp/dwarf-new}}
ROUNDS=${ROUNDS:-2}
FLOWS=${FLOWS:-8000}
WARM=${WARM:-2000}
BURSTS=${BURSTS:-2}
REF_CLIENTS=${REF_CLIENTS:-4}
REF_SECONDS=${REF_SECONDS:-10}
SLOW=${SLOW:-1}
RUN=${RUN:-1}
RUN_CLIENTS=${RUN_CLIENTS:-32}
RUN_SECONDS=${RUN_SECONDS:-10}
ROLES=${ROLES:-1}
ROLE_CHUNK=${ROLE_CHUNK:-100}
PORT=${PORT:-5491}
WORK=${WORK:-/var/tmp/dwarf-iso}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PGBIN_REL=usr/lib/postgresql/15/bin
TCK=$(getconf CLK_TCK)

die() { echo "isolation-compare: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root (servers run as postgres; CPU is read from /proc)"
[[ $ROLES =~ ^[0-9]+$ ]] && ((ROLES >= 1 && ROLES <= 26)) || die "ROLES is $ROLES, not 1 to 26"
[[ $ROLE_CHUNK =~ ^[0-9]+$ ]] && ((ROLE_CHUNK >= 1)) || die "ROLE_CHUNK is $ROLE_CHUNK, not a positive integer"
OWNERS=()					# the flows' owners when ROLES > 1: bench_a, bench_b...
if ((ROLES > 1)); then
	LETTERS=({a..z})
	for ((i = 0; i < ROLES; i++)); do
		OWNERS+=("bench_${LETTERS[i]}")
	done
	OWNERS_SAID="owned by ROLES=$ROLES roles, ${OWNERS[0]} to ${OWNERS[-1]}, in turns of $ROLE_CHUNK flows"
else
	OWNERS_SAID="owned by the superuser (ROLES=1)"
fi
for b in BASE NEW; do
	p=${b}_PREFIX t=${b}_TREE
	[[ -x ${!p}/$PGBIN_REL/postgres ]] || die "${!p}: no $PGBIN_REL/postgres"
	lib=$("${!p}/$PGBIN_REL/pg_config" --pkglibdir)
	[[ $lib == "${!p}"/* ]] || die "${!p}: pg_config --pkglibdir is $lib, not inside the copy"
	cmp -s "${!t}/dwarf.so" "$lib/dwarf.so" || die "$lib/dwarf.so is not ${!t}/dwarf.so: install the tree into the copy"
	[[ -x ${!t}/bench/dwarf-bench ]] || die "${!t}/bench/dwarf-bench missing: make -C ${!t}"
done

SOCK=$WORK/sock
DATA=$WORK/data
OUT=$WORK/out
mkdir -p "$WORK" "$SOCK" "$OUT"
chown postgres: "$WORK" "$SOCK" "$OUT"
chmod 755 "$WORK"
export PGHOST=$SOCK PGPORT=$PORT PGUSER=postgres PGDATABASE=bench
RUNNING_BIN=
stop_server() {
	if [[ -n $RUNNING_BIN ]]; then
		runuser -u postgres -- "$RUNNING_BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null || true
		RUNNING_BIN=
	fi
}
trap 'stop_server; rm -rf "$DATA"' EXIT
trap 'exit 130' INT TERM

# CPU ticks of the postmaster and its children, alive or reaped by it
server_ticks() {
	cat /proc/[0-9]*/stat 2>/dev/null | sed -E 's/ \(.*\) / X /' |
		awk -v pm="$1" '$1 == pm || $4 == pm {t += $14 + $15 + $16 + $17} END {print t + 0}'
}
# busy CPU ticks of the whole machine
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat; }
# CPU ticks of this database's dwarf workers
worker_ticks() {
	local t=0 p
	for p in $(q -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = current_database()"); do
		t=$((t + $(sed -E 's/ \(.*\) / X /' "/proc/$p/stat" | awk '{print $14 + $15}')))
	done
	echo "$t"
}

start_server() {			# build prefix tag
	local bin=$2/$PGBIN_REL
	rm -rf "$DATA"
	runuser -u postgres -- "$bin/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
	cat >>"$DATA/postgresql.conf" <<-CONF
		listen_addresses = ''
		port = $PORT
		unix_socket_directories = '$SOCK'
		shared_preload_libraries = 'dwarf'
		max_worker_processes = 32
		fsync = on
		synchronous_commit = on
	CONF
	: >"$OUT/$3.log"
	chown postgres: "$OUT/$3.log"
	runuser -u postgres -- "$bin/pg_ctl" -D "$DATA" -l "$OUT/$3.log" -w -t 60 start >/dev/null
	RUNNING_BIN=$bin
	PSQL_BIN=$bin/psql
	PM=$(head -1 "$DATA/postmaster.pid")
	q -d postgres -c "CREATE DATABASE bench" >/dev/null
	q -c "CREATE EXTENSION dwarf" >/dev/null
	# A build whose step log is in segments makes them on its first
	# dwarf.maintain(), as a scheduled pass would have: without it every
	# step goes to the default partition.
	if [[ $(q -c "SELECT to_regclass('dwarf.segment') IS NOT NULL") == t ]]; then
		q -c "SELECT dwarf.maintain()" >/dev/null
	fi
	for _ in $(seq 1 100); do
		[[ $(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = 'bench'") \
			== "$(q -c "SHOW dwarf.workers")" ]] && return 0
		sleep 0.1
	done
	die "$3: dwarf workers did not start"
}
q() { timeout 180 "$PSQL_BIN" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# When ROLES > 1, the roles that own the bursts' flows: each gets what a flow
# owner needs and a bench_linear_10 of its own, the superuser's definition
setup_owners() {
	local r
	((ROLES > 1)) || return 0
	{
		echo "SELECT definition AS def FROM dwarf.graph WHERE name = 'bench_linear_10' ORDER BY id DESC LIMIT 1 \\gset"
		for r in "${OWNERS[@]}"; do
			echo "CREATE ROLE $r;"
			echo "GRANT USAGE ON SCHEMA dwarf, dwarf_bench TO $r;"
			echo "GRANT EXECUTE ON FUNCTION dwarf.create, dwarf.define, dwarf_bench.noop TO $r;"
			echo "SET ROLE $r;"
			echo "SELECT dwarf.define('bench_linear_10', :'def') \\g /dev/null"
			echo "RESET ROLE;"
		done
	} | q -f -
}

# The statements that create a burst's $1 flows in one transaction: one
# statement as the superuser, or (ROLES > 1) ROLE_CHUNK flows at a time as
# each owner in turn
create_sql() {
	local n=$1 i=0 k
	if ((ROLES == 1)); then
		echo "SELECT count(dwarf.create('bench_linear_10', '{}')) FROM generate_series(1, $n) \\g /dev/null"
		return
	fi
	echo "BEGIN;"
	while ((i * ROLE_CHUNK < n)); do
		k=$((n - i * ROLE_CHUNK < ROLE_CHUNK ? n - i * ROLE_CHUNK : ROLE_CHUNK))
		echo "SET LOCAL ROLE ${OWNERS[i % ROLES]};"
		echo "SELECT count(dwarf.create('bench_linear_10', '{}')) FROM generate_series(1, $k) \\g /dev/null"
		i=$((i + 1))
	done
	echo "COMMIT;"
}

# One burst of $1 flows; prints "steps steps_s create_s wal_b_step rec_step cpu_us_step wcpu_us_step other_cores
# completed owners" (owners: role=flows,... of the burst's flows)
burst() {
	local n=$1 id0 tc lsn0 lsn1 rec0 c0 c1 m0 m1 w0 w1 t0 t1
	id0=$(q -c "SELECT coalesce(max(id), 0) FROM dwarf.flow")
	rec0=$(q -c "SELECT wal_records FROM pg_stat_wal")
	c0=$(server_ticks "$PM") m0=$(machine_ticks) w0=$(worker_ticks) t0=$(date +%s.%N)
	cat >"$WORK/burst.sql" <<-SQL
		SELECT pg_current_wal_lsn();
		$(create_sql "$n")
		SELECT replace(clock_timestamp()::text, ' ', 'T');
		SELECT set_config('bench.id0', '$id0', false) \\g /dev/null
		DO \$\$
		DECLARE cur bigint := current_setting('bench.id0')::bigint; polls int := 0;
		BEGIN
		    LOOP
		        SELECT min(id) INTO cur FROM dwarf.flow WHERE id >= cur AND status = 'running';
		        EXIT WHEN cur IS NULL;
		        polls := polls + 1;
		        IF polls > 12000 THEN RAISE EXCEPTION 'flows still running after 120 s'; END IF;
		        PERFORM pg_sleep(0.01);
		    END LOOP;
		END \$\$;
		SELECT pg_current_wal_lsn();
	SQL
	read -r lsn0 tc lsn1 <<<"$(q -F ' ' -f "$WORK/burst.sql" | tr '\n' ' ')"
	c1=$(server_ticks "$PM") m1=$(machine_ticks) w1=$(worker_ticks) t1=$(date +%s.%N)
	sleep 1.5					# let every process publish its pg_stat_wal counters
	q -F ' ' -c "
	WITH f AS (SELECT * FROM dwarf.flow WHERE id > $id0),
	     s AS (SELECT count(*) AS steps FROM dwarf.step WHERE flow_id > $id0),
	     t AS (SELECT extract(epoch FROM max(finished_at) - '$tc'::timestamptz) AS run_s,
	                  extract(epoch FROM '$tc'::timestamptz - min(created_at)) AS create_s,
	                  count(*) FILTER (WHERE status = 'completed') AS ok FROM f)
	SELECT s.steps, round(s.steps / t.run_s), round(t.create_s::numeric, 2),
	       round(pg_wal_lsn_diff('$lsn1', '$lsn0') / s.steps),
	       round((SELECT wal_records - $rec0 FROM pg_stat_wal)::numeric / s.steps, 2),
	       round(($c1 - $c0) * 1e6 / $TCK / s.steps, 1),
	       round(($w1 - $w0) * 1e6 / $TCK / s.steps, 1),
	       round(greatest(($m1 - $m0) - ($c1 - $c0), 0)::numeric / $TCK / ($t1 - $t0), 2),
	       t.ok,
	       (SELECT string_agg(owner::text || '=' || n, ',' ORDER BY owner::text)
	          FROM (SELECT owner, count(*) AS n FROM f GROUP BY owner) o)
	  FROM s, t"
}

# The burst's flows per owner, for its progress line when ROLES > 1
said_owners() { ((ROLES == 1)) || echo ", owners $owners"; }

reference() {
	local r
	r=$(timeout $((REF_SECONDS + 60)) "$RUNNING_BIN/pgbench" -n -M prepared -f "$HERE/pgbench/reference.sql" \
		-c "$REF_CLIENTS" -j 2 -T "$REF_SECONDS" 2>&1) || { echo "$r" >&2; echo "nan"; return; }
	awk '/^tps = .*without initial connection time/ {print int($3 + 0.5)}' <<<"$r"
}

# One pgbench run of bench/pgbench/$1 at $2 clients for RUN_SECONDS s, raw output in
# $OUT/$tag-$3.txt.  Prints "tps latency_ms xacts failed aborted exit flows completed
# steps server_cpu_us_per_flow server_cpu_us_per_step wal_b_per_step other_cores"
# (flows, steps: rows added to dwarf.flow and dwarf.step meanwhile; other load =
# machine CPU minus this server's and pgbench's own, in cores).
pgb() {
	local script=$1 c=$2 name=$3 j id0 lsn0 lsn1 c0 c1 m0 m1 t0 t1 r rc
	local tps lat xacts failed aborted pcpu
	j=$((c < 2 ? c : 2))
	id0=$(q -c "SELECT coalesce(max(id), 0) FROM dwarf.flow")
	lsn0=$(q -c "SELECT pg_current_wal_lsn()")
	c0=$(server_ticks "$PM") m0=$(machine_ticks) t0=$(date +%s.%N)
	r=$({
		timeout $((RUN_SECONDS + 90)) "$RUNNING_BIN/pgbench" -n -M prepared -f "$HERE/pgbench/$script" \
			-c "$c" -j "$j" -T "$RUN_SECONDS" 2>&1 && rc=0 || rc=$?
		echo "exit status $rc"
		times
	})
	c1=$(server_ticks "$PM") m1=$(machine_ticks) t1=$(date +%s.%N)
	lsn1=$(q -c "SELECT pg_current_wal_lsn()")
	printf '%s\n' "pgbench -n -M prepared -f bench/pgbench/$script -c $c -j $j -T $RUN_SECONDS" "$r" >"$OUT/$tag-$name.txt"
	tps=$(awk '/^tps = .*without initial connection time/ {printf "%.1f", $3}' <<<"$r")
	lat=$(awk '/^latency average = / {print $4}' <<<"$r")
	xacts=$(awk '/^number of transactions actually processed:/ {print $6}' <<<"$r")
	failed=$(awk '/^number of failed transactions:/ {print $5}' <<<"$r")
	aborted=$(grep -ci 'aborted' <<<"$r" || true)
	rc=$(awk '/^exit status / {print $3}' <<<"$r")
	# pgbench's own CPU: the children's line of times (the last one), "XmY.YYYs XmY.YYYs"
	pcpu=$(tail -1 <<<"$r" | awk '{n = 0; for (i = 1; i <= 2; i++) {split($i, a, "m"); n += a[1] * 60 + a[2]}; print n}')
	read -r flows ok steps cpuf cpus walb other <<<"$(q -F ' ' -c "
	WITH f AS (SELECT count(*) AS n, count(*) FILTER (WHERE status = 'completed') AS ok
	             FROM dwarf.flow WHERE id > $id0),
	     s AS (SELECT count(*) AS n FROM dwarf.step WHERE flow_id > $id0)
	SELECT f.n, f.ok, s.n,
	       CASE WHEN f.n > 0 THEN round(($c1 - $c0) * 1e6 / $TCK / f.n)::text ELSE '-' END,
	       CASE WHEN s.n > 0 THEN round(($c1 - $c0) * 1e6 / $TCK / s.n, 1)::text ELSE '-' END,
	       CASE WHEN s.n > 0 THEN round(pg_wal_lsn_diff('$lsn1', '$lsn0') / s.n)::text ELSE '-' END,
	       round(greatest(($m1 - $m0) - ($c1 - $c0) - $pcpu * $TCK, 0)::numeric / $TCK / ($t1 - $t0), 2)
	  FROM f, s")"
	echo "${tps:-nan} ${lat:-nan} ${xacts:-0} ${failed:-0} ${aborted:-0} ${rc:-nan} ${flows:--} ${ok:--} ${steps:--} ${cpuf:--} ${cpus:--} ${walb:--} ${other:--}"
}

ROWS=()
SLOWROWS=()
RUNROWS=()
FANOUT_STEPS=$(($(awk '$1 == "\\set" && $2 == "width" {print $3}' "$HERE/pgbench/run_fanout.sql") + 2))
LOGS=()
echo "BASE: $BASE_PREFIX, $BASE_TREE at $(git -C "$BASE_TREE" rev-parse --short HEAD)$(git -C "$BASE_TREE" diff --quiet HEAD -- src sql || echo ' (modified)')"
echo "NEW:  $NEW_PREFIX, $NEW_TREE at $(git -C "$NEW_TREE" rev-parse --short HEAD)$(git -C "$NEW_TREE" diff --quiet HEAD -- src sql || echo ' (modified)')"
echo "$(date -u '+%F %T UTC'), $(nproc) cores, $FLOWS flows x 10 steps per burst, $OWNERS_SAID, reference: $REF_CLIENTS clients x $REF_SECONDS s"
RUNS=()
for round in $(seq 1 "$ROUNDS"); do
	for build in BASE NEW; do
		p=${build}_PREFIX t=${build}_TREE tag=r$round-$(tr A-Z a-z <<<"$build")
		echo "=== round $round $build ($(cut -d' ' -f1-3 /proc/loadavg) load)"
		start_server "$build" "${!p}" "$tag"
		"${!t}/bench/dwarf-bench" -dsn "host=$SOCK port=$PORT dbname=bench user=postgres" \
			-workload linear -steps 10 -reference -setup-only >/dev/null
		"${!t}/bench/dwarf-bench" -dsn "host=$SOCK port=$PORT dbname=bench user=postgres" \
			-workload fanout -setup-only >/dev/null
		setup_owners
		read -r steps sps create_s walb recs cpu wcpu other ok owners < <(burst "$WARM")
		echo "  warm-up burst: $steps steps ($ok of $WARM flows completed), $sps steps/s, WAL $walb B/step$(said_owners)"
		ref1=$(reference)
		for b in $(seq 1 "$BURSTS"); do
			q -c "CHECKPOINT"
			sleep 1
			read -r steps sps create_s walb recs cpu wcpu other ok owners < <(burst "$FLOWS")
			echo "  burst $b: $steps steps ($ok of $FLOWS flows completed), $sps steps/s, create ${create_s} s," \
				"WAL $walb B/step, $recs records/step, CPU $cpu us/step (workers $wcpu), other load $other cores$(said_owners)"
			BURST[$b]="$sps $walb $recs $cpu $wcpu $create_s $other $ok"
		done
		ref2=$(reference)
		ref=$(awk -v a="$ref1" -v b="$ref2" 'BEGIN {printf "%d", (a + b) / 2 + 0.5}')
		echo "  reference: $ref1 tps before the bursts, $ref2 after ($REF_CLIENTS clients), mean $ref"
		for b in $(seq 1 "$BURSTS"); do
			read -r sps walb recs cpu wcpu create_s other ok <<<"${BURST[$b]}"
			ratio=$(awk -v s="$sps" -v r="$ref" 'BEGIN {printf (r > 0 ? "%.2f" : "-"), s / r}')
			ROWS+=("| $round | $build | $b | $sps | $ref1 / $ref2 | **$ratio** | $walb | $recs | $cpu | $wcpu | $create_s | $other | $ok/$FLOWS |")
		done
		if [[ $RUN == 1 ]]; then
			declare -A REFTPS=() REFLAT=()
			for spec in "reference.sql 1 ref-1" "run_linear.sql 1 linear-1" "run_linear.sql $RUN_CLIENTS linear-$RUN_CLIENTS" \
				"reference.sql $RUN_CLIENTS ref-$RUN_CLIENTS" "run_fanout.sql $RUN_CLIENTS fanout-$RUN_CLIENTS"; do
				read -r script c name <<<"$spec"
				read -r tps lat xacts failed aborted rc flows ok steps cpuf cpus walb other < <(pgb "$script" "$c" "$name")
				if [[ $script == reference.sql ]]; then
					REFTPS[$c]=$tps REFLAT[$c]=$lat
					echo "  $name: $tps tps, latency average $lat ms, $xacts transactions, other load $other cores (pgbench exit $rc)"
					continue
				fi
				per=10
				[[ $script == run_fanout.sql ]] && per=$FANOUT_STEPS
				RUNS+=("$name $c $per $tps $lat $xacts $failed $aborted $rc $flows $ok $steps $cpuf $cpus $walb $other")
				echo "  $name: $tps dwarf.run/s x $per steps, latency average $lat ms, $xacts runs ($failed failed, pgbench exit $rc);" \
					"$ok of $flows flows completed, $steps steps; server CPU $cpuf us/run, $cpus us/step; WAL $walb B/step; other load $other cores"
			done
			for x in "${RUNS[@]}"; do
				read -r name c per tps lat xacts failed aborted rc flows ok steps cpuf cpus walb other <<<"$x"
				sps=$(awk -v t="$tps" -v p="$per" 'BEGIN {printf "%d", t * p + 0.5}')
				rt=${REFTPS[$c]:-nan}
				ratio=$(awk -v s="$sps" -v r="$rt" 'BEGIN {printf (r > 0 ? "%.2f" : "-"), s / r}')
				spf=$(awk -v s="$steps" -v f="$flows" 'BEGIN {printf (f > 0 ? "%.2f" : "-"), s / f}')
				RUNROWS+=("| $round | $build | ${name%-*} | $c | $tps | $sps | $rt | **$ratio** | **$lat** | ${REFLAT[$c]:-} | $cpuf | $cpus | $walb | $spf | $ok/$flows | $failed | $other |")
			done
			RUNS=()
			unset REFTPS REFLAT
		fi
		if [[ $SLOW == 1 ]]; then
			s=$(PSQL=$PSQL_BIN timeout 330 "$HERE/slow-steps.sh" 2>&1) || s+=$'\nslow-steps.sh FAILED'
			sed 's/^/  /' <<<"$s"
			r=$(grep '^RESULT' <<<"$s" || true)
			v() { sed -nE "s/.* $1=([^ ]*).*/\1/p" <<<" $r"; }
			SLOWROWS+=("| $round | $build | $(v alone_median_ms) / $(v alone_max_ms) | $(v quick_ok)/$(v quick_runs) | $(v quick_median_ms) | $(v quick_p90_ms) | **$(v quick_max_ms)** | $(v still_running) | $(v slow_done)/$(v slow_flows) | $(v slow_first_s) | **$(v slow_all_s)** | $(v slow_overlap) |")
		fi
		stop_server
		# what the log says before the shutdown request (workers then end with FATAL, as expected)
		bad=$(sed '/received fast shutdown request/q' "$OUT/$tag.log" |
			grep -E '(ERROR|FATAL|PANIC|WARNING):|terminated by signal|exited with exit code [1-9]' || true)
		echo "  server log $OUT/$tag.log: $(grep -c . <<<"$bad" || true) error/warning lines before shutdown"
		[[ -z $bad ]] || sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //; s/[0-9]+/N/g' <<<"$bad" |
			sort | uniq -c | sort -rn | head -8 | sed 's/^/    /'
		LOGS+=("$tag: $(grep -c . <<<"$bad" || true)")
	done
done

echo
echo "Speed: $FLOWS ten-step no-op flows created in one transaction, $OWNERS_SAID, then waited for; reference = pgbench reference.sql, $REF_CLIENTS clients, $REF_SECONDS s"
echo
echo "| round | build | burst | steps/s | reference tps before / after | ratio to their mean | WAL B/step | WAL records/step | server CPU us/step | workers' CPU us/step | create s | other load (cores) | completed |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
if [[ $RUN == 1 ]]; then
	echo
	echo "dwarf.run under pgbench, $RUN_SECONDS s each: run_linear.sql (10 steps) at 1 and $RUN_CLIENTS clients, run_fanout.sql ($FANOUT_STEPS steps) at $RUN_CLIENTS; reference.sql at the same client count"
	echo
	echo "| round | build | script | clients | runs/s (flows/s) | steps/s | reference tps | ratio | mean latency ms | reference latency ms | server CPU us/run | server CPU us/step | WAL B/step | step rows/flow | completed | failed | other load (cores) |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${RUNROWS[@]}"
fi
if [[ $SLOW == 1 ]]; then
	echo
	echo "Time: bench/slow-steps.sh (pg_sleep(3) task known slow, 8 flows of it at once, then 30 dwarf.run of a 2-step no-op graph)"
	echo
	echo "| round | build | quick run alone: median / max ms | quick runs completed | median ms | p90 ms | max ms | slow flows running after the 30 runs | slow completed | first slow done s | all slow done s | slow steps overlapped |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${SLOWROWS[@]}"
fi
echo
echo "Server log lines with ERROR, FATAL, PANIC, WARNING or a failed process, before shutdown: ${LOGS[*]}"
