#!/bin/bash
# External tasks under load: issue 20's shapes, driven by bench/external-bench
# (workers outside the server: a few connections, many leases each).
#
#   bench/external.sh [PGBIN]           (or PGBIN=... in the environment)
#   QUICK=1 bench/external.sh           (a few minutes, smaller everything)
#   SHAPES="e d" bench/external.sh      (some of them; default "e d a c b")
#
# PGBIN is the bin directory of a PostgreSQL 15 installation with dwarf
# installed into it (default /opt/pg-bench/usr/lib/postgresql/15/bin, where
# /work/tools/ptest.sh bench puts it); bench/external-bench must be built
# (make).  Run as root: the server runs as the postgres OS user on a unix
# socket in WORK (/var/tmp/external-bench), port PORT (5494), and the
# driver reads the server's CPU from /proc.  Each driver run gets a fresh
# cluster, with shared_preload_libraries = 'dwarf', max_worker_processes =
# 32, fsync and synchronous_commit on, everything else at PostgreSQL's and
# dwarf's defaults, removed after it (the server log, WORK/server.log,
# collects all runs).
#
# The shapes, in the order of SHAPES (full run / QUICK=1):
#   e  wake latency: SAMPLES (200 / 50) claims waiting with wait => '10 s',
#      each woken by a flow another connection creates;
#   d  no work: D_FLOWS (20000 / 4000) one-step flows and a quarter as many
#      ten-step flows drained batched (4 connections, claim max 100,
#      100 completes per transaction), then D_UNBATCHED (2000 / 500)
#      one-step flows one claim and one complete at a time (D_MODES picks
#      and orders the passes, see external-bench -help); beside the
#      one-row durable UPDATE rate at 4 clients (REF_SECS, 10 / 3 s, before
#      and after);
#   a  ten-step flows at RATE_A flows/s (100 / 50), every task held each of
#      HOLDS_A ms in turn ("0 1000 8000" / "0 1000"), WINDOW (30 / 10) s
#      measured once the pipeline is full;
#   c  ten-step flows of three classes at once, RATE_C flows/s each (10 / 5),
#      held HOLDS_C ms ("5,200,8000" / "5,200,2000"); predicted latency from
#      a's 0-ms hand-off when a ran first;
#   b  closed loop: INFLIGHT (10000 / 1000) one-step flows open at once, each
#      task held HOLD_B ms (60000 / 10000), measured over one hold.
# (D_FLOWS was kept under 16,000 while a worker's flow table that shrank
# after holding 8,000 flows corrupted them: fixed, t/184; bench/README.md,
# "External tasks".)
# Each driver run is bounded by `timeout` (TIMEOUT, 900 s).  Output:
# progress, the driver's RESULT lines and a summary, on stdout and in
# bench/results/external-YYYYMMDD-HHMM.txt; then the server log's
# ERROR/WARNING lines.
set -uo pipefail
PGBIN=${1:-${PGBIN:-/opt/pg-bench/usr/lib/postgresql/15/bin}}
SHAPES=${SHAPES:-"e d a c b"}
WORK=${WORK:-/var/tmp/external-bench}
PORT=${PORT:-5494}
TIMEOUT=${TIMEOUT:-900}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DRIVER=$HERE/external-bench
if [[ ${QUICK:-0} == 1 ]]; then
	: "${SAMPLES:=50}" "${D_FLOWS:=4000}" "${D_UNBATCHED:=500}" "${REF_SECS:=3}"
	: "${RATE_A:=50}" "${HOLDS_A:=0 1000}" "${WINDOW:=10}" "${RATE_C:=5}" "${HOLDS_C:=5,200,2000}"
	: "${INFLIGHT:=1000}" "${HOLD_B:=10000}"
else
	: "${SAMPLES:=200}" "${D_FLOWS:=20000}" "${D_UNBATCHED:=2000}" "${REF_SECS:=10}"
	: "${RATE_A:=100}" "${HOLDS_A:=0 1000 8000}" "${WINDOW:=30}" "${RATE_C:=10}" "${HOLDS_C:=5,200,8000}"
	: "${INFLIGHT:=10000}" "${HOLD_B:=60000}"
fi
SOCK=$WORK/sock
DATA=$WORK/data
LOG=$WORK/server.log
DSN="host=$SOCK port=$PORT dbname=bench user=postgres"

