--
-- retry_policy: a function task's "retry" in the graph.  An error the
-- policy retries (by SQLSTATE or class in "on") makes the step's row a
-- 'retry' with the error and no changes, and the step runs again after the
-- backoff, until the attempts are used up or give_up_after has passed; then
-- it fails as any step does (on_error edges, or the flow fails).  A task's
-- own dwarf.retry() still works and counts in the same attempts.  A task's
-- time_budget limits its steps besides the flow's; running past it is a
-- 57014, which the default policy retries.  Backoffs are checked with the
-- step rows' own timestamps, never with a timer in the test.
--
\set VERBOSITY terse
CREATE SCHEMA rp;
-- Every attempt writes a row here: only the attempts that returned keep it.
CREATE TABLE rp.log (flow_id bigint, attempt int);

-- Runs a statement; returns 'ok' or its error.
CREATE FUNCTION rp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- Does on its attempt n what s.plan[n-1] says: "retry" (asks dwarf.retry for
-- another attempt and returns), "sleep" (5 s, past any budget here),
-- "slow XXXXX" (half a second, then raises XXXXX), a SQLSTATE (raises it), or
-- nothing (returns).  Its attempt is one more than the flow's retry rows so
-- far, which the earlier attempts committed.
CREATE FUNCTION rp.act(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	n int := 1 + (SELECT count(*) FROM dwarf.step WHERE flow_id = dwarf.flow_id() AND status = 'retry');
	what text := s->'plan'->>(n - 1);
BEGIN
	INSERT INTO rp.log VALUES (dwarf.flow_id(), n);
	IF what = 'retry' THEN
		IF dwarf.retry('10 ms', 1, '10 ms') THEN
			RETURN jsonb_build_object('asked', n);
		END IF;
		RAISE EXCEPTION 'dwarf.retry said no';
	ELSIF what = 'sleep' THEN
		PERFORM pg_sleep(5);
		RETURN jsonb_build_object('slept', n);
	ELSIF what LIKE 'slow %' THEN
		PERFORM pg_sleep(0.5);
		what := substr(what, 6);
	END IF;
	IF what IS NOT NULL THEN
		RAISE EXCEPTION 'attempt % failed', n USING ERRCODE = what, DETAIL = 'As planned.';
	END IF;
	RETURN jsonb_build_object('done', n);
END $$;
CREATE FUNCTION rp.handler(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('handled', s->'onErr'->>'message', 'sqlstate', s->'onErr'->>'sqlstate') $$;

-- A flow's step rows: status, attempt, the error's SQLSTATE and message,
-- and changes.
CREATE FUNCTION rp.rows(id bigint) RETURNS TABLE (task text, status text, attempt int,
	sqlstate text, error text, changes jsonb) LANGUAGE sql AS $$
	SELECT task, status, attempt, error->>'sqlstate', error->>'message', changes
	  FROM dwarf.step WHERE flow_id = id ORDER BY step_id $$;

----------------------------------------------------------------------
-- definitions: what a policy may say
----------------------------------------------------------------------
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"tries": 3}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"attempts": 0}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"attempts": 2.5}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"factor": 0.5}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"initial": "soon"}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"on": ["4000"]}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"on": ["40p01"]}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "retry": {"on": "40001"}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"external": "q", "retry": {"on": ["08"]}}}}')$$);
SELECT rp.try($$SELECT dwarf.define('rp_bad', '{"tasks": {"A": {"function": "rp.act", "time_budget": "0 s"}}}')$$);
SELECT count(*) AS bad_graphs_defined FROM dwarf.graph WHERE name = 'rp_bad';

-- The normalized definition keeps the object form, its function
-- schema-qualified.
SET search_path = rp, public;
SELECT dwarf.define('rp_flaky', '{"tasks": {"A": {"function": "act",
  "retry": {"attempts": 3, "initial": "10 ms"}}}}') IS NOT NULL AS defined;
RESET search_path;
SELECT definition->'tasks' AS tasks FROM dwarf.graph WHERE name = 'rp_flaky';

----------------------------------------------------------------------
-- retried errors
----------------------------------------------------------------------

