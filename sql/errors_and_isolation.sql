--
-- errors_and_isolation: a failing task fails its flow and its SQL writes are
-- rolled back; on_error handlers; failures inside a fan-out; failing flows do
-- not hurt flows running beside them; a task's own writes happen exactly once.
--
\set VERBOSITY terse
CREATE SCHEMA ei;
CREATE TABLE ei.log (task text, n int);

-- A task that writes, then raises.
CREATE FUNCTION ei.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.log VALUES ('boom', (s->>'n')::int);
	RAISE EXCEPTION 'boom on %', s->>'n'
		USING ERRCODE = 'check_violation', DETAIL = 'some detail', HINT = 'some hint';
END $$;

-- A handler: reports what it found in onErr, and writes a row of its own.
CREATE FUNCTION ei.handler(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.log VALUES ('handler', (s->>'n')::int);
	RETURN jsonb_build_object('handled', true,
		'seen', jsonb_build_object('message', s->'onErr'->'message',
								   'sqlstate', s->'onErr'->'sqlstate',
								   'task', s->'onErr'->'task',
								   'detail', s->'onErr'->'detail',
								   'hint', s->'onErr'->'hint'));
END $$;

-- 1. No handler: the flow fails with the message, the write is rolled back.
SELECT dwarf.define('ei_fail', '{"tasks": {"A": "ei.boom"}}');
SELECT flow_id IS NOT NULL AS has_id, status, error, state, interrupt_payload, cancel_reason
  FROM dwarf.run('ei_fail', '{"n": 1}');
SELECT count(*) AS rows_left FROM ei.log;
SELECT h.task, h.status, h.attempt, h.error, h.changes
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'ei_fail';
SELECT f.status, f.error, f.finished_at >= f.created_at AS finished
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE g.name = 'ei_fail';

-- 2. An on_error edge: the handler runs and finds the error in onErr; the
--    failing task's write is rolled back, the handler's is kept.
SELECT dwarf.define('ei_handled', '{
  "tasks": {"A": "ei.boom", "H": "ei.handler"},
  "transitions": [{"from": "A", "to": "H", "on_error": true}]}');
SELECT status, error, state->'handled' AS handled, state->'seen' AS seen,
	   state->'onErr'->>'message' AS on_err_message
  FROM dwarf.run('ei_handled', '{"n": 2}');
SELECT * FROM ei.log ORDER BY task, n;
SELECT h.task, h.status, h.attempt, h.error
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'ei_handled' ORDER BY h.step_id;
TRUNCATE ei.log;

-- 3. Inside a for_each fan-out only the failing branch takes the handler
--    path; the cohort converges at the fan-in as usual.
CREATE FUNCTION ei.split(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT '{"items": [1, 2, 3]}'::jsonb $$;
CREATE FUNCTION ei.work(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.log VALUES ('work', (s->>'item')::int);
	IF (s->>'item')::int = 2 THEN
		RAISE EXCEPTION 'item % is bad', s->>'item';
	END IF;
	RETURN jsonb_build_object('done', (s->>'item')::int * 10);
END $$;
CREATE FUNCTION ei.fix(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.log VALUES ('fix', (s->>'item')::int);
	RETURN jsonb_build_object('done', 'fixed ' || (s->>'item') || ': ' || (s->'onErr'->>'message'));
END $$;
CREATE FUNCTION ei.join(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.log VALUES ('join', jsonb_array_length(s->'done'));
	RETURN jsonb_build_object('joined', s->'done');
END $$;
SELECT dwarf.define('ei_fanout_handled', '{
  "tasks": {"Split": "ei.split", "Work": "ei.work", "Fix": "ei.fix", "Join": "ei.join"},
  "transitions": [
    {"from": "Split", "to": "Work", "for_each": "items"},
    {"from": "Work", "to": "Join"},
    {"from": "Work", "to": "Fix", "on_error": true},
    {"from": "Fix", "to": "Join"}],
  "fan_in": ["Join"],
  "reducers": {"done": "append"}}');
SELECT status, error, state->'done' AS done, state->'joined' AS joined,
	   state ? 'item' AS has_item, state->'items' AS items
  FROM dwarf.run('ei_fanout_handled', '{}');
SELECT task, n FROM ei.log ORDER BY task, n;
SELECT h.task, h.status, count(*)
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL dwarf.history(f.id) h
 WHERE g.name = 'ei_fanout_handled' GROUP BY 1, 2 ORDER BY 1, 2;
TRUNCATE ei.log;

-- 4. Without a handler in a fan-out the flow fails and the fan-in never runs.
SELECT dwarf.define('ei_fanout_failed', '{
  "tasks": {"Split": "ei.split", "Work": "ei.work", "Join": "ei.join"},
  "transitions": [
    {"from": "Split", "to": "Work", "for_each": "items"},
    {"from": "Work", "to": "Join"}],
  "fan_in": ["Join"],
  "reducers": {"done": "append"}}');
SELECT status, error FROM dwarf.run('ei_fanout_failed', '{}');
SELECT count(*) AS join_steps
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Join') s
 WHERE g.name = 'ei_fanout_failed';
SELECT count(*) AS failed_work_steps
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id,
	   LATERAL (SELECT * FROM dwarf.history(f.id) WHERE task = 'Work') s
 WHERE g.name = 'ei_fanout_failed' AND s.status = 'failed';
SELECT count(*) FILTER (WHERE task = 'join') AS join_rows,
	   count(*) FILTER (WHERE task = 'work' AND n = 2) AS bad_item_rows
  FROM ei.log;

-- 5. A failing flow does not hurt flows that run at the same time: 20 flows
--    created in one transaction, every 4th fails in its first task.
CREATE TABLE ei.mixlog (task text, n int);
CREATE FUNCTION ei.mix_a(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.mixlog VALUES ('A', (s->>'n')::int);
	IF (s->>'n')::int % 4 = 0 THEN
		RAISE EXCEPTION 'flow % fails', s->>'n';
	END IF;
	RETURN jsonb_build_object('a', (s->>'n')::int);
END $$;
CREATE FUNCTION ei.mix_b(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.mixlog VALUES ('B', (s->>'n')::int);
	RETURN jsonb_build_object('b', (s->>'a')::int * 2);
END $$;
SELECT dwarf.define('ei_mix', '{"tasks": {"A": "ei.mix_a", "B": "ei.mix_b"},
  "transitions": [{"chain": ["A", "B", "END"]}]}');
CREATE TABLE ei.ids (n int, id bigint);
BEGIN;
INSERT INTO ei.ids SELECT n, dwarf.create('ei_mix', jsonb_build_object('n', n))
  FROM generate_series(1, 20) n;
COMMIT;
SELECT o.status, count(*) FROM ei.ids i, LATERAL dwarf.await(i.id, '30 s') o
 GROUP BY o.status ORDER BY o.status;
SELECT i.n, f.error FROM ei.ids i JOIN dwarf.flow f ON f.id = i.id
 WHERE f.status = 'failed' ORDER BY i.n;
SELECT count(*) AS completed_with_right_state FROM ei.ids i JOIN dwarf.flow f ON f.id = i.id
 WHERE f.status = 'completed' AND f.state = jsonb_build_object('n', i.n, 'a', i.n, 'b', 2 * i.n);
SELECT task, count(*) AS rows, count(DISTINCT n) AS flows,
	   bool_and(n % 4 <> 0) AS no_failed_flow_rows
  FROM ei.mixlog GROUP BY task ORDER BY task;

-- 6. Exactly-once writes: each flow inserts one row keyed by its own id
--    (unique), so a step that ran twice would fail its flow.
CREATE TABLE ei.once (flow_id bigint UNIQUE, n int);
CREATE FUNCTION ei.once(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ei.once VALUES (dwarf.flow_id(), (s->>'n')::int);
	RETURN jsonb_build_object('wrote', true);
END $$;
SELECT dwarf.define('ei_once', '{"tasks": {"W": "ei.once"}}');
CREATE TABLE ei.once_ids (n int, id bigint);
BEGIN;
INSERT INTO ei.once_ids SELECT n, dwarf.create('ei_once', jsonb_build_object('n', n))
  FROM generate_series(1, 25) n;
COMMIT;
SELECT o.status, count(*) FROM ei.once_ids i, LATERAL dwarf.await(i.id, '30 s') o
 GROUP BY o.status ORDER BY o.status;
SELECT count(*) AS rows, count(DISTINCT o.flow_id) AS flows,
	   count(*) FILTER (WHERE o.n = i.n) AS matching
  FROM ei.once o JOIN ei.once_ids i ON i.id = o.flow_id;
SELECT count(*) AS total_rows FROM ei.once;

DROP SCHEMA ei CASCADE;
