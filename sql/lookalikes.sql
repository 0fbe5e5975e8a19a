--
-- lookalikes: no code a role controls through names runs with another
-- role's rights.
--
-- 1. mallory plants look-alikes of the functions, aggregates and operators
--    that dwarf's C code and SQL functions use, in her schema mal, first on
--    her search_path (before pg_catalog).  Each logs who ran it, then returns
--    what the real one would.  She drives every dwarf function and every
--    kind of step; her tasks call the look-alikes themselves (as mallory: that
--    is allowed), and some set a mal-first search_path for the whole worker
--    session.  No look-alike may ever run as anyone but mallory: not as the
--    extension's owner (client backends), not as the workers' superuser, not
--    as the roles whose tasks run in the same worker after hers.
-- 2. A task may not call a function in a schema its flow's owner has no USAGE
--    on, by any path: define, a run of another role's graph, fork, continue,
--    subgraph, a task calling it, nor after a role with USAGE ran it first or
--    after USAGE is revoked.
--
-- Not shadowable, so not planted: coalesce, greatest, least, nullif and
-- extract are syntax (extract becomes pg_catalog.extract), and casts
-- (::int, ::regrole, ...) are found in pg_cast by type, not by name; CREATE
-- CAST needs ownership of a type (checked below).  jsonb_build_object(VARIADIC
-- "any") cannot be declared in SQL or PL/pgSQL: mal has its zero-argument
-- form and a (text, jsonb) form, which wins for calls with those types.
--
\set VERBOSITY terse
CREATE ROLE regress_dwarf_mallory NOLOGIN;
CREATE ROLE regress_dwarf_victim NOLOGIN;
GRANT USAGE ON SCHEMA dwarf TO regress_dwarf_mallory, regress_dwarf_victim;
CREATE SCHEMA mal AUTHORIZATION regress_dwarf_mallory;

