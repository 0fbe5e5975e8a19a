/*
 * dwarf_router 0.1: dwarf's SQL API on a router database.
 *
 * Schema dwarf here has the functions, types and view of a dwarf shard, with
 * the same signatures, and PL/Proxy sends each call to the shard that holds
 * its flow: an application moves from one server to several by changing its
 * connection string.  The shards are the partitions of the PL/Proxy SQL/MED
 * cluster dwarf_shards; partition i is the server whose dwarf.shard_id is i,
 * and a flow id carries that number in bits 48 to 62.
 *
 * The layers, from the caller down:
 *   dwarf.*             the API: choose the partition, handle a shard's error
 *   dwarf_router.*_on   PL/Proxy functions: one remote call on one partition
 *                       (or *_on_all: on every partition at once)
 */
\echo Use "CREATE EXTENSION dwarf_router" to load this file. \quit

DO $$
BEGIN
	IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'dwarf') THEN
		RAISE EXCEPTION 'dwarf_router cannot be created in a database that has extension dwarf'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'Both define schema dwarf: a shard''s runs flows, a router''s sends calls to the shards.',
				  HINT = 'Create the router in a database of its own; it may live on the same server as a shard.';
	END IF;
END
$$;

CREATE SCHEMA dwarf_router;
COMMENT ON SCHEMA dwarf_router IS
	'dwarf_router''s routing helpers and PL/Proxy calls behind schema dwarf';

CREATE TYPE dwarf.outcome AS (
	flow_id		bigint,
	status		text,
	state		jsonb,
	error		text,
	interrupt_payload jsonb,
	cancel_reason text,
	error_task	text,
	error_sqlstate text,
	error_detail text,
	error_hint	text
);
COMMENT ON TYPE dwarf.outcome IS 'What dwarf.await, dwarf.await_all, dwarf.await_any and dwarf.run return (as on a shard)';

/*
 * Routing.
 */

/*
 * How many partitions foreign server dwarf_shards lists.  Read at every call
 * (a catalog lookup) rather than cached, so that a partition added with
 * ALTER SERVER routes at once, in every session.
 */
CREATE FUNCTION dwarf_router.partitions() RETURNS int
	LANGUAGE plpgsql STABLE
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	n int;
BEGIN
	SELECT (SELECT count(*) FROM pg_options_to_table(s.srvoptions) o
			 WHERE o.option_name ~ '^p[0-9]+$')
	  INTO n
	  FROM pg_foreign_server s
	 WHERE s.srvname = 'dwarf_shards';
	IF coalesce(n, 0) = 0 THEN
		RAISE EXCEPTION 'dwarf_router has no shards: foreign server dwarf_shards %',
			CASE WHEN n IS NULL THEN 'does not exist' ELSE 'lists no partition' END
			USING ERRCODE = 'undefined_object',
				  HINT = 'CREATE SERVER dwarf_shards FOREIGN DATA WRAPPER plproxy OPTIONS '
						 '(p0 ''host=... dbname=...'', p1 ''...''), where partition i is the server '
						 'whose dwarf.shard_id is i; see "Shards" in dwarf''s README.';
	END IF;
	RETURN n;
END
$$;
COMMENT ON FUNCTION dwarf_router.partitions() IS
	'How many partitions (shards) foreign server dwarf_shards lists';

/*
 * The partition of a flow: the shard number in its id.  Partition numbers
 * are handed to PL/Proxy already reduced (0 <= part < partitions), so that
 * its mapping (a bit mask, or a modulus with modular_mapping) keeps them as
 * they are.  A NULL id goes to partition 0, which answers it as any shard
 * would.
 */
CREATE FUNCTION dwarf_router.partition_of(flow_id bigint) RETURNS int
	LANGUAGE plpgsql STABLE
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	n int := dwarf_router.partitions();
	shard int := (flow_id >> 48)::int;
BEGIN
	IF flow_id IS NULL THEN
		RETURN 0;
	END IF;
	IF flow_id < 0 OR shard >= n THEN
		RAISE EXCEPTION 'flow % does not exist', flow_id
			USING ERRCODE = 'undefined_object',
				  DETAIL = CASE WHEN flow_id < 0 THEN 'A flow id is never negative.'
						   ELSE format('Its id names dwarf shard %s, and foreign server dwarf_shards '
									   'has partitions p0 to p%s only.', shard, n - 1) END,
				  HINT = 'A flow id carries its shard''s dwarf.shard_id in bits 48 to 62.';
	END IF;
	RETURN shard;
END
$$;
COMMENT ON FUNCTION dwarf_router.partition_of(bigint) IS
	'The partition of dwarf_shards that holds a flow: the shard number in bits 48 to 62 of its id';

/*
 * Step ids.  A shard's step ids carry the shard of their flow in bits 48 to
 * 62, as flow ids do, so the router passes them through unchanged and
 * routes a step id the way it routes a flow id.
 */
CREATE FUNCTION dwarf_router.partition_of_step(step_id bigint) RETURNS int
	LANGUAGE plpgsql STABLE
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	n int := dwarf_router.partitions();
	part int := (step_id >> 48)::int;
BEGIN
	IF step_id IS NULL THEN
		RETURN 0;
	END IF;
	IF step_id < 0 OR part >= n THEN
		RAISE EXCEPTION 'step % does not exist', step_id
			USING ERRCODE = 'undefined_object',
				  DETAIL = format('Its id names dwarf shard %s, and foreign server dwarf_shards '
								  'has partitions p0 to p%s only.', part, n - 1),
				  HINT = 'A step id carries its shard''s dwarf.shard_id in bits 48 to 62.';
	END IF;
	RETURN part;
END
$$;
COMMENT ON FUNCTION dwarf_router.partition_of_step(bigint) IS
	'The partition of dwarf_shards that holds a step the router named';

/*
 * Where a new flow goes.  With an idempotency key, the key's hash decides,
 * so that a retried create reaches the shard that has the first one and
 * returns its id.  Otherwise a thread's hash keeps the flows of a thread
 * together; anything else goes to a random shard.  The hash is reduced as
 * PL/Proxy's own mask would (for a power of two, h & 2^31-1 mod n = h & n-1).
 */
CREATE FUNCTION dwarf_router.partition_for_create(idempotency_key text, thread text) RETURNS int
	LANGUAGE sql VOLATILE
	SET search_path = pg_catalog, pg_temp
	AS $$
	SELECT CASE WHEN coalesce(idempotency_key, thread) IS NOT NULL
				THEN (hashtext(coalesce(idempotency_key, thread)) & 2147483647) % n
				ELSE floor(random() * n)::int END
	  FROM dwarf_router.partitions() n
