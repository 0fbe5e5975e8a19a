#!/bin/bash
# Issue 25's WAL breakdown: where a step's WAL goes, by record type and by
# relation, for the bulk shape (bench/isolation-compare.sh's bursts: FLOWS
# ten-step no-op flows of bench_linear_10 created in one statement), then
# for dwarf.maintain() archiving them (archive_after = 0), the VACUUM that
# follows, and a second burst into the emptied tables.
#   bench/wal-breakdown.sh PREFIX TREE   (as root; PREFIX: a relocated PostgreSQL 15 with
#   TREE's dwarf installed, as for isolation-compare.sh; TREE: the built source)
# SETUP_SQL, when set, runs after CREATE EXTENSION (an experiment: ALTER TABLE ...).
# Uses pg_walinspect (contrib, PostgreSQL 15) between LSNs taken before and
# after each phase; a fresh cluster under WORK; prints markdown-ish tables.
set -euo pipefail
PREFIX=${1:-/opt/pg-steplog}
TREE=${2:-$(pwd)}
FLOWS=${FLOWS:-8000}
WARM=${WARM:-2000}
PORT=${PORT:-5497}
WORK=${WORK:-/var/tmp/steplog-wal}
BIN=$PREFIX/usr/lib/postgresql/15/bin
AS=(setpriv --reuid=postgres --regid=postgres --init-groups --)
DATA=$WORK/data
q() { "${AS[@]}" env PGHOST=$WORK PGPORT=$PORT PGUSER=postgres PGDATABASE=bench "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
rm -rf "$WORK"; mkdir -p "$WORK"; chown postgres: "$WORK"
trap '"${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true' EXIT
"${AS[@]}" "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$WORK'
shared_preload_libraries = 'dwarf'
max_worker_processes = 32
fsync = on
synchronous_commit = on
wal_keep_size = 4GB
CONF
"${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$WORK/log" -w start >/dev/null
q -d postgres -c "CREATE DATABASE bench"
q -c "CREATE EXTENSION dwarf" -c "CREATE EXTENSION pg_walinspect"
[[ -z ${SETUP_SQL:-} ]] || q -c "$SETUP_SQL"
"$TREE/bench/dwarf-bench" -dsn "host=$WORK port=$PORT dbname=bench user=postgres" \
	-workload linear -steps 10 -setup-only >/dev/null
for _ in $(seq 1 100); do
	[[ $(q -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'dwarf worker' AND datname = 'bench'") \
		== "$(q -c "SHOW dwarf.workers")" ]] && break
	sleep 0.1
done

# burst N: creates N flows in one statement and waits for them to close; prints "lsn0 lsn1"
burst() {
	local id0
	id0=$(q -c "SELECT coalesce(max(id), 0) FROM dwarf.flow")
	q -F ' ' <<SQL | tr '\n' ' '
SELECT pg_current_wal_lsn();
SELECT count(dwarf.create('bench_linear_10', '{}')) FROM generate_series(1, $1) \g /dev/null
DO \$\$
DECLARE cur bigint := $id0; polls int := 0;
BEGIN
    LOOP
        SELECT min(id) INTO cur FROM dwarf.flow WHERE id >= cur AND status = 'running';
        EXIT WHEN cur IS NULL;
        polls := polls + 1;
        IF polls > 12000 THEN RAISE EXCEPTION 'flows still running after 120 s'; END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
END \$\$;
SELECT pg_current_wal_lsn();
SQL
}

# report TITLE LSN0 LSN1 STEPS: WAL between the LSNs by record type, then by record type and relation
report() {
	echo; echo "### $1: $(q -c "SELECT round(pg_wal_lsn_diff('$3', '$2') / $4::numeric, 1)") B/step over $4 steps ($2 to $3)"
	q -c "SELECT 'checkpoints in it: ' || CASE WHEN redo_lsn > '$2' THEN 'yes, redo at ' || redo_lsn ELSE 'none' END FROM pg_control_checkpoint()"
	echo; echo "| record | count | per step | record B/step | FPI B/step | total B/step | % |"; echo "|---|---|---|---|---|---|---|"
	q -F ' | ' -c "SELECT '| ' || \"resource_manager/record_type\", count, round(count::numeric / $4, 3),
	       round(record_size::numeric / $4, 1), round(fpi_size::numeric / $4, 1),
	       round(combined_size::numeric / $4, 1), round(combined_size_percentage::numeric, 1) || ' |'
	  FROM pg_get_wal_stats('$2', '$3', true) WHERE count > 0 ORDER BY combined_size DESC"
	echo; echo "| record | relation | count | per step | record B/step | FPI B/step | total B/step |"; echo "|---|---|---|---|---|---|---|"
	q -F ' | ' -c "WITH r AS (
	  SELECT resource_manager || '/' || split_part(record_type, ' ', 1) AS rec, record_length, fpi_length,
	         (regexp_match(block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid AS fn
	    FROM pg_get_wal_records_info('$2', '$3'))
	SELECT '| ' || rec, CASE WHEN fn IS NULL THEN '-' WHEN c.relname IS NULL THEN fn::text
	                         WHEN c.relnamespace = 'pg_catalog'::regnamespace THEN 'catalogs'
	                         ELSE c.relname END AS rel,
	       count(*), round(count(*)::numeric / $4, 3),
	       round(sum(record_length - fpi_length)::numeric / $4, 1), round(sum(fpi_length)::numeric / $4, 1),
	       round(sum(record_length)::numeric / $4, 1) || ' |'
	  FROM r LEFT JOIN pg_class c ON c.relfilenode = r.fn
	 GROUP BY 1, 2 HAVING sum(record_length) >= 0.05 * $4 ORDER BY sum(record_length) DESC"
}

echo "# issue 25 WAL breakdown: $(date -u '+%F %T UTC'), $TREE at $(git -C "$TREE" rev-parse --short HEAD)$(git -C "$TREE" diff --quiet HEAD -- src sql || echo ' (modified)'), $FLOWS flows x 10 steps"
[[ -z ${SETUP_SQL:-} ]] || echo "SETUP_SQL: $SETUP_SQL"
echo "indexes: $(q -c "SELECT string_agg(indexrelid::regclass::text, ', ' ORDER BY 1) FROM pg_index WHERE indrelid IN (SELECT relid FROM pg_partition_tree('dwarf.step_log') UNION ALL SELECT 'dwarf.flow'::regclass)")"
burst "$WARM" >/dev/null
q -c "CHECKPOINT"; sleep 1
read -r l0 l1 <<<"$(burst "$FLOWS")"
steps=$(q -c "SELECT count(*) FROM dwarf.step")
report "1. run: a burst of $FLOWS flows after a CHECKPOINT (tables fresh; warm-up of $WARM flows before)" "$l0" "$l1" $((FLOWS * 10))
a0=$(q -c "SELECT pg_current_wal_lsn()")
q -c "SET dwarf.archive_after = 0" -c "SELECT dwarf.maintain()"
a1=$(q -c "SELECT pg_current_wal_lsn()")
report "2. archive: dwarf.maintain() with archive_after = 0 moving all $steps steps (the warm-up's pages written before the CHECKPOINT)" "$a0" "$a1" "$steps"
v0=$(q -c "SELECT pg_current_wal_lsn()")
q -c "VACUUM dwarf.step_log" -c "VACUUM dwarf.flow"
v1=$(q -c "SELECT pg_current_wal_lsn()")
report "3. VACUUM dwarf.step_log, dwarf.flow after the archive (no checkpoint between: no FPIs)" "$v0" "$v1" "$steps"
q -c "CHECKPOINT"; sleep 1
read -r l0 l1 <<<"$(burst "$FLOWS")"
report "4. run again: a burst of $FLOWS flows into the emptied, vacuumed tables, after a CHECKPOINT" "$l0" "$l1" $((FLOWS * 10))
a0=$(q -c "SELECT pg_current_wal_lsn()")
q -c "CHECKPOINT"
q -c "SET dwarf.archive_after = 0" -c "SELECT dwarf.maintain()" >/dev/null
a1=$(q -c "SELECT pg_current_wal_lsn()")
report "5. archive again, after a CHECKPOINT (steady state: every page's first change is a full-page image)" "$a0" "$a1" $((FLOWS * 10))
