/*
 * ops.c
 *		SQL-callable operations on existing flows: cancel, resume, fork,
 *		continue, delete and purge; and two that only read: the worker
 *		counters (worker_stats) and a flow's state replayed by the worker's
 *		code (replay_state).
 *
 * Each operation finds the flow under row-level security (a role sees only
 * the flows of roles whose privileges it has), then writes as the extension
 * owner and tells the owning worker at commit.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"
#include "graph.h"
#include "flowrun.h"
#include "json.h"
#include "flows.h"
#include "stats.h"
#include "names.h"

/*
 * The status of a flow the caller may see (row-level security shows a role
 * only the flows of roles it has the privileges of); an error when none.
 * The caller is connected to SPI.
 */
static char *
VisibleFlowStatus(int64 flow_id)
{
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(flow_id)};

	Exec("SELECT status FROM dwarf.flow_all WHERE id = $1 LIMIT 1", 1, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		FlowNotFound(flow_id);
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}


/*
 * At commit, has the worker that owns a cancelled flow stop the flow's
 * running step, if it has one (in the worker, or in a runner it lent the
 * step to): while a task runs, both watch the worker's notes for this one
 * (step.c), and the step's writes roll back.
 */
static void
StopRunningStepOnCommit(int64 flow_id)
{
	NoteOnCommit(flow_id, NOTE_CANCEL_FLOW, false);
}

/*
 * Cancels a flow and its tree below it, if it is open; whether it was.  The
 * flow first, on its own: once its row is ours, no child can start under
 * it (nor, for the top of a tree, anywhere in the tree).  The caller is
 * connected to SPI.
 */
static bool
CancelFlowAndTree(int64 flow_id, Datum *args, char *nulls)
{
	Oid			types[2] = {INT8OID, TEXTOID};
	SavedUser	saved = BecomeOwner();
	bool		isnull;
	bool		no_root;
	int64		parent = 0;
	Datum		root;

	Exec("UPDATE dwarf.flow SET status = 'cancelled', cancel_reason = $2, finished_at = now()"
		 " WHERE id = $1 AND status IN ('running', 'interrupted')"
		 " RETURNING parent_id, root_id, " CLOSED_FLOW_COLUMNS,
		 2, types, args, nulls, SPI_OK_UPDATE_RETURNING);
	if (SPI_processed == 0)
	{
		RestoreUser(saved);
		return false;
	}
	StatsClosedRows(3, STATS_CANCELLED);
	root = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &no_root);
	root = no_root ? Int64GetDatum(flow_id) : root;
	parent = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));

	/* Child flows started by dwarf.subgraph go with their parent. */
	(void) CancelDescendants(flow_id, DatumGetInt64(root),
							 psprintf("parent flow " INT64_FORMAT " cancelled", flow_id));
	RestoreUser(saved);

	/* A parent waiting in dwarf.subgraph runs its task again, and sees why. */
	if (!isnull)
		NoteOnCommit(parent, NOTE_RELOAD_FLOW, false);

	/*
	 * The cancel's note before the reload's: the worker withdraws what the
	 * flow has offered (its HTTP calls are closed at once) only while it
	 * still holds the flow, which the reload drops.
	 */
	StopRunningStepOnCommit(flow_id);
	NoteOnCommit(flow_id, NOTE_RELOAD_FLOW, true);
	return true;
}

/* Times dwarf.cancel tries again after losing a deadlock to a worker. */
#define CANCEL_TRIES 5

DWARF_FUNCTION(dwarf_cancel);

/*
 * dwarf.cancel(flow, reason): stops a running or interrupted flow, and the
 * flows it started with dwarf.subgraph, at any depth, and those they start
 * while the cancel runs (CancelDescendants).  Returns true when it
 * cancelled it, false when it had already closed, so that a query can
 * cancel many flows at once (SELECT dwarf.cancel(id) FROM ...) whatever
 * became of each; a flow the caller cannot see is an error.
 *
 * A worker may hold a row of the tree (a flow it closes in its batch) and
 * then wait for the top's row, which the cancel holds: a deadlock, whose
 * victim may be the cancel.  The cancel runs in a subtransaction, and
 * one that lost a deadlock lets go of every row, so that the worker
 * commits, and tries again.
 */
