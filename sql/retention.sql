--
-- retention: dwarf.maintain() moves closed flows (and their steps) into
-- dwarf.flow_archive / dwarf.step_archive, day partitions by the time the
-- flow closed, and drops whole days older than dwarf.retention.  Running and
-- interrupted flows, and a closed child whose parent still waits, stay live.
-- Every read and operation works the same on an archived flow.  The "now"
-- argument shows what a later pass would do, so nothing here waits.
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
	RETURN SQLSTATE || ': ' || regexp_replace(regexp_replace(SQLERRM, '(flow|step) -?\d+', '\1 N', 'g'),
											  '_archive_\d{8}', '_archive_YYYYMMDD', 'g');
END $$;

----------------------------------------------------------------------
-- the settings: intervals, per session (and per database), checked
----------------------------------------------------------------------
SHOW dwarf.archive_after;
SHOW dwarf.retention;
SELECT rt.try($$SET dwarf.archive_after = 'soon'$$);
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

-- Where a flow is: live, archived, or gone.
CREATE FUNCTION rt.place(f_id bigint) RETURNS text LANGUAGE sql AS $$
	SELECT CASE WHEN EXISTS (SELECT 1 FROM dwarf.flow WHERE id = f_id) THEN 'live'
				WHEN EXISTS (SELECT 1 FROM dwarf.flow_archive WHERE id = f_id) THEN 'archived'
				ELSE 'gone' END
		   || ' (' || (SELECT count(*) FROM dwarf.step WHERE flow_id = f_id) || ' live steps, '
		   || (SELECT count(*) FROM dwarf.step_archive WHERE flow_id = f_id) || ' archived)' $$;

----------------------------------------------------------------------
-- a pass moves only what closed longer ago than dwarf.archive_after
----------------------------------------------------------------------
SET dwarf.archive_after = '1 hour';
SELECT dwarf.maintain() ->> 'moved_flows' AS moved;
-- it made the partitions of today and the next two days (UTC), in both tables
SELECT count(*) AS days_ready
  FROM generate_series(0, 2) d,
	   LATERAL (SELECT to_char((now() AT TIME ZONE 'UTC')::date + d, 'YYYYMMDD') AS day) x
 WHERE to_regclass('dwarf.flow_archive_' || x.day) IS NOT NULL
   AND to_regclass('dwarf.step_archive_' || x.day) IS NOT NULL;
SELECT f.name, rt.place(f.id) FROM rt.flows f ORDER BY f.name;
-- dwarf.maintain belongs to the extension's owner
CREATE ROLE rt_other;
GRANT USAGE ON SCHEMA dwarf, rt TO rt_other;
SET ROLE rt_other;
SELECT rt.try('SELECT dwarf.maintain()');
RESET ROLE;

-- An index someone adds to a day partition of the steps is kept as a
-- statement would keep it: a partial index gets only the rows its
-- predicate takes.  rt.count_today counts today's archived steps.
CREATE FUNCTION rt.count_today(cond text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	n bigint;
BEGIN
	EXECUTE format('SELECT count(*) FROM dwarf.%I WHERE %s',
				   'step_archive_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'), cond) INTO n;
	RETURN n;
END $$;
DO $$
BEGIN
	EXECUTE format('CREATE INDEX rt_failed_steps ON dwarf.%I (flow_id) WHERE status = %L',
				   'step_archive_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'), 'failed');
END $$;

-- Two hours later: the closed flows move with their steps; the interrupted
-- flows stay, and so does the closed child whose parent still waits.
SELECT (r ->> 'moved_flows')::int >= 4 AS moved, (r ->> 'more')::boolean AS more
  FROM dwarf_internal.maintain_at(now() + interval '2 hours') r;
SELECT f.name, rt.place(f.id) FROM rt.flows f ORDER BY f.name;
-- the step rows sit in the day partition of their flow
SELECT count(*) AS steps_off_their_flows_day
  FROM dwarf.step_archive s JOIN rt.flows r ON r.id = s.flow_id
 WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow_archive f
					WHERE f.id = s.flow_id AND f.finished_at = s.flow_finished_at);
-- the partial index holds the failed steps only: a scan of it (the only
-- index path once bitmap scans are off) counts what a sequential scan counts
SET enable_seqscan = off;
SET enable_bitmapscan = off;
CREATE TEMP TABLE rt_by_index AS SELECT rt.count_today($$status = 'failed'$$) AS n;
RESET enable_seqscan;
SET enable_indexscan = off;
SELECT i.n = rt.count_today($$status = 'failed'$$) AS same_count, i.n >= 1 AS has_failed,
	   rt.count_today('true') > i.n AS has_others
  FROM rt_by_index i;
RESET enable_indexscan;
RESET enable_bitmapscan;

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
-- each day partition has its own indexes, which the reads of an archived
-- flow use (with sequential scans off, as dwarf_internal.flow_steps has them)
CREATE FUNCTION rt.uses_index(sql text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
	line text;
	plan text := '';
BEGIN
	FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
		plan := plan || line || E'\n';
	END LOOP;
	RETURN plan LIKE '%Index%' AND plan NOT LIKE '%Seq Scan%';
END $$;
SET enable_seqscan = off;
SELECT rt.uses_index(format('SELECT * FROM dwarf.flow_all WHERE id = %s', f.id)) AS by_id,
	   rt.uses_index(format('SELECT * FROM dwarf.step_archive WHERE flow_id = %s AND flow_finished_at = %L',
							f.id, f.finished_at)) AS its_steps,
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
SET ROLE rt_other;
SELECT count(*) AS archived_flows, (SELECT count(*) FROM dwarf.step_archive) AS archived_steps
  FROM dwarf.flow_archive;
SELECT rt.try(format('SELECT dwarf.history(%s)', :plain_id));
SELECT rt.try(format('SELECT dwarf.snapshot(%s)', :plain_id));
SELECT rt.try(format('SELECT dwarf.await(%s)', :plain_id));
SELECT rt.try(format('SELECT * FROM %s', :'some_day'));
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
-- child were never moved, and the parent completes with its whole history
----------------------------------------------------------------------
SELECT (r ->> 'partitions_dropped')::int >= 1 AS dropped,
	   (r -> 'days_dropped') ? to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS today_dropped
  FROM dwarf_internal.maintain_at(now() + interval '2 months') r;
SELECT to_regclass('dwarf.flow_archive_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL AS flow_day_gone,
	   to_regclass('dwarf.step_archive_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL AS step_day_gone;
-- A flow that closed on a day already expired is moved into that day (made
-- again), and the next pass drops it: a pass drops days before it moves.
INSERT INTO rt.flows SELECT 'late', flow_id FROM dwarf.run('rt_chain', '{}');
SELECT r -> 'days_made' ? to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS made_again,
	   (r ->> 'moved_flows')::int >= 1 AS moved
  FROM dwarf_internal.maintain_at(now() + interval '2 months') r;
SELECT rt.place(id) FROM rt.flows WHERE name = 'late';
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

-- dwarf.storage: sizes and the last pass
SELECT archive_days >= 1 AS has_days, oldest_archived_day IS NOT NULL AS has_oldest,
	   last_maintain_at IS NOT NULL AS has_last_pass, last_maintain ? 'moved_flows' AS says_what,
	   live_flow_bytes > 0 AND live_step_bytes > 0 AS live_sizes
  FROM dwarf.storage;
SELECT count(*) >= 3 AS passes_logged FROM dwarf.maintain_log;

RESET dwarf.archive_after;
REVOKE USAGE ON SCHEMA dwarf FROM rt_other;
DROP ROLE rt_other;
DROP SCHEMA rt CASCADE;
