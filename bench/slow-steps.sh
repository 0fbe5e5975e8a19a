#!/bin/bash
# The time target of task isolation: slow steps must hold up no other flow.
# Against a running server that preloads dwarf, with CREATE EXTENSION dwarf
# done in the database (PGHOST, PGPORT, PGDATABASE, and PGUSER if needed):
#
#   1. a task that sleeps SLEEP s (3) runs once, so that dwarf knows it is slow;
#   2. SLOW_FLOWS (8) flows of it are created at once (one transaction);
#   3. at once, while they run, RUNS (30) successive
#        SELECT * FROM dwarf.run('bench_quick2', '{}', timeout => '30 s')
#      of a 2-step no-op graph, in one psql session, each timed by psql
#      (\timing: the client's round trip);
#   4. then it waits for the slow flows (at most 120 s).
#
# Prints the median and maximum time of one quick run (target <= 150 ms) and
# the time from the slow flows' creation to the last one's finished_at
# (target <= 5 s), then one line "RESULT key=value ..." for scripts.  For
# comparison it first times the same RUNS quick runs with no slow flow about.
# Run it with dwarf's settings at their defaults and max_worker_processes = 32
# (the figures of bench/README.md); it prints the settings it ran with.
# One quick run before step 2 loads the quick graph; it is not counted.
# Bounded: about SLEEP x 2 + 5 s when slow steps are isolated; each call has
# a 30 s timeout otherwise, and the whole script stops after 300 s.
#   PGHOST=/var/tmp/dwarf-iso/sock PGPORT=5491 PGDATABASE=bench bench/slow-steps.sh
set -euo pipefail
SLEEP=${SLEEP:-3}
SLOW_FLOWS=${SLOW_FLOWS:-8}
RUNS=${RUNS:-30}
PSQL=${PSQL:-psql}
: "${PGDATABASE:?set PGHOST, PGPORT and PGDATABASE}"
export PGOPTIONS="${PGOPTIONS:-} -c statement_timeout=60s"
q() { timeout 150 "$PSQL" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
deadline=$((SECONDS + 300))

q <<SQL
SET client_min_messages = warning;
CREATE SCHEMA IF NOT EXISTS dwarf_bench;
CREATE OR REPLACE FUNCTION dwarf_bench.noop(s jsonb) RETURNS jsonb LANGUAGE sql
    AS \$f\$ SELECT '{}'::jsonb \$f\$;
CREATE OR REPLACE FUNCTION dwarf_bench.slow(s jsonb) RETURNS jsonb LANGUAGE sql
    AS \$f\$ SELECT pg_sleep($SLEEP); SELECT '{"slept": true}'::jsonb \$f\$;
SELECT dwarf.define('bench_slow', '{"tasks": {"S": "dwarf_bench.slow"}, "transitions": []}') \\g /dev/null
SELECT dwarf.define('bench_quick2', '{"tasks": {"A": "dwarf_bench.noop", "B": "dwarf_bench.noop"},
  "transitions": [{"from": "A", "to": "B"}]}') \\g /dev/null
SQL

echo "settings: $(q -F ' ' -c "SELECT 'max_worker_processes=' || current_setting('max_worker_processes'),
  'dwarf.workers=' || current_setting('dwarf.workers'),
  'dwarf.batch_size=' || current_setting('dwarf.batch_size'),
  'dwarf.long_step=' || coalesce(current_setting('dwarf.long_step', true), '(none)'),
  'dwarf.max_runners=' || coalesce(current_setting('dwarf.max_runners', true), '(none)'),
  'dwarf.batch_time=' || coalesce(current_setting('dwarf.batch_time', true), '(none)')")"

read -r first_id first_status < <(q -F ' ' -c "SELECT flow_id, status FROM dwarf.run('bench_slow', '{}', timeout => '30 s')")
first_s=$(q -c "SELECT round(extract(epoch FROM finished_at - created_at)::numeric, 2) FROM dwarf.flow WHERE id = $first_id")
echo "first slow run (teaches dwarf the task is slow): $first_status in $first_s s"
warm=$(q -c "SELECT status FROM dwarf.run('bench_quick2', '{}', timeout => '30 s')")
[[ $warm == completed ]] || echo "WARNING: the warm-up quick run ended $warm"

# n, median, p90 and max of the numbers on stdin
stats() {
	sort -g | awk '{v[NR] = $1}
	END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
	     p = v[int(NR * 0.9 + 0.999)]; printf "%d %.1f %.1f %.1f\n", NR, m, p, v[NR]}'
}
quick_runs() {
	for _ in $(seq 1 "$RUNS"); do
		echo "SELECT * FROM dwarf.run('bench_quick2', '{}', timeout => '30 s');"
	done
}

