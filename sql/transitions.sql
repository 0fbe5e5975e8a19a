--
-- transitions: every kind of edge end to end, fan-out and fan-in order,
-- for_each keys, empty for_each, goto, END, and the state merge rules.
--
-- Each task appends its name to "trail" (reducer append), so the final
-- state shows which tasks ran, folded in the order the engine promises.
--
\set VERBOSITY terse
CREATE SCHEMA tr;
CREATE FUNCTION tr.a(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "A"}'::jsonb $$;
CREATE FUNCTION tr.b(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "B", "who": "B"}'::jsonb $$;
CREATE FUNCTION tr.c(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "C", "who": "C"}'::jsonb $$;
CREATE FUNCTION tr.d(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "D"}'::jsonb $$;
CREATE FUNCTION tr.x(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "X"}'::jsonb $$;
-- the fan-in reports what it was given
CREATE FUNCTION tr.j(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('trail', 'J', 'j_saw', s) $$;
-- a slow task, so that branch completion order differs from branch order
CREATE FUNCTION tr.slow_c(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(0.3);
	RETURN '{"trail": "C", "who": "C"}';
END $$;

-- plain edges
SELECT dwarf.define('tr_plain', '{"tasks": {"A": "tr.a", "B": "tr.b"},
  "transitions": [{"from": "A", "to": "B"}], "reducers": {"trail": "append"}}');
SELECT status, state FROM dwarf.run('tr_plain', '{"in": 1}');

-- chain, ending at END
SELECT dwarf.define('tr_chain', '{"tasks": {"A": "tr.a", "B": "tr.b", "C": "tr.c"},
  "transitions": [{"chain": ["C", "A", "B", "END"]}], "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_chain', '{}');

-- END as the target of an edge ends the flow there; and a task with no
-- outgoing edge ends the flow
SELECT dwarf.define('tr_end', '{"tasks": {"A": "tr.a", "B": "tr.b"},
  "transitions": [{"from": "A", "to": "END", "when": "$.stop == true"},
                  {"from": "A", "to": "B", "when": "$.stop == false"},
                  {"from": "B", "to": "END"}],
  "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_end', '{"stop": true}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_end', '{"stop": false}');
SELECT dwarf.define('tr_dead_end', '{"tasks": {"A": "tr.a"}, "reducers": {"trail": "append"}}');
SELECT status, state FROM dwarf.run('tr_dead_end', '{"in": 1}');

-- when: every matching edge fires; several make a fan-out that meets at J
SELECT dwarf.define('tr_when', '{"tasks": {"A": "tr.a", "B": "tr.b", "C": "tr.c", "D": "tr.d", "J": "tr.j"},
  "transitions": [
    {"from": "A", "to": "B", "when": "$.x > 3"},
    {"from": "A", "to": "C", "when": "$.x > 1"},
    {"from": "A", "to": "D", "when": "$.x > 10"},
    {"from": "B", "to": "J"}, {"from": "C", "to": "J"}, {"from": "D", "to": "J"}],
  "fan_in": ["J"], "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail, state->'who' AS who FROM dwarf.run('tr_when', '{"x": 5}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_when', '{"x": 2}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_when', '{"x": 20}');
-- no match: the flow completes at A
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_when', '{"x": 0}');
-- a missing field does not match (and is no error)
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_when', '{}');

-- switch: tried in order, only the first match fires
SELECT dwarf.define('tr_switch', '{"tasks": {"A": "tr.a", "B": "tr.b", "C": "tr.c", "D": "tr.d"},
  "transitions": [
    {"from": "A", "to": "B", "switch": "$.x > 3"},
    {"from": "A", "to": "C", "switch": "$.x > 1"},
    {"from": "A", "to": "D", "switch": "$.x > 0"}],
  "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_switch', '{"x": 5}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_switch', '{"x": 2}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_switch', '{"x": 1}');
-- no match: the flow completes at A
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_switch', '{"x": 0}');

-- static fan-out: branches fold in the order of "to" (C before B), whatever
-- order they finish in; a field without a reducer keeps the last branch's value
SELECT dwarf.define('tr_static', '{"tasks": {"A": "tr.a", "B": "tr.b", "C": "tr.slow_c", "J": "tr.j"},
  "transitions": [
    {"from": "A", "to": ["C", "B"]},
    {"from": "B", "to": "J"}, {"from": "C", "to": "J"}],
  "fan_in": ["J"], "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail, state->'who' AS who,
	   state->'j_saw'->'trail' AS j_saw_trail FROM dwarf.run('tr_static', '{}');
SELECT h.task, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'tr_static' GROUP BY h.task ORDER BY h.task;
-- static fan-out without a fan-in: the flow completes when every branch has ended
SELECT dwarf.define('tr_static_open', '{"tasks": {"A": "tr.a", "B": "tr.b", "C": "tr.c"},
  "transitions": [{"from": "A", "to": ["C", "B"]}],
  "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_static_open', '{}');

-- for_each: each branch sees item, itemIndex (from 0) and itemCount; the
-- fan-in sees the branches' changes in element order and none of the
-- for_each keys; the source array stays
CREATE FUNCTION tr.each(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF s->>'item' = 'b' THEN
		PERFORM pg_sleep(0.3);	-- finishes last, folds second
	END IF;
	RETURN jsonb_build_object('seen', jsonb_build_object(
		'item', s->'item', 'index', s->'itemIndex', 'count', s->'itemCount'));
END $$;
SELECT dwarf.define('tr_each', '{"tasks": {"A": "tr.a", "W": "tr.each", "J": "tr.j"},
  "transitions": [
    {"from": "A", "to": "W", "for_each": "items"},
    {"from": "W", "to": "J"}],
  "fan_in": ["J"], "reducers": {"trail": "append", "seen": "append"}}');
SELECT status, error, state->'seen' AS seen, state->'items' AS items,
	   state->'trail' AS trail,
	   state ?| ARRAY['item', 'itemIndex', 'itemCount'] AS has_keys,
	   state->'j_saw' ?| ARRAY['item', 'itemIndex', 'itemCount'] AS fan_in_saw_keys,
	   state->'j_saw'->'seen' = state->'seen' AS fan_in_saw_all
  FROM dwarf.run('tr_each', '{"items": ["a", "b", "c"]}');
-- the for_each keys are dropped at the fan-in even when a branch wrote them
CREATE FUNCTION tr.each_rewrite(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('item', upper(s->>'item'), 'itemIndex', 99,
							  'up', upper(s->>'item'))
$$;
SELECT dwarf.define('tr_each_rewrite', '{"tasks": {"A": "tr.a", "W": "tr.each_rewrite", "J": "tr.j"},
  "transitions": [
    {"from": "A", "to": "W", "for_each": "items"},
    {"from": "W", "to": "J"}],
  "fan_in": ["J"], "reducers": {"up": "append"}}');
SELECT status, state->'up' AS up, state->'items' AS items,
	   state ?| ARRAY['item', 'itemIndex', 'itemCount'] AS has_keys,
	   state->'j_saw' ?| ARRAY['item', 'itemIndex', 'itemCount'] AS fan_in_saw_keys
  FROM dwarf.run('tr_each_rewrite', '{"items": ["a", "b"]}');
-- "as" names the element, and <as>Index / <as>Count follow it
CREATE FUNCTION tr.each_as(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('seen', jsonb_build_array(jsonb_build_array(s->'order', s->'orderIndex', s->'orderCount')),
							  'has_item', s ? 'item')
$$;
SELECT dwarf.define('tr_each_as', '{"tasks": {"A": "tr.a", "W": "tr.each_as", "J": "tr.j"},
  "transitions": [
    {"from": "A", "to": "W", "for_each": "orders", "as": "order"},
    {"from": "W", "to": "J"}],
  "fan_in": ["J"], "reducers": {"seen": "append"}}');
SELECT status, state->'seen' AS seen, state->'has_item' AS has_item,
	   state->'orders' AS orders, state ?| ARRAY['order', 'orderIndex', 'orderCount'] AS has_keys
  FROM dwarf.run('tr_each_as', '{"orders": [{"id": 1}, {"id": 2}]}');
-- an empty for_each converging on a fan-in goes straight to it
SELECT status, state->'trail' AS trail, state->'seen' AS seen, state->'items' AS items
  FROM dwarf.run('tr_each', '{"items": []}');
SELECT h.task, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'tr_each' AND f.input = '{"items": []}' GROUP BY h.task ORDER BY h.task;
-- an empty for_each with no fan-in downstream: the flow completes
SELECT dwarf.define('tr_each_open', '{"tasks": {"A": "tr.a", "W": "tr.each", "B": "tr.b"},
  "transitions": [
    {"from": "A", "to": "W", "for_each": "items"},
    {"from": "W", "to": "B"}],
  "reducers": {"trail": "append", "seen": "append"}}');
SELECT status, state FROM dwarf.run('tr_each_open', '{"items": []}');
-- ... and a non-empty one: every branch ends, then the flow completes
SELECT status, state->'trail' AS trail, state->'seen' AS seen
  FROM dwarf.run('tr_each_open', '{"items": [1, 2]}');
-- a for_each field that is not an array fails the flow
SELECT status, error FROM dwarf.run('tr_each', '{"items": "abc"}');

-- goto: the task decides; without the call the goto edge is not taken
CREATE FUNCTION tr.jumper(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'jump')::boolean THEN
		PERFORM dwarf.goto(s->>'target');
	END IF;
	RETURN '{"trail": "Jumper"}';
END $$;
SELECT dwarf.define('tr_goto', '{"tasks": {"Jumper": "tr.jumper", "B": "tr.b", "X": "tr.x"},
  "transitions": [
    {"from": "Jumper", "to": "B"},
    {"from": "Jumper", "to": "X", "goto": true}],
  "reducers": {"trail": "append"}}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_goto', '{"jump": true, "target": "X"}');
SELECT status, state->'trail' AS trail FROM dwarf.run('tr_goto', '{"jump": false}');
-- goto to a task without a goto edge fails the step
SELECT status, error FROM dwarf.run('tr_goto', '{"jump": true, "target": "B"}');
-- goto may loop back
CREATE FUNCTION tr.again(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF coalesce((s->>'n')::int, 0) < 2 THEN
		PERFORM dwarf.goto('Count');
	END IF;
	RETURN '{"trail": "Again"}';
END $$;
CREATE FUNCTION tr.count(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1, 'trail', 'Count') $$;
SELECT dwarf.define('tr_goto_loop', '{"entry": "Count", "tasks": {"Count": "tr.count", "Again": "tr.again"},
  "transitions": [
    {"from": "Count", "to": "Again"},
    {"from": "Again", "to": "Count", "goto": true}],
  "reducers": {"trail": "append"}}');
SELECT status, state FROM dwarf.run('tr_goto_loop', '{}');

-- state merge: a returned key replaces, JSON null removes, other keys stay
CREATE FUNCTION tr.merge(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT '{"drop": null, "change": 4, "new": {"deep": [1]}, "absent": null}'::jsonb $$;
SELECT dwarf.define('tr_merge', '{"tasks": {"M": "tr.merge"}}');
SELECT status, state FROM dwarf.run('tr_merge', '{"keep": 1, "drop": 2, "change": 3}');
-- a task returning NULL (or an empty object) changes nothing
CREATE FUNCTION tr.nothing(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION tr.empty(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
SELECT dwarf.define('tr_null', '{"tasks": {"N": "tr.nothing", "E": "tr.empty"},
  "transitions": [{"from": "N", "to": "E"}]}');
SELECT status, state FROM dwarf.run('tr_null', '{"keep": [1, 2]}');
SELECT h.task, h.status, h.changes FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'tr_null' ORDER BY h.step_id;
-- a task returning a JSON value that is not an object fails its step
CREATE FUNCTION tr.scalar(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '42'::jsonb $$;
CREATE FUNCTION tr.array(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '[1, 2]'::jsonb $$;
CREATE FUNCTION tr.json_null(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT 'null'::jsonb $$;
SELECT dwarf.define('tr_scalar', '{"tasks": {"S": "tr.scalar"}}');
SELECT dwarf.define('tr_array', '{"tasks": {"S": "tr.array"}}');
SELECT dwarf.define('tr_json_null', '{"tasks": {"S": "tr.json_null"}}');
SELECT status, error, state FROM dwarf.run('tr_scalar', '{"keep": 1}');
SELECT status, error, state FROM dwarf.run('tr_array', '{"keep": 1}');
SELECT status, error, state FROM dwarf.run('tr_json_null', '{"keep": 1}');
SELECT h.task, h.status, h.error FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'tr_array' ORDER BY h.step_id;

DROP SCHEMA tr CASCADE;
