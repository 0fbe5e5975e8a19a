/* dwarf 0.1: durable graph workflows run by the server's own background workers. */
\echo Use "CREATE EXTENSION dwarf" to load this file. \quit

/*
 * dwarf_internal: the functions that dwarf's own functions, views and
 * workers call, which are not for users (README's function table lists
 * the API, all of it in schema dwarf).  No role but the extension's owner
 * has USAGE on the schema, so no one else can name them.  EXECUTE on each
 * is revoked from PUBLIC at the end of this script, and granted back only
 * on those that a public function or view calls as its caller (PostgreSQL
 * checks EXECUTE as the caller): those callers name them in SQL-standard
 * bodies (BEGIN ATOMIC) or views, resolved when this script runs, so a
 * call needs no USAGE on the schema.  C code that names one in a statement
 * runs it as the extension's owner.
 */
CREATE SCHEMA dwarf_internal;
REVOKE ALL ON SCHEMA dwarf_internal FROM PUBLIC;
COMMENT ON SCHEMA dwarf_internal IS
	'dwarf''s own helpers, called by its functions, views and workers: not an API, may change without notice';

/*
 * Tables.  They are the truth: the workers keep each running flow in memory
 * only to go faster, and rebuild it from these rows after any restart.
 */

CREATE TABLE dwarf.graph (
	id			serial PRIMARY KEY,
	name		text NOT NULL,
	version		int NOT NULL,
	definition	jsonb NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now(),
	owner		regrole NOT NULL DEFAULT current_user::regrole,
	UNIQUE (name, owner, version)
);
COMMENT ON TABLE dwarf.graph IS
	'Workflow definitions; one row per version, written by dwarf.define()';
COMMENT ON COLUMN dwarf.graph.owner IS
	'The role that defined the graph: a graph name is its owner''s, and a role''s calls find its own graphs first, '
	'then those of the roles it belongs to; another role''s graph is named as role.name';

CREATE SEQUENCE dwarf.flow_seq;
COMMENT ON SEQUENCE dwarf.flow_seq IS
	'Low 40 bits of flow ids; bits 40 to 47 carry the WAL timeline less one (0 until a promotion), '
	'bits 48 to 62 dwarf.shard_id';

CREATE TABLE dwarf.flow (
	id			bigint PRIMARY KEY,
	graph_id	int NOT NULL,
	status		text NOT NULL DEFAULT 'running'
				CHECK (status IN ('running', 'interrupted', 'completed', 'failed', 'cancelled')),
	owner		regrole NOT NULL,
	priority	int NOT NULL DEFAULT 0,
	idempotency_key text,
	input		jsonb NOT NULL,
	state		jsonb,
	error		text,
	interrupt_payload jsonb,
	resume_data jsonb,
	cancel_reason text,
	thread		text,
	baggage		jsonb,
	fairness_key text,
	fairness_weight int NOT NULL DEFAULT 1,
	time_budget interval,
	delete_on_completion boolean NOT NULL DEFAULT false,
	start_task	text,
	parent_id	bigint,
	parent_key	text,
	root_id		bigint,
	tree_flows	int NOT NULL DEFAULT 1,
	created_at	timestamptz NOT NULL DEFAULT now(),
	finished_at timestamptz
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX flow_idempotency_key ON dwarf.flow (owner, idempotency_key)
	WHERE idempotency_key IS NOT NULL;
CREATE INDEX flow_thread ON dwarf.flow (thread, id) WHERE thread IS NOT NULL;
CREATE UNIQUE INDEX flow_parent ON dwarf.flow (parent_id, parent_key) WHERE parent_id IS NOT NULL;
CREATE INDEX flow_root ON dwarf.flow (root_id) WHERE root_id IS NOT NULL;
COMMENT ON TABLE dwarf.flow IS
	'One row per flow. Written when the flow is created and when it closes; '
	'a running flow''s progress lives in dwarf.step';
COMMENT ON COLUMN dwarf.flow.state IS
	'Final state once the flow has closed, or the state at an interrupt; NULL while it runs (see dwarf.snapshot)';
COMMENT ON COLUMN dwarf.flow.resume_data IS
	'What dwarf.resume handed over, until the owning worker records it as a step';
COMMENT ON COLUMN dwarf.flow.baggage IS
	'JSON every task of the flow can read with dwarf.baggage(); not part of the state';
COMMENT ON COLUMN dwarf.flow.fairness_key IS
	'Within a priority, ready steps are dispatched in proportion to fairness_weight across keys';
COMMENT ON COLUMN dwarf.flow.time_budget IS
	'How long one step may run; a task past it is stopped and its step fails';
COMMENT ON COLUMN dwarf.flow.start_task IS
	'The task the flow starts at, when not the graph''s entry (dwarf.fork)';
COMMENT ON COLUMN dwarf.flow.parent_id IS
	'For a child flow started by dwarf.subgraph: the parent flow (parent_key: which call)';
COMMENT ON COLUMN dwarf.flow.root_id IS
	'For a child flow: the flow at the top of its tree of subgraphs (NULL for that flow itself), '
	'so that dwarf.cancel stops a whole tree with one statement';
COMMENT ON COLUMN dwarf.flow.tree_flows IS
	'On a flow that started subgraphs: how many flows its tree has had, itself included '
	'(capped by dwarf.max_tree_flows)';

/*
 * Step ids: each worker takes a block of 64 at a time (store.c), as a cache
 * would, but with one nextval a block, so that a task's lastval() does not
 * show it (session.c).
 */
CREATE SEQUENCE dwarf.step_seq INCREMENT BY 64;

/*
 * The step log: what each step attempt did, appended when the step's
 * transaction commits.  This is the only thing written per step: the
 * flow's cursor is the set of its steps, so replaying them over the flow's
 * input rebuilds where it stands.  Read it as dwarf.step, one row per step.
 *
 * It is stored packed: a row of dwarf.step_log holds the steps of one flow
 * that one transaction wrote together (a worker's batch runs a flow's
 * chain of steps in one transaction), each column an array with an element
 * per step, in execution order, and NULL where every element would be.
 * One row and one index entry for a flow's run of steps, not one per step,
 * is what halves the WAL a step costs (bench/README.md, issue 25).
 * first_step and last_step are the first and last of the row's step ids,
 * for the lookups by step id (dwarf.fork).
 *
 * The step log is written once and never moved.  It is partitioned by
 * flow id into segments, each the steps of the flows created in a span of
 * time (dwarf.segment_interval): dwarf.maintain makes the next segments
 * ahead of the flow ids, hands a segment whose flows have all closed to
 * dwarf.step_log_archive by detaching and attaching it (no row is copied),
 * and drops archived segments past dwarf.retention whole.  A segment has
 * no updates and no deletes, so autovacuum has nothing to do there and is
 * off.  The default partition takes what no segment covers: every step
 * until dwarf.maintain first runs, the steps of a flow whose id was handed
 * out before its segment was archived, and the steps of the few flows
 * still open in a segment that is archived (moved there, see
 * dwarf_internal.maintain_at).
 *
 * No index spans partitions (pg_dump's output of a segment must restore as
 * it is, see dwarf.step_log_archive); each partition has its own, made
 * with it (dwarf_internal.make_step_segment).
 */
CREATE TABLE dwarf.step_log (
	flow_id		bigint NOT NULL,
	first_step	bigint NOT NULL,
	last_step	bigint NOT NULL,
	step_id		bigint[] NOT NULL,
	token		int[] NOT NULL,
	task		text[] NOT NULL,
	status		text[] NOT NULL,
	attempt		int[] NOT NULL,
	started_at	timestamptz[] NOT NULL,
	finished_at timestamptz[] NOT NULL,
	changes		jsonb[],
	goto_task	text[],
	wake_at		timestamptz[],
	signal		jsonb[],
	error		jsonb[]
) PARTITION BY RANGE (flow_id);
CREATE TABLE dwarf.step_default (LIKE dwarf.step_log INCLUDING DEFAULTS);
CREATE UNIQUE INDEX step_default_pkey ON dwarf.step_default (flow_id, first_step);
CREATE INDEX step_default_step_id ON dwarf.step_default USING brin (first_step, last_step);
ALTER TABLE dwarf.step_log ATTACH PARTITION dwarf.step_default DEFAULT;
COMMENT ON TABLE dwarf.step_default IS
	'Steps no segment of dwarf.step_log covers (see dwarf.segment); read them through dwarf.step';
COMMENT ON TABLE dwarf.step_log IS
	'Durable step log, packed: a row per flow and transaction that wrote its steps, a column an array with an '
	'element per step (NULL: every element is); read it through dwarf.step, a row per step';

CREATE VIEW dwarf.step WITH (security_invoker = true) AS
	SELECT l.flow_id, s.step_id, s.token, s.task, s.status, s.attempt, s.started_at, s.finished_at,
		   s.changes, s.goto_task, s.wake_at, s.signal, s.error
	  FROM dwarf.step_log l,
		   LATERAL unnest(l.step_id, l.token, l.task, l.status, l.attempt, l.started_at,
						  l.finished_at, l.changes, l.goto_task, l.wake_at, l.signal, l.error)
			 AS s(step_id, token, task, status, attempt, started_at, finished_at,
				  changes, goto_task, wake_at, signal, error);
COMMENT ON VIEW dwarf.step IS
	'Durable step log: one row per task execution (dwarf.step_log unpacked); a flow''s steps in execution order '
	'are its rows by step_id';
COMMENT ON COLUMN dwarf.step.status IS
	'completed, failed, retry (dwarf.retry, or an error the task''s retry policy retries), interrupted, resumed (dwarf.resume) or waiting (dwarf.subgraph). '
	'Workers append the rows of dwarf.step_log directly, without the executor: no triggers run for them';
COMMENT ON COLUMN dwarf.step.token IS
	'Flow-local number of the branch (token) that ran the step';
COMMENT ON COLUMN dwarf.step.wake_at IS
	'When what follows the step may run (dwarf.sleep, dwarf.retry backoff); NULL for at once';
COMMENT ON COLUMN dwarf.step.signal IS
	'The payload of an interrupted step, the data a resumed step was given, or the child a waiting step waits for';
COMMENT ON COLUMN dwarf.step.error IS
	'The task''s error as {message, sqlstate, detail, hint, task}; NULL on success. '
	'A step the engine refused on a cap also names the setting, as cap';

/*
 * Privileges: anyone may read graphs; a role sees only the flows (and steps)
 * of roles whose privileges it has (the step log's policy is made with the
 * archive's, below).  All writes go through the functions below, which
 * check ownership themselves.
 */
REVOKE ALL ON dwarf.graph, dwarf.flow, dwarf.step_log, dwarf.step, dwarf.step_default FROM PUBLIC;
GRANT SELECT ON dwarf.graph, dwarf.flow, dwarf.step_log, dwarf.step TO PUBLIC;
ALTER TABLE dwarf.flow ENABLE ROW LEVEL SECURITY;
ALTER TABLE dwarf.step_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY flow_owner ON dwarf.flow FOR SELECT
	USING (pg_has_role(owner, 'USAGE'));

/*
 * A priority below 0 runs a flow's steps before every other role's, so it is
 * a privilege: dwarf.create and dwarf.run allow one only to superusers and
 * to roles with the privileges of dwarf_priority (GRANT dwarf_priority TO
 * ops), and dwarf.fork, dwarf.continue and dwarf.subgraph, whose new flow
 * takes the priority of the flow it follows, check the same.  Roles belong
 * to the whole cluster: a database that installs dwarf after another finds
 * the role made, and DROP EXTENSION leaves it.
 */
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'dwarf_priority') THEN
		CREATE ROLE dwarf_priority NOLOGIN;
		COMMENT ON ROLE dwarf_priority IS
			'Members may create dwarf flows with a priority below 0, ahead of every other role''s';
	END IF;
END
$$;

/*
 * pg_dump: the rows of these tables and where the sequences stand are the
 * database's data, not the extension's definition, so pg_dump dumps them
 * (a restore's CREATE EXTENSION makes the tables empty and the sequences
 * new, then the rows are copied in and the sequences set).  The archive's
 * day partitions need no mark: dwarf.maintain makes them at run time, so
 * they are not members of the extension and pg_dump dumps each one whole,
 * with its indexes and rows, as any table of the database; their
 * partitioned parents hold no rows of their own.  dwarf.maintain_log is
 * marked where it is made, below.
 */