$$;
COMMENT ON FUNCTION dwarf_router.partition_for_create(text, text) IS
	'The partition a new flow goes to: by idempotency key, else by thread, else at random';

/*
 * Errors.
 */

/*
 * An error as the API raises it.  Each dwarf.* function catches what its
 * calls raise, has dwarf_router.shard_error say what to raise instead, and
 * raises that itself, from its own frame: PL/pgSQL adds a CONTEXT line for
 * every PL/pgSQL frame on the stack where an error is raised (and RAISE;
 * keeps the lines of the first raise), so an error raised anywhere deeper
 * would show the router's internals.  Raised there, it shows one line, the
 * function called, which no SQL can hide.  The four forms of that RAISE in
 * each function are because RAISE refuses a NULL option.
 */
CREATE TYPE dwarf_router.error AS (code text, message text, detail text, hint text);

/* A PL/Proxy error that means the request never reached the shard. */
CREATE FUNCTION dwarf_router.never_sent(message text) RETURNS boolean
	LANGUAGE sql IMMUTABLE
	AS $$
	SELECT message ~ '^PL/Proxy function \S+\(\d+\): (\[[^]]*\] PQconnect(Start|Poll)|connect timeout)'
$$;

/*
 * The partitions that do not answer now: each is asked its shard number in a
 * call of its own.  Only run on an error path, to name the shard that failed
 * a call sent to all of them (PL/Proxy's error names the database only).
 */
CREATE FUNCTION dwarf_router.unreachable() RETURNS int[]
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	down int[] := '{}';
BEGIN
	FOR p IN 0 .. dwarf_router.partitions() - 1 LOOP
		BEGIN
			PERFORM dwarf_router.shard_id_on(p);
		EXCEPTION WHEN OTHERS THEN
			down := down || p;
		END;
	END LOOP;
	RETURN down;
END
$$;

/*
 * Called from an exception handler around PL/Proxy calls to partitions parts
 * (NULL: to all), with the caught error's fields: the error to raise in its
 * place.  An error a shard raised is returned as the shard raised it (code,
 * message, detail, hint, less PL/Proxy's "REMOTE ERROR" and "Remote hint:"
 * prefixes), the shard named in the detail, so that the router answers as
 * one server would.  A shard that could not be reached, or that broke off,
 * becomes an error (08006) naming it.  Anything else (the router's own
 * error, or one already turned) is returned as it is.
 */
CREATE FUNCTION dwarf_router.shard_error(parts int[], code text, message text,
										 detail text, hint text, retry_hint text DEFAULT NULL)
	RETURNS dwarf_router.error
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	remote text[] := regexp_match(message, '^\S+\(\d+\): \[[^]]*\] REMOTE \S+: (.*)$');
	lost text[] := regexp_match(message,
		'^PL/Proxy function \S+\(\d+\): ((\[[^]]*\] PQ|connect timeout|query timeout).*)$');
	down int[];
BEGIN
	detail := nullif(regexp_replace(detail, '^Remote detail: ', ''), '');
	hint := nullif(regexp_replace(hint, '^Remote hint: ', ''), '');
	IF remote IS NOT NULL THEN
		message := remote[1];
		detail := concat_ws(' ', detail,
							CASE WHEN cardinality(parts) = 1 THEN format('(Raised by dwarf shard %s.)', parts[1])
								 ELSE '(Raised by a dwarf shard.)' END);
	ELSIF lost IS NOT NULL THEN
		down := coalesce(parts, dwarf_router.unreachable());
		code := '08006';
		message := CASE
			WHEN cardinality(down) = 0 THEN 'a dwarf shard could not be reached'
			WHEN cardinality(down) = 1 AND lost[1] ~ 'FATAL: '	-- it answered, to say no (role, password, ...)
				THEN format('dwarf shard %s refused the connection', down[1])
			WHEN cardinality(down) = 1 THEN format('dwarf shard %s is unreachable', down[1])
			ELSE format('dwarf shards %s are unreachable', array_to_string(down, ', ')) END;
		detail := lost[1];
		hint := coalesce(retry_hint,
			format('Check the server of %s in foreign server dwarf_shards; calls routed to '
				   'other shards go on working.',
				   CASE WHEN cardinality(down) > 0 THEN 'partition p' || array_to_string(down, ', p')
						ELSE 'each partition' END));
	END IF;
	RETURN (code, message, detail, hint)::dwarf_router.error;
END
$$;
COMMENT ON FUNCTION dwarf_router.shard_error(int[], text, text, text, text, text) IS
	'The error to raise for one caught: a shard''s error as the shard raised it, "dwarf shard N is unreachable", '
	'or any other as it is';

/*
 * The PL/Proxy calls.  Each sends one query to partition "part" (or to all
 * of them) and returns its rows; the names of their arguments are replaced
 * in the SELECT, which is why columns there are always qualified.
 */

CREATE FUNCTION dwarf_router.shard_id_on(part int) RETURNS int
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT pg_catalog.current_setting('dwarf.shard_id', true)::int AS shard_id_on;
$$;

CREATE FUNCTION dwarf_router.create_on(part int, graph text, input jsonb, priority int,
									   idempotency_key text, fairness_key text, fairness_weight int,
									   time_budget interval, delete_on_completion boolean,
									   baggage jsonb, thread text)
	RETURNS bigint
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.create(graph, input, priority, idempotency_key, fairness_key, fairness_weight,
						time_budget, delete_on_completion, baggage, thread) AS create_on;
$$;

CREATE FUNCTION dwarf_router.run_on(part int, graph text, input jsonb, timeout interval, priority int,
									idempotency_key text, fairness_key text, fairness_weight int,
									time_budget interval, delete_on_completion boolean,
									baggage jsonb, thread text)
	RETURNS dwarf.outcome
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT o.flow_id, o.status, o.state, o.error, o.interrupt_payload, o.cancel_reason,
		   o.error_task, o.error_sqlstate, o.error_detail, o.error_hint
	  FROM dwarf.run(graph, input, timeout, priority, idempotency_key, fairness_key, fairness_weight,
					 time_budget, delete_on_completion, baggage, thread) o;
$$;

CREATE FUNCTION dwarf_router.await_on(part int, flow bigint, timeout interval)
	RETURNS dwarf.outcome
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT o.flow_id, o.status, o.state, o.error, o.interrupt_payload, o.cancel_reason,
		   o.error_task, o.error_sqlstate, o.error_detail, o.error_hint
	  FROM dwarf.await(flow, timeout) o;
$$;

