#!/bin/bash
# Memory of the dwarf workers while many flows sleep (dwarf.sleep('1 h')):
# starts its own server, creates N flows whose first task sleeps an hour,
# waits until every one has taken that step, and reports each worker's
# memory (VmRSS, and RssAnon: its private memory, without the shared buffers
# it touched; and the total of its memory contexts, from
# pg_log_backend_memory_contexts); then stops the server (fast), starts it again and reports the
# same once the workers are idle.
#   bench/sleepers.sh BINDIR [flows] [dir]
#   e.g. bench/sleepers.sh /opt/pg-sleepers/usr/lib/postgresql/15/bin 1000000
# BINDIR holds pg_ctl etc. of a PostgreSQL 15 with dwarf installed.  Run as
# root (the server then runs as postgres) or as the server's OS user.
set -euo pipefail
BIN=${1:?usage: sleepers.sh BINDIR [flows] [dir]}
N=${2:-1000000}
DIR=${3:-/var/tmp/sleepers-bench}
AS=()
[[ $(id -u) == 0 ]] && AS=(setpriv --reuid=postgres --regid=postgres --init-groups --)

rm -rf "$DIR"; mkdir -p "$DIR"
[[ $(id -u) == 0 ]] && chown postgres:postgres "$DIR"
"${AS[@]}" "$BIN/initdb" -D "$DIR/data" -A trust >/dev/null
cat >>"$DIR/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$DIR'
port = 5491
shared_preload_libraries = 'dwarf'
dwarf.workers = 2
max_wal_size = 4GB
log_line_prefix = '[%p] '
CONF
PSQL=("${AS[@]}" "$BIN/psql" -h "$DIR" -p 5491 -X -q -At -v ON_ERROR_STOP=1 postgres)
start() { "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null; }
start
trap '"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true' EXIT

"${PSQL[@]}" <<'SQL'
CREATE EXTENSION dwarf;
CREATE SCHEMA nap;
CREATE FUNCTION nap.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('1 hour'); RETURN '{}'; END $$;
CREATE FUNCTION nap.woke(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"woke": true}'::jsonb $$;
SELECT dwarf.define('nap', '{"tasks": {"Nap": "nap.nap", "Woke": "nap.woke"},
  "transitions": [{"from": "Nap", "to": "Woke"}]}');
SQL

# Each worker's pid, VmRSS and RssAnon in MB, and the workers' totals.
report() {
	local what=$1 p rss anon trss=0 tanon=0
	for p in $("${PSQL[@]}" -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'dwarf worker'"); do
		rss=$(awk '/^VmRSS:/ {print int($2 / 1024)}' /proc/$p/status)
		anon=$(awk '/^RssAnon:/ {print int($2 / 1024)}' /proc/$p/status)
		"${PSQL[@]}" -c "SELECT pg_log_backend_memory_contexts($p)" >/dev/null
		sleep 1
		echo "  worker $p: VmRSS $rss MB, RssAnon $anon MB;" \
			"memory contexts: $(grep "\[$p\].*Grand total" "$DIR/log" | tail -1 | sed 's/.*Grand total: //')"
		trss=$((trss + rss)); tanon=$((tanon + anon))
	done
	echo "$what: workers' VmRSS $trss MB, RssAnon $tanon MB in all"
}

# Waits until every dwarf worker sleeps in its loop, three looks in a row.
wait_idle() {
	local calm=0
	while ((calm < 3)); do
		sleep 2
		if [[ $("${PSQL[@]}" -c "SELECT count(*) FILTER (WHERE wait_event IS DISTINCT FROM 'Extension')
				FROM pg_stat_activity WHERE backend_type = 'dwarf worker'") == 0 ]]; then
			calm=$((calm + 1))
		else
			calm=0
		fi
	done
}

report "before any flow"
t0=$(date +%s)
left=$N
while ((left > 0)); do
	k=$((left < 50000 ? left : 50000))
	"${PSQL[@]}" -c "SELECT count(dwarf.create('nap', '{}')) FROM generate_series(1, $k)" >/dev/null
	left=$((left - k))
done
while [[ $("${PSQL[@]}" -c "SELECT count(*) FROM dwarf.step") -lt $N ]]; do sleep 5; done
wait_idle
echo "$N flows created and asleep in $(($(date +%s) - t0)) s"
report "$N flows asleep"

"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null
t0=$(date +%s)
start
sleep 2
wait_idle
echo "restarted; workers idle after $(($(date +%s) - t0)) s"
report "$N flows asleep, after a restart"
"${PSQL[@]}" -c "SELECT 'flows loaded since the restart: ' || sum(flows_loaded) FROM dwarf.worker_stats()"