Datum
dwarf_cancel(PG_FUNCTION_ARGS)
{
	int64		flow_id;
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	volatile bool cancelled = false;
	volatile int tries;
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;

	CheckNotStandby("dwarf.cancel");

	CheckNotNull(fcinfo, 0, "flow_id");
	flow_id = PG_GETARG_INT64(0);
	args[0] = Int64GetDatum(flow_id);
	if (PG_ARGISNULL(1))
		nulls[1] = 'n';
	else
		args[1] = PG_GETARG_DATUM(1);

	Connect();
	(void) VisibleFlowStatus(flow_id);

	for (tries = 1;; tries++)
	{
		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(cxt);
		PG_TRY();
		{
			cancelled = CancelFlowAndTree(flow_id, args, nulls);
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(cxt);
			edata = CopyErrorData();
			FlushErrorState();
			RollbackAndReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
			if (edata->sqlerrcode != ERRCODE_T_R_DEADLOCK_DETECTED || tries >= CANCEL_TRIES)
				ReThrowError(edata);
			FreeErrorData(edata);
			pg_usleep(10000L * tries);
			CHECK_FOR_INTERRUPTS();
			continue;
		}
		PG_END_TRY();
		break;
	}
	SPI_finish();
	PG_RETURN_BOOL(cancelled);
}

DWARF_FUNCTION(dwarf_resume);

/*
 * dwarf.resume(flow, data): an interrupted flow runs on; its interrupted
 * task runs again and its dwarf.interrupt call returns data.
 */
Datum
dwarf_resume(PG_FUNCTION_ARGS)
{
	int64		flow_id;
	Oid			types[2] = {INT8OID, JSONBOID};
	Oid			idtypes[2] = {INT8OID, INT8OID};
	Datum		args[2];
	Datum		upargs[2];
	char	   *status;
	SavedUser	saved;
	int64		target;
	bool		isnull;

	CheckNotStandby("dwarf.resume");

	CheckNotNull(fcinfo, 0, "flow_id");
	flow_id = PG_GETARG_INT64(0);
	args[0] = Int64GetDatum(flow_id);
	args[1] = PG_ARGISNULL(1) ? DirectFunctionCall1(jsonb_in, CStringGetDatum("null")) :
		PG_GETARG_DATUM(1);

	Connect();
	status = VisibleFlowStatus(flow_id);

	if (strcmp(status, "interrupted") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("flow " INT64_FORMAT " cannot be resumed: it is %s, not interrupted",
						flow_id, status)));

	/*
	 * A child flow's interrupt surfaces at its parents: resuming any of them
	 * resumes the deepest interrupted flow below.  Its parents, which were
	 * interrupted only through it, go back to running.
	 */
	saved = BecomeOwner();
	Exec("WITH RECURSIVE tree AS ("
		 "  SELECT id, 0 AS depth FROM dwarf.flow WHERE id = $1"
		 "  UNION ALL SELECT f.id, t.depth + 1 FROM dwarf.flow f JOIN tree t ON f.parent_id = t.id"
		 "   WHERE f.status IN ('running', 'interrupted'))"
		 " SELECT tree.id FROM tree JOIN dwarf.flow f USING (id)"
		 " WHERE f.status = 'interrupted' ORDER BY depth DESC LIMIT 1",
		 1, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)		/* another resume (or a cancel) came first */
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("flow " INT64_FORMAT " was resumed or cancelled meanwhile", flow_id)));
	target = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	upargs[0] = args[0];
	upargs[1] = Int64GetDatum(target);
	Exec("WITH RECURSIVE up AS ("
			 "  SELECT parent_id AS id FROM dwarf.flow WHERE id = $2::bigint"
			 "  UNION ALL SELECT f.parent_id FROM dwarf.flow f JOIN up ON f.id = up.id"
			 "   WHERE f.parent_id IS NOT NULL)"
			 " UPDATE dwarf.flow SET status = 'running', interrupt_payload = NULL, state = NULL"
		 " WHERE id IN (SELECT id FROM up) AND status = 'interrupted'",
		 2, idtypes, upargs, NULL, SPI_OK_UPDATE);
	args[0] = Int64GetDatum(target);
	Exec("UPDATE dwarf.flow SET status = 'running', interrupt_payload = NULL, state = NULL,"
		 " resume_data = $2 WHERE id = $1 AND status = 'interrupted' RETURNING id",
		 2, types, args, NULL, SPI_OK_UPDATE_RETURNING);
	RestoreUser(saved);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("flow " INT64_FORMAT " was resumed or cancelled meanwhile", target)));
	SPI_finish();
	flow_id = target;
	NoteOnCommit(flow_id, NOTE_RELOAD_FLOW, false);
	PG_RETURN_VOID();
}

