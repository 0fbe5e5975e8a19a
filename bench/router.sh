#!/bin/bash
# dwarf on two shards behind a dwarf_router, against one server alone.
#
# Starts three throwaway servers on unix sockets in $DIR (durable defaults:
# fsync and synchronous_commit on): shards 0 and 1 (dwarf preloaded,
# dwarf.shard_id 0 and 1) and a router (PL/Proxy + dwarf_router, the two
# shards as foreign server dwarf_shards).  The graph bench_linear_10 (ten
# no-op steps, as bench/dwarf-bench defines it) is defined through the
# router, and bench/pgbench/run_linear.sql (one dwarf.run of it per
# transaction) is run with pgbench, $SECS s each:
#
#   alone    against shard 0 only, $CLIENTS clients: one server's rate
#   direct   against both shards at once, $CLIENTS clients each
#   router   against the router, 2 x $CLIENTS clients: the flows spread
#            over the shards (each shard's share counted in its dwarf.step)
#   latency  dwarf.run at a fixed $RATE runs/s (issue 23's load) from
#            2 x $CLIENTS clients, $LAT_SECS s each: p50/p95/p99/max of
#            each call's time (pgbench's per-transaction log, less the lag
#            behind the schedule, as an application times a call) directly
#            (both shards, half the rate and $CLIENTS clients each),
#            through the router on new connections (each client's first
#            call to a shard opens its PL/Proxy connection there), and
#            through the router with each client first calling
#            dwarf_router.shards(), which opens them all, as a pool should
#            when it opens a connection (that call not counted)
#   per call one client: dwarf.await of a closed flow (the cheapest routed
#            call) and dwarf.run, directly and through the router; the
#            difference in latency is the router's overhead per call
#
# Steps/s = flows/s x 10.  On a machine whose cores the three servers share
# no speed-up is expected (bench/README.md, "Shards" says how to show scale).
# About two minutes in all with the defaults.  Run as root (it switches to the
# postgres user) or as postgres, after `make install`:
#   bench/router.sh                      # CLIENTS=8 SECS=10 RATE=268 LAT_SECS=10
#   CLIENTS=16 SECS=30 KEEP=1 bench/router.sh
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
DIR=${DIR:-/var/tmp/dwarf-router-bench}
PORT=${PORT:-5530}  # shard i listens on PORT + i, the router on PORT + 2
CLIENTS=${CLIENTS:-8}
SECS=${SECS:-10}
CALL_SECS=${CALL_SECS:-5}
RATE=${RATE:-268}
LAT_SECS=${LAT_SECS:-10}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ $(id -u) -eq 0 ]]; then
	mkdir -p "$DIR"
	chown postgres:postgres "$DIR"
	exec setpriv --reuid=postgres --regid=postgres --init-groups -- \
		env -i PATH="$PG_BIN:/usr/bin:/bin" HOME=/var/lib/postgresql LANG=C.UTF-8 \
		PG_BIN="$PG_BIN" DIR="$DIR" PORT="$PORT" CLIENTS="$CLIENTS" SECS="$SECS" \
		CALL_SECS="$CALL_SECS" RATE="$RATE" LAT_SECS="$LAT_SECS" KEEP="${KEEP:-0}" bash "${BASH_SOURCE[0]}"
fi
export PATH="$PG_BIN:$PATH"
export PGHOST="$DIR" PGUSER=postgres PGDATABASE=bench

q() { psql -X -q -At -v ON_ERROR_STOP=1 -p "$1" "${@:2}"; }
stop_all() {
	for n in shard0 shard1 router; do
		[[ -f $DIR/$n/postmaster.pid ]] && pg_ctl -D "$DIR/$n" stop -m fast -w >/dev/null 2>&1
	done
	if [[ ${KEEP:-0} != 1 ]]; then rm -rf "${DIR:?}"/{shard0,shard1,router,*.log,*.sql,*.out,lat-*}; fi
}
trap stop_all EXIT

# --- three servers ---------------------------------------------------------
for i in 0 1 2; do
	n=$([[ $i == 2 ]] && echo router || echo "shard$i")
	rm -rf "${DIR:?}/$n"
	initdb -D "$DIR/$n" -U postgres -A trust -E UTF8 >/dev/null
	{
		echo "port = $((PORT + i))"
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$DIR'"
		echo "max_connections = 100"
		if [[ $i != 2 ]]; then
			echo "shared_preload_libraries = 'dwarf'"
			echo "dwarf.shard_id = $i"
			echo "max_worker_processes = 16"
		fi
	} >>"$DIR/$n/postgresql.conf"
	pg_ctl -D "$DIR/$n" -l "$DIR/$n.log" -w start >/dev/null
	q $((PORT + i)) -d postgres -c 'CREATE DATABASE bench'
