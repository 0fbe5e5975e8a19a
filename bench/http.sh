#!/bin/bash
# HTTP tasks against the test server (test/http_server.py, loopback), which
# answers each call after DELAY_S seconds.  Two shapes:
#
# MODE=burst (the default): N flows whose one step is such a call, created
# at once, all in flight together.  Reports how long all took to close,
# the peak in flight as the HTTP server counted it, the throughput, and the
# CPU of dwarf's processes (workers, HTTP process, launcher: utime + stime
# from /proc) over the run.
#
# MODE=steady: N flows, each a chain of STEPS calls (default 5), their
# creates spread evenly over DELAY_S seconds, so that N calls are in flight
# at every moment, each flow's next call made as its last one is recorded:
# a closed loop of N inside the engine, with no client in it.  Over a
# window that starts once every flow is created and its first call has
# ended (WINDOW_FROM, default 1.5 x DELAY_S after the first create) and
# ends before the first flows finish (WINDOW_TO, default (STEPS - 0.2) x
# DELAY_S), it reports the calls answered per second (the HTTP server's
# count) and the steps recorded per second (dwarf.step), against the
# ideal N / DELAY_S; the flows running and the calls in flight at the
# server (sampled every second: min and mean); and dwarf's processes' CPU
# over the window as a fraction of one core, and the whole machine's (from
# /proc/stat: other work shares it).  SAMPLES=FILE keeps the per-second
# samples.
#
#   bench/http.sh "host=/var/tmp/dwarfbench port=5480 dbname=bench" [calls] [delay_s]
#   MODE=steady bench/http.sh "host=/var/tmp/dwarfbench port=5480 dbname=bench" 10000 60
#
# The server must preload dwarf, with the extension created in that
# database.  The script sets dwarf.http_allow (to the test server's URL),
# dwarf.http_max_host_connections and dwarf.http_max_in_flight with ALTER
# SYSTEM, so it connects as a superuser, and resets them at the end.  Run
# as root or as the server's OS user (the CPU figure reads /proc).
set -euo pipefail
DSN=${1:?usage: [MODE=burst|steady] http.sh DSN [calls] [delay_s]}
N=${2:-2000}
DELAY=${3:-10}
MODE=${MODE:-burst}
PSQL=(psql "$DSN" -X -q -At -v ON_ERROR_STOP=1)
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
[[ $MODE == burst || $MODE == steady ]] || { echo "MODE is burst or steady" >&2; exit 2; }

ulimit -n "$(ulimit -Hn)"
python3 "$HERE/../test/http_server.py" "$WORK/port" &
SERVER=$!
CREATOR=
cleanup() {
	[[ -n $CREATOR ]] && kill "$CREATOR" 2>/dev/null || true
	kill "$SERVER" 2>/dev/null || true
	"${PSQL[@]}" -c "ALTER SYSTEM RESET dwarf.http_allow" -c "ALTER SYSTEM RESET dwarf.http_max_host_connections" \
		-c "ALTER SYSTEM RESET dwarf.http_max_in_flight" -c "SELECT pg_reload_conf()" >/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 100); do [[ -s $WORK/port ]] && break; sleep 0.1; done
PORT=$(cat "$WORK/port")
BASE="http://127.0.0.1:$PORT"
CALL="{\"http\": \"POST $BASE/delay/$((DELAY * 1000))\", \"timeout\": \"$((DELAY * 3)) s\"}"