CREATE FUNCTION dwarf_router.await_any_on(part int, flows bigint[], timeout interval)
	RETURNS dwarf.outcome
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT o.flow_id, o.status, o.state, o.error, o.interrupt_payload, o.cancel_reason,
		   o.error_task, o.error_sqlstate, o.error_detail, o.error_hint
	  FROM dwarf.await_any(flows, timeout) o;
$$;

CREATE FUNCTION dwarf_router.snapshot_on(part int, flow bigint)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   state jsonb, error text, interrupt_payload jsonb,
				   cancel_reason text, steps bigint,
				   created_at timestamptz, finished_at timestamptz,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT s.flow_id, s.graph, s.version, s.status, s.state, s.error, s.interrupt_payload,
		   s.cancel_reason, s.steps, s.created_at, s.finished_at,
		   s.error_task, s.error_sqlstate, s.error_detail, s.error_hint
	  FROM dwarf.snapshot(flow) s;
$$;

CREATE FUNCTION dwarf_router.history_on(part int, flow bigint, task_name text)
	RETURNS TABLE (step_id bigint, task text, status text, attempt int,
				   started_at timestamptz, finished_at timestamptz,
				   error text, changes jsonb,
				   error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT h.step_id, h.task, h.status, h.attempt, h.started_at, h.finished_at, h.error, h.changes,
		   h.error_sqlstate, h.error_detail, h.error_hint
	  FROM dwarf.history(flow) h
	 WHERE task_name IS NULL OR h.task = task_name;
$$;

CREATE FUNCTION dwarf_router.state_at_on(part int, flow bigint, before_step bigint, replay boolean)
	RETURNS jsonb
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT CASE WHEN replay THEN dwarf.replay_state(flow, before_step)
				ELSE dwarf.state_at(flow, before_step) END AS state_at_on;
$$;

CREATE FUNCTION dwarf_router.cancel_on(part int, flow bigint, reason text) RETURNS boolean
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.cancel(flow, reason) AS cancel_on;
$$;

CREATE FUNCTION dwarf_router.resume_on(part int, flow bigint, data jsonb) RETURNS void
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.resume(flow, data) AS resume_on;
$$;

CREATE FUNCTION dwarf_router.fork_on(part int, step bigint, overrides jsonb) RETURNS bigint
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.fork(step, overrides) AS fork_on;
$$;

CREATE FUNCTION dwarf_router.continue_on(part int, flow bigint, input jsonb) RETURNS bigint
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.continue(flow, input) AS continue_on;
$$;

CREATE FUNCTION dwarf_router.delete_on(part int, flow bigint) RETURNS void
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.delete(flow) AS delete_on;
$$;

CREATE FUNCTION dwarf_router.history_mermaid_on(part int, flow bigint) RETURNS text
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.history_mermaid(flow) AS history_mermaid_on;
$$;

CREATE FUNCTION dwarf_router.validate_on(part int, definition jsonb) RETURNS jsonb
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.validate(definition) AS validate_on;
$$;

CREATE FUNCTION dwarf_router.define_on(part int, graph_name text, definition jsonb) RETURNS int
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT dwarf.define(graph_name, definition) AS define_on;
$$;

/*
 * Where the current role's graph of that name stands on one shard (a graph
 * name is its owner's, and dwarf.define defines the caller's own): its
 * latest version (NULL: none), and that version's definition.
 */
CREATE FUNCTION dwarf_router.graph_on(part int, graph_name text)
	RETURNS TABLE (shard int, version int, definition jsonb)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT pg_catalog.current_setting('dwarf.shard_id', true)::int AS shard,
		   g.version, g.definition
	  FROM (SELECT 1) one
	  LEFT JOIN LATERAL (SELECT x.version, x.definition
						   FROM dwarf.graph x
						  WHERE x.name = graph_name AND x.owner = current_user::regrole
						  ORDER BY x.version DESC LIMIT 1) g ON true;
$$;

/* The versions of the current role's graph on one shard from version "since" on, oldest first. */
CREATE FUNCTION dwarf_router.graph_versions_on(part int, graph_name text, since int)
	RETURNS TABLE (version int, definition jsonb)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON part;
	SELECT x.version, x.definition FROM dwarf.graph x
	 WHERE x.name = graph_name AND x.owner = current_user::regrole
	   AND x.version >= since
	 ORDER BY x.version;
$$;

/* Every graph of every shard: its owner's name and its own. */
CREATE FUNCTION dwarf_router.graph_names_on_all() RETURNS TABLE (owner text, name text)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON ALL;
	SELECT DISTINCT pg_catalog.pg_get_userbyid(x.owner::oid)::text AS owner, x.name FROM dwarf.graph x;
$$;

CREATE FUNCTION dwarf_router.list_on_all(graph_name text, flow_status text, since timestamptz,
										 until timestamptz, thread_name text, error_like text,
										 before bigint, lim int)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   thread text, error text, created_at timestamptz,
				   finished_at timestamptz, interrupt_payload jsonb,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON ALL;
	SELECT l.flow_id, l.graph, l.version, l.status, l.thread, l.error, l.created_at, l.finished_at,
		   l.interrupt_payload, l.error_task, l.error_sqlstate, l.error_detail, l.error_hint
	  FROM dwarf.list(graph_name, flow_status, since, until, thread_name, error_like, before, lim) l;
$$;

CREATE FUNCTION dwarf_router.stats_on_all()
	RETURNS TABLE (shard int, running bigint, interrupted bigint, completed bigint,
				   failed bigint, cancelled bigint, steps_done bigint, in_flight numeric,
				   workers jsonb)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON ALL;
	SELECT pg_catalog.current_setting('dwarf.shard_id', true)::int AS shard,
		   s.running, s.interrupted, s.completed, s.failed, s.cancelled, s.steps_done,
		   s.in_flight, s.workers
	  FROM dwarf.stats s;
$$;

CREATE FUNCTION dwarf_router.worker_stats_on_all()
	RETURNS TABLE (database oid, worker int, pid int, flows_loaded bigint,
				   ready bigint, steps bigint, steps_failed bigint,
				   flows_closed bigint, batches bigint, aborted_batches bigint)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON ALL;
	SELECT w.database, w.worker, w.pid, w.flows_loaded, w.ready, w.steps, w.steps_failed,
		   w.flows_closed, w.batches, w.aborted_batches
	  FROM dwarf.worker_stats() w;
$$;

CREATE FUNCTION dwarf_router.purge_on_all(older_than interval, all_roles boolean) RETURNS SETOF bigint
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON ALL;
	SELECT dwarf.purge(older_than, all_roles) AS purge_on_all;
$$;

CREATE FUNCTION dwarf_router.maintain_on_all(dry_run boolean)
	RETURNS TABLE (shard int, result jsonb)
	LANGUAGE plproxy AS $$
	CLUSTER 'dwarf_shards';
	RUN ON ALL;
	SELECT pg_catalog.current_setting('dwarf.shard_id', true)::int AS shard,
		   dwarf.maintain(dry_run) AS result;
$$;

/*
 * A shard's error leaves its PL/Proxy connection in the middle of a query
 * (PL/Proxy raises the error before reading the end of the result), so the
 * next call to that shard drops the connection and opens another, with a
 * NOTICE "PL/Proxy: dropping stale conn".  The reconnection is PL/Proxy's
 * and harmless (a few milliseconds, after errors only); the notice would
 * follow every error through the router into the application's log, so the
 * PL/Proxy calls run with client_min_messages = warning.  The shards' dwarf
 * raises no notices to its callers, so none is lost; PL/Proxy's warnings
 * (such as "detected unstable connection", after a shard restarted) still
 * show.
 */
DO $$
DECLARE
	f regprocedure;
BEGIN
	FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid = p.prolang
			  WHERE l.lanname = 'plproxy' AND p.pronamespace = 'dwarf_router'::regnamespace LOOP
		EXECUTE format('ALTER FUNCTION %s SET client_min_messages = warning', f);
	END LOOP;
END
$$;

/*
 * The API, as on a shard.  Each function picks its partition, makes the
 * PL/Proxy call and turns a shard's error into one that names the shard.
 * Unlike on a shard, every call commits on its shard by itself (PL/Proxy
 * runs remote calls in autocommit): a flow created through the router
 * exists even if the caller's transaction rolls back.
 */

CREATE FUNCTION dwarf.create(graph text, input jsonb DEFAULT '{}',
							 priority int DEFAULT 0,
							 idempotency_key text DEFAULT NULL,
							 fairness_key text DEFAULT NULL,
							 fairness_weight int DEFAULT 1,
							 time_budget interval DEFAULT NULL,
							 delete_on_completion boolean DEFAULT false,
							 baggage jsonb DEFAULT NULL,
							 thread text DEFAULT NULL)
	RETURNS bigint
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	tried int[] := '{}';
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_for_create(idempotency_key, thread);
	LOOP
		BEGIN
			RETURN dwarf_router.create_on(part, graph, input, priority, idempotency_key, fairness_key,
										  fairness_weight, time_budget, delete_on_completion,
										  baggage, thread);
		EXCEPTION WHEN OTHERS THEN
			tried := tried || part;
			part := dwarf_router.failover(tried, idempotency_key, SQLERRM);
			IF part IS NULL THEN
				RAISE;
			END IF;
		END;
	END LOOP;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(tried, SQLSTATE, SQLERRM, e_detail, e_hint,
								  dwarf_router.create_hint(idempotency_key, SQLERRM));
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.create(text, jsonb, int, text, text, int, interval, boolean, jsonb, text) IS
	'Creates a flow on a shard (by idempotency key, else thread, else at random); '
	'unlike on a shard it commits at once, whatever the caller''s transaction does';

CREATE FUNCTION dwarf.run(graph text, input jsonb DEFAULT '{}',
						  timeout interval DEFAULT '30 s',
						  priority int DEFAULT 0,
						  idempotency_key text DEFAULT NULL,
						  fairness_key text DEFAULT NULL,
						  fairness_weight int DEFAULT 1,
						  time_budget interval DEFAULT NULL,
						  delete_on_completion boolean DEFAULT false,
						  baggage jsonb DEFAULT NULL,
						  thread text DEFAULT NULL)
	RETURNS dwarf.outcome
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	tried int[] := '{}';
	result dwarf.outcome;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_for_create(idempotency_key, thread);
	LOOP
		BEGIN
			SELECT * INTO result
			  FROM dwarf_router.run_on(part, graph, input, timeout, priority, idempotency_key,
									   fairness_key, fairness_weight, time_budget,
									   delete_on_completion, baggage, thread);
			RETURN result;
		EXCEPTION WHEN OTHERS THEN
			tried := tried || part;
			part := dwarf_router.failover(tried, idempotency_key, SQLERRM);
			IF part IS NULL THEN
				RAISE;
			END IF;
		END;
	END LOOP;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(tried, SQLSTATE, SQLERRM, e_detail, e_hint,
								  dwarf_router.create_hint(idempotency_key, SQLERRM));
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.run(text, jsonb, interval, int, text, text, int, interval, boolean, jsonb, text) IS
	'Creates a flow on a shard (by idempotency key, else thread, else at random) and awaits it there';

/*
 * After a failed create: the next partition to try, or NULL.  Only a create
 * without an idempotency key moves on (to the next partition, once each),
 * and only when the request never left the router, so that no flow is made
 * twice; a keyed create must stay where a retry will look for it.
 */
CREATE FUNCTION dwarf_router.failover(tried int[], idempotency_key text, message text) RETURNS int
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	n int := dwarf_router.partitions();
	following int := (tried[cardinality(tried)] + 1) % n;
BEGIN
	IF idempotency_key IS NOT NULL OR NOT dwarf_router.never_sent(message)
	   OR cardinality(tried) >= n THEN
		RETURN NULL;
	END IF;
	RAISE WARNING 'dwarf shard % is unreachable; the flow goes to dwarf shard %',
		tried[cardinality(tried)], following
		USING DETAIL = message;
	RETURN following;
END
$$;

/* The hint of a create that failed: whether the flow may exist after all. */
CREATE FUNCTION dwarf_router.create_hint(idempotency_key text, message text) RETURNS text
	LANGUAGE sql IMMUTABLE
	AS $$
	SELECT CASE
		WHEN dwarf_router.never_sent(message) THEN NULL
		WHEN idempotency_key IS NOT NULL THEN
			'The flow may have been created before the shard broke off: retry with the same '
			'idempotency_key to get its id without creating it twice.'
		ELSE 'The flow may have been created before the shard broke off; pass an idempotency_key '
			 'to make a retry safe.' END
$$;

CREATE FUNCTION dwarf.await(flow_id bigint, timeout interval DEFAULT '30 s')
	RETURNS dwarf.outcome
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	result dwarf.outcome;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow_id);
	SELECT * INTO result FROM dwarf_router.await_on(part, flow_id, timeout);
	RETURN result;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.await(bigint, interval) IS
	'Waits, on the flow''s shard, until the flow closes or is interrupted, or the timeout passes';

