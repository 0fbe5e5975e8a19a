#!/bin/bash
# What a lookup of an archived flow by id costs in one day partition of
# dwarf.flow_archive: through the block-range index dwarf.maintain gives a
# day (dwarf_internal.make_archive_day), and through a B-tree on id, as the
# days had before.  One day of FLOWS closed flows, written in id order as a
# pass writes them, one flow in LATE closing long after its neighbours (its
# id half a million lower), the ranges summarized and the table analyzed as
# a pass leaves them; then LOOKUPS lookups of ids spread over the day, each
# way, timed in the server (no client round trip), and one lookup's buffers.
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
q -c "CREATE EXTENSION dwarf"

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
CREATE TABLE public.btree_day AS SELECT * FROM dwarf.flow_archive_20260101;
CREATE INDEX ON public.btree_day (id);
VACUUM ANALYZE public.btree_day;
SQL
q <<'SQL'
SELECT format('heap %s pages; block-range index %s pages; B-tree %s pages',
			  pg_relation_size('dwarf.flow_archive_20260101') / 8192,
			  pg_relation_size('dwarf.flow_archive_20260101_id') / 8192,
			  pg_relation_size('public.btree_day_id_idx') / 8192);
CREATE FUNCTION public.lookups(tab regclass, n int, flows bigint) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz;
	found bigint := 0;
	c bigint;
BEGIN
	/* warm: every page in shared buffers, as a day read often is */
	EXECUTE format('SELECT count(*) FROM %s', tab) INTO c;
	t0 := clock_timestamp();
	FOR i IN 1 .. n LOOP
		EXECUTE format('SELECT count(*) FROM %s WHERE id = $1', tab) INTO c USING (i * 7919 % flows) + 1;
		found := found + c;
	END LOOP;
	IF found < n * 0.99 THEN	/* an id that closed late is found once, or not at all past the day's end */
		RAISE EXCEPTION 'found % of % flows', found, n;
	END IF;
	RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;
SQL
for t in dwarf.flow_archive_20260101 public.btree_day; do
	q -c "SELECT public.lookups('$t', 50, $FLOWS)" >/dev/null
	echo "$t: $(q -c "SELECT round(public.lookups('$t', $LOOKUPS, $FLOWS)::numeric, 1)") us a lookup (mean of $LOOKUPS)"
	q -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM $t WHERE id = $((FLOWS / 2 + 17))" | sed 's/^/    /'
done
