/*
 * flows.c
 *		The flow table's writers' tools, shared by the SQL functions (api.c,
 *		ops.c, control.c) and the workers (store.c, worker.c): new flow ids
 *		and flow rows, acting as the extension's owner, statements kept for
 *		a session's life, notes that reach the workers when a transaction
 *		commits, and the checks every SQL function makes of its arguments.
 *
 * The tables are readable under row-level security and writable by no one
 * but the extension's owner: a function checks who may do what, then
 * writes as the owner (BecomeOwner).
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/genam.h"
#include "common/int.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"
#include "json.h"
#include "flows.h"
#include "rows.h"
#include "stats.h"

/* What to tell the workers (and the launcher) when this transaction commits. */
typedef struct PendingNote
{
	int64		flow_id;
	DwarfNoteKind kind;
	bool		wake_waiters;
} PendingNote;

static List *PendingNotes = NIL;	/* in TopTransactionContext */
static bool PendingRescan = false;
static uint64 PendingWakes = 0; /* workers to wake, by number (bit n: worker n) */

/* ---------- commit-time notes ---------- */

/*
 * At commit, wakes the worker that owns flow_id, with no note: what it is
 * to do waits for it in shared memory (the answers of external steps,
 * offers.c).  However many flows of a worker the transaction touched, it
 * is woken once.
 */
void
WakeOwnerOnCommit(int64 flow_id)
{
	PendingWakes |= UINT64CONST(1) << (DwarfWorkerOf(flow_id) % DWARF_MAX_WORKERS);
}

void
NoteOnCommit(int64 flow_id, DwarfNoteKind kind, bool wake_waiters)
{
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
	PendingNote *note = palloc(sizeof(PendingNote));

	note->flow_id = flow_id;
	note->kind = kind;
	note->wake_waiters = wake_waiters;
	PendingNotes = lappend(PendingNotes, note);
	MemoryContextSwitchTo(old);
}

/*
 * Hands a note to every worker of this database: a tree's flows may be
 * owned by any of them (flows are placed by id).
 */
static void
PushToAllWorkers(int64 flow_id, DwarfNoteKind kind)
{
	int			i;

	if (Dwarf == NULL)
		return;
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
		if (Dwarf->workers[i].dboid == MyDatabaseId && Dwarf->workers[i].latch)
			(void) DwarfPushNote(&Dwarf->workers[i], flow_id, kind);
}

/* From the object access hook: an extension or database came or went. */
void
DwarfRescanOnCommit(void)
{
	PendingRescan = true;
}

/*
 * Transaction callback: once the transaction has committed (its rows are
 * visible), hand its notes to the owning workers and wake them.
 */
void
DwarfXactCallback(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (event == XACT_EVENT_COMMIT)
	{
		foreach(lc, PendingNotes)
		{
			PendingNote *note = lfirst(lc);
			DwarfWorkerSlot *slot = DwarfOwnerSlot(MyDatabaseId, note->flow_id);

			if (note->kind == NOTE_CANCEL_TREE)
				PushToAllWorkers(note->flow_id, note->kind);
			else if (slot)
				(void) DwarfPushNote(slot, note->flow_id, note->kind);
			if (note->wake_waiters && Dwarf)
				DwarfWakeWaiters(&note->flow_id, 1);
		}
		if (PendingWakes != 0 && Dwarf)
		{
			int			i;

			for (i = 0; i < DWARF_MAX_WORKERS; i++)
			{
				DwarfWorkerSlot *slot;

				if ((PendingWakes & (UINT64CONST(1) << i)) == 0)
					continue;
				slot = DwarfWorkerSlotOf(MyDatabaseId, i);
				if (slot && slot->latch)
					SetLatch(slot->latch);
			}
		}
		if (PendingRescan && Dwarf)
		{
			int			i;

			DwarfWakeLauncher();
			for (i = 0; i < DWARF_MAX_WORKERS; i++)
				if (Dwarf->workers[i].dboid == MyDatabaseId && Dwarf->workers[i].latch)
					SetLatch(Dwarf->workers[i].latch);
		}
	}
	/*
	 * The notes would have to wait for COMMIT PREPARED, which may come from
	 * another session, after a restart: refuse, as PostgreSQL does for
	 * LISTEN or temporary tables.
	 */
	if (event == XACT_EVENT_PRE_PREPARE && (PendingNotes != NIL || PendingRescan || PendingWakes))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot PREPARE a transaction that created, cancelled, resumed or deleted dwarf flows or answered their steps"),
				 errhint("Commit it instead: a flow starts when its transaction commits.")));
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
	{
		PendingNotes = NIL;
		PendingRescan = false;
		PendingWakes = 0;
	}
}

