--
-- define_graphs: versions, validation (entry filled in, functions
-- schema-qualified), running flows keep their version, and every kind of
-- rejected definition with its error.
--
\set VERBOSITY terse
CREATE SCHEMA dg;
CREATE FUNCTION dg.a(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"a": 1}'::jsonb $$;
CREATE FUNCTION dg.b(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"b": 1}'::jsonb $$;
CREATE FUNCTION dg.takes_int(n int) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION dg.returns_text(s jsonb) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;

-- Versions: 1, then 2.
SELECT dwarf.define('dg_versions', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define('dg_versions', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B"}]}');
SELECT version, definition->>'entry' AS entry, definition->'tasks' AS tasks
  FROM dwarf.graph WHERE name = 'dg_versions' ORDER BY version;
SELECT status, state FROM dwarf.run('dg_versions', '{}');

-- validate: fills in the entry and schema-qualifies the functions found
-- through the search_path; what it returns is what define stores.
SET search_path = dg, public;
SELECT dwarf.validate('{"tasks": {"A": "a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B"}]}');
SELECT dwarf.validate('{"entry": "B", "tasks": {"A": "a", "B": "b"},
  "transitions": [{"from": "B", "to": "A"}]}')->'entry' AS named_entry;
SELECT dwarf.define('dg_qualified', '{"tasks": {"A": "a"}}');
RESET search_path;
SELECT definition FROM dwarf.graph WHERE name = 'dg_qualified';
-- ... so a caller with another search_path runs the same functions.
SELECT status, state FROM dwarf.run('dg_qualified', '{}');

-- A running flow keeps the version it started with.
CREATE FUNCTION dg.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(1);
	RETURN '{"slow": true}';
END $$;
CREATE FUNCTION dg.v1(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"ran": "v1"}'::jsonb $$;
CREATE FUNCTION dg.v2(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"ran": "v2"}'::jsonb $$;
SELECT dwarf.define('dg_keep', '{"tasks": {"Slow": "dg.slow", "Then": "dg.v1"},
  "transitions": [{"from": "Slow", "to": "Then"}]}');
CREATE TEMP TABLE keep (id bigint);
BEGIN;
INSERT INTO keep SELECT dwarf.create('dg_keep', '{}');
COMMIT;
SELECT dwarf.define('dg_keep', '{"tasks": {"Slow": "dg.slow", "Other": "dg.v2"},
  "transitions": [{"from": "Slow", "to": "Other"}]}');
SELECT o.status, o.state FROM keep, LATERAL dwarf.await(keep.id, '30 s') o;
SELECT s.version, s.status FROM keep, LATERAL dwarf.snapshot(keep.id) s;
SELECT h.task, h.status FROM keep, LATERAL dwarf.history(keep.id) h ORDER BY h.step_id;
-- A flow created now runs version 2.
SELECT status, state FROM dwarf.run('dg_keep', '{}');

-- A loop through a "when" edge is accepted, and runs until it is left.
-- (Count has an incoming edge from itself, so the entry must be named.)
CREATE FUNCTION dg.count(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1) $$;
SELECT dwarf.define('dg_loop', '{"entry": "Count", "tasks": {"Count": "dg.count", "Done": "dg.b"},
  "transitions": [
    {"from": "Count", "to": "Count", "when": "$.n < 3"},
    {"from": "Count", "to": "Done", "when": "$.n >= 3"}]}');
SELECT status, state FROM dwarf.run('dg_loop', '{}');
SELECT h.task, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'dg_loop' GROUP BY h.task ORDER BY h.task;
-- A loop through a goto edge is accepted too.
SELECT dwarf.define('dg_goto_loop', '{"entry": "A", "tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B"}, {"from": "B", "to": "A", "goto": true}]}');

-- Rejected definitions, each with its error.  None of them stores a version.
SELECT dwarf.define('dg_bad', '[]');
SELECT dwarf.define('dg_bad', '"tasks"');
SELECT dwarf.define('dg_bad', '{}');
SELECT dwarf.define('dg_bad', '{"tasks": {}}');
SELECT dwarf.define('dg_bad', '{"tasks": ["dg.a"]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a"}, "edges": []}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "weight": 2}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.nope"}}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "nope_schema.nope"}}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.takes_int"}}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.returns_text"}}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": 42}}');
-- dangling targets: in "to", in "from", in a "to" array, in a chain, in fan_in, entry
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a"},
  "transitions": [{"from": "A", "to": "Nowhere"}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a"},
  "transitions": [{"from": "Nowhere", "to": "A"}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": ["B", "Nowhere"]}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"chain": ["A", "B", "Nowhere"]}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a"}, "fan_in": ["Nowhere"]}');
SELECT dwarf.define('dg_bad', '{"entry": "Nowhere", "tasks": {"A": "dg.a"}}');
-- a chain that goes on after END, a transition without from/to
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"chain": ["A", "END", "B"]}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A"}]}');
-- unreachable task
SELECT dwarf.define('dg_bad', '{"entry": "A", "tasks": {"A": "dg.a", "B": "dg.b", "C": "dg.a"},
  "transitions": [{"from": "A", "to": "B"}, {"from": "C", "to": "B"}]}');
-- a cycle of unconditional edges
SELECT dwarf.define('dg_bad', '{"tasks": {"S": "dg.a", "A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "S", "to": "A"}, {"from": "A", "to": "B"}, {"from": "B", "to": "A"}]}');
SELECT dwarf.define('dg_bad', '{"entry": "A", "tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"chain": ["A", "B", "A"]}]}');
-- switch mixed with a plain edge from the same node
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b", "C": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "switch": "$.a == 1"}, {"from": "A", "to": "C"}]}');
-- bad path expressions
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "when": "$.a ==="}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "switch": "not a path ("}]}');
-- unknown reducer
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a"}, "reducers": {"total": "sum"}}');
-- END cannot name a task; nor can an empty name
SELECT dwarf.define('dg_bad', '{"tasks": {"END": "dg.a"}}');
SELECT dwarf.define('dg_bad', '{"tasks": {"": "dg.a"}}');
-- ambiguous entry: two tasks without incoming edges; none at all
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b", "C": "dg.b"},
  "transitions": [{"from": "A", "to": "C"}, {"from": "B", "to": "C"}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "when": "$.a == 1"}, {"from": "B", "to": "A", "when": "$.a == 1"}]}');
