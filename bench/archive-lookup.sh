#!/bin/bash
# What a lookup of an archived flow by id costs in one day partition of
# dwarf.flow_archive, and what a day's B-tree by id costs a pass.  One day
# of FLOWS closed flows, written in id order as a pass writes them, one flow
# in LATE closing long after its neighbours (its id half a million lower),
# the ranges summarized and the table analyzed as a pass leaves them.
# LOOKUPS lookups of ids spread over the day and as many of ids the day does
# not hold (what every other day kept pays), timed in the server (no client
# round trip), and one lookup's buffers: first through the block-range index
# a day is made with (dwarf_internal.make_archive_day), then after a pass
# two days later has built the day its B-tree by id, with that pass's WAL.
#   bench/archive-lookup.sh PREFIX      (as root; PREFIX: a relocated PostgreSQL 15
#                                        with dwarf installed, as for wal-breakdown.sh)
set -euo pipefail
PREFIX=${1:-/opt/pg-steplog}
FLOWS=${FLOWS:-2000000}
LATE=${LATE:-1000}
LOOKUPS=${LOOKUPS:-2000}
PORT=${PORT:-5496}
WORK=${WORK:-/var/tmp/archive-lookup}
BIN=$PREFIX/usr/lib/postgresql/15/bin
AS=(setpriv --reuid=postgres --regid=postgres --init-groups --)
DATA=$WORK/data
q() { "${AS[@]}" env PGHOST=$WORK PGPORT=$PORT PGUSER=postgres PGDATABASE=postgres "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
rm -rf "$WORK"; mkdir -p "$WORK"; chown postgres: "$WORK"
trap '"${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true' EXIT
"${AS[@]}" "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$WORK'
shared_preload_libraries = 'dwarf'
shared_buffers = 1GB
autovacuum = off
CONF
"${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$WORK/log" -w start >/dev/null
q -c "CREATE EXTENSION dwarf" -c "CREATE EXTENSION pg_walinspect"

echo "# archived flow lookup by id: $(date -u '+%F %T') UTC, $FLOWS flows in one day, one in $LATE closing late"
q <<SQL
SELECT dwarf_internal.make_archive_day(date '2026-01-01') \g /dev/null
-- a day's flows in id order, as passes write them; every LATE-th one an old flow closing late
INSERT INTO dwarf.flow_archive_20260101
SELECT CASE WHEN g % $LATE = 0 THEN greatest(g - 500000, 1) ELSE g END, 1, 'completed', 'postgres', 0, NULL,
	   '{}', '{"n": 10}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, NULL, false, NULL, NULL, NULL, NULL, 1,
	   timestamptz '2026-01-01 00:00+00', timestamptz '2026-01-01 00:00+00' + g * interval '1 ms'
  FROM generate_series(1, $FLOWS) g;
SELECT brin_summarize_range('dwarf.flow_archive_20260101_id', r * 32)
  FROM generate_series(0, pg_relation_size('dwarf.flow_archive_20260101') / 8192 / 32 - 1) r \g /dev/null
ANALYZE dwarf.flow_archive_20260101;
SQL
q <<'SQL'
CREATE FUNCTION public.lookups(tab regclass, n int, flows bigint, present boolean) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz;
	found bigint := 0;
	c bigint;
BEGIN
	/* warm: every page in shared buffers, as a day read often is */
	EXECUTE format('SELECT count(*) FROM %s', tab) INTO c;
	t0 := clock_timestamp();
	FOR i IN 1 .. n LOOP
		EXECUTE format('SELECT count(*) FROM %s WHERE id = $1', tab) INTO c
			USING CASE WHEN present THEN (i * 7919 % flows) + 1 ELSE flows + 1000000 + i END;
		found := found + c;
	END LOOP;
	IF (present AND found < n * 0.99) OR (NOT present AND found > 0) THEN
		RAISE EXCEPTION 'found % of % flows', found, n;	/* an id that closed late is found once, or not at all */
	END IF;
	RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;
SQL
T=dwarf.flow_archive_20260101
lookups() {
	echo "$1: index by id $(q -c "SELECT string_agg(format('%s (%s, %s pages)', c.relname, a.amname, pg_relation_size(c.oid) / 8192), ', ')
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
	   WHERE i.indrelid = '$T'::regclass AND c.relname LIKE '%\_id%' AND c.relname NOT LIKE '%idempotency%'")"
	q -c "SELECT public.lookups('$T', 50, $FLOWS, true)" >/dev/null
	echo "  a flow of the day: $(q -c "SELECT round(public.lookups('$T', $LOOKUPS, $FLOWS, true)::numeric, 1)") us a lookup (mean of $LOOKUPS)"
	echo "  an id the day does not hold: $(q -c "SELECT round(public.lookups('$T', $LOOKUPS, $FLOWS, false)::numeric, 1)") us a lookup (mean of $LOOKUPS)"
	q -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM $T WHERE id = $((FLOWS / 2 + 17))" | sed 's/^/    /'
}
echo "heap $(q -c "SELECT pg_relation_size('$T') / 8192") pages"
lookups "as a pass leaves the day (block-range index)"
# a pass two days later: the day has passed its cutoff, and the pass builds its B-tree
q -c "CHECKPOINT"
q <<SQL
SELECT pg_current_wal_lsn() AS lsn0 \gset
SELECT clock_timestamp() AS t0 \gset
SELECT r -> 'days_indexed' AS days_indexed FROM dwarf_internal.maintain_at(timestamptz '2026-01-03 00:05+00') r \gset
SELECT format('pass two days later: built %s, %s ms; WAL %s (%s B a flow, %s B a step of 10-step flows), of which the index''s page images %s',
			  :'days_indexed', round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz)::numeric * 1000),
			  pg_size_pretty(pg_current_wal_lsn() - :'lsn0'::pg_lsn),
			  round((pg_current_wal_lsn() - :'lsn0'::pg_lsn) / $FLOWS::numeric, 2),
			  round((pg_current_wal_lsn() - :'lsn0'::pg_lsn) / $FLOWS::numeric / 10, 2),
			  (SELECT pg_size_pretty(sum(fpi_length)) FROM pg_get_wal_records_info(:'lsn0', pg_current_wal_lsn())
				WHERE block_ref ~ format('/%s (fork main )?blk ', pg_relation_filenode('${T}_id_btree'))));
SQL
lookups "after it (B-tree)"