/* ---------- acting as the extension owner ---------- */

/* The owner of dwarf's tables, who alone may write them. */
Oid
DwarfExtensionOwner(void)
{
	Oid			nsp = get_namespace_oid("dwarf", false);
	Oid			rel = get_relname_relid("flow", nsp);
	HeapTuple	tup;
	Oid			owner;

	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(rel));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "dwarf: table dwarf.flow is missing");
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

SavedUser
BecomeOwner(void)
{
	SavedUser	saved;

	GetUserIdAndSecContext(&saved.user, &saved.sec);
	SetUserIdAndSecContext(DwarfExtensionOwner(), saved.sec | SECURITY_LOCAL_USERID_CHANGE);
	saved.nest = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return saved;
}

/* Back to the caller's role and search_path (an error unwinds both anyway). */
void
RestoreUser(SavedUser saved)
{
	AtEOXact_GUC(true, saved.nest);
	SetUserIdAndSecContext(saved.user, saved.sec);
}

/* Runs one statement through SPI and checks that it did what was meant. */
void
Exec(const char *sql, int nargs, Oid *types, Datum *args, const char *nulls,
	 int expect)
{
	int			rc = SPI_execute_with_args(sql, nargs, types, args, nulls, false, 0);

	if (rc != expect)
		elog(ERROR, "dwarf: \"%s\" failed: %s", sql, SPI_result_code_string(rc));
}

/*
 * Prepares a statement for the life of the backend, with a generic plan: a
 * custom plan for every execution would plan again each time.  Used for
 * every statement of a hot path, in client backends and workers alike.
 */
SPIPlanPtr
PrepareKept(const char *sql, int nargs, Oid *types)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, types, CURSOR_OPT_GENERIC_PLAN);

	if (plan == NULL || SPI_keepplan(plan) != 0)
		elog(ERROR, "dwarf: could not prepare \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	return plan;
}

/*
 * Executes a kept plan of a statement that reads rows by a list of keys
 * ("id = ANY($1)"), with sequential scans off while it is planned, so that
 * it reads the keys' rows by index whatever the table's statistics say.
 * A plan made while the table was empty (a worker that started before
 * any flow) scans the table whole; so does one made for a thousand keys
 * while the table has no statistics (a fresh install until autovacuum
 * first analyzes it, a restored one): each key gets the default
 * selectivity, and a thousand of them cover the table.  Then every load of
 * a thousand flows read the table whole (25 ms at 50,000 rows).  The
 * generic plan is made at the first execution and again when the table's
 * statistics or definition change, both inside SPI_execute_plan, hence
 * the setting around it.
 */
int
ExecKeptByKeys(SPIPlanPtr plan, Datum *args, bool read_only)
{
	int			nest = NewGUCNestLevel();
	int			rc;

	(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	rc = SPI_execute_plan(plan, args, NULL, read_only, 0);
	AtEOXact_GUC(true, nest);
	return rc;
}

/* Like Exec, with a plan PrepareKept makes on first use and keeps in *plan. */
void
ExecKept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *args,
		 int expect)
{
	int			rc;

	if (*plan == NULL)
		*plan = PrepareKept(sql, nargs, types);
	rc = SPI_execute_plan(*plan, args, NULL, false, 0);
	if (rc != expect)
		elog(ERROR, "dwarf: \"%s\" failed: %s", sql, SPI_result_code_string(rc));
}

