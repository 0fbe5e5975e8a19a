--
-- flow_control: the calls a task makes from inside its step: dwarf.retry,
-- dwarf.sleep, dwarf.goto (with retry and sleep), dwarf.interrupt and
-- dwarf.resume, dwarf.subgraph, dwarf.step_key, dwarf.flow_id, dwarf.baggage,
-- with bad input, and each of them outside a task.  Waits are checked with
-- the database's own step timestamps, never with a timer in the test.
--
\set VERBOSITY terse
CREATE SCHEMA fc;
-- Every task run writes a row here: the write commits with its step.
CREATE TABLE fc.log (
	id			serial PRIMARY KEY,
	flow_id		bigint NOT NULL,
	task		text NOT NULL,
	n			int,
	step_key	text,
	note		text
);

-- Runs a statement; returns 'ok' or its error, with flow and step ids masked.
CREATE FUNCTION fc.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '(flow|step) -?\d+', '\1 N', 'g');
END $$;
-- An error text with flow ids masked.
CREATE FUNCTION fc.mask(t text) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT regexp_replace(t, 'flow -?\d+', 'flow N', 'g') $$;
-- Waits (at most 30 s, or the given seconds) until the condition holds.
CREATE FUNCTION fc.wait_until(cond text, seconds int DEFAULT 30) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE ok boolean;
BEGIN
	FOR i IN 1 .. seconds * 20 LOOP
		EXECUTE 'SELECT ' || cond INTO ok;
		IF ok THEN RETURN true; END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
	RETURN false;
END $$;

