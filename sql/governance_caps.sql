--
-- governance_caps: what keeps one role's flows from taking the engine from
-- the others.  A flow that loops (dwarf.goto, dwarf.retry) ends failed on
-- dwarf.max_flow_steps; dwarf.retry waits at least dwarf.min_retry_delay;
-- a for_each wider than dwarf.max_for_each fails its step; a priority below
-- 0 is a privilege (role dwarf_priority); dwarf.cancel of a closed flow
-- returns false, so it works in bulk.  test/dwarf.conf sets the caps low:
-- max_flow_steps 300, max_for_each 200, min_retry_delay 5 ms.
--
CREATE SCHEMA gc;
CREATE FUNCTION gc.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
-- runs a statement; its error's SQLSTATE and message, flow ids masked
CREATE FUNCTION gc.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'flow \d+', 'flow N');
END $$;

-- The caps are settings with generous defaults, and only a superuser may change them.
SELECT name, boot_val, unit, context FROM pg_settings
 WHERE name IN ('dwarf.max_flow_steps', 'dwarf.max_for_each', 'dwarf.min_retry_delay')
 ORDER BY name;
SELECT current_setting('dwarf.max_flow_steps') AS max_flow_steps,
	   current_setting('dwarf.max_for_each') AS max_for_each,
	   current_setting('dwarf.min_retry_delay') AS min_retry_delay;
CREATE ROLE regress_gc_alice NOLOGIN;
CREATE ROLE regress_gc_ops NOLOGIN;
GRANT USAGE ON SCHEMA dwarf, gc TO regress_gc_alice, regress_gc_ops;
SET ROLE regress_gc_alice;
SET dwarf.max_flow_steps = 1000000;
RESET ROLE;

----------------------------------------------------------------------
-- dwarf.max_flow_steps
----------------------------------------------------------------------

-- A task that always goes to itself: the flow ends failed on the cap after
-- 300 steps; the 301st is recorded failed with the cap's error.
CREATE FUNCTION gc.forever(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.goto('Loop');
	RETURN jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1);
END $$;
SELECT dwarf.define('gc_goto', '{"entry": "Loop", "tasks": {"Loop": "gc.forever"},
  "transitions": [{"from": "Loop", "to": "Loop", "goto": true}]}');
