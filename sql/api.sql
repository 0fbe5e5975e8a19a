--
-- api: create is transactional, await, run, idempotency keys, priority,
-- snapshot, history, step, cancel, purge, stats, bad input, and the control
-- functions outside a task.
--
\set VERBOSITY terse
CREATE SCHEMA api;
CREATE FUNCTION api.a(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"a": 1}'::jsonb $$;
CREATE FUNCTION api.b(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"b": 2}'::jsonb $$;
CREATE FUNCTION api.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(2);
	RETURN '{"slow": true}';
END $$;
CREATE FUNCTION api.boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'boom';
END $$;
SELECT dwarf.define('api_boom', '{"tasks": {"A": "api.boom"}}');
SELECT dwarf.define('api_quick', '{"tasks": {"A": "api.a", "B": "api.b"},
  "transitions": [{"from": "A", "to": "B"}]}');
SELECT dwarf.define('api_slow', '{"tasks": {"A": "api.a", "Slow": "api.slow", "B": "api.b"},
  "transitions": [{"chain": ["A", "Slow", "B", "END"]}]}');

-- Runs a statement; returns 'ok' or its error, with flow ids masked.
CREATE FUNCTION api.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'flow -?\d+', 'flow N', 'g');
END $$;
-- Waits (at most 30 s) until a step of the task has been recorded.
CREATE FUNCTION api.wait_for_step(flow bigint, task text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1 .. 600 LOOP
		IF EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = flow AND s.task = wait_for_step.task) THEN
			RETURN true;
		END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
	RETURN false;
END $$;

-- create is transactional: rolled back, there is no flow ...
BEGIN;
SELECT dwarf.create('api_quick', '{"tag": "rolled back"}') AS rb_id \gset
SELECT count(*) AS visible_inside FROM dwarf.flow WHERE id = :rb_id;
ROLLBACK;
SELECT count(*) AS after_rollback FROM dwarf.flow WHERE id = :rb_id;
SELECT api.try(format('SELECT dwarf.await(%s, %L)', :rb_id, '1 s'));
-- ... committed, it runs.
BEGIN;
SELECT dwarf.create('api_quick', '{"tag": "committed"}') AS c_id \gset
-- await in the transaction that created the flow is an error that says why
SELECT api.try(format('SELECT dwarf.await(%s, %L)', :c_id, '1 s'));
COMMIT;
SELECT flow_id = :c_id AS same_id, status, state, error FROM dwarf.await(:c_id, '30 s');

-- run works in autocommit ...
SELECT flow_id IS NOT NULL AS has_id, status, state, error, interrupt_payload, cancel_reason
  FROM dwarf.run('api_quick', '{"tag": "autocommit"}');
-- ... and in an explicit transaction, whose rollback does not undo the flow
BEGIN;
SELECT status, state FROM dwarf.run('api_quick', '{"tag": "explicit"}');
ROLLBACK;
SELECT count(*), min(status) AS status FROM dwarf.flow WHERE input->>'tag' = 'explicit';
-- a run can follow a create in the same transaction
BEGIN;
SELECT dwarf.create('api_quick', '{"tag": "mixed"}') AS m_id \gset
SELECT status FROM dwarf.run('api_quick', '{"tag": "mixed run"}');
COMMIT;
SELECT status FROM dwarf.await(:m_id, '30 s');

-- idempotency_key: a second create or run with the key returns the first flow
SELECT dwarf.create('api_quick', '{"n": 1}', idempotency_key => 'api-k1') AS k1 \gset
SELECT dwarf.create('api_quick', '{"n": 2}', idempotency_key => 'api-k1') = :k1 AS same_flow;
SELECT flow_id = :k1 AS same_flow, status, state FROM dwarf.run('api_quick', '{"n": 3}', idempotency_key => 'api-k1');
SELECT count(*), min(input::text) AS input FROM dwarf.flow WHERE idempotency_key = 'api-k1';
BEGIN;
SELECT dwarf.create('api_quick', '{}', idempotency_key => 'api-k2') AS k2 \gset
SELECT dwarf.create('api_quick', '{}', idempotency_key => 'api-k2') = :k2 AS same_in_one_transaction;
COMMIT;
SELECT flow_id AS k3 FROM dwarf.run('api_quick', '{}', idempotency_key => 'api-k3') \gset
SELECT flow_id = :k3 AS same_flow, status FROM dwarf.run('api_quick', '{}', idempotency_key => 'api-k3');
SELECT idempotency_key, count(*) FROM dwarf.flow WHERE idempotency_key LIKE 'api-k%'
 GROUP BY 1 ORDER BY 1;