SELECT pg_catalog.pg_extension_config_dump('dwarf.graph', '');
SELECT pg_catalog.pg_extension_config_dump('dwarf.graph_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('dwarf.flow', '');
SELECT pg_catalog.pg_extension_config_dump('dwarf.flow_seq', '');
SELECT pg_catalog.pg_extension_config_dump('dwarf.step_default', '');
SELECT pg_catalog.pg_extension_config_dump('dwarf.step_seq', '');

/*
 * A physical copy of a server (pg_basebackup, a file-system snapshot) holds
 * the same flows and sequences, so left alone it hands out the flow ids and
 * step keys its source hands out too.  A copy that will run apart from its
 * source (a staging clone of production) takes a tag of its own with
 * dwarf.new_incarnation(); every dwarf.step_key() it gives from then on
 * carries the tag, so no service outside sees a key of the source again.
 * No row: the original server's keys carry no tag.
 */
CREATE TABLE dwarf.incarnation (
	tag			text NOT NULL,
	taken_at	timestamptz NOT NULL DEFAULT now(),
	one_row		boolean PRIMARY KEY DEFAULT true CHECK (one_row)
);
COMMENT ON TABLE dwarf.incarnation IS
	'The tag this database''s step keys carry since dwarf.new_incarnation() (no row: none)';
REVOKE ALL ON dwarf.incarnation FROM PUBLIC;
GRANT SELECT ON dwarf.incarnation TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('dwarf.incarnation', '');

/*
 * After a restore, the workers take the restored flows in.  The restore
 * copies the rows in after CREATE EXTENSION has started the database's
 * workers, which know only the flows they were told of: this trigger asks
 * each of them to scan the tables again once the session that copied the
 * steps ends (restore.c says why not sooner).  Nothing else writes
 * dwarf.step_log with a statement: the workers append its rows without the
 * executor's triggers, so the trigger costs them nothing.
 */
CREATE FUNCTION dwarf_internal.restored() RETURNS trigger
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_restored';
COMMENT ON FUNCTION dwarf_internal.restored() IS
	'Trigger of dwarf.step_restored: once the session ends, every dwarf worker of the database scans its tables '
	'again and carries on the flows it finds';
CREATE TRIGGER step_restored AFTER INSERT ON dwarf.step_log
	FOR EACH STATEMENT EXECUTE FUNCTION dwarf_internal.restored();
/* A restore copies the rows into each partition, not through dwarf.step_log. */
CREATE TRIGGER step_restored AFTER INSERT ON dwarf.step_default
	FOR EACH STATEMENT EXECUTE FUNCTION dwarf_internal.restored();
COMMENT ON TRIGGER step_restored ON dwarf.step_log IS
	'Fires for rows written with a statement, which only a restore (pg_restore, psql) does: '
	'the workers take in the restored flows when its session ends';

/*
 * The archive: closed flows, moved out of the live tables by
 * dwarf.maintain() once they have been closed for dwarf.archive_after, and
 * the step log's segments whose flows have all closed, handed over whole.
 * Flows are partitioned by the day (UTC) they closed, made by
 * dwarf_internal.make_archive_day, each with indexes of its own, and a day
 * goes as one DROP once older than dwarf.retention.  Steps are partitioned
 * by flow id as dwarf.step_log is: a segment detached from dwarf.step_log is
 * attached here as it is, and dropped once its newest flow's day has gone.
 * Nobody is granted the partitions directly, so every read goes through
 * these parents and their row-level security.
 *
 * The parents have no partitioned indexes, so that pg_dump's output of a
 * partition restores as it is: attached to a parent with partitioned
 * indexes (which CREATE EXTENSION would have made before the restore
 * attaches the partition), it would get indexes of the same names made
 * for it, and the dump's own CREATE INDEX of them would fail.  A read
 * through a parent uses each partition's indexes all the same.
 */
CREATE TABLE dwarf.flow_archive (LIKE dwarf.flow INCLUDING DEFAULTS)
	PARTITION BY RANGE (finished_at);
ALTER TABLE dwarf.flow_archive ALTER COLUMN finished_at SET NOT NULL;
COMMENT ON TABLE dwarf.flow_archive IS
	'Closed flows moved out of dwarf.flow by dwarf.maintain(); one partition per day the flow closed (UTC)';

CREATE TABLE dwarf.step_log_archive (LIKE dwarf.step_log INCLUDING DEFAULTS)
	PARTITION BY RANGE (flow_id);
COMMENT ON TABLE dwarf.step_log_archive IS
	'The segments of the step log whose flows have all closed, handed over by dwarf.maintain() as they are '
	'(see dwarf.segment); read them through dwarf.step_archive, or a flow''s steps with dwarf.history(flow_id)';
CREATE VIEW dwarf.step_archive WITH (security_invoker = true) AS
	SELECT l.flow_id, s.step_id, s.token, s.task, s.status, s.attempt, s.started_at, s.finished_at,
		   s.changes, s.goto_task, s.wake_at, s.signal, s.error
	  FROM dwarf.step_log_archive l,
		   LATERAL unnest(l.step_id, l.token, l.task, l.status, l.attempt, l.started_at,
						  l.finished_at, l.changes, l.goto_task, l.wake_at, l.signal, l.error)
			 AS s(step_id, token, task, status, attempt, started_at, finished_at,
				  changes, goto_task, wake_at, signal, error);
COMMENT ON VIEW dwarf.step_archive IS
	'Archived steps, one row per task execution (dwarf.step_log_archive unpacked)';

REVOKE ALL ON dwarf.flow_archive, dwarf.step_log_archive, dwarf.step_archive FROM PUBLIC;
GRANT SELECT ON dwarf.flow_archive, dwarf.step_log_archive, dwarf.step_archive TO PUBLIC;
ALTER TABLE dwarf.flow_archive ENABLE ROW LEVEL SECURITY;
ALTER TABLE dwarf.step_log_archive ENABLE ROW LEVEL SECURITY;
CREATE POLICY flow_archive_owner ON dwarf.flow_archive FOR SELECT
	USING (pg_has_role(owner, 'USAGE'));
/*
 * A flow's steps are its owner's to read wherever its row is: a pass of
 * dwarf.maintain moves a closed flow's row to the archive long before its
 * segment of the step log follows (a segment goes once all of its flows have
 * closed), so the live step log's policy looks in the archive too.  The
 * live table is looked at first: the archive is read only for the steps of
 * a flow whose row has left it.
 */
CREATE POLICY step_owner ON dwarf.step_log FOR SELECT
	USING (EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id = flow_id)
		   OR EXISTS (SELECT 1 FROM dwarf.flow_archive f WHERE f.id = flow_id));
CREATE POLICY step_archive_owner ON dwarf.step_log_archive FOR SELECT
	USING (EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id = flow_id)
		   OR EXISTS (SELECT 1 FROM dwarf.flow_archive f WHERE f.id = flow_id));

/*
 * The step log's segments, live (attached to dwarf.step_log) or archived
 * (attached to dwarf.step_log_archive): the flow ids [lo, hi) each covers.
 * dwarf.maintain makes them and keeps this table; a segment made to cover
 * ids handed out before any segment did (a gap) starts archived.
 */
CREATE TABLE dwarf.segment (
	lo			bigint PRIMARY KEY,
	hi			bigint NOT NULL CHECK (hi > lo),
	relation	name NOT NULL UNIQUE,
	live		boolean NOT NULL,
	made_at		timestamptz NOT NULL DEFAULT now(),
	archived_at timestamptz,
	newest_close timestamptz,
	summarized_to bigint
);
COMMENT ON TABLE dwarf.segment IS
	'The partitions of the step log: flow ids [lo, hi), in dwarf.step_log (live) or dwarf.step_log_archive; '
	'newest_close: the latest close of a flow whose steps it holds, which dwarf.retention counts from; '
	'summarized_to: how many block ranges of 128 pages its index on step ids summarizes';
REVOKE ALL ON dwarf.segment FROM PUBLIC;
GRANT SELECT ON dwarf.segment TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('dwarf.segment', '');

/*
 * Live and archived together, for every read that takes a flow or step id.
 * A flow is in exactly one of the two in any snapshot: dwarf.maintain moves
 * it in one transaction.  A read of one flow by id says LIMIT 1: the live
 * table comes first, and a live flow's read then stops there, never
 * reading the archive's days (a day finds an id through a block-range
 * index until a pass gives it a B-tree, see
 * dwarf_internal.make_archive_day).
 */
CREATE VIEW dwarf.flow_all WITH (security_invoker = true) AS
	SELECT * FROM dwarf.flow
	UNION ALL
	SELECT * FROM dwarf.flow_archive;
COMMENT ON VIEW dwarf.flow_all IS 'dwarf.flow and dwarf.flow_archive together';
CREATE VIEW dwarf.step_all WITH (security_invoker = true) AS
	SELECT * FROM dwarf.step
	UNION ALL
	SELECT * FROM dwarf.step_archive;
COMMENT ON VIEW dwarf.step_all IS 'dwarf.step and dwarf.step_archive together';
GRANT SELECT ON dwarf.flow_all, dwarf.step_all TO PUBLIC;

/*
 * A flow's steps, live or archived: the segment (or default partition) of
 * dwarf.step_log or dwarf.step_log_archive that covers its id.  The statement is
 * planned for the id at each call (EXECUTE), so that both parents are
 * pruned to that one partition when planned: a plan for any id would lock
 * every partition of the archive at each call.  It is a lookup of a few
 * rows, whatever the statistics of a partition still filling up say: no
 * sequential scan, no parallel plan, no JIT.  dwarf.history is how a user
 * reads them; this is what it, snapshot, state_at and replay_state read
 * from.
 */
CREATE FUNCTION dwarf_internal.flow_steps(flow_id bigint) RETURNS SETOF dwarf.step
	LANGUAGE plpgsql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
	SET enable_seqscan = off
	SET max_parallel_workers_per_gather = 0
	SET jit = off
	AS $$
BEGIN
	RETURN QUERY EXECUTE format('SELECT * FROM dwarf.step_all s WHERE s.flow_id = %s', flow_steps.flow_id);
END
$$;
COMMENT ON FUNCTION dwarf_internal.flow_steps(bigint) IS
	'The steps of a flow (live or archived) the caller may see, in no particular order';

/*
 * A failed flow's error names the task that failed and its SQLSTATE, detail
 * and hint, beside the message (error, kept as it was): they are read from
 * the failed step whose message the flow's error is (its error document,
 * what an on_error handler finds in onErr), so a flow row stores the
 * message only.  A flow failed by the engine rather than by a step (its
 * graph version gone, a step that could not be recorded) has only the
 * message.
 */
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
COMMENT ON TYPE dwarf.outcome IS
	'What dwarf.await, dwarf.await_all, dwarf.await_any and dwarf.run return; a failed flow''s error_task, '
	'error_sqlstate, error_detail and error_hint come from the step that failed it';

/*
 * The error document of the step that failed a flow (status failed, error
 * its message), NULL for any other flow.  A subquery of the readers below:
 * a CASE around it keeps it off every flow but a failed one.
 */
CREATE FUNCTION dwarf_internal.failed_step_error(flow_id bigint, error text) RETURNS jsonb
	LANGUAGE sql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT s.error FROM dwarf_internal.flow_steps(failed_step_error.flow_id) s
	 WHERE s.status = 'failed' AND s.error ->> 'message' = failed_step_error.error
	 ORDER BY s.step_id DESC LIMIT 1;
END;
COMMENT ON FUNCTION dwarf_internal.failed_step_error(bigint, text) IS
	'The error document ({message, sqlstate, detail, hint, task}) of the step whose error, error, failed the flow; '
	'NULL when no step did';

CREATE FUNCTION dwarf.check_flow(flow_id bigint) RETURNS void
	LANGUAGE c STRICT STABLE
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_check_flow';
COMMENT ON FUNCTION dwarf.check_flow(bigint) IS
	'Raises the error every dwarf function that takes a flow id raises for one the caller cannot see, live or '
	'archived: "flow N does not exist" (SQLSTATE 42704), with a hint when the id names another shard or timeline';

/*
 * Functions.  Those in SQL that call dwarf_internal's helpers have
 * SQL-standard bodies (BEGIN ATOMIC), resolved when this script runs: a
 * body in a string would be parsed at each caller's first call, as the
 * caller, who has no USAGE on dwarf_internal.
 */

CREATE FUNCTION dwarf.validate(definition jsonb) RETURNS jsonb
	LANGUAGE c STRICT STABLE
	AS 'MODULE_PATHNAME', 'dwarf_validate';
COMMENT ON FUNCTION dwarf.validate(jsonb) IS
	'Checks a graph definition and returns it with its entry filled in; raises an error naming the bad node or edge';

CREATE FUNCTION dwarf.define(name text, definition jsonb) RETURNS int
	LANGUAGE c STRICT
	AS 'MODULE_PATHNAME', 'dwarf_define';
COMMENT ON FUNCTION dwarf.define(text, jsonb) IS
	'Stores a new version of the calling role''s graph of that name and returns it; running flows keep the version '
	'they started with. Names that look like others (invisible characters, mixed Latin, Greek and Cyrillic letters) '
	'are refused; names are stored in NFC';

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
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_create';
COMMENT ON FUNCTION dwarf.create(text, jsonb, int, text, text, int, interval, boolean, jsonb, text) IS
	'Creates a flow of the latest version of a graph (the caller''s own of that name, else one of a role it '
	'belongs to, else role.name''s); it starts when the calling transaction commits';

CREATE FUNCTION dwarf.await(flow_id bigint, timeout interval DEFAULT '30 s')
	RETURNS dwarf.outcome
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_await';
COMMENT ON FUNCTION dwarf.await(bigint, interval) IS
	'Waits until the flow closes or is interrupted, or the timeout passes, and returns its outcome';

CREATE FUNCTION dwarf.await_all(flow_ids bigint[], timeout interval DEFAULT '30 s')
	RETURNS SETOF dwarf.outcome
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_await_all';
COMMENT ON FUNCTION dwarf.await_all(bigint[], interval) IS
	'Waits until every flow closes or is interrupted, or the timeout passes, in one connection; '
	'returns one outcome per element of flow_ids, in their order (past the timeout, as each is now)';

CREATE FUNCTION dwarf.await_any(flow_ids bigint[], timeout interval DEFAULT '30 s')
	RETURNS dwarf.outcome
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_await_any';
COMMENT ON FUNCTION dwarf.await_any(bigint[], interval) IS
	'Waits until one of the flows closes or is interrupted, and returns its outcome (the first such in flow_ids'' '
	'order); past the timeout, the first flow''s outcome as it is now (running)';

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
	LANGUAGE c
	-- no SET search_path: the C function pins it itself, at less cost per call
	AS 'MODULE_PATHNAME', 'dwarf_run';
COMMENT ON FUNCTION dwarf.run(text, jsonb, interval, int, text, text, int, interval, boolean, jsonb, text) IS
	'Creates a flow (committed by the engine, independently of the caller) and awaits it';