die() { echo "external.sh: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root (the server runs as postgres; CPU is read from /proc)"
[[ -x $PGBIN/postgres ]] || die "$PGBIN: no postgres binary"
[[ -f $("$PGBIN/pg_config" --pkglibdir)/dwarf.so ]] || die "dwarf is not installed into $PGBIN/.."
[[ -x $DRIVER ]] || die "$DRIVER missing: make bench/external-bench"
[[ -S $SOCK/.s.PGSQL.$PORT ]] && die "a server already listens on $SOCK/.s.PGSQL.$PORT"

mkdir -p "$HERE/results"
RESULT=$HERE/results/external-$(date -u +%Y%m%d-%H%M).txt
exec > >(tee "$RESULT") 2>&1

# A fast shutdown that does not end in 60 s (a process that does not
# answer it) is said, and followed by an immediate one.
stop_server() {
	if [[ -f $DATA/postmaster.pid ]] &&
		! runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1; then
		echo "external.sh: the server did not stop in 60 s (fast shutdown); still running:"
		ps -o pid,stat,time,cmd --ppid "$(head -1 "$DATA/postmaster.pid")"
		runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -m immediate -w -t 60 stop >/dev/null 2>&1
	fi
	rm -rf "$DATA"
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# A fresh cluster for each driver run, so that no run inherits another's
# flows, workers' memory or statistics.
start_server() {
	rm -rf "$DATA"
	mkdir -p "$WORK" "$SOCK"
	chown postgres: "$WORK" "$SOCK"
	runuser -u postgres -- "$PGBIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null ||
		die "initdb failed"
	cat >>"$DATA/postgresql.conf" <<-CONF
		listen_addresses = ''
		port = $PORT
		unix_socket_directories = '$SOCK'
		shared_preload_libraries = 'dwarf'
		max_worker_processes = 32
		fsync = on
		synchronous_commit = on
	CONF
	echo "=== server start $(date -u '+%T UTC')" >>"$LOG"
	chown postgres: "$LOG"
	runuser -u postgres -- "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null || die "the server did not start"
	q -d postgres -c "CREATE DATABASE bench" >/dev/null
	q -d bench -c "CREATE EXTENSION dwarf" >/dev/null || die "CREATE EXTENSION dwarf failed"
}
q() { timeout 60 "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$SOCK" -p "$PORT" -U postgres "$@"; }

mkdir -p "$WORK"
: >"$LOG"
start_server
echo "external.sh: $(date -u '+%F %T UTC'), $(nproc) cores (shared with other work: load $(cut -d' ' -f1-3 /proc/loadavg)),"
echo "  dwarf at $(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null)$(git -C "$HERE/.." diff --quiet HEAD -- src sql 2>/dev/null || echo ' (modified)'), PGBIN $PGBIN, QUICK=${QUICK:-0}"
echo "  settings: $(q -d bench -F ' ' -c "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
  WHERE name IN ('fsync', 'synchronous_commit', 'max_worker_processes', 'max_connections', 'shared_buffers')
     OR name LIKE 'dwarf.%'")"
stop_server

run() {			# run SHAPE ARGS...: one driver run, bounded
	local shape=$1
	shift
	echo
	echo "=== shape $shape: external-bench -shape $shape $* ($(cut -d' ' -f1-3 /proc/loadavg) load)"
	start_server
	timeout "$TIMEOUT" "$DRIVER" -dsn "$DSN" -shape "$shape" "$@" 2>&1 | tee "$WORK/last.out"
	local rc=${PIPESTATUS[0]}
	stop_server
	grep '^RESULT ' "$WORK/last.out" >>"$LINES"
	((rc == 0)) || echo "=== shape $shape: the driver exited $rc"
}

LINES=$WORK/result-lines.txt
: >"$LINES"
HANDOFF=
for s in $SHAPES; do
	case $s in
		e) run e -samples "$SAMPLES" ;;
		d) run d -flows "$D_FLOWS" -unbatched-flows "$D_UNBATCHED" -reference -ref-secs "$REF_SECS" ${D_MODES:+-modes "$D_MODES"} ;;
		a)
			for h in $HOLDS_A; do
				run a -hold "$h" -rate "$RATE_A" -window "$WINDOW" -label "a-$h"
				if [[ $h == 0 ]]; then
					HANDOFF=$(grep '^RESULT shape=a label=a-0 ' "$LINES" | tail -1 | sed -nE 's/.* handoff_ms=([^ ]*).*/\1/p')
				fi
			done
			;;
		c) run c -hold "$HOLDS_C" -rate "$RATE_C" -window "$WINDOW" ${HANDOFF:+-handoff-ms "$HANDOFF"} ;;
		b) run b -hold "$HOLD_B" -inflight "$INFLIGHT" ;;
		*) echo "external.sh: no shape $s" ;;
	esac
done

# one table of the RESULT lines: key=value pairs, the keys of each shape's first line
echo
echo "Summary ($(date -u '+%F %T UTC'))"
for s in e d a c b; do
	lines=$(grep "^RESULT shape=$s " "$LINES") || continue
	keys=$(head -1 <<<"$lines" | tr ' ' '\n' | sed -n 's/=.*//p' | tr '\n' ' ' | sed 's/ $//')
	echo
	echo "| ${keys// / | } |"
	echo "|$(awk '{for (i = 1; i <= NF; i++) printf "---|"}' <<<"$keys")"
	while read -r line; do
		row="|"
		for k in $keys; do
			row+=" $(tr ' ' '\n' <<<"$line" | sed -n "s/^$k=//p") |"
		done
		echo "$row"
	done <<<"$lines"
done

echo
# what the log says while each server runs, before its shutdown request
# (workers then end with FATAL, as expected)
bad=$(awk '/^=== server start/ {on = 1} /received fast shutdown request/ {on = 0} on' "$LOG" |
	grep -E '(ERROR|FATAL|PANIC|WARNING):|terminated by signal|exited with exit code [1-9]|rolled back' || true)
echo "server log $LOG: $(grep -c . <<<"$bad") lines with ERROR, FATAL, PANIC, WARNING, a failed process or a rolled-back batch, before shutdowns"
[[ -z $bad ]] || sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //; s/[0-9]+/N/g' <<<"$bad" | sort | uniq -c | sort -rn | head -12
