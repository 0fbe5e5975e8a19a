--
-- altered_tables: the workers write dwarf's rows by column name, so a
-- column an administrator adds to dwarf.step_log or dwarf.flow gets its
-- default and a dropped one is skipped.  An error outside any task (here a
-- CHECK constraint on dwarf.step_log that one step breaks) makes the worker
-- back off, not restart for ever, and fails only the flow whose step it is.
--
\set VERBOSITY terse
CREATE SCHEMA alt;
CREATE FUNCTION alt.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"ok": true}'::jsonb $$;
CREATE FUNCTION alt.poison(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"poison": true}'::jsonb $$;
SELECT dwarf.define('alt_two', '{"tasks": {"A": "alt.noop", "B": "alt.noop"},
  "transitions": [{"chain": ["A", "B"]}]}');
SELECT dwarf.define('alt_poison', '{"tasks": {"A": "alt.noop", "P": "alt.poison"},
  "transitions": [{"chain": ["A", "P"]}]}');

-- Added columns get their defaults, in rows dwarf.run and dwarf.create made.
ALTER TABLE dwarf.step_log ADD COLUMN extra int DEFAULT 7;
ALTER TABLE dwarf.flow ADD COLUMN note text DEFAULT 'noted';
CREATE TABLE alt.runs AS SELECT * FROM dwarf.run('alt_two', '{}', timeout => '60 s');
CREATE TABLE alt.created AS SELECT dwarf.create('alt_two', '{}') AS id;
INSERT INTO alt.runs SELECT o.* FROM alt.created c, LATERAL dwarf.await(c.id, '60 s') o;
SELECT status, count(*) FROM alt.runs GROUP BY 1;
SELECT DISTINCT s.extra FROM dwarf.step_log s JOIN alt.runs r USING (flow_id);
SELECT DISTINCT f.note FROM dwarf.flow f JOIN alt.runs r ON r.flow_id = f.id;

-- Dropped, they are skipped.
ALTER TABLE dwarf.step_log DROP COLUMN extra;
ALTER TABLE dwarf.flow DROP COLUMN note;
SELECT status, jsonb_path_query_array(state, '$.ok') AS ok
  FROM dwarf.run('alt_two', '{}', timeout => '60 s');

-- A constraint added to dwarf.flow holds for the rows dwarf.create and the
-- workers write, though both read the table's definition before it came
-- (they keep it until the table changes); dropped, it no longer holds.
ALTER TABLE dwarf.flow ADD CONSTRAINT alt_no_slow CHECK (NOT input ? 'slow');
SELECT dwarf.create('alt_two', '{"slow": true}') IS NOT NULL AS created;
SELECT status FROM dwarf.run('alt_two', '{"slow": true}', timeout => '60 s');
ALTER TABLE dwarf.flow DROP CONSTRAINT alt_no_slow;
SELECT status FROM dwarf.run('alt_two', '{"slow": true}', timeout => '60 s');

-- One step breaks a constraint: its flow fails with an error that says
-- so, once other steps have been recorded meanwhile; the others run.
ALTER TABLE dwarf.step_log ADD CONSTRAINT alt_no_poison
	CHECK (changes IS NULL OR changes::text NOT LIKE '%poison%');
CREATE TABLE alt.poisoned AS SELECT dwarf.create('alt_poison', '{}') AS id;
DO $$
DECLARE
	i int := 0;
BEGIN
	WHILE (SELECT status FROM dwarf.flow WHERE id = (SELECT id FROM alt.poisoned)) = 'running'
		  AND i < 600 LOOP
		IF (SELECT status FROM dwarf.run('alt_two', '{}', timeout => '60 s')) <> 'completed' THEN
			RAISE EXCEPTION 'a flow without poison did not complete';
		END IF;
		PERFORM pg_sleep(0.05);
		i := i + 1;
	END LOOP;
END $$;
SELECT f.status, f.error LIKE 'dwarf could not record the step of task "P"%alt_no_poison%' AS says_why
  FROM dwarf.flow f WHERE id = (SELECT id FROM alt.poisoned);
SELECT h.task, h.status FROM alt.poisoned p, LATERAL dwarf.history(p.id) h ORDER BY h.step_id;
ALTER TABLE dwarf.step_log DROP CONSTRAINT alt_no_poison;
SELECT status FROM dwarf.run('alt_poison', '{}', timeout => '60 s');

DROP SCHEMA alt CASCADE;