/*
 * await_all waits for each flow in turn, on its shard, within what is left
 * of the timeout: the whole wait is the longest flow's.  await_any waits
 * on the shard of the flows when they are all on one; across shards, it
 * asks each in turn for a tenth of a second at a time.
 */
CREATE FUNCTION dwarf.await_all(flow_ids bigint[], timeout interval DEFAULT '30 s')
	RETURNS SETOF dwarf.outcome
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	deadline timestamptz := clock_timestamp() + timeout;
	id bigint;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	IF flow_ids IS NULL OR timeout IS NULL THEN
		RAISE EXCEPTION 'flow_ids and timeout of dwarf.await_all must not be NULL'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	FOREACH id IN ARRAY flow_ids LOOP
		RETURN NEXT dwarf.await(id, greatest(deadline - clock_timestamp(), '0'));
	END LOOP;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(NULL, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.await_all(bigint[], interval) IS
	'Waits, on their shards, until every flow closes or is interrupted, or the timeout passes; '
	'one outcome per element of flow_ids, in their order';

CREATE FUNCTION dwarf.await_any(flow_ids bigint[], timeout interval DEFAULT '30 s')
	RETURNS dwarf.outcome
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	deadline timestamptz := clock_timestamp() + timeout;
	parts int[];
	part int;
	result dwarf.outcome;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	parts := ARRAY(SELECT DISTINCT dwarf_router.partition_of(i) FROM unnest(flow_ids) i ORDER BY 1);
	IF cardinality(parts) = 1 THEN
		SELECT * INTO result FROM dwarf_router.await_any_on(parts[1], flow_ids, timeout);
		RETURN result;
	END IF;
	LOOP
		FOREACH part IN ARRAY parts LOOP
			SELECT * INTO result
			  FROM dwarf_router.await_any_on(part,
					ARRAY(SELECT i FROM unnest(flow_ids) i WHERE dwarf_router.partition_of(i) = part),
					least(greatest(deadline - clock_timestamp(), '0'), '100 ms'));
			IF result.status <> 'running' THEN
				RETURN result;
			END IF;
		END LOOP;
		IF clock_timestamp() >= deadline THEN
			RETURN dwarf.await(flow_ids[1], '0');
		END IF;
	END LOOP;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(parts, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.await_any(bigint[], interval) IS
	'Waits, on their shards, until one of the flows closes or is interrupted, and returns its outcome; '
	'past the timeout, the first flow''s as it is now';

/*
 * snapshot, history and list return columns named as some of their arguments,
 * which PL/pgSQL cannot compile: for them dwarf.* is a SQL function over a
 * PL/pgSQL one in dwarf_router with other argument names.  The SQL function
 * is inlined into the query that calls it in FROM (it is neither STRICT nor
 * has SET options), so the PL/pgSQL one is the outermost frame, and raises
 * the errors (see dwarf_router.error).  Its search_path names its own
 * schema so that the CONTEXT line of its errors says "snapshot(bigint)", as
 * called, not "dwarf_router.snapshot(bigint)": PL/pgSQL qualifies the name
 * only when the function is not on the search_path it was compiled under.
 * history, state_at and stats are built the same way.
 */
CREATE FUNCTION dwarf_router.snapshot(flow bigint)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   state jsonb, error text, interrupt_payload jsonb,
				   cancel_reason text, steps bigint,
				   created_at timestamptz, finished_at timestamptz,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE plpgsql STABLE STRICT
	SET search_path = pg_catalog, dwarf_router, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow);
	RETURN QUERY SELECT * FROM dwarf_router.snapshot_on(part, flow);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;

CREATE FUNCTION dwarf.snapshot(flow_id bigint)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   state jsonb, error text, interrupt_payload jsonb,
				   cancel_reason text, steps bigint,
				   created_at timestamptz, finished_at timestamptz,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE sql STABLE
	AS $$ SELECT * FROM dwarf_router.snapshot($1) $$;
COMMENT ON FUNCTION dwarf.snapshot(bigint) IS
	'A flow''s status and state now, from its shard';

/* history: the steps of a flow, their ids made to carry the shard. */
CREATE FUNCTION dwarf_router.history(flow bigint, task_name text)
	RETURNS TABLE (step_id bigint, task text, status text, attempt int,
				   started_at timestamptz, finished_at timestamptz,
				   error text, changes jsonb,
				   error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE plpgsql STABLE
	SET search_path = pg_catalog, dwarf_router, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow);
	RETURN QUERY
		SELECT h.step_id, h.task, h.status, h.attempt,
			   h.started_at, h.finished_at, h.error, h.changes,
			   h.error_sqlstate, h.error_detail, h.error_hint
		  FROM dwarf_router.history_on(part, flow, task_name) h
		 ORDER BY h.step_id;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;

CREATE FUNCTION dwarf.history(flow_id bigint)
	RETURNS TABLE (step_id bigint, task text, status text, attempt int,
				   started_at timestamptz, finished_at timestamptz,
				   error text, changes jsonb,
				   error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE sql STABLE
	AS $$ SELECT * FROM dwarf_router.history($1, NULL) WHERE $1 IS NOT NULL $$;
COMMENT ON FUNCTION dwarf.history(bigint) IS
	'One row per step of a flow, in execution order, from its shard; the step ids carry the shard (see dwarf.fork)';

/* state_at and replay_state: before_step is a router step id (or a shard's own: the flow names the shard). */
CREATE FUNCTION dwarf_router.state_at(flow bigint, before_step bigint, replay boolean) RETURNS jsonb
	LANGUAGE plpgsql STABLE
	SET search_path = pg_catalog, dwarf_router, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow);
	RETURN dwarf_router.state_at_on(part, flow, before_step, replay);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;

CREATE FUNCTION dwarf.state_at(flow_id bigint, before_step bigint DEFAULT NULL) RETURNS jsonb
	LANGUAGE sql STABLE
	AS $$ SELECT dwarf_router.state_at($1, $2, false) $$;
COMMENT ON FUNCTION dwarf.state_at(bigint, bigint) IS
	'A flow''s state (before a step of dwarf.history, when given), from its shard';

CREATE FUNCTION dwarf.replay_state(flow_id bigint, before_step bigint DEFAULT NULL) RETURNS jsonb
	LANGUAGE sql STABLE
	AS $$ SELECT dwarf_router.state_at($1, $2, true) $$;
COMMENT ON FUNCTION dwarf.replay_state(bigint, bigint) IS
	'A flow''s state as its worker computes it, from its shard';

CREATE FUNCTION dwarf.cancel(flow_id bigint, reason text DEFAULT NULL) RETURNS boolean
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow_id);
	RETURN dwarf_router.cancel_on(part, flow_id, reason);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.cancel(bigint, text) IS
	'Cancels a running or interrupted flow on its shard; false when it has already closed';