/*
 * A state with input merged in as a task's changes would be (the graph's
 * reducers apply, and a key set to JSON null removes a field), for fork's
 * overrides and continue's input.  The caller is connected to SPI.
 */
static Jsonb *
MergeOverrides(Jsonb *state, Jsonb *input, int32 graph_id)
{
	Oid			types[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(graph_id)};
	Reducer    *reducers = NULL;
	int			nreducers = 0;
	bool		isnull;
	Datum		d;

	Exec("SELECT definition -> 'reducers' FROM dwarf.graph WHERE id = $1",
		 1, types, args, NULL, SPI_OK_SELECT);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		reducers = ReducersFromJsonb(DatumGetJsonbP(d), &nreducers);
	return MergeChanges(state, input, reducers, nreducers);
}

/* The step dwarf.fork starts from, with its flow's graph and its state then. */
enum
{
	Anum_forkstep_task = 1,
	Anum_forkstep_graph_id,
	Anum_forkstep_priority,
	Anum_forkstep_thread,
	Anum_forkstep_state
};
/*
 * The step is looked up in the rows of the packed step log whose step ids
 * span it (their block-range index), live or archived, then unpacked.
 */
#define FORK_STEP_SQL \
	"SELECT s.task, f.graph_id, f.priority, f.thread, dwarf.state_at(f.id, s.step_id)" \
	" FROM (SELECT l.flow_id, u.step_id, u.task FROM dwarf.step_log l," \
	"        unnest(l.step_id, l.task) u(step_id, task)" \
	"       WHERE l.first_step <= $1 AND l.last_step >= $1" \
	"       UNION ALL" \
	"       SELECT l.flow_id, u.step_id, u.task FROM dwarf.step_log_archive l," \
	"        unnest(l.step_id, l.task) u(step_id, task)" \
	"       WHERE l.first_step <= $1 AND l.last_step >= $1) s" \
	" JOIN dwarf.flow_all f ON f.id = s.flow_id WHERE s.step_id = $1"

DWARF_FUNCTION(dwarf_fork);

/*
 * dwarf.fork(step_id, overrides): a new flow of the same graph version that
 * starts at the step's task, from the state the step saw (the flow's input
 * with every earlier step's changes folded in), with overrides on top.
 */
Datum
dwarf_fork(PG_FUNCTION_ARGS)
{
	Oid			types[1] = {INT8OID};
	Datum		args[1];
	const char *keys[2] = {"start_task", "thread"};
	JsonbValue	values[2];
	int			nkeys = 1;
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	int64		id;
	int32		graph_id;
	bool		is_new;
	char	   *task;
	char	   *thread;
	Jsonb	   *state;

	CheckNotStandby("dwarf.fork");

	CheckNotNull(fcinfo, 0, "step_id");
	CheckNotNull(fcinfo, 1, "overrides");
	CheckInput(PG_GETARG_JSONB_P(1));
	args[0] = PG_GETARG_DATUM(0);
	Connect();
	Exec(FORK_STEP_SQL, 1, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("step " INT64_FORMAT " does not exist", DatumGetInt64(args[0]))));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	task = SPI_getvalue(tup, desc, Anum_forkstep_task);
	thread = SPI_getvalue(tup, desc, Anum_forkstep_thread);
	graph_id = DatumGetInt32(SPI_getbinval(tup, desc, Anum_forkstep_graph_id, &isnull));
	state = MergeOverrides(DatumGetJsonbP(SPI_getbinval(tup, desc, Anum_forkstep_state, &isnull)),
						   PG_GETARG_JSONB_P(1), graph_id);
	values[0].type = jbvString;
	values[0].val.string.val = task;
	values[0].val.string.len = strlen(task);
	if (thread)
	{
		values[1].type = jbvString;
		values[1].val.string.val = thread;
		values[1].val.string.len = strlen(thread);
		nkeys++;
	}
	CheckPriorityOf(GetUserId(),
					DatumGetInt32(SPI_getbinval(tup, desc, Anum_forkstep_priority, &isnull)),
					"dwarf.fork");
	id = InsertFlow(NewFlowId(), graph_id, GetUserId(),
					DatumGetInt32(SPI_getbinval(tup, desc, Anum_forkstep_priority, &isnull)),
					NULL, state, JsonbWithKeys(JsonbEmptyObject(), nkeys, keys, values),
					&is_new);
	NoteOnCommit(id, NOTE_NEW_FLOW, false);
	SPI_finish();
	PG_RETURN_INT64(id);
}

