--
-- graph_names: a graph name belongs to the role that defined it.  A role's
-- define, create, run and subgraph find its own graph of that name first,
-- then one of a role it belongs to; another role's graph only when named
-- as role.name.  Nobody's name captures another role's calls.  Names that
-- look like other names (invisible characters, letters of two scripts that
-- look alike) are refused at define; names are stored in NFC.
--
\set VERBOSITY terse
CREATE ROLE regress_dwarf_gn_alice NOLOGIN;
CREATE ROLE regress_dwarf_gn_mallory NOLOGIN;
CREATE ROLE regress_dwarf_gn_team NOLOGIN;
CREATE ROLE regress_dwarf_gn_crew NOLOGIN;
GRANT regress_dwarf_gn_team, regress_dwarf_gn_crew TO regress_dwarf_gn_alice;
GRANT USAGE ON SCHEMA dwarf TO regress_dwarf_gn_alice, regress_dwarf_gn_mallory,
	regress_dwarf_gn_team, regress_dwarf_gn_crew;
CREATE SCHEMA gn;
GRANT USAGE ON SCHEMA gn TO PUBLIC;
-- alice's data; mallory may not read it
CREATE TABLE gn.alice_orders (v text);
INSERT INTO gn.alice_orders VALUES ('alice''s order');
GRANT SELECT ON gn.alice_orders TO regress_dwarf_gn_alice;
-- Runs a statement; returns 'ok' or its error, with flow ids masked.
CREATE FUNCTION gn.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'flow -?\d+', 'flow N', 'g');
END $$;
-- Tasks that say whose graph ran them, and as whom.
CREATE FUNCTION gn.mallory_task(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN jsonb_build_object('graph_of', 'mallory', 'ran_as', current_user,
							  'leaked', (SELECT string_agg(v, ',') FROM gn.alice_orders));
END $$;
CREATE FUNCTION gn.alice_task(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('graph_of', 'alice', 'ran_as', current_user) $$;
CREATE FUNCTION gn.team_task(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('graph_of', 'team', 'ran_as', current_user) $$;
CREATE FUNCTION gn.crew_task(s jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT jsonb_build_object('graph_of', 'crew', 'ran_as', current_user) $$;
-- A task that runs subgraph "payments" and keeps what it returned.
CREATE FUNCTION gn.pay(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb := dwarf.subgraph('payments', '{}');
BEGIN
	IF r IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN jsonb_build_object('payments', r);
END $$;

----------------------------------------------------------------------
-- 1. mallory defines checkout and payments first
----------------------------------------------------------------------
SET ROLE regress_dwarf_gn_mallory;
SELECT dwarf.define('checkout', '{"tasks": {"T": "gn.mallory_task"}}') AS mallory_checkout;
SELECT dwarf.define('payments', '{"tasks": {"T": "gn.mallory_task"}}') AS mallory_payments;
SELECT dwarf.define('checkout', '{"tasks": {"T": "gn.mallory_task", "U": "gn.mallory_task"},
  "transitions": [{"from": "T", "to": "U"}]}') AS mallory_checkout_v2;
RESET ROLE;

-- alice has no checkout yet: her run does not reach mallory's
SET ROLE regress_dwarf_gn_alice;
SELECT gn.try($$SELECT dwarf.run('checkout', '{}')$$) AS alice_run_before;
SELECT gn.try($$SELECT dwarf.create('checkout', '{}')$$) AS alice_create_before;
-- she defines her own checkout: version 1 of her graph, not refused
SELECT dwarf.define('checkout', '{"tasks": {"T": "gn.alice_task", "P": "gn.pay"},
  "transitions": [{"from": "T", "to": "P"}]}') AS alice_checkout;
-- her run and her create run her tasks; her subgraph "payments" does not
-- reach mallory's (she has none yet: the flow fails)
SELECT status, state->>'graph_of' AS graph_of, state->>'ran_as' AS ran_as,
	   state->'leaked' AS leaked, error
  FROM dwarf.run('checkout', '{}');
SELECT dwarf.define('payments', '{"tasks": {"T": "gn.alice_task"}}') AS alice_payments;
SELECT status, state->>'graph_of' AS graph_of, state->'payments'->>'graph_of' AS payments_of,
	   state->'leaked' AS leaked
  FROM dwarf.run('checkout', '{}');
SELECT dwarf.create('checkout', '{}') AS created \gset
SELECT status, state->>'graph_of' AS graph_of, state->'payments'->>'graph_of' AS payments_of
  FROM dwarf.await(:created, '30 s');
RESET ROLE;

-- mallory's name reaches only mallory's graph
SET ROLE regress_dwarf_gn_mallory;
SELECT status, state->>'graph_of' AS graph_of, error FROM dwarf.run('checkout', '{}');
RESET ROLE;

-- the rows: one name, two owners, each with its own versions
SELECT owner, name, version, definition->'tasks'->>'T' AS task FROM dwarf.graph
 WHERE name IN ('checkout', 'payments') ORDER BY name, owner::text, version;

----------------------------------------------------------------------
-- 2. Another role's graph: named as role.name, it runs as the caller
----------------------------------------------------------------------
SET ROLE regress_dwarf_gn_mallory;
SELECT dwarf.define('tools', '{"tasks": {"T": "gn.mallory_task"}}') AS mallory_tools;
-- a graph whose task calls subgraph "payments"
SELECT dwarf.define('outer', '{"tasks": {"P": "gn.pay"}}') AS mallory_outer;
RESET ROLE;
SET ROLE regress_dwarf_gn_alice;
SELECT gn.try($$SELECT dwarf.run('tools', '{}')$$) AS bare_tools;
SELECT status, state->>'graph_of' AS graph_of, state->>'ran_as' AS ran_as
  FROM dwarf.run('regress_dwarf_gn_mallory.tools', '{}');
SELECT status, state->>'graph_of' AS graph_of, state->>'ran_as' AS ran_as
  FROM dwarf.run('"regress_dwarf_gn_mallory".tools', '{}');
SELECT dwarf.create('regress_dwarf_gn_mallory.tools', '{}') AS qualified \gset
SELECT status, state->>'graph_of' AS graph_of FROM dwarf.await(:qualified, '30 s');
-- a subgraph resolves among the flow's owner's graphs, not its definer's:
-- mallory's outer, run by alice, starts alice's payments
SELECT status, state->'payments'->>'graph_of' AS payments_of, state->'leaked' AS leaked
  FROM dwarf.run('regress_dwarf_gn_mallory.outer', '{}');
SELECT gn.try($$SELECT dwarf.run('nobody.tools', '{}')$$) AS unknown_role;
SELECT gn.try($$SELECT dwarf.run('regress_dwarf_gn_mallory.nothing', '{}')$$) AS unknown_graph;
RESET ROLE;

-- a superuser has every role's privileges, but mallory's names do not
-- capture its calls either: only a graph of a role it was granted is found
SELECT gn.try($$SELECT dwarf.run('tools', '{}')$$) AS superuser_bare;
SELECT status, state->>'ran_as' AS ran_as FROM dwarf.run('regress_dwarf_gn_mallory.tools', '{}');

----------------------------------------------------------------------
-- 3. Graphs of the roles a role belongs to
----------------------------------------------------------------------
SET ROLE regress_dwarf_gn_team;
SELECT dwarf.define('shared', '{"tasks": {"T": "gn.team_task"}}') AS team_shared;
SELECT dwarf.define('team_only', '{"tasks": {"T": "gn.team_task"}}') AS team_only;
RESET ROLE;
SET ROLE regress_dwarf_gn_alice;
-- one role of hers has it: found, and runs as alice
SELECT status, state->>'graph_of' AS graph_of, state->>'ran_as' AS ran_as FROM dwarf.run('shared', '{}');
SELECT status, state->>'graph_of' AS graph_of FROM dwarf.run('team_only', '{}');
RESET ROLE;
SET ROLE regress_dwarf_gn_crew;
SELECT dwarf.define('shared', '{"tasks": {"T": "gn.crew_task"}}') AS crew_shared;
RESET ROLE;
SET ROLE regress_dwarf_gn_alice;
-- two roles of hers have it: an error that lists them
SELECT gn.try($$SELECT dwarf.run('shared', '{}')$$) AS ambiguous;
\set VERBOSITY default
SELECT dwarf.create('shared', '{}');
\set VERBOSITY terse
SELECT status, state->>'graph_of' AS graph_of FROM dwarf.run('regress_dwarf_gn_crew.shared', '{}');
-- her own comes first
SELECT dwarf.define('shared', '{"tasks": {"T": "gn.alice_task"}}') AS alice_shared;
SELECT status, state->>'graph_of' AS graph_of FROM dwarf.run('shared', '{}');
-- define always makes the caller's own graph: a new version of team's
-- graph is defined as team
SELECT dwarf.define('team_only', '{"tasks": {"T": "gn.alice_task"}}') AS alice_team_only;
SET ROLE regress_dwarf_gn_team;
SELECT dwarf.define('team_only', '{"tasks": {"T": "gn.team_task"}}') AS team_only_v2;
RESET ROLE;
SELECT owner, name, version FROM dwarf.graph WHERE name IN ('shared', 'team_only')
 ORDER BY name, owner::text, version;

----------------------------------------------------------------------
-- 4. continue and list: by the flow's own graph
----------------------------------------------------------------------
SET ROLE regress_dwarf_gn_alice;
-- continue takes the latest version of the flow's own graph
SELECT flow_id AS first FROM dwarf.run('checkout', '{}') \gset
SELECT dwarf.continue(:first, '{}') AS next \gset
SELECT status, state->>'graph_of' AS graph_of FROM dwarf.await(:next, '30 s');
SELECT graph, count(*) FROM dwarf.list(graph => 'checkout') GROUP BY graph;
SELECT graph, count(*) FROM dwarf.list(graph => 'regress_dwarf_gn_mallory.tools') GROUP BY graph;
SELECT count(*) AS mallory_checkout_flows FROM dwarf.list(graph => 'regress_dwarf_gn_mallory.checkout');
RESET ROLE;

----------------------------------------------------------------------
-- 5. Names that look like other names are refused at define
----------------------------------------------------------------------
CREATE FUNCTION gn.try_define(name text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	RETURN 'version ' || dwarf.define(name, '{"tasks": {"T": "gn.alice_task"}}');
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SET ROLE regress_dwarf_gn_alice;
SELECT n, gn.try_define(name) AS define FROM (VALUES
	(1, U&'\0441heckout'),				-- Cyrillic с, then Latin
	(2, U&'p\03B1yments'),				-- Greek α among Latin
	(3, U&'\0437\0430\043A\03B1\0437'),	-- Cyrillic with a Greek α
	(4, U&'check\200Bout'),				-- zero-width space
	(5, U&'check\200Dout'),				-- zero-width joiner between letters
	(6, U&'\202Etuokcehc'),				-- right-to-left override
	(7, U&'check\2066out\2069'),		-- bidi isolate
	(8, U&'check\00ADout'),				-- soft hyphen
	(9, U&'check\FEFFout'),				-- zero-width no-break space
	(10, U&'check\00A0out'),			-- no-break space
	(11, U&'check\2009out'),			-- thin space
	(12, U&'check\3164out'),			-- Hangul filler: an invisible letter
	(13, U&'check\FE0Fout'),			-- variation selector after a letter
	(14, U&'check\E000out'),			-- private use
	(15, U&'check\2029out')				-- paragraph separator
) v(n, name) ORDER BY n;
\set VERBOSITY default
SELECT dwarf.define(U&'\0441heckout', '{"tasks": {"T": "gn.alice_task"}}');
SELECT dwarf.define(U&'check\200Bout', '{"tasks": {"T": "gn.alice_task"}}');
\set VERBOSITY terse
-- names in one script, plain ASCII, emoji sequences: defined and run
RESET ROLE;
CREATE TABLE gn.good (n int, name text);
GRANT SELECT ON gn.good TO PUBLIC;
INSERT INTO gn.good VALUES
	(1, '注文処理'),
	(2, 'заказ'),
	(3, 'παραγγελία'),
	(4, 'ship-v2.0:eu/west 1_x'),
	(5, 'café_Grüße'),
	(6, '日本の checkout'),
	(7, 'заказ-2 / 注文'),
	(8, U&'\+01F469\200D\+01F4BB'),		-- woman technologist (a ZWJ sequence)
	(9, U&'\2764\FE0F order'),			-- heavy black heart, emoji style
	(10, U&'\+01F3F3\FE0F\200D\+01F308');	-- rainbow flag
SET ROLE regress_dwarf_gn_alice;
SELECT n, name, gn.try_define(name) AS define FROM gn.good ORDER BY n;
SELECT n, o.status, o.state->>'graph_of' AS graph_of
  FROM gn.good, LATERAL dwarf.run(name, '{}') o ORDER BY n;
-- a name is stored in NFC: the decomposed spelling defines and finds the same graph
SELECT gn.try_define(U&'cafe\0301') AS decomposed, gn.try_define(U&'caf\00E9') AS composed;
SELECT name = U&'caf\00E9' AS stored_nfc, octet_length(name) AS bytes, version FROM dwarf.graph
 WHERE owner = 'regress_dwarf_gn_alice'::regrole AND name IN (U&'caf\00E9', U&'cafe\0301') ORDER BY version;
SELECT status, state->>'graph_of' AS graph_of FROM dwarf.run(U&'cafe\0301', '{}');
RESET ROLE;
-- refused names were not stored
SELECT count(*) AS stored_refused FROM dwarf.graph
 WHERE name ~ U&'[\0441\03B1\200B\200D\202E\2066\00AD\FEFF\00A0\2009\3164\E000\2029]'
   AND name NOT IN (U&'\+01F469\200D\+01F4BB', U&'\+01F3F3\FE0F\200D\+01F308', 'παραγγελία');

-- clean up, so that the file can run again
SELECT count(dwarf.delete(f.id)) >= 0 AS deleted FROM dwarf.flow f
 WHERE f.owner IN ('regress_dwarf_gn_alice'::regrole, 'regress_dwarf_gn_mallory'::regrole)
   AND f.parent_id IS NULL;
DELETE FROM dwarf.graph WHERE owner IN ('regress_dwarf_gn_alice'::regrole, 'regress_dwarf_gn_mallory'::regrole,
	'regress_dwarf_gn_team'::regrole, 'regress_dwarf_gn_crew'::regrole);
DROP SCHEMA gn CASCADE;
DROP OWNED BY regress_dwarf_gn_alice, regress_dwarf_gn_mallory, regress_dwarf_gn_team, regress_dwarf_gn_crew;
DROP ROLE regress_dwarf_gn_alice, regress_dwarf_gn_mallory, regress_dwarf_gn_team, regress_dwarf_gn_crew;
