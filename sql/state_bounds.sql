--
-- state_bounds: dwarf_internal.fold_changes folds many changes in one pass, with the
-- same result as folding them one at a time, and is bounded by
-- dwarf.max_state_size: a fold that would build a larger state fails with
-- an error that names the setting (SQLSTATE 54000) instead of taking the
-- server's memory.  dwarf.state_at of a for_each flow: its final state,
-- the state before its fan-in, and (while branches run) the fold.
--
\set VERBOSITY terse
CREATE SCHEMA sb;

-- 1. Many changes at once equal the same changes one at a time, for every
-- reducer, over more fields than a fold looks up by a scan (16).
CREATE FUNCTION sb.one_by_one(state jsonb, changes jsonb[], reducers jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE c jsonb;
BEGIN
	FOREACH c IN ARRAY changes LOOP
		state := dwarf_internal.fold_changes(state, ARRAY[c], reducers);
	END LOOP;
	RETURN state;
END $$;
CREATE TABLE sb.changes AS
SELECT array_agg(jsonb_build_object(
		'rep', i, 'app', CASE WHEN i % 3 = 0 THEN to_jsonb(ARRAY[i, -i]) ELSE to_jsonb(i) END,
		'add', i, 'min', (i * 7919) % 1000, 'max', (i * 7919) % 1000,
		'uni', to_jsonb(ARRAY[i % 10, i % 7]), 'mrg', jsonb_build_object('k' || (i % 5), i),
		'and', i % 50 <> 0, 'or', i = 77, 'cat', chr(97 + i % 26),
		'gone', CASE WHEN i % 2 = 0 THEN 'null'::jsonb ELSE to_jsonb(i) END,
		'f' || (i % 40), i) ORDER BY i) AS changes
  FROM generate_series(1, 300) i;
SELECT dwarf_internal.fold_changes('{"keep": 1, "add": 1000, "app": ["start"]}', changes, r)
		 = sb.one_by_one('{"keep": 1, "add": 1000, "app": ["start"]}', changes, r) AS same,
	   jsonb_array_length(dwarf_internal.fold_changes('{}', changes, r)->'app') AS appended,
	   dwarf_internal.fold_changes('{}', changes, r)->'uni' AS uni,
	   dwarf_internal.fold_changes('{}', changes, r)->'mrg' AS mrg,
	   dwarf_internal.fold_changes('{}', changes, r)->>'add' AS added,
	   dwarf_internal.fold_changes('{"gone": 1}', changes, r) ? 'gone' AS gone_kept,
	   (SELECT count(*) FROM jsonb_object_keys(dwarf_internal.fold_changes('{}', changes, r)) k
		 WHERE k LIKE 'f%') AS f_fields
  FROM sb.changes,
	   (SELECT '{"app": "append", "add": "add", "min": "min", "max": "max", "uni": "union",
				 "mrg": "merge", "and": "and", "or": "or", "cat": "concat"}'::jsonb AS r) r;
-- a type error still names the reducer and the field, past the first change
SELECT dwarf_internal.fold_changes('{}', ARRAY['{"n": 1}', '{"n": 2}', '{"n": "x"}']::jsonb[], '{"n": "add"}');

-- 2. The cap.
SELECT name, boot_val, unit, context FROM pg_settings WHERE name = 'dwarf.max_state_size';
-- 100,000 objects fold under the default cap
SELECT length(dwarf_internal.fold_changes('{}',
		 (SELECT array_agg(jsonb_build_object('results', i, 'total', i)) FROM generate_series(1, 100000) i),
		 '{"results": "append", "total": "add"}')::text) AS folded_length;
-- and fail under a smaller one, with the setting named
SET dwarf.max_state_size = '256kB';
SELECT length(dwarf_internal.fold_changes('{}',
		 (SELECT array_agg(jsonb_build_object('results', i, 'total', i)) FROM generate_series(1, 100000) i),
		 '{"results": "append", "total": "add"}')::text) AS folded_length;
DO $$
BEGIN
	PERFORM dwarf_internal.fold_changes('{}',
		(SELECT array_agg(jsonb_build_object('k' || i, repeat('x', 100))) FROM generate_series(1, 10000) i),
		NULL);
EXCEPTION WHEN program_limit_exceeded THEN
	RAISE NOTICE 'program_limit_exceeded: %', SQLERRM;
END $$;
-- a state that stays small (replaced, not grown) folds however many changes
SELECT dwarf_internal.fold_changes('{}',
		 (SELECT array_agg(jsonb_build_object('last', repeat('y', 1000), 'n', i)) FROM generate_series(1, 10000) i),
		 '{"n": "add"}') ->> 'n' AS n;
RESET dwarf.max_state_size;

-- 3. state_at of a for_each flow: its branches' values in element order.
CREATE FUNCTION sb.start(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION sb.work(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('total', s->'item', 'results', s->'item',
							 'saw_items', s ? 'items', 'index', s->'itemIndex') $$;
CREATE FUNCTION sb.join(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('n', jsonb_array_length(s->'results')) $$;
SELECT dwarf.define('sb_each', '{"tasks": {"Start": "sb.start", "Work": "sb.work", "Join": "sb.join"},
  "transitions": [{"from": "Start", "to": "Work", "for_each": "items", "as": "item"},
				  {"from": "Work", "to": "Join"}, {"from": "Join", "to": "END"}],
  "fan_in": ["Join"], "reducers": {"total": "add", "results": "append"}}');
SELECT flow_id AS each_id FROM dwarf.run('sb_each',
	jsonb_build_object('items', (SELECT jsonb_agg(i) FROM generate_series(1, 150) i)),
	timeout => '60 s') \gset
SELECT status, state->'total' AS total, state->'n' AS n,
	   state->'results' = state->'items' AS in_element_order,
	   state ?| ARRAY['item', 'itemIndex', 'itemCount'] AS each_keys_left,
	   state->'saw_items' AS branch_saw_items
  FROM dwarf.snapshot(:each_id);
SELECT dwarf.state_at(:each_id) = (SELECT state FROM dwarf.flow WHERE id = :each_id) AS final_state,
	   dwarf.state_at(:each_id, (SELECT step_id FROM dwarf.history(:each_id) WHERE task = 'Join'))
		 - 'n' = (SELECT state - 'n' FROM dwarf.flow WHERE id = :each_id) AS before_join,
	   dwarf.state_at(:each_id, (SELECT step_id FROM dwarf.history(:each_id) WHERE task = 'Join')) ? 'n'
		 AS join_seen,
	   dwarf.state_at(:each_id, (SELECT min(step_id) FROM dwarf.history(:each_id) WHERE task = 'Work'))
		 = jsonb_build_object('items', (SELECT jsonb_agg(i) FROM generate_series(1, 150) i)) AS before_branches;
-- while several branches run (here: before the 100th branch's step), no
-- one branch's state is the flow's, and state_at folds every committed change
SELECT step_id AS hundredth FROM dwarf.history(:each_id) WHERE task = 'Work'
 ORDER BY step_id OFFSET 99 LIMIT 1 \gset
SELECT dwarf.state_at(:each_id, :hundredth) - 'items'
		 = jsonb_build_object('total', sum((changes->>'total')::int),
							  'results', jsonb_agg(changes->'results' ORDER BY step_id),
							  'saw_items', false,
							  'index', (array_agg(changes->'index' ORDER BY step_id DESC))[1])
		 AS fold_of_committed
  FROM dwarf.history(:each_id) WHERE task = 'Work' AND step_id < :hundredth;

DROP SCHEMA sb CASCADE;