/* The closed flow dwarf.continue follows: its thread, final state and graph. */
enum
{
	Anum_continued_status = 1,
	Anum_continued_thread,
	Anum_continued_state,
	Anum_continued_graph_name,
	Anum_continued_priority,
	Anum_continued_graph_owner
};
#define CONTINUED_FLOW_SQL \
	"SELECT f.status, coalesce(f.thread, f.id::text), coalesce(f.state, f.input)," \
	" g.name, f.priority, g.owner::oid" \
	" FROM dwarf.flow_all f JOIN dwarf.graph g ON g.id = f.graph_id WHERE f.id = $1 LIMIT 1"

DWARF_FUNCTION(dwarf_continue);

/*
 * dwarf.continue(flow, input): the next flow of a conversation-like thread:
 * the graph's latest version, starting from the closed flow's final state
 * with input merged in.  A flow without a thread starts one named by its id.
 */
Datum
dwarf_continue(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {INT8OID, TEXTOID};
	Datum		args[2];
	const char *key = "thread";
	JsonbValue	value;
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	char	   *status;
	char	   *thread;
	Jsonb	   *state;
	int64		flow_id;
	int64		id;
	int32		graph_id;
	int32		priority;
	bool		is_new;
	Datum		d;
	SavedUser	saved;

	CheckNotStandby("dwarf.continue");

	CheckNotNull(fcinfo, 0, "flow_id");
	CheckNotNull(fcinfo, 1, "input");
	CheckInput(PG_GETARG_JSONB_P(1));
	flow_id = PG_GETARG_INT64(0);
	args[0] = Int64GetDatum(flow_id);
	Connect();
	Exec(CONTINUED_FLOW_SQL, 1, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		FlowNotFound(flow_id);
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	status = SPI_getvalue(tup, desc, Anum_continued_status);
	if (strcmp(status, "running") == 0 || strcmp(status, "interrupted") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("flow " INT64_FORMAT " cannot be continued: it is %s", flow_id, status),
				 errhint("Continue a flow once it has closed.")));
	thread = SPI_getvalue(tup, desc, Anum_continued_thread);
	d = SPI_getbinval(tup, desc, Anum_continued_state, &isnull);
	priority = DatumGetInt32(SPI_getbinval(tup, desc, Anum_continued_priority, &isnull));
	CheckPriorityOf(GetUserId(), priority, "dwarf.continue");
	graph_id = LatestGraphOf(DatumGetObjectId(SPI_getbinval(tup, desc, Anum_continued_graph_owner,
															&isnull)),
							 DatumGetTextPP(SPI_getbinval(tup, desc, Anum_continued_graph_name,
														  &isnull)),
							 false);
	state = MergeOverrides(DatumGetJsonbP(d), PG_GETARG_JSONB_P(1), graph_id);
	value.type = jbvString;
	value.val.string.val = thread;
	value.val.string.len = strlen(thread);
	id = InsertFlow(NewFlowId(), graph_id, GetUserId(), priority,
					NULL, state, JsonbWithKeys(JsonbEmptyObject(), 1, &key, &value),
					&is_new);

	/*
	 * The flow names its thread from now on, live or archived.  Live first:
	 * if dwarf.maintain moves it meanwhile, the move waits for this update
	 * and carries it, or committed before, and the archive's update sees it.
	 */
	saved = BecomeOwner();
	args[1] = CStringGetTextDatum(thread);
	Exec("UPDATE dwarf.flow SET thread = $2 WHERE id = $1 AND thread IS NULL",
		 2, types, args, NULL, SPI_OK_UPDATE);
	if (SPI_processed == 0)
		Exec("UPDATE dwarf.flow_archive SET thread = $2 WHERE id = $1 AND thread IS NULL",
			 2, types, args, NULL, SPI_OK_UPDATE);
	RestoreUser(saved);
	NoteOnCommit(id, NOTE_NEW_FLOW, false);
	SPI_finish();
	PG_RETURN_INT64(id);
}

