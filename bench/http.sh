#!/bin/bash
# HTTP tasks: N flows whose one step is an HTTP call that the test server
# (test/http_server.py, loopback) answers after DELAY_S seconds, all in
# flight at once.  Reports how long all took to complete, the peak of calls
# in flight as the HTTP server counted them, the throughput, and the CPU of
# dwarf's processes (workers, HTTP process, launcher: utime + stime from
# /proc) over the run.
#   bench/http.sh "host=/var/tmp/dwarfbench port=5480 dbname=bench" [calls] [delay_s]
# The server must preload dwarf, with the extension created in that
# database.  The script sets dwarf.http_allow (to the test server's URL)
# and dwarf.http_max_host_connections with ALTER SYSTEM, so it connects as
# a superuser, and resets them at the end.  Run as root or as the server's
# OS user (the CPU figure reads /proc).
set -euo pipefail
DSN=${1:?usage: http.sh DSN [calls] [delay_s]}
N=${2:-2000}
DELAY=${3:-10}
PSQL=(psql "$DSN" -X -q -At -v ON_ERROR_STOP=1)
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)

ulimit -n "$(ulimit -Hn)"
python3 "$HERE/../test/http_server.py" "$WORK/port" &
SERVER=$!
cleanup() {
	kill "$SERVER" 2>/dev/null || true
	"${PSQL[@]}" -c "ALTER SYSTEM RESET dwarf.http_allow" -c "ALTER SYSTEM RESET dwarf.http_max_host_connections" \
		-c "SELECT pg_reload_conf()" >/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 100); do [[ -s $WORK/port ]] && break; sleep 0.1; done
PORT=$(cat "$WORK/port")
BASE="http://127.0.0.1:$PORT"

"${PSQL[@]}" <<SQL >/dev/null
ALTER SYSTEM SET dwarf.http_allow = '$BASE/';
ALTER SYSTEM SET dwarf.http_max_host_connections = $((N + 100));
SELECT pg_reload_conf();
SELECT dwarf.define('bench_http', '{"tasks": {"Call": {"http": "POST $BASE/delay/$((DELAY * 1000))", "timeout": "$((DELAY * 3)) s"}},
  "transitions": [{"chain": ["Call", "END"]}]}');
SQL
for _ in $(seq 1 100); do
	[[ $("${PSQL[@]}" -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http' AND datname = current_database()") == 1 ]] && break
	sleep 0.1
done

dwarf_ticks() {
	local t=0 p
	for p in $("${PSQL[@]}" -c "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'dwarf%' AND (datname = current_database() OR datname IS NULL)"); do
		[[ -r /proc/$p/stat ]] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}

curl -s "$BASE/reset" >/dev/null
t0=$(dwarf_ticks)
start=$("${PSQL[@]}" -c "SELECT clock_timestamp()")
"${PSQL[@]}" -c "SELECT count(dwarf.create('bench_http', '{}')) FROM generate_series(1, $N)" >/dev/null
begun=$(date +%s.%N)
for _ in $(seq 1 $((DELAY * 10 + 600))); do
	left=$("${PSQL[@]}" -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_http' AND f.status = 'running' AND f.created_at >= '$start'")
	[[ $left == 0 ]] && break
	sleep 0.1
done
ended=$(date +%s.%N)
t1=$(dwarf_ticks)
curl -s "$BASE/stats" >"$WORK/stats"
"${PSQL[@]}" -F ' ' -c "SELECT 'completed: ' || count(*) FILTER (WHERE f.status = 'completed') || ' of ' || count(*)
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_http' AND f.created_at >= '$start'"
python3 - "$WORK/stats" "$begun" "$ended" "$N" "$DELAY" "$((t1 - t0))" "$(getconf CLK_TCK)" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); begun, ended = float(sys.argv[2]), float(sys.argv[3])
n, delay, ticks, hz = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
took = ended - begun
print(f"{n} calls of {delay} s: all closed {took:.1f} s after the creates committed; "
      f"requests {s['requests']}, peak in flight {s['peak']}")
print(f"throughput {n / took:.0f} calls/s (in flight / duration = {n / delay:.0f}/s); "
      f"dwarf's processes' CPU over the run: {ticks / hz:.2f} s")
PY