done
for i in 0 1; do
	q $((PORT + i)) <<-'SQL'
		CREATE EXTENSION dwarf;
		CREATE SCHEMA dwarf_bench;
		CREATE FUNCTION dwarf_bench.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
	SQL
done
ROUTER=$((PORT + 2))
q $ROUTER <<SQL
CREATE EXTENSION plproxy;
CREATE EXTENSION dwarf_router;
CREATE SERVER dwarf_shards FOREIGN DATA WRAPPER plproxy
	OPTIONS (p0 'host=$DIR port=$PORT dbname=bench', p1 'host=$DIR port=$((PORT + 1)) dbname=bench');
CREATE USER MAPPING FOR PUBLIC SERVER dwarf_shards;
SELECT dwarf.define('bench_linear_10', jsonb_build_object(
	'tasks', (SELECT jsonb_object_agg('S' || i, 'dwarf_bench.noop') FROM generate_series(1, 10) i),
	'transitions', jsonb_build_array(jsonb_build_object('chain',
		(SELECT jsonb_agg('S' || i ORDER BY i) FROM generate_series(1, 10) i) || '["END"]'::jsonb))))
	\g /dev/null
SQL
echo "router: $(q $ROUTER -F ' ' -c "SELECT string_agg('p' || partition || (CASE WHEN ok THEN ' ok' ELSE ' ' || problem END), ', ') FROM dwarf_router.shards()")"
echo "durable: $(q $PORT -c "SELECT current_setting('fsync') || '/' || current_setting('synchronous_commit')") (fsync/synchronous_commit); $(nproc) cores; $CLIENTS clients a server, $SECS s a run"

# pgbench PORT CLIENTS SECS SCRIPT [TAG [OPTION...]]: "tps latency_ms" of a
# run; with TAG, each transaction's latency is logged in $DIR/lat-TAG.* for pct
bench() {
	local log=()
	if [[ -n ${5:-} ]]; then
		rm -f "$DIR/lat-$5".*
		log=(-l --log-prefix="$DIR/lat-$5" "${@:6}")
	fi
	pgbench -n -M prepared -c "$2" -j 2 -T "$3" -p "$1" -f "$4" "${log[@]}" 2>&1 |
		awk '/^latency average/ {lat = $4} /^tps/ {tps = $3} /aborted/ {bad = 1}
		     END {if (bad || tps == "") {print "FAILED"; exit 1}; printf "%.1f %.2f\n", tps, lat}'
}
# pct FIRST TAG...: "p50 p95 p99 max" in ms of the transactions logged under
# the tags, from each client's FIRST-th on (pgbench numbers them from 1):
# the time of the call, less its lag behind the rate's schedule (field 7)
pct() {
	local first=$1 t
	shift
	for t; do cat "$DIR/lat-$t".*; done | awk -v f="$first" '$2 >= f {print ($3 - $7) / 1000}' | sort -n |
		awk '{v[NR] = $1} END {n = NR; printf "%.1f %.1f %.1f %.1f\n",
			v[int(n * 0.50 + 0.999)], v[int(n * 0.95 + 0.999)], v[int(n * 0.99 + 0.999)], v[n]}'
}
steps() { q "$1" -c 'SELECT count(*) FROM dwarf.step'; }
LINEAR=$ROOT/bench/pgbench/run_linear.sql
cp "$LINEAR" "$DIR/run_linear.sql"  # readable by postgres wherever the tree is
LINEAR=$DIR/run_linear.sql
# The same, but each client's first transaction only opens its connections
# to the shards (variables persist across a client's transactions), as a
# pool that warms each new connection would.
WARM=$DIR/run_warm.sql
{
	echo '\if :warm = 0'
	echo 'SELECT count(*) FROM dwarf_router.shards();'
	echo '\set warm 1'
	echo '\else'
	cat "$LINEAR"
	echo '\endif'
} >"$WARM"

# --- one server alone --------------------------------------------------------
bench $PORT 2 3 "$LINEAR" >/dev/null  # warm-up: plans, caches, worker graphs
bench $((PORT + 1)) 2 3 "$LINEAR" >/dev/null
read -r alone_tps alone_lat < <(bench $PORT "$CLIENTS" "$SECS" "$LINEAR")

# --- both shards directly, at once -------------------------------------------
bench $PORT "$CLIENTS" "$SECS" "$LINEAR" >"$DIR/d0.out" &
bench $((PORT + 1)) "$CLIENTS" "$SECS" "$LINEAR" >"$DIR/d1.out"
wait
read -r d0_tps d0_lat <"$DIR/d0.out"
read -r d1_tps d1_lat <"$DIR/d1.out"