/* Deletes a flow and its child flows, live or archived; their ids. */
#define DELETE_FLOW_TREE_SQL \
	"WITH RECURSIVE tree AS (" \
	"  SELECT $1::bigint AS id" \
	"  UNION ALL SELECT f.id FROM dwarf.flow_all f JOIN tree t ON f.parent_id = t.id)," \
	" steps AS (DELETE FROM dwarf.step_log WHERE flow_id IN (SELECT id FROM tree))," \
	" archived AS (DELETE FROM dwarf.flow_archive WHERE id IN (SELECT id FROM tree)" \
	"  RETURNING id, finished_at)," \
	" archived_steps AS (DELETE FROM dwarf.step_log_archive WHERE flow_id IN (SELECT id FROM tree))," \
	" live AS (DELETE FROM dwarf.flow WHERE id IN (SELECT id FROM tree) RETURNING id)" \
	" SELECT id FROM live UNION ALL SELECT id FROM archived"

/*
 * Refuses to delete a child flow while its parent is open (running or
 * interrupted): the parent's step that called dwarf.subgraph reads the
 * child's outcome whenever it runs again, and without the child it would
 * start a new one.  The child can be cancelled instead (the parent's step
 * then fails, or takes its on_error edge), or deleted with its parent.
 * dwarf.maintain keeps such children in the live table for the same
 * reason.  The caller is connected to SPI, as the extension owner.
 */
static void
CheckNoOpenParent(int64 flow_id)
{
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(flow_id)};
	char	   *parent;
	char	   *status;

	Exec("SELECT p.id, p.status FROM dwarf.flow_all c JOIN dwarf.flow p ON p.id = c.parent_id"
		 " WHERE c.id = $1 AND p.status IN ('running', 'interrupted')",
		 1, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		return;
	parent = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	ereport(ERROR,
			(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
			 errmsg("cannot delete flow " INT64_FORMAT ": it is a child of flow %s, which is still %s",
					flow_id, parent, status),
			 errdetail("Flow %s started it with dwarf.subgraph, and its step reads the child's outcome when it runs again.",
					   parent),
			 errhint("Cancel flow " INT64_FORMAT " instead (the step of flow %s that waits for it then fails), or delete flow %s, which deletes its child flows too.",
					 flow_id, parent, parent)));
}

/*
 * Deletes again the steps of the flows whose ids the int8[] names, live or
 * archived, in a statement of its own, after the statement that deleted
 * those flows and their steps.  A dwarf.maintain pass may have moved some
 * of the steps between dwarf.step_default and the archive while that
 * statement ran: it waited for the pass's delete of them, skipped them,
 * and its snapshot did not see them arrive where they went.  A new
 * statement's does.  The caller is connected to SPI, as the extension
 * owner.
 */
static void
DeleteMovedSteps(Datum ids)
{
	Oid			types[1] = {INT8ARRAYOID};

	Exec("WITH live AS (DELETE FROM dwarf.step_log WHERE flow_id = ANY ($1))"
		 " DELETE FROM dwarf.step_log_archive WHERE flow_id = ANY ($1)",
		 1, types, &ids, NULL, SPI_OK_DELETE);
}

DWARF_FUNCTION(dwarf_delete);

/*
 * dwarf.delete(flow): the flow, its steps and its child flows, gone.  A
 * child flow whose parent is still open cannot be deleted on its own.
 */