CREATE FUNCTION dwarf.cancel(flow_id bigint, reason text DEFAULT NULL)
	RETURNS boolean
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_cancel';
COMMENT ON FUNCTION dwarf.cancel(bigint, text) IS
	'Cancels a running or interrupted flow and its subgraph flows at any depth, those started while it runs included; '
	'none starts a further step. '
	'Returns false, changing nothing, when the flow has already closed';

CREATE FUNCTION dwarf.resume(flow_id bigint, data jsonb DEFAULT 'null')
	RETURNS void
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_resume';
COMMENT ON FUNCTION dwarf.resume(bigint, jsonb) IS
	'Resumes an interrupted flow: the interrupted task runs again and its dwarf.interrupt call returns data';

/*
 * External tasks ({"external": "queue"} in a graph's tasks): a worker
 * outside the server claims a waiting step, does the work, and completes
 * (or fails) it in its own transaction.  Claims and leases live in shared
 * memory; the answer is a row of dwarf.answer, written with the outside
 * worker's own writes, that the flow's worker records as the step's row
 * (and deletes) once it is committed.
 */
CREATE TABLE dwarf.answer (
	flow_id		bigint NOT NULL,
	token		int NOT NULL,
	visits		int NOT NULL,
	attempt		int NOT NULL,
	status		text NOT NULL CHECK (status IN ('completed', 'failed')),
	changes		jsonb,
	error		jsonb,
	retryable	boolean NOT NULL,
	started_at	timestamptz NOT NULL,
	finished_at timestamptz NOT NULL,
	PRIMARY KEY (flow_id, token, visits, attempt)
);
COMMENT ON TABLE dwarf.answer IS
	'Answers of outside workers to steps of external tasks (dwarf.complete, dwarf.fail), '
	'until the flow''s worker records each as the step''s row';
REVOKE ALL ON dwarf.answer FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('dwarf.answer', '');

CREATE FUNCTION dwarf.claim(queue text, max int DEFAULT 1, lease interval DEFAULT NULL,
							wait interval DEFAULT '0')
	RETURNS TABLE (lease bigint, flow_id bigint, graph text, task text, attempt int,
				   input jsonb, baggage jsonb, step_key text, lease_until timestamptz)
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_claim';
COMMENT ON FUNCTION dwarf.claim(text, int, interval, interval) IS
	'Leases up to max waiting steps of the queue''s external tasks, of flows whose owners'' privileges you have, '
	'oldest first, for lease (NULL: the task''s lease, 5 min by default); waits up to wait for the first. '
	'Writes nothing: a claim needs no commit, and a lease holds whatever becomes of the transaction';

CREATE FUNCTION dwarf.complete(lease bigint, changes jsonb DEFAULT NULL) RETURNS void
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_complete';
COMMENT ON FUNCTION dwarf.complete(bigint, jsonb) IS
	'Completes the step of a held lease with changes (a JSON object, or NULL for none) when your transaction commits: '
	'what else it wrote commits with the step, exactly once';

CREATE FUNCTION dwarf.fail(lease bigint, error text, retryable boolean DEFAULT true) RETURNS void
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_fail';
COMMENT ON FUNCTION dwarf.fail(bigint, text, boolean) IS
	'Fails the attempt of a held lease when your transaction commits: the task''s retry policy offers the step again '
	'(retryable only) or the step fails (its on_error edges, or the flow fails)';

CREATE FUNCTION dwarf.extend(lease bigint, lease_for interval) RETURNS timestamptz
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_extend';
COMMENT ON FUNCTION dwarf.extend(bigint, interval) IS
	'Heartbeat of a long external step: its lease now ends lease_for from now (returned). '
	'A lease that ran out is not extended: its attempt has failed';

CREATE FUNCTION dwarf.external_steps(queue text DEFAULT NULL)
	RETURNS TABLE (queue text, flow_id bigint, task text, attempt int, state text,
				   leased_at timestamptz, lease_until timestamptz)
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_external_steps';
COMMENT ON FUNCTION dwarf.external_steps(text) IS
	'The steps of external tasks waiting now, of flows whose owners'' privileges you have: '
	'ready, leased (since, until), answering, or expired (its failed attempt being recorded)';

/*
 * HTTP tasks ({"http": "POST https://host/path"}): the server's own HTTP
 * process makes the call; the answer is the step's changes.  A flow's
 * owner needs EXECUTE on dwarf.http_call for its HTTP steps to be called
 * (checked before each call); the URL must be inside dwarf.http_allow.
 */
CREATE FUNCTION dwarf.http_call(url text) RETURNS boolean
	LANGUAGE c STABLE
	AS 'MODULE_PATHNAME', 'dwarf_http_call';
COMMENT ON FUNCTION dwarf.http_call(text) IS
	'Whether HTTP tasks may call url (it starts with one of dwarf.http_allow''s prefixes). '
	'EXECUTE on this function is the privilege of making HTTP calls: '
	'the HTTP steps of a flow whose owner lacks it fail without a request';
REVOKE ALL ON FUNCTION dwarf.http_call(text) FROM PUBLIC;

CREATE FUNCTION dwarf.goto(task text) RETURNS void
	LANGUAGE c STRICT
	AS 'MODULE_PATHNAME', 'dwarf_goto';
COMMENT ON FUNCTION dwarf.goto(text) IS
	'Inside a task: take the goto edge to the named task when this task returns';

CREATE FUNCTION dwarf.retry(initial interval DEFAULT '1 s', factor float8 DEFAULT 2,
							max interval DEFAULT '5 min',
							give_up_after interval DEFAULT NULL)
	RETURNS boolean
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_retry';
COMMENT ON FUNCTION dwarf.retry(interval, float8, interval, interval) IS
	'Inside a task: true, and this step runs again after exponential backoff once the task returns; '
	'false once give_up_after has passed since the first attempt (then raise the error). '
	'A task''s "retry" policy in the graph retries its errors without it';

CREATE FUNCTION dwarf.sleep(duration interval) RETURNS void
	LANGUAGE c STRICT
	AS 'MODULE_PATHNAME', 'dwarf_sleep';
COMMENT ON FUNCTION dwarf.sleep(interval) IS
	'Inside a task: what follows this step runs only after the interval; the flow holds no worker meanwhile';

/*
 * Named limits, a role's own like its graphs: a task that names one
 * ("limit": "openai", or {"name": "openai", "key": "$.customer"} for a
 * count per customer) has at most concurrency steps of its owner's flows in
 * progress and at most rate starts per per.  "openai" is the flow owner's
 * limit; "team.openai" is role team's, which only a graph whose definer has
 * team's privileges may name.  The settings are rows here (dumped with the
 * database), each visible to the roles with its owner's privileges; the
 * counts are in shared memory (limits.c).
 */
CREATE TABLE dwarf.limit (
	name		text COLLATE "C" NOT NULL
				CHECK (name <> '' AND octet_length(name) < 64),
	owner		regrole NOT NULL,
	concurrency int CHECK (concurrency >= 0),
	rate		int CHECK (rate >= 1),
	per			interval NOT NULL DEFAULT '1 s' CHECK (per > '0'),
	set_at		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (owner, name)
);
COMMENT ON TABLE dwarf.limit IS
	'Named limits, each its owner''s, written by dwarf.set_limit(): at most concurrency steps of the owner''s tasks '
	'that name one in progress, and at most rate starts per per (NULL: no bound)';
REVOKE ALL ON dwarf.limit FROM PUBLIC;
GRANT SELECT ON dwarf.limit TO PUBLIC;
ALTER TABLE dwarf.limit ENABLE ROW LEVEL SECURITY;
CREATE POLICY limit_owner ON dwarf.limit FOR SELECT
	USING (pg_has_role(owner, 'USAGE'));
SELECT pg_catalog.pg_extension_config_dump('dwarf.limit', '');

CREATE FUNCTION dwarf.set_limit(name text, concurrency int DEFAULT NULL, rate int DEFAULT NULL,
								per interval DEFAULT '1 s')
	RETURNS void
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_set_limit';
COMMENT ON FUNCTION dwarf.set_limit(text, int, int, interval) IS
	'Sets the caller''s named limit (role.name: that role''s, with its privileges) for the tasks that name it '
	'("limit" in the graph): at most concurrency of the steps of its flows in progress at once and at most rate '
	'starts per per, across every graph (NULL: no bound; lowered while more run, new steps wait until fewer do). '
	'With a key, each value of it has counts of its own. A task whose limit is not set is not limited';

CREATE FUNCTION dwarf.drop_limit(name text)
	RETURNS boolean
	LANGUAGE c STRICT
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_drop_limit';
COMMENT ON FUNCTION dwarf.drop_limit(text) IS
	'Drops the caller''s named limit (role.name: that role''s, with its privileges): the tasks that name it are '
	'no longer limited, and its counts go once nothing is in progress under them. False when there was none';

CREATE FUNCTION dwarf.limit_counts(OUT owner regrole, OUT name text, OUT key text, OUT in_progress int)
	RETURNS SETOF record
	LANGUAGE c STRICT
	AS 'MODULE_PATHNAME', 'dwarf_limit_counts';
COMMENT ON FUNCTION dwarf.limit_counts() IS
	'The live counts of the named limits of roles whose privileges you have, in this database: steps in progress '
	'by owner, limit and key (NULL: the limit''s own count, also for a step whose key has no value); counts of '
	'names not set too';

CREATE VIEW dwarf.limits WITH (security_invoker = true) AS
	SELECT l.name, l.owner, l.concurrency, l.rate, l.per, c.key,
		   coalesce(c.in_progress, 0) AS in_progress
	  FROM dwarf.limit l
	  LEFT JOIN dwarf.limit_counts() c ON c.owner = l.owner AND c.name COLLATE "C" = l.name;
COMMENT ON VIEW dwarf.limits IS
	'Each named limit of a role whose privileges you have, with its settings and its steps in progress, a row per '
	'key counted';
GRANT SELECT ON dwarf.limits TO PUBLIC;

CREATE FUNCTION dwarf.interrupt(payload jsonb DEFAULT NULL) RETURNS jsonb
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_interrupt';
COMMENT ON FUNCTION dwarf.interrupt(jsonb) IS
	'Inside a task: NULL the first time, and the flow parks as interrupted with the payload once the task returns; '
	'after dwarf.resume(flow, data) the task runs again and the same call returns data';

CREATE FUNCTION dwarf.subgraph(graph text, input jsonb DEFAULT '{}') RETURNS jsonb
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_subgraph';
COMMENT ON FUNCTION dwarf.subgraph(text, jsonb) IS
	'Inside a task: NULL the first time, and a child flow starts (of the graph that name means to the flow''s '
	'owner, as for dwarf.create); when it completes the task runs again '
	'and the same call returns the child''s final state (a failed child raises an error)';

CREATE FUNCTION dwarf.step_key() RETURNS text
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_step_key';
COMMENT ON FUNCTION dwarf.step_key() IS
	'Inside a task: a key for this step, stable across attempts and crashes, for idempotent external calls';

CREATE FUNCTION dwarf.new_incarnation() RETURNS text
	LANGUAGE plpgsql STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	tag text := left(replace(gen_random_uuid()::text, '-', ''), 16);
BEGIN
	IF pg_is_in_recovery() THEN
		RAISE EXCEPTION 'dwarf.new_incarnation() cannot run on a standby server'
			USING ERRCODE = 'read_only_sql_transaction',
				  HINT = 'Run it on the copy once it runs as a primary, before it runs flows.';
	END IF;
	DELETE FROM dwarf.incarnation;
	INSERT INTO dwarf.incarnation (tag) VALUES (tag);
	RETURN tag;
END
$$;
REVOKE ALL ON FUNCTION dwarf.new_incarnation() FROM PUBLIC;
COMMENT ON FUNCTION dwarf.new_incarnation() IS
	'On a physical copy that runs apart from its source: a new random tag that every dwarf.step_key() '
	'of this database carries from now on, so that the copy never gives a key its source gives';

CREATE FUNCTION dwarf.baggage() RETURNS jsonb
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_baggage';
COMMENT ON FUNCTION dwarf.baggage() IS 'Inside a task: the baggage the flow was created with';

CREATE FUNCTION dwarf.flow_id() RETURNS bigint
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_flow_id';
COMMENT ON FUNCTION dwarf.flow_id() IS 'Inside a task: the id of the flow it runs for';

CREATE FUNCTION dwarf_internal.fold_changes(input jsonb, changes jsonb[], reducers jsonb)
	RETURNS jsonb
	LANGUAGE c IMMUTABLE
	AS 'MODULE_PATHNAME', 'dwarf_fold_changes';
COMMENT ON FUNCTION dwarf_internal.fold_changes(jsonb, jsonb[], jsonb) IS
	'Merges step changes into a state in order, with the given per-field reducers';

CREATE FUNCTION dwarf.replay_state(flow_id bigint, before_step bigint DEFAULT NULL)
	RETURNS jsonb
	LANGUAGE c STABLE
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_replay_state';
COMMENT ON FUNCTION dwarf.replay_state(bigint, bigint) IS
	'A flow''s state as its worker computes it, its steps replayed over its input: the final state, or its one live branch''s; NULL while several branches run. '
	'An unknown flow is an error';

CREATE FUNCTION dwarf.state_at(flow_id bigint, before_step bigint DEFAULT NULL)
	RETURNS jsonb
	LANGUAGE sql STABLE
	SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT dwarf.check_flow(state_at.flow_id);
	SELECT coalesce(dwarf.replay_state(state_at.flow_id, state_at.before_step),
		   dwarf_internal.fold_changes(f.input,
			   ARRAY(SELECT s.changes FROM dwarf_internal.flow_steps(f.id) s
					  WHERE s.status IN ('completed', 'retry')
						AND (state_at.before_step IS NULL OR s.step_id < state_at.before_step)
					  ORDER BY s.step_id),
			   g.definition -> 'reducers'))
	  FROM dwarf.flow_all f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE f.id = state_at.flow_id
	 LIMIT 1;
