--
-- external_definitions: how a graph writes an external task, and what
-- dwarf.define refuses of it; and the SQL functions of outside workers on
-- leases that do not exist.  (The steps themselves, claimed and answered,
-- are t/180_external_tasks.pl.)
--
\set VERBOSITY terse
CREATE SCHEMA ed;
CREATE FUNCTION ed.f(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
-- Runs a statement; returns 'ok' or its error.
CREATE FUNCTION ed.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Accepted: the stored definition keeps each task's object, its function
-- schema-qualified.
SELECT dwarf.define('ed_ok', '{"tasks": {"A": {"function": "f", "retry": {"attempts": 2}},
  "B": {"external": "llm", "lease": "2 min", "retry": {"attempts": 3, "initial": "5 s"}},
  "C": "ed.f"}, "transitions": [{"chain": ["A", "B", "C", "END"]}]}')
  FROM (SELECT set_config('search_path', 'ed, public', false)) s;
RESET search_path;
SELECT definition->'tasks' AS tasks FROM dwarf.graph WHERE name = 'ed_ok';

-- Refused, each with an error that names the task and the key.
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"function": "ed.f", "external": "q"}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": ""}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": 7}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": "q", "lease": "0 s"}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": "q", "lease": "soon"}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"function": "ed.f", "lease": "1 min"}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": "q", "time_budget": "1 min"}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": "q", "queue": "r"}}}')$$);
SELECT ed.try($$SELECT dwarf.define('ed_bad', '{"tasks": {"A": {"external": "q", "retry": {"tries": 2}}}}')$$);
SELECT count(*) AS bad_graphs_defined FROM dwarf.graph WHERE name = 'ed_bad';

-- The outside workers' functions, on what does not exist or is out of range.
SELECT ed.try($$SELECT dwarf.complete(12345, '{}')$$);
SELECT ed.try($$SELECT dwarf.fail(12345, 'boom')$$);
SELECT ed.try($$SELECT dwarf.extend(12345, '1 min')$$);
SELECT ed.try($$SELECT dwarf.complete(NULL, '{}')$$);
SELECT ed.try($$SELECT dwarf.extend(12345, '0 s')$$);
SELECT ed.try($$SELECT * FROM dwarf.claim('llm', 0)$$);
SELECT ed.try($$SELECT * FROM dwarf.claim('llm', 1, '0 s')$$);
SELECT ed.try($$SELECT * FROM dwarf.claim('llm', 1, NULL, '2 hours')$$);
SELECT ed.try($$SELECT * FROM dwarf.claim(NULL)$$);
-- nothing waits on a queue no flow uses
SELECT count(*) AS claimed FROM dwarf.claim('nobody', 10, NULL, '10 ms');
SELECT count(*) AS waiting FROM dwarf.external_steps('nobody');
