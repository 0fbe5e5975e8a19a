#!/bin/bash
# The WAL and time of dwarf.maintain's move, per step, on a running server:
# N (10000) 10-step no-op flows run to completion, then one pass moves them.
# Prints the WAL per step of running them, of the move and of a VACUUM of
# the live tables, the pass's time, and three dwarf.history timings of
# archived flows.  Drops and recreates database DB (dwarf_archive_wal).
#
#   PGHOST=/var/tmp/dev PGPORT=5499 PGUSER=postgres bench/archive-wal.sh
#
# The server must preload dwarf; run as a user that may create databases.
set -euo pipefail
N=${N:-10000}
DB=${DB:-dwarf_archive_wal}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
psql -X -q -d "$DB" -c "CREATE EXTENSION dwarf" >/dev/null
PGDATABASE=$DB "$HERE/dwarf-bench" -setup-only >/dev/null
psql -X -q -At -d "$DB" <<EOF
SET dwarf.archive_after = '0';
-- a first round, moved, so that the measured one finds the tables warm
SELECT count(dwarf.create('bench_linear_10', '{}')) FROM generate_series(1, 3000) \gset
DO \$\$ BEGIN WHILE EXISTS (SELECT 1 FROM dwarf.flow WHERE status = 'running') LOOP PERFORM pg_sleep(0.2); END LOOP; END \$\$;
SELECT dwarf.maintain() IS NOT NULL AS warmed \gset
VACUUM dwarf.flow, dwarf.step_log;
CHECKPOINT;
SELECT pg_current_wal_lsn() AS l0 \gset
SELECT count(dwarf.create('bench_linear_10', '{}')) FROM generate_series(1, $N) \gset
DO \$\$ BEGIN WHILE EXISTS (SELECT 1 FROM dwarf.flow WHERE status = 'running') LOOP PERFORM pg_sleep(0.2); END LOOP; END \$\$;
SELECT 'run:    ' || round((pg_current_wal_lsn() - :'l0'::pg_lsn) / ($N * 10.0), 1) || ' B/step';
SELECT pg_current_wal_lsn() AS l1 \gset
SELECT 'move:   ' || round((pg_current_wal_lsn() - :'l1'::pg_lsn) / ($N * 10.0), 1) || ' B/step, '
       || (m ->> 'moved_steps') || ' steps in ' || (m ->> 'took_ms') || ' ms'
  FROM dwarf.maintain() m;
SELECT pg_current_wal_lsn() AS l2 \gset
VACUUM dwarf.flow, dwarf.step_log;
SELECT 'vacuum: ' || round((pg_current_wal_lsn() - :'l2'::pg_lsn) / ($N * 10.0), 1) || ' B/step';
SELECT max(id) AS fid FROM dwarf.flow_archive \gset
\timing on
SELECT 'history of an archived flow: ' || count(*) || ' steps' FROM dwarf.history(:fid);
SELECT 'history of an archived flow: ' || count(*) || ' steps' FROM dwarf.history(:fid - 1000);
SELECT 'history of an archived flow: ' || count(*) || ' steps' FROM dwarf.history(:fid - 3001);
EOF
