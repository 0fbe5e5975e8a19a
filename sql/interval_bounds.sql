--
-- interval_bounds: an HTTP task's timeout, a step's time_budget (in the
-- graph and at create) and one dwarf.sleep have maxima a user would expect
-- (README, "Limits"), with a clear error past them.  A month counts as 30
-- days in interval arithmetic ('1 year' is 360 days), so the bounds are
-- whole days: '1 year' and '365 days' both sleep.
--
\set VERBOSITY terse
CREATE SCHEMA ib;
CREATE FUNCTION ib.noop(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION ib.nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM dwarf.sleep((s->>'nap')::interval); RETURN '{}'; END $$;

-- An HTTP task's timeout: at most 1 day.
CREATE FUNCTION ib.http(timeout text) RETURNS text LANGUAGE sql AS $$
SELECT dwarf.validate(jsonb_build_object(
	'tasks', jsonb_build_object('call', jsonb_build_object('http', 'POST https://api.example.test/x',
		'timeout', timeout)),
	'transitions', '[{"chain": ["call", "END"]}]'::jsonb))->'tasks'->'call'->>'timeout' $$;
SELECT ib.http('1 day');
SELECT ib.http('24 hours');
SELECT ib.http('1 day 1 s');
SELECT ib.http('1 mon');
SELECT ib.http('100 years');
SELECT ib.http('0 s');

-- A task's time_budget: at most 7 days.
CREATE FUNCTION ib.budget(budget text) RETURNS text LANGUAGE sql AS $$
SELECT dwarf.validate(jsonb_build_object(
	'tasks', jsonb_build_object('a', jsonb_build_object('function', 'ib.noop', 'time_budget', budget)),
	'transitions', '[{"chain": ["a", "END"]}]'::jsonb))->'tasks'->'a'->>'time_budget' $$;
SELECT ib.budget('7 days');
SELECT ib.budget('7 days 1 s');
SELECT ib.budget('1000 years');

-- A flow's time_budget at create: the same bound.
SELECT dwarf.define('ib_nap', '{"tasks": {"A": "ib.nap"}}');
BEGIN;
SELECT dwarf.create('ib_nap', '{"nap": "1 s"}', time_budget => '7 days') > 0 AS created;
ROLLBACK;
SELECT dwarf.create('ib_nap', '{"nap": "1 s"}', time_budget => '7 days 1 s');
SELECT dwarf.create('ib_nap', '{"nap": "1 s"}', time_budget => '101 years');
SELECT dwarf.create('ib_nap', '{"nap": "1 s"}', time_budget => '0 s');

-- dwarf.sleep: at most 366 days.
SELECT status, error FROM dwarf.run('ib_nap', '{"nap": "367 days"}', timeout => '30 s');
SELECT status, error FROM dwarf.run('ib_nap', '{"nap": "101 years"}', timeout => '30 s');
SELECT status, error FROM dwarf.run('ib_nap', '{"nap": "13 mons"}', timeout => '30 s');
-- '1 year' (360 days) and '365 days' are taken: the step completes, the flow sleeps.
CREATE FUNCTION ib.slept(nap text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	id bigint := (SELECT flow_id FROM dwarf.run('ib_nap', jsonb_build_object('nap', nap), timeout => '0 s'));
	done text;
BEGIN
	FOR i IN 1..300 LOOP
		SELECT string_agg(status, ',') INTO done FROM dwarf.history(id);
		EXIT WHEN done IS NOT NULL;
		PERFORM pg_sleep(0.05);
	END LOOP;
	PERFORM dwarf.cancel(id, 'seen');
	RETURN done;
END $$;
SELECT ib.slept('1 year');
SELECT ib.slept('365 days');
