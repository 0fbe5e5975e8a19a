#!/bin/bash
# What a dwarf.run costs the machine, and what the "12x the ceiling at 32
# clients" target lets it cost.  Starts its own server for each round (a
# fresh cluster, so that no round inherits the last one's tables or
# autovacuum), then runs, each for SECONDS_EACH s under pgbench -M
# prepared at CLIENTS clients, one after the other:
#   select1      SELECT 1: a bare round trip, the floor of any call
#   reference    bench/pgbench/reference.sql: the one-row durable commit (the ceiling)
#   run-1/10/20  dwarf.run of a linear flow of 1, 10 and 20 no-op steps
# For each it reads /proc/stat before and after: the machine's busy time
# (user + system + interrupts, every process, pgbench too) per
# transaction, how busy the machine was, and context switches per
# transaction.  From the three dwarf.run lines it fits a run's cost as
# fixed + steps * marginal (least squares), and says what a 10-step run
# may cost for dwarf.run to make 12x the reference's rate: with the whole
# machine busy, CPUS * 1e6 / (1.2 * reference tps) us.
#   bench/run-floor.sh BINDIR [rounds] [dir]
#   e.g. bench/run-floor.sh /usr/lib/postgresql/15/bin 3
# BINDIR holds pg_ctl, pgbench etc. of a PostgreSQL 15 with dwarf
# installed; bench/dwarf-bench must be built (make bench/dwarf-bench).
# Run as root (the server then runs as postgres) or as the server's OS
# user, on an otherwise quiet machine.  Env: CLIENTS (32), SECONDS_EACH
# (8), WORKERS (dwarf.workers, 2), EXTRA_CONF (lines for postgresql.conf).
set -euo pipefail
BIN=${1:?usage: run-floor.sh BINDIR [rounds] [dir]}
ROUNDS=${2:-3}
DIR=${3:-/var/tmp/run-floor}
CLIENTS=${CLIENTS:-32}
SECS=${SECONDS_EACH:-8}
WORKERS=${WORKERS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
PORT=5497
CPUS=$(nproc)
TCK=$(getconf CLK_TCK)
AS=()
[[ $(id -u) == 0 ]] && AS=(setpriv --reuid=postgres --regid=postgres --init-groups --)
[[ -x $HERE/dwarf-bench ]] || { echo "run-floor: build bench/dwarf-bench first (make bench/dwarf-bench)" >&2; exit 1; }

stop() { [[ -f $DIR/data/postmaster.pid ]] && "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true; }
trap stop EXIT

start() {
	stop
	rm -rf "$DIR"; mkdir -p "$DIR"
	[[ $(id -u) == 0 ]] && chown postgres:postgres "$DIR"
	"${AS[@]}" "$BIN/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
	cat >>"$DIR/data/postgresql.conf" <<-CONF
		listen_addresses = ''
		unix_socket_directories = '$DIR'
		port = $PORT
		shared_preload_libraries = 'dwarf'
		max_worker_processes = 32
		dwarf.workers = $WORKERS
		fsync = on
		synchronous_commit = on
		${EXTRA_CONF:-}
	CONF
	"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null
	export PGHOST=$DIR PGPORT=$PORT PGUSER=postgres PGDATABASE=postgres
	"$BIN/psql" -X -q -v ON_ERROR_STOP=1 -c "CREATE EXTENSION dwarf" -c "SELECT dwarf.maintain()" >/dev/null
	for s in 1 10 20; do
		"$HERE/dwarf-bench" -workload linear -steps $s -setup-only >/dev/null
	done
	"$HERE/dwarf-bench" -workload reference -setup-only >/dev/null
}

# busy and idle ticks of the whole machine, and context switches so far
snap() { awk '/^cpu / {u = $2 + $3; s = $4 + $7 + $8; i = $5 + $6} /^ctxt/ {c = $2} END {print u, s, i, c}' /proc/stat; }

declare -A COST=() TPS=()
ROWS=()
for round in $(seq 1 "$ROUNDS"); do
	start
	echo "round $round: server up (dwarf.workers = $WORKERS, $CLIENTS clients, $SECS s each)"
	for name in select1 reference run-1 run-10 run-20; do
		case $name in
			select1) script="SELECT 1;" ;;
			reference) script=$(cat "$HERE/pgbench/reference.sql") ;;
			run-*) script="SELECT 1 / (status = 'completed')::int FROM dwarf.run('bench_linear_${name#run-}', '{}');" ;;
		esac
		printf '%s\n' "$script" >"$DIR/$name.sql"
		read -r u0 s0 i0 c0 < <(snap)
		out=$("$BIN/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$DIR/$name.sql" 2>&1) ||
			{ echo "$out" >&2; exit 1; }
		read -r u1 s1 i1 c1 < <(snap)
		n=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' <<<"$out")
		tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' <<<"$out" | head -1)
		row=$(awk -v n="$n" -v t="$tps" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v i=$((i1 - i0)) \
			-v c=$((c1 - c0)) -v k="$TCK" 'BEGIN {
				us = 1e6 / k / n
				printf "%.0f %.1f %.1f %.1f %.1f %.2f", t, (u + s) * us, u * us, s * us, 100 * (u + s) / (u + s + i), c / n }')
		read -r t cost ucost scost busy ctxt <<<"$row"
		COST[$round,$name]=$cost TPS[$round,$name]=$t
		ROWS+=("| $round | $name | $t | **$cost** | $ucost | $scost | $busy% | $ctxt |")
		echo "  $name: $t tps, machine $cost us a transaction (user $ucost, system $scost), busy $busy%, $ctxt context switches a transaction"
	done
done
stop

echo
echo "Each transaction's cost in machine time, $CLIENTS clients, $CPUS CPUs ($(date -u '+%F %H:%M') UTC):"
echo
echo "| round | load | tps | machine us / xact | user | system | busy | ctxt / xact |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "| round | run = fixed + steps x marginal | 10-step run | dwarf.run's ratio (10 x runs/s over the reference's tps) | the same at 100% busy | budget of a 10-step run for 12x at 100% busy |"
echo "|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
	awk -v a="${COST[$round,run-1]}" -v b="${COST[$round,run-10]}" -v c="${COST[$round,run-20]}" \
		-v ref="${TPS[$round,reference]}" -v runs="${TPS[$round,run-10]}" -v cpus="$CPUS" -v r="$round" 'BEGIN {
		# least squares over x = 1, 10, 20
		mx = 31 / 3; my = (a + b + c) / 3
		sxy = (1 - mx) * (a - my) + (10 - mx) * (b - my) + (20 - mx) * (c - my)
		sxx = (1 - mx) ^ 2 + (10 - mx) ^ 2 + (20 - mx) ^ 2
		m = sxy / sxx; f = my - m * mx
		printf "| %d | %.0f + steps x %.1f us | %.0f us | %.2fx | %.2fx | %.0f us |\n", r, f, m, b,
			10 * runs / ref, 10 * cpus * 1e6 / b / ref, cpus * 1e6 / (1.2 * ref) }'
done