void
Connect(void)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "dwarf: SPI_connect failed");
}

void
CheckInput(Jsonb *input)
{
	if (!JsonbIsObject(input))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("flow input must be a JSON object")));
}

/*
 * The functions that write flows say so on a standby, instead of failing
 * in the middle with PostgreSQL's "read-only transaction" errors.
 */
void
CheckNotStandby(const char *function)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("%s cannot run on a standby server", function),
				 errdetail("dwarf writes flows only on the primary; this server is in recovery."),
				 errhint("Connect to the primary to create or change flows; a standby can read them.")));
}

/*
 * A new flow id: this shard's number, an epoch, and the sequence's value.
 * The epoch is the WAL timeline less one (its low 8 bits), so a server
 * never promoted (timeline 1) hands out small ids: 1, 2, 3...  The timeline
 * changes at every promotion, so a standby promoted after an asynchronous
 * failover (timeline 2, epoch 1) never hands out again an id (nor a
 * dwarf.step_key()) that the lost primary had given out.
 */
int64
NewFlowId(void)
{
	Oid			seq;
	int64		value;

	CheckNotStandby("dwarf");
	seq = get_relname_relid("flow_seq", get_namespace_oid("dwarf", false));
	value = nextval_internal(seq, false);	/* dwarf's own: no privilege to check */
	DwarfNextvalUsed = true;
	if (value >= (INT64CONST(1) << DWARF_EPOCH_SHIFT))
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("dwarf.flow_seq is past 2^40")));
	return ((int64) dwarf_shard_id << DWARF_SHARD_SHIFT) |
		((int64) ((GetWALInsertionTimeLine() - 1) & 0xFF) << DWARF_EPOCH_SHIFT) | value;
}

DWARF_FUNCTION(dwarf_flow_id_prefix);

/*
 * dwarf_internal.flow_id_prefix(): the high bits of the ids NewFlowId gives
 * now (shard and epoch), for dwarf_internal.next_flow_id.
 */
Datum
dwarf_flow_id_prefix(PG_FUNCTION_ARGS)
{
	CheckNotStandby("dwarf_internal.flow_id_prefix");
	PG_RETURN_INT64(((int64) dwarf_shard_id << DWARF_SHARD_SHIFT) |
					((int64) ((GetWALInsertionTimeLine() - 1) & 0xFF) << DWARF_EPOCH_SHIFT));
}

/*
 * The error of every function that takes a flow id, for one the caller
 * cannot see, live or archived: "flow N does not exist".  Its hint says
 * what the id itself tells: that it names another shard, or that it was
 * given out on another timeline (bits 40 to 47, NewFlowId): a later one
 * means another server's id; an earlier one, an id from before this
 * server's last promotion, which may be a flow lost with the old primary.
 */
void
FlowNotFound(int64 flow_id)
{
	int			shard = (int) (flow_id >> DWARF_SHARD_SHIFT);
	int			epoch = (int) ((flow_id >> DWARF_EPOCH_SHIFT) & 0xFF);
	int			now = RecoveryInProgress() ? epoch : (int) ((GetWALInsertionTimeLine() - 1) & 0xFF);

	if (flow_id > 0 && shard != dwarf_shard_id)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("flow " INT64_FORMAT " does not exist", flow_id),
				 errhint("A flow id carries its shard's dwarf.shard_id in bits 48 to 62: this one names shard %d, and this server is shard %d.",
						 shard, dwarf_shard_id)));
	if (flow_id > 0 && epoch > now)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("flow " INT64_FORMAT " does not exist", flow_id),
				 errhint("Its bits 40 to 47 say it was given out on timeline %d, and this server is on timeline %d: it is not an id of this server.",
						 epoch + 1, now + 1)));
	if (flow_id > 0 && epoch < now)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("flow " INT64_FORMAT " does not exist", flow_id),
				 errhint("A role sees only its own flows. This id was given out before this server's last promotion (on timeline %d; it is on timeline %d): a flow the old primary created after the last WAL this server received was lost with it.",
						 epoch + 1, now + 1)));
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("flow " INT64_FORMAT " does not exist", flow_id),
			 errhint("A role sees only its own flows (and those of roles whose privileges it has).")));
}

