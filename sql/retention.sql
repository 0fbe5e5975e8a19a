--
-- retention: dwarf.maintain() moves closed flows into dwarf.flow_archive,
-- day partitions by the time the flow closed, and drops whole days older
-- than dwarf.retention.  Their steps are never copied: the step log's
-- segment (the partition of dwarf.step for a range of flow ids) goes to
-- dwarf.step_archive whole once the ids have passed it, the same table
-- with its rows and its indexes (one someone added too), and is dropped
-- whole once its newest flow's day has expired and none of its flows is
-- open.  Running and interrupted flows, and a closed child whose parent
-- still waits, stay live; the steps of the open ones move to
-- dwarf.step_default when their segment goes, and into the archived
-- segment once they close.  Every read and operation works the same on an
-- archived flow.  The "now" argument shows what a later pass would do, so
-- nothing here waits; with dwarf.segment_interval = '1 s' a segment is
-- some 64 flows wide, and flows of graph rt_tick (rt.pass) move the ids
-- past one.
--
-- Other tests' closed flows are in the same tables and move too: counts are
-- of this test's own flows.
--
\set VERBOSITY terse
CREATE SCHEMA rt;

-- Runs a statement; returns 'ok' or its error, with flow and step ids masked.
CREATE FUNCTION rt.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(regexp_replace(regexp_replace(SQLERRM, '(flow|step) -?\d+', '\1 N', 'g'),
			'_archive_\d{8}', '_archive_YYYYMMDD', 'g'), 'step_\d+', 'step_N', 'g');
END $$;

----------------------------------------------------------------------
-- the settings: intervals, per session (and per database), checked
----------------------------------------------------------------------
SHOW dwarf.archive_after;
SHOW dwarf.retention;
SHOW dwarf.segment_interval;
SELECT rt.try($$SET dwarf.archive_after = 'soon'$$);
SELECT rt.try($$SET dwarf.segment_interval = 'hourly'$$);
SELECT rt.try($$SET dwarf.retention = '-1 day'$$);
SET dwarf.retention = '2 mons';
SHOW dwarf.retention;
RESET dwarf.retention;

----------------------------------------------------------------------
-- flows of every kind
----------------------------------------------------------------------
CREATE FUNCTION rt.add(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1) $$;
CREATE FUNCTION rt.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'rt boom'; END $$;
CREATE FUNCTION rt.ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE answer jsonb := dwarf.interrupt('{"question": "go on?"}');
BEGIN
	IF answer IS NULL THEN
		RETURN '{}';
	END IF;
	RETURN jsonb_build_object('answer', answer);