-- Helpers anyone may use, owned by the superuser.
CREATE SCHEMA la;
GRANT USAGE ON SCHEMA la TO PUBLIC;
-- Runs a statement; returns 'ok' or its error, with flow and step ids masked.
CREATE FUNCTION la.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '(flow|step) -?\d+', '\1 N', 'g');
END $$;
CREATE FUNCTION la.mask(t text) RETURNS text LANGUAGE sql IMMUTABLE AS
$$ SELECT regexp_replace(t, 'flow -?\d+', 'flow N', 'g') $$;
-- A task of any role that names everything without a schema: were mallory's
-- search_path left in a worker, it would call her look-alikes as that role.
CREATE FUNCTION la.plain(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN jsonb_build_object('plain',
		clock_timestamp() >= now() - interval '1 day'
		AND hashtext('x') = hashtext('x')
		AND jsonb_typeof(s) = 'object'
		AND jsonb_path_match(s, '$.type() == "object"')
		AND s @@ '$.type() == "object"'
		AND (s || '{"z": {"y": "1"}}') -> 'z' ->> 'y' = '1'
		AND s @> '{}' AND s ? 'n' AND s = s
		AND int4(7::bigint) = 7 AND 6::bigint < 7::bigint
		AND 'A' || 'b' ILIKE 'ab'
		AND (SELECT count(*) FROM jsonb_object_keys(s)) > 0
		AND (SELECT max(x) FROM (VALUES (1), (2)) v(x)) = 2
		AND replace('ab', 'b', 'c') = 'ac'
		AND array_length(ARRAY[1, 2], 1) = 2
		AND jsonb_build_object() = '{}'::jsonb
		AND pg_has_role(current_user::regrole::oid, 'USAGE'));
END $$;
CREATE FUNCTION la.gate(s jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{"gate": true}'::jsonb $$;

----------------------------------------------------------------------
-- 1. Look-alikes
----------------------------------------------------------------------

SET ROLE regress_dwarf_mallory;
SET search_path = mal, public, pg_catalog;
GRANT USAGE ON SCHEMA mal TO PUBLIC;
-- pid: the process it ran in (this session's, or a worker's)
CREATE TABLE mal.calls (fn text, ran_as text, session_as text, pid int);
GRANT INSERT ON mal.calls TO PUBLIC;
CREATE SEQUENCE mal.seq;
CREATE FUNCTION mal.log(fn text) RETURNS void LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp AS $$
BEGIN
	INSERT INTO mal.calls
	VALUES (fn, current_user, session_user, pg_backend_pid());
END $$;

-- Functions: each logs, then returns what the pg_catalog one returns.
CREATE FUNCTION mal.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('clock_timestamp()'); RETURN pg_catalog.clock_timestamp(); END $$;
CREATE FUNCTION mal.now() RETURNS timestamptz LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('now()'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION mal.hashtext(t text) RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('hashtext(text)'); RETURN pg_catalog.hashtext(t); END $$;
CREATE FUNCTION mal.nextval(r regclass) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('nextval(regclass)'); RETURN pg_catalog.nextval(r); END $$;
CREATE FUNCTION mal.jsonb_build_object() RETURNS jsonb LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('jsonb_build_object()'); RETURN pg_catalog.jsonb_build_object(); END $$;
CREATE FUNCTION mal.jsonb_build_object(k text, v jsonb) RETURNS jsonb LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('jsonb_build_object(text,jsonb)'); RETURN pg_catalog.jsonb_build_object(k, v); END $$;
CREATE FUNCTION mal.jsonb_path_match(target jsonb, path jsonpath, vars jsonb DEFAULT '{}', silent boolean DEFAULT false)
	RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('jsonb_path_match(jsonb,jsonpath,jsonb,boolean)');
		RETURN pg_catalog.jsonb_path_match(target, path, vars, silent); END $$;
CREATE FUNCTION mal.jsonb_typeof(j jsonb) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('jsonb_typeof(jsonb)'); RETURN pg_catalog.jsonb_typeof(j); END $$;
CREATE FUNCTION mal.jsonb_object_keys(j jsonb) RETURNS SETOF text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('jsonb_object_keys(jsonb)'); RETURN QUERY SELECT pg_catalog.jsonb_object_keys(j); END $$;
CREATE FUNCTION mal.int4(i bigint) RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('int4(bigint)'); RETURN pg_catalog.int4(i); END $$;
CREATE FUNCTION mal.replace(a text, b text, c text) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('replace(text,text,text)'); RETURN pg_catalog.replace(a, b, c); END $$;
CREATE FUNCTION mal.array_length(a anyarray, d int) RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('array_length(anyarray,integer)'); RETURN pg_catalog.array_length(a, d); END $$;
CREATE FUNCTION mal.pg_has_role(r oid, o oid, p text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('pg_has_role(oid,oid,text)'); RETURN pg_catalog.pg_has_role(r, o, p); END $$;
CREATE FUNCTION mal.pg_has_role(o oid, p text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('pg_has_role(oid,text)'); RETURN pg_catalog.pg_has_role(o, p); END $$;
CREATE FUNCTION mal.pg_advisory_xact_lock(a int, b int) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('pg_advisory_xact_lock(integer,integer)'); PERFORM pg_catalog.pg_advisory_xact_lock(a, b); END $$;

-- Aggregates: max(integer) and count(*), logging from the final function
-- (which runs even over no rows).
CREATE FUNCTION mal.max_step(m int, x int) RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN RETURN CASE WHEN m IS NULL OR x > m THEN x ELSE m END; END $$;
CREATE FUNCTION mal.max_final(m int) RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('max(integer)'); RETURN m; END $$;
CREATE AGGREGATE mal.max(int) (SFUNC = mal.max_step, STYPE = int, FINALFUNC = mal.max_final);
CREATE FUNCTION mal.count_step(n bigint) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN RETURN n + 1; END $$;
CREATE FUNCTION mal.count_final(n bigint) RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('count(*)'); RETURN n; END $$;
CREATE AGGREGATE mal.count(*) (SFUNC = mal.count_step, STYPE = bigint, INITCOND = '0', FINALFUNC = mal.count_final);

-- Operators: each function logs, then calls the pg_catalog implementation.
CREATE FUNCTION mal.op_eq_int8(a bigint, b bigint) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('=(bigint,bigint)'); RETURN pg_catalog.int8eq(a, b); END $$;
CREATE OPERATOR mal.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = mal.op_eq_int8);
CREATE FUNCTION mal.op_eq_int4(a int, b int) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('=(integer,integer)'); RETURN pg_catalog.int4eq(a, b); END $$;
CREATE OPERATOR mal.= (LEFTARG = int, RIGHTARG = int, FUNCTION = mal.op_eq_int4);
CREATE FUNCTION mal.op_eq_text(a text, b text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('=(text,text)'); RETURN pg_catalog.texteq(a, b); END $$;
CREATE OPERATOR mal.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.op_eq_text);
CREATE FUNCTION mal.op_eq_jsonb(a jsonb, b jsonb) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('=(jsonb,jsonb)'); RETURN pg_catalog.jsonb_eq(a, b); END $$;
CREATE OPERATOR mal.= (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = mal.op_eq_jsonb);
CREATE FUNCTION mal.op_lt_int8(a bigint, b bigint) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('<(bigint,bigint)'); RETURN pg_catalog.int8lt(a, b); END $$;
CREATE OPERATOR mal.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = mal.op_lt_int8);
CREATE FUNCTION mal.op_cat_text(a text, b text) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('||(text,text)'); RETURN pg_catalog.textcat(a, b); END $$;
CREATE OPERATOR mal.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.op_cat_text);
CREATE FUNCTION mal.op_cat_jsonb(a jsonb, b jsonb) RETURNS jsonb LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('||(jsonb,jsonb)'); RETURN pg_catalog.jsonb_concat(a, b); END $$;
CREATE OPERATOR mal.|| (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = mal.op_cat_jsonb);
CREATE FUNCTION mal.op_field_text(a jsonb, k text) RETURNS text LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('->>(jsonb,text)'); RETURN pg_catalog.jsonb_object_field_text(a, k); END $$;
CREATE OPERATOR mal.->> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = mal.op_field_text);
CREATE FUNCTION mal.op_field(a jsonb, k text) RETURNS jsonb LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('->(jsonb,text)'); RETURN pg_catalog.jsonb_object_field(a, k); END $$;
CREATE OPERATOR mal.-> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = mal.op_field);
CREATE FUNCTION mal.op_contains(a jsonb, b jsonb) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('@>(jsonb,jsonb)'); RETURN pg_catalog.jsonb_contains(a, b); END $$;
CREATE OPERATOR mal.@> (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = mal.op_contains);
CREATE FUNCTION mal.op_exists(a jsonb, k text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('?(jsonb,text)'); RETURN pg_catalog.jsonb_exists(a, k); END $$;
CREATE OPERATOR mal.? (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = mal.op_exists);
CREATE FUNCTION mal.op_path_match(a jsonb, p jsonpath) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('@@(jsonb,jsonpath)'); RETURN pg_catalog.jsonb_path_match_opr(a, p); END $$;
CREATE OPERATOR mal.@@ (LEFTARG = jsonb, RIGHTARG = jsonpath, FUNCTION = mal.op_path_match);
CREATE FUNCTION mal.op_ts_minus(a timestamptz, b interval) RETURNS timestamptz LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('-(timestamptz,interval)'); RETURN pg_catalog.timestamptz_mi_interval(a, b); END $$;
CREATE OPERATOR mal.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = mal.op_ts_minus);
CREATE FUNCTION mal.op_ilike(a text, b text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
	AS $$ BEGIN PERFORM mal.log('~~*(text,text)'); RETURN pg_catalog.texticlike(a, b); END $$;
CREATE OPERATOR mal.~~* (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.op_ilike);

-- Casts are not hers to plant.
SELECT la.try('CREATE CAST (text AS int) WITH INOUT') AS create_cast;

-- Calls every look-alike once, by its plain name.
CREATE FUNCTION mal.touch(s jsonb) RETURNS boolean LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE ok boolean;
BEGIN
	ok := clock_timestamp() >= now() - interval '1 day'
		AND hashtext('x') = hashtext('x')
		AND nextval('mal.seq') > 0
		AND jsonb_build_object() = '{}'::jsonb
		AND jsonb_build_object('s', s) ? 's'
		AND jsonb_path_match(s, '$.type() == "object"')
		AND s @@ '$.type() == "object"'
		AND jsonb_typeof(s) = 'object'
		AND int4(7::bigint) = 7
		AND 7::bigint = 7::bigint AND 6::bigint < 7::bigint
		AND (s || '{"z": {"y": "1"}}') -> 'z' ->> 'y' = '1'
		AND s @> '{}'
		AND 'ab' = 'a'::text || 'b'
		AND 'AB' ILIKE 'ab'
		AND pg_has_role(current_user::regrole::oid, current_user::regrole::oid, 'USAGE')
		AND pg_has_role(current_user::regrole::oid, 'USAGE')
		AND replace('ab', 'b', 'c') = 'ac'
		AND array_length(ARRAY[1, 2], 1) = 2
		AND (SELECT count(*) FROM jsonb_object_keys('{"a": 1}')) = 1
		AND (SELECT max(x) FROM (VALUES (1), (2)) v(x)) = 2;
	PERFORM pg_advisory_xact_lock(pg_backend_pid(), 0);
	RETURN ok;
END $$;
SELECT mal.touch('{}') AS touched;
SELECT count(DISTINCT fn) AS lookalikes, bool_and(ran_as = 'regress_dwarf_mallory') AS as_mallory
  FROM mal.calls;

----------------------------------------------------------------------
-- mallory's tasks: they name everything plainly, under her search_path
----------------------------------------------------------------------

CREATE FUNCTION mal.t_start(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	PERFORM mal.clock_timestamp();		-- by its full name, whatever the path
	RETURN jsonb_build_object('touched', mal.touch(s), 'bag', dwarf.baggage(),
		'key_ok', dwarf.step_key() LIKE '%-Start', 'id_ok', dwarf.flow_id() IS NOT NULL,
		'items', '[1, 2, 3]'::jsonb, 'log', 'start');
END $$;
CREATE FUNCTION mal.t_log(s jsonb, what text, total int DEFAULT NULL) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	RETURN jsonb_build_object('log', what, 'total', total, 'touched', mal.touch(s));
END $$;
CREATE FUNCTION mal.t_big(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'big') $$;
CREATE FUNCTION mal.t_small(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'small') $$;
CREATE FUNCTION mal.t_left(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'left', 1) $$;
CREATE FUNCTION mal.t_right(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'right', 2) $$;
CREATE FUNCTION mal.t_join(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'join') $$;
CREATE FUNCTION mal.t_each(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'each', int4((s ->> 'it')::bigint)) $$;
CREATE FUNCTION mal.t_gather(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT mal.t_log(s, 'gather') $$;
CREATE FUNCTION mal.t_flaky(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	IF coalesce((s ->> 'tries')::int, 0) < 1 THEN
		IF dwarf.retry('10 ms', 1, '10 ms') THEN
			RETURN jsonb_build_object('tries', to_jsonb(1));
		END IF;
		RAISE EXCEPTION 'flaky gave up';
	END IF;
	RETURN mal.t_log(s, 'flaky');
END $$;
CREATE FUNCTION mal.t_boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	PERFORM mal.touch(s);
	RAISE EXCEPTION 'boom from mallory';
END $$;
CREATE FUNCTION mal.t_fix(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	RETURN mal.t_log(s, 'fix') || jsonb_build_object('fixed', s -> 'onErr' -> 'message');
END $$;
CREATE FUNCTION mal.t_loop(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE n int := coalesce((s ->> 'loops')::int, 0) + 1;
BEGIN
	IF n < 3 THEN
		PERFORM dwarf.goto('Loop');
	END IF;
	RETURN jsonb_build_object('loops', to_jsonb(n)) || jsonb_build_object('touched', to_jsonb(mal.touch(s)));
END $$;
CREATE FUNCTION mal.t_nap(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	PERFORM dwarf.sleep('10 ms');
	RETURN mal.t_log(s, 'nap');
END $$;
CREATE FUNCTION mal.t_ask(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE d jsonb := dwarf.interrupt(jsonb_build_object('ask', to_jsonb('approve?'::text)));
BEGIN
	PERFORM mal.touch(s);
	IF d IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN jsonb_build_object('answer', d);
END $$;
CREATE FUNCTION mal.t_kid(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT jsonb_build_object('kid', to_jsonb(mal.touch(s))) $$;
CREATE FUNCTION mal.t_call(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE r jsonb := dwarf.subgraph('la_child', '{"from": "parent"}');
BEGIN
	IF r IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN jsonb_build_object('child', r);
END $$;
CREATE FUNCTION mal.t_call_wait(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE r jsonb := dwarf.subgraph('la_wait', '{}');
BEGIN
	IF r IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN jsonb_build_object('child', r);
END $$;
CREATE FUNCTION mal.t_handle(s jsonb) RETURNS jsonb LANGUAGE sql
	SET search_path = mal, public, pg_catalog AS $$ SELECT jsonb_build_object('handled', s -> 'onErr' -> 'message') $$;
CREATE FUNCTION mal.t_zz(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	PERFORM dwarf.sleep('1 hour');
	RETURN mal.t_log(s, 'zz');
END $$;
-- From inside a task: dwarf.define and dwarf.create, which act as the
-- extension's owner, under her search_path in the worker.
CREATE FUNCTION mal.t_nest(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	PERFORM dwarf.define('la_nested', '{"tasks": {"K": "t_kid"}}');
	RETURN jsonb_build_object('created',
		to_jsonb(dwarf.create('la_nested', '{"from": "task"}', idempotency_key => 'la-nested') > 0));
END $$;
-- A task runs in a worker whose session user is a superuser: it must not be
-- able to become that user (then it would run her look-alikes as it).
CREATE FUNCTION mal.t_escape(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	r jsonb := '{}';
	t record;
BEGIN
	FOR t IN SELECT * FROM (VALUES
		('1 set role', pg_catalog.format('SET ROLE %I', session_user)),
		('2 reset role', 'RESET ROLE'),
		('3 set session authorization', pg_catalog.format('SET SESSION AUTHORIZATION %I', session_user)),
		('4 set_config role', pg_catalog.format('SELECT pg_catalog.set_config(%L, %L, false)', 'role', session_user)),
		('5 create temp table', 'CREATE TEMP TABLE mal_tmp (x int)')) v(label, stmt)
	LOOP
		BEGIN
			EXECUTE t.stmt;
			PERFORM mal.touch(s);		-- as whoever it became
			r := r OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(t.label,
				'escaped: ' OPERATOR(pg_catalog.||) current_user);
		EXCEPTION WHEN OTHERS THEN
			r := r OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(t.label, SQLERRM);
		END;
	END LOOP;
	RETURN pg_catalog.jsonb_build_object('tried', r, 'still', current_user);
END $$;
-- Tasks that leave her search_path set for the whole worker session, with
-- set_config and with SET (none has a SET clause of its own), and return,
-- raise, or run past their time budget.
CREATE FUNCTION mal.t_leak(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.set_config('search_path', 'mal, public, pg_catalog', false);
	RETURN pg_catalog.jsonb_build_object('leaky', mal.touch(s));
END $$;
CREATE FUNCTION mal.t_leak_boom(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.set_config('search_path', 'mal, public, pg_catalog', false);
	PERFORM mal.touch(s);
	RAISE EXCEPTION 'leaky boom';
END $$;
CREATE FUNCTION mal.t_slow(s jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	SET search_path = mal, public, pg_catalog;
	PERFORM pg_catalog.pg_sleep(0.3);
	RETURN pg_catalog.jsonb_build_object('slow', mal.touch(s));
END $$;

----------------------------------------------------------------------
-- mallory drives every dwarf function, under her search_path
----------------------------------------------------------------------

SELECT dwarf.validate('{"tasks": {"A": "t_kid"}}') ->> 'entry' AS validated_entry,
	   dwarf.validate('{"tasks": {"A": "t_kid"}}') -> 'tasks' ->> 'A' AS validated_task;
SELECT dwarf.define('la_child', '{"tasks": {"Kid": "t_kid"}}') AS child_v1;
SELECT dwarf.define('la_child', '{"tasks": {"Kid": "mal.t_kid"}}') AS child_v2;
SELECT dwarf.define('la_main', '{
  "tasks": {"Start": "t_start", "Big": "t_big", "Small": "t_small",
            "Left": "t_left", "Right": "t_right", "Join": "t_join",
            "Each": "t_each", "Gather": "t_gather", "Flaky": "t_flaky",
            "Boom": "t_boom", "Fix": "t_fix", "Loop": "t_loop", "Nap": "t_nap"},
  "transitions": [
    {"from": "Start", "to": "Big", "when": "$.n > 1"},
    {"from": "Start", "to": "Small", "when": "$.n <= 1"},
    {"from": "Big", "to": ["Left", "Right"]},
    {"from": "Left", "to": "Join"},
    {"from": "Right", "to": "Join"},
    {"from": "Join", "to": "Each", "for_each": "items", "as": "it"},
    {"from": "Each", "to": "Gather"},
    {"from": "Gather", "to": "Flaky", "switch": "$.total >= 6"},
    {"from": "Gather", "to": "Small", "switch": "$.total < 6"},
    {"from": "Flaky", "to": "Boom"},
    {"from": "Boom", "to": "Fix", "on_error": true},
    {"from": "Fix", "to": "Loop"},
    {"from": "Loop", "to": "Loop", "goto": true},
    {"from": "Loop", "to": "Nap"},
    {"chain": ["Nap", "END"]}],
  "fan_in": ["Join", "Gather"],
  "reducers": {"log": "append", "total": "add"}}') AS main_v1;
SELECT dwarf.define('la_wait', '{"tasks": {"Ask": "t_ask"}}') AS wait_v1;
SELECT dwarf.define('la_parent', '{"tasks": {"Call": "t_call"}}') AS parent_v1;
SELECT dwarf.define('la_parent_wait', '{"tasks": {"CallWait": "t_call_wait"}}') AS parent_wait_v1;
SELECT dwarf.define('la_zz', '{"tasks": {"Zz": "t_zz", "After": "t_kid"},
  "transitions": [{"from": "Zz", "to": "After"}]}') AS zz_v1;
SELECT dwarf.define('la_nest', '{"tasks": {"N": "t_nest"}}') AS nest_v1;
SELECT dwarf.define('la_leak', '{"tasks": {"Leak1": "t_leak", "Leak2": "t_leak"},
  "transitions": [{"chain": ["Leak1", "Leak2", "END"]}]}') AS leak_v1;
SELECT dwarf.define('la_leak_err', '{"tasks": {"L": "t_leak_boom", "H": "t_handle"},
  "transitions": [{"from": "L", "to": "H", "on_error": true}]}') AS leak_err_v1;
SELECT dwarf.define('la_escape', '{"tasks": {"E": "t_escape"}}') AS escape_v1;
SELECT dwarf.define('la_slow', '{"tasks": {"S1": "t_slow", "S2": "t_slow", "S3": "t_slow"},
  "transitions": [{"chain": ["S1", "S2", "S3", "END"]}]}') AS slow_v1;
SELECT name, version, definition -> 'tasks' AS tasks FROM dwarf.graph
 WHERE name IN ('la_child', 'la_wait') ORDER BY name, version;

-- run, with every option
SELECT status, error, state -> 'log' AS log, state -> 'total' AS total,
	   state -> 'loops' AS loops, state -> 'fixed' AS fixed, state -> 'bag' AS bag,
	   state -> 'touched' AS touched, state -> 'key_ok' AS key_ok, state -> 'id_ok' AS id_ok
  FROM dwarf.run('la_main', '{"n": 2}', timeout => '30 s', priority => 1,
				 idempotency_key => 'la-main-1', fairness_key => 'tenant-a',
				 fairness_weight => 3, time_budget => '20 s', delete_on_completion => false,
				 baggage => '{"b": 1}', thread => 'la-t1');
-- create, with every option; the same idempotency key gives the same flow
SELECT dwarf.create('la_main', '{"n": 2}', priority => 2, idempotency_key => 'la-main-2',
					fairness_key => 'tenant-b', fairness_weight => 2, time_budget => '20 s',
					delete_on_completion => false, baggage => '{"b": 2}', thread => 'la-t2') AS main_id \gset
SELECT dwarf.create('la_main', '{"n": 2}', idempotency_key => 'la-main-2') = :main_id AS same_flow;
SELECT status, error, state -> 'log' AS log, state -> 'total' AS total, state -> 'bag' AS bag
  FROM dwarf.await(:main_id, '30 s');
-- fire and forget
SELECT status, state IS NULL AS no_state FROM dwarf.run('la_child', '{}', delete_on_completion => true);
-- reading: snapshot, history (of one task too), state_at, list, history_mermaid, stats
SELECT graph, version, status, steps FROM dwarf.snapshot(:main_id);
SELECT task, status, count(*) FROM dwarf.history(:main_id) GROUP BY 1, 2 ORDER BY 1, 2;
SELECT status, attempt, error, changes FROM dwarf.history(:main_id) WHERE task = 'Flaky' ORDER BY step_id;
SELECT dwarf.state_at(:main_id) -> 'total' AS total_at_end,
	   dwarf.state_at(:main_id, (SELECT min(step_id) FROM dwarf.history(:main_id) WHERE task = 'Join')) -> 'total' AS total_before_join;
SELECT count(*) AS listed FROM dwarf.list(graph => 'la_main', status => 'completed',
	since => now() - interval '1 hour', until => clock_timestamp() + interval '1 hour',
	thread => 'la-t2', error_like => NULL, page_size => 10);
SELECT flow_id AS first_id FROM dwarf.list(graph => 'la_main', page_size => 1) \gset
SELECT :first_id = :main_id AS newest_first,
	   (SELECT count(*) FROM dwarf.list(graph => 'la_main', before => :first_id)) AS next_page;
SELECT dwarf.history_mermaid(:main_id) LIKE 'flowchart TD%' AS mermaid,
	   length(dwarf.history_mermaid(:main_id)) > 100 AS mermaid_has_nodes;
SELECT completed > 0 AS some_completed, steps_done > 0 AS some_steps FROM dwarf.stats;
SELECT count(*) > 0 AS workers FROM dwarf.worker_stats();
-- interrupt, then resume
SELECT flow_id AS wait_id FROM dwarf.run('la_wait', '{}') \gset
SELECT status, interrupt_payload FROM dwarf.await(:wait_id, '30 s');
SELECT dwarf.resume(:wait_id, '{"ok": true}');
SELECT status, state -> 'answer' AS answer FROM dwarf.await(:wait_id, '30 s');
-- subgraph
SELECT status, error, state -> 'child' AS child FROM dwarf.run('la_parent', '{}');
-- a child's interrupt surfaces at its parent; resuming the parent resumes it
SELECT flow_id AS pw_id, status AS pw_status, interrupt_payload AS pw_payload
  FROM dwarf.run('la_parent_wait', '{}') \gset
SELECT :'pw_status' AS status, :'pw_payload' AS interrupt_payload;
SELECT dwarf.resume(:pw_id, '{"ok": 2}');
SELECT status, state -> 'child' -> 'answer' AS answer FROM dwarf.await(:pw_id, '30 s');
-- cancel a sleeping flow
SELECT dwarf.create('la_zz', '{}') AS zz_id \gset
SELECT dwarf.cancel(:zz_id, 'by mallory');
SELECT status, cancel_reason FROM dwarf.await(:zz_id, '30 s');
-- fork from a step, continue a thread, delete
SELECT step_id AS nap_step FROM dwarf.history(:main_id) WHERE task = 'Nap' \gset
SELECT dwarf.fork(:nap_step, '{"forked": true}') AS fork_id \gset
SELECT status, state -> 'forked' AS forked, state -> 'loops' AS loops FROM dwarf.await(:fork_id, '30 s');
SELECT dwarf.continue(:main_id, '{"n": 0, "again": true}') AS cont_id \gset
SELECT status, state -> 'again' AS again, state -> 'log' -> -1 AS last_log FROM dwarf.await(:cont_id, '30 s');
SELECT count(*) AS in_thread FROM dwarf.list(thread => 'la-t2');
SELECT dwarf.delete(:cont_id);
SELECT count(*) AS in_thread_after_delete FROM dwarf.list(thread => 'la-t2');
-- dwarf.define and dwarf.create called from a task
SELECT status, error, state -> 'created' AS created FROM dwarf.run('la_nest', '{}');
SELECT flow_id AS nested_id FROM dwarf.list(graph => 'la_nested') \gset
SELECT status, state -> 'kid' AS kid FROM dwarf.await(:nested_id, '30 s');
-- a task cannot take the worker's superuser identity
SELECT r.status, r.state ->> 'still' AS still, t.key AS tried, t.value AS outcome
  FROM dwarf.run('la_escape', '{}') r LEFT JOIN LATERAL jsonb_each_text(r.state -> 'tried') t ON true
 ORDER BY t.key;
-- tasks that leave her search_path in the worker session: four flows, so
-- that each worker runs some; and a slow task (its later steps run in
-- runners, when there are any)
BEGIN;
CREATE TEMP TABLE leak_ids AS
	SELECT dwarf.create('la_leak', '{}') AS id FROM generate_series(1, 4);
COMMIT;
SELECT o.status, count(*) FROM leak_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1;
SELECT status, state FROM dwarf.run('la_slow', '{}');
SELECT status, state FROM dwarf.run('la_slow', '{}');
SELECT status, error FROM dwarf.run('la_slow', '{}', time_budget => '100 ms');
BEGIN;
CREATE TEMP TABLE leak_err_ids AS
	SELECT dwarf.create('la_leak_err', '{}') AS id FROM generate_series(1, 4);
COMMIT;
SELECT o.status, o.state -> 'handled' AS handled, count(*)
  FROM leak_err_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
RESET search_path;
RESET ROLE;

-- The next tasks in those workers, of other roles, name everything plainly:
-- they must find pg_catalog's functions, not mallory's.
SELECT dwarf.define('la_plain', '{"tasks": {"P1": "la.plain", "P2": "la.plain"},
  "transitions": [{"chain": ["P1", "P2", "END"]}]}') AS plain_v1;
SELECT pg_catalog.quote_ident(current_user) || '.la_plain' AS la_plain \gset
SET ROLE regress_dwarf_victim;
BEGIN;
CREATE TEMP TABLE plain_ids AS
	SELECT dwarf.create(:'la_plain', '{"n": 1}') AS id FROM generate_series(1, 4);
COMMIT;
SELECT o.status, o.state, count(*) FROM plain_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
DROP TABLE plain_ids;
RESET ROLE;
BEGIN;
CREATE TEMP TABLE plain_ids AS
	SELECT dwarf.create('la_plain', '{"n": 1}') AS id FROM generate_series(1, 4);
COMMIT;
SELECT o.status, o.state, count(*) FROM plain_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
DROP TABLE plain_ids;

----------------------------------------------------------------------
-- 2. A schema mallory has no USAGE on
----------------------------------------------------------------------

CREATE SCHEMA b AUTHORIZATION regress_dwarf_victim;
SET ROLE regress_dwarf_victim;
CREATE TABLE b.secret_log (ran_as text, flow_id bigint);
CREATE FUNCTION b.secret(s jsonb) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER
	SET search_path = pg_catalog, pg_temp AS $$
DECLARE fid bigint;
BEGIN
	BEGIN
		fid := dwarf.flow_id();
	EXCEPTION WHEN OTHERS THEN
		fid := NULL;
	END;
	INSERT INTO b.secret_log VALUES (current_user, fid);
	RETURN '{"secret": "the victim''s"}';
END $$;
GRANT EXECUTE ON FUNCTION b.secret(jsonb) TO PUBLIC;
-- the log works (rolled back)
BEGIN;
SELECT b.secret('{}');
SELECT count(*) AS secret_runs FROM b.secret_log;
ROLLBACK;
-- victim's graph: S runs only when go is true
SELECT dwarf.define('la_vic_secret', '{"tasks": {"Gate": "la.gate", "S": "b.secret"},
  "transitions": [{"from": "Gate", "to": "S", "when": "$.go == true"}]}') AS vic_v1;
SELECT flow_id AS vic_id, status FROM dwarf.run('la_vic_secret', '{"go": false}') \gset
SELECT :'status' AS victim_flow;
SELECT step_id AS vic_step FROM dwarf.history(:vic_id) WHERE task = 'Gate' \gset
RESET ROLE;

SET ROLE regress_dwarf_mallory;
SET search_path = mal, public, pg_catalog;
-- not directly, not in a graph of her own
SELECT la.try('SELECT b.secret(''{}'')') AS direct;
SELECT la.try($$SELECT dwarf.validate('{"tasks": {"S": "b.secret"}}')$$) AS validate;
SELECT la.try($$SELECT dwarf.define('la_mal_secret', '{"tasks": {"S": "b.secret"}}')$$) AS define;
-- not a new version of victim's graph: her define of that name makes a
-- graph of her own, and victim's is untouched
SELECT la.try($$SELECT dwarf.define('la_vic_secret', '{"tasks": {"S": "t_kid"}}')$$) AS define_victims;
SELECT owner, version, definition -> 'tasks' ->> 'S' AS s FROM dwarf.graph
 WHERE name = 'la_vic_secret' ORDER BY owner::text, version;
-- not through a run of victim's graph (anyone may run it, named as
-- role.name, as themselves)
SELECT status, error FROM dwarf.run('regress_dwarf_victim.la_vic_secret', '{"go": true}');
BEGIN;
CREATE TEMP TABLE secret_ids AS
	SELECT dwarf.create('regress_dwarf_victim.la_vic_secret', '{"go": true}') AS id FROM generate_series(1, 2);
COMMIT;
SELECT o.status, o.error, count(*) FROM secret_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
-- not by forking her failed step S, nor by continuing her failed flow
SELECT min(id) AS mine FROM secret_ids \gset
SELECT step_id AS my_s FROM dwarf.history(:mine) WHERE task = 'S' \gset
SELECT dwarf.fork(:my_s, '{}') AS forked_id \gset
SELECT status, error FROM dwarf.await(:forked_id, '30 s');
SELECT dwarf.continue(:mine, '{}') AS cont_secret_id \gset
SELECT status, error FROM dwarf.await(:cont_secret_id, '30 s');
SELECT count(*) AS failed_on_schema_b FROM dwarf.list(graph => 'la_vic_secret', error_like => '%schema b%');
-- not through victim's flow: she cannot see it, fork its steps or continue it
SELECT la.try(format('SELECT dwarf.fork(%s, %L)', :vic_step, '{"go": true}')) AS fork_victims;
SELECT la.try(format('SELECT dwarf.continue(%s, %L)', :vic_id, '{"go": true}')) AS continue_victims;
SELECT la.try(format('SELECT dwarf.resume(%s, %L)', :vic_id, '{"go": true}')) AS resume_victims;
SELECT la.try(format('SELECT dwarf.cancel(%s)', :vic_id)) AS cancel_victims;
SELECT la.try(format('SELECT dwarf.delete(%s)', :vic_id)) AS delete_victims;
SELECT la.try(format('SELECT dwarf.await(%s)', :vic_id)) AS await_victims;
SELECT la.try(format('SELECT dwarf.snapshot(%s)', :vic_id)) AS snapshot_victims;
-- not as a subgraph of her own flow (the error reaches her on_error handler),
-- nor from inside a task of hers
CREATE FUNCTION mal.t_sub(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE r jsonb := dwarf.subgraph('regress_dwarf_victim.la_vic_secret', '{"go": true}');
BEGIN
	IF r IS NULL THEN
		RETURN NULL;
	END IF;
	RETURN jsonb_build_object('got', r);
END $$;
CREATE FUNCTION mal.t_direct(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
BEGIN
	RETURN b.secret(s);
END $$;
CREATE FUNCTION mal.t_dynamic(s jsonb) RETURNS jsonb LANGUAGE plpgsql
	SET search_path = mal, public, pg_catalog AS $$
DECLARE r jsonb;
BEGIN
	EXECUTE 'SELECT b.secret($1)' INTO r USING s;
	RETURN r;
END $$;
SELECT dwarf.define('la_mal_sub', '{"tasks": {"Sub": "t_sub", "Handle": "t_handle"},
  "transitions": [{"from": "Sub", "to": "Handle", "on_error": true}]}') AS sub_v1;
SELECT dwarf.define('la_mal_direct', '{"tasks": {"D": "t_direct"}}') AS direct_v1;
SELECT dwarf.define('la_mal_dynamic', '{"tasks": {"D": "t_dynamic"}}') AS dynamic_v1;
SELECT status, la.mask(error) AS error, la.mask(state ->> 'handled') AS handled FROM dwarf.run('la_mal_sub', '{}');
SELECT status, error FROM dwarf.run('la_mal_direct', '{}');
SELECT status, error FROM dwarf.run('la_mal_dynamic', '{}');
RESET search_path;
RESET ROLE;
-- the secret never ran
SELECT count(*) AS secret_runs FROM b.secret_log;

-- The check is made for each role: victim's runs pass it, mallory's, in the
-- same workers right after, do not.
SET ROLE regress_dwarf_victim;
BEGIN;
CREATE TEMP TABLE vic_ids AS
	SELECT dwarf.create('la_vic_secret', '{"go": true}') AS id FROM generate_series(1, 2);
COMMIT;
SELECT o.status, o.state -> 'secret' AS secret, count(*) FROM vic_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
DROP TABLE vic_ids;
RESET ROLE;
SET ROLE regress_dwarf_mallory;
BEGIN;
CREATE TEMP TABLE again_ids AS
	SELECT dwarf.create('regress_dwarf_victim.la_vic_secret', '{"go": true}') AS id FROM generate_series(1, 2);
COMMIT;
SELECT o.status, o.error, count(*) FROM again_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
DROP TABLE again_ids;
RESET ROLE;
-- Once granted USAGE, mallory's flow may call it (as the function's owner:
-- it is SECURITY DEFINER); once revoked, no longer, in any worker.
SET ROLE regress_dwarf_victim;
GRANT USAGE ON SCHEMA b TO regress_dwarf_mallory;
RESET ROLE;
SET ROLE regress_dwarf_mallory;
BEGIN;
CREATE TEMP TABLE granted_ids AS
	SELECT dwarf.create('regress_dwarf_victim.la_vic_secret', '{"go": true}') AS id FROM generate_series(1, 2);
COMMIT;
SELECT o.status, o.state -> 'secret' AS secret, count(*) FROM granted_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
DROP TABLE granted_ids;
RESET ROLE;
SET ROLE regress_dwarf_victim;
REVOKE USAGE ON SCHEMA b FROM regress_dwarf_mallory;
RESET ROLE;
SET ROLE regress_dwarf_mallory;
BEGIN;
CREATE TEMP TABLE revoked_ids AS
	SELECT dwarf.create('regress_dwarf_victim.la_vic_secret', '{"go": true}') AS id FROM generate_series(1, 2);
COMMIT;
SELECT o.status, o.error, count(*) FROM revoked_ids i, LATERAL dwarf.await(i.id, '30 s') o GROUP BY 1, 2;
DROP TABLE revoked_ids;
RESET ROLE;
-- every run of the secret was by a flow whose owner had USAGE on b then
SELECT f.owner::text AS flow_owner, l.ran_as, count(*)
  FROM b.secret_log l LEFT JOIN dwarf.flow f ON f.id = l.flow_id
 GROUP BY 1, 2 ORDER BY 1, 2;

----------------------------------------------------------------------
-- The verdict on the look-alikes
----------------------------------------------------------------------

-- No look-alike ever ran as anyone but mallory.
SELECT fn, ran_as FROM mal.calls WHERE ran_as <> 'regress_dwarf_mallory' GROUP BY 1, 2 ORDER BY 1, 2;
-- The log works: every look-alike ran, as mallory, in her session and in her
-- tasks in the workers, where t_start calls mal.clock_timestamp() by name.
SELECT CASE WHEN pid = pg_backend_pid() THEN 'her session' ELSE 'her tasks' END AS ran_in,
	   count(DISTINCT fn) AS lookalikes, count(DISTINCT ran_as) AS roles
  FROM mal.calls GROUP BY 1 ORDER BY 1;
SELECT count(*) > 0 AS task_called_clock_timestamp FROM mal.calls
 WHERE fn = 'clock_timestamp()' AND ran_as = 'regress_dwarf_mallory' AND pid <> pg_backend_pid();

-- clean up, so that the file can run again
SELECT count(*) > 0 AS deleted FROM (
	SELECT dwarf.delete(f.id) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE g.name LIKE 'la\_%' AND f.parent_id IS NULL) d;
SELECT count(*) AS flows_left FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
 WHERE g.name LIKE 'la\_%';
DELETE FROM dwarf.graph WHERE name LIKE 'la\_%';
SET client_min_messages = warning;
DROP SCHEMA mal, b, la CASCADE;
RESET client_min_messages;
DROP OWNED BY regress_dwarf_mallory, regress_dwarf_victim;
DROP ROLE regress_dwarf_mallory;
DROP ROLE regress_dwarf_victim;