DWARF_FUNCTION(dwarf_check_flow);

/*
 * dwarf.check_flow(flow): nothing when the caller may see the flow (live
 * or archived), else FlowNotFound's error; what the SQL functions that take
 * a flow id (history, snapshot...) call first, so that an unknown id is the
 * same error everywhere.
 */
Datum
dwarf_check_flow(PG_FUNCTION_ARGS)
{
	int64		flow_id = PG_GETARG_INT64(0);
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(flow_id)};
	bool		found;

	Connect();
	Exec("SELECT 1 FROM dwarf.flow_all WHERE id = $1 LIMIT 1", 1, types, args, NULL, SPI_OK_SELECT);
	found = SPI_processed > 0;
	SPI_finish();
	if (!found)
		FlowNotFound(flow_id);
	PG_RETURN_VOID();
}

/* ---------- flow rows ---------- */

/*
 * A flow's row, inserted with ON CONFLICT on the idempotency key only when
 * there is a key: without one no conflict is possible, and a speculative
 * insertion would cost a WAL record a flow (its confirmation), a token lock
 * and an arbiter check for nothing.
 */
#define INSERT_FLOW_SQL \
	"INSERT INTO dwarf.flow AS f (id, graph_id, owner, priority, idempotency_key, input," \
	" fairness_key, fairness_weight, time_budget, delete_on_completion, baggage," \
	" thread, start_task, parent_id, parent_key, root_id)" \
	" VALUES ($1, $2, $3::regrole, $4, $5, $6, $7->>'fairness_key'," \
	" coalesce(($7->>'fairness_weight')::int, 1), ($7->>'time_budget')::interval," \
	" coalesce(($7->>'delete_on_completion')::boolean, false), $7->'baggage'," \
	" $7->>'thread', $7->>'start_task', ($7->>'parent_id')::bigint, $7->>'parent_key'," \
	" ($7->>'root_id')::bigint)"

static SPIPlanPtr InsertFlowPlan = NULL;
static SPIPlanPtr InsertKeylessFlowPlan = NULL;
static SPIPlanPtr FindKeyPlan = NULL;
static SPIPlanPtr FindArchivedKeyPlan = NULL;
static SPIPlanPtr UndoInsertPlan = NULL;

/*
 * Inserts a flow row (as the extension owner; the caller is connected to
 * SPI).  With an idempotency key the owner already used, inserts nothing
 * and returns that flow's id with *is_new false.  Options is a JSON object
 * with the optional settings (fairness_key, time_budget, baggage, ...).
 * Used by dwarf.create in the caller's transaction, and by workers for
 * dwarf.run, dwarf.subgraph, dwarf.fork and dwarf.continue.
 */
int64
InsertFlow(int64 flow_id, int32 graph_id, Oid owner, int32 priority,
		   text *key, Jsonb *input, Jsonb *options, bool *is_new)
{
	FlowRow		row;

	/*
	 * A create with no key and only the options rows.c knows (dwarf.create's
	 * own) is written without a statement: an INSERT would be set up per
	 * call, its check constraints parsed again each time, and a bulk create
	 * would spend half its time there.  In a read-only transaction the
	 * INSERT is left to refuse it.
	 */
	if (key == NULL && !XactReadOnly &&
		RowsInsertFlow(flow_id, graph_id, owner, priority, input,
					   options ? options : JsonbEmptyObject(), &row))
	{
		StatsFlowCreated(graph_id, NULL);
		*is_new = true;
		return flow_id;
	}
	return InsertFlowRow(flow_id, graph_id, owner, priority, key, input, options, is_new,
						 NULL, NULL);
}