END $$;
-- Starts rt_chain as a child, then rt_ask as a second child (which parks).
CREATE FUNCTION rt.parent(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE first jsonb := dwarf.subgraph('rt_chain', '{}');
		second jsonb;
BEGIN
	IF first IS NULL THEN
		RETURN '{}';
	END IF;
	second := dwarf.subgraph('rt_ask', '{}');
	IF second IS NULL THEN
		RETURN '{}';
	END IF;
	RETURN jsonb_build_object('first', first, 'second', second);
END $$;
SELECT dwarf.define('rt_chain', '{"tasks": {"A": "rt.add", "B": "rt.add", "C": "rt.add"},
  "transitions": [{"chain": ["A", "B", "C", "END"]}], "reducers": {"n": "replace"}}');
SELECT dwarf.define('rt_fail', '{"tasks": {"A": "rt.add", "B": "rt.boom"},
  "transitions": [{"from": "A", "to": "B"}]}');
SELECT dwarf.define('rt_ask', '{"tasks": {"A": "rt.add", "Ask": "rt.ask", "C": "rt.add"},
  "transitions": [{"chain": ["A", "Ask", "C", "END"]}]}');
SELECT dwarf.define('rt_parent', '{"tasks": {"P": "rt.parent", "Q": "rt.add"},
  "transitions": [{"from": "P", "to": "Q"}]}');
CREATE FUNCTION rt.tick(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT dwarf.define('rt_tick', '{"tasks": {"T": "rt.tick"}, "transitions": []}');

-- rt.pass(flow) creates flows of rt_tick until the ids have passed the
-- segment of the given flow, and records them in rt.ticks; once they are
-- committed, rt.passed(flow) awaits them (and forgets them) and says
-- whether they completed and the ids passed the segment.
CREATE TABLE rt.ticks (id bigint PRIMARY KEY);
CREATE FUNCTION rt.pass(f_id bigint) RETURNS boolean LANGUAGE sql AS $$
	WITH made AS (
		INSERT INTO rt.ticks
			SELECT dwarf.create('rt_tick', '{}')
			  FROM generate_series(1, (SELECT s.hi - dwarf_internal.next_flow_id() FROM dwarf.segment s
										WHERE f_id >= s.lo AND f_id < s.hi))
		RETURNING id)
	SELECT count(*) > 0 FROM made $$;
CREATE FUNCTION rt.passed(f_id bigint) RETURNS boolean LANGUAGE sql AS $$
	WITH t AS (DELETE FROM rt.ticks RETURNING id)
	SELECT bool_and(o.status = 'completed')
		   AND dwarf_internal.next_flow_id() >= (SELECT s.hi FROM dwarf.segment s WHERE f_id >= s.lo AND f_id < s.hi)
	  FROM t, dwarf.await(t.id, '60 s') o $$;

-- A pass before this test's flows, so that they go to a live segment, not
-- to dwarf.step_default.
SET dwarf.archive_after = '1 hour';
SET dwarf.segment_interval = '1 s';
SELECT dwarf.maintain() ? 'segments_made' AS says_segments;

CREATE TABLE rt.flows (name text PRIMARY KEY, id bigint);
INSERT INTO rt.flows SELECT 'plain', flow_id FROM dwarf.run('rt_chain', '{"n": 10}');
INSERT INTO rt.flows SELECT 'keyed', flow_id FROM dwarf.run('rt_chain', '{}', idempotency_key => 'rt-once');
INSERT INTO rt.flows SELECT 'threaded', flow_id FROM dwarf.run('rt_chain', '{}', thread => 'rt-thread');
INSERT INTO rt.flows SELECT 'failed', flow_id FROM dwarf.run('rt_fail', '{}');
INSERT INTO rt.flows SELECT 'asking', flow_id FROM dwarf.run('rt_ask', '{}');
INSERT INTO rt.flows SELECT 'parent', flow_id FROM dwarf.run('rt_parent', '{}');
INSERT INTO rt.flows
	SELECT 'child_done', id FROM dwarf.flow WHERE parent_id = (SELECT id FROM rt.flows WHERE name = 'parent')
	   AND status = 'completed';
INSERT INTO rt.flows
	SELECT 'child_asking', id FROM dwarf.flow WHERE parent_id = (SELECT id FROM rt.flows WHERE name = 'parent')
	   AND status = 'interrupted';
SELECT f.name, s.status, s.steps FROM rt.flows f, dwarf.snapshot(f.id) s ORDER BY f.name;

-- What the reads say before any move, to compare with after.
CREATE TABLE rt.before AS
	SELECT f.name, (SELECT to_jsonb(o) FROM dwarf.await(f.id, '0 s') o) AS outcome,
		   (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.step_id) FROM dwarf.history(f.id) h) AS history,
		   dwarf.history_mermaid(f.id) AS mermaid,
		   dwarf.state_at(f.id) AS state
	  FROM rt.flows f;

-- Where a flow is: live, archived, or gone; and its steps.
CREATE FUNCTION rt.place(f_id bigint) RETURNS text LANGUAGE sql AS $$
	SELECT CASE WHEN EXISTS (SELECT 1 FROM dwarf.flow WHERE id = f_id) THEN 'live'
				WHEN EXISTS (SELECT 1 FROM dwarf.flow_archive WHERE id = f_id) THEN 'archived'
				ELSE 'gone' END
		   || ' (' || (SELECT count(*) FROM dwarf.step WHERE flow_id = f_id) || ' live steps, '
		   || (SELECT count(*) FROM dwarf.step_archive WHERE flow_id = f_id) || ' archived)' $$;

-- The segment this test's flows are in, and its table as it is now.
CREATE TABLE rt.seg AS
	SELECT g.relation, g.lo, g.hi, c.relfilenode
	  FROM dwarf.segment g JOIN pg_class c ON c.oid = ('dwarf.' || g.relation)::regclass
	 WHERE (SELECT min(id) FROM rt.flows) >= g.lo AND (SELECT max(id) FROM rt.flows) < g.hi;
SELECT count(*) AS one_segment_holds_them, bool_and(g.live) AS live
  FROM rt.seg s JOIN dwarf.segment g USING (relation);

----------------------------------------------------------------------
-- a pass moves only what closed longer ago than dwarf.archive_after
----------------------------------------------------------------------
SELECT dwarf.maintain() ->> 'moved_flows' AS moved;
-- it made the flow partitions of today and the next two days (UTC)
SELECT count(*) AS days_ready
  FROM generate_series(0, 2) d,
	   LATERAL (SELECT to_char((now() AT TIME ZONE 'UTC')::date + d, 'YYYYMMDD') AS day) x
 WHERE to_regclass('dwarf.flow_archive_' || x.day) IS NOT NULL;
-- and a live segment covers the next flow id, and another follows it
SELECT count(*) AS next_segments_ready
  FROM dwarf.segment s
 WHERE s.live AND s.lo <= dwarf_internal.next_flow_id() AND dwarf_internal.next_flow_id() < s.hi
   AND EXISTS (SELECT 1 FROM dwarf.segment n WHERE n.live AND n.lo = s.hi);
SELECT f.name, rt.place(f.id) FROM rt.flows f ORDER BY f.name;
-- dwarf.maintain belongs to the extension's owner
CREATE ROLE rt_other;
GRANT USAGE ON SCHEMA dwarf, rt TO rt_other;
SET ROLE rt_other;
SELECT rt.try('SELECT dwarf.maintain()');
RESET ROLE;

-- An index someone adds to a segment is kept: the segment goes to the
-- archive as the same table, and rows moved into it later are indexed as
-- a statement would index them (a partial index gets only the rows its
-- predicate takes).  rt.count_seg counts the segment's rows (each a flow's
-- packed steps); rt.index_counts says whether a scan of the partial index
-- (the only path once sequential and bitmap scans are off: the plan names
-- it) counts what a sequential scan counts, how many rows it has (those
-- with a step that did not complete), and that the segment has rows it
-- leaves out.
CREATE FUNCTION rt.count_seg(cond text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	n bigint;
BEGIN
	EXECUTE format('SELECT count(*) FROM dwarf.%I WHERE %s', (SELECT relation FROM rt.seg), cond) INTO n;
	RETURN n;
END $$;
CREATE FUNCTION rt.index_counts()
	RETURNS TABLE (uses_index boolean, same_count boolean, not_completed bigint, has_others boolean)
LANGUAGE plpgsql AS $$
DECLARE
	by_index bigint;
	line text;
	plan text := '';
BEGIN
	SET LOCAL enable_seqscan = off;
	SET LOCAL enable_bitmapscan = off;
	FOR line IN EXECUTE format('EXPLAIN (COSTS OFF) SELECT count(*) FROM dwarf.%I WHERE NOT status <@ %L',
							   (SELECT relation FROM rt.seg), '{completed}') LOOP
		plan := plan || line || E'\n';
	END LOOP;
	by_index := rt.count_seg($c$NOT status <@ '{completed}'$c$);
	SET LOCAL enable_seqscan = on;
	SET LOCAL enable_indexscan = off;
	RETURN QUERY SELECT plan LIKE '%rt_not_completed%', by_index = rt.count_seg($c$NOT status <@ '{completed}'$c$),
						by_index, rt.count_seg('true') > by_index;
END $$;
DO $$
BEGIN
	EXECUTE format('CREATE INDEX rt_not_completed ON dwarf.%I (flow_id) WHERE NOT status <@ %L',
				   (SELECT relation FROM rt.seg), '{completed}');
END $$;
SELECT * FROM rt.index_counts();

-- New flows' ids past the segment of this test's flows, for the passes
-- below, run as if two hours later.
SELECT rt.pass(max(id)) FROM rt.flows;
SELECT rt.passed(max(id)) FROM rt.flows;
-- The move writes the archive's rows itself, a heap page to a WAL record
-- (the aggregate dwarf_internal.archive): a check on the archive still holds it up.
-- A pass that meets a row the check refuses fails whole, naming the flow,
-- and moves nothing; the flows stay live.
CREATE TABLE rt.rows_before AS SELECT * FROM dwarf.flow WHERE id IN (SELECT id FROM rt.flows);
ALTER TABLE dwarf.flow_archive ADD CONSTRAINT rt_no_failed CHECK (status <> 'failed') NOT VALID;
-- A new day takes the archive's checks, or it could not be attached: a
-- pass run past midnight (UTC) makes tomorrow's, and must still fail on the row.
-- (Ten days ahead: no pass of this or an earlier test has made that day.)
BEGIN;
SELECT dwarf_internal.make_archive_day((now() AT TIME ZONE 'UTC')::date + 10) AS day_made_under_the_check;
ROLLBACK;
SELECT rt.try($$SELECT dwarf_internal.maintain_at(now() + interval '2 hours')$$);
SELECT f.name, rt.place(f.id) FROM rt.flows f WHERE f.name IN ('plain', 'failed') ORDER BY f.name;
ALTER TABLE dwarf.flow_archive DROP CONSTRAINT rt_no_failed;
-- Rows are copied column by column as SELECT * lists them: a column added
-- to dwarf.flow alone fails the pass, naming it; once dropped (it stays in
-- the table's descriptor, as a dropped column) the copy lines up again.
ALTER TABLE dwarf.flow ADD COLUMN rt_extra int;
SELECT rt.try($$SELECT dwarf_internal.maintain_at(now() + interval '2 hours')$$);
ALTER TABLE dwarf.flow DROP COLUMN rt_extra;
-- and it is for dwarf.maintain alone
SET ROLE rt_other;
SELECT rt.try('SELECT dwarf_internal.archive(NULL::dwarf.flow)');
RESET ROLE;
SELECT rt.try('SELECT dwarf_internal.archive(NULL::dwarf.flow)');

-- Two hours later, once the ids have passed the segment: the closed flows
-- move, and the segment goes to the archive whole; the interrupted flows
-- stay, their steps moved to dwarf.step_default, and so does the closed
-- child whose parent still waits, its steps in the archived segment.
SELECT (r ->> 'moved_flows')::int >= 4 AS moved, (r ->> 'more')::boolean AS more,
	   (r -> 'segments_archived') ? (SELECT relation FROM rt.seg) AS archived_the_segment,
	   (r ->> 'moved_steps')::int >= 6 AS moved_the_open_flows_steps
  FROM dwarf_internal.maintain_at(now() + interval '2 hours') r;
SELECT f.name, rt.place(f.id) FROM rt.flows f ORDER BY f.name;
-- each archived row is the live row as it was, column for column, and each
-- index of its day partition finds it (with sequential scans off, the
-- indexes are the only way in)
SELECT count(*) AS archived, count(*) FILTER (WHERE a IS NOT DISTINCT FROM b) AS same_row
  FROM rt.rows_before b JOIN dwarf.flow_archive a USING (id);
SET enable_seqscan = off;
SELECT (SELECT count(*) FROM dwarf.flow_archive a WHERE a.id = f.id) AS by_id,
	   (SELECT a.id FROM dwarf.flow_archive a
		 WHERE a.owner = current_user::regrole AND a.idempotency_key = 'rt-once') = f.id AS by_key
  FROM rt.flows f WHERE f.name = 'keyed';
SELECT count(*) AS by_thread FROM dwarf.flow_archive a WHERE a.thread = 'rt-thread';
RESET enable_seqscan;
-- The day partition's index by id is a block-range index.  A pass writes
-- its flows in id order (here 4,000 copies of an archived flow, closed the
-- day before and put back live in the reverse order), summarizes every
-- range of 32 pages they filled and leaves the last, still filling, alone;
-- it analyzes the partition it made, and a lookup by id then reads the
-- index and one range, with no planner setting.
CREATE FUNCTION rt.plan(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	line text;
	plan text := '';
BEGIN
	FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
		plan := plan || line || E'\n';
	END LOOP;
	RETURN plan;
END $$;
CREATE FUNCTION rt.plan_of(sql text, node text) RETURNS boolean LANGUAGE sql AS
	$$ SELECT strpos(p, node) > 0 AND p NOT LIKE '%Seq Scan%' FROM rt.plan(sql) p $$;
INSERT INTO dwarf.flow
SELECT (jsonb_populate_record(NULL::dwarf.flow, to_jsonb(t) || jsonb_build_object('id', 800000000000 + g,
		'finished_at', t.finished_at - interval '1 day'))).*
  FROM dwarf.flow_archive t, generate_series(4000, 1, -1) g
 WHERE t.id = (SELECT id FROM rt.flows WHERE name = 'plain');
-- (after a checkpoint, so that the pass's first change to each flow page
-- logs the whole page: it compresses those images, and sets the session's
-- setting back)
CREATE EXTENSION pg_walinspect;
CHECKPOINT;
SELECT pg_current_wal_lsn() AS lsn0 \gset
BEGIN;
SELECT (r ->> 'moved_flows')::int AS moved FROM dwarf_internal.maintain_at(now() + interval '2 hours') r;
SELECT current_setting('wal_compression') AS wal_compression_after;
COMMIT;
SELECT count(*) > 0 AS flow_page_images,
	   count(*) FILTER (WHERE block_ref !~ 'method: (lz4|pglz)') AS not_compressed
  FROM pg_get_wal_records_info(:'lsn0', pg_current_wal_lsn())
 WHERE resource_manager = 'Heap' AND record_type = 'DELETE' AND block_ref LIKE '%FPW%'
   AND block_ref ~ format('/%s (fork main )?blk ', pg_relation_filenode('dwarf.flow'));
SELECT tableoid::regclass AS part, to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day
  FROM dwarf.flow_archive WHERE id = 800000000001 \gset
SELECT count(DISTINCT tableoid) AS partitions,
	   array_agg(id ORDER BY ctid) = array_agg(id ORDER BY id) AS in_id_order
  FROM dwarf.flow_archive WHERE id > 800000000000;
SELECT pg_get_indexdef((:'part' || '_id')::regclass) ~ 'USING brin \(id int8_minmax_multi_ops' AS brin_by_id,
	   pg_relation_size(:'part') / 8192 / 32 >= 2 AS ranges_filled,
	   (SELECT reltuples FROM pg_class WHERE oid = :'part'::regclass) AS analyzed_rows;
BEGIN;
SELECT (SELECT sum(brin_summarize_range((:'part' || '_id')::regclass, r * 32))
		  FROM generate_series(0, pg_relation_size(:'part') / 8192 / 32 - 1) r) AS whole_ranges_left,
	   brin_summarize_range((:'part' || '_id')::regclass, pg_relation_size(:'part') / 8192 / 32 * 32) AS last_range_left;
ROLLBACK;
SELECT rt.plan_of(format('SELECT * FROM %s WHERE id = 800000002000', :'part'), 'Bitmap Index Scan on '
				  || (SELECT relname FROM pg_class WHERE oid = (:'part' || '_id')::regclass)) AS by_id_through_it,
	   (SELECT count(*) FROM dwarf.flow_archive WHERE id = 800000002000) AS found;
-- The day has passed the pass's cutoff: the next pass builds it a B-tree
-- by id, which logs its pages compressed, and a lookup by id goes through
-- that.  A day is built once; today's, still filling, is not.  A build
-- that fails (here an event trigger refuses it) is a warning: the pass
-- goes on and commits, and the next one builds it.
CREATE FUNCTION rt.refuse_id_btree() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() c WHERE c.object_identity LIKE '%\_id\_btree') THEN
		RAISE EXCEPTION 'no B-tree by id today';
	END IF;
END $$;
CREATE EVENT TRIGGER rt_refuse_id_btree ON ddl_command_end WHEN TAG IN ('CREATE INDEX')
	EXECUTE FUNCTION rt.refuse_id_btree();
SELECT r -> 'days_indexed' AS refused, r ? 'moved_flows' AS went_on
  FROM dwarf_internal.maintain_at(now() + interval '2 hours') r;
SELECT to_regclass(:'part' || '_id_btree') IS NULL AS not_built;
DROP EVENT TRIGGER rt_refuse_id_btree;
SELECT r -> 'days_indexed' = jsonb_build_array(:'day') AS would_index,
	   to_regclass(:'part' || '_id_btree') IS NULL AS not_built
  FROM dwarf_internal.maintain_at(now() + interval '2 hours', dry_run => true) r;
SELECT pg_current_wal_lsn() AS lsn1 \gset
SELECT r -> 'days_indexed' = jsonb_build_array(:'day') AS indexed_that_day
  FROM dwarf_internal.maintain_at(now() + interval '2 hours') r;
-- (not_today: the day the pass's cutoff falls in, which no pass indexes;
-- today, but for the last hour of a UTC day, when it is tomorrow)
SELECT pg_get_indexdef((:'part' || '_id_btree')::regclass) ~ 'USING btree \(id\)$' AS btree_by_id,
	   rt.plan_of(format('SELECT * FROM %s WHERE id = 800000002000', :'part'), 'Index Scan using '
				  || (SELECT relname FROM pg_class WHERE oid = (:'part' || '_id_btree')::regclass)) AS by_id_through_it,
	   (SELECT count(*) FROM dwarf.flow_archive WHERE id = 800000002000) AS found,
	   to_regclass(format('dwarf.flow_archive_%s_id_btree',
						  to_char((now() + interval '2 hours' - current_setting('dwarf.archive_after')::interval)
								  AT TIME ZONE 'UTC', 'YYYYMMDD'))) IS NULL
		 AS not_today;
SELECT count(*) > 0 AS index_page_images,
	   count(*) FILTER (WHERE block_ref !~ 'method: (lz4|pglz)') AS not_compressed
  FROM pg_get_wal_records_info(:'lsn1', pg_current_wal_lsn())
 WHERE block_ref ~ format('/%s (fork main )?blk ', pg_relation_filenode(:'part' || '_id_btree'));
DROP EXTENSION pg_walinspect;
-- what tells a pass which days' index by id is its own block-range index
SELECT dwarf_internal.is_brin((:'part' || '_id')::regclass) AS id_is_brin,
	   dwarf_internal.is_brin((:'part' || '_id_btree')::regclass) AS btree_is_not,
	   dwarf_internal.is_brin(NULL) AS none_is_not;
SELECT NOT r -> 'days_indexed' ? :'day' AS not_again
  FROM dwarf_internal.maintain_at(now() + interval '2 hours') r;
DROP TABLE :part;
-- Rows stream through the aggregate, written a thousand at a time, each to
-- its day: 2,500 copies of an archived flow closing today and tomorrow, in
-- a transaction rolled back.
BEGIN;
SELECT dwarf_internal.archive(jsonb_populate_record(NULL::dwarf.flow,
		to_jsonb(t) || jsonb_build_object('id', 900000000000 + g,
										  'finished_at', t.finished_at + (g % 2) * interval '1 day'))) AS written
  FROM dwarf.flow_archive t, generate_series(1, 2500) g
 WHERE t.id = (SELECT id FROM rt.flows WHERE name = 'plain');
SELECT count(*) AS copies, count(DISTINCT tableoid) AS days,
	   count(*) FILTER (WHERE (to_jsonb(a) - 'id' - 'finished_at') = (SELECT to_jsonb(p) - 'id' - 'finished_at'
			FROM dwarf.flow_archive p WHERE p.id = (SELECT id FROM rt.flows WHERE name = 'plain'))) AS same
  FROM dwarf.flow_archive a WHERE a.id > 900000000000;
SET LOCAL enable_seqscan = off;
SELECT count(*) AS found_by_id FROM (VALUES (900000000001), (900000001234), (900000002500)) v(id)
 WHERE EXISTS (SELECT 1 FROM dwarf.flow_archive a WHERE a.id = v.id);
-- and 8 MB at a time: twelve flows whose states are a megabyte each
SELECT dwarf_internal.archive(jsonb_populate_record(NULL::dwarf.flow,
		to_jsonb(t) || jsonb_build_object('id', 900000010000 + g, 'state', jsonb_build_object('big', repeat(g::text, 1000000))))) AS written
  FROM dwarf.flow_archive t, generate_series(1, 12) g
 WHERE t.id = (SELECT id FROM rt.flows WHERE name = 'plain');
SELECT count(*) AS big, bool_and(length(state ->> 'big') = 1000000 * length((id - 900000010000)::text)) AS whole
  FROM dwarf.flow_archive WHERE id > 900000010000;
ROLLBACK;
-- the segment is the same table, attached to dwarf.step_archive, with the
-- steps of the closed flows where they were: none was copied
SELECT g.live, c.relfilenode = s.relfilenode AS same_table,
	   (SELECT i.inhparent::regclass FROM pg_inherits i WHERE i.inhrelid = c.oid) AS parent,
	   (SELECT count(*) FROM dwarf.step_log_archive a JOIN rt.flows f ON f.id = a.flow_id
		 WHERE a.tableoid <> c.oid) AS steps_elsewhere
  FROM rt.seg s JOIN dwarf.segment g USING (relation) JOIN pg_class c ON c.oid = ('dwarf.' || s.relation)::regclass;
-- the archive's steps as the statistics count them: a row packs a flow's steps
ANALYZE dwarf.step_log_archive;
SELECT s.archive_steps_estimate = a.steps AS estimate_counts_steps, a.steps > a.packs AS packed
  FROM dwarf.storage s,
	   (SELECT (SELECT count(*) FROM dwarf.step_archive) AS steps,
			   (SELECT count(*) FROM dwarf.step_log_archive) AS packs) a;
-- the open flows' steps are in dwarf.step_default
SELECT string_agg(DISTINCT s.tableoid::regclass::text, ',') AS open_flows_steps_in
  FROM dwarf.step_log s JOIN rt.flows f ON f.id = s.flow_id;
-- the index someone added is still there, and still right
SELECT * FROM rt.index_counts();

----------------------------------------------------------------------
-- every read says the same of an archived flow
----------------------------------------------------------------------
SELECT b.name,
	   (SELECT to_jsonb(o) FROM dwarf.await(f.id, '0 s') o) = b.outcome AS await,
	   (SELECT jsonb_agg(to_jsonb(h) ORDER BY h.step_id) FROM dwarf.history(f.id) h) = b.history AS history,
	   dwarf.history_mermaid(f.id) = b.mermaid AS mermaid,
	   dwarf.state_at(f.id) = b.state AS state
  FROM rt.before b JOIN rt.flows f USING (name) ORDER BY b.name;
SELECT status, state, steps FROM dwarf.snapshot((SELECT id FROM rt.flows WHERE name = 'plain'));
-- each day partition and each segment has its own indexes, which the reads
-- of an archived flow use (with sequential scans off, as
-- dwarf_internal.flow_steps has them)
CREATE FUNCTION rt.uses_index(sql text) RETURNS boolean LANGUAGE sql AS
	$$ SELECT p LIKE '%Index%' AND p NOT LIKE '%Seq Scan%' FROM rt.plan(sql) p $$;
SET enable_seqscan = off;
SELECT rt.uses_index(format('SELECT * FROM dwarf.flow_all WHERE id = %s', f.id)) AS by_id,
	   rt.uses_index(format('SELECT * FROM dwarf.step_archive WHERE flow_id = %s', f.id)) AS its_steps,
	   rt.uses_index(format('SELECT id FROM dwarf.flow_archive WHERE owner = %L::regrole AND idempotency_key = %L',
							f.owner, 'rt-once')) AS by_key,
	   rt.uses_index($$SELECT id FROM dwarf.flow_archive WHERE thread = 'rt-thread'$$) AS by_thread,
	   rt.uses_index(format('SELECT id FROM dwarf.flow_archive WHERE parent_id = %s', f.id)) AS by_parent
  FROM dwarf.flow_archive f WHERE f.id = (SELECT id FROM rt.flows WHERE name = 'plain');
RESET enable_seqscan;
SELECT task, status FROM dwarf.history((SELECT id FROM rt.flows WHERE name = 'plain')) WHERE task = 'B';
-- list: live and archived together, newest first, and the same cursor
SELECT array_agg(l.flow_id ORDER BY l.flow_id DESC) = array_agg(l.flow_id ORDER BY ord) AS newest_first,
	   count(*) FILTER (WHERE l.flow_id IN (SELECT id FROM rt.flows)) AS mine
  FROM dwarf.list(page_size => 1000) WITH ORDINALITY l(flow_id, graph, version, status, thread, error,
														created_at, finished_at, interrupt_payload, error_task,
														error_sqlstate, error_detail, error_hint, ord);
SELECT graph, status FROM dwarf.list(graph => 'rt_chain', page_size => 2);
SELECT graph, status FROM dwarf.list(graph => 'rt_chain',
	before => (SELECT min(flow_id) FROM dwarf.list(graph => 'rt_chain', page_size => 2)));
SELECT count(*) FROM dwarf.list(thread => 'rt-thread');
-- an idempotent create finds the archived flow, and inserts nothing
SELECT dwarf.create('rt_chain', '{}', idempotency_key => 'rt-once')
	   = (SELECT id FROM rt.flows WHERE name = 'keyed') AS same_flow;
SELECT count(*) AS live_rows_with_that_key FROM dwarf.flow WHERE idempotency_key = 'rt-once';
-- cancel and resume say what they say of any closed flow
SELECT dwarf.cancel((SELECT id FROM rt.flows WHERE name = 'plain')) AS cancelled;
SELECT rt.try(format('SELECT dwarf.resume(%s)', (SELECT id FROM rt.flows WHERE name = 'plain')));

-- fork from an archived step, continue an archived thread
INSERT INTO rt.flows
	SELECT 'forked', dwarf.fork((SELECT step_id FROM dwarf.history((SELECT id FROM rt.flows WHERE name = 'plain')) WHERE task = 'B'),
								'{"n": 100}');
SELECT o.status, o.state FROM dwarf.await((SELECT id FROM rt.flows WHERE name = 'forked')) o;
INSERT INTO rt.flows SELECT 'continued', dwarf.continue((SELECT id FROM rt.flows WHERE name = 'threaded'), '{"n": 50}');
SELECT o.status, o.state FROM dwarf.await((SELECT id FROM rt.flows WHERE name = 'continued')) o;
SELECT thread FROM dwarf.snapshot((SELECT id FROM rt.flows WHERE name = 'continued')) s
  JOIN dwarf.flow_all f ON f.id = s.flow_id;
-- continuing a flow without a thread names the thread after it, archived or not
INSERT INTO rt.flows SELECT 'continued_plain', dwarf.continue((SELECT id FROM rt.flows WHERE name = 'failed'));
SELECT (SELECT thread FROM dwarf.flow_archive WHERE id = (SELECT id FROM rt.flows WHERE name = 'failed'))
	   = (SELECT id FROM rt.flows WHERE name = 'failed')::text AS thread_named;
SELECT status FROM dwarf.await((SELECT id FROM rt.flows WHERE name = 'continued_plain'));

----------------------------------------------------------------------
-- row-level security: another role sees none of it
----------------------------------------------------------------------
SELECT id AS plain_id FROM rt.flows WHERE name = 'plain' \gset
SELECT partition AS some_day FROM dwarf_internal.archive_days('dwarf.flow_archive') LIMIT 1 \gset
SELECT relation AS seg FROM rt.seg \gset
SET ROLE rt_other;
SELECT count(*) AS archived_flows, (SELECT count(*) FROM dwarf.step_archive) AS archived_steps
  FROM dwarf.flow_archive;
SELECT rt.try(format('SELECT dwarf.history(%s)', :plain_id));
SELECT rt.try(format('SELECT dwarf.snapshot(%s)', :plain_id));
SELECT rt.try(format('SELECT dwarf.await(%s)', :plain_id));
SELECT rt.try(format('SELECT * FROM %s', :'some_day'));
SELECT rt.try(format('SELECT * FROM dwarf.%I', :'seg'));
RESET ROLE;
REVOKE USAGE ON SCHEMA rt FROM rt_other;

----------------------------------------------------------------------
-- delete and purge work on archived flows
----------------------------------------------------------------------
SELECT dwarf.delete((SELECT id FROM rt.flows WHERE name = 'keyed'));
SELECT rt.place(id) FROM rt.flows WHERE name = 'keyed';
-- (purge keeps child_done: its parent, still interrupted, reads it again)
SELECT dwarf.purge(older_than => '0 s') >= 1 AS purged;
SELECT f.name, rt.place(f.id) FROM rt.flows f WHERE f.name IN ('plain', 'failed') ORDER BY f.name;

----------------------------------------------------------------------
-- what is left, two months later: old days are dropped whole (the tables
-- are gone, no row was deleted); the interrupted flows and the waiting
-- child were never moved, and their archived segment is kept while they
-- are open; the parent completes with its whole history
----------------------------------------------------------------------
SELECT (r ->> 'partitions_dropped')::int >= 1 AS dropped,
	   (r -> 'days_dropped') ? to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS today_dropped,
	   (r -> 'segments_dropped') ? :'seg' AS segment_dropped
  FROM dwarf_internal.maintain_at(now() + interval '2 months') r;
SELECT to_regclass('dwarf.flow_archive_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL AS flow_day_gone,
	   to_regclass('dwarf.' || :'seg') IS NOT NULL AS segment_kept;
-- A flow that closed on a day already expired is moved into that day (made
-- again), and the next pass drops it: a pass drops days before it moves.
-- Its segment, once the ids have passed it, goes to the archive and, its
-- newest flow's day expired, is dropped in the same pass.
INSERT INTO rt.flows SELECT 'late', flow_id FROM dwarf.run('rt_chain', '{}');
SELECT rt.pass(id) FROM rt.flows WHERE name = 'late';
SELECT rt.passed(id) FROM rt.flows WHERE name = 'late';
SELECT relation AS late_seg FROM dwarf.segment, rt.flows f WHERE f.name = 'late' AND f.id >= lo AND f.id < hi \gset
SELECT r -> 'days_made' ? to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS made_again,
	   (r ->> 'moved_flows')::int >= 1 AS moved,
	   (r -> 'segments_archived') ? :'late_seg' AS its_segment_archived,
	   (r -> 'segments_dropped') ? :'late_seg' AS and_dropped
  FROM dwarf_internal.maintain_at(now() + interval '2 months') r;
SELECT rt.place(id), to_regclass('dwarf.' || :'late_seg') IS NULL AS segment_gone FROM rt.flows WHERE name = 'late';
-- a dry run of the next pass says what it would drop, with how many flows,
-- and drops nothing
SELECT (r ->> 'dry_run')::boolean AS dry_run,
	   (r -> 'days_dropped') ? to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS would_drop_today,
	   (r ->> 'flows_in_days_dropped')::int >= 1 AS with_its_flows
  FROM dwarf_internal.maintain_at(now() + interval '2 months', dry_run => true) r;
SELECT rt.place(id) FROM rt.flows WHERE name = 'late';
SELECT (r -> 'days_dropped') ? to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS dropped_on_the_next_pass
  FROM dwarf_internal.maintain_at(now() + interval '2 months') r;
SELECT f.name, rt.place(f.id) FROM rt.flows f ORDER BY f.name;
SELECT dwarf.resume((SELECT id FROM rt.flows WHERE name = 'parent'), '"yes"');
SELECT o.status, o.state -> 'second' AS second FROM dwarf.await((SELECT id FROM rt.flows WHERE name = 'parent')) o;
SELECT task, status FROM dwarf.history((SELECT id FROM rt.flows WHERE name = 'parent')) ORDER BY step_id;
SELECT dwarf.resume((SELECT id FROM rt.flows WHERE name = 'asking'), '"yes"');
SELECT o.status FROM dwarf.await((SELECT id FROM rt.flows WHERE name = 'asking')) o;
SELECT task, status FROM dwarf.history((SELECT id FROM rt.flows WHERE name = 'asking')) ORDER BY step_id;

-- Once they closed, a pass moves their steps from dwarf.step_default into
-- their archived segment (the flows stay live until dwarf.archive_after),
-- the index someone added takes the moved rows it should, and the reads
-- say the same
SELECT (dwarf.maintain() ->> 'moved_steps')::int >= 13 AS moved_their_steps;
SELECT f.name, rt.place(f.id) FROM rt.flows f WHERE f.name IN ('parent', 'asking', 'child_asking', 'child_done')
 ORDER BY f.name;
SELECT count(*) AS in_default FROM dwarf.step_default s JOIN rt.flows f ON f.id = s.flow_id;
SELECT * FROM rt.index_counts();
SELECT task, status FROM dwarf.history((SELECT id FROM rt.flows WHERE name = 'asking')) ORDER BY step_id;
-- Two months later, the segment goes whole with the last of its flows
SELECT (r -> 'segments_dropped') ? :'seg' AS segment_dropped
  FROM dwarf_internal.maintain_at(now() + interval '2 months') r;
SELECT to_regclass('dwarf.' || :'seg') IS NULL AS segment_gone,
	   NOT EXISTS (SELECT 1 FROM dwarf.segment WHERE relation = :'seg') AS unlisted;
SELECT dwarf_internal.maintain_at(now() + interval '2 months') IS NOT NULL AS next_pass;
SELECT f.name, rt.place(f.id) FROM rt.flows f ORDER BY f.name;

-- dwarf.storage: sizes and the last pass
SELECT archive_days >= 1 AS has_days, oldest_archived_day IS NOT NULL AS has_oldest,
	   last_maintain_at IS NOT NULL AS has_last_pass, last_maintain ? 'moved_flows' AS says_what,
	   live_flow_bytes > 0 AND live_step_bytes > 0 AS live_sizes,
	   live_segments = (SELECT count(*) FROM dwarf.segment WHERE live) AND live_segments >= 2 AS live_segments,
	   archived_segments = (SELECT count(*) FROM dwarf.segment WHERE NOT live) AS archived_segments
  FROM dwarf.storage;
SELECT count(*) >= 3 AS passes_logged FROM dwarf.maintain_log;

RESET dwarf.archive_after;
RESET dwarf.segment_interval;
REVOKE USAGE ON SCHEMA dwarf FROM rt_other;
DROP ROLE rt_other;
DROP SCHEMA rt CASCADE;