CREATE FUNCTION dwarf.resume(flow_id bigint, data jsonb DEFAULT 'null') RETURNS void
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow_id);
	PERFORM dwarf_router.resume_on(part, flow_id, data);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.resume(bigint, jsonb) IS
	'Resumes an interrupted flow on its shard';

CREATE FUNCTION dwarf.fork(step_id bigint, overrides jsonb DEFAULT '{}') RETURNS bigint
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of_step(step_id);
	RETURN dwarf_router.fork_on(part, step_id, overrides);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.fork(bigint, jsonb) IS
	'A new flow, on the step''s shard, restarting at a step of dwarf.history (a router step id, which carries its shard)';

CREATE FUNCTION dwarf.continue(flow_id bigint, input jsonb DEFAULT '{}') RETURNS bigint
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow_id);
	RETURN dwarf_router.continue_on(part, flow_id, input);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.continue(bigint, jsonb) IS
	'The next flow of a thread, on the closed flow''s shard';

CREATE FUNCTION dwarf.delete(flow_id bigint) RETURNS void
	LANGUAGE plpgsql STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow_id);
	PERFORM dwarf_router.delete_on(part, flow_id);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.delete(bigint) IS
	'Deletes a flow, its steps and its child flows, on its shard';

CREATE FUNCTION dwarf.history_mermaid(flow_id bigint) RETURNS text
	LANGUAGE plpgsql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	part := dwarf_router.partition_of(flow_id);
	RETURN dwarf_router.history_mermaid_on(part, flow_id);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.history_mermaid(bigint) IS
	'A Mermaid flowchart of the flow''s graph, each task styled by how it ran, from its shard';