-- 40001 twice, then it returns: three rows, two retries holding the errors
-- and no changes, one completed; attempts 1, 2, 3.
SELECT flow_id AS flaky_id
  FROM dwarf.run('rp_flaky', '{"plan": ["40001", "40001"]}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:flaky_id, '60 s');
SELECT * FROM rp.rows(:flaky_id);
SELECT task, status, attempt, error FROM dwarf.history(:flaky_id);
-- the failed attempts' writes rolled back; the last one's stayed
SELECT attempt FROM rp.log WHERE flow_id = :flaky_id;
-- the backoff: initial 10 ms, then twice that, from the end of the attempt;
-- the next attempt starts no sooner
SELECT attempt, wake_at - finished_at AS backoff FROM dwarf.step
 WHERE flow_id = :flaky_id AND status = 'retry' ORDER BY attempt;
SELECT bool_and(b.started_at >= a.wake_at) AS waited
  FROM dwarf.step a JOIN dwarf.step b ON b.flow_id = a.flow_id AND b.attempt = a.attempt + 1
 WHERE a.flow_id = :flaky_id;
-- the error document of a retry row is a failed step's
SELECT error FROM dwarf.step WHERE flow_id = :flaky_id AND attempt = 1;
-- the rows replayed give the same flow: before the last attempt, the input
-- state; after it, the final state
SELECT dwarf.replay_state(:flaky_id, (SELECT max(step_id) FROM dwarf.step WHERE flow_id = :flaky_id))
	AS before_the_last, dwarf.replay_state(:flaky_id) = state AS replayed_final
  FROM dwarf.await(:flaky_id, '0 s');

-- An error the policy does not retry fails at once (the default "on" is the
-- transient errors; 22012 is not one).
SELECT flow_id AS once_id
  FROM dwarf.run('rp_flaky', '{"plan": ["22012"]}', timeout => '60 s') \gset
SELECT status, error FROM dwarf.await(:once_id, '60 s');
SELECT * FROM rp.rows(:once_id);

-- A class in "on" retries every SQLSTATE of it; used up, the attempts end in
-- the on_error edge with the last attempt's error.
SELECT dwarf.define('rp_handled', '{"tasks": {"A": {"function": "rp.act",
  "retry": {"attempts": 2, "initial": "10 ms", "on": ["40"]}}, "H": "rp.handler"},
  "transitions": [{"from": "A", "to": "H", "on_error": true}]}') IS NOT NULL AS defined;
SELECT status, state->'handled' AS handled, state->'sqlstate' AS sqlstate, error
  FROM dwarf.run('rp_handled', '{"plan": ["40P01", "40001", "40001"]}', timeout => '60 s');
SELECT r.* FROM dwarf.flow f, LATERAL rp.rows(f.id) r
 WHERE f.graph_id = (SELECT id FROM dwarf.graph WHERE name = 'rp_handled');
-- an error out of this "on" is not retried, though the default "on" has it
SELECT status, state->'handled' AS handled
  FROM dwarf.run('rp_handled', '{"plan": ["55P03"]}', timeout => '60 s');

-- give_up_after: the second attempt ends 1 s after the first, plus run
-- time; the third would start 2 s after that, past 1.5 s from the first.
SELECT dwarf.define('rp_give_up', '{"tasks": {"A": {"function": "rp.act",
  "retry": {"attempts": 10, "initial": "1 s", "give_up_after": "1.5 s"}}}}') IS NOT NULL AS defined;
SELECT flow_id AS gu_id
  FROM dwarf.run('rp_give_up', '{"plan": ["40001", "40001", "40001", "40001"]}', timeout => '60 s') \gset
SELECT status, error FROM dwarf.await(:gu_id, '60 s');
SELECT task, status, attempt, sqlstate FROM rp.rows(:gu_id);

----------------------------------------------------------------------
-- dwarf.retry() in the task
----------------------------------------------------------------------

-- It takes precedence: a task that asked for a retry and returned runs
-- again, whatever the policy says (here one attempt, the default).
SELECT dwarf.define('rp_plain', '{"tasks": {"A": "rp.act"}}') IS NOT NULL AS defined;
SELECT status, state FROM dwarf.run('rp_plain', '{"plan": ["retry", "retry"]}', timeout => '60 s');
-- with no policy, a transient error fails the step at once
SELECT status, error FROM dwarf.run('rp_plain', '{"plan": ["40001"]}', timeout => '60 s');

-- Its attempts and the policy's count together: 3 in all here.
SELECT flow_id AS both_id
  FROM dwarf.run('rp_flaky', '{"plan": ["retry", "40001", "40001", "40001"]}', timeout => '60 s') \gset