"${PSQL[@]}" <<SQL >/dev/null
ALTER SYSTEM SET dwarf.http_allow = '$BASE/';
ALTER SYSTEM SET dwarf.http_max_host_connections = $((N + 100));
ALTER SYSTEM SET dwarf.http_max_in_flight = $((N > 9900 ? N + 100 : 10000));
SELECT pg_reload_conf();
SQL
for _ in $(seq 1 100); do
	[[ $("${PSQL[@]}" -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf http' AND datname = current_database()") == 1 ]] && break
	sleep 0.1
done

# The pids of dwarf's processes of this database, and their CPU in ticks.
dwarf_pids() {
	"${PSQL[@]}" -c "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'dwarf%' AND (datname = current_database() OR datname IS NULL)"
}
dwarf_ticks() {
	local t=0 p
	for p in "$@"; do
		[[ -r /proc/$p/stat ]] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}

burst() {
	"${PSQL[@]}" -c "SELECT dwarf.define('bench_http', '{\"tasks\": {\"Call\": $CALL}, \"transitions\": [{\"chain\": [\"Call\", \"END\"]}]}')" >/dev/null
	curl -s "$BASE/reset" >/dev/null
	t0=$(dwarf_ticks $(dwarf_pids))
	start=$("${PSQL[@]}" -c "SELECT clock_timestamp()")
	"${PSQL[@]}" -c "SELECT count(dwarf.create('bench_http', '{}')) FROM generate_series(1, $N)" >/dev/null
	begun=$(date +%s.%N)
	for _ in $(seq 1 $((DELAY * 10 + 600))); do
		left=$("${PSQL[@]}" -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_http' AND f.status = 'running' AND f.created_at >= '$start'")
		[[ $left == 0 ]] && break
		sleep 0.1
	done
	ended=$(date +%s.%N)
	t1=$(dwarf_ticks $(dwarf_pids))
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
}

steady() {
	local steps=${STEPS:-5} tasks="" chain="" i batches per start t0 now sample
	local from=${WINDOW_FROM:-$((DELAY * 3 / 2))} to=${WINDOW_TO:-$((DELAY * (steps * 10 - 2) / 10))}
	local samples=${SAMPLES:-$WORK/samples}
	for i in $(seq 1 "$steps"); do
		tasks+="${tasks:+, }\"Call$i\": $CALL"
		chain+="\"Call$i\", "
	done
	"${PSQL[@]}" -c "SELECT dwarf.define('bench_http_steady', '{\"tasks\": {$tasks}, \"transitions\": [{\"chain\": [${chain}\"END\"]}]}')" >/dev/null
	curl -s "$BASE/reset" >/dev/null

	# the creates: a batch every half second for DELAY seconds, each committed
	batches=$((DELAY * 2))
	start=$("${PSQL[@]}" -c "SELECT clock_timestamp()")
	t0=$(date +%s.%N)
	for i in $(seq 0 $((batches - 1))); do
		per=$(((N * (i + 1)) / batches - (N * i) / batches))
		echo "SELECT pg_sleep_until('$start'::timestamptz + interval '$((i * 500)) ms');"
		echo "SELECT count(dwarf.create('bench_http_steady', '{}')) FROM generate_series(1, $per);"
	done | "${PSQL[@]}" >/dev/null &
	CREATOR=$!

	# a sample a second until every flow closed (or far past when they should have)
	: >"$samples"
	for _ in $(seq 1 $((DELAY * (steps + 1) + 180))); do
		now=$(date +%s.%N)
		sample=$("${PSQL[@]}" -F ' ' -c "SELECT count(*) FILTER (WHERE f.status = 'running'), count(*)
		  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_http_steady' AND f.created_at >= '$start'")
		echo "$now $sample $(curl -s "$BASE/counts" | tr -d ' ') $(dwarf_ticks $(dwarf_pids)) $(awk '/^cpu /{print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat)" >>"$samples"
		set -- $sample
		[[ $1 == 0 && $2 == "$N" ]] && break
		sleep "$(python3 -c "import time; print(max(0, 1 - (time.time() - $now)))")"
	done
	wait "$CREATOR"
	CREATOR=
	"${PSQL[@]}" -F ' ' -c "SELECT 'completed: ' || count(*) FILTER (WHERE f.status = 'completed') || ' of ' || count(*)
	  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_http_steady' AND f.created_at >= '$start'"
	# the steps recorded in the window, by when they finished
	"${PSQL[@]}" -c "SELECT extract(epoch FROM s.finished_at) FROM dwarf.step s JOIN dwarf.flow f ON f.id = s.flow_id
	  JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'bench_http_steady' AND f.created_at >= '$start'
	  AND s.finished_at BETWEEN '$start'::timestamptz + interval '$from s' AND '$start'::timestamptz + interval '$to s'" >"$WORK/steps"
	python3 - "$samples" "$WORK/steps" "$t0" "$from" "$to" "$N" "$DELAY" "$steps" "$(getconf CLK_TCK)" <<'PY'
import json, sys
samples, steps_file = sys.argv[1], sys.argv[2]
t0, lo, hi = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
n, delay, steps, hz = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
rows = []
for line in open(samples):
    now, running, total, counts, ticks, busy = line.split()
    rows.append((float(now) - t0, int(running), int(total), json.loads(counts), int(ticks), int(busy)))
win = [r for r in rows if lo <= r[0] <= hi]
if len(win) < 2:
    sys.exit("the run ended before the window: no figures")
a, b = win[0], win[-1]
span = b[0] - a[0]
answered = (b[3]["answered"] - a[3]["answered"]) / span
recorded = sum(1 for _ in open(steps_file)) / (hi - lo)
running = [r[1] for r in win]
server = [r[3]["in_flight"] for r in win]
mean_running = sum(running) / len(running)
mean_server = sum(server) / len(server)
cpu = (b[4] - a[4]) / hz
ideal = mean_running / delay
print(f"{n} flows x {steps} calls of {delay} s, creates spread over {delay} s; window {a[0]:.0f}-{b[0]:.0f} s "
      f"after the first create ({len(win)} samples), last flow closed {rows[-1][0]:.0f} s after it")
print(f"flows running in the window: min {min(running)}, mean {mean_running:.0f}; "
      f"calls in flight at the server: min {min(server)}, mean {mean_server:.0f}, peak {rows[-1][3]['peak']}")
print(f"throughput: {answered:.1f} calls answered/s (server), {recorded:.1f} steps recorded/s (dwarf.step); "
      f"ideal {ideal:.1f}/s (flows running / {delay} s): {100 * answered / ideal:.1f}% and {100 * recorded / ideal:.1f}%")
print(f"dwarf's processes' CPU over the window: {cpu:.2f} s in {span:.0f} s = {cpu / span:.3f} of one core; "
      f"the machine's (everything): {(b[5] - a[5]) / hz / span:.2f} cores")
PY
}

"$MODE"