# the same runs with no slow flow about, for comparison
out=$({ echo '\timing on'; quick_runs; } | q -F '|')
read -r _ bmedian bp90 bmax < <(awk '/^Time: / {print $2}' <<<"$out" | stats)
bok=$(awk -F'|' '/^[0-9]+\|/ {print $2}' <<<"$out" | grep -c '^completed$' || true)
echo "quick runs alone (no slow flow running): $bok of $RUNS completed; median $bmedian ms, p90 $bp90 ms, max $bmax ms"

id0=$(q -c "SELECT coalesce(max(id), 0) FROM dwarf.flow")
out=$({
	echo '\timing on'
	echo "SELECT count(dwarf.create('bench_slow', '{}')) FROM generate_series(1, $SLOW_FLOWS);"
	quick_runs
	echo '\timing off'
	echo "SELECT 'STILL_RUNNING|' || count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'bench_slow' AND f.id > $id0 AND f.status = 'running';"
} | q -F '|')

# Timing lines in order: the create, then the runs.  Result rows of the runs
# are flow_id|status|state|...
times=$(awk '/^Time: / {print $2}' <<<"$out" | tail -n +2)
statuses=$(awk -F'|' '/^[0-9]+\|/ {print $2}' <<<"$out")
still=$(awk -F'|' '/^STILL_RUNNING\|/ {print $2}' <<<"$out")
ok=$(grep -c '^completed$' <<<"$statuses" || true)
read -r _ median p90 max < <(stats <<<"$times")
echo "quick runs while the slow flows run: $ok of $RUNS completed; one run: median $median ms, p90 $p90 ms, max $max ms (target: max <= 150 ms)"
echo "  each, ms: $(tr '\n' ' ' <<<"$times")"
echo "slow flows still running when the quick runs ended: $still of $SLOW_FLOWS"

while :; do
	left=$(q -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE g.name = 'bench_slow' AND f.id > $id0 AND f.status = 'running'")
	[[ $left == 0 ]] && break
	if ((SECONDS > deadline - 150)); then
		echo "WARNING: $left slow flows still running; giving up"
		break
	fi
	sleep 0.2
done
read -r done_n all_s first_s overlap < <(q -F ' ' -c "
SELECT count(*) FILTER (WHERE f.status = 'completed'),
       round(extract(epoch FROM max(f.finished_at) - min(f.created_at))::numeric, 2),
       round(extract(epoch FROM min(f.finished_at) - min(f.created_at))::numeric, 2),
       (SELECT max(s.started_at) < min(s.finished_at) FROM dwarf.step s
          JOIN dwarf.flow f2 ON f2.id = s.flow_id JOIN dwarf.graph g2 ON g2.id = f2.graph_id
         WHERE g2.name = 'bench_slow' AND f2.id > $id0)
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'bench_slow' AND f.id > $id0")
echo "slow flows: $done_n of $SLOW_FLOWS completed; all done ${all_s} s after their creation, the first ${first_s} s (target: all <= 5 s); their steps overlapped: $overlap"
echo "RESULT alone_median_ms=$bmedian alone_max_ms=$bmax quick_ok=$ok quick_runs=$RUNS quick_median_ms=$median quick_p90_ms=$p90 quick_max_ms=$max" \
	"slow_done=$done_n slow_flows=$SLOW_FLOWS slow_all_s=$all_s slow_first_s=$first_s slow_overlap=$overlap still_running=$still"
