--
-- server_errors: an error of the server rather than of the task (a full
-- disk, memory or connections run short: class 53; an I/O error) fails no
-- flow.  The step's writes roll back, nothing is recorded, and the step runs
-- again after a backoff for as long as the trouble lasts.  The task's own
-- errors still fail it, or take its on_error edge.
--
\set VERBOSITY terse
CREATE SCHEMA se;
CREATE SEQUENCE se.tries;
CREATE TABLE se.log (flow_id bigint, try bigint);
-- Raises "disk full" on its first two tries (the sequence is not rolled
-- back with them), writing a row each time; then succeeds.
CREATE FUNCTION se.disk_full(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	try bigint := nextval('se.tries');
BEGIN
	INSERT INTO se.log VALUES (dwarf.flow_id(), try);
	IF try <= 2 THEN
		RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
	END IF;
	RETURN jsonb_build_object('tries', try);
END $$;
CREATE FUNCTION se.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION se.handler(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"handled": true}'::jsonb $$;
CREATE FUNCTION se.own_error(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the task''s own error' USING ERRCODE = '22023'; END $$;

SELECT dwarf.define('se_disk', '{"tasks": {"A": "se.noop", "B": "se.disk_full", "C": "se.noop",
  "H": "se.handler"}, "transitions": [{"chain": ["A", "B", "C"]},
  {"from": "B", "to": "H", "on_error": true}]}');
SELECT dwarf.define('se_own', '{"tasks": {"A": "se.own_error"}}');

-- The flow completes: B ran three times, only the third counted, and the
-- handler never ran.
CREATE TABLE se.runs AS SELECT * FROM dwarf.run('se_disk', '{}', timeout => '60 s');
SELECT status, state->'tries' AS tries, state ? 'handled' AS handled, error FROM se.runs;
SELECT h.task, h.status, h.attempt FROM se.runs r, LATERAL dwarf.history(r.flow_id) h ORDER BY h.step_id;
-- Only the successful try's write stayed.
SELECT try FROM se.log WHERE flow_id = (SELECT flow_id FROM se.runs);

-- A task's own error still fails its flow.
SELECT status, error FROM dwarf.run('se_own', '{}', timeout => '60 s');

DROP SCHEMA se CASCADE;