Datum
dwarf_delete(PG_FUNCTION_ARGS)
{
	int64		flow_id = PG_GETARG_INT64(0);
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(flow_id)};
	SavedUser	saved;
	uint64		i;
	uint64		n;
	Datum	   *ids;

	CheckNotStandby("dwarf.delete");

	Connect();
	(void) VisibleFlowStatus(flow_id);
	saved = BecomeOwner();
	CheckNoOpenParent(flow_id);

	/*
	 * Lock the live rows of the flow and its children first: dwarf.maintain
	 * skips a locked flow, so none of them moves to the archive under us.
	 * One that moved before this statement is in the archive for the next
	 * statement's snapshot.
	 */
	Exec("WITH RECURSIVE tree AS ("
		 "  SELECT $1::bigint AS id"
		 "  UNION ALL SELECT f.id FROM dwarf.flow_all f JOIN tree t ON f.parent_id = t.id)"
		 " SELECT id FROM dwarf.flow WHERE id IN (SELECT id FROM tree) FOR UPDATE",
		 1, types, args, NULL, SPI_OK_SELECT);
	Exec(DELETE_FLOW_TREE_SQL, 1, types, args, NULL, SPI_OK_SELECT);
	n = SPI_processed;
	ids = palloc(sizeof(Datum) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		bool		isnull;

		ids[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
		NoteOnCommit(DatumGetInt64(ids[i]), NOTE_RELOAD_FLOW, true);
	}

	if (n > 0)
		DeleteMovedSteps(PointerGetDatum(construct_array(ids, (int) n, INT8OID, 8, true,
														 TYPALIGN_DOUBLE)));
	RestoreUser(saved);
	SPI_finish();
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_purge);

/*
 * dwarf.purge(older_than, all_roles): deletes the caller's own closed flows
 * (and their steps) finished before now() minus older_than; with
 * all_roles, those of every role the caller has the privileges of (for a
 * superuser, every role's).  Own flows by default, so that a superuser's
 * or an admin role's clean-up of its own flows leaves other teams' alone.
 * A closed child whose parent is still open stays, as for dwarf.delete
 * (its parent's step reads it again).  Returns how many flows went.
 */
Datum
dwarf_purge(PG_FUNCTION_ARGS)
{
	Oid			types[3] = {INTERVALOID, OIDOID, BOOLOID};
	Datum		args[3] = {PG_GETARG_DATUM(0), ObjectIdGetDatum(GetUserId()), PG_GETARG_DATUM(1)};
	bool		isnull;
	int64		purged;
	SavedUser	saved;

	CheckNotStandby("dwarf.purge");

	(void) IntervalMicros(PG_GETARG_INTERVAL_P(0), "older_than");
	Connect();
	saved = BecomeOwner();
	Exec("WITH gone AS ("
		 "  DELETE FROM dwarf.flow f"
		 "   WHERE f.status IN ('completed', 'failed', 'cancelled')"
		 "     AND f.finished_at < now() - $1"
		 "     AND (f.owner::oid = $2 OR $3 AND pg_has_role($2, f.owner, 'USAGE'))"
		 "     AND NOT EXISTS (SELECT 1 FROM dwarf.flow p WHERE p.id = f.parent_id"
		 "                      AND p.status IN ('running', 'interrupted'))"
		 "  RETURNING f.id),"
		 " steps AS (DELETE FROM dwarf.step_log s USING gone WHERE s.flow_id = gone.id),"
		 " archived AS ("
		 "  DELETE FROM dwarf.flow_archive"
		 "   WHERE finished_at < now() - $1"
		 "     AND (owner::oid = $2 OR $3 AND pg_has_role($2, owner, 'USAGE'))"
		 "  RETURNING id, finished_at),"
		 " archived_steps AS (DELETE FROM dwarf.step_log_archive s"
		 "  WHERE s.flow_id IN (SELECT id FROM gone UNION ALL SELECT id FROM archived))"
		 " SELECT count(*), array_agg(id) FROM (SELECT id FROM gone UNION ALL SELECT id FROM archived) x",
		 3, types, args, NULL, SPI_OK_SELECT);
	purged = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (purged > 0)
		DeleteMovedSteps(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	RestoreUser(saved);
	SPI_finish();
	PG_RETURN_INT64(purged);
}

DWARF_FUNCTION(dwarf_worker_stats);

/* dwarf.worker_stats(): one row per worker of this database. */
Datum
dwarf_worker_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	if (Dwarf == NULL)
		return (Datum) 0;
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];
		Datum		values[10];
		bool		nulls[10] = {0};

		if (slot->dboid != MyDatabaseId || slot->pid == 0 || slot->index < 0)
			continue;			/* index < 0: the HTTP process (http.c) */
		values[0] = ObjectIdGetDatum(slot->dboid);
		values[1] = Int32GetDatum(slot->index);
		values[2] = Int32GetDatum(slot->pid);
		values[3] = Int64GetDatum(pg_atomic_read_u64(&slot->flows_loaded));
		values[4] = Int64GetDatum(pg_atomic_read_u64(&slot->ready));
		values[5] = Int64GetDatum(pg_atomic_read_u64(&slot->steps));
		values[6] = Int64GetDatum(pg_atomic_read_u64(&slot->steps_failed));
		values[7] = Int64GetDatum(pg_atomic_read_u64(&slot->flows_closed));
		values[8] = Int64GetDatum(pg_atomic_read_u64(&slot->batches));
		values[9] = Int64GetDatum(pg_atomic_read_u64(&slot->aborted_batches));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* What dwarf.replay_state replays from: the graph, and where the flow began. */