SELECT status FROM dwarf.await(:k2, '30 s');

-- priority is accepted and kept
SELECT dwarf.create('api_quick', '{"tag": "prio"}', priority => 5) AS p_id \gset
SELECT status, state FROM dwarf.await(:p_id, '30 s');
SELECT status FROM dwarf.run('api_quick', '{"tag": "prio run"}', priority => -3);
SELECT input->>'tag' AS tag, priority FROM dwarf.flow WHERE input->>'tag' LIKE 'prio%' ORDER BY 1;

-- dwarf.run in REPEATABLE READ reports what the flow came to
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) > 0 AS snapshot_taken FROM dwarf.flow;
SELECT status, state->>'tag' AS tag FROM dwarf.run('api_quick', '{"tag": "rr"}');
SELECT status, error FROM dwarf.run('api_boom', '{}');
ROLLBACK;

-- A slow flow: await with a short timeout returns it running, without error
-- (api.slow has run once before, so dwarf knows it is slow: its steps are
-- not chained after A's, they run on their own, in runners)
SELECT status FROM dwarf.run('api_slow', '{"tag": "first"}', timeout => '30 s');
SELECT dwarf.create('api_slow', '{"tag": "slow"}') AS s_id \gset
SELECT flow_id = :s_id AS same_id, status, state, error FROM dwarf.await(:s_id, '100 ms');
SELECT status, state FROM dwarf.await(:s_id, '0 s');
-- await in REPEATABLE READ reads the flow as it is now, not as the
-- transaction's snapshot saw it
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT status FROM dwarf.await(:s_id, '0 s');
ROLLBACK;
-- the snapshot of a running flow: its state so far
SELECT api.wait_for_step(:s_id, 'A');
SELECT graph, version, status, state, steps, finished_at IS NULL AS not_finished
  FROM dwarf.snapshot(:s_id);
SELECT status FROM dwarf.flow WHERE id = :s_id;
SELECT status, state FROM dwarf.await(:s_id, '30 s');
-- the snapshot of a closed flow
SELECT graph, version, status, state, error, steps, finished_at >= created_at AS finished
  FROM dwarf.snapshot(:s_id);
-- history: one row per step, in execution order
SELECT task, status, attempt, finished_at >= started_at AS timed, error, changes
  FROM dwarf.history(:s_id);
SELECT count(*) = count(DISTINCT step_id) AS distinct_ids,
	   bool_and(step_id IS NOT NULL) AS ids
  FROM dwarf.history(:s_id);
SELECT array_agg(task ORDER BY step_id) = array_agg(task) AS ordered_by_step_id
  FROM dwarf.history(:s_id);
SELECT task, status, attempt, changes FROM dwarf.history(:s_id) WHERE task = 'B';
SELECT count(*) FROM dwarf.history(:s_id) WHERE task = 'Nope';
SELECT count(*) FROM dwarf.snapshot(-1);
SELECT count(*) FROM dwarf.history(-1);

-- timestamps: a flow is created during the call that makes it, and finishes
-- after it was created
SELECT clock_timestamp() AS t0 \gset
SELECT flow_id AS t_id FROM dwarf.run('api_quick', '{"tag": "times"}') \gset
SELECT dwarf.create('api_quick', '{"tag": "times"}') AS t2_id \gset
SELECT status FROM dwarf.await(:t2_id, '30 s');
SELECT f.id = :t_id AS by_run, f.created_at >= :'t0' AS created_during_call,
	   f.finished_at >= f.created_at AS finished_after_created,
	   (SELECT bool_and(h.started_at >= f.created_at AND h.finished_at <= f.finished_at)
		  FROM dwarf.history(f.id) h) AS steps_inside
  FROM dwarf.flow f WHERE f.id IN (:t_id, :t2_id) ORDER BY 1 DESC;

-- run past its timeout returns the flow running, without error
SELECT status, state FROM dwarf.run('api_slow', '{"tag": "run timeout"}', timeout => '100 ms');
SELECT o.status FROM dwarf.flow f, LATERAL dwarf.await(f.id, '30 s') o
 WHERE f.input->>'tag' = 'run timeout';

-- purge('0 s') removes every closed flow and its steps, and returns how many;
-- running flows stay
SELECT dwarf.create('api_slow', '{"tag": "survivor"}') AS r_id \gset
SELECT count(*) AS closed FROM dwarf.flow WHERE status IN ('completed', 'failed', 'cancelled') \gset
SELECT :closed > 10 AS several_closed;
SELECT dwarf.purge('0 s') = :closed AS purged_all_closed;
SELECT status, count(*) FROM dwarf.flow GROUP BY status;
SELECT count(*) AS orphan_steps FROM dwarf.step s
 WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id = s.flow_id);
