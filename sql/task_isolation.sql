--
-- task_isolation: a task's session state ends with its step.  Tasks of two
-- roles share dwarf's workers; what role A's task SETs, prepares, locks or
-- tries to create is never seen by role B's next task, and a task may call
-- only what its owner could call from a session of its own.
--
\set VERBOSITY terse
CREATE ROLE dwarf_iso_a;
CREATE ROLE dwarf_iso_b;
GRANT USAGE ON SCHEMA dwarf TO dwarf_iso_a, dwarf_iso_b;
CREATE SCHEMA iso_a AUTHORIZATION dwarf_iso_a;
CREATE SCHEMA iso_b AUTHORIZATION dwarf_iso_b;

SET ROLE dwarf_iso_a;
-- Changes every setting it can for the rest of the session, and returns.
CREATE FUNCTION iso_a.meddle(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('synchronous_commit', 'off', false);
	PERFORM set_config('search_path', 'iso_a, public', false);
	PERFORM set_config('statement_timeout', '1234', false);
	PERFORM set_config('default_transaction_read_only', 'on', false);
	PERFORM set_config('work_mem', '77kB', false);
	PERFORM pg_advisory_lock(4242);
	RETURN jsonb_build_object('sc', current_setting('synchronous_commit'));
END $$;
-- Each tries one thing a restricted operation forbids.
CREATE FUNCTION iso_a.temp_table(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN CREATE TEMP TABLE orders (x int); RETURN '{}'; END $$;
CREATE FUNCTION iso_a.set_role(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN SET ROLE dwarf_iso_b; RETURN '{}'; END $$;
CREATE FUNCTION iso_a.prepare(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN EXECUTE 'PREPARE leak AS SELECT 1'; RETURN '{}'; END $$;
CREATE FUNCTION iso_a.listen(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN LISTEN leak; RETURN '{}'; END $$;
SELECT dwarf.define('iso_meddle', '{"tasks": {"A": "iso_a.meddle"}}');
SELECT dwarf.define('iso_temp', '{"tasks": {"A": "iso_a.temp_table"}}');
SELECT dwarf.define('iso_role', '{"tasks": {"A": "iso_a.set_role"}}');
SELECT dwarf.define('iso_prepare', '{"tasks": {"A": "iso_a.prepare"}}');
SELECT dwarf.define('iso_listen', '{"tasks": {"A": "iso_a.listen"}}');

-- Inside its own step, the task saw its own change.
SELECT status, state FROM dwarf.run('iso_meddle', '{}');
-- Enough flows that every worker ran the meddling task at least once
-- (a flow's worker is its id modulo dwarf.workers).
SELECT status, count(*) FROM (SELECT (dwarf.run('iso_meddle', '{}')).status
  FROM generate_series(1, 6)) r GROUP BY 1;
-- What a restricted operation forbids fails the step with a clear error.
SELECT status, error FROM dwarf.run('iso_temp', '{}');
SELECT status, error FROM dwarf.run('iso_role', '{}');
SELECT status, error FROM dwarf.run('iso_prepare', '{}');
SELECT status, error FROM dwarf.run('iso_listen', '{}');
RESET ROLE;

SET ROLE dwarf_iso_b;
CREATE TABLE iso_b.orders (x int);
CREATE FUNCTION iso_b.look(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	path text := current_setting('search_path');
BEGIN
	-- Unqualified, "orders" would find a temporary table first, if any.
	PERFORM set_config('search_path', 'iso_b', true);
	INSERT INTO orders VALUES (1);
	RETURN jsonb_build_object(
		'synchronous_commit', current_setting('synchronous_commit'),
		'search_path', path,
		'statement_timeout', current_setting('statement_timeout'),
		'read_only', current_setting('default_transaction_read_only'),
		'work_mem', current_setting('work_mem'),
		'prepared', (SELECT count(*) FROM pg_prepared_statements),
		'advisory_locks', (SELECT count(*) FROM pg_locks
							WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
		'temp_schemas', (SELECT count(*) FROM pg_namespace
						  WHERE oid = pg_my_temp_schema()),
		'current_user', current_user);
END $$;
SELECT dwarf.define('iso_look', '{"tasks": {"A": "iso_b.look"}}');
-- B's tasks, on every worker, see the server's defaults and their own table.
SELECT status, state, error, count(*) FROM (SELECT (r).status, (r).state, (r).error
  FROM (SELECT dwarf.run('iso_look', '{}') r
		  FROM generate_series(1, 6)) x) y GROUP BY 1, 2, 3;
SELECT count(*) AS b_orders FROM iso_b.orders;
RESET ROLE;

-- USAGE on the schema: a SECURITY DEFINER function of a schema A may not use
-- is not A's to run, even with EXECUTE granted to PUBLIC.
CREATE SCHEMA iso_secret;
CREATE TABLE iso_secret.calls (who text);
CREATE FUNCTION iso_secret.reveal(s jsonb) RETURNS jsonb LANGUAGE sql SECURITY DEFINER AS $$
	INSERT INTO iso_secret.calls VALUES (session_user); SELECT '{"secret": 42}'::jsonb $$;
GRANT EXECUTE ON FUNCTION iso_secret.reveal(jsonb) TO PUBLIC;
GRANT USAGE ON SCHEMA iso_secret TO dwarf_iso_a;
SET ROLE dwarf_iso_a;
SELECT dwarf.define('iso_reveal', '{"tasks": {"A": "iso_secret.reveal"}}');
RESET ROLE;
REVOKE USAGE ON SCHEMA iso_secret FROM dwarf_iso_a;
SET ROLE dwarf_iso_a;
SELECT status, error FROM dwarf.run('iso_reveal', '{}');
RESET ROLE;
GRANT USAGE ON SCHEMA iso_secret TO dwarf_iso_a;
SET ROLE dwarf_iso_a;
SELECT status, state FROM dwarf.run('iso_reveal', '{}');
RESET ROLE;
SELECT count(*) AS secret_calls FROM iso_secret.calls;

-- Clean up: the roles are cluster-wide.
DELETE FROM dwarf.step_log WHERE flow_id IN (SELECT id FROM dwarf.flow
  WHERE owner IN ('dwarf_iso_a'::regrole, 'dwarf_iso_b'::regrole));
DELETE FROM dwarf.flow WHERE owner IN ('dwarf_iso_a'::regrole, 'dwarf_iso_b'::regrole);
DELETE FROM dwarf.graph WHERE owner IN ('dwarf_iso_a'::regrole, 'dwarf_iso_b'::regrole);
DROP SCHEMA iso_a, iso_b, iso_secret CASCADE;
REVOKE USAGE ON SCHEMA dwarf FROM dwarf_iso_a, dwarf_iso_b;
DROP ROLE dwarf_iso_a, dwarf_iso_b;
