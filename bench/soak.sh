#!/bin/bash
# Soak: an hour (SOAK_MINUTES) of mixed load against a running server that
# preloads dwarf, sampling the dwarf processes' memory and the live tables'
# size, to show whether anything grows.  See "Soak" in bench/README.md.
#
#   PGHOST=/var/tmp/soakdb PGPORT=5498 PGDATABASE=soak PGUSER=postgres bench/soak.sh
#
# The database needs CREATE EXTENSION dwarf; the script creates schema soak
# (task functions, graphs, table soak.odd) from bench/soak/setup.sql.  Run it
# on the server's machine (it reads /proc/<pid> of the dwarf processes: as
# root or as the server's OS user), over a unix socket (PGHOST a directory).
#
# Load: pgbench, SOAK_CLIENTS (8) clients at SOAK_RATE (100) transactions/s
# in total, scripts bench/soak/*.sql by weight:
#   quick        dwarf.run of a 10-step no-op chain                 (waited)
#   slow         Pre -> Slow (pg_sleep 300-800 ms, runs in runners) -> Post
#   fail         A -> Boom (raises): the flow fails                 (waited)
#   fail_handled A -> Boom -on_error-> Handle: completes             (waited)
#   retry        Flaky: dwarf.retry('100 ms', 2, '1 s') until attempt 2 or 3
#   sleep        Nap: dwarf.sleep(1-5 s) -> Woke
#   interrupt    Ask: dwarf.interrupt; resumed 2-5 s later by a loop here
# Beside it: a loop resuming due interrupted flows (every SOAK_RESUME_SECONDS,
# 1) and a loop running dwarf.purge(older_than => SOAK_PURGE_AGE, '2 minutes')
# every SOAK_PURGE_SECONDS (60), so that the live tables should stay flat.
#
# Every SOAK_SAMPLE_SECONDS (60) one CSV row (bench/results/soak-<date>.csv):
# memory of the database's dwarf workers (summed) and of the launcher (VmRSS and
# RssAnon from /proc/<pid>/status, Pss from smaps_rollup), their CPU, runners
# alive, pg_total_relation_size of dwarf.flow and dwarf.step, flows by status
# (dwarf.stats), steps/s (the workers' step counters in dwarf.stats), step
# rows/s and flows created/s (dwarf.step_seq, dwarf.flow_seq), flows closed
# in the window by outcome (flows that ended wrongly go to soak.odd too),
# p50/p99 duration of quick and slow flows, purged and resumed so far.
# After the load: up to SOAK_DRAIN_SECONDS (60) for the soak flows to close,
# one last sample, then the least-squares slope per hour of each series over
# the second half of the load (warm-up skipped) and FLAT or GROWING against
# SOAK_THRESHOLD_PCT (5) % of the series' mean per hour.
#
# Other settings: SOAK_WEIGHTS ("quick=50 slow=5 fail=5 fail_handled=5 retry=10
# sleep=15 interrupt=10"), SOAK_CSV (output file), SOAK_SERVER_LOG (the
# server's log file: its new ERROR/WARNING/FATAL/PANIC lines are summarised at
# the end).  Bounded: the load stops after SOAK_MINUTES, everything after
# SOAK_MINUTES + 5 minutes; background jobs are stopped on exit or interrupt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SOAK_MINUTES=${SOAK_MINUTES:-60}
SOAK_SAMPLE_SECONDS=${SOAK_SAMPLE_SECONDS:-60}
SOAK_CLIENTS=${SOAK_CLIENTS:-8}
SOAK_RATE=${SOAK_RATE:-100}
SOAK_WEIGHTS=${SOAK_WEIGHTS:-"quick=50 slow=5 fail=5 fail_handled=5 retry=10 sleep=15 interrupt=10"}
SOAK_PURGE_AGE=${SOAK_PURGE_AGE:-"2 minutes"}
SOAK_PURGE_SECONDS=${SOAK_PURGE_SECONDS:-60}
SOAK_RESUME_SECONDS=${SOAK_RESUME_SECONDS:-1}
SOAK_DRAIN_SECONDS=${SOAK_DRAIN_SECONDS:-60}
SOAK_THRESHOLD_PCT=${SOAK_THRESHOLD_PCT:-5}
SOAK_SERVER_LOG=${SOAK_SERVER_LOG:-}
STAMP=$(date -u +%Y%m%d-%H%M%S)
SOAK_CSV=${SOAK_CSV:-bench/results/soak-$STAMP.csv}
PGBENCH=${PGBENCH:-pgbench}
PSQL=${PSQL:-psql}