enum
{
	Anum_replayflow_definition = 1,
	Anum_replayflow_input,
	Anum_replayflow_start_task
};
#define REPLAY_FLOW_SQL \
	"SELECT g.definition, f.input, f.start_task FROM dwarf.flow_all f" \
	" JOIN dwarf.graph g ON g.id = f.graph_id WHERE f.id = $1 LIMIT 1"

DWARF_FUNCTION(dwarf_replay_state);

/*
 * dwarf.replay_state(flow, before_step): the flow's state as its worker
 * computes it, by replaying its steps (those before before_step) over its
 * input with the worker's own code: a closed flow's final state, or the
 * state its one live branch works on (after a fan-in: the branches folded
 * in branch order).  NULL while several branches run (or for a NULL id);
 * a flow the caller may not see is FlowNotFound's error, as everywhere.
 */
Datum
dwarf_replay_state(PG_FUNCTION_ARGS)
{
	int64		flow_id;
	Oid			types[2] = {INT8OID, INT8OID};
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	MemoryContext outer = CurrentMemoryContext;
	FlowRun		flow = {0};
	Graph	   *graph;
	Jsonb	   *state;
	bool		isnull;
	uint64		i;
	SavedUser	saved;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	flow_id = PG_GETARG_INT64(0);
	args[0] = Int64GetDatum(flow_id);
	if (PG_ARGISNULL(1))
	{
		args[1] = (Datum) 0;
		nulls[1] = 'n';
	}
	else
		args[1] = PG_GETARG_DATUM(1);

	Connect();
	Exec(REPLAY_FLOW_SQL, 1, types, args, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		FlowNotFound(flow_id);
	/*
	 * The stored definition names its functions qualified; looking them up
	 * needs no rights of the caller's (replay calls none of them).  The
	 * steps are read as the owner too, by dwarf_internal's flow_steps, which
	 * the caller cannot name: it may see them, as it may see the flow.
	 */
	saved = BecomeOwner();
	graph = GraphParse(DatumGetJsonbP(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
													Anum_replayflow_definition, &isnull)),
					   CurrentMemoryContext, false);
	flow.id = flow_id;
	FlowRunCreate(&flow, graph,
				  GraphStartNode(graph, SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
													 Anum_replayflow_start_task)),
				  DatumGetJsonbP(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
											   Anum_replayflow_input, &isnull)),
				  CurrentMemoryContext);

	Exec(STEP_ROWS_ALL_SQL " AND ($2::bigint IS NULL OR step_id < $2) ORDER BY step_id",
		 2, types, args, nulls, SPI_OK_SELECT);
	RestoreUser(saved);
	for (i = 0; i < SPI_processed && flow.status == FLOW_RUNNING; i++)
		if (!ReplayStepRow(&flow, SPI_tuptable->vals[i], SPI_tuptable->tupdesc))
			break;

	state = FlowStateSoFar(&flow);
	if (state)
	{
		Jsonb	   *copy = MemoryContextAlloc(outer, VARSIZE(state));

		memcpy(copy, state, VARSIZE(state));
		state = copy;
	}
	FlowRunFree(&flow);
	SPI_finish();
	if (state == NULL)
		PG_RETURN_NULL();
	PG_RETURN_JSONB_P(state);
}