/*
 * Graphs.  Every shard must know every graph, at the same version, since a
 * flow may start on any of them.  The router defines a graph on one shard
 * after the other (PL/Proxy has no distributed commit), so a define that
 * fails half way leaves some shards a version ahead; the next define through
 * the router first brings them level again, by copying the missing versions
 * from a shard that has them.
 */

CREATE FUNCTION dwarf.validate(definition jsonb) RETURNS jsonb
	LANGUAGE plpgsql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part int;
	normalized jsonb;
	first jsonb;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	/* Every shard checks it: a task's function must exist on each of them. */
	FOR p IN 0 .. dwarf_router.partitions() - 1 LOOP
		part := p;
		normalized := dwarf_router.validate_on(p, definition);
		IF p = 0 THEN
			first := normalized;
		ELSIF normalized IS DISTINCT FROM first THEN
			RAISE EXCEPTION 'dwarf shards 0 and % normalize the definition differently', p
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('Shard 0 gives %s, shard %s gives %s.', first, p, normalized),
					  HINT = 'Run the same dwarf version on every shard.';
		END IF;
	END LOOP;
	RETURN first;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.validate(jsonb) IS
	'Checks a graph definition on every shard and returns it normalized; an error names the shard that refused it';

/*
 * Brings every shard to the latest version of the current role's graph of
 * that name that any shard has, copying the missing versions (as the
 * current role) from the first shard that has it.  Returns that version
 * (0: no shard has the graph) and its definition; raises an error naming
 * the shard when one holds a version that differs from the same version
 * elsewhere, or is unreachable.
 */
CREATE FUNCTION dwarf_router.level_graph(graph_name text, OUT version int, OUT definition jsonb,
										 OUT copied int)
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	n int := dwarf_router.partitions();
	versions int[] := '{}';
	definitions jsonb[] := '{}';
	part int;
	lead int;
	g record;
	v record;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	copied := 0;
	FOR p IN 0 .. n - 1 LOOP
		part := p;
		SELECT * INTO g FROM dwarf_router.graph_on(p, graph_name);
		IF g.shard IS DISTINCT FROM p THEN
			RAISE EXCEPTION 'partition p% of dwarf_shards is not dwarf shard %', p, p
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = format('Its server has dwarf.shard_id = %s.', coalesce(g.shard::text, 'unset')),
					  HINT = format('Set dwarf.shard_id = %s in that server''s postgresql.conf, or fix p%s '
									'in foreign server dwarf_shards.', p, p);
		END IF;
		versions := versions || coalesce(g.version, 0);
		definitions := array_append(definitions, g.definition);
	END LOOP;

	version := (SELECT max(x) FROM unnest(versions) x);
	lead := array_position(versions, version) - 1;
	definition := definitions[lead + 1];
	FOR p IN 0 .. n - 1 LOOP
		CONTINUE WHEN versions[p + 1] = version;
		part := lead;
		FOR v IN SELECT * FROM dwarf_router.graph_versions_on(lead, graph_name, versions[p + 1]) LOOP
			IF v.version = versions[p + 1] THEN
				/* The version both have must be the same graph, or these are two histories. */
				IF v.definition IS DISTINCT FROM definitions[p + 1] THEN
					RAISE EXCEPTION 'graph "%" differs between dwarf shards % and % at version %',
						graph_name, lead, p, v.version
						USING ERRCODE = 'object_not_in_prerequisite_state',
							  DETAIL = format('Shard %s has versions up to %s, shard %s up to %s.',
											  lead, version, p, versions[p + 1]),
							  HINT = format('It was defined on a shard directly. Make shard %s''s versions '
											'%s to %s match shard %s''s by hand, or use another graph name.',
											p, v.version, version, lead);
				END IF;
				CONTINUE;
			END IF;
			part := p;
			IF dwarf_router.define_on(p, graph_name, v.definition) <> v.version THEN
				RAISE EXCEPTION 'graph "%" got another version number on dwarf shard % than on shard %',
					graph_name, p, lead
					USING ERRCODE = 'object_not_in_prerequisite_state',
						  DETAIL = format('Copying version %s, shard %s numbered it differently.', v.version, p),
						  HINT = 'The graph was defined on that shard at the same time; define it again through the router.';
			END IF;
			copied := copied + 1;
			part := lead;
		END LOOP;
	END LOOP;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf_router.level_graph(text) IS
	'Copies the versions of a graph that some shards lack from a shard that has them; returns the latest version';