END;
COMMENT ON FUNCTION dwarf.state_at(bigint, bigint) IS
	'A flow''s state (those steps before before_step, when given), as the worker computes it; while several branches run, the input with every committed step''s changes folded in, in commit order. '
	'An unknown flow is an error';

CREATE FUNCTION dwarf.snapshot(flow_id bigint)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   state jsonb, error text, interrupt_payload jsonb,
				   cancel_reason text, steps bigint,
				   created_at timestamptz, finished_at timestamptz,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE sql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT dwarf.check_flow(snapshot.flow_id);
	SELECT f.id, g.name, g.version, f.status,
		   coalesce(f.state, dwarf.state_at(f.id)),
		   f.error, f.interrupt_payload, f.cancel_reason,
		   (SELECT count(*) FROM dwarf_internal.flow_steps(f.id)),
		   f.created_at, f.finished_at,
		   e.doc ->> 'task', e.doc ->> 'sqlstate', e.doc ->> 'detail', e.doc ->> 'hint'
	  FROM dwarf.flow_all f JOIN dwarf.graph g ON g.id = f.graph_id,
		   LATERAL (SELECT CASE WHEN f.status = 'failed'
								THEN dwarf_internal.failed_step_error(f.id, f.error) END AS doc) e
	 WHERE f.id = snapshot.flow_id
	 LIMIT 1;
END;
COMMENT ON FUNCTION dwarf.snapshot(bigint) IS
	'A flow''s status and state now (while it runs: its input with every committed step''s changes folded in); '
	'an unknown flow is an error';

