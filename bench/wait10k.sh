#!/bin/bash
# 10,000 flows that wait durably at once (dwarf.sleep), on a server that
# preloads dwarf.  Reports the dwarf workers' CPU while the flows wait and
# checks that every flow completed, none before its wake time.
#   bench/wait10k.sh "host=/var/tmp/dwarfbench port=5480 dbname=bench" [flows] [sleep_s]
# Run as root or as the server's OS user (the CPU figure reads /proc).
set -euo pipefail
DSN=${1:?usage: wait10k.sh DSN [flows] [sleep_s]}
N=${2:-10000}
SLEEP=${3:-20}
PSQL=(psql "$DSN" -X -q -At -v ON_ERROR_STOP=1)

"${PSQL[@]}" <<SQL
CREATE SCHEMA IF NOT EXISTS dwarf_bench;
CREATE OR REPLACE FUNCTION dwarf_bench.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS \$\$
BEGIN PERFORM dwarf.sleep(make_interval(secs => (s->>'sleep')::float8)); RETURN '{}'; END \$\$;
CREATE OR REPLACE FUNCTION dwarf_bench.woke(s jsonb) RETURNS jsonb LANGUAGE sql AS
  \$\$ SELECT '{"woke": true}'::jsonb \$\$;
SELECT dwarf.define('bench_wait10k', '{"tasks": {"Nap": "dwarf_bench.nap", "Woke": "dwarf_bench.woke"},
  "transitions": [{"from": "Nap", "to": "Woke"}]}');
SQL

worker_ticks() {
	local t=0 p
	for p in $("${PSQL[@]}" -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = current_database()"); do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}

start=$("${PSQL[@]}" -c "SELECT clock_timestamp()")
"${PSQL[@]}" -c "SELECT count(dwarf.create('bench_wait10k', jsonb_build_object('sleep', $SLEEP))) FROM generate_series(1, $N)" >/dev/null
sleep 3
sleeping=$("${PSQL[@]}" -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_wait10k' AND f.status = 'running' AND f.created_at >= '$start'")
t0=$(worker_ticks)
window=$((SLEEP / 2))
sleep "$window"
t1=$(worker_ticks)
echo "flows waiting: $sleeping; dwarf workers' CPU over ${window} s of waiting: $((t1 - t0)) ticks ($(( (t1 - t0) * 10 )) ms)"

for _ in $(seq 1 $((SLEEP + 60))); do
	left=$("${PSQL[@]}" -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_wait10k' AND f.status <> 'completed' AND f.created_at >= '$start'")
	[[ $left == 0 ]] && break
	sleep 1
done
"${PSQL[@]}" -F ' ' <<SQL
SELECT 'completed: ' || count(*) FILTER (WHERE f.status = 'completed') || ' of ' || count(*),
       'woke early: ' || count(*) FILTER (WHERE w.started_at < n.finished_at + make_interval(secs => $SLEEP)),
       'max lateness: ' || round(extract(epoch FROM max(w.started_at - (n.finished_at + make_interval(secs => $SLEEP)))) * 1000) || ' ms'
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
  JOIN dwarf.step n ON n.flow_id = f.id AND n.task = 'Nap'
  JOIN dwarf.step w ON w.flow_id = f.id AND w.task = 'Woke'
 WHERE g.name = 'bench_wait10k' AND f.created_at >= '$start';
SQL