CREATE FUNCTION dwarf.define(name text, definition jsonb) RETURNS int
	LANGUAGE plpgsql STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	normalized jsonb;
	level record;
	part int;
	got int;
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	/* Checked on every shard first, so that a bad definition changes none. */
	normalized := dwarf.validate(definition);
	level := dwarf_router.level_graph(name);
	/*
	 * Some shards were behind: most likely this retries a define that failed
	 * half way.  If the latest version is this very definition, it is now on
	 * every shard, and defining it once more would only add a copy.
	 */
	IF level.copied > 0 AND level.definition = normalized THEN
		RETURN level.version;
	END IF;
	FOR p IN 0 .. dwarf_router.partitions() - 1 LOOP
		part := p;
		got := dwarf_router.define_on(p, name, definition);
		IF got <> level.version + 1 THEN
			RAISE EXCEPTION 'graph "%" got version % on dwarf shard % instead of %',
				name, got, p, level.version + 1
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = 'It was defined on that shard directly (or through another router) at the same time.',
					  HINT = 'Define it again through the router: that brings every shard to the same version.';
		END IF;
	END LOOP;
	RETURN got;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(ARRAY[part], SQLSTATE, SQLERRM, e_detail, e_hint,
		CASE WHEN part > 0 THEN
			format('Shards 0 to %s have the new version already. Once shard %s is back, call '
				   'dwarf.define again with the same definition: the shards behind catch up, '
				   'and nothing is defined twice.', part - 1, part) END);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.define(text, jsonb) IS
	'Stores a new version of a graph on every shard (the same version number on each) and returns it';

/*
 * Across all shards.
 */

CREATE FUNCTION dwarf_router.list(graph_name text, flow_status text, since timestamptz,
								  until timestamptz, thread_name text, error_like text,
								  before bigint, lim int)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   thread text, error text, created_at timestamptz,
				   finished_at timestamptz, interrupt_payload jsonb,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE plpgsql STABLE
	SET search_path = pg_catalog, dwarf_router, pg_temp
	AS $$
DECLARE
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	/*
	 * Each shard returns its first "lim" flows below the cursor; the first
	 * "lim" of their union, in the same order, are the page.  The order is
	 * flow id, as on a shard, so the cursor means what it means there.
	 */
	RETURN QUERY
		SELECT l.* FROM dwarf_router.list_on_all(graph_name, flow_status, since, until,
												  thread_name, error_like, before, lim) l
		 ORDER BY l.flow_id DESC
		 LIMIT lim;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(NULL, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;

CREATE FUNCTION dwarf.list(graph text DEFAULT NULL, status text DEFAULT NULL,
						   since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL,
						   thread text DEFAULT NULL, error_like text DEFAULT NULL,
						   before bigint DEFAULT NULL, page_size int DEFAULT 100)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   thread text, error text, created_at timestamptz,
				   finished_at timestamptz, interrupt_payload jsonb,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE sql STABLE
	AS $$ SELECT * FROM dwarf_router.list($1, $2, $3, $4, $5, $6, $7, $8) $$;
COMMENT ON FUNCTION dwarf.list(text, text, timestamptz, timestamptz, text, text, bigint, int) IS
	'The caller''s flows on all shards, filtered, by descending flow id (newest first within a shard; '
	'a flow id begins with its shard number), page_size at a time; pass the last flow_id seen as "before" for the next page';

CREATE FUNCTION dwarf_router.shard_stats()
	RETURNS TABLE (shard int, running bigint, interrupted bigint, completed bigint,
				   failed bigint, cancelled bigint, steps_done bigint, in_flight numeric,
				   workers jsonb)
	LANGUAGE plpgsql
	SET search_path = pg_catalog, dwarf_router, pg_temp
	AS $$
DECLARE
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	RETURN QUERY SELECT * FROM dwarf_router.stats_on_all() s ORDER BY s.shard;
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(NULL, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf_router.shard_stats() IS
	'dwarf.stats of each shard, one row per shard';

CREATE VIEW dwarf.stats AS
	WITH s AS MATERIALIZED (SELECT * FROM dwarf_router.shard_stats())
	SELECT (SELECT coalesce(sum(s.running), 0)::bigint FROM s) AS running,
		   (SELECT coalesce(sum(s.interrupted), 0)::bigint FROM s) AS interrupted,
		   (SELECT coalesce(sum(s.completed), 0)::bigint FROM s) AS completed,
		   (SELECT coalesce(sum(s.failed), 0)::bigint FROM s) AS failed,
		   (SELECT coalesce(sum(s.cancelled), 0)::bigint FROM s) AS cancelled,
		   (SELECT coalesce(sum(s.steps_done), 0)::bigint FROM s) AS steps_done,
		   (SELECT coalesce(sum(s.in_flight), 0) FROM s) AS in_flight,
		   (SELECT coalesce(jsonb_agg(w.worker || jsonb_build_object('shard', s.shard) ORDER BY s.shard), '[]')
			  FROM s, jsonb_array_elements(s.workers) AS w(worker)) AS workers;
COMMENT ON VIEW dwarf.stats IS
	'dwarf.stats summed over all shards; each worker in "workers" says its shard '
	'(dwarf_router.shard_stats() has one row per shard)';

CREATE FUNCTION dwarf.worker_stats()
	RETURNS TABLE (database oid, worker int, pid int, flows_loaded bigint,
				   ready bigint, steps bigint, steps_failed bigint,
				   flows_closed bigint, batches bigint, aborted_batches bigint)
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	RETURN QUERY SELECT * FROM dwarf_router.worker_stats_on_all();
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(NULL, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.worker_stats() IS 'The counters of every shard''s dwarf workers';

CREATE FUNCTION dwarf.purge(older_than interval DEFAULT '30 days', all_roles boolean DEFAULT false) RETURNS bigint
	LANGUAGE plpgsql STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	RETURN (SELECT coalesce(sum(n), 0)::bigint FROM dwarf_router.purge_on_all(older_than, all_roles) n);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(NULL, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.purge(interval, boolean) IS
	'Deletes the caller''s own closed flows (with all_roles, those of every role whose privileges it has) older '
	'than older_than on every shard; returns how many in all';

/*
 * dwarf.maintain on every shard.  Its results are combined key by key: numbers
 * (flows moved, partitions dropped, milliseconds taken) are summed, booleans
 * or-ed ("more": some shard has more to do); "shards" keeps each shard's own
 * result, under its shard number, for everything else.
 */
CREATE FUNCTION dwarf.maintain(dry_run boolean DEFAULT false) RETURNS jsonb
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	e_detail text;
	e_hint text;
	e dwarf_router.error;
BEGIN
	RETURN (
		WITH r AS MATERIALIZED (SELECT * FROM dwarf_router.maintain_on_all(maintain.dry_run)),
		fields AS (
			SELECT x.key, x.value
			  FROM r, jsonb_each(CASE jsonb_typeof(r.result) WHEN 'object' THEN r.result ELSE '{}' END) x)
		SELECT coalesce((SELECT jsonb_object_agg(t.key, t.total)
						   FROM (SELECT f.key,
										CASE min(jsonb_typeof(f.value))
											WHEN 'number' THEN to_jsonb(sum(f.value::text::numeric)
															   FILTER (WHERE jsonb_typeof(f.value) = 'number'))
											ELSE to_jsonb(bool_or(f.value::text::boolean)
														  FILTER (WHERE jsonb_typeof(f.value) = 'boolean')) END AS total
								   FROM fields f
								  WHERE jsonb_typeof(f.value) IN ('number', 'boolean')
								  GROUP BY f.key
								 HAVING count(DISTINCT jsonb_typeof(f.value)) = 1) t), '{}')
			   || jsonb_build_object('shards',
					  (SELECT coalesce(jsonb_object_agg(r.shard::text, r.result ORDER BY r.shard), '{}')
						 FROM r)));
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	e := dwarf_router.shard_error(NULL, SQLSTATE, SQLERRM, e_detail, e_hint);
	CASE
		WHEN e.detail IS NULL AND e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message;
		WHEN e.hint IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail;
		WHEN e.detail IS NULL THEN RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, HINT = e.hint;
		ELSE RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
	END CASE;
END
$$;
COMMENT ON FUNCTION dwarf.maintain(boolean) IS
	'Runs dwarf.maintain (with dry_run: changing nothing) on every shard: numeric fields summed, each shard''s own '
	'result under "shards"';

/*
 * Calls that act on the step being run make no sense on a router: steps run
 * on the shards.  They exist here only to say so, each raising the error in
 * its own frame (see dwarf_router.error).
 */
CREATE FUNCTION dwarf_router.inside_task_only(fn text) RETURNS dwarf_router.error
	LANGUAGE sql IMMUTABLE
	AS $$
	SELECT ROW('0A000', fn || ' cannot be called on a dwarf router',
			   'It acts on the step being run, and steps run on the shards.',
			   'Call it inside a task function; tasks run on the shards, where dwarf is installed.')::dwarf_router.error
$$;

CREATE FUNCTION dwarf.goto(task text) RETURNS void LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.goto');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.retry(initial interval DEFAULT '1 s', factor float8 DEFAULT 2,
							max interval DEFAULT '5 min', give_up_after interval DEFAULT NULL)
	RETURNS boolean LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.retry');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.sleep(duration interval) RETURNS void LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.sleep');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.interrupt(payload jsonb DEFAULT NULL) RETURNS jsonb LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.interrupt');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.subgraph(graph text, input jsonb DEFAULT '{}') RETURNS jsonb LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.subgraph');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.step_key() RETURNS text LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.step_key');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.baggage() RETURNS jsonb LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.baggage');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
