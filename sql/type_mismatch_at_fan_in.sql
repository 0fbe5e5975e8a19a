--
-- type_mismatch_at_fan_in: a reducer type mismatch found while folding the
-- branches at a fan-in fails the flow with a clear error, the fan-in never
-- runs, and the server goes on working.  (Kept in a file of its own that
-- runs last: it once crashed the worker, and the server with it, in a loop.)
--
\set VERBOSITY terse
CREATE SCHEMA tm;
CREATE FUNCTION tm.none(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION tm.branch(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT s->'item' $$;
CREATE FUNCTION tm.join(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"joined": true}'::jsonb $$;
SELECT dwarf.define('tm_fan_in', '{
  "tasks": {"Split": "tm.none", "Branch": "tm.branch", "Join": "tm.join"},
  "transitions": [
    {"from": "Split", "to": "Branch", "for_each": "items"},
    {"from": "Branch", "to": "Join"}],
  "fan_in": ["Join"],
  "reducers": {"flag": "and", "low": "min"}}');
-- the branches agree: fine
SELECT status, error, state->'flag' AS flag, state->'joined' AS joined
  FROM dwarf.run('tm_fan_in', '{"items": [{"flag": true}, {"flag": false}]}');
-- "and" cannot take a number: the branch that wrote it fails
SELECT status, error, state->'joined' AS joined
  FROM dwarf.run('tm_fan_in', '{"items": [{"flag": true}, {"flag": 1}]}');
-- each branch's value suits "min", but a number and a string cannot be
-- compared: the fold at the fan-in fails the flow
SELECT status, error, state->'joined' AS joined
  FROM dwarf.run('tm_fan_in', '{"items": [{"low": 1}, {"low": "x"}]}');
SELECT count(*) AS join_steps FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Join') h WHERE g.name = 'tm_fan_in' AND f.status = 'failed';
-- the server and its workers go on
SELECT status, error, state->'flag' AS flag
  FROM dwarf.run('tm_fan_in', '{"items": [{"flag": true}, {"flag": true}]}');
DROP SCHEMA tm CASCADE;
