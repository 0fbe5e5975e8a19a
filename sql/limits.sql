--
-- limits: inputs past dwarf's documented limits get a clear error, never a
-- crash; a parent never waits for a child that was cancelled, and its
-- child cannot be deleted while it waits.
--
\set VERBOSITY terse
CREATE SCHEMA lim;
CREATE FUNCTION lim.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;

-- A chain of 80,000 tasks: more than a graph may have.
SELECT dwarf.validate(jsonb_build_object(
	'tasks', (SELECT jsonb_object_agg('t' || g, 'lim.noop') FROM generate_series(1, 80000) g),
	'transitions', jsonb_build_array(jsonb_build_object('chain',
		(SELECT jsonb_agg('t' || g ORDER BY g) FROM generate_series(1, 80000) g)))));
-- 10,000 is allowed, and a long chain is checked without running out of stack.
SELECT jsonb_array_length(dwarf.validate(jsonb_build_object(
	'tasks', (SELECT jsonb_object_agg('t' || g, 'lim.noop') FROM generate_series(1, 10000) g),
	'transitions', jsonb_build_array(jsonb_build_object('chain',
		(SELECT jsonb_agg('t' || g ORDER BY g) FROM generate_series(1, 10000) g)))))->'transitions')
  > 0 AS validated;

-- Intervals past 100 years: a sleep that would overflow its wake time fails
-- the step with a clear error instead of waking at once.
CREATE FUNCTION lim.long_sleep(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('106751990 days'); RETURN '{}'; END $$;
SELECT dwarf.define('lim_sleep', '{"tasks": {"A": "lim.long_sleep"}}');
SELECT status, error FROM dwarf.run('lim_sleep', '{}');
SELECT * FROM dwarf.await(1, '2147483647 days 2562047788 hours');
SELECT * FROM dwarf.run('lim_sleep', '{}', timeout => '-1 s');

-- A child cancelled (or deleted) while its parent waits in dwarf.subgraph:
-- the parent's task runs again and learns it.
CREATE FUNCTION lim.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('1 hour'); RETURN '{}'; END $$;
CREATE FUNCTION lim.call_child(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RETURN coalesce(dwarf.subgraph('lim_child', '{}'), '{}'); END $$;
SELECT dwarf.define('lim_child', '{"tasks": {"Nap": "lim.nap", "After": "lim.noop"},
  "transitions": [{"from": "Nap", "to": "After"}]}');
SELECT dwarf.define('lim_parent', '{"tasks": {"Call": "lim.call_child"}}');
CREATE TABLE lim.ids (what text, id bigint);
CREATE FUNCTION lim.start_and_find_child() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	parent bigint;
BEGIN
	SELECT flow_id INTO parent FROM dwarf.run('lim_parent', '{}', timeout => '100 ms');
	INSERT INTO lim.ids VALUES ('parent', parent);
	FOR i IN 1..200 LOOP		-- the parent's step starts the child
		INSERT INTO lim.ids SELECT 'child', id FROM dwarf.flow WHERE parent_id = parent;
		EXIT WHEN FOUND;
		PERFORM pg_sleep(0.05);
	END LOOP;
END $$;
SELECT lim.start_and_find_child();
SELECT status FROM dwarf.await((SELECT id FROM lim.ids WHERE what = 'parent'), '100 ms');
SELECT dwarf.cancel((SELECT id FROM lim.ids WHERE what = 'child'), 'not needed');
SELECT status, error LIKE 'subgraph "lim_child" (flow % cancelled: cancelled' AS says_why
  FROM dwarf.await((SELECT id FROM lim.ids WHERE what = 'parent'), '10 s');

-- A child cannot be deleted while its parent waits for it (the parent's task
-- would start a new child when it runs again): dwarf.delete refuses, and the
-- parent goes on waiting for the same child.  Deleting the parent deletes
-- both (subgraph_child_delete tests the rest).
DELETE FROM lim.ids;
SELECT lim.start_and_find_child();
DO $$
BEGIN
	PERFORM dwarf.delete((SELECT id FROM lim.ids WHERE what = 'child'));
	RAISE NOTICE 'the child was deleted';
EXCEPTION WHEN dependent_objects_still_exist THEN
	RAISE NOTICE 'refused: its parent still waits for it';
END $$;
SELECT count(*) AS children, bool_and(id = (SELECT id FROM lim.ids WHERE what = 'child')) AS same_child
  FROM dwarf.flow WHERE parent_id = (SELECT id FROM lim.ids WHERE what = 'parent');
SELECT dwarf.delete((SELECT id FROM lim.ids WHERE what = 'parent'));
SELECT count(*) AS family_left FROM dwarf.flow
 WHERE id IN (SELECT id FROM lim.ids);

-- A task that starts a subgraph of its own graph, unconditionally: the
-- recursion stops at 32 levels, and every level fails with the reason.
CREATE FUNCTION lim.recurse(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RETURN coalesce(dwarf.subgraph('lim_rec', '{}'), '{}'); END $$;
SELECT dwarf.define('lim_rec', '{"tasks": {"R": "lim.recurse"}}');
SELECT status, error LIKE '%subgraph "lim_rec" would nest flows more than 32 deep' AS says_why
  FROM dwarf.run('lim_rec', '{}', timeout => '60 s');
SELECT f.status, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name = 'lim_rec' GROUP BY 1;

-- A task may not wait for another flow with dwarf.run or dwarf.await (it
-- would hold its worker, which may be the one to run the other flow).
CREATE FUNCTION lim.nested_run(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.run('lim_rec', '{}'); RETURN '{}'; END $$;
CREATE FUNCTION lim.nested_await(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.await(dwarf.flow_id(), '1 s'); RETURN '{}'; END $$;
SELECT dwarf.define('lim_nested_run', '{"tasks": {"A": "lim.nested_run"}}');
SELECT dwarf.define('lim_nested_await', '{"tasks": {"A": "lim.nested_await"}}');
SELECT status, error FROM dwarf.run('lim_nested_run', '{}');
SELECT status, error FROM dwarf.run('lim_nested_await', '{}');

-- A chain of fewer than two tasks says nothing: refused.
SELECT dwarf.validate('{"tasks": {"A": "lim.noop"}, "transitions": [{"chain": []}]}');
SELECT dwarf.validate('{"tasks": {"A": "lim.noop"}, "transitions": [{"chain": ["A"]}]}');

-- A flow whose role was dropped while it slept fails with a clear error.
-- (Its tasks need nothing granted to the role, so that DROP ROLE goes
-- through: functions in public, dwarf granted to PUBLIC for the while.)
CREATE FUNCTION public.lim_nap_short(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('300 ms'); RETURN '{}'; END $$;
CREATE FUNCTION public.lim_noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT dwarf.define('lim_nap', '{"tasks": {"Nap": "public.lim_nap_short", "After": "public.lim_noop"},
  "transitions": [{"from": "Nap", "to": "After"}]}');
GRANT USAGE ON SCHEMA dwarf TO PUBLIC;
SELECT pg_catalog.quote_ident(current_user) || '.lim_nap' AS lim_nap \gset
CREATE ROLE dwarf_lim_gone;
SET ROLE dwarf_lim_gone;
SELECT dwarf.create(:'lim_nap', '{}') AS gone_id \gset
RESET ROLE;
DROP ROLE dwarf_lim_gone;
SELECT status, error LIKE 'the role that created flow % was dropped' AS says_why
  FROM dwarf.await(:gone_id, '10 s');
REVOKE USAGE ON SCHEMA dwarf FROM PUBLIC;
DROP FUNCTION public.lim_nap_short(jsonb), public.lim_noop(jsonb);