CREATE FUNCTION fc.after(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO fc.log (flow_id, task, step_key) VALUES (dwarf.flow_id(), 'After', dwarf.step_key());
	RETURN '{"after": true}';
END $$;

----------------------------------------------------------------------
-- dwarf.retry
----------------------------------------------------------------------

-- Fails twice, then succeeds.  The counter it returns with each retry is the
-- next attempt's input; its SQL write commits with each attempt.
CREATE FUNCTION fc.flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
	INSERT INTO fc.log (flow_id, task, n, step_key) VALUES (dwarf.flow_id(), 'Flaky', n, dwarf.step_key());
	IF n < 3 THEN
		IF dwarf.retry('100 ms', 2, '1 min') THEN
			RETURN jsonb_build_object('tries', n);
		END IF;
		RAISE EXCEPTION 'flaky gave up';
	END IF;
	RETURN jsonb_build_object('tries', n, 'ok', true);
END $$;
SELECT dwarf.define('fc_retry', '{"tasks": {"Flaky": "fc.flaky", "After": "fc.after"},
  "transitions": [{"from": "Flaky", "to": "After"}]}');
SELECT flow_id AS r_id FROM dwarf.run('fc_retry', '{"x": 1}') \gset
SELECT status, state, error FROM dwarf.await(:r_id, '30 s');
-- one history row per attempt, each retry's changes recorded
SELECT task, status, attempt, error, changes FROM dwarf.history(:r_id);
-- each attempt's SQL write committed, once, and saw the previous one's changes
SELECT task, n FROM fc.log WHERE flow_id = :r_id ORDER BY id;
-- the backoff: attempt k+1 starts at least 100 ms * 2^(k-1) after attempt k ended
SELECT b.attempt, b.started_at >= a.finished_at + '100 ms'::interval * 2 ^ (a.attempt - 1) AS waited
  FROM (SELECT * FROM dwarf.history(:r_id) WHERE task = 'Flaky') a JOIN (SELECT * FROM dwarf.history(:r_id) WHERE task = 'Flaky') b ON b.attempt = a.attempt + 1
 ORDER BY 1;
-- dwarf.step_key() is the same for every attempt of a step, another for the next step;
-- dwarf.flow_id() is the flow's id
SELECT count(DISTINCT step_key) FILTER (WHERE task = 'Flaky') AS flaky_keys,
	   count(DISTINCT step_key) FILTER (WHERE task = 'After') AS after_keys,
	   count(DISTINCT step_key) AS all_keys,
	   bool_and(step_key IS NOT NULL AND step_key <> '') AS keys_set,
	   bool_and(flow_id = :r_id) AS flow_id_is_the_flow
  FROM fc.log WHERE flow_id = :r_id;
-- another flow gets other keys
SELECT flow_id AS r2_id FROM dwarf.run('fc_retry', '{"x": 2}') \gset
SELECT status FROM dwarf.await(:r2_id, '30 s');
SELECT count(DISTINCT step_key) AS keys_of_two_flows FROM fc.log WHERE flow_id IN (:r_id, :r2_id);

-- max caps the backoff: initial 300 ms, factor 10, max 200 ms: every wait is
-- at least 200 ms (and the factor never applies)
CREATE FUNCTION fc.capped(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
	IF n < 3 AND dwarf.retry('300 ms', 10, '200 ms') THEN
		RETURN jsonb_build_object('tries', n);
	END IF;
	RETURN jsonb_build_object('tries', n);
END $$;
SELECT dwarf.define('fc_capped', '{"tasks": {"Capped": "fc.capped"}}');
SELECT flow_id AS cap_id FROM dwarf.run('fc_capped', '{}') \gset
SELECT status, state FROM dwarf.await(:cap_id, '30 s');
SELECT b.attempt, b.started_at >= a.finished_at + '200 ms' AS waited_max
  FROM (SELECT * FROM dwarf.history(:cap_id) WHERE task = 'Capped') a JOIN (SELECT * FROM dwarf.history(:cap_id) WHERE task = 'Capped') b ON b.attempt = a.attempt + 1
 ORDER BY 1;

-- give up: with a tiny give_up_after the first call already returns false
-- (asking for nothing) and the task raises: the flow fails with its message
CREATE FUNCTION fc.hopeless(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE again boolean;
BEGIN
	again := dwarf.retry('1 s', 2, '1 min', give_up_after => (s->>'give_up')::interval);
	INSERT INTO fc.log (flow_id, task, note) VALUES (dwarf.flow_id(), 'Hopeless', again::text);
	IF again THEN
		RETURN jsonb_build_object('tries', coalesce((s->>'tries')::int, 0) + 1);
	END IF;
	RAISE EXCEPTION 'service down for good (retry said %)', again;
END $$;
SELECT dwarf.define('fc_hopeless', '{"tasks": {"Hopeless": "fc.hopeless", "After": "fc.after"},
  "transitions": [{"from": "Hopeless", "to": "After"}]}');
SELECT flow_id AS h_id FROM dwarf.run('fc_hopeless', '{"give_up": "1 ms"}') \gset
SELECT status, state, error FROM dwarf.await(:h_id, '30 s');
SELECT task, status, attempt, error FROM dwarf.history(:h_id);
-- the failed attempt's write was rolled back with it
SELECT count(*) AS hopeless_writes FROM fc.log WHERE flow_id = :h_id;
-- give up after the first retry: the first call fits in 1.5 s, the second would end past it
CREATE FUNCTION fc.once_more(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF dwarf.retry('1 s', 1, '1 s', give_up_after => '1.5 s') THEN
		RETURN jsonb_build_object('tries', coalesce((s->>'tries')::int, 0) + 1);
	END IF;
	RAISE EXCEPTION 'gave up after % tries', coalesce((s->>'tries')::int, 0) + 1;
END $$;
SELECT dwarf.define('fc_once_more', '{"tasks": {"OnceMore": "fc.once_more"}}');
SELECT flow_id AS om_id FROM dwarf.run('fc_once_more', '{}') \gset
SELECT status, error FROM dwarf.await(:om_id, '30 s');
SELECT task, status, attempt, error, changes FROM dwarf.history(:om_id);
-- give_up_after zero or negative means no limit
CREATE FUNCTION fc.no_limit(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
	IF n < 2 THEN
		IF dwarf.retry('10 ms', 1, '10 ms', give_up_after => (s->>'give_up')::interval) THEN
			RETURN jsonb_build_object('tries', n);
		END IF;
		RAISE EXCEPTION 'gave up although there is no limit';
	END IF;
	RETURN jsonb_build_object('tries', n);
END $$;
SELECT dwarf.define('fc_no_limit', '{"tasks": {"NoLimit": "fc.no_limit"}}');
SELECT status, state, error FROM dwarf.run('fc_no_limit', '{"give_up": "0 s"}');
SELECT status, state, error FROM dwarf.run('fc_no_limit', '{"give_up": "-1 h"}');
SELECT status, state - 'give_up' AS state, error FROM dwarf.run('fc_no_limit', '{}');

-- bad arguments fail the step with a clear error
CREATE FUNCTION fc.bad_retry(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.retry((s->>'initial')::interval, (s->>'factor')::float8, (s->>'max')::interval);
	RETURN '{"retried": true}';
END $$;
SELECT dwarf.define('fc_bad_retry', '{"tasks": {"BadRetry": "fc.bad_retry"}}');
SELECT v.args, o.status, o.error
  FROM (VALUES (1, '{"initial": "-1 s", "factor": 2, "max": "1 min"}'::jsonb),
			   (2, '{"initial": "1 s", "factor": 0.5, "max": "1 min"}'),
			   (3, '{"initial": "1 s", "factor": 0, "max": "1 min"}'),
			   (4, '{"initial": "1 s", "factor": -2, "max": "1 min"}'),
			   (5, '{"initial": "1 s", "factor": "NaN", "max": "1 min"}'),
			   (6, '{"initial": "1 s", "factor": "Infinity", "max": "1 min"}'),
			   (7, '{"initial": "1 s", "factor": 2, "max": "-1 min"}'),
			   (8, '{"factor": 2, "max": "1 min"}'),
			   (9, '{"initial": "1 s", "max": "1 min"}')) v(n, args),
	   LATERAL dwarf.run('fc_bad_retry', v.args) o
 ORDER BY v.n;
-- each failed in its first attempt, with no retry row
SELECT count(*) FILTER (WHERE h.status = 'failed' AND h.attempt = 1) AS failed_first_attempts,
	   count(*) FILTER (WHERE h.status <> 'failed') AS other_rows
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id, LATERAL dwarf.history(f.id) h
 WHERE g.name = 'fc_bad_retry';

----------------------------------------------------------------------
-- dwarf.sleep
----------------------------------------------------------------------

CREATE FUNCTION fc.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF s ? 'nap' THEN
		PERFORM dwarf.sleep((s->>'nap')::interval);
	END IF;
	IF s ? 'nap2' THEN
		PERFORM dwarf.sleep((s->>'nap2')::interval);
	END IF;
	INSERT INTO fc.log (flow_id, task) VALUES (dwarf.flow_id(), 'Nap');
	RETURN '{"napped": true}';
END $$;
SELECT dwarf.define('fc_sleep', '{"tasks": {"Nap": "fc.nap", "After": "fc.after"},
  "transitions": [{"from": "Nap", "to": "After"}]}');
SELECT flow_id AS s_id FROM dwarf.run('fc_sleep', '{"nap": "1 s"}') \gset
SELECT status, state FROM dwarf.await(:s_id, '30 s');
SELECT task, status, attempt, changes FROM dwarf.history(:s_id);
-- the next step started at least the interval after the sleeping step ended
SELECT b.started_at >= a.finished_at + '1 s' AS slept_1s
  FROM (SELECT * FROM dwarf.history(:s_id) WHERE task = 'Nap') a, (SELECT * FROM dwarf.history(:s_id) WHERE task = 'After') b;
-- the sleeping step's write committed once, the next step ran once
SELECT task, count(*) FROM fc.log WHERE flow_id = :s_id GROUP BY task ORDER BY task;
-- two sleeps in one task add up
SELECT flow_id AS s2_id FROM dwarf.run('fc_sleep', '{"nap": "400 ms", "nap2": "400 ms"}') \gset
SELECT status FROM dwarf.await(:s2_id, '30 s');
SELECT b.started_at >= a.finished_at + '800 ms' AS slept_800ms
  FROM (SELECT * FROM dwarf.history(:s2_id) WHERE task = 'Nap') a, (SELECT * FROM dwarf.history(:s2_id) WHERE task = 'After') b;
-- a zero sleep is allowed
SELECT status, state FROM dwarf.run('fc_sleep', '{"nap": "0 s"}');
-- a negative sleep fails the step, and its write is rolled back
SELECT flow_id AS s3_id FROM dwarf.run('fc_sleep', '{"nap": "-1 s"}') \gset
SELECT status, error FROM dwarf.await(:s3_id, '30 s');
SELECT task, status, attempt, error FROM dwarf.history(:s3_id);
SELECT count(*) AS negative_nap_writes FROM fc.log WHERE flow_id = :s3_id;
-- a task that also sleeps: the flow is running, not done, while it waits
SELECT dwarf.create('fc_sleep', '{"nap": "2 s"}') AS s4_id \gset
SELECT status FROM dwarf.await(:s4_id, '300 ms');
SELECT fc.wait_until(format('EXISTS (SELECT 1 FROM dwarf.step WHERE flow_id = %s)', :s4_id)) AS nap_done;
SELECT status, steps FROM dwarf.snapshot(:s4_id);
SELECT status, state FROM dwarf.await(:s4_id, '30 s');

-- sleep and retry backoff add up: attempt 1 sleeps 500 ms and asks for a
-- 300 ms retry: attempt 2 starts at least 800 ms after attempt 1 ended
CREATE FUNCTION fc.nap_retry(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
	IF n = 1 THEN
		PERFORM dwarf.sleep('500 ms');
		IF dwarf.retry('300 ms', 1, '300 ms') THEN
			RETURN jsonb_build_object('tries', n);
		END IF;
	END IF;
	RETURN jsonb_build_object('tries', n);
END $$;
SELECT dwarf.define('fc_nap_retry', '{"tasks": {"NapRetry": "fc.nap_retry", "After": "fc.after"},
  "transitions": [{"from": "NapRetry", "to": "After"}]}');
SELECT flow_id AS nr_id FROM dwarf.run('fc_nap_retry', '{}') \gset
SELECT status, state FROM dwarf.await(:nr_id, '30 s');
SELECT task, status, attempt FROM dwarf.history(:nr_id);
SELECT b.started_at >= a.finished_at + '800 ms' AS waited_800ms
  FROM (SELECT * FROM dwarf.history(:nr_id) WHERE task = 'NapRetry') a JOIN (SELECT * FROM dwarf.history(:nr_id) WHERE task = 'NapRetry') b ON b.attempt = 2
 WHERE a.attempt = 1;

----------------------------------------------------------------------
-- dwarf.goto with retry and sleep
----------------------------------------------------------------------

-- Attempt 1 calls goto('X') and then asks for a retry: the goto belongs to
-- that attempt only; attempt 2 does not call it and takes the plain edge.
CREATE FUNCTION fc.jumper(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'tries')::int, 0) + 1;
BEGIN
	IF n = 1 AND (s->>'retry_first')::boolean THEN
		PERFORM dwarf.goto('X');
		IF dwarf.retry('10 ms', 1, '10 ms') THEN
			RETURN jsonb_build_object('tries', n);
		END IF;
	END IF;
	IF (s->>'jump')::boolean THEN
		PERFORM dwarf.goto('X');
		IF s ? 'nap' THEN
			PERFORM dwarf.sleep((s->>'nap')::interval);
		END IF;
	END IF;
	RETURN jsonb_build_object('tries', n, 'trail', 'Jumper');
END $$;
CREATE FUNCTION fc.x(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "X"}'::jsonb $$;
CREATE FUNCTION fc.b(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"trail": "B"}'::jsonb $$;
SELECT dwarf.define('fc_goto', '{"tasks": {"Jumper": "fc.jumper", "B": "fc.b", "X": "fc.x"},
  "transitions": [
    {"from": "Jumper", "to": "B"},
    {"from": "Jumper", "to": "X", "goto": true}],
  "reducers": {"trail": "append"}}');
SELECT flow_id AS g1_id FROM dwarf.run('fc_goto', '{"retry_first": true, "jump": false}') \gset
SELECT status, state->'trail' AS trail, state->'tries' AS tries FROM dwarf.await(:g1_id, '30 s');
SELECT task, status, attempt FROM dwarf.history(:g1_id);
-- goto on the retried attempt is taken
SELECT status, state->'trail' AS trail FROM dwarf.run('fc_goto', '{"retry_first": true, "jump": true}');
-- goto with a sleep: X starts at least the sleep after Jumper ended
SELECT flow_id AS g2_id FROM dwarf.run('fc_goto', '{"jump": true, "nap": "500 ms"}') \gset
SELECT status, state->'trail' AS trail FROM dwarf.await(:g2_id, '30 s');
SELECT b.started_at >= a.finished_at + '500 ms' AS slept_before_x
  FROM (SELECT * FROM dwarf.history(:g2_id) WHERE task = 'Jumper') a, (SELECT * FROM dwarf.history(:g2_id) WHERE task = 'X') b;

----------------------------------------------------------------------
-- dwarf.interrupt and dwarf.resume
----------------------------------------------------------------------

CREATE FUNCTION fc.before(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"before": true}'::jsonb $$;
-- Asks twice, in sequence; each answer comes back from the same call.
CREATE FUNCTION fc.approve(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE d jsonb; e jsonb;
BEGIN
	INSERT INTO fc.log (flow_id, task) VALUES (dwarf.flow_id(), 'Approve');
	d := dwarf.interrupt(jsonb_build_object('ask', 'first', 'order', s->'order'));
	IF d IS NULL THEN RETURN NULL; END IF;
	e := dwarf.interrupt(jsonb_build_object('ask', 'second', 'first_answer', d));
	IF e IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('first', d, 'second', e);
END $$;
SELECT dwarf.define('fc_approve', '{"tasks": {"Before": "fc.before", "Approve": "fc.approve", "After": "fc.after"},
  "transitions": [{"chain": ["Before", "Approve", "After", "END"]}]}');
-- the first call returns NULL: the flow parks as interrupted with the payload;
-- its state is the state at the interrupt, without the payload
SELECT flow_id AS i_id FROM dwarf.run('fc_approve', '{"order": 7}') \gset
SELECT status, state, error, interrupt_payload, cancel_reason FROM dwarf.await(:i_id, '30 s');
SELECT status, state, interrupt_payload FROM dwarf.flow WHERE id = :i_id;
SELECT status, state, interrupt_payload FROM dwarf.snapshot(:i_id);
SELECT status, state, interrupt_payload FROM dwarf.await(:i_id, '100 ms');
-- parked: nothing more runs
SELECT pg_sleep(0.3);
SELECT task, count(*) FROM fc.log WHERE flow_id = :i_id GROUP BY task ORDER BY task;
-- resume: the task runs again, the first call returns the data, the second parks
SELECT dwarf.resume(:i_id, '{"ok": true}');
SELECT status, state, interrupt_payload FROM dwarf.await(:i_id, '30 s');
-- resume again: the second call returns the second data and the flow completes
SELECT dwarf.resume(:i_id, '"yes"');
SELECT status, state, interrupt_payload FROM dwarf.await(:i_id, '30 s');
SELECT status, state, interrupt_payload, resume_data FROM dwarf.flow WHERE id = :i_id;
SELECT task, status FROM dwarf.history(:i_id);
-- the task ran three times, After once
SELECT task, count(*) FROM fc.log WHERE flow_id = :i_id GROUP BY task ORDER BY task;
-- resume of a flow that is not interrupted is an error naming its status
SELECT fc.try(format('SELECT dwarf.resume(%s, %L)', :i_id, '{}'));
SELECT fc.try(format('SELECT dwarf.resume(%s, %L)', :h_id, '{}'));
SELECT dwarf.create('fc_sleep', '{"nap": "1 s"}') AS run_id \gset
SELECT fc.try(format('SELECT dwarf.resume(%s, %L)', :run_id, '{}'));
SELECT status FROM dwarf.await(:run_id, '30 s');
-- resume of an unknown flow
SELECT fc.try('SELECT dwarf.resume(-1, ''{}'')');
SELECT fc.try('SELECT dwarf.resume(NULL, ''{}'')');
-- an interrupted flow can be cancelled; it cannot be resumed then
SELECT flow_id AS ic_id FROM dwarf.run('fc_approve', '{"order": 8}') \gset
SELECT status FROM dwarf.await(:ic_id, '30 s');
SELECT dwarf.cancel(:ic_id, 'nobody answered');
SELECT status, cancel_reason FROM dwarf.await(:ic_id, '30 s');
SELECT fc.try(format('SELECT dwarf.resume(%s, %L)', :ic_id, '{}'));
SELECT pg_sleep(0.3);
SELECT task, count(*) FROM fc.log WHERE flow_id = :ic_id GROUP BY task ORDER BY task;

----------------------------------------------------------------------
-- dwarf.subgraph
----------------------------------------------------------------------

CREATE FUNCTION fc.child_a(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO fc.log (flow_id, task) VALUES (dwarf.flow_id(), 'ChildA');
	RETURN jsonb_build_object('doubled', (s->>'x')::int * 2);
END $$;
CREATE FUNCTION fc.child_b(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"child_b": true}'::jsonb $$;
CREATE FUNCTION fc.child_fail(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'child exploded on %', s->>'x';
END $$;
CREATE FUNCTION fc.child_ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE d jsonb := dwarf.interrupt(jsonb_build_object('ask', 'child', 'x', s->'x'));
BEGIN
	IF d IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('answer', d);
END $$;
CREATE FUNCTION fc.child_nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.sleep('1 min');
	RETURN '{"napped": true}';
END $$;
SELECT dwarf.define('fc_child', '{"tasks": {"ChildA": "fc.child_a", "ChildB": "fc.child_b"},
  "transitions": [{"from": "ChildA", "to": "ChildB"}]}');
SELECT dwarf.define('fc_child_fail', '{"tasks": {"ChildFail": "fc.child_fail"}}');
SELECT dwarf.define('fc_child_ask', '{"tasks": {"ChildAsk": "fc.child_ask", "ChildB": "fc.child_b"},
  "transitions": [{"from": "ChildAsk", "to": "ChildB"}]}');
SELECT dwarf.define('fc_child_nap', '{"tasks": {"ChildNap": "fc.child_nap", "ChildB": "fc.child_b"},
  "transitions": [{"from": "ChildNap", "to": "ChildB"}]}');
-- The parent's task calls the child graph named in its state.
CREATE FUNCTION fc.call(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
	INSERT INTO fc.log (flow_id, task) VALUES (dwarf.flow_id(), 'Call');
	r := dwarf.subgraph(s->>'child', coalesce(s->'child_input', jsonb_build_object('x', s->'x')));
	IF r IS NULL THEN RETURN NULL; END IF;
	RETURN jsonb_build_object('child_state', r);
END $$;
SELECT dwarf.define('fc_parent', '{"tasks": {"Before": "fc.before", "Call": "fc.call", "After": "fc.after"},
  "transitions": [{"chain": ["Before", "Call", "After", "END"]}]}');
-- the parent gets the child's final state
SELECT flow_id AS p_id FROM dwarf.run('fc_parent', '{"child": "fc_child", "x": 21}') \gset
SELECT status, state, error FROM dwarf.await(:p_id, '30 s');
SELECT f.status, f.state, f.parent_id = :p_id AS child_of_parent, g.name
  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id WHERE f.parent_id = :p_id;
SELECT id AS p_child_id FROM dwarf.flow WHERE parent_id = :p_id \gset
SELECT task, status FROM dwarf.history(:p_child_id);
SELECT task, count(*) FROM fc.log WHERE flow_id IN (:p_id, :p_child_id) GROUP BY task ORDER BY task;
-- a failed child raises in the parent: the parent fails with the child's message
SELECT flow_id AS pf_id FROM dwarf.run('fc_parent', '{"child": "fc_child_fail", "x": "purpose"}') \gset
SELECT status, fc.mask(error) AS error FROM dwarf.await(:pf_id, '30 s');
SELECT error LIKE '%child exploded on purpose%' AS parent_error_has_child_message
  FROM dwarf.flow WHERE id = :pf_id;
SELECT f.status, f.error FROM dwarf.flow f WHERE f.parent_id = :pf_id;
SELECT count(*) AS after_ran FROM dwarf.history(:pf_id) WHERE task = 'After';
-- an unknown child graph or an input that is not an object fails the parent's step
SELECT status, fc.mask(error) AS error FROM dwarf.run('fc_parent', '{"child": "fc_no_such_graph"}');
SELECT status, fc.mask(error) AS error FROM dwarf.run('fc_parent', '{"child": "fc_child", "child_input": [1]}');
-- a child's interrupt surfaces at the parent, with the child's payload; the
-- parent's state is its own state at the interrupt
SELECT flow_id AS pi_id FROM dwarf.run('fc_parent', '{"child": "fc_child_ask", "x": 5}') \gset
SELECT status, state, interrupt_payload FROM dwarf.await(:pi_id, '30 s');
SELECT status, state, interrupt_payload FROM dwarf.flow WHERE id = :pi_id;
SELECT id AS pi_child_id FROM dwarf.flow WHERE parent_id = :pi_id \gset
SELECT status, state, interrupt_payload FROM dwarf.flow WHERE id = :pi_child_id;
-- resuming the parent reaches the child, and everything completes
SELECT dwarf.resume(:pi_id, '{"ok": "from parent"}');
SELECT status, state, interrupt_payload FROM dwarf.await(:pi_id, '30 s');
SELECT status, state FROM dwarf.await(:pi_child_id, '30 s');
-- resuming the child directly is accepted: the child completes, and the
-- parent goes on with the child's final state (it does not stay parked)
SELECT flow_id AS pj_id FROM dwarf.run('fc_parent', '{"child": "fc_child_ask", "x": 6}') \gset
SELECT status FROM dwarf.await(:pj_id, '30 s');
SELECT id AS pj_child_id FROM dwarf.flow WHERE parent_id = :pj_id \gset
SELECT dwarf.resume(:pj_child_id, '"direct"');
SELECT status, state FROM dwarf.await(:pj_child_id, '30 s');
SELECT fc.wait_until(format('(SELECT status <> %L FROM dwarf.flow WHERE id = %s)', 'interrupted', :pj_id), 10)
	AS parent_unparked;
SELECT status, state->'child_state'->'answer' AS answer FROM dwarf.await(:pj_id, '30 s');
-- cancel of the parent cascades to its running child
SELECT dwarf.create('fc_parent', '{"child": "fc_child_nap"}') AS pc_id \gset
SELECT fc.wait_until(format('EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.parent_id = %s
	AND EXISTS (SELECT 1 FROM dwarf.step s WHERE s.flow_id = f.id))', :pc_id)) AS child_sleeping;
SELECT id AS pc_child_id FROM dwarf.flow WHERE parent_id = :pc_id \gset
SELECT status FROM dwarf.flow WHERE id = :pc_child_id;
SELECT dwarf.cancel(:pc_id, 'stop the family');
SELECT status, cancel_reason FROM dwarf.await(:pc_id, '30 s');
SELECT status FROM dwarf.await(:pc_child_id, '30 s');
SELECT status FROM dwarf.flow WHERE id = :pc_child_id;
SELECT count(*) AS child_b_ran FROM dwarf.history(:pc_child_id) WHERE task = 'ChildB';
-- delete of a parent deletes its child and their steps
SELECT dwarf.delete(:p_id);
SELECT count(*) AS flows_left FROM dwarf.flow WHERE id IN (:p_id, :p_child_id);
SELECT count(*) AS steps_left FROM dwarf.step WHERE flow_id IN (:p_id, :p_child_id);
-- delete of an unknown flow
SELECT fc.try('SELECT dwarf.delete(-1)');

----------------------------------------------------------------------
-- dwarf.baggage
----------------------------------------------------------------------

CREATE FUNCTION fc.bag(s jsonb) RETURNS jsonb LANGUAGE sql AS
$$ SELECT jsonb_build_object('seen', coalesce(dwarf.baggage(), '"none"')) $$;
SELECT dwarf.define('fc_bag', '{"tasks": {"Bag": "fc.bag", "Bag2": "fc.bag"},
  "transitions": [{"from": "Bag", "to": "Bag2"}]}');
-- every task reads the baggage; it is not part of the state
SELECT status, state FROM dwarf.run('fc_bag', '{"x": 1}', baggage => '{"tenant": "t1", "trace": [1, 2]}');
SELECT status, state FROM dwarf.run('fc_bag', '{"x": 2}');
SELECT status, state FROM dwarf.run('fc_bag', '{"x": 3}', baggage => '"just a string"');
SELECT dwarf.create('fc_bag', '{"x": 4}', baggage => '{"via": "create"}') AS b_id \gset
SELECT status, state FROM dwarf.await(:b_id, '30 s');
SELECT baggage, input FROM dwarf.flow WHERE id = :b_id;

----------------------------------------------------------------------
-- outside a task, every control call raises
----------------------------------------------------------------------
SELECT dwarf.retry();
SELECT dwarf.retry('1 s', 2, '1 min', '1 h');
SELECT dwarf.sleep('1 s');
SELECT dwarf.sleep('-1 s');
SELECT dwarf.goto('X');
SELECT dwarf.interrupt('{"a": 1}');
SELECT dwarf.interrupt();
SELECT dwarf.subgraph('fc_child', '{}');
SELECT dwarf.step_key();
SELECT dwarf.flow_id();
SELECT dwarf.baggage();

-- nothing of ours is left running or parked (then delete them all: the tests
-- that follow count flows)
SELECT f.status, count(*) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name LIKE 'fc\_%' AND f.status IN ('running', 'interrupted') GROUP BY 1;
SELECT count(*) > 0 AS deleted_some FROM (
	SELECT dwarf.delete(f.id) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE g.name LIKE 'fc\_%' AND f.parent_id IS NULL) d;
SELECT count(*) AS fc_flows_left FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name LIKE 'fc\_%';
DROP SCHEMA fc CASCADE;