CREATE FUNCTION dwarf.history(flow_id bigint)
	RETURNS TABLE (step_id bigint, task text, status text, attempt int,
				   started_at timestamptz, finished_at timestamptz,
				   error text, changes jsonb,
				   error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE sql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT dwarf.check_flow(history.flow_id);
	SELECT s.step_id, s.task, s.status, s.attempt, s.started_at,
		   s.finished_at, s.error ->> 'message', s.changes,
		   s.error ->> 'sqlstate', s.error ->> 'detail', s.error ->> 'hint'
	  FROM dwarf_internal.flow_steps(history.flow_id) s
	 ORDER BY s.step_id;
END;
COMMENT ON FUNCTION dwarf.history(bigint) IS
	'One row per step of a flow, in execution order; a failed attempt''s error with its SQLSTATE, detail and hint. '
	'The steps of one task: WHERE task = ... An unknown flow is an error';

CREATE FUNCTION dwarf.list(graph text DEFAULT NULL, status text DEFAULT NULL,
						   since timestamptz DEFAULT NULL, until timestamptz DEFAULT NULL,
						   thread text DEFAULT NULL, error_like text DEFAULT NULL,
						   before bigint DEFAULT NULL, page_size int DEFAULT 100)
	RETURNS TABLE (flow_id bigint, graph text, version int, status text,
				   thread text, error text, created_at timestamptz,
				   finished_at timestamptz, interrupt_payload jsonb,
				   error_task text, error_sqlstate text, error_detail text, error_hint text)
	LANGUAGE sql STABLE
	SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
	SELECT l.id, l.name, l.version, l.status, l.thread, l.error, l.created_at, l.finished_at,
		   l.interrupt_payload,
		   e.doc ->> 'task', e.doc ->> 'sqlstate', e.doc ->> 'detail', e.doc ->> 'hint'
	  FROM (SELECT f.id, g.name, g.version, f.status, f.thread, f.error, f.created_at,
				   f.finished_at, f.interrupt_payload
			  FROM dwarf.flow_all f JOIN dwarf.graph g ON g.id = f.graph_id
			 WHERE (list.graph IS NULL OR g.name = list.graph OR g.owner::text || '.' || g.name = list.graph)
			   AND (list.status IS NULL OR f.status = list.status)
			   AND (list.since IS NULL OR f.created_at >= list.since)
			   AND (list.until IS NULL OR f.created_at < list.until)
			   AND (list.thread IS NULL OR f.thread = list.thread)
			   AND (list.error_like IS NULL OR f.error ILIKE list.error_like)
			   AND (list.before IS NULL OR f.id < list.before)
			 ORDER BY f.id DESC
			 LIMIT list.page_size) l,
		   LATERAL (SELECT CASE WHEN l.status = 'failed'
								THEN dwarf_internal.failed_step_error(l.id, l.error) END AS doc) e
	 ORDER BY l.id DESC;
END;
COMMENT ON FUNCTION dwarf.list(text, text, timestamptz, timestamptz, text, text, bigint, int) IS
	'The caller''s flows, newest first, filtered (graph: a name, any owner''s, or role.name), page_size at a time: '
	'pass the last flow_id seen as "before" for the next page. An interrupted flow''s payload is in '
	'interrupt_payload, a failed one''s task and SQLSTATE in error_task and error_sqlstate';

CREATE FUNCTION dwarf.history_mermaid(flow_id bigint) RETURNS text
	LANGUAGE plpgsql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	def jsonb;
	tasks text[];
	out text := 'flowchart TD' || chr(10);
	t record;
	e jsonb;
	i int;
	froms text[];
	tos text[];
BEGIN
	PERFORM dwarf.check_flow(history_mermaid.flow_id);
	SELECT g.definition INTO def
	  FROM dwarf.flow_all f JOIN dwarf.graph g ON g.id = f.graph_id
	 WHERE f.id = history_mermaid.flow_id;
	tasks := ARRAY(SELECT jsonb_object_keys(def -> 'tasks') ORDER BY 1);

	/* One node per task, styled by the outcome of its last step. */
	FOR t IN
		WITH s AS (SELECT s.task, s.status, s.step_id FROM dwarf.history(history_mermaid.flow_id) s),
		 last AS (SELECT DISTINCT ON (s.task) s.task, s.status FROM s ORDER BY s.task, s.step_id DESC),
		 runs AS (SELECT s.task, count(*) FILTER (WHERE s.status IN ('completed', 'failed')) AS runs
					FROM s GROUP BY s.task)
		SELECT k.name, k.n, l.status, coalesce(r.runs, 0) AS runs
		  FROM unnest(tasks) WITH ORDINALITY AS k(name, n)
		  LEFT JOIN last l ON l.task = k.name
		  LEFT JOIN runs r ON r.task = k.name
		 ORDER BY k.n
	LOOP
		out := out || format('    n%s["%s<br/>%s"]:::%s', t.n,
							 replace(t.name, '"', '#quot;'),
							 CASE WHEN t.status IS NULL THEN 'not run'
								  ELSE t.status || CASE WHEN t.runs > 1 THEN ' x' || t.runs ELSE '' END END,
							 coalesce(t.status, 'notrun')) || chr(10);
	END LOOP;
	out := out || '    END_(("END"))' || chr(10);

	/* The edges of the definition; dotted when never taken. */
	FOR e IN SELECT x FROM jsonb_array_elements(coalesce(def -> 'transitions', '[]')) x LOOP
		IF e ? 'chain' THEN
			froms := ARRAY(SELECT jsonb_array_elements_text(e -> 'chain'));
			tos := froms[2:];
			froms := froms[:array_length(froms, 1) - 1];
		ELSE
			tos := CASE jsonb_typeof(e -> 'to') WHEN 'array'
						THEN ARRAY(SELECT jsonb_array_elements_text(e -> 'to'))
						ELSE ARRAY[e ->> 'to'] END;
			froms := array_fill(e ->> 'from', ARRAY[array_length(tos, 1)]);
		END IF;
		FOR i IN 1 .. coalesce(array_length(tos, 1), 0) LOOP
			out := out || format('    %s %s %s',
				'n' || array_position(tasks, froms[i]),
				CASE WHEN e ? 'when' THEN '-->|when|'
					 WHEN e ? 'switch' THEN '-->|switch|'
					 WHEN e ? 'for_each' THEN '-->|for_each|'
					 WHEN (e ->> 'goto')::boolean THEN '-.->|goto|'
					 WHEN (e ->> 'on_error')::boolean THEN '-.->|on_error|'
					 ELSE '-->' END,
				CASE WHEN tos[i] = 'END' THEN 'END_' ELSE 'n' || array_position(tasks, tos[i]) END)
				|| chr(10);
		END LOOP;
	END LOOP;

	RETURN out
		|| '    classDef completed fill:#d4edda,stroke:#28a745' || chr(10)
		|| '    classDef failed fill:#f8d7da,stroke:#dc3545' || chr(10)
		|| '    classDef retry fill:#fff3cd,stroke:#ffc107' || chr(10)
		|| '    classDef interrupted fill:#d1ecf1,stroke:#17a2b8' || chr(10)
		|| '    classDef resumed fill:#d1ecf1,stroke:#17a2b8' || chr(10)
		|| '    classDef notrun fill:#eeeeee,stroke:#999999,stroke-dasharray:3' || chr(10);
END
$$;
COMMENT ON FUNCTION dwarf.history_mermaid(bigint) IS
	'A Mermaid flowchart of the flow''s graph, each task styled by the outcome of its last step';

CREATE FUNCTION dwarf.fork(step_id bigint, overrides jsonb DEFAULT '{}')
	RETURNS bigint
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_fork';
COMMENT ON FUNCTION dwarf.fork(bigint, jsonb) IS
	'A new flow of the same graph version that starts at the step''s task, from the state that step saw, with overrides merged in; '
	'it takes the flow''s priority, which below 0 needs the privileges of dwarf_priority';

CREATE FUNCTION dwarf.continue(flow_id bigint, input jsonb DEFAULT '{}')
	RETURNS bigint
	LANGUAGE c
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_continue';
COMMENT ON FUNCTION dwarf.continue(bigint, jsonb) IS
	'A new flow in the same thread, of the graph''s latest version, starting from the closed flow''s final state with input merged in; '
	'it takes the flow''s priority, which below 0 needs the privileges of dwarf_priority';

CREATE FUNCTION dwarf.delete(flow_id bigint) RETURNS void
	LANGUAGE c STRICT
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_delete';
COMMENT ON FUNCTION dwarf.delete(bigint) IS
	'Deletes a flow, its steps and its child flows, whatever their status; '
	'a child flow whose parent is still running or interrupted is refused (cancel it instead)';

CREATE FUNCTION dwarf.purge(older_than interval DEFAULT '30 days', all_roles boolean DEFAULT false)
	RETURNS bigint
	LANGUAGE c STRICT
	SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'dwarf_purge';
COMMENT ON FUNCTION dwarf.purge(interval, boolean) IS
	'Deletes the caller''s own closed flows (and their steps) that finished longer ago than older_than, '
	'but for children of a parent still open; returns how many. With all_roles, those of every role whose '
	'privileges the caller has (a superuser: every role''s)';

CREATE FUNCTION dwarf.worker_stats()
	RETURNS TABLE (database oid, worker int, pid int, flows_loaded bigint,
				   ready bigint, steps bigint, steps_failed bigint,
				   flows_closed bigint, batches bigint, aborted_batches bigint)
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_worker_stats';
COMMENT ON FUNCTION dwarf.worker_stats() IS 'Counters of the dwarf workers of this database';

CREATE VIEW dwarf.stats WITH (security_invoker = true) AS
	SELECT (SELECT count(*) FILTER (WHERE status = 'running') FROM dwarf.flow) AS running,
		   (SELECT count(*) FILTER (WHERE status = 'interrupted') FROM dwarf.flow) AS interrupted,
		   (SELECT count(*) FILTER (WHERE status = 'completed') FROM dwarf.flow) AS completed,
		   (SELECT count(*) FILTER (WHERE status = 'failed') FROM dwarf.flow) AS failed,
		   (SELECT count(*) FILTER (WHERE status = 'cancelled') FROM dwarf.flow) AS cancelled,
		   (SELECT count(*) FROM dwarf.step) AS steps_done,
		   (SELECT coalesce(sum(w.ready), 0) FROM dwarf.worker_stats() w) AS in_flight,
		   (SELECT coalesce(jsonb_agg(to_jsonb(w)), '[]') FROM dwarf.worker_stats() w) AS workers;
COMMENT ON VIEW dwarf.stats IS
	'Flows by status (those the caller may see), steps done, steps ready to run now, and per-worker counters';
GRANT SELECT ON dwarf.stats TO PUBLIC;


/*
 * Retention: dwarf.maintain() moves closed flows into the archive and drops
 * expired archive days.  Schedule it (pg_cron, or any scheduler):
 *     SELECT cron.schedule('dwarf-maintain', '* * * * *', 'SELECT dwarf.maintain()');
 */

CREATE TABLE dwarf.maintain_log (
	started_at	timestamptz NOT NULL,
	took		interval NOT NULL,
	now_given	timestamptz NOT NULL,
	result		jsonb NOT NULL
);
CREATE INDEX maintain_log_started_at ON dwarf.maintain_log (started_at);
COMMENT ON TABLE dwarf.maintain_log IS
	'The last 1000 passes of dwarf.maintain(): when, how long, what it did (now_given: its "now" argument)';
REVOKE ALL ON dwarf.maintain_log FROM PUBLIC;
GRANT SELECT ON dwarf.maintain_log TO PUBLIC;
/* Dumped by pg_dump with the rest of dwarf's tables: dwarf.storage shows it. */
SELECT pg_catalog.pg_extension_config_dump('dwarf.maintain_log', '');

/*
 * Cumulative statistics (stats.c), per database, graph and task, in shared
 * memory: they count on when flows are archived or purged, survive an
 * orderly restart, and start again from zero after a crash or
 * dwarf.stats_reset().  Readable by members of pg_monitor: aggregates only,
 * never a flow's contents.  A graph is named by its name alone (the graphs
 * of two owners with one name count together).
 */
CREATE FUNCTION dwarf_internal.stats_counters()
	RETURNS TABLE (graph text, task text,
				   flows_created bigint, flows_completed bigint, flows_failed bigint,
				   flows_cancelled bigint,
				   steps_run bigint, steps_failed bigint, steps_retried bigint,
				   flow_seconds_sum float8, flow_seconds_count bigint,
				   flow_p50_s float8, flow_p95_s float8, flow_p99_s float8,
				   step_seconds_sum float8, step_seconds_count bigint,
				   step_p50_s float8, step_p95_s float8, step_p99_s float8,
				   stats_reset timestamptz)
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_stats_counters';
COMMENT ON FUNCTION dwarf_internal.stats_counters() IS
	'This database''s counters: a row per graph (task NULL: its flows, and its steps of all tasks) and one per task; '
	'read through dwarf.graph_stats and dwarf.task_stats';

CREATE VIEW dwarf.graph_stats AS
	SELECT graph, flows_created, flows_completed, flows_failed, flows_cancelled,
		   steps_run, steps_failed, steps_retried,
		   flow_seconds_sum, flow_seconds_count, flow_p50_s, flow_p95_s, flow_p99_s,
		   step_seconds_sum, step_seconds_count, step_p50_s, step_p95_s, step_p99_s,
		   stats_reset
	  FROM dwarf_internal.stats_counters()
	 WHERE task IS NULL;
COMMENT ON VIEW dwarf.graph_stats IS
	'Per graph, cumulative: flows created, completed, failed, cancelled; steps run (every attempt), failed, retried; '
	'flow durations (created to closed) and step durations (started to finished): sum, count and percentiles '
	'estimated from the histogram (NULL when empty); stats_reset: since when they count';

CREATE VIEW dwarf.task_stats AS
	SELECT graph, task, steps_run, steps_failed, steps_retried,
		   step_seconds_sum, step_seconds_count, step_p50_s, step_p95_s, step_p99_s
	  FROM dwarf_internal.stats_counters()
	 WHERE task IS NOT NULL;
COMMENT ON VIEW dwarf.task_stats IS
	'Per task of each graph, cumulative: steps run (every attempt), failed (status failed), retried (status retry), '
	'and their durations';

CREATE FUNCTION dwarf.stats_histogram()
	RETURNS TABLE (graph text, task text, kind text, le float8, count bigint)
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_stats_histogram';
COMMENT ON FUNCTION dwarf.stats_histogram() IS
	'Duration histograms, a row per bucket: kind flow (per graph, task NULL) or step (per task); '
	'count: durations of at most le seconds (cumulative; the last bucket, le Infinity, holds them all)';

CREATE FUNCTION dwarf.stats_reset() RETURNS void
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_stats_reset';
COMMENT ON FUNCTION dwarf.stats_reset() IS
	'Zeroes this database''s counters and histograms (stats_reset becomes now); the extension''s owner or a superuser only';

CREATE FUNCTION dwarf_internal.stats_shared()
	RETURNS TABLE (ready_backlog bigint, timers_due bigint, runners_busy int, runners_max int,
				   poison_steps bigint)
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'dwarf_stats_shared';
COMMENT ON FUNCTION dwarf_internal.stats_shared() IS
	'What dwarf.health reads of shared memory';

/*
 * One row per graph with open flows, and one with graph NULL for the whole
 * database (always there): the ages are the oldest of each; the rest is
 * the database's, the same on every row.  The ages read the live flow
 * table, which dwarf.maintain keeps to open flows and those closed within
 * dwarf.archive_after.  No index on status serves them: one would make
 * every flow's close (its one update) a non-HOT update, on the hot path.
 */
CREATE VIEW dwarf.health AS
	WITH open AS (
		SELECT g.name AS graph,
			   min(f.created_at) FILTER (WHERE f.status = 'running') AS oldest_running,
			   min(f.created_at) FILTER (WHERE f.status = 'interrupted') AS oldest_interrupted
		  FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id
		 WHERE f.status IN ('running', 'interrupted')
		 GROUP BY GROUPING SETS ((g.name), ())),
	maintained AS (
		SELECT started_at + took AS last_maintain
		  FROM dwarf.maintain_log ORDER BY started_at DESC LIMIT 1)
	SELECT o.graph,
		   extract(epoch FROM now() - o.oldest_running)::float8 AS oldest_running_s,
		   extract(epoch FROM now() - o.oldest_interrupted)::float8 AS oldest_interrupted_s,
		   s.ready_backlog, s.timers_due, s.runners_busy, s.runners_max, s.poison_steps,
		   m.last_maintain
	  FROM open o CROSS JOIN dwarf_internal.stats_shared() s LEFT JOIN maintained m ON true;
COMMENT ON VIEW dwarf.health IS
	'Per graph with open flows (and graph NULL: the whole database): age in seconds of the oldest running and '
	'interrupted flow; and for the database: steps ready in the workers'' queues, steps waiting for a timer '
	'(sleep, retry backoff), runners busy (all databases) and dwarf.max_runners, steps blamed for ending their '
	'process, when dwarf.maintain last finished';

REVOKE ALL ON FUNCTION dwarf_internal.stats_counters(), dwarf.stats_histogram(), dwarf.stats_reset(),
	dwarf_internal.stats_shared() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dwarf_internal.stats_counters(), dwarf.stats_histogram(), dwarf_internal.stats_shared()
	TO pg_monitor;
/*
 * pg_monitor needs the schema to read them; what else it may call there
 * acts as its member, on its own flows, as for any role granted it.
 */
GRANT USAGE ON SCHEMA dwarf TO pg_monitor;
REVOKE ALL ON dwarf.graph_stats, dwarf.task_stats, dwarf.health FROM PUBLIC;
GRANT SELECT ON dwarf.graph_stats, dwarf.task_stats, dwarf.health TO pg_monitor;

/* The archive's partitions of one table, with the UTC day each holds. */
CREATE FUNCTION dwarf_internal.archive_days(parent regclass)
	RETURNS TABLE (day date, partition regclass)
	LANGUAGE sql STABLE STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
	SELECT to_date(right(c.relname, 8), 'YYYYMMDD'), c.oid::regclass
	  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	 WHERE i.inhparent = archive_days.parent
	 ORDER BY 1
$$;
COMMENT ON FUNCTION dwarf_internal.archive_days(regclass) IS
	'The day partitions of dwarf.flow_archive or dwarf.step_log_archive, oldest first';

/*
 * Whether an archive day's index by id is a block-range index, as
 * make_archive_day makes it: dwarf.maintain summarizes such an index and
 * gives the day a B-tree by id once it has passed, and leaves alone an
 * index by id of another kind (made by hand).  NULL (no such index): false.
 */
CREATE FUNCTION dwarf_internal.is_brin(index regclass) RETURNS boolean
	LANGUAGE sql STABLE
	SET search_path = pg_catalog, pg_temp
	AS $$
	SELECT EXISTS (SELECT 1 FROM pg_class i JOIN pg_am m ON m.oid = i.relam
					WHERE i.oid = is_brin.index AND m.amname = 'brin')
$$;
REVOKE ALL ON FUNCTION dwarf_internal.is_brin(regclass) FROM PUBLIC;
COMMENT ON FUNCTION dwarf_internal.is_brin(regclass) IS
	'For dwarf.maintain: whether an archive day''s index by id is a block-range index (false for none)';

/*
 * Makes the partition of one day (UTC) of dwarf.flow_archive, unless it
 * exists; true when it made it.  It is made as a table of its own, with its
 * indexes, and then attached, which locks the parent only against other
 * DDL (SHARE UPDATE EXCLUSIVE), so reads and moves of the archive go on
 * meanwhile.  Called by dwarf.maintain only, which holds its lock, so two
 * calls never race to make the same day.  By id (every read of a flow) it
 * has a block-range index, not a B-tree: a pass writes its rows in id
 * order, so a range of 32 pages covers a short run of ids, and what a
 * pass writes to it is one record for each range it fills (summarized at
 * the end of the pass), where a B-tree writes one for each flow (a fifth
 * of the move's WAL, bench/README.md "Issue 25, seventh session").  The
 * multi-minmax kind keeps a flow that closed long after its neighbours'
 * ids from widening its range.  A lookup reads the index whole and a
 * range's pages: 0.56 ms in a day of 2,000,000 flows, against 0.03 ms for
 * a B-tree (bench/archive-lookup.sh), so once the day has passed, when
 * few rows still come, a pass builds it a B-tree by id as well (see
 * maintain_at); a live flow's reads stop at dwarf.flow (see
 * dwarf.flow_all).  Then B-trees, partial, for what dwarf.create's idempotency
 * key, dwarf.list's thread and a parent's children are looked up by.
 */
CREATE FUNCTION dwarf_internal.make_archive_day(day date) RETURNS boolean
	LANGUAGE plpgsql STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part text := 'flow_archive_' || to_char(day, 'YYYYMMDD');
BEGIN
	IF to_regclass('dwarf.' || part) IS NOT NULL THEN
		RETURN false;
	END IF;
	/*
	 * With the archive's CHECK constraints: ATTACH requires a partition to
	 * have each of them, so one added to dwarf.flow_archive (by hand, or a
	 * test's) would otherwise fail every pass that needs a new day.
	 */
	EXECUTE format('CREATE TABLE dwarf.%I (LIKE dwarf.flow_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
				   part);
	EXECUTE format('CREATE INDEX %I ON dwarf.%I USING brin (id int8_minmax_multi_ops (values_per_range = 16))'
				   ' WITH (pages_per_range = 32)', part || '_id', part);
	/* made with its first range summarized empty, which each row written to it would widen */
	PERFORM pg_catalog.brin_desummarize_range(format('dwarf.%I', part || '_id')::regclass, 0);
	EXECUTE format('CREATE INDEX %I ON dwarf.%I (owner, idempotency_key)'
				   ' WHERE idempotency_key IS NOT NULL', part || '_idempotency_key', part);
	EXECUTE format('CREATE INDEX %I ON dwarf.%I (thread, id) WHERE thread IS NOT NULL',
				   part || '_thread', part);
	EXECUTE format('CREATE INDEX %I ON dwarf.%I (parent_id) WHERE parent_id IS NOT NULL',
				   part || '_parent', part);
	EXECUTE format('ALTER TABLE dwarf.flow_archive ATTACH PARTITION dwarf.%I FOR VALUES FROM (%L) TO (%L)',
				   part, to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00',
				   to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
	RETURN true;
END
$$;
REVOKE ALL ON FUNCTION dwarf_internal.make_archive_day(date) FROM PUBLIC;
COMMENT ON FUNCTION dwarf_internal.make_archive_day(date) IS
	'For dwarf.maintain: makes the partition of one day (UTC) of dwarf.flow_archive, with its indexes, '
	'unless it exists; true when it made it';

/*
 * Makes a segment of the step log for flow ids [lo, hi), attached to
 * dwarf.step_log (live) or to dwarf.step_log_archive (a gap: ids handed
 * out before a segment covered them, whose steps wait in
 * dwarf.step_default).  Made as a table of its own and then attached, as
 * an archive day is, with: a CHECK constraint on its range, so that
 * attaching it to the archive later needs no scan; a B-tree on (flow_id,
 * first_step), by which the workers and dwarf.history read a flow's
 * steps; a block-range index on (first_step, last_step) for dwarf.fork's
 * lookups by step id, which costs nothing for rows appended; the restore
 * trigger; and autovacuum off, since its rows are never updated and only
 * the few of a flow that outlives it are deleted.
 */
CREATE FUNCTION dwarf_internal.make_step_segment(lo bigint, hi bigint, live boolean) RETURNS name
	LANGUAGE plpgsql STRICT
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	part name := 'step_' || lo;
BEGIN
	EXECUTE format('CREATE TABLE dwarf.%I (LIKE dwarf.step_log INCLUDING DEFAULTS,'
				   ' CONSTRAINT %I CHECK (flow_id >= %s AND flow_id < %s))'
				   ' WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)',
				   part, part || '_range', lo, hi);
	EXECUTE format('CREATE UNIQUE INDEX %I ON dwarf.%I (flow_id, first_step)', part || '_pkey', part);
	EXECUTE format('CREATE INDEX %I ON dwarf.%I USING brin (first_step, last_step)', part || '_step_id', part);
	EXECUTE format('CREATE TRIGGER step_restored AFTER INSERT ON dwarf.%I'
				   ' FOR EACH STATEMENT EXECUTE FUNCTION dwarf_internal.restored()', part);
	EXECUTE format('ALTER TABLE dwarf.%I ATTACH PARTITION dwarf.%I FOR VALUES FROM (%s) TO (%s)',
				   CASE WHEN live THEN 'step_log' ELSE 'step_log_archive' END, part, lo, hi);
	INSERT INTO dwarf.segment (lo, hi, relation, live, archived_at)
		VALUES (lo, hi, part, live, CASE WHEN live THEN NULL ELSE now() END);
	RETURN part;
END
$$;
REVOKE ALL ON FUNCTION dwarf_internal.make_step_segment(bigint, bigint, boolean) FROM PUBLIC;
COMMENT ON FUNCTION dwarf_internal.make_step_segment(bigint, bigint, boolean) IS
	'For dwarf.maintain: makes the segment of the step log for flow ids [lo, hi), live or archived';

CREATE FUNCTION dwarf_internal.flow_id_prefix() RETURNS bigint
	LANGUAGE c STRICT
	AS 'MODULE_PATHNAME', 'dwarf_flow_id_prefix';
COMMENT ON FUNCTION dwarf_internal.flow_id_prefix() IS
	'The high bits of the flow ids handed out now: dwarf.shard_id and the epoch (the timeline less one)';
CREATE FUNCTION dwarf_internal.next_flow_id() RETURNS bigint
	LANGUAGE sql
	SET search_path = pg_catalog, pg_temp
	BEGIN ATOMIC
	SELECT dwarf_internal.flow_id_prefix() | (coalesce(pg_sequence_last_value('dwarf.flow_seq'), 0) + 1);
	END;
REVOKE ALL ON FUNCTION dwarf_internal.flow_id_prefix(), dwarf_internal.next_flow_id() FROM PUBLIC;
COMMENT ON FUNCTION dwarf_internal.next_flow_id() IS
	'The id the next new flow will get, without taking it (dwarf.maintain makes segments ahead of it)';

CREATE FUNCTION dwarf_internal.archive_add(internal, dwarf.flow) RETURNS internal
	LANGUAGE C
	AS 'MODULE_PATHNAME', 'dwarf_archive_add';
CREATE FUNCTION dwarf_internal.archive_done(internal) RETURNS bigint
	LANGUAGE C
	AS 'MODULE_PATHNAME', 'dwarf_archive_done';
CREATE AGGREGATE dwarf_internal.archive(dwarf.flow) (
	SFUNC = dwarf_internal.archive_add,
	STYPE = internal,
	FINALFUNC = dwarf_internal.archive_done,
	FINALFUNC_MODIFY = READ_WRITE
);
REVOKE ALL ON FUNCTION dwarf_internal.archive_add(internal, dwarf.flow), dwarf_internal.archive_done(internal),
	dwarf_internal.archive(dwarf.flow) FROM PUBLIC;
COMMENT ON AGGREGATE dwarf_internal.archive(dwarf.flow) IS
	'For dwarf.maintain: writes the flow rows it moves into dwarf.flow_archive''s day partitions '
	'as they come, a heap page to a WAL record; returns how many';

CREATE FUNCTION dwarf_internal.lock_maintain() RETURNS void
	LANGUAGE C VOLATILE STRICT
	AS 'MODULE_PATHNAME', 'dwarf_lock_maintain';
REVOKE ALL ON FUNCTION dwarf_internal.lock_maintain() FROM PUBLIC;
COMMENT ON FUNCTION dwarf_internal.lock_maintain() IS
	'For dwarf.maintain: one pass at a time in a database, under a lock of dwarf''s own (an advisory lock '
	'tag that pg_advisory_lock cannot make, so no other session can hold it to keep passes waiting)';

/*
 * A pass of dwarf.maintain as if the time were now: what dwarf.maintain()
 * runs with now(), and what tests run with a later time, to see days expire
 * without waiting for them.  With a time ahead of the clock it drops days
 * that still hold flows which have not reached their retention, so it is
 * not dwarf.maintain's argument (where a mistaken call would drop them) but
 * a function of its own, granted to no one: only the extension's owner and
 * superusers may call it.  With dry_run, it changes nothing (no partition
 * made or dropped, no flow moved, no log row) and returns what the pass
 * would do.
 */
CREATE FUNCTION dwarf_internal.maintain_at(now timestamptz, dry_run boolean DEFAULT false) RETURNS jsonb
	LANGUAGE plpgsql SECURITY DEFINER
	SET search_path = pg_catalog, pg_temp
	AS $$
DECLARE
	started		timestamptz := clock_timestamp();
	archive_after interval := current_setting('dwarf.archive_after')::interval;
	retention	interval := current_setting('dwarf.retention')::interval;
	span		interval := greatest(current_setting('dwarf.segment_interval')::interval, interval '1 s');
	cutoff		timestamptz := maintain_at.now - archive_after;
	today		date := (maintain_at.now AT TIME ZONE 'UTC')::date;
	/* A day is dropped once all of it is older than the retention. */
	expired_before date := ((maintain_at.now - retention) AT TIME ZONE 'UTC')::date;
	dropped_flows bigint := 0;
	n_dropped	bigint;
	chunk		constant int := 2000;		/* flows moved per statement */
	most		constant int := 3000000;	/* flows moved per pass (a minute of 50,000 a second) */
	parts		text[] := '{}';		/* the day partitions of the archive the pass moves flows into */
	parts_from	bigint[] := '{}';	/* and each one's first block range the moves may fill */
	default_chunk constant int := 25000;	/* rows of packed steps moved out of dwarf.step_default per statement */
	budget		constant interval := '20 s';	/* no flow move starts after it */
	default_budget constant interval := '30 s';	/* nor a move out of the default partition */
	ids			bigint[];
	moved_flows bigint := 0;
	moved_steps bigint := 0;
	n_flows		bigint;
	n_steps		bigint;
	n_rows		bigint;
	made		text[] := '{}';
	dropped		text[] := '{}';
	deferred	text[] := '{}';
	indexed		text[] := '{}';	/* the day given its B-tree by id (one at most) */
	segs_made	text[] := '{}';
	segs_archived text[] := '{}';
	segs_dropped text[] := '{}';
	segs_deferred text[] := '{}';
	segs_replaced text[] := '{}';
	lock_timeout text;
	wal_compression text;	/* the session's, set back at the pass's end */
	more		boolean := false;
	d			record;
	g			record;
	next_id		bigint;
	ahead		boolean;
	prev_hi		bigint;
	newest		record;
	rate		float8;		/* flow ids a second since the last pass, or NULL */
	next_id_at	timestamptz;
	/*
	 * A segment holds at least the flows of its interval at 16 a second
	 * (at most 16,384), so that a burst of creates between two passes
	 * still finds its segments made.
	 */
	min_width	bigint := greatest(64, least(16384, (extract(epoch FROM span) * 16)::bigint));
	/*
	 * The flow ids a fresh install's first pass makes segments for, ahead
	 * of the first: at 100,000 flows a second, those of nearly three
	 * minutes, time enough for passes a minute apart to learn the rate.
	 */
	guess_reach	constant bigint := 16777216;
	fresh		boolean := false;
	has_steps	boolean;
	width		bigint;
	n_open		bigint;
	n_all		bigint;
	i			int;
	result		jsonb;
BEGIN
	IF pg_is_in_recovery() THEN
		RAISE EXCEPTION 'dwarf.maintain cannot run on a standby'
			USING ERRCODE = 'read_only_sql_transaction',
				  HINT = 'Run it on the primary; the standby follows.';
	END IF;
	/* One pass at a time: a second caller waits, then finds less to do. */
	PERFORM dwarf_internal.lock_maintain();

	/*
	 * The pass holds the rows it moves while it waits for the locks of
	 * its DDL, and a session that read dwarf.step and then waits for one
	 * of those rows makes a cycle.  Whoever's deadlock check runs first
	 * fails; with this, it is the pass's (each wait below gives up at once
	 * on a cycle and leaves its partition to the next pass), not the
	 * application's.
	 */
	PERFORM set_config('deadlock_timeout', '10ms', true);

	/*
	 * Partitions first, before this pass locks any row: a session that
	 * read the archive (and so holds a lock on it) may be waiting for a row
	 * this pass moves, and must not then wait for this pass's DDL.
	 *
	 * Expired days go whole.  Dropping a partition takes an exclusive lock
	 * on its parent, which waits for every transaction reading the archive
	 * and holds up new readers while it waits.  It waits half a second at
	 * most (less than deadlock_timeout, so that a reader that took the
	 * parents in another order is never the one a deadlock check fails),
	 * else the partition is left to the next pass.
	 */
	lock_timeout := current_setting('lock_timeout');
	FOR d IN SELECT a.day, a.partition FROM dwarf_internal.archive_days('dwarf.flow_archive') a
			  WHERE a.day < expired_before LOOP
		IF dry_run THEN
			EXECUTE format('SELECT count(*) FROM %s', d.partition) INTO n_dropped;
			dropped_flows := dropped_flows + n_dropped;
			dropped := dropped || to_char(d.day, 'YYYY-MM-DD');
			CONTINUE;
		END IF;
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			EXECUTE format('DROP TABLE IF EXISTS %s', d.partition);
			dropped := dropped || to_char(d.day, 'YYYY-MM-DD');
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			deferred := deferred || to_char(d.day, 'YYYY-MM-DD');
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
	END LOOP;

	/* Today's flow partition and the next two days', so that moves rarely wait for DDL. */
	FOR i IN 0 .. 2 LOOP
		IF today + i >= expired_before AND
			(CASE WHEN dry_run THEN to_regclass('dwarf.flow_archive_' || to_char(today + i, 'YYYYMMDD')) IS NULL
				  ELSE dwarf_internal.make_archive_day(today + i) END) THEN
			made := made || to_char(today + i, 'YYYY-MM-DD');
		END IF;
	END LOOP;

	/*
	 * The pass's full-page images compressed (lz4, else pglz), unless the
	 * server compresses them already: a flow page's first change after a
	 * checkpoint logs the whole page, and under load, with a checkpoint
	 * every few seconds, those images are most of what a pass writes (and
	 * all that a day's B-tree's build, below, writes).  For the pass only,
	 * set back at its end; a superuser's setting, so an owner that is not
	 * one leaves it as it is.
	 */
	wal_compression := current_setting('wal_compression');
	IF NOT dry_run AND wal_compression = 'off' THEN
		BEGIN
			PERFORM set_config('wal_compression', 'lz4', true);
		EXCEPTION WHEN invalid_parameter_value OR insufficient_privilege THEN
			BEGIN
				PERFORM set_config('wal_compression', 'pglz', true);
			EXCEPTION WHEN insufficient_privilege THEN
				NULL;
			END;
		END;
	END IF;

	/*
	 * The oldest day whose flows have all been old enough to move since
	 * before this pass's cutoff, and whose index by id is still the
	 * block-range index its moves were written with (see
	 * make_archive_day), gets a B-tree by id, built at once: a page to a
	 * WAL record (compressed, above), where the same index there from the
	 * start would have logged a record for each flow.  Each read of the
	 * day then finds a flow in a few pages, where the block-range index
	 * reads itself whole.  The few rows later passes still move into the
	 * day go into both.  One day a pass, so that the first pass after an
	 * upgrade or a stop of days stays short; a day someone holds a lock on
	 * (a purge) is waited for half a second at most, else left to the next
	 * pass.  A build that fails otherwise (no room for its sort) is a
	 * warning, not the pass's failure: the moves go on, and the next pass
	 * tries again.  A dry run names the day and builds nothing.
	 */
	SELECT a.day, c.relname INTO d
	  FROM dwarf_internal.archive_days('dwarf.flow_archive') a
	  JOIN pg_class c ON c.oid = a.partition
	 WHERE a.day >= expired_before AND a.day < (cutoff AT TIME ZONE 'UTC')::date
	   AND to_regclass(format('dwarf.%I', c.relname || '_id_btree')) IS NULL
	   AND dwarf_internal.is_brin(to_regclass(format('dwarf.%I', c.relname || '_id')))
	 ORDER BY a.day LIMIT 1;
	IF FOUND AND dry_run THEN
		indexed := indexed || to_char(d.day, 'YYYY-MM-DD');
	ELSIF FOUND THEN
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			EXECUTE format('CREATE INDEX %I ON dwarf.%I (id)', d.relname || '_id_btree', d.relname);
			indexed := indexed || to_char(d.day, 'YYYY-MM-DD');
		EXCEPTION
			WHEN lock_not_available OR deadlock_detected THEN
				NULL;
			WHEN OTHERS THEN
				RAISE WARNING 'dwarf.maintain built no B-tree by id for an archive day: %', SQLERRM
					USING DETAIL = format('The day is %s, partition dwarf.%I.', d.day, d.relname),
						  HINT = 'The next pass tries again; reads of that day go through its block-range index meanwhile.';
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
	END IF;

	/*
	 * Closed flows old enough, oldest first.  A closed child whose parent
	 * still runs stays: the parent's waiting task looks it up again in the
	 * live table when it runs again.
	 */
	ids := ARRAY(
		SELECT f.id FROM dwarf.flow f
		 WHERE f.status IN ('completed', 'failed', 'cancelled')
		   AND f.finished_at < cutoff
		   AND (f.parent_id IS NULL OR NOT EXISTS (
				SELECT 1 FROM dwarf.flow p
				 WHERE p.id = f.parent_id AND p.status IN ('running', 'interrupted')))
		 ORDER BY f.finished_at
		 LIMIT most + 1);
	IF cardinality(ids) > most THEN
		more := true;
		ids := ids[1:most];
	END IF;
	/* moved in id order, for the archive's index by id (see make_archive_day) */
	ids := ARRAY(SELECT x FROM unnest(ids) x ORDER BY x);

	/* The partitions of the days they closed on, if not there yet. */
	FOR d IN SELECT DISTINCT (f.finished_at AT TIME ZONE 'UTC')::date AS day
			   FROM dwarf.flow f WHERE f.id = ANY (ids) ORDER BY 1 LOOP
		IF dry_run THEN
			IF to_regclass('dwarf.flow_archive_' || to_char(d.day, 'YYYYMMDD')) IS NULL
			   AND NOT to_char(d.day, 'YYYY-MM-DD') = ANY (made) THEN
				made := made || to_char(d.day, 'YYYY-MM-DD');
			END IF;
		ELSE
			IF dwarf_internal.make_archive_day(d.day) THEN
				made := made || to_char(d.day, 'YYYY-MM-DD');
			END IF;
			parts := parts || ('dwarf.flow_archive_' || to_char(d.day, 'YYYYMMDD'));
			parts_from := parts_from || (pg_relation_size(parts[cardinality(parts)]) / 8192 / 32);
		END IF;
	END LOOP;

	/*
	 * Flow rows are moved in chunks, in one statement each: a plain
	 * DELETE, which writes no lock of its own for each row as FOR UPDATE
	 * would (a tenth of the move's WAL), whose rows the aggregate
	 * dwarf_internal.archive writes into the archive a heap page to a WAL
	 * record, as COPY does (an INSERT would log each row apart).  A row
	 * that someone else holds (dwarf.delete, dwarf.continue in an open
	 * transaction) makes it wait, half a second at most; then the chunk
	 * goes again skipping the rows held, which the next pass takes.  A row
	 * that changed meanwhile is read again: one that is open again, or
	 * gone, stays.  Each chunk is a subtransaction (the exception block);
	 * past 64 of them the pass's process no longer lists them all in
	 * shared memory, and other sessions' snapshots look its rows' xids up
	 * in pg_subtrans while it runs: bench/README.md's soaks with a pass
	 * every minute measured no loss of throughput from it.
	 */
	i := 1;
	WHILE NOT dry_run AND i <= coalesce(cardinality(ids), 0) LOOP
		IF clock_timestamp() - started > budget THEN
			more := true;
			EXIT;
		END IF;
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			WITH gone AS (DELETE FROM dwarf.flow f
						   WHERE f.id = ANY (ids[i:i + chunk - 1])
							 AND f.status IN ('completed', 'failed', 'cancelled')
						  RETURNING f)
			SELECT dwarf_internal.archive(gone.f ORDER BY (gone.f).id) INTO n_flows FROM gone;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			PERFORM set_config('lock_timeout', lock_timeout, true);
			WITH picked AS (
				SELECT id FROM dwarf.flow
				 WHERE id = ANY (ids[i:i + chunk - 1])
				   AND status IN ('completed', 'failed', 'cancelled')
				   FOR UPDATE SKIP LOCKED),
			 gone AS (DELETE FROM dwarf.flow f USING picked p WHERE f.id = p.id RETURNING f)
			SELECT dwarf_internal.archive(gone.f ORDER BY (gone.f).id) INTO n_flows FROM gone;
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
		moved_flows := moved_flows + n_flows;
		i := i + chunk;
	END LOOP;

	/*
	 * The block ranges the moves filled, summarized in the archive's index
	 * by id (see make_archive_day); a range not summarized matches every
	 * lookup.  The last range, still filling, is left as it is, so that the
	 * next pass's rows widen no summary (a WAL record each).  Ranges a
	 * pass that failed left behind are summarized by autovacuum's next
	 * pass over the partition.  A partition never analyzed is analyzed
	 * now: without statistics (the correlation of id with the rows'
	 * places), the planner reckons a block-range index no better than
	 * reading the whole partition, and a new day's reads would do so until
	 * autovacuum first analyzed it.  A partition whose index by id is of
	 * another kind (made by hand) is left alone.
	 */
	FOR i IN 1 .. cardinality(parts) LOOP
		CONTINUE WHEN NOT dwarf_internal.is_brin(to_regclass(parts[i] || '_id'));
		PERFORM pg_catalog.brin_summarize_range((parts[i] || '_id')::regclass, r * 32)
		   FROM generate_series(parts_from[i], pg_relation_size(parts[i]) / 8192 / 32 - 1) r;
		IF (SELECT c.reltuples < 0 FROM pg_class c WHERE c.oid = parts[i]::regclass) THEN
			EXECUTE format('ANALYZE %s', parts[i]);
		END IF;
	END LOOP;

	/*
	 * The step log's segments come last, after the flow rows' moves, which
	 * may take seconds: handing a segment over and making one lock
	 * dwarf.step_log and its default partition until the pass commits, which
	 * holds up the workers' writes of steps meanwhile.
	 */
	/*
	 * Steps in dwarf.step_default of flows that have closed, under an
	 * archived segment: moved there.  They are the steps of flows that
	 * outlived their segment, or that were created before a segment
	 * covered them (before the first pass, or in a burst past the
	 * segments made), so few once the segments run ahead.  This comes
	 * before the handovers, whose lock on dwarf.step_log would hold up the
	 * workers for as long as the move takes, default_chunk rows to a
	 * statement, and starts none once the pass has run for default_budget,
	 * so that a pass after a burst does not run for minutes: the next
	 * passes move the rest.
	 */
	n_steps := 0;
	WHILE NOT dry_run LOOP
		IF clock_timestamp() - started > default_budget THEN
			more := true;
			EXIT;
		END IF;
		WITH gone AS (
			DELETE FROM dwarf.step_default x
			 WHERE x.ctid = ANY (ARRAY(
				SELECT y.ctid FROM dwarf.step_default y
				 WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow f
									WHERE f.id = y.flow_id AND f.status IN ('running', 'interrupted'))
				   AND EXISTS (SELECT 1 FROM dwarf.segment s
								WHERE NOT s.live AND y.flow_id >= s.lo AND y.flow_id < s.hi)
				 LIMIT default_chunk))
			RETURNING x.*),
		 put AS (INSERT INTO dwarf.step_log_archive SELECT * FROM gone RETURNING cardinality(step_id) AS n)
		SELECT count(*), n_steps + coalesce(sum(put.n), 0) INTO n_rows, n_steps FROM put;
		EXIT WHEN n_rows < default_chunk;
	END LOOP;
	IF NOT dry_run THEN
		IF n_steps > 0 THEN
			moved_steps := moved_steps + n_steps;
			UPDATE dwarf.segment s SET newest_close = greatest(s.newest_close, maintain_at.now)
			 WHERE NOT s.live AND EXISTS (SELECT 1 FROM dwarf.flow_all f
										   WHERE f.id >= s.lo AND f.id < s.hi
											 AND f.finished_at > coalesce(s.newest_close, '-infinity'));
		END IF;
	END IF;

	/*
	 * A segment is never vacuumed, so its block-range index on step_id
	 * (dwarf.step_key's and dwarf.fork's lookups) is summarized here: the
	 * whole ranges each live segment filled since the last pass.  A range
	 * not summarized matches every lookup; the last one, still filling, is
	 * left as it is, so that no insert has a summary to widen (a WAL
	 * record each).
	 */
	IF NOT dry_run THEN
		FOR g IN SELECT * FROM dwarf.segment s WHERE s.live LOOP
			PERFORM pg_catalog.brin_summarize_range(to_regclass(format('dwarf.%I', g.relation || '_step_id')), r * 128)
			   FROM generate_series(coalesce(g.summarized_to, 0),
									pg_relation_size(format('dwarf.%I', g.relation)) / 8192 / 128 - 1) r
			  WHERE to_regclass(format('dwarf.%I', g.relation || '_step_id')) IS NOT NULL;
			UPDATE dwarf.segment s SET summarized_to = pg_relation_size(format('dwarf.%I', g.relation)) / 8192 / 128
			 WHERE s.lo = g.lo;
		END LOOP;
	END IF;

	/*
	 * Live segments that no new flow goes to any more, to the archive.  One
	 * whose flows have all closed is detached and attached to the archive
	 * as it is.  One that has spanned twice its interval with a few flows
	 * still open goes too, the steps of those few moved to
	 * dwarf.step_default first (the only steps ever moved).  Detaching
	 * takes an exclusive lock on dwarf.step_log, which waits for the workers'
	 * transactions in progress (a batch: milliseconds) and holds up their
	 * next writes of steps until the pass commits; it waits half a second
	 * at most, else the segment waits for the next pass.
	 */
	next_id := dwarf_internal.next_flow_id();
	FOR g IN SELECT * FROM dwarf.segment s WHERE s.live AND s.hi <= next_id ORDER BY s.lo LOOP
		SELECT count(*) FILTER (WHERE f.status IN ('running', 'interrupted')), count(*)
		  INTO n_open, n_all
		  FROM dwarf.flow f WHERE f.id >= g.lo AND f.id < g.hi;
		CONTINUE WHEN n_open > 0 AND (g.made_at > maintain_at.now - 2 * span
									  OR n_open > greatest(100, n_all / 100));
		IF dry_run THEN
			segs_archived := segs_archived || g.relation::text;
			CONTINUE;
		END IF;
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			LOCK TABLE dwarf.step_log IN ACCESS EXCLUSIVE MODE;
			PERFORM set_config('lock_timeout', lock_timeout, true);
			EXECUTE format('ALTER TABLE dwarf.step_log DETACH PARTITION dwarf.%I', g.relation);
			IF n_open > 0 THEN
				/*
				 * Detached, the segment no longer covers its ids in
				 * dwarf.step_log, so the open flows' steps go to its default
				 * partition; dwarf's own move, not a restore, so without
				 * the restore trigger's rescan.
				 */
				PERFORM set_config('session_replication_role', 'replica', true);
				EXECUTE format('WITH gone AS (DELETE FROM dwarf.%I s USING dwarf.flow f'
							   ' WHERE f.id = s.flow_id AND f.status IN (''running'', ''interrupted'')'
							   ' RETURNING s.*),'
							   ' put AS (INSERT INTO dwarf.step_log SELECT * FROM gone RETURNING cardinality(step_id) AS n)'
							   ' SELECT coalesce(sum(put.n), 0) FROM put', g.relation) INTO n_steps;
				PERFORM set_config('session_replication_role', 'origin', true);
				moved_steps := moved_steps + n_steps;
			END IF;
			EXECUTE format('ALTER TABLE dwarf.step_log_archive ATTACH PARTITION dwarf.%I FOR VALUES FROM (%s) TO (%s)',
						   g.relation, g.lo, g.hi);
			UPDATE dwarf.segment s SET live = false, archived_at = maintain_at.now,
				   newest_close = (SELECT max(f.finished_at) FROM dwarf.flow_all f
									WHERE f.id >= g.lo AND f.id < g.hi)
			 WHERE s.lo = g.lo;
			segs_archived := segs_archived || g.relation::text;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			segs_deferred := segs_deferred || g.relation::text;
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
	END LOOP;

	/*
	 * The step log's segments ahead of the flow ids: the one the next flow
	 * goes to and the one after it, each as wide as the flows created in
	 * dwarf.segment_interval at the rate of the current one.  Where none
	 * covers the next id (the first pass; ids that outran the segments
	 * while no pass ran; a promotion, which moves ids to a new epoch), a
	 * new run of segments starts at it, and a segment in the archive covers
	 * the ids before it that none did, for their steps in
	 * dwarf.step_default to be archived into.  This comes after the
	 * handover: attaching a segment locks dwarf.step_default, and a pass
	 * that held that lock while it waited for dwarf.step_log's would take the
	 * two in the reverse of the order every writer of steps takes them
	 * (a deadlock that the writer, not the pass, lost).
	 */
	/*
	 * How fast the ids go: from the next id the last pass read (its log)
	 * to this one.  A segment's own times do not tell it: one made ahead
	 * waits minutes for its first flow.
	 */
	next_id := dwarf_internal.next_flow_id();
	next_id_at := clock_timestamp();
	SELECT ((next_id - (l.result->>'next_id')::bigint)
			/ extract(epoch FROM next_id_at - (l.result->>'next_id_at')::timestamptz))::float8
	  INTO rate
	  FROM dwarf.maintain_log l
	 WHERE l.result ? 'next_id' AND (l.result->>'next_id_at')::timestamptz < next_id_at - interval '1 s'
	 ORDER BY l.started_at DESC LIMIT 1;
	IF rate < 0 THEN
		rate := NULL;
	END IF;

	/*
	 * The segments a fresh install's first pass made ahead with no rate to
	 * go by (below), once flows come: the first pass that sees the ids
	 * move drops those beyond the one after the current, no flow having
	 * reached them, and the next passes make segments at the rate's width.
	 * Until then they stay, however many passes run before the first
	 * flow, for a load that starts between two passes.  No other pass makes
	 * a segment beyond the one after the current; but a restore into a
	 * server whose flow ids start lower (another dwarf.shard_id, an
	 * earlier timeline) brings segments above the ids, and those hold
	 * steps and flows: only a segment with neither goes.  Dropping a
	 * partition locks dwarf.step_log, as a handover does, and before the
	 * default partition is locked below: the order every writer of steps
	 * takes.
	 */
	SELECT * INTO g FROM dwarf.segment s WHERE s.live AND s.lo <= next_id AND next_id < s.hi;
	IF FOUND AND rate > 0 THEN
		FOR d IN SELECT s.* FROM dwarf.segment s
				  WHERE s.live AND s.lo > g.hi
					AND NOT EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id >= s.lo AND f.id < s.hi)
				  ORDER BY s.lo LOOP
			EXECUTE format('SELECT EXISTS (SELECT 1 FROM dwarf.%I)', d.relation) INTO has_steps;
			IF NOT has_steps THEN
				segs_replaced := segs_replaced || d.relation::text;
			END IF;
		END LOOP;
	END IF;
	IF cardinality(segs_replaced) > 0 AND NOT dry_run THEN
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			LOCK TABLE dwarf.step_log IN ACCESS EXCLUSIVE MODE;
			PERFORM set_config('lock_timeout', lock_timeout, true);
			/* no step is written now; a flow may have come (not this far ahead) */
			FOR g IN SELECT s.* FROM dwarf.segment s WHERE s.relation = ANY (segs_replaced)
					  AND NOT EXISTS (SELECT 1 FROM dwarf.flow_all f WHERE f.id >= s.lo AND f.id < s.hi) LOOP
				EXECUTE format('DROP TABLE dwarf.%I', g.relation);
				DELETE FROM dwarf.segment WHERE lo = g.lo;
			END LOOP;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			segs_replaced := '{}';		/* the next pass drops them */
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
	END IF;

	SELECT * INTO g FROM dwarf.segment s WHERE s.live AND s.lo <= next_id AND next_id < s.hi;
	ahead := NOT dry_run;
	IF ahead AND (NOT FOUND OR NOT EXISTS (SELECT 1 FROM dwarf.segment s WHERE s.lo = g.hi)) THEN
		/*
		 * A segment attached to dwarf.step_log must find no row of its range
		 * in dwarf.step_default, or the attach fails; a flow created since
		 * next_id was read may already have written steps there.  With
		 * the default partition locked (the attach would lock it anyway),
		 * no step lands there any more, and every flow that has one there
		 * has an id below the next id read now.  The lock waits half a
		 * second at most, as the handover's does, else the segments wait
		 * for the next pass.
		 */
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			LOCK TABLE dwarf.step_default IN ACCESS EXCLUSIVE MODE;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			ahead := false;
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
		next_id := dwarf_internal.next_flow_id();
		SELECT * INTO g FROM dwarf.segment s WHERE s.live AND s.lo <= next_id AND next_id < s.hi;
	END IF;
	IF NOT FOUND AND ahead THEN
		/*
		 * No segment holds the next id: the first pass, or the ids outran
		 * the segments since the last one.  The new segment holds twice
		 * the ids of an interval at the rate they went since the last pass
		 * (with none logged, since the newest segment was made; on the
		 * first pass, the live flows created in the interval: the flows
		 * archived since are no longer in dwarf.flow to count).
		 */
		SELECT s.lo, s.made_at INTO newest FROM dwarf.segment s ORDER BY s.hi DESC LIMIT 1;
		IF rate IS NOT NULL THEN
			width := greatest(min_width, (2 * rate * extract(epoch FROM span))::bigint);
		ELSIF FOUND THEN
			width := greatest(min_width, (2 * greatest(next_id - newest.lo, 0) * extract(epoch FROM span)
										  / greatest(extract(epoch FROM maintain_at.now - newest.made_at), 1))::bigint);
		ELSE
			width := greatest(min_width, 2 * (SELECT count(*) FROM dwarf.flow f WHERE f.created_at > maintain_at.now - span));
			fresh := pg_sequence_last_value('dwarf.flow_seq') IS NULL;
		END IF;
		prev_hi := coalesce((SELECT max(s.hi) FROM dwarf.segment s), 0);
		IF prev_hi < next_id THEN
			segs_made := segs_made || dwarf_internal.make_step_segment(prev_hi, next_id, false)::text;
		END IF;
		segs_made := segs_made || dwarf_internal.make_step_segment(next_id, next_id + width, true)::text;
		/*
		 * A fresh install (no segment yet, no flow id ever handed out):
		 * nothing says how fast the ids will go once flows come, and a
		 * load that starts after this pass would outrun a segment of the
		 * minimum width within seconds, its steps going to
		 * dwarf.step_default until the next pass, to be copied out of it.
		 * Segments that double in width follow, up to guess_reach ids, so
		 * that whatever the rate, the ids at the next pass are in one
		 * about as wide as the ids gone since this one; the first pass
		 * after flows came drops the rest (above).
		 */
		IF fresh THEN
			prev_hi := next_id + width;
			WHILE prev_hi - next_id < guess_reach LOOP
				width := 2 * width;
				segs_made := segs_made || dwarf_internal.make_step_segment(prev_hi, prev_hi + width, true)::text;
				prev_hi := prev_hi + width;
			END LOOP;
		END IF;
		SELECT * INTO g FROM dwarf.segment s WHERE s.live AND s.lo <= next_id AND next_id < s.hi;
	END IF;
	IF FOUND AND ahead AND NOT EXISTS (SELECT 1 FROM dwarf.segment s WHERE s.lo = g.hi) THEN
		/*
		 * The ids of an interval at the rate they went since the last
		 * pass; after a segment this very pass made, as wide as it (else
		 * the minimum, with no rate in it yet).  With no pass logged, the
		 * rate in the current segment since it was made.
		 */
		IF g.made_at = now() THEN
			width := g.hi - g.lo;
		ELSIF rate IS NOT NULL THEN
			width := greatest(min_width, (rate * extract(epoch FROM span))::bigint);
		ELSE
			width := greatest(min_width, ((next_id - g.lo) * extract(epoch FROM span)
									 / greatest(extract(epoch FROM maintain_at.now - g.made_at), 1))::bigint);
		END IF;
		segs_made := segs_made || dwarf_internal.make_step_segment(g.hi, g.hi + width, true)::text;
	END IF;

	/*
	 * Archived segments of the step log go once the newest of their flows
	 * closed on a day now dropped, and none of their flows is left in
	 * dwarf.flow: an open one, which outlived its segment, has its steps in
	 * dwarf.step_default and more may come there to be archived into this
	 * segment; a closed one moves to a day partition first, so that no
	 * flow is ever without its steps.
	 */
	FOR g IN SELECT * FROM dwarf.segment s
			  WHERE NOT s.live
				AND (coalesce(s.newest_close, s.archived_at) AT TIME ZONE 'UTC')::date < expired_before
				AND NOT EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id >= s.lo AND f.id < s.hi)
			  ORDER BY s.lo LOOP
		IF dry_run THEN
			segs_dropped := segs_dropped || g.relation::text;
			CONTINUE;
		END IF;
		BEGIN
			PERFORM set_config('lock_timeout', '500ms', true);
			EXECUTE format('DROP TABLE IF EXISTS dwarf.%I', g.relation);
			DELETE FROM dwarf.segment WHERE lo = g.lo;
			segs_dropped := segs_dropped || g.relation::text;
		EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
			segs_deferred := segs_deferred || g.relation::text;
		END;
		PERFORM set_config('lock_timeout', lock_timeout, true);
	END LOOP;

	/* A dry run counts what the moves would take, and stops there. */
	IF dry_run THEN
		RETURN jsonb_build_object(
			'dry_run', true,
			'moved_flows', coalesce(cardinality(ids), 0),
			'segments_made', to_jsonb(segs_made),
			'partitions_made', cardinality(made),
			'partitions_dropped', cardinality(dropped),
			'days_made', to_jsonb(made),
			'days_dropped', to_jsonb(dropped),
			'days_indexed', to_jsonb(indexed),
			'flows_in_days_dropped', dropped_flows,
			'segments_archived', to_jsonb(segs_archived),
			'segments_dropped', to_jsonb(segs_dropped),
			'segments_replaced', to_jsonb(segs_replaced),
			'more', more,
			'took_ms', round(extract(epoch FROM clock_timestamp() - started) * 1000, 1));
	END IF;


	result := jsonb_build_object(
		'next_id', next_id,
		'next_id_at', next_id_at,
		'moved_flows', moved_flows,
		'moved_steps', moved_steps,
		'partitions_made', cardinality(made),
		'partitions_dropped', cardinality(dropped),
		'days_made', to_jsonb(made),
		'days_dropped', to_jsonb(dropped),
		'days_left_for_next_pass', to_jsonb(deferred),
		'days_indexed', to_jsonb(indexed),
		'segments_made', to_jsonb(segs_made),
		'segments_archived', to_jsonb(segs_archived),
		'segments_dropped', to_jsonb(segs_dropped),
		'segments_replaced', to_jsonb(segs_replaced),
		'segments_left_for_next_pass', to_jsonb(segs_deferred),
		'more', more,
		'took_ms', round(extract(epoch FROM clock_timestamp() - started) * 1000, 1));
	INSERT INTO dwarf.maintain_log VALUES (started, clock_timestamp() - started, maintain_at.now, result);
	-- answers that came as their flow closed or was cancelled: no one records them
	DELETE FROM dwarf.answer a
	 WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow f
					   WHERE f.id = a.flow_id AND f.status IN ('running', 'interrupted'));
	DELETE FROM dwarf.maintain_log
	 WHERE started_at < (SELECT l.started_at FROM dwarf.maintain_log l
						  ORDER BY l.started_at DESC OFFSET 999 LIMIT 1);
	IF current_setting('wal_compression') <> wal_compression THEN
		PERFORM set_config('wal_compression', wal_compression, true);
	END IF;
	RETURN result;