die() { echo "soak: $*" >&2; exit 1; }
: "${PGDATABASE:?set PGHOST (a socket directory), PGPORT, PGDATABASE and PGUSER}"
[[ ${PGHOST:-} == /* ]] || die "PGHOST must be a unix socket directory (got '${PGHOST:-}')"
[[ $SOAK_MINUTES =~ ^[0-9]+$ && $SOAK_MINUTES -ge 2 ]] || die "SOAK_MINUTES must be a whole number >= 2"
[[ $SOAK_SAMPLE_SECONDS =~ ^[0-9]+$ && $SOAK_SAMPLE_SECONDS -ge 5 && $SOAK_SAMPLE_SECONDS -le 110 ]] ||
	die "SOAK_SAMPLE_SECONDS must be 5..110 (a window must be shorter than the purge age)"
command -v "$PGBENCH" >/dev/null || die "pgbench not found"
export PGOPTIONS="${PGOPTIONS:-} -c statement_timeout=60s"

LOAD_S=$((SOAK_MINUTES * 60))
DEADLINE=$((SECONDS + LOAD_S + 300))	# hard bound for the whole script
TMP=$(mktemp -d /tmp/soak.XXXXXX)
BG_PIDS=()

q() { timeout 90 "$PSQL" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

cleanup() {
	local p
	trap - EXIT INT TERM
	for p in "${BG_PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	for p in "${BG_PIDS[@]}"; do
		wait "$p" 2>/dev/null
	done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "soak: interrupted" >&2; exit 130' INT TERM

# A sleep that a TERM to the loop running it cuts short.
nap() { sleep "$1" & NAP_PID=$!; wait "$NAP_PID"; }
loop_trap() { trap 'kill "${NAP_PID:-}" 2>/dev/null; exit 0' TERM; }

# ---------------------------------------------------------------- setup
q -c "SELECT 1 FROM pg_extension WHERE extname = 'dwarf'" | grep -q 1 ||
	die "dwarf is not installed in database $PGDATABASE (CREATE EXTENSION dwarf)"
q -f bench/soak/setup.sql >/dev/null || die "setup failed"

settings=$(q -F ' ' -c "SELECT 'server=' || current_setting('server_version'),
  'fsync=' || current_setting('fsync'), 'synchronous_commit=' || current_setting('synchronous_commit'),
  'max_worker_processes=' || current_setting('max_worker_processes'),
  'shared_buffers=' || current_setting('shared_buffers'),
  'dwarf.workers=' || current_setting('dwarf.workers'), 'dwarf.batch_size=' || current_setting('dwarf.batch_size'),
  'dwarf.long_step=' || current_setting('dwarf.long_step'), 'dwarf.max_runners=' || current_setting('dwarf.max_runners')")
echo "soak: $settings"
echo "soak: ${SOAK_MINUTES} min of load, ${SOAK_CLIENTS} clients at ${SOAK_RATE} tx/s ($SOAK_WEIGHTS), sample every ${SOAK_SAMPLE_SECONDS} s, purge '$SOAK_PURGE_AGE' every ${SOAK_PURGE_SECONDS} s"

# One of each, in the order that teaches dwarf the slow task is slow; checks
# that every graph does what the soak expects before the load starts.
check=$(q -F ' ' <<'SQL'
SELECT 'quick=' || status FROM dwarf.run('soak_quick', '{}', timeout => '30 s');
SELECT 'slow=' || status FROM dwarf.run('soak_slow', '{"ms": 400}', timeout => '30 s');
SELECT 'fail=' || status FROM dwarf.run('soak_fail', '{}', timeout => '30 s');
SELECT 'fail_handled=' || status || coalesce('/' || (state->>'handled'), '') FROM dwarf.run('soak_fail_handled', '{}', timeout => '30 s');
SELECT 'retry=' || status || '/tries:' || coalesce(state->>'tries', '?') FROM dwarf.run('soak_retry', '{"need": 3}', timeout => '30 s');
SELECT 'sleep=' || status FROM dwarf.run('soak_sleep', '{"ms": 1000}', timeout => '30 s');
SELECT flow_id AS iid, status AS ist FROM dwarf.run('soak_interrupt', '{"resume_after": 0}', timeout => '30 s') \gset
SELECT dwarf.resume(:iid, '{"ok": true}') \g /dev/null
SELECT 'interrupt=' || :'ist' || '/' || status FROM dwarf.await(:iid, timeout => '30 s');
SQL
)
echo "soak: check: $(tr '\n' ' ' <<<"$check")"
grep -q '^quick=completed$' <<<"$check" && grep -q '^slow=completed$' <<<"$check" &&
	grep -q '^fail=failed$' <<<"$check" && grep -q '^fail_handled=completed/soak: planned failure$' <<<"$check" &&
	grep -q '^retry=completed/tries:3$' <<<"$check" && grep -q '^sleep=completed$' <<<"$check" &&
	grep -q '^interrupt=interrupted/completed$' <<<"$check" || die "a soak graph does not behave as expected"

log_offset=0
if [[ -n $SOAK_SERVER_LOG ]]; then
	[[ -r $SOAK_SERVER_LOG ]] || die "cannot read SOAK_SERVER_LOG $SOAK_SERVER_LOG"
	log_offset=$(stat -c %s "$SOAK_SERVER_LOG")
fi

# ---------------------------------------------------------------- sampling
mkdir -p "$(dirname "$SOAK_CSV")"
echo "unix_s,elapsed_s,phase,workers_n,workers_rss_kb,workers_anon_kb,workers_pss_kb,worker_rss_max_kb,workers_cpu_pct,launcher_rss_kb,launcher_anon_kb,launcher_pss_kb,runners_n,flow_bytes,step_bytes,live_bytes,flow_rows,step_rows,running,interrupted,completed,failed,cancelled,steps_total,steps_s,step_rows_s,flows_created_s,closed_ok,failed_expected,odd,quick_p50_ms,quick_p99_ms,slow_p50_ms,slow_p99_ms,purged_total,resumed_total,resume_errors,loadavg1,worker_pids,launcher_pid" >"$SOAK_CSV"
CLK_TCK=$(getconf CLK_TCK)
T0=$(date +%s.%N)
prev_t="" prev_steps="" prev_seq="" prev_fseq="" prev_ticks="" prev_pids=""
win_lo=$(q -c "SELECT now()")	# each sample counts the flows closed in (win_lo, now - 5 s]
first_pids=""

# VmRSS RssAnon Pss (kB) and utime+stime (ticks) of one process; blanks if gone.
proc_mem() {
	local p=$1 rss anon pss ticks
	rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null)
	anon=$(awk '/^RssAnon:/ {print $2}' "/proc/$p/status" 2>/dev/null)
	pss=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null)
	ticks=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null)
	echo "${rss:-} ${anon:-} ${pss:-} ${ticks:-}"
}

sample() {
	local phase=$1 row now_s
	row=$(q -F '|' -v lo="$win_lo" <<'SQL'
WITH g AS (SELECT id, name FROM dwarf.graph WHERE name LIKE 'soak\_%'),
win AS (
  SELECT f.id, g.name, f.status, f.error, f.finished_at,
         extract(epoch FROM f.finished_at - f.created_at) * 1000 AS ms,
         CASE
           WHEN g.name = 'soak_fail' AND f.status <> 'failed' THEN 'should have failed'
           WHEN g.name <> 'soak_fail' AND f.status <> 'completed' THEN 'did not complete'
           WHEN g.name = 'soak_fail_handled' AND NOT f.state ? 'handled' THEN 'handler did not run'
           WHEN g.name = 'soak_retry' AND f.state->>'tries' IS DISTINCT FROM f.input->>'need' THEN 'wrong number of tries'
           WHEN g.name = 'soak_sleep' AND f.finished_at - f.created_at < make_interval(secs => (f.input->>'ms')::int / 1000.0)
             THEN 'woke early'
           WHEN g.name = 'soak_interrupt' AND f.state->'answer' IS DISTINCT FROM '{"ok": true}' THEN 'no resume answer'
           WHEN g.name = 'soak_slow' AND NOT f.state ? 'slept_ms' THEN 'slow task did not run'
         END AS odd
    FROM dwarf.flow f JOIN g ON g.id = f.graph_id
   WHERE f.finished_at > :'lo'::timestamptz AND f.finished_at <= now() - interval '5 s'),
ins AS (
  INSERT INTO soak.odd (flow_id, graph, status, what, error, finished_at)
  SELECT id, name, status, odd, error, finished_at FROM win WHERE odd IS NOT NULL
  ON CONFLICT DO NOTHING RETURNING 1),
st AS (SELECT * FROM dwarf.stats)
SELECT extract(epoch FROM now()),
       now() - interval '5 s',
       (SELECT string_agg(pid::text, ' ' ORDER BY pid) FROM pg_stat_activity
         WHERE backend_type = 'dwarf worker' AND datname = current_database()),
       (SELECT min(pid) FROM pg_stat_activity WHERE backend_type = 'dwarf launcher'),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf runner'),
       pg_total_relation_size('dwarf.flow'), (SELECT live_step_bytes FROM dwarf.storage),
       st.running + st.interrupted + st.completed + st.failed + st.cancelled, st.steps_done,
       st.running, st.interrupted, st.completed, st.failed, st.cancelled,
       (SELECT coalesce(sum((w->>'steps')::bigint), 0) FROM jsonb_array_elements(st.workers) w),
       (SELECT last_value FROM dwarf.step_seq), (SELECT last_value FROM dwarf.flow_seq),
       (SELECT count(*) FROM win WHERE status = 'completed' AND odd IS NULL),
       (SELECT count(*) FROM win WHERE name = 'soak_fail' AND status = 'failed'),
       (SELECT count(*) FROM win WHERE odd IS NOT NULL),
       (SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1) FROM win WHERE name = 'soak_quick'),
       (SELECT round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1) FROM win WHERE name = 'soak_quick'),
       (SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1) FROM win WHERE name = 'soak_slow'),
       (SELECT round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1) FROM win WHERE name = 'soak_slow'),
       (SELECT count(*) FROM ins)
  FROM st;
SQL
	) || { echo "soak: sample query failed" >&2; return 1; }
	local now_e lo pids lpid runners fb sb frows srows run intr comp fail canc steps seq fseq ok fexp odd q50 q99 s50 s99 _ins
	IFS='|' read -r now_e lo pids lpid runners fb sb frows srows run intr comp fail canc steps seq fseq ok fexp odd q50 q99 s50 s99 _ins <<<"$row"
	win_lo=$lo
	[[ -z $first_pids ]] && first_pids=$pids
	local p n=0 rss_sum=0 anon_sum=0 pss_sum=0 rss_max=0 ticks_sum=0 m
	local -a f
	for p in $pids; do
		m=$(proc_mem "$p"); read -ra f <<<"$m"
		((n++))
		rss_sum=$((rss_sum + ${f[0]:-0})); anon_sum=$((anon_sum + ${f[1]:-0}))
		pss_sum=$((pss_sum + ${f[2]:-0})); ticks_sum=$((ticks_sum + ${f[3]:-0}))
		((${f[0]:-0} > rss_max)) && rss_max=${f[0]}
	done
	local lrss="" lanon="" lpss=""
	if [[ -n $lpid ]]; then
		m=$(proc_mem "$lpid"); read -ra f <<<"$m"
		lrss=${f[0]:-}; lanon=${f[1]:-}; lpss=${f[2]:-}
	fi
	now_s=$(date +%s.%N)
	local el steps_s="" seq_s="" fseq_s="" cpu=""
	el=$(awk -v a="$now_s" -v b="$T0" 'BEGIN {printf "%.0f", a - b}')
	if [[ -n $prev_t ]]; then
		read -r steps_s seq_s fseq_s < <(awk -v t="$now_e" -v pt="$prev_t" -v s="$steps" -v ps="$prev_steps" \
			-v q="$seq" -v pq="$prev_seq" -v fq="$fseq" -v pfq="$prev_fseq" \
			'BEGIN {d = t - pt; printf "%s %.0f %.0f\n", (s >= ps ? sprintf("%.0f", (s - ps) / d) : "NA"), (q - pq) / d, (fq - pfq) / d}')
		[[ $pids == "$prev_pids" ]] &&
			cpu=$(awk -v a="$ticks_sum" -v b="$prev_ticks" -v t="$now_e" -v pt="$prev_t" -v hz="$CLK_TCK" \
				'BEGIN {printf "%.1f", (a - b) / hz / (t - pt) * 100}')
	fi
	prev_t=$now_e prev_steps=$steps prev_seq=$seq prev_fseq=$fseq prev_ticks=$ticks_sum prev_pids=$pids
	local purged resumed rerr load1
	purged=$(awk '{s += $2} END {print s + 0}' "$TMP/purge.log" 2>/dev/null || echo 0)
	resumed=$(awk '{s += $2} END {print s + 0}' "$TMP/resume.log" 2>/dev/null || echo 0)
	rerr=$(awk '{s += $3} END {print s + 0}' "$TMP/resume.log" 2>/dev/null || echo 0)
	load1=$(cut -d' ' -f1 /proc/loadavg)
	echo "$(printf %.0f "$now_e"),$el,$phase,$n,$rss_sum,$anon_sum,$pss_sum,$rss_max,$cpu,$lrss,$lanon,$lpss,$runners,$fb,$sb,$((fb + sb)),$frows,$srows,$run,$intr,$comp,$fail,$canc,$steps,$steps_s,$seq_s,$fseq_s,$ok,$fexp,$odd,$q50,$q99,$s50,$s99,$purged,$resumed,$rerr,$load1,$pids,$lpid" >>"$SOAK_CSV"
	printf 'soak: %5ss %-5s workers rss %s kB (anon %s, cpu %s%%) launcher %s kB | flow %s kB step %s kB | running %s interrupted %s | %s steps/s, %s flows/s created | closed ok %s failed(planned) %s odd %s | quick p50/p99 %s/%s ms | purged %s resumed %s\n' \
		"$el" "$phase" "$rss_sum" "$anon_sum" "${cpu:-?}" "${lrss:-?}" $((fb / 1024)) $((sb / 1024)) "$run" "$intr" \
		"${steps_s:-?}" "${fseq_s:-?}" "$ok" "$fexp" "$odd" "${q50:-?}" "${q99:-?}" "$purged" "$resumed"
}

# The dwarf workers' memory contexts into the server log (superuser only),
# at the start and at the end of the load, to see what grew.
log_contexts() {
	q -c "SELECT pg_log_backend_memory_contexts(pid) FROM pg_stat_activity
	  WHERE backend_type = 'dwarf worker' AND datname = current_database()" >/dev/null 2>&1 ||
		echo "soak: could not log the workers' memory contexts (needs superuser)" >&2
}

# ---------------------------------------------------------------- load
: >"$TMP/purge.log"
: >"$TMP/resume.log"
(
	loop_trap
	while ((SECONDS < DEADLINE)); do
		nap "$SOAK_PURGE_SECONDS"
		n=$(q -c "SELECT dwarf.purge(older_than => '$SOAK_PURGE_AGE')" 2>>"$TMP/purge.err") || n=ERR
		echo "$(date +%s) ${n/ERR/0} ${n}" >>"$TMP/purge.log"
	done
) &
BG_PIDS+=($!)

(
	loop_trap
	while ((SECONDS < DEADLINE)); do
		nap "$SOAK_RESUME_SECONDS"
		ids=$(q -c "SELECT f.id FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		  WHERE f.status = 'interrupted' AND f.resume_data IS NULL AND g.name = 'soak_interrupt'
		    AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id AND s.status = 'interrupted'
		                 AND s.finished_at < now() - make_interval(secs => coalesce((f.input->>'resume_after')::int, 3)))" 2>>"$TMP/resume.err") || continue
		[[ -z $ids ]] && continue
		n=$(wc -w <<<"$ids")
		# one transaction per resume: one that fails takes no other with it
		errs=$(for id in $ids; do echo "SELECT dwarf.resume($id, '{\"ok\": true}');"; done |
			timeout 90 "$PSQL" -X -q -At 2>&1 >/dev/null | tee -a "$TMP/resume.err" | grep -c ERROR)
		echo "$(date +%s) $((n - errs)) $errs" >>"$TMP/resume.log"
	done
) &
BG_PIDS+=($!)

pgb_args=()
for w in $SOAK_WEIGHTS; do
	[[ -f bench/soak/${w%%=*}.sql ]] || die "no script bench/soak/${w%%=*}.sql"
	pgb_args+=(-f "bench/soak/${w%%=*}.sql@${w#*=}")
done

sample start
log_contexts
timeout -s TERM $((LOAD_S + 120)) "$PGBENCH" -n -M prepared -c "$SOAK_CLIENTS" -j 2 -R "$SOAK_RATE" -T "$LOAD_S" \
	-P "$SOAK_SAMPLE_SECONDS" "${pgb_args[@]}" >"$TMP/pgbench.out" 2>"$TMP/pgbench.err" &
PGB_PID=$!
BG_PIDS+=($PGB_PID)

next=$((SECONDS + SOAK_SAMPLE_SECONDS))
load_end=$((SECONDS + LOAD_S))
while kill -0 "$PGB_PID" 2>/dev/null && ((SECONDS < DEADLINE)); do
	if ((SECONDS >= next)); then
		((SECONDS < load_end - SOAK_SAMPLE_SECONDS / 2)) && sample load
		next=$((next + SOAK_SAMPLE_SECONDS))
	fi
	sleep 1
done
wait "$PGB_PID"; pgb_rc=$?
sample load	# the end of the load
log_contexts

# ---------------------------------------------------------------- drain
drain_end=$((SECONDS + SOAK_DRAIN_SECONDS))
while ((SECONDS < drain_end && SECONDS < DEADLINE)); do
	left=$(q -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	  WHERE g.name LIKE 'soak\_%' AND f.status IN ('running', 'interrupted')") || left="?"
	[[ $left == 0 ]] && break
	sleep 2
done
sleep 6	# so that the last window has seen every close (it lags 5 s)
sample drain
left=$(q -c "SELECT count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
  WHERE g.name LIKE 'soak\_%' AND f.status IN ('running', 'interrupted')")
for p in "${BG_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done

# ---------------------------------------------------------------- report
echo
echo "== pgbench (exit $pgb_rc)"
sed -n '/^transaction type/,$p' "$TMP/pgbench.out"
grep -v '^progress:' "$TMP/pgbench.err" | grep -v '^\s*$' | sort | uniq -c | sort -rn | head -10

echo
echo "== flows"
awk -F, 'NR > 1 {ok += $28; fe += $29; odd += $30} END {printf "closed as expected: %d, failed as planned (soak_fail): %d, ended wrongly: %d\n", ok, fe, odd}' "$SOAK_CSV"
echo "still running or interrupted after the drain: $left"
q -F ' ' -c "SELECT graph, what, count(*), min(error) FROM soak.odd WHERE seen_at >= to_timestamp(${T0%.*}) GROUP BY 1, 2 ORDER BY 3 DESC" |
	sed 's/^/  odd: /'
last_pids=$(tail -1 "$SOAK_CSV" | awk -F, '{print $(NF - 1)}')
[[ $last_pids == "$first_pids" ]] && echo "dwarf worker pids unchanged: $first_pids" ||
	echo "WARNING: dwarf worker pids changed: $first_pids -> $last_pids (a worker restarted)"
echo "purge: $(awk '{n++; s += $2} $3 == "ERR" {e++} END {printf "%d runs, %d flows deleted, %d errors", n, s, e}' "$TMP/purge.log")"
echo "resume: $(awk '{s += $2; e += $3} END {printf "%d flows resumed, %d errors", s, e}' "$TMP/resume.log")"
[[ -s $TMP/resume.err ]] && sort "$TMP/resume.err" | uniq -c | sort -rn | head -5 | sed 's/^/  /'
[[ -s $TMP/purge.err ]] && sort "$TMP/purge.err" | uniq -c | sort -rn | head -5 | sed 's/^/  /'

echo
echo "== trends over the second half of the load (least squares; threshold ${SOAK_THRESHOLD_PCT}% of the mean per hour)"
verdict=$(awk -F, -v thr="$SOAK_THRESHOLD_PCT" '
	NR == 1 {for (i = 1; i <= NF; i++) col[$i] = i; next}
	$3 == "load" {n++; t[n] = $2; for (k in col) v[n, k] = $(col[k])}
	END {
		half = t[n] / 2; split("workers_rss_kb workers_anon_kb workers_pss_kb launcher_rss_kb launcher_anon_kb flow_bytes step_bytes live_bytes", m, " ")
		# the verdict: private memory of the workers and the launcher, the live tables.
		# VmRSS and Pss also count the shared buffers a process has touched, which
		# grow until it has touched all of shared_buffers (the free list hands out
		# buffers never used before): reported, not judged.
		split("workers_anon_kb launcher_anon_kb flow_bytes step_bytes", judged, " ")
		for (j in judged) isj[judged[j]] = 1
		grow = 0
		printf "%-18s %12s %12s %12s %12s %14s %9s  %s\n", "series", "first", "last", "min", "max", "slope/h", "% mean/h", "verdict"
		for (j = 1; j <= 8; j++) {
			k = m[j]; c = 0; sx = sy = sxx = sxy = 0; mn = ""; mx = ""
			for (i = 1; i <= n; i++) {
				y = v[i, k]; if (y == "") continue
				if (mn == "" || y + 0 < mn) mn = y + 0; if (mx == "" || y + 0 > mx) mx = y + 0
				if (t[i] < half) continue
				x = t[i] / 3600; c++; sx += x; sy += y; sxx += x * x; sxy += x * y
			}
			if (c < 3) {printf "%-18s too few samples in the second half (%d)\n", k, c; continue}
			slope = (c * sxy - sx * sy) / (c * sxx - sx * sx); mean = sy / c
			pct = mean ? slope / mean * 100 : 0
			vd = pct >= thr ? "GROWING" : "FLAT"
			if (isj[k] && vd == "GROWING") grow = 1
			first = ""; for (i = 1; i <= n; i++) if (v[i, k] != "") {first = v[i, k]; break}
			last = ""; for (i = n; i >= 1; i--) if (v[i, k] != "") {last = v[i, k]; break}
			printf "%-18s %12s %12s %12s %12s %14.0f %8.1f%%  %s%s\n", k, first, last, mn, mx, slope, pct, vd, isj[k] ? "" : " (not judged)"
		}
		printf "VERDICT %s\n", grow ? "GROWING" : "FLAT"
	}' "$SOAK_CSV")
grep -v '^VERDICT' <<<"$verdict"
echo "(kB for memory, bytes for tables; workers_* are sums over the database's dwarf workers. The verdict"
echo " judges RssAnon, a process's private memory, where a leak shows; VmRSS and Pss also count the"
echo " shared buffers it has touched, which grow until it has touched all of shared_buffers)"

if [[ -n $SOAK_SERVER_LOG ]]; then
	echo
	echo "== server log since the start: lines by severity and message (timestamps, pids and numbers masked)"
	tail -c +$((log_offset + 1)) "$SOAK_SERVER_LOG" | grep -E ' (ERROR|WARNING|FATAL|PANIC|LOG):' |
		grep -vE 'checkpoint (starting|complete)|LOG:  (level: [0-9]+;|Grand total:|logging memory contexts)' |
		sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //; s/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -25
fi

if [[ -n $SOAK_SERVER_LOG ]]; then
	echo
	echo "== dwarf workers' memory contexts at the start and at the end of the load (used bytes)"
	tail -c +$((log_offset + 1)) "$SOAK_SERVER_LOG" | grep -E 'dwarf worker LOG:  (Grand total|level: [01]; )' |
		sed -E 's/^[0-9-]+ ([0-9:]+)[.0-9]* [A-Z]+ \[([0-9]+)\] dwarf worker LOG:  /\1 pid \2 /' |
		grep -E 'Grand total|TopMemoryContext|CacheMemoryContext|level: 1; dwarf' |
		sed -E 's/[0-9]+ (total in|bytes in) [0-9]+ blocks; [0-9]+ free \([0-9]+ chunks\); //; s/^/  /' | head -40
fi

echo
echo "CSV: $SOAK_CSV"
echo "$(grep '^VERDICT' <<<"$verdict")"
