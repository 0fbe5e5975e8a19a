--
-- reducers: every reducer at a fan-in (branches folded in element order)
-- and in a chain (each task writes a delta), null ignored for a reduced
-- field, type mismatches fail the flow, and dwarf_internal.fold_changes directly.
--
\set VERBOSITY terse
CREATE SCHEMA rd;

-- At a fan-in: each for_each branch returns its element as its changes.
CREATE FUNCTION rd.split(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION rd.branch(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF (s->>'itemIndex')::int = 0 THEN
		PERFORM pg_sleep(0.3);	-- the first branch finishes last
	END IF;
	RETURN s->'item';
END $$;
CREATE FUNCTION rd.join(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"joined": true}'::jsonb $$;
SELECT dwarf.define('rd_fan_in', '{
  "tasks": {"Split": "rd.split", "Branch": "rd.branch", "Join": "rd.join"},
  "transitions": [
    {"from": "Split", "to": "Branch", "for_each": "items"},
    {"from": "Branch", "to": "Join"}],
  "fan_in": ["Join"],
  "reducers": {"rep": "replace", "app": "append", "add": "add", "min": "min", "max": "max",
               "uni": "union", "mrg": "merge", "and": "and", "or": "or", "cat": "concat",
               "app2": "append", "uni2": "union", "smin": "min", "smax": "max",
               "cata": "concat", "nul": "add"}}');
CREATE TABLE rd.fan_in AS
SELECT * FROM dwarf.run('rd_fan_in', '{
  "rep": "init", "app": [0], "add": 10, "min": 4, "max": 8, "uni": [1], "mrg": {"z": 0},
  "and": true, "or": false, "cat": "<", "cata": [0],
  "items": [
    {"rep": "first", "app": 1, "add": 1, "min": 5, "max": 5, "uni": [1, 2],
     "mrg": {"a": 1, "b": 1}, "and": true, "or": false, "cat": "x",
     "app2": 1, "uni2": [1, 1], "smin": "b", "smax": "b", "cata": [1], "nul": 1},
    {"rep": "second", "app": [2], "add": 2.5, "min": 3, "max": 9, "uni": [2, 3],
     "mrg": {"b": 2, "c": 2}, "and": true, "or": true, "cat": "y",
     "app2": 2, "uni2": [2, 1], "smin": "a", "smax": "c", "cata": [2, 3], "nul": null},
    {"rep": "third", "app": "three", "add": -1, "min": 4, "max": 7, "uni": 4,
     "mrg": {"d": 3}, "and": false, "or": false, "cat": "z",
     "app2": 3, "uni2": [3], "smin": "c", "smax": "a", "cata": [], "nul": 2}]}');
SELECT status, error, state->'joined' AS joined FROM rd.fan_in;
SELECT key, value FROM rd.fan_in, jsonb_each(state) WHERE key NOT IN ('items', 'joined') ORDER BY key;

-- In a chain: each task writes a delta to the reduced fields; null is
-- ignored for a reduced field and removes a field without a reducer.
CREATE FUNCTION rd.d1(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT
 '{"rep": "a", "app": "a", "add": 1, "min": 5, "max": 5, "uni": ["a"], "mrg": {"a": 1},
   "and": true, "or": false, "cat": "a", "plain": 1}'::jsonb $$;
CREATE FUNCTION rd.d2(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT
 '{"rep": "b", "app": "b", "add": 2, "min": 3, "max": 9, "uni": ["a", "b"], "mrg": {"b": 2},
   "and": false, "or": true, "cat": "b"}'::jsonb $$;
CREATE FUNCTION rd.d3(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT
 '{"app": null, "add": null, "min": null, "max": null, "uni": null, "mrg": null,
   "and": null, "or": null, "cat": null, "plain": null}'::jsonb $$;
CREATE FUNCTION rd.d4(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT
 '{"app": ["c"], "add": 0.5, "min": 4, "max": 1, "uni": "c", "mrg": {"a": 9},
   "and": true, "or": false, "cat": "c"}'::jsonb $$;
SELECT dwarf.define('rd_chain', '{
  "tasks": {"D1": "rd.d1", "D2": "rd.d2", "D3": "rd.d3", "D4": "rd.d4"},
  "transitions": [{"chain": ["D1", "D2", "D3", "D4", "END"]}],
  "reducers": {"rep": "replace", "app": "append", "add": "add", "min": "min", "max": "max",
               "uni": "union", "mrg": "merge", "and": "and", "or": "or", "cat": "concat"}}');
CREATE TABLE rd.chain AS SELECT * FROM dwarf.run('rd_chain', '{"add": 100}');
SELECT status, error FROM rd.chain;
SELECT key, value FROM rd.chain, jsonb_each(state) ORDER BY key;
-- each step's changes are its delta, not the reduced value
SELECT h.task, h.changes->'add' AS add, h.changes->'app' AS app
  FROM rd.chain c, LATERAL dwarf.history(c.flow_id) h ORDER BY h.step_id;

-- A type mismatch fails the flow with a clear error: in a chain ...
CREATE FUNCTION rd.ten(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"total": "ten"}'::jsonb $$;
SELECT dwarf.define('rd_bad_chain', '{"tasks": {"T": "rd.ten"}, "reducers": {"total": "add"}}');
SELECT status, error, state FROM dwarf.run('rd_bad_chain', '{"total": 1}');
SELECT h.task, h.status, h.error FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h WHERE g.name = 'rd_bad_chain';
-- the same mismatch at a fan-in is in type_mismatch_at_fan_in.sql, which
-- runs last: it used to crash the server
-- dwarf_internal.fold_changes: the input with each change merged in order
SELECT dwarf_internal.fold_changes('{"n": 1, "keep": true}',
						  ARRAY['{"n": 2, "list": "a"}', '{"n": 3, "list": "b"}', '{"keep": null}']::jsonb[],
						  '{"n": "add", "list": "append"}');
SELECT dwarf_internal.fold_changes('{"n": 1}', ARRAY['{"n": 2}', '{"n": 3}']::jsonb[], NULL);
SELECT dwarf_internal.fold_changes('{"n": 1}', ARRAY[]::jsonb[], '{"n": "add"}');
SELECT dwarf_internal.fold_changes('{"n": 1}', NULL, '{"n": "add"}');
SELECT dwarf_internal.fold_changes(NULL, ARRAY['{"n": 2}']::jsonb[], '{}');
-- NULL changes (a step that returned nothing) are skipped
SELECT dwarf_internal.fold_changes('{"n": 1}', ARRAY[NULL, '{"n": 2}']::jsonb[], '{"n": "add"}');
SELECT dwarf_internal.fold_changes('[1]', ARRAY['{"n": 2}']::jsonb[], '{}');
SELECT dwarf_internal.fold_changes('{}', ARRAY['{"n": 2}']::jsonb[], '[]');
SELECT dwarf_internal.fold_changes('{}', ARRAY['{"n": 2}']::jsonb[], '{"n": "sum"}');

-- every reducer on one old value (NULL: the field is absent) and one change
CREATE FUNCTION rd.fold(reducer text, old jsonb, change jsonb) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	RETURN dwarf_internal.fold_changes(CASE WHEN old IS NULL THEN '{}' ELSE jsonb_build_object('f', old) END,
							  ARRAY[jsonb_build_object('f', change)],
							  jsonb_build_object('f', reducer))->'f';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SELECT r AS reducer, old, change, rd.fold(r, old::jsonb, change::jsonb) AS result FROM (VALUES
	('replace', '1', '"x"'), ('replace', '1', 'null'), ('replace', NULL, '[1]'),
	('append', '[1]', '2'), ('append', '[1]', '[2]'), ('append', NULL, '2'), ('append', '1', '2'),
	('append', '[1]', 'null'),
	('add', '1', '2.5'), ('add', NULL, '2'), ('add', '1', 'null'), ('add', '1', '"ten"'),
	('add', '"one"', '1'), ('add', 'true', '1'),
	('min', '2', '1'), ('min', '1', '2'), ('min', '"b"', '"a"'), ('min', NULL, '3'),
	('min', '1', '"a"'), ('min', 'true', 'false'),
	('max', '2', '1'), ('max', '"b"', '"c"'), ('max', '1', 'null'), ('max', '{}', '{}'),
	('union', '[1, 2]', '[2, 3]'), ('union', '[1]', '1'), ('union', NULL, '[1, 1]'),
	('union', '[{"a": 1}]', '[{"a": 1}, {"a": 2}]'), ('union', '"a"', '[1]'),
	('merge', '{"a": 1, "b": 1}', '{"b": 2}'), ('merge', NULL, '{"a": 1}'),
	('merge', '{"a": 1}', '[1]'), ('merge', '[1]', '{"a": 1}'),
	('and', 'true', 'false'), ('and', 'true', 'true'), ('and', NULL, 'false'), ('and', 'true', '1'),
	('or', 'false', 'true'), ('or', 'false', 'false'), ('or', '"yes"', 'true'),
	('concat', '"ab"', '"cd"'), ('concat', '[1]', '[2, 3]'), ('concat', '[1]', '"a"'),
	('concat', NULL, '"a"'), ('concat', '"a"', '1'), ('concat', '"a"', '[1]')
) v(r, old, change);
-- the first value of a reduced field (nothing to combine it with yet) must
-- still be of a type the reducer takes
SELECT r AS reducer, change, split_part(rd.fold(r, NULL, change::jsonb), ':', 1) AS sqlstate,
	   rd.fold(r, NULL, change::jsonb) LIKE '%reducer "' || r || '" of field "f"%' AS names_reducer_and_field
  FROM (VALUES
	('add', '"ten"'), ('and', '1'), ('or', '"yes"'), ('merge', '[1]'),
	('min', '{"a": 1}'), ('max', 'true'), ('concat', '1')
) v(r, change);

DROP SCHEMA rd CASCADE;
