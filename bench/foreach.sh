#!/bin/bash
# foreach.sh BINDIR DIR N...: times a for_each of N items (one flow: Start ->
# for_each Work -> Join fan-in -> END, reducers add and append) on a private
# cluster in DIR made with the server binaries in BINDIR, and then
# dwarf_internal.fold_changes of 100,000 objects in a session.  Prints,
# per N, the seconds from create to completion and the workers' peak RSS
# (VmHWM), and for the fold its time and the backend's peak RSS.  Run as
# root: the server runs as postgres.  TIMEOUT (seconds, default 300) ends a
# run that is too slow.
set -euo pipefail
BIN=$1; DIR=$2; shift 2
TIMEOUT=${TIMEOUT:-300}
AS=(setpriv --reuid=postgres --regid=postgres --init-groups --)
rm -rf "$DIR"; mkdir -p "$DIR"; chown postgres:postgres "$DIR"
"${AS[@]}" "$BIN/initdb" -D "$DIR/data" -A trust >/dev/null
cat >> "$DIR/data/postgresql.conf" <<CONF
shared_preload_libraries = 'dwarf'
dwarf.workers = 1
max_worker_processes = 16
listen_addresses = ''
unix_socket_directories = '$DIR'
dwarf.max_for_each = 200000
dwarf.max_flow_steps = 1000000
CONF
# a bound on each process's memory: a runaway fold fails, it is not OOM-killed
(ulimit -v 4000000; "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null)
trap '"${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null' EXIT
psql() { "${AS[@]}" "$BIN/psql" -h "$DIR" -d postgres -X -q -At -v ON_ERROR_STOP=1 "$@"; }
psql <<'SQL'
CREATE EXTENSION dwarf;
CREATE SCHEMA b;
CREATE FUNCTION b.start(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION b.work(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('total', s->'item', 'results', s->'item') $$;
CREATE FUNCTION b.join(s jsonb) RETURNS jsonb LANGUAGE sql
	AS $$ SELECT jsonb_build_object('n', jsonb_array_length(s->'results')) $$;
SELECT dwarf.define('fe', '{"tasks": {"Start": "b.start", "Work": "b.work", "Join": "b.join"},
  "transitions": [{"from": "Start", "to": "Work", "for_each": "items", "as": "item"},
                  {"from": "Work", "to": "Join"}, {"from": "Join", "to": "END"}],
  "fan_in": ["Join"], "reducers": {"total": "add", "results": "append"}}');
SQL
sleep 2
# the workers' peak resident memory, less the shared memory they touched
workers() { pgrep -P "$(head -1 "$DIR/data/postmaster.pid")" -f "dwarf worker" | tr '\n' ' '; }
hwm() {
	for p in $(workers); do
		awk '/VmHWM/ {h = $2} /RssShmem/ {s = $2} END {print h - s}' /proc/$p/status 2>/dev/null
	done | sort -n | tail -1
}
for n in "$@"; do
	id=$(psql -c "SELECT dwarf.create('fe', jsonb_build_object('items', (SELECT jsonb_agg(i) FROM generate_series(1, $n) i)))")
	t0=$(date +%s.%N)
	status=running
	while [[ $status == running ]]; do
		sleep 0.5
		status=$(psql -c "SELECT status FROM dwarf.flow WHERE id = $id")
		if (( $(echo "$(date +%s.%N) - $t0 > $TIMEOUT" | bc) )); then status=timeout; fi
	done
	t1=$(date +%s.%N)
	steps=$(psql -c "SELECT count(*) FROM dwarf.step WHERE flow_id = $id")
	ok=$(psql -c "SELECT (state->>'total')::numeric = $n::numeric * ($n + 1) / 2 AND (state->>'n')::int = $n FROM dwarf.flow WHERE id = $id")
	printf 'for_each %7d: %-9s %8.1f s  %7d steps  right state: %s  worker peak RSS %s kB\n' \
		"$n" "$status" "$(echo "$t1 - $t0" | bc)" "$steps" "${ok:-?}" "$(hwm)"
	psql -c "SELECT dwarf.cancel($id, 'bench')" >/dev/null
done
out=$(psql <<'SQL'
\timing on
SELECT pg_backend_pid();
SELECT length(dwarf_internal.fold_changes('{}', (SELECT array_agg(jsonb_build_object('k' || i, i, 'results', i, 'total', i)) FROM generate_series(1, 100000) i), '{"results": "append", "total": "add"}')::text);
SELECT (SELECT value FROM regexp_matches(pg_read_file('/proc/' || pg_backend_pid() || '/status'), 'VmHWM:\s+(\d+)') AS m(value));
SQL
) || true
echo "fold_changes of 100000 objects: $(echo "$out" | tr '\n' ' ')"
