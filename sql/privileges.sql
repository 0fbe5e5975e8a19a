--
-- privileges: a flow runs its tasks as the role that created it; a role
-- cannot make a task do what it could not do itself; a role sees and
-- controls only its own flows and graphs; a graph name is its owner's.
--
\set VERBOSITY terse
CREATE ROLE regress_dwarf_alice NOLOGIN;
CREATE ROLE regress_dwarf_bob NOLOGIN;
GRANT USAGE ON SCHEMA dwarf TO regress_dwarf_alice, regress_dwarf_bob;
CREATE SCHEMA pv;
GRANT USAGE ON SCHEMA pv TO regress_dwarf_alice, regress_dwarf_bob;
GRANT CREATE ON SCHEMA pv TO regress_dwarf_alice;
CREATE TABLE pv.who (who text, tag text);
GRANT SELECT, INSERT ON pv.who TO regress_dwarf_alice, regress_dwarf_bob;
-- owned by the superuser, no grants
CREATE TABLE pv.secret (v text);
-- a function only alice may execute
CREATE FUNCTION pv.private(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"private": true}'::jsonb $$;
REVOKE EXECUTE ON FUNCTION pv.private(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pv.private(jsonb) TO regress_dwarf_alice;
-- SECURITY INVOKER task functions
CREATE FUNCTION pv.write_secret(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO pv.secret VALUES ('written by ' || current_user);
	RETURN '{"wrote": true}';
END $$;
CREATE FUNCTION pv.slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(1);
	RETURN '{"slow": true}';
END $$;
CREATE FUNCTION pv.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'flow -?\d+', 'flow N', 'g');
END $$;

-- A flow runs its tasks as the role that created it.
SET ROLE regress_dwarf_alice;
CREATE FUNCTION pv.whoami(s jsonb) RETURNS jsonb LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
	INSERT INTO pv.who VALUES (current_user, s->>'tag');
	RETURN jsonb_build_object('current_user', current_user, 'session_user', session_user);
END $$;
SELECT dwarf.define('pv_alice_graph', '{"tasks": {"W": "pv.whoami"}}');
SELECT status, error, state->'current_user' AS current_user
  FROM dwarf.run('pv_alice_graph', '{"tag": "alice run"}');
SELECT dwarf.create('pv_alice_graph', '{"tag": "alice create"}') AS a_id \gset
SELECT status, state->'current_user' AS current_user FROM dwarf.await(:a_id, '30 s');
SELECT owner, status FROM dwarf.flow WHERE id = :a_id;
RESET ROLE;
SELECT who, tag FROM pv.who ORDER BY tag;

-- An unprivileged role cannot get a task to do what it could not do itself.
SET ROLE regress_dwarf_bob;
INSERT INTO pv.secret VALUES ('bob himself');
SELECT dwarf.define('pv_bob_secret', '{"tasks": {"S": "pv.write_secret"}}');
SELECT status, error FROM dwarf.run('pv_bob_secret', '{}');
RESET ROLE;
SELECT count(*) AS secret_rows FROM pv.secret;
-- the superuser's own flow of the same graph may write it; it is bob's
-- graph, so the superuser names it as bob's (bob's names never stand in
-- for its own)
SELECT pv.try($$SELECT dwarf.run('pv_bob_secret', '{}')$$) AS bare_name;
SELECT status, error FROM dwarf.run('regress_dwarf_bob.pv_bob_secret', '{}');
SELECT v FROM pv.secret;
TRUNCATE pv.secret;

-- A role without EXECUTE on a task function gets a failed flow.
SET ROLE regress_dwarf_bob;
SELECT dwarf.define('pv_bob_private', '{"tasks": {"P": "pv.private"}}');
SELECT status, error FROM dwarf.run('pv_bob_private', '{}');
RESET ROLE;
SET ROLE regress_dwarf_alice;
SELECT status, error, state FROM dwarf.run('regress_dwarf_bob.pv_bob_private', '{}');
RESET ROLE;