# --- through the router --------------------------------------------------------
s0=$(steps $PORT)
s1=$(steps $((PORT + 1)))
read -r r_tps r_lat < <(bench $ROUTER $((2 * CLIENTS)) "$SECS" "$LINEAR")
r0=$((($(steps $PORT) - s0) / SECS))
r1=$((($(steps $((PORT + 1))) - s1) / SECS))

# --- latency at a fixed rate ----------------------------------------------------
bench $PORT "$CLIENTS" "$LAT_SECS" "$LINEAR" d0 -R $((RATE / 2)) >/dev/null &
bench $((PORT + 1)) "$CLIENTS" "$LAT_SECS" "$LINEAR" d1 -R $((RATE / 2)) >/dev/null
wait
bench $ROUTER $((2 * CLIENTS)) "$LAT_SECS" "$LINEAR" routed -R "$RATE" >/dev/null
bench $ROUTER $((2 * CLIENTS)) "$LAT_SECS" "$WARM" warmed -R "$RATE" -D warm=0 >/dev/null

# --- overhead per call: one client, directly and through the router -----------
flow=$(q $PORT -c "SELECT max(id) FROM dwarf.flow WHERE status = 'completed'")
echo "SELECT status FROM dwarf.await($flow, '0');" >"$DIR/await.sql"
read -r _ aw_direct < <(bench $PORT 1 "$CALL_SECS" "$DIR/await.sql")
read -r _ aw_router < <(bench $ROUTER 1 "$CALL_SECS" "$DIR/await.sql")
read -r _ run_direct < <(bench $PORT 1 "$CALL_SECS" "$LINEAR")
read -r _ run_router < <(bench $ROUTER 1 "$CALL_SECS" "$LINEAR")

# --- report --------------------------------------------------------------------
read -r d_p50 d_p95 d_p99 d_max < <(pct 1 d0 d1)
read -r r_p50 r_p95 r_p99 r_max < <(pct 1 routed)
read -r w_p50 w_p95 w_p99 w_max < <(pct 2 warmed)
awk -v c="$CLIENTS" \
	-v at="$alone_tps" -v al="$alone_lat" \
	-v d0="$d0_tps" -v d0l="$d0_lat" -v d1="$d1_tps" -v d1l="$d1_lat" \
	-v rt="$r_tps" -v rl="$r_lat" -v r0="$r0" -v r1="$r1" \
	-v awd="$aw_direct" -v awr="$aw_router" -v rd="$run_direct" -v rr="$run_router" \
	-v rate="$RATE" -v dp="$d_p50 $d_p95 $d_p99 $d_max" \
	-v rp="$r_p50 $r_p95 $r_p99 $r_max" -v wp="$w_p50 $w_p95 $w_p99 $w_max" 'BEGIN {
	printf "\n%-34s %10s %10s %10s %12s\n", "run (bench_linear_10, steps/s)", "shard 0", "shard 1", "total", "latency ms"
	printf "%-34s %10.0f %10s %10.0f %12.2f\n", "one server alone, " c " clients", at * 10, "-", at * 10, al
	printf "%-34s %10.0f %10.0f %10.0f %7.2f %.2f\n", "both shards directly, " c " each", d0 * 10, d1 * 10, (d0 + d1) * 10, d0l, d1l
	printf "%-34s %10d %10d %10.0f %12.2f\n", "through the router, " 2 * c " clients", r0, r1, rt * 10, rl
	printf "\n%-46s %8s %8s %8s %8s\n", "dwarf.run at " rate " runs/s, " 2 * c " clients: ms", "p50", "p95", "p99", "max"
	split(dp, d, " "); split(rp, r, " "); split(wp, w, " ")
	printf "%-46s %8s %8s %8s %8s\n", "both shards directly, " c " clients each", d[1], d[2], d[3], d[4]
	printf "%-46s %8s %8s %8s %8s\n", "through the router, new connections", r[1], r[2], r[3], r[4]
	printf "%-46s %8s %8s %8s %8s\n", "through the router, connections warmed", w[1], w[2], w[3], w[4]
	printf "\nrouter overhead per call (1 client): dwarf.await %.2f -> %.2f ms (+%.2f), dwarf.run %.2f -> %.2f ms (+%.2f)\n",
		awd, awr, awr - awd, rd, rr, rr - rd
	printf "per shard vs alone: directly %.0f%% and %.0f%%, through the router %.0f%% and %.0f%%\n",
		100 * d0 / at, 100 * d1 / at, 100 * r0 / (at * 10), 100 * r1 / (at * 10)
	printf "RESULT alone=%.0f direct0=%.0f direct1=%.0f router0=%d router1=%d router_total=%.0f await_overhead_ms=%.2f run_overhead_ms=%.2f direct_p99_ms=%s router_p99_ms=%s router_warmed_p99_ms=%s\n",
		at * 10, d0 * 10, d1 * 10, r0, r1, rt * 10, awr - awd, rr - rd, d[3], r[3], w[3]
}'