SELECT status, error FROM dwarf.await(:both_id, '60 s');
SELECT * FROM rp.rows(:both_id);
-- dwarf.retry() goes on past the policy's attempts; the policy's next
-- retry after them is refused
SELECT flow_id AS past_id
  FROM dwarf.run('rp_flaky', '{"plan": ["40001", "retry", "retry", "40001"]}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:past_id, '60 s');
SELECT status, attempt, sqlstate, changes FROM rp.rows(:past_id);

----------------------------------------------------------------------
-- what is not the task's own error is not an attempt
----------------------------------------------------------------------

-- An error of the server (class 53) puts the step off, even with 53 in
-- "on": no row, no attempt used.  A sequence counts its calls (it is not
-- rolled back).
CREATE SEQUENCE rp.calls;
CREATE FUNCTION rp.short_of(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	call bigint := nextval('rp.calls');
BEGIN
	IF call <= 2 THEN
		RAISE EXCEPTION 'out of memory, call %', call USING ERRCODE = '53200';
	END IF;
	RETURN jsonb_build_object('call', call);
END $$;
SELECT dwarf.define('rp_short', '{"tasks": {"A": {"function": "rp.short_of",
  "retry": {"attempts": 2, "initial": "10 ms", "on": ["53"]}}}}') IS NOT NULL AS defined;
SELECT flow_id AS short_id FROM dwarf.run('rp_short', '{}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:short_id, '60 s');
SELECT * FROM rp.rows(:short_id);

-- A slow task's step runs in a runner (it runs past dwarf.long_step, so its
-- worker gives it to one); there its error is retried the same way.
SELECT dwarf.define('rp_slow', '{"tasks": {"A": {"function": "rp.act",
  "retry": {"attempts": 2, "initial": "10 ms"}}}}') IS NOT NULL AS defined;
SELECT flow_id AS slow_id
  FROM dwarf.run('rp_slow', '{"plan": ["slow 40001"]}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:slow_id, '60 s');
SELECT task, status, attempt, sqlstate, changes FROM rp.rows(:slow_id);
-- the failed attempt ran its half second: longer than a worker keeps a step
SELECT finished_at - started_at >= '0.5 s' AS ran_in_a_runner
  FROM dwarf.step WHERE flow_id = :slow_id AND attempt = 1;

----------------------------------------------------------------------
-- time_budget per task
----------------------------------------------------------------------

-- The smaller of the task's and the flow's applies; the error says which.
SELECT dwarf.define('rp_budget', '{"tasks": {"A": {"function": "rp.act", "time_budget": "100 ms"}}}')
	IS NOT NULL AS defined;
SELECT flow_id AS tb_id
  FROM dwarf.run('rp_budget', '{"plan": ["sleep"]}', time_budget => '10 s', timeout => '60 s') \gset
SELECT status, error FROM dwarf.await(:tb_id, '60 s');
SELECT status, attempt, error->>'sqlstate' AS sqlstate, error->>'detail' AS detail,
	   finished_at - started_at < '4 s' AS stopped_early
  FROM dwarf.step WHERE flow_id = :tb_id;
SELECT flow_id AS fb_id
  FROM dwarf.run('rp_budget', '{"plan": ["sleep"]}', time_budget => '50 ms', timeout => '60 s') \gset
SELECT status, error FROM dwarf.await(:fb_id, '60 s');
SELECT status, attempt, error->>'detail' AS detail FROM dwarf.step WHERE flow_id = :fb_id;
-- a quick step is not stopped
SELECT status, state FROM dwarf.run('rp_budget', '{}', timeout => '60 s');

-- 57014 is a transient error: a policy with the default "on" retries a step
-- that ran past its budget.
SELECT dwarf.define('rp_budget_retry', '{"tasks": {"A": {"function": "rp.act",
  "time_budget": "100 ms", "retry": {"attempts": 2, "initial": "10 ms"}}}}') IS NOT NULL AS defined;
SELECT flow_id AS tr_id
  FROM dwarf.run('rp_budget_retry', '{"plan": ["sleep"]}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:tr_id, '60 s');
SELECT * FROM rp.rows(:tr_id);
-- both attempts past it: the flow fails with the budget's error
SELECT status, error FROM dwarf.run('rp_budget_retry', '{"plan": ["sleep", "sleep"]}', timeout => '60 s');

DROP SCHEMA rp CASCADE;