-- "as" without for_each; more than one kind on one edge
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "as": "x"}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "A", "to": "B", "when": "$.a == 1", "goto": true}]}');
-- a goto edge must name a task
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a"},
  "transitions": [{"from": "A", "to": "END", "goto": true}]}');
-- invalid graph names
SELECT dwarf.define('', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define(' leading space', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define('trailing space ', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define(E'tab\there', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define(E'new\nline', '{"tasks": {"A": "dg.a"}}');
-- any printable name up to 63 bytes is fine, as for a PostgreSQL identifier
SELECT dwarf.define('dg has space; semi', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define('dg_ünïcödé_日本語', '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define(repeat('é', 32), '{"tasks": {"A": "dg.a"}}');
SELECT dwarf.define(repeat('x', 64), '{"tasks": {"A": "dg.a"}}');
SELECT count(*) AS bad_versions FROM dwarf.graph WHERE name = 'dg_bad';
-- validate rejects the same way, without a name
SELECT dwarf.validate('{"tasks": {"A": "dg.a"}, "reducers": {"total": "sum"}}');

-- The error names the node or edge; the detail and hint say more.
\set VERBOSITY default
SELECT dwarf.define('dg_bad', '{"tasks": {"S": "dg.a", "A": "dg.a", "B": "dg.b"},
  "transitions": [{"from": "S", "to": "A"}, {"from": "A", "to": "B"}, {"from": "B", "to": "A"}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.a", "B": "dg.b", "C": "dg.b"},
  "transitions": [{"from": "A", "to": "C"}, {"from": "B", "to": "C"}]}');
SELECT dwarf.define('dg_bad', '{"tasks": {"A": "dg.takes_int"}}');
\set VERBOSITY terse

DROP SCHEMA dg CASCADE;