SELECT dwarf.purge('0 s') AS nothing_left;
SELECT status, state FROM dwarf.await(:r_id, '30 s');
-- a flow closed just now is not older than an hour
SELECT dwarf.purge('1 hour') AS too_young;
SELECT dwarf.purge() AS default_30_days;

-- dwarf.stats: flows by status, steps done, the workers
SELECT running, interrupted, completed, failed, cancelled, steps_done,
	   in_flight >= 0 AS in_flight_ok, jsonb_array_length(workers) AS workers
  FROM dwarf.stats;
SELECT status FROM dwarf.run('api_quick', '{}');
SELECT completed, steps_done FROM dwarf.stats;
SELECT count(*) AS worker_rows, bool_and(steps >= 0) AS counters FROM dwarf.worker_stats();
SELECT dwarf.purge('0 s');

-- cancel a running flow: it is cancelled with its reason, and starts no
-- further step (B, after the slow step, never runs)
SELECT dwarf.create('api_slow', '{"tag": "cancel me"}') AS x_id \gset
SELECT api.wait_for_step(:x_id, 'A');
SELECT dwarf.cancel(:x_id, 'changed my mind');
SELECT status, cancel_reason, error FROM dwarf.await(:x_id, '30 s');
SELECT status, cancel_reason, finished_at IS NOT NULL AS finished FROM dwarf.flow WHERE id = :x_id;
SELECT pg_sleep(2.5);	-- time for the slow step to end; the flow must still not go on
SELECT count(*) FILTER (WHERE task = 'A') AS a_steps, count(*) FILTER (WHERE task = 'B') AS b_steps
  FROM dwarf.history(:x_id);
SELECT status, cancel_reason FROM dwarf.snapshot(:x_id);
-- cancelling a closed flow returns false and changes nothing
SELECT dwarf.cancel(:x_id) AS cancelled;
SELECT flow_id AS done_id FROM dwarf.run('api_quick', '{}') \gset
SELECT dwarf.cancel(:done_id, 'too late') AS cancelled;
SELECT status, cancel_reason FROM dwarf.flow WHERE id = :done_id;
SELECT dwarf.cancel(-1);
-- cancel without a reason
SELECT dwarf.create('api_slow', '{"tag": "cancel without reason"}') AS y_id \gset
SELECT dwarf.cancel(:y_id);
SELECT status, cancel_reason FROM dwarf.await(:y_id, '30 s');

-- bad input
SELECT dwarf.create('api_nope', '{}');
SELECT dwarf.run('api_nope', '{}');
SELECT dwarf.create(NULL, '{}');
SELECT dwarf.run(NULL, '{}');
SELECT dwarf.create('api_quick', NULL);
SELECT dwarf.run('api_quick', NULL);
SELECT dwarf.create('api_quick', '[1, 2]');
SELECT dwarf.run('api_quick', '[1, 2]');
SELECT dwarf.create('api_quick', '42');
SELECT dwarf.create('api_quick', '"text"');
SELECT dwarf.run('api_quick', 'null');
SELECT dwarf.create('api_quick', '{"a": ');
SELECT dwarf.run('api_quick', '{"a" 1}');
SELECT dwarf.create('api_quick', '{}', priority => NULL);
SELECT dwarf.await(NULL);
SELECT dwarf.await(-1);
SELECT dwarf.run('api_quick', '{"tag": "negative"}', timeout => '-1 s');
SELECT dwarf.run('api_quick', '{}', timeout => NULL);
SELECT count(*) AS flows_from_bad_runs FROM dwarf.flow WHERE input->>'tag' = 'negative';
SELECT dwarf.create('api_quick', '{}') AS n_id \gset
SELECT dwarf.await(:n_id, '-1 s');
SELECT status FROM dwarf.await(:n_id, '30 s');
SELECT dwarf.purge('-1 s');

-- a 5 MB input goes through run and ends in the state
SELECT status, length(state->>'big') AS big_length, state->'a' AS a, state->'b' AS b
  FROM dwarf.run('api_quick', jsonb_build_object('big', repeat('x', 5 * 1024 * 1024)), '60 s');

-- the control functions only work inside a task
SELECT dwarf.goto('A');
SELECT dwarf.step_key();
SELECT dwarf.flow_id();

SELECT dwarf.purge('0 s') > 0 AS cleaned;
DROP SCHEMA api CASCADE;