SELECT flow_id AS goto_id FROM dwarf.run('gc_goto', '{}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:goto_id, '60 s');
SELECT count(*) AS steps, count(*) FILTER (WHERE status = 'completed') AS completed,
	   count(*) FILTER (WHERE status = 'failed') AS failed
  FROM dwarf.history(:goto_id);
-- the failed step's error is a task error's document, naming the setting
\x on
SELECT s.task, s.status, s.changes, s.error->>'sqlstate' AS sqlstate, s.error->>'cap' AS cap,
	   s.error->>'detail' AS detail, s.error->>'hint' AS hint
  FROM dwarf.step s WHERE s.flow_id = :goto_id AND s.status = 'failed';
\x off

-- An on_error edge does not take such a flow anywhere: a handler would only
-- be one more step past the cap.
CREATE FUNCTION gc.handler(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('handled', s->'onErr'->>'cap') $$;
SELECT dwarf.define('gc_goto_handled', '{"entry": "Loop", "tasks": {"Loop": "gc.forever", "Handler": "gc.handler"},
  "transitions": [{"from": "Loop", "to": "Loop", "goto": true},
                  {"from": "Loop", "to": "Handler", "on_error": true}]}');
SELECT status, state, error FROM dwarf.run('gc_goto_handled', '{}', timeout => '60 s');

-- A task that retries for ever, with no backoff: the same end, every attempt counted.
CREATE FUNCTION gc.again(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	IF dwarf.retry('0 s', 1, '0 s') THEN
		RETURN jsonb_build_object('n', coalesce((s->>'n')::int, 0) + 1);
	END IF;
	RAISE EXCEPTION 'retry said no';
END $$;
SELECT dwarf.define('gc_retry', '{"tasks": {"Again": "gc.again"}}');
SELECT flow_id AS retry_id FROM dwarf.run('gc_retry', '{}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:retry_id, '60 s');
SELECT count(*) AS steps, max(attempt) AS last_attempt,
	   count(*) FILTER (WHERE status = 'retry') AS retries
  FROM dwarf.history(:retry_id);

-- A flow of exactly 300 steps completes: the cap is on the step after.
CREATE FUNCTION gc.count_to(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'n')::int, 0) + 1;
BEGIN
	IF n < (s->>'to')::int THEN
		PERFORM dwarf.goto('Count');
	END IF;
	RETURN jsonb_build_object('n', n);
END $$;
SELECT dwarf.define('gc_count', '{"entry": "Count", "tasks": {"Count": "gc.count_to"},
  "transitions": [{"from": "Count", "to": "Count", "goto": true}]}');
SELECT status, state->'n' AS n, error FROM dwarf.run('gc_count', '{"to": 300}', timeout => '60 s');
SELECT status, state->'n' AS n, error FROM dwarf.run('gc_count', '{"to": 301}', timeout => '60 s');

----------------------------------------------------------------------
-- dwarf.min_retry_delay
----------------------------------------------------------------------

-- dwarf.retry('0 s', ...) waits dwarf.min_retry_delay: each retry's wake
-- time is at least 5 ms after its attempt ended.
SELECT count(*) AS retries,
	   bool_and(wake_at >= finished_at + '5 ms') AS waited_min_delay
  FROM dwarf.step WHERE flow_id = :retry_id AND status = 'retry';
-- a longer backoff is left as it is
CREATE FUNCTION gc.slow_again(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE n int := coalesce((s->>'n')::int, 0) + 1;
BEGIN
	IF n < 2 AND dwarf.retry('50 ms', 1, '50 ms') THEN
		RETURN jsonb_build_object('n', n);
	END IF;
	RETURN jsonb_build_object('n', n);
END $$;
SELECT dwarf.define('gc_slow_retry', '{"tasks": {"Again": "gc.slow_again"}}');
SELECT flow_id AS slow_id FROM dwarf.run('gc_slow_retry', '{}') \gset
SELECT status, state FROM dwarf.await(:slow_id, '30 s');
SELECT wake_at - finished_at = '50 ms' AS waited_its_own
  FROM dwarf.step WHERE flow_id = :slow_id AND status = 'retry';

----------------------------------------------------------------------
-- dwarf.max_for_each
----------------------------------------------------------------------

CREATE FUNCTION gc.split(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('items', (SELECT jsonb_agg(g) FROM generate_series(1, (s->>'n')::int) g)) $$;
CREATE FUNCTION gc.work(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('total', (s->>'item')::int) $$;
SELECT dwarf.define('gc_each', '{"tasks": {"Split": "gc.split", "Work": "gc.work", "Join": "gc.noop"},
  "transitions": [{"from": "Split", "to": "Work", "for_each": "items"},
                  {"from": "Work", "to": "Join"}],
  "fan_in": ["Join"], "reducers": {"total": "add"}}');
-- 200 branches: the cap allows them
SELECT status, state->'total' AS total, error FROM dwarf.run('gc_each', '{"n": 200}', timeout => '60 s');
-- 201: the step fails with the cap's error, and no branch starts
SELECT flow_id AS wide_id FROM dwarf.run('gc_each', '{"n": 201}', timeout => '60 s') \gset
SELECT status, state, error FROM dwarf.await(:wide_id, '60 s');
SELECT task, status, changes, error FROM dwarf.history(:wide_id);
\x on
SELECT s.error->>'sqlstate' AS sqlstate, s.error->>'cap' AS cap,
	   s.error->>'detail' AS detail, s.error->>'hint' AS hint
  FROM dwarf.step s WHERE s.flow_id = :wide_id;
\x off
-- with an on_error edge the handler runs, and finds the cap in onErr
SELECT dwarf.define('gc_each_handled', '{"tasks": {"Split": "gc.split", "Work": "gc.work",
                                                   "Join": "gc.noop", "Handler": "gc.handler"},
  "transitions": [{"from": "Split", "to": "Work", "for_each": "items"},
                  {"from": "Split", "to": "Handler", "on_error": true},
                  {"from": "Work", "to": "Join"}],
  "fan_in": ["Join"], "reducers": {"total": "add"}}');
SELECT status, state->'handled' AS handled, state->'onErr'->>'sqlstate' AS sqlstate, error
  FROM dwarf.run('gc_each_handled', '{"n": 1000}', timeout => '60 s');

----------------------------------------------------------------------
-- priority below 0: a privilege
----------------------------------------------------------------------

-- the install script made the role (and found it made, in a second database)
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = 'dwarf_priority';
GRANT dwarf_priority TO regress_gc_ops;
SET ROLE regress_gc_alice;
SELECT dwarf.define('gc_alice', '{"tasks": {"A": "gc.noop"}}');
-- an ordinary role: 0 and above are fine, below 0 is refused
SELECT status FROM dwarf.run('gc_alice', '{}', priority => 0);
SELECT status FROM dwarf.run('gc_alice', '{}', priority => 10);
SELECT status FROM dwarf.run('gc_alice', '{}', priority => -1000);
SELECT dwarf.create('gc_alice', '{}', priority => -1);
SELECT count(*) AS alice_flows, min(priority) AS lowest FROM dwarf.flow
 WHERE graph_id IN (SELECT id FROM dwarf.graph WHERE name = 'gc_alice');
RESET ROLE;
-- a member of dwarf_priority may
SET ROLE regress_gc_ops;
SELECT dwarf.define('gc_ops', '{"tasks": {"A": "gc.noop"}}');
SELECT status FROM dwarf.run('gc_ops', '{}', priority => -1000);
SELECT dwarf.create('gc_ops', '{}', priority => -5) > 0 AS created;
RESET ROLE;
-- and so may a superuser
SELECT status FROM dwarf.run('gc_count', '{"to": 1}', priority => -1);
SELECT owner, priority FROM dwarf.flow WHERE priority < 0 ORDER BY priority, owner::text;
-- a task creating a flow is held to its owner's privileges too
CREATE FUNCTION gc.spawn(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM dwarf.create('gc_alice', '{}', priority => -1);
	RETURN '{}';
END $$;
GRANT EXECUTE ON FUNCTION gc.spawn(jsonb) TO regress_gc_alice;
SET ROLE regress_gc_alice;
SELECT dwarf.define('gc_alice_spawn', '{"tasks": {"Spawn": "gc.spawn"}}');
SELECT status, error FROM dwarf.run('gc_alice_spawn', '{}');
RESET ROLE;

----------------------------------------------------------------------
-- dwarf.cancel in bulk
----------------------------------------------------------------------

CREATE FUNCTION gc.park(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep('1 hour'); RETURN '{}'; END $$;
SELECT dwarf.define('gc_park', '{"tasks": {"Park": "gc.park", "After": "gc.noop"},
  "transitions": [{"from": "Park", "to": "After"}]}');
CREATE TABLE gc.batch (id bigint);
INSERT INTO gc.batch SELECT dwarf.create('gc_park', '{}') FROM generate_series(1, 3);
INSERT INTO gc.batch SELECT flow_id FROM dwarf.run('gc_count', '{"to": 1}');
-- three running, one completed: true for each running one, false for the closed one
SELECT f.status AS was, dwarf.cancel(b.id, 'in bulk') AS cancelled
  FROM gc.batch b JOIN dwarf.flow f ON f.id = b.id ORDER BY b.id;
SELECT status, cancel_reason, count(*) FROM dwarf.flow WHERE id IN (SELECT id FROM gc.batch)
 GROUP BY 1, 2 ORDER BY 1;
-- again: all closed, all false, nothing changed
SELECT dwarf.cancel(id, 'twice') AS cancelled FROM gc.batch ORDER BY id;
SELECT count(*) FILTER (WHERE cancel_reason = 'in bulk') AS kept_reason
  FROM dwarf.flow WHERE id IN (SELECT id FROM gc.batch);
-- a flow that does not exist, or that the caller cannot see, is still an error
SELECT dwarf.cancel(-1);
SELECT dwarf.create('gc_park', '{}') AS su_park_id \gset
SET ROLE regress_gc_alice;
SELECT gc.try(format('SELECT dwarf.cancel(%s)', :su_park_id)) AS alice_cancels_others;
RESET ROLE;
SELECT dwarf.cancel(:su_park_id, 'tidy up');

DROP SCHEMA gc CASCADE;
REVOKE USAGE ON SCHEMA dwarf FROM regress_gc_alice, regress_gc_ops;
DROP OWNED BY regress_gc_alice, regress_gc_ops;
DROP ROLE regress_gc_alice, regress_gc_ops;