END
$$;
REVOKE ALL ON FUNCTION dwarf_internal.maintain_at(timestamptz, boolean) FROM PUBLIC;
COMMENT ON FUNCTION dwarf_internal.maintain_at(timestamptz, boolean) IS
	'A pass of dwarf.maintain as if the time were now (for tests: a time ahead drops days before their retention); '
	'granted to no one, unlike dwarf.maintain';

CREATE FUNCTION dwarf.maintain(dry_run boolean DEFAULT false) RETURNS jsonb
	LANGUAGE sql SECURITY DEFINER
	SET search_path = pg_catalog, pg_temp
	AS $$ SELECT dwarf_internal.maintain_at(pg_catalog.now(), maintain.dry_run) $$;
REVOKE ALL ON FUNCTION dwarf.maintain(boolean) FROM PUBLIC;
COMMENT ON FUNCTION dwarf.maintain(boolean) IS
	'Moves flows closed for longer than dwarf.archive_after (and their steps) into the archive, drops archive days '
	'older than dwarf.retention and makes the next days'' partitions; returns what it did. With dry_run => true it '
	'changes nothing and returns what a pass would do. For the extension''s owner '
	'(GRANT EXECUTE, and USAGE on schema dwarf, to an operator role); schedule it with pg_cron';

/*
 * The steps in a step log's partitions, as the statistics estimate them: a
 * row packs a flow's steps (dwarf.step_log), so it is each partition's rows
 * (reltuples) times the mean count of elements of its step_id arrays, which
 * ANALYZE keeps as the last number of the column's elem_count_histogram
 * (STATISTIC_KIND_DECHIST, 5).  A partition not analyzed yet counts a step a
 * row.  SECURITY DEFINER: pg_statistic is its owner's to read.
 */
