--
-- run_timeout: dwarf.run gives up on its create at its timeout, not later,
-- and says so with an error that a PL/pgSQL handler can catch (not 57014,
-- query_canceled, which WHEN OTHERS does not catch).  Here the engine
-- cannot create the flow: this transaction holds a lock on dwarf.flow that
-- the create needs.  statement_timeout only bounds a dwarf.run that would
-- wait longer than its own timeout.
--
CREATE SCHEMA rt;
CREATE FUNCTION rt.echo(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"ok": true}'::jsonb $$;
SELECT dwarf.define('rt_echo', '{"tasks": {"A": "rt.echo"}}');
CREATE TABLE rt.caught (sqlstate text, message text, detail text);

SET statement_timeout = '30 s';
BEGIN;
LOCK TABLE dwarf.flow IN SHARE MODE;
DO $$
DECLARE
	st text;
	msg text;
	det text;
BEGIN
	PERFORM dwarf.run('rt_echo', '{}', timeout => '2 s', idempotency_key => 'rt-stuck');
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
	INSERT INTO rt.caught VALUES (st, msg, det);
END $$;
COMMIT;
RESET statement_timeout;

-- Caught, with the code for its case: the engine never took the create (no
-- flow was created), or took it and may still create it (the message
-- names the flow).
SELECT sqlstate IN ('53000', '40003') AS caught,
	   CASE sqlstate
		   WHEN '53000' THEN message = 'dwarf.run timed out before the engine took its create'
			   AND detail = 'No flow was created.'
		   WHEN '40003' THEN message ~ '^dwarf\.run timed out while the engine was creating flow \d+$'
			   AND detail = 'The flow may or may not have been created.'
	   END AS says_what_happened
  FROM rt.caught;

-- Once the lock is gone the engine is served again, and the key finds the
-- one flow of that call, whichever way it went.
SELECT status FROM dwarf.run('rt_echo', '{}', idempotency_key => 'rt-stuck');
SELECT count(*) AS flows_of_the_key FROM dwarf.flow WHERE idempotency_key = 'rt-stuck';