/*
 * InsertFlow, and a new flow's row as a worker takes it in (flows.h), in
 * *row and *desc when they are given and the flow is new: the worker that
 * creates a flow for dwarf.run puts it in memory without reading it back.
 */
int64
InsertFlowRow(int64 flow_id, int32 graph_id, Oid owner, int32 priority,
			  text *key, Jsonb *input, Jsonb *options, bool *is_new,
			  HeapTuple *row, TupleDesc *desc)
{
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	int64		id;
	SavedUser	saved = BecomeOwner();

	if (InsertFlowPlan == NULL)
	{
		Oid			types[7] = {INT8OID, INT4OID, OIDOID, INT4OID, TEXTOID, JSONBOID, JSONBOID};
		Oid			keytypes[2] = {OIDOID, TEXTOID};

		InsertFlowPlan = PrepareKept(
			INSERT_FLOW_SQL
			" ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
			" RETURNING " FLOW_ROW_COLUMNS, 7, types);
		InsertKeylessFlowPlan = PrepareKept(
			INSERT_FLOW_SQL " RETURNING " FLOW_ROW_COLUMNS, 7, types);
		FindKeyPlan = PrepareKept(
			"SELECT id FROM dwarf.flow_all WHERE owner = $1::regrole AND idempotency_key = $2",
			2, keytypes);
		FindArchivedKeyPlan = PrepareKept(
			"SELECT id FROM dwarf.flow_archive WHERE owner = $1::regrole AND idempotency_key = $2",
			2, keytypes);
		UndoInsertPlan = PrepareKept("DELETE FROM dwarf.flow WHERE id = $1", 1, types);
	}

	args[0] = Int64GetDatum(flow_id);
	args[1] = Int32GetDatum(graph_id);
	args[2] = ObjectIdGetDatum(owner);
	args[3] = Int32GetDatum(priority);
	if (key)
		args[4] = PointerGetDatum(key);
	else
		nulls[4] = 'n';
	args[5] = JsonbPGetDatum(input);
	args[6] = JsonbPGetDatum(options ? options : JsonbEmptyObject());

	if (SPI_execute_plan(key ? InsertFlowPlan : InsertKeylessFlowPlan, args, nulls, false, 0)
		!= SPI_OK_INSERT_RETURNING)
		elog(ERROR, "dwarf: could not insert a flow");
	*is_new = SPI_processed == 1;
	id = flow_id;
	if (row && *is_new)
	{
		*row = SPI_copytuple(SPI_tuptable->vals[0]);
		*desc = CreateTupleDescCopy(SPI_tuptable->tupdesc);
	}

	/*
	 * The key may belong to a flow dwarf.maintain has archived: then that
	 * flow is the answer, and the row just inserted goes.  Looked up after
	 * the insert, whose conflict check waited for any move in progress, so
	 * that a flow moving meanwhile is seen here.
	 */
	if (*is_new && key)
	{
		Datum		keyargs[2] = {args[2], args[4]};

		if (SPI_execute_plan(FindArchivedKeyPlan, keyargs, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not look up idempotency key \"%s\"", text_to_cstring(key));
		if (SPI_processed == 1)
		{
			id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
			if (SPI_execute_plan(UndoInsertPlan, args, NULL, false, 0) != SPI_OK_DELETE)
				elog(ERROR, "dwarf: could not undo the insert of flow " INT64_FORMAT, flow_id);
			*is_new = false;
		}
	}
	else if (!*is_new)
	{
		Datum		keyargs[2] = {args[2], args[4]};

		if (SPI_execute_plan(FindKeyPlan, keyargs, NULL, false, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			elog(ERROR, "dwarf: the flow with idempotency key \"%s\" vanished",
				 text_to_cstring(key));
		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}

	/*
	 * A new flow counts as created (stats.c), unless the worker that wrote
	 * it takes it in from its row (row): TakeInFlow counts those.
	 */
	if (*is_new && row == NULL)
		StatsFlowCreated(graph_id, NULL);
	RestoreUser(saved);
	return id;
}

/* ---------- trees of subgraphs ---------- */

/*
 * A tree of flows is a flow started by dwarf.create or dwarf.run (its top)
 * and the flows dwarf.subgraph started below it, at any depth.  Each child
 * names the top in root_id, so that the whole tree is one index scan away
 * (a cancel of 100,000 flows is one statement, not a walk), and the top's
 * row counts the tree's flows in tree_flows: the count is bumped by an
 * UPDATE of that one row, which serializes the tree's creators across
 * workers (a tree's flows are placed on workers by their own ids) and
 * conflicts with a cancel's UPDATE of the same row, so a child is never
 * started in a tree whose top was cancelled meanwhile.
 */

/* Above this many flows, a cancel tells the workers about the tree, not each flow. */
#define CANCEL_NOTES_PER_FLOW 64

/*
 * Cancels the running and interrupted flows below flow_id, whose tree's
 * top is root (flow_id itself, or an ancestor), with reason; the caller
 * has cancelled flow_id itself, so that no new child starts under it.  The
 * statement runs again until it finds none: a child that a worker started
 * before this cancel's locks reached its parent is committed and visible
 * to the next statement (each takes a new snapshot), and none can start
 * after (StartChildFlow locks the parent and the top).  The workers hear at
 * commit: flow by flow when they are few, else with one note for the tree
 * (NOTE_CANCEL_TREE, to every worker).  Returns how many were cancelled.
 * The caller is connected to SPI, as the extension owner.
 */
int64
CancelDescendants(int64 flow_id, int64 root, const char *reason)
{
	Oid			types[3] = {INT8OID, INT8OID, TEXTOID};
	Datum		args[3] = {Int64GetDatum(flow_id), Int64GetDatum(root),
	CStringGetTextDatum(reason)};
	int64		ids[CANCEL_NOTES_PER_FLOW];
	int64		total = 0;
	uint64		i;

	for (;;)
	{
		if (flow_id == root)
			Exec("UPDATE dwarf.flow SET status = 'cancelled', finished_at = now(), cancel_reason = $3"
				 " WHERE root_id = $2 AND status IN ('running', 'interrupted')"
				 " RETURNING id, " CLOSED_FLOW_COLUMNS,
				 3, types, args, NULL, SPI_OK_UPDATE_RETURNING);
		else
			Exec("WITH RECURSIVE tree AS ("
				 "  SELECT id FROM dwarf.flow WHERE parent_id = $1"
				 "  UNION ALL SELECT f.id FROM dwarf.flow f JOIN tree t ON f.parent_id = t.id)"
				 " UPDATE dwarf.flow SET status = 'cancelled', finished_at = now(), cancel_reason = $3"
				 " WHERE id IN (SELECT id FROM tree) AND root_id = $2"
				 "  AND status IN ('running', 'interrupted') RETURNING id, " CLOSED_FLOW_COLUMNS,
				 3, types, args, NULL, SPI_OK_UPDATE_RETURNING);
		if (SPI_processed == 0)
			break;
		for (i = 0; i < SPI_processed; i++)
		{
			bool		isnull;

			if (total + i < CANCEL_NOTES_PER_FLOW)
				ids[total + i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
															 SPI_tuptable->tupdesc, 1, &isnull));
		}
		StatsClosedRows(2, STATS_CANCELLED);
		total += SPI_processed;
	}
	if (total > CANCEL_NOTES_PER_FLOW)
		NoteOnCommit(root, NOTE_CANCEL_TREE, false);
	else
		for (i = 0; i < total; i++)
		{
			/* the cancel first: its worker withdraws what the flow offered */
			NoteOnCommit(ids[i], NOTE_CANCEL_FLOW, false);
			NoteOnCommit(ids[i], NOTE_RELOAD_FLOW, true);
		}
	return total;
}

/*
 * The tree whose top is root met dwarf.max_tree_flows (a worker heard so
 * through NOTE_TREE_CAP): the top fails with the cap's error, if it is
 * still open, and every open flow below it is cancelled, so that a fork
 * bomb ends as a whole and not one leaf at a time.  The caller is connected
 * to SPI, in a transaction of its own.
 */
void
FailTreeOnCap(int64 root)
{
	Oid			types[2] = {INT8OID, TEXTOID};
	Datum		args[2];
	SavedUser	saved = BecomeOwner();

	args[0] = Int64GetDatum(root);
	args[1] = CStringGetTextDatum(psprintf("the flow tree of flow " INT64_FORMAT " reached %d flows, the most dwarf.max_tree_flows allows",
										   root, dwarf_max_tree_flows));
	Exec("UPDATE dwarf.flow SET status = 'failed', error = $2, finished_at = now()"
		 " WHERE id = $1 AND status IN ('running', 'interrupted') AND root_id IS NULL"
		 " RETURNING " CLOSED_FLOW_COLUMNS,
		 2, types, args, NULL, SPI_OK_UPDATE_RETURNING);
	if (SPI_processed == 1)
	{
		StatsClosedRows(1, STATS_FAILED);
		NoteOnCommit(root, NOTE_CANCEL_FLOW, false);
		NoteOnCommit(root, NOTE_RELOAD_FLOW, true);
	}
	(void) CancelDescendants(root, root,
							 psprintf("flow " INT64_FORMAT " failed: its tree reached dwarf.max_tree_flows",
									  root));
	RestoreUser(saved);
}

/*
 * May role own a flow of this priority?  Below 0 only with the privileges
 * of dwarf_priority (superusers have them; without that role, only
 * superusers may).
 */
bool
MayUsePriority(Oid role, int32 priority)
{
	Oid			granted;

	if (priority >= 0)
		return true;
	granted = get_role_oid(DWARF_PRIORITY_ROLE, true);
	return OidIsValid(granted) ? has_privs_of_role(role, granted) : superuser_arg(role);
}

/*
 * Refuses a priority below 0 for a flow owned by role unless it may
 * (MayUsePriority): for the flows dwarf.fork, dwarf.continue and
 * dwarf.subgraph start from another flow's priority, as dwarf.create and
 * dwarf.run refuse it for theirs.
 */
void
CheckPriorityOf(Oid role, int32 priority, const char *function)
{
	if (MayUsePriority(role, priority))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for %s to start a flow with priority %d", function, priority),
			 errdetail("The new flow would take its priority from the flow it follows; a priority below 0 runs a flow's steps before those of every other role."),
			 errhint("Ask a superuser to GRANT %s TO %s.",
					 DWARF_PRIORITY_ROLE, GetUserNameFromId(role, false))));
}

/* ---------- arguments ---------- */

void
CheckNotNull(FunctionCallInfo fcinfo, int arg, const char *name)
{
	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/*
 * Microseconds in an interval argument (months count as 30 days).  With
 * what, a negative interval is an error naming that argument.
 */
int64
IntervalMicros(Interval *span, const char *what)
{
	int64		days = (int64) span->month * DAYS_PER_MONTH + span->day;
	int64		us;

	/* Past the limit, a wake time or deadline would overflow a timestamp. */
	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &us) ||
		pg_add_s64_overflow(us, span->time, &us) ||
		us > DWARF_MAX_INTERVAL || us < -DWARF_MAX_INTERVAL)
		ereport(ERROR,
				(errcode(ERRCODE_INTERVAL_FIELD_OVERFLOW),
				 errmsg("%s is out of range", what ? what : "interval"),
				 errhint("dwarf takes intervals of at most 100 years.")));
	if (what && us < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", what)));
	return us;
}
