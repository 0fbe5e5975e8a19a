#!/bin/bash
# Copyright: dwarf project.
#
# packed-steps-wal.sh: what the step log's layout costs in WAL, before
# building the next one.  Issue 25's target is <= 150 B of WAL per step;
# the run writes 205-213 B, of which the step row is ~79 B and its entry
# in the (flow_id, step_id) B-tree ~90 B.  This writes the same steps two
# ways into tables shaped as a segment of the step log, and prints the
# WAL per step of each:
#
#   rows    one row per step, as dwarf.step is: the B-tree on
#           (flow_id, step_id) and the block-range index on step_id;
#   packed  one row per flow and batch (the flow's steps in the batch as
#           arrays, a column left NULL when every step's value is), with
#           the same two indexes on (flow_id, first step_id) and step_id.
#
# The steps are those of FLOWS ten-step no-op flows, written as the
# workers write them: a batch of BATCH flows at a time, each flow's steps
# one after the other (chaining), rows multi-inserted (COPY, as
# table_multi_insert), one transaction a batch.  A warm-up of the same
# size first, after a checkpoint, so that the measured part writes few
# full-page images (as in a steady run between checkpoints).
#
#   bench/packed-steps-wal.sh [PGBIN]      # as root; a throwaway cluster
#
# Env: FLOWS (8000), BATCH (50), PORT (5496).
set -euo pipefail
PGBIN=${1:-/usr/lib/postgresql/15/bin}
FLOWS=${FLOWS:-8000}
BATCH=${BATCH:-50}
PORT=${PORT:-5496}
WORK=$(mktemp -d /var/tmp/packed-wal.XXXXXX)
chown postgres "$WORK"
as_pg() { runuser -u postgres -- "$@"; }
cleanup() { as_pg "$PGBIN/pg_ctl" -D "$WORK/data" stop -m immediate >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
as_pg "$PGBIN/initdb" -D "$WORK/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$WORK/data/postgresql.conf" <<CONF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$WORK'
max_wal_size = 4GB
checkpoint_timeout = 30min
CONF
as_pg "$PGBIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w start >/dev/null
q() { as_pg "$PGBIN/psql" -h "$WORK" -p "$PORT" -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 "$@"; }

q <<'SQL'
CREATE TABLE rows (
	flow_id bigint NOT NULL, step_id bigint NOT NULL, token int NOT NULL, task text NOT NULL,
	status text NOT NULL, attempt int NOT NULL, started_at timestamptz NOT NULL,
	finished_at timestamptz NOT NULL, changes jsonb, goto_task text, wake_at timestamptz,
	signal jsonb, error jsonb) WITH (autovacuum_enabled = false);
CREATE UNIQUE INDEX ON rows (flow_id, step_id);
CREATE INDEX ON rows USING brin (step_id);
CREATE TABLE packed (
	flow_id bigint NOT NULL, step_id bigint NOT NULL, step_ids bigint[] NOT NULL,
	tokens int[] NOT NULL, tasks text[] NOT NULL, statuses text[] NOT NULL, attempts int[] NOT NULL,
	started_at timestamptz[] NOT NULL, finished_at timestamptz[] NOT NULL, changes jsonb[],
	goto_tasks text[], wake_at timestamptz[], signals jsonb[], errors jsonb[]) WITH (autovacuum_enabled = false);
CREATE UNIQUE INDEX ON packed (flow_id, step_id);
CREATE INDEX ON packed USING brin (step_id);
-- the steps of flows [lo, lo + n), in the order a worker records them
-- (each flow's steps one after the other); flow f's step k has the id
-- f * 16 + k, as a worker's block of step ids would give them
CREATE FUNCTION step_rows(lo bigint, n int) RETURNS SETOF rows LANGUAGE sql AS $$
	SELECT f, f * 16 + k, 0, 'T' || k, 'completed', 1,
		   '2026-12-02 12:00'::timestamptz + k * interval '1 ms',
		   '2026-12-02 12:00'::timestamptz + k * interval '1 ms' + interval '10 us',
		   NULL::jsonb, NULL, NULL::timestamptz, NULL::jsonb, NULL::jsonb
	  FROM generate_series(lo, lo + n - 1) f, generate_series(1, 10) k
	 ORDER BY f, k
$$;
SQL
# write LAYOUT LO: the steps of FLOWS flows from LO, a COPY and a commit
# per batch; prints the WAL bytes written
write() {
	local layout=$1 lo=$2 f
	for ((f = lo; f < lo + FLOWS; f += BATCH)); do
		if [[ $layout == rows ]]; then
			echo "COPY (SELECT * FROM step_rows($f, $BATCH)) TO '$WORK/b.dat';"
		else
			echo "COPY (SELECT flow_id, min(step_id), array_agg(step_id ORDER BY step_id),
				array_agg(token ORDER BY step_id), array_agg(task ORDER BY step_id),
				array_agg(status ORDER BY step_id), array_agg(attempt ORDER BY step_id),
				array_agg(started_at ORDER BY step_id), array_agg(finished_at ORDER BY step_id),
				NULL, NULL, NULL, NULL, NULL
				FROM step_rows($f, $BATCH) GROUP BY flow_id ORDER BY flow_id) TO '$WORK/b.dat';"
		fi
		echo "SELECT pg_current_wal_insert_lsn() AS before \\gset"
		echo "COPY $layout FROM '$WORK/b.dat';"
		echo "SELECT :'total'::numeric + pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'before') AS total \\gset"
	done
	echo "SELECT :'total';"
}

for layout in rows packed; do
	q -c CHECKPOINT >/dev/null
	{ echo "\\set total 0"; write $layout 1000000; } | q >/dev/null		# warm-up
	wal=$({ echo "\\set total 0"; write $layout $((1000000 + FLOWS)); } | q | tail -1)
	steps=$((FLOWS * 10))
	heap=$(q -c "SELECT pg_relation_size('$layout')")
	printf '%-7s %d steps: %s B of WAL per step (heap and indexes, the COPYs only); table %s B per step\n' \
		"$layout" "$steps" "$(awk -v w="$wal" -v s="$steps" 'BEGIN {printf "%.1f", w / s}')" \
		"$(awk -v h="$heap" -v s="$((2 * steps))" 'BEGIN {printf "%.1f", h / s}')"
done