CREATE FUNCTION dwarf.flow_id() RETURNS bigint LANGUAGE plpgsql
	AS $$
DECLARE
	e dwarf_router.error := dwarf_router.inside_task_only('dwarf.flow_id');
BEGIN
	RAISE EXCEPTION USING ERRCODE = e.code, MESSAGE = e.message, DETAIL = e.detail, HINT = e.hint;
END $$;
COMMENT ON FUNCTION dwarf.goto(text) IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.retry(interval, float8, interval, interval) IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.sleep(interval) IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.interrupt(jsonb) IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.subgraph(text, jsonb) IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.step_key() IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.baggage() IS 'Inside a task only: raises an error on a router';
COMMENT ON FUNCTION dwarf.flow_id() IS 'Inside a task only: raises an error on a router';

/*
 * Administration.
 */

/* What each partition is: its connection string, whether it answers, and its dwarf.shard_id. */
CREATE FUNCTION dwarf_router.shards()
	RETURNS TABLE (partition int, connstr text, shard_id int, ok boolean, problem text)
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
BEGIN
	FOR partition, connstr IN
		SELECT substr(o.option_name, 2)::int, o.option_value
		  FROM pg_foreign_server s, pg_options_to_table(s.srvoptions) o
		 WHERE s.srvname = 'dwarf_shards' AND o.option_name ~ '^p[0-9]+$'
		 ORDER BY 1
	LOOP
		BEGIN
			shard_id := dwarf_router.shard_id_on(partition);
			ok := shard_id IS NOT DISTINCT FROM partition;
			problem := CASE WHEN shard_id IS NULL THEN 'dwarf is not loaded there (no dwarf.shard_id)'
							WHEN NOT ok THEN format('its dwarf.shard_id is %s, not %s', shard_id, partition) END;
		EXCEPTION WHEN OTHERS THEN
			shard_id := NULL;
			ok := false;
			problem := SQLERRM;
		END;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION dwarf_router.shards() IS
	'Each partition of dwarf_shards: its connection string, and whether it answers as the dwarf shard of its number';

/*
 * Brings every shard to the same versions of every graph that any shard has:
 * run it after adding a shard.  Each graph is copied as its owner (a graph
 * name is its owner's, and dwarf.define defines the caller's own), so that
 * it stays that role's; the caller must be able to SET ROLE to each owner
 * (a superuser can).
 */
CREATE FUNCTION dwarf_router.sync_graphs()
	RETURNS TABLE (owner text, graph text, version int, copied int)
	LANGUAGE plpgsql
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	caller text := current_user;
	level record;
BEGIN
	FOR owner, graph IN SELECT DISTINCT n.owner, n.name FROM dwarf_router.graph_names_on_all() n ORDER BY 1, 2 LOOP
		PERFORM set_config('role', owner, true);
		level := dwarf_router.level_graph(graph);
		PERFORM set_config('role', caller, true);
		version := level.version;
		copied := level.copied;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION dwarf_router.sync_graphs() IS
	'Copies to every shard the graph versions it lacks (after adding a shard); one row per owner and graph';

/*
 * Who may call what.  The API runs as its caller, and PL/Proxy connects to
 * the shards as the current role, so that each shard's row-level security
 * sees the caller and each role sees its own flows, as on one server.  A
 * role needs USAGE on schema dwarf, USAGE on foreign server dwarf_shards and
 * a user mapping for it (see the README).  Schema dwarf_router is open to
 * all: its functions run as their caller too, and give no more than the API.
 */
GRANT USAGE ON SCHEMA dwarf_router TO PUBLIC;
REVOKE ALL ON FUNCTION dwarf_router.sync_graphs() FROM PUBLIC;
GRANT SELECT ON dwarf.stats TO PUBLIC;