-- Anyone may run anyone's graph, named as role.name, but the tasks run as
-- the caller.
SET ROLE regress_dwarf_bob;
SELECT status, state->'current_user' AS current_user
  FROM dwarf.run('regress_dwarf_alice.pv_alice_graph', '{"tag": "bob runs alice''s graph"}');
RESET ROLE;
SELECT who, tag FROM pv.who ORDER BY tag;

-- bob cannot define a new version of alice's graph: his define of that
-- name makes a graph of his own; alice's define adds a version to hers
SET ROLE regress_dwarf_bob;
SELECT dwarf.define('pv_alice_graph', '{"tasks": {"S": "pv.write_secret"}}');
RESET ROLE;
SET ROLE regress_dwarf_alice;
SELECT dwarf.define('pv_alice_graph', '{"tasks": {"W": "pv.whoami", "Slow": "pv.slow"},
  "transitions": [{"from": "W", "to": "Slow"}]}');
RESET ROLE;
SELECT name, owner, version, definition->'tasks' AS tasks FROM dwarf.graph WHERE name LIKE 'pv\_%'
 ORDER BY name, owner::text, version;

-- bob cannot see or control alice's flows
SET ROLE regress_dwarf_alice;
SELECT dwarf.create('pv_alice_graph', '{"tag": "alice slow"}') AS slow_id \gset
RESET ROLE;
SET ROLE regress_dwarf_bob;
SELECT pv.try(format('SELECT dwarf.await(%s, %L)', :slow_id, '1 s')) AS bob_await;
SELECT pv.try(format('SELECT dwarf.cancel(%s, %L)', :slow_id, 'by bob')) AS bob_cancel;
SELECT pv.try(format('SELECT dwarf.await(%s, %L)', :a_id, '1 s')) AS bob_await_closed;
SELECT pv.try(format('SELECT dwarf.snapshot(%s)', :slow_id)) AS bob_sees_snapshot;
SELECT pv.try(format('SELECT dwarf.history(%s)', :a_id)) AS bob_sees_history;
SELECT owner, count(*) FROM dwarf.flow GROUP BY owner ORDER BY owner;
SELECT count(*) AS bob_sees_steps_of_others FROM dwarf.step s
 WHERE s.flow_id IN (:a_id, :slow_id);
SELECT running, completed, failed FROM dwarf.stats;
RESET ROLE;
-- alice's flow went on untouched
SET ROLE regress_dwarf_alice;
SELECT status, cancel_reason, state->'slow' AS slow FROM dwarf.await(:slow_id, '30 s');
SELECT owner, status, count(*) FROM dwarf.flow GROUP BY owner, status ORDER BY owner, status;
SELECT count(*) AS alice_sees_her_history FROM dwarf.history(:a_id);
-- alice may cancel her own flow
SELECT dwarf.create('pv_alice_graph', '{"tag": "alice cancels"}') AS c_id \gset
SELECT dwarf.cancel(:c_id, 'by alice');
SELECT status, cancel_reason FROM dwarf.await(:c_id, '30 s');
RESET ROLE;

-- purge removes only the caller's own closed flows
SELECT owner, count(*) FROM dwarf.flow WHERE owner IN ('regress_dwarf_alice', 'regress_dwarf_bob')
 GROUP BY owner ORDER BY owner;
SET ROLE regress_dwarf_bob;
SELECT dwarf.purge('0 s') AS bob_purged;
RESET ROLE;
SELECT owner, count(*) FROM dwarf.flow WHERE owner IN ('regress_dwarf_alice', 'regress_dwarf_bob')
 GROUP BY owner ORDER BY owner;

-- clean up, so that the file can run again
SELECT pg_sleep(1.5);	-- let alice's cancelled flow's running step end
SET ROLE regress_dwarf_alice;
SELECT dwarf.purge('0 s') AS alice_purged;
RESET ROLE;
DELETE FROM dwarf.graph WHERE name LIKE 'pv\_%';
DROP SCHEMA pv CASCADE;
DROP OWNED BY regress_dwarf_alice, regress_dwarf_bob;
DROP ROLE regress_dwarf_alice;
DROP ROLE regress_dwarf_bob;