CREATE FUNCTION dwarf_internal.steps_estimate(log regclass) RETURNS bigint
	LANGUAGE sql STABLE SECURITY DEFINER
	SET search_path = pg_catalog, pg_temp
	AS $$
	SELECT coalesce(sum(greatest(c.reltuples, 0) * coalesce(h.per_row, 1)), 0)::bigint
	  FROM pg_partition_tree(steps_estimate.log) t
	  JOIN pg_class c ON c.oid = t.relid
	  LEFT JOIN LATERAL (
		SELECT n[array_upper(n, 1)] AS per_row
		  FROM pg_attribute a
		  JOIN pg_statistic s ON s.starelid = a.attrelid AND s.staattnum = a.attnum AND NOT s.stainherit,
			   LATERAL (VALUES (CASE 5 WHEN s.stakind1 THEN s.stanumbers1 WHEN s.stakind2 THEN s.stanumbers2
										WHEN s.stakind3 THEN s.stanumbers3 WHEN s.stakind4 THEN s.stanumbers4
										WHEN s.stakind5 THEN s.stanumbers5 END)) v(n)
		 WHERE a.attrelid = c.oid AND a.attname = 'step_id') h ON true
	 WHERE t.isleaf
	$$;

CREATE VIEW dwarf.storage AS
	SELECT (SELECT pg_total_relation_size('dwarf.flow')) AS live_flow_bytes,
		   (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
			  FROM pg_partition_tree('dwarf.step_log') t WHERE t.isleaf) AS live_step_bytes,
		   (SELECT coalesce(sum(pg_total_relation_size(a.partition)), 0)
			  FROM dwarf_internal.archive_days('dwarf.flow_archive') a) AS archive_flow_bytes,
		   (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
			  FROM pg_partition_tree('dwarf.step_log_archive') t WHERE t.isleaf) AS archive_step_bytes,
		   dwarf_internal.steps_estimate('dwarf.step_log_archive') AS archive_steps_estimate,
		   (SELECT count(*) FROM dwarf_internal.archive_days('dwarf.flow_archive')) AS archive_days,
		   (SELECT min(a.day) FROM dwarf_internal.archive_days('dwarf.flow_archive') a) AS oldest_archived_day,
		   (SELECT count(*) FROM dwarf.segment s WHERE s.live) AS live_segments,
		   (SELECT count(*) FROM dwarf.segment s WHERE NOT s.live) AS archived_segments,
		   l.started_at AS last_maintain_at,
		   l.took AS last_maintain_took,
		   l.result AS last_maintain
	  FROM (SELECT 1) one
	  LEFT JOIN LATERAL (SELECT * FROM dwarf.maintain_log ORDER BY started_at DESC LIMIT 1) l ON true;
COMMENT ON VIEW dwarf.storage IS
	'Sizes of the live tables and the archive, the oldest archived day, and the last dwarf.maintain() pass';
GRANT SELECT ON dwarf.storage TO PUBLIC;

/*
 * dwarf_internal's functions are for dwarf's own code.  PostgreSQL checks
 * EXECUTE as the caller of a public function or view that calls one, so
 * those it calls on the caller's behalf stay executable; with no USAGE on
 * the schema, no role can name them itself.
 */
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA dwarf_internal FROM PUBLIC;
GRANT EXECUTE ON FUNCTION dwarf_internal.flow_steps(bigint),			-- history, snapshot, state_at
	dwarf_internal.failed_step_error(bigint, text),						-- snapshot, list
	dwarf_internal.fold_changes(jsonb, jsonb[], jsonb),					-- state_at
	dwarf_internal.archive_days(regclass),								-- dwarf.storage
	dwarf_internal.steps_estimate(regclass)								-- dwarf.storage
	TO PUBLIC;
