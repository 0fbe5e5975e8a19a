/*
 * api.c
 *		The SQL functions that define graphs and start flows and wait for
 *		them: validate, define, create, await, and run (whose create the
 *		owning worker commits, see CreateThroughWorker).
 *
 * Flows remember the role that created them, and the workers run their
 * tasks as that role; the writes themselves go through flows.c.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
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
#include "graph.h"
#include "flowrun.h"
#include "json.h"
#include "flows.h"
#include "request.h"
#include "names.h"
#include "limits.h"

/* ---------- define ---------- */

DWARF_FUNCTION(dwarf_validate);

/* dwarf.validate(definition): the checked, normalized definition. */
Datum
dwarf_validate(PG_FUNCTION_ARGS)
{
	Jsonb	   *definition = PG_GETARG_JSONB_P(0);
	Graph	   *graph = GraphParse(definition, CurrentMemoryContext, true);

	PG_RETURN_JSONB_P(GraphNormalized(graph, definition));
}

/*
 * A graph may name its definer's own limits, and those of roles whose
 * privileges the definer has (role.name); any other is an error that names
 * it (limits.c).
 */
static void
CheckLimitsUsable(Graph *graph)
{
	int			i;

	for (i = 0; i < graph->nnodes; i++)
	{
		int			j;

		for (j = 0; j < graph->nodes[i].nlimits; j++)
		{
			const char *bare;

			(void) LimitCheckUse(GetUserId(), graph->nodes[i].limits[j].name, &bare);
		}
	}
}

DWARF_FUNCTION(dwarf_define);

/*
 * dwarf.define(name, definition): checks the definition and stores it as
 * the next version of the caller's own graph of that name (names.c: a
 * name is its owner's, so another role's graph of the same name is
 * another graph, and a role's versions decide only what its own name runs).
 */
Datum
dwarf_define(PG_FUNCTION_ARGS)
{
	text	   *name;
	Jsonb	   *normalized;
	Oid			types[3] = {TEXTOID, JSONBOID, OIDOID};
	Datum		args[3];
	bool		isnull;
	int32		version;
	SavedUser	saved;
	Graph	   *graph;

	CheckNotStandby("dwarf.define");

	name = GraphNameChecked(PG_GETARG_TEXT_PP(0));

	graph = GraphParse(PG_GETARG_JSONB_P(1), CurrentMemoryContext, true);
	CheckLimitsUsable(graph);
	normalized = GraphNormalized(graph, PG_GETARG_JSONB_P(1));

	/*
	 * The lock on the owner's name keeps two defines from taking one version
	 * number.  It is dwarf's own (dwarf.h), which no session can hold to
	 * keep a role from defining.
	 */
	DwarfLockXact(DWARF_LOCK_GRAPH_NAME,
				  DatumGetUInt32(hash_any((unsigned char *) VARDATA_ANY(name),
										  VARSIZE_ANY_EXHDR(name))),
				  GetUserId());
	Connect();
	saved = BecomeOwner();
	args[0] = PointerGetDatum(name);
	args[1] = JsonbPGetDatum(normalized);
	args[2] = ObjectIdGetDatum(saved.user);
	Exec("INSERT INTO dwarf.graph (name, version, definition, owner)"
		 " SELECT $1, coalesce(max(version), 0) + 1, $2, $3::regrole"
		 " FROM dwarf.graph WHERE name = $1 AND owner = $3::regrole RETURNING version",
		 3, types, args, NULL, SPI_OK_INSERT_RETURNING);
	version = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	RestoreUser(saved);
	SPI_finish();
	PG_RETURN_INT32(version);
}

/* ---------- create ---------- */

/*
 * The optional create settings as one JSON object (what InsertFlow and a
 * run request carry), from the arguments of dwarf.create/dwarf.run that
 * follow idempotency_key, starting at argument first.
 */
/* A key argument (idempotency key, thread, fairness key), checked for length. */
static text *
KeyArg(FunctionCallInfo fcinfo, int arg, const char *what)
{
	text	   *key;

	if (PG_ARGISNULL(arg))
		return NULL;
	key = PG_GETARG_TEXT_PP(arg);
	if (VARSIZE_ANY_EXHDR(key) > DWARF_MAX_KEY)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is %d bytes, more than the %d allowed", what,
						(int) VARSIZE_ANY_EXHDR(key), DWARF_MAX_KEY),
				 errhint("Use a hash of it (md5(...), say) if it must be longer.")));
	return key;
}

static Jsonb *
OptionsFromArgs(FunctionCallInfo fcinfo, int first)
{
	const char *keys[6];
	JsonbValue	values[6];
	int			n = 0;

	if (!PG_ARGISNULL(first))
	{
		keys[n] = "fairness_key";
		values[n].type = jbvString;
		values[n].val.string.val = text_to_cstring(KeyArg(fcinfo, first, "fairness_key"));
		values[n].val.string.len = strlen(values[n].val.string.val);
		n++;
	}
	if (!PG_ARGISNULL(first + 1))
	{
		int32		weight = PG_GETARG_INT32(first + 1);

		if (weight < 1 || weight > 10000)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("fairness_weight must be between 1 and 10000")));
		keys[n] = "fairness_weight";
		values[n].type = jbvNumeric;
		values[n].val.numeric = int64_to_numeric(weight);
		n++;
	}
	if (!PG_ARGISNULL(first + 2))
	{
		Interval   *budget = PG_GETARG_INTERVAL_P(first + 2);
		int64		us = IntervalMicros(budget, NULL);
		char	   *text;

		if (us <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("time_budget must be positive")));
		if (us > DWARF_MAX_TIME_BUDGET)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("time_budget is longer than 7 days, the most a step's time_budget may be"),
					 errhint("A month counts as 30 days.")));
		text = DatumGetCString(DirectFunctionCall1(interval_out, IntervalPGetDatum(budget)));
		keys[n] = "time_budget";
		values[n].type = jbvString;
		values[n].val.string.val = text;
		values[n].val.string.len = strlen(text);
		n++;
	}
	if (!PG_ARGISNULL(first + 3) && PG_GETARG_BOOL(first + 3))
	{
		keys[n] = "delete_on_completion";
		values[n].type = jbvBool;
		values[n].val.boolean = true;
		n++;
	}
	if (!PG_ARGISNULL(first + 4))
	{
		Jsonb	   *baggage = PG_GETARG_JSONB_P(first + 4);

		keys[n] = "baggage";
		values[n].type = jbvBinary;
		values[n].val.binary.data = &baggage->root;
		values[n].val.binary.len = VARSIZE(baggage) - VARHDRSZ;
		n++;
	}
	if (!PG_ARGISNULL(first + 5))
	{
		keys[n] = "thread";
		values[n].type = jbvString;
		values[n].val.string.val = text_to_cstring(KeyArg(fcinfo, first + 5, "thread"));
		values[n].val.string.len = strlen(values[n].val.string.val);
		n++;
	}
	return JsonbWithKeys(JsonbEmptyObject(), n, keys, values);
}

/*
 * Refuses a priority below 0 to a role without the privileges of role
 * dwarf_priority (the install script makes it; superusers have them): such
 * a flow's steps run before every other role's, so going below the default
 * is granted, not taken.  Without that role, only superusers may.
 */
static void
CheckPriority(int32 priority)
{
	if (MayUsePriority(GetUserId(), priority))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to create a flow with priority %d", priority),
			 errdetail("A priority below 0 runs a flow's steps before those of every other role."),
			 errhint("Use a priority of 0 or more, or ask a superuser to GRANT %s TO %s.",
					 DWARF_PRIORITY_ROLE, GetUserNameFromId(GetUserId(), false))));
}

/* Inserts a flow in the caller's transaction; its worker hears at commit. */
static int64
CreateFlow(text *graph, Jsonb *input, int32 priority, text *key, Jsonb *options)
{
	int64		id;
	int32		graph_id;
	bool		is_new;

	CheckInput(input);
	Connect();
	graph_id = ResolveGraph(graph, GetUserId(), false);
	id = InsertFlow(NewFlowId(), graph_id, GetUserId(), priority, key, input, options, &is_new);
	if (is_new)
		NoteOnCommit(id, NOTE_NEW_FLOW, false);
	SPI_finish();
	return id;
}

DWARF_FUNCTION(dwarf_create);

/*
 * dwarf.create(graph, input, priority, idempotency_key): a new flow of the
 * graph's latest version, started when the caller commits.
 */
Datum
dwarf_create(PG_FUNCTION_ARGS)
{
	CheckNotStandby("dwarf.create");
	CheckNotNull(fcinfo, 0, "graph");
	CheckNotNull(fcinfo, 1, "input");
	CheckNotNull(fcinfo, 2, "priority");
	CheckPriority(PG_GETARG_INT32(2));
	PG_RETURN_INT64(CreateFlow(PG_GETARG_TEXT_PP(0), PG_GETARG_JSONB_P(1),
							   PG_GETARG_INT32(2),
							   KeyArg(fcinfo, 3, "idempotency_key"),
							   OptionsFromArgs(fcinfo, 4)));
}

/* ---------- await ---------- */

static const char *const closed_statuses[] = {"interrupted", "completed", "failed", "cancelled"};

/*
 * The columns of dwarf.outcome: flow_id, status, state, error,
 * interrupt_payload, cancel_reason, then the failed step's task, SQLSTATE,
 * detail and hint (from its error document, under these keys).
 */
#define OUTCOME_COLUMNS		10
#define OUTCOME_ROW_COLUMNS 6	/* those read from the flow's row */
static const char *const outcome_error_keys[] = {"task", "sqlstate", "detail", "hint"};

/* What dwarf.await or dwarf.run knows of the flow it waits for. */
typedef struct Awaited
{
	int64		flow_id;
	const char *waiter;			/* "dwarf.await" or "dwarf.run", for errors */
	bool		existed;		/* it was there: if it is gone, it was deleted */
	bool		deletes_itself; /* created with delete_on_completion */
} Awaited;

/* A closed flow's outcome as ReadOutcome reads it, from what is known of it. */
static void
ClosedOutcome(int64 flow_id, RunOutcome *outcome, Datum *values, bool *nulls)
{
	memset(nulls, true, sizeof(bool) * OUTCOME_COLUMNS);
	values[0] = Int64GetDatum(flow_id);
	nulls[0] = false;
	values[1] = CStringGetTextDatum(outcome->completed ? "completed" : "failed");
	nulls[1] = false;
	if (outcome->state)
	{
		values[2] = JsonbPGetDatum(outcome->state);
		nulls[2] = false;
	}
	if (outcome->error)
	{
		values[3] = CStringGetTextDatum(outcome->error);
		nulls[3] = false;
	}
}

/*
 * Fills the outcome's error_task, error_sqlstate, error_detail and
 * error_hint from a failed step's error document (none: NULLs).  The
 * values are made in the caller's context, outside SPI's (the caller is
 * connected to SPI).
 */
static void
ErrorColumns(Datum doc, bool isnull, Datum *values, bool *nulls)
{
	int			i;

	for (i = 0; i < lengthof(outcome_error_keys); i++)
	{
		int			col = OUTCOME_ROW_COLUMNS + i;
		JsonbValue *v = isnull ? NULL : JsonbField(DatumGetJsonbP(doc), outcome_error_keys[i]);

		nulls[col] = v == NULL || v->type != jbvString;
		if (!nulls[col])
			values[col] = SPI_datumTransfer(PointerGetDatum(cstring_to_text_with_len(v->val.string.val,
																					 v->val.string.len)),
											false, -1);
	}
}

/*
 * The error document of the step that failed a flow, read with a fresh
 * snapshot (as ReadOutcome reads the flow) by dwarf_internal's
 * failed_step_error, which only the extension's owner may name: the caller
 * has just read the flow's row, so it may see the flow's steps too.  Into
 * *isnull, whether there is none.
 */
static Datum
FailedStepError(int64 flow_id, Datum error, bool *isnull)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {INT8OID, TEXTOID};
	Datum		args[2] = {Int64GetDatum(flow_id), error};
	SavedUser	saved = BecomeOwner();

	if (plan == NULL)
		plan = PrepareKept("SELECT dwarf_internal.failed_step_error($1, $2)", 2, types);
	PushActiveSnapshot(GetLatestSnapshot());
	if (SPI_execute_plan(plan, args, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "dwarf: could not read the failed step of flow " INT64_FORMAT, flow_id);
	PopActiveSnapshot();
	RestoreUser(saved);
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
}

/*
 * Reads a flow's outcome with a fresh snapshot.  Returns false when the flow
 * is still running.  Errors if the caller cannot see it.  A flow that
 * existed before and is gone was deleted: on completion, when it was
 * created so (its outcome is "completed", with nothing more to tell), else
 * by someone, and the error says so.
 */
static bool
ReadOutcome(Awaited *aw, Datum *values, bool *nulls, bool first)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr archived_plan = NULL;
	int64		flow_id = aw->flow_id;
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(flow_id)};
	HeapTuple	tup;
	TupleDesc	desc;
	char	   *status;
	int			i;
	bool		closed = false;
	bool		isnull;
	Datum		doc;

	/*
	 * Read with a snapshot taken now, not the transaction's: in REPEATABLE
	 * READ or SERIALIZABLE that would never see the flow end (nor, for
	 * dwarf.run, the flow at all).  Only this read sees further; the
	 * caller's own queries keep their snapshot.
	 */
	if (plan == NULL)
		plan = PrepareKept("SELECT id, status, state, error, interrupt_payload, cancel_reason, xmin,"
						   " delete_on_completion FROM dwarf.flow WHERE id = $1", 1, types);
	PushActiveSnapshot(GetLatestSnapshot());
	if (SPI_execute_plan(plan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read flow " INT64_FORMAT, flow_id);
	PopActiveSnapshot();

	/*
	 * Not live: it may be archived.  A later snapshot than the first read's
	 * sees a move that read missed, since a move is one transaction.
	 */
	if (SPI_processed == 0)
	{
		if (archived_plan == NULL)
			archived_plan = PrepareKept("SELECT id, status, state, error, interrupt_payload,"
										" cancel_reason, xmin, delete_on_completion"
										" FROM dwarf.flow_archive WHERE id = $1",
										1, types);
		PushActiveSnapshot(GetLatestSnapshot());
		if (SPI_execute_plan(archived_plan, args, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not read flow " INT64_FORMAT, flow_id);
		PopActiveSnapshot();
	}
	if (SPI_processed == 0 && aw->existed && aw->deletes_itself)
	{
		/* Deleted on completion: its outcome is gone with it. */
		RunOutcome	deleted = {.closed = true, .completed = true};

		ClosedOutcome(flow_id, &deleted, values, nulls);
		return true;
	}
	if (SPI_processed == 0 && aw->existed)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("flow " INT64_FORMAT " was deleted while %s waited for it",
						flow_id, aw->waiter),
				 errdetail("It was removed (by dwarf.delete, or by dwarf.purge or retention once it had closed) before its outcome could be read; its outcome is gone with it.")));
	if (SPI_processed == 0)
		FlowNotFound(flow_id);
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	status = SPI_getvalue(tup, desc, 2);
	aw->existed = true;
	aw->deletes_itself = DatumGetBool(SPI_getbinval(tup, desc, 8, &isnull)) && !isnull;
	if (first && strcmp(status, "running") == 0)
	{
		TransactionId xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 7, &isnull));

		if (TransactionIdIsCurrentTransactionId(xmin))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("flow " INT64_FORMAT " was created in this transaction and cannot start before it commits",
							flow_id),
					 errhint("Commit first, or use dwarf.run(), which commits its create on its own.")));
	}
	for (i = 0; i < lengthof(closed_statuses); i++)
		closed |= strcmp(status, closed_statuses[i]) == 0;
	for (i = 0; i < OUTCOME_ROW_COLUMNS; i++)
	{
		values[i] = SPI_getbinval(tup, desc, i + 1, &nulls[i]);
		if (!nulls[i])
			values[i] = SPI_datumTransfer(values[i], TupleDescAttr(desc, i)->attbyval,
										  TupleDescAttr(desc, i)->attlen);
	}
	isnull = true;
	doc = (Datum) 0;
	if (strcmp(status, "failed") == 0 && !nulls[3])
		doc = FailedStepError(flow_id, values[3], &isnull);
	ErrorColumns(doc, isnull, values, nulls);
	return closed;
}

/*
 * Waits in the server until the flows close or park (every one of them;
 * with any, one of them), or timeout_ms passes, and fills values[i] and
 * nulls[i] with flow i's outcome (past the timeout, as it is now).  Returns
 * the first flow, in their order, that has closed or parked; -1 if none
 * has.  Sleeps on its latch; the worker that commits a flow's end sets it
 * when that flow is the one this backend watches (its waiter slot holds
 * one id: the first still open), and so does a delete of it.  The others
 * are read again when it wakes, and at least every second (with any and
 * several flows, every 100 ms: one of the others may be the first to end).
 */
static int
AwaitFlows(Awaited *aws, int n, bool any, int64 timeout_ms, Datum **values, bool **nulls)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	pg_atomic_uint64 *waiting = Dwarf ? &Dwarf->waiting[GetNumberFromPGProc(MyProc)] : NULL;
	bool	   *done = palloc0(sizeof(bool) * n);
	volatile int watched = 0;
	volatile bool first = true;
	volatile int closed = -1;

	Connect();
	if (waiting)
		pg_atomic_write_u64(waiting, (uint64) aws[0].flow_id);
	PG_TRY();
	{
		for (;;)
		{
			long		remaining;
			int			open = -1;
			int			i;

			for (i = 0; i < n; i++)
				if (!done[i])
					done[i] = ReadOutcome(&aws[i], values[i], nulls[i], first);
			first = false;
			for (i = n - 1; i >= 0; i--)
			{
				if (done[i])
					closed = i;
				else
					open = i;
			}
			if (open < 0 || (any && closed >= 0))
				break;
			if (open != watched)
			{
				/* Watch the next open flow, and read it once more before sleeping. */
				watched = open;
				if (waiting)
					pg_atomic_write_u64(waiting, (uint64) aws[open].flow_id);
				continue;
			}
			remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
			if (remaining <= 0)
				break;
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 Min(remaining, any && n > 1 ? 100 : 1000), PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}
	PG_FINALLY();
	{
		if (waiting)
			pg_atomic_write_u64(waiting, 0);
	}
	PG_END_TRY();
	SPI_finish();
	pfree(done);
	return closed;
}

/* AwaitFlows for one flow. */
static void
AwaitFlow(Awaited *aw, int64 timeout_ms, Datum *values, bool *nulls)
{
	(void) AwaitFlows(aw, 1, false, timeout_ms, &values, &nulls);
}

static Datum
OutcomeDatum(FunctionCallInfo fcinfo, Datum *values, bool *nulls)
{
	TupleDesc	desc;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dwarf: outcome type is not composite");
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls));
}

DWARF_FUNCTION(dwarf_await);

/* dwarf.await(flow, timeout): the flow's outcome once it ends or parks. */
Datum
dwarf_await(PG_FUNCTION_ARGS)
{
	Datum		values[OUTCOME_COLUMNS];
	bool		nulls[OUTCOME_COLUMNS];
	int64		timeout_ms;
	Awaited		aw = {.waiter = "dwarf.await"};

	CheckNotNull(fcinfo, 0, "flow_id");
	CheckNotNull(fcinfo, 1, "timeout");
	timeout_ms = IntervalMicros(PG_GETARG_INTERVAL_P(1), "timeout") / 1000;
	if (DwarfCurrentStep != NULL && timeout_ms > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dwarf.await cannot wait inside a dwarf task"),
				 errdetail("The task would hold its worker while it waits."),
				 errhint("Use a timeout of 0 to read the flow's status, or dwarf.subgraph() to run a flow and wait for it.")));
	aw.flow_id = PG_GETARG_INT64(0);
	AwaitFlow(&aw, timeout_ms, values, nulls);
	PG_RETURN_DATUM(OutcomeDatum(fcinfo, values, nulls));
}

/* The most flows dwarf.await_all and dwarf.await_any wait for at once. */
#define AWAIT_MAX_FLOWS 10000

/*
 * The flow ids of dwarf.await_all's or dwarf.await_any's array, checked:
 * no NULL, at most AWAIT_MAX_FLOWS, and no waiting inside a task.
 */
static Awaited *
AwaitedFromArray(FunctionCallInfo fcinfo, const char *waiter, int *n, int64 *timeout_ms)
{
	ArrayType  *array;
	Datum	   *elems;
	bool	   *elem_nulls;
	Awaited    *aws;
	int			i;

	CheckNotNull(fcinfo, 0, "flow_ids");
	CheckNotNull(fcinfo, 1, "timeout");
	*timeout_ms = IntervalMicros(PG_GETARG_INTERVAL_P(1), "timeout") / 1000;
	if (DwarfCurrentStep != NULL && *timeout_ms > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s cannot wait inside a dwarf task", waiter),
				 errdetail("The task would hold its worker while it waits."),
				 errhint("Use a timeout of 0 to read the flows' status, or dwarf.subgraph() to run a flow and wait for it.")));
	array = PG_GETARG_ARRAYTYPE_P(0);
	deconstruct_array(array, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &elems, &elem_nulls, n);
	if (*n > AWAIT_MAX_FLOWS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s waits for at most %d flows, not %d", waiter, AWAIT_MAX_FLOWS, *n),
				 errhint("Wait for them in batches.")));
	aws = palloc0(sizeof(Awaited) * Max(*n, 1));
	for (i = 0; i < *n; i++)
	{
		if (elem_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("flow_ids of %s must not hold a NULL", waiter)));
		aws[i].flow_id = DatumGetInt64(elems[i]);
		aws[i].waiter = waiter;
	}
	return aws;
}

/* Room for n outcomes, as AwaitFlows fills them. */
static void
OutcomeArrays(int n, Datum ***values, bool ***nulls)
{
	int			i;

	*values = palloc(sizeof(Datum *) * Max(n, 1));
	*nulls = palloc(sizeof(bool *) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		(*values)[i] = palloc0(sizeof(Datum) * OUTCOME_COLUMNS);
		(*nulls)[i] = palloc(sizeof(bool) * OUTCOME_COLUMNS);
		memset((*nulls)[i], true, sizeof(bool) * OUTCOME_COLUMNS);
	}
}

DWARF_FUNCTION(dwarf_await_all);

/*
 * dwarf.await_all(flows, timeout): waits, in one backend, until every flow
 * has closed or parked, or the timeout passes; one outcome per element of
 * the array, in its order.  An unknown id is await's error, before any wait.
 */
Datum
dwarf_await_all(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Awaited    *aws;
	Datum	  **values;
	bool	  **nulls;
	int64		timeout_ms;
	int			n;
	int			i;

	aws = AwaitedFromArray(fcinfo, "dwarf.await_all", &n, &timeout_ms);
	InitMaterializedSRF(fcinfo, 0);
	if (n == 0)
		return (Datum) 0;
	OutcomeArrays(n, &values, &nulls);
	(void) AwaitFlows(aws, n, false, timeout_ms, values, nulls);
	for (i = 0; i < n; i++)
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values[i], nulls[i]);
	return (Datum) 0;
}

DWARF_FUNCTION(dwarf_await_any);

/*
 * dwarf.await_any(flows, timeout): waits until one of the flows has closed
 * or parked and returns its outcome (of several, the first in the array's
 * order); past the timeout, the first flow's outcome as it is.
 */
Datum
dwarf_await_any(PG_FUNCTION_ARGS)
{
	Awaited    *aws;
	Datum	  **values;
	bool	  **nulls;
	int64		timeout_ms;
	int			n;
	int			closed;

	aws = AwaitedFromArray(fcinfo, "dwarf.await_any", &n, &timeout_ms);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("flow_ids of dwarf.await_any is empty")));
	OutcomeArrays(n, &values, &nulls);
	closed = AwaitFlows(aws, n, true, timeout_ms, values, nulls);
	if (closed < 0)
		closed = 0;
	PG_RETURN_DATUM(OutcomeDatum(fcinfo, values[closed], nulls[closed]));
}

/* ---------- run ---------- */

/*
 * The time dwarf.run's create may take even when its timeout is shorter: a
 * run with a timeout of a few milliseconds still gets its flow's id back.
 */
#define RUN_CREATE_MIN_MS	1000

/*
 * Hands the create to the worker that will own the flow (request.c), which
 * commits it, batched with other callers' creates, and answers with the
 * flow id by the deadline, or raises an error.
 */
static int64
CreateThroughWorker(text *graph, Jsonb *input, int32 priority, text *key, Jsonb *options,
					TimestampTz deadline, RunOutcome *outcome)
{
	int32		graph_id;

	CheckInput(input);
	graph_id = ResolveGraph(graph, GetUserId(), true);
	return RequestCreate(NewFlowId(), graph_id, priority, key, input, options, deadline,
						 outcome);
}

DWARF_FUNCTION(dwarf_run);

/*
 * dwarf.run(graph, input, timeout, priority, idempotency_key): create and
 * await.  The create commits on its own, so this works in autocommit and
 * the flow runs even if the caller's transaction later rolls back.  Past
 * the timeout it returns the flow's status as it is, or, when the engine
 * had not yet said that the flow exists, raises an error (one that a
 * PL/pgSQL handler can catch) that says whether it may still be created.
 */
Datum
dwarf_run(PG_FUNCTION_ARGS)
{
	Datum		values[OUTCOME_COLUMNS];
	bool		nulls[OUTCOME_COLUMNS];
	int64		timeout_ms;
	TimestampTz deadline;
	RunOutcome	outcome;
	Awaited		aw = {.waiter = "dwarf.run", .existed = true};
	int			pinned;

	CheckNotStandby("dwarf.run");
	CheckNotNull(fcinfo, 0, "graph");
	CheckNotNull(fcinfo, 1, "input");
	CheckNotNull(fcinfo, 2, "timeout");
	CheckNotNull(fcinfo, 3, "priority");
	CheckPriority(PG_GETARG_INT32(3));
	if (DwarfCurrentStep != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dwarf.run cannot be called inside a dwarf task"),
				 errdetail("The task would hold its worker while it waits, and the worker may be the one to run the new flow."),
				 errhint("Use dwarf.subgraph() to run a flow and wait for it without holding a worker, or dwarf.create() to start one.")));
	timeout_ms = IntervalMicros(PG_GETARG_INTERVAL_P(2), "timeout") / 1000;
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	/*
	 * dwarf.run is declared without SET search_path (the hot path: a SET
	 * clause costs a GUC level, and a walk over every setting when the call
	 * ends); its statements run under "pg_catalog, pg_temp" all the same,
	 * pinned here, so the kept statements, planned under either, are not
	 * planned again.  An error unpins it with the transaction.
	 */
	pinned = CompatPinSearchPath();
	aw.flow_id = CreateThroughWorker(PG_GETARG_TEXT_PP(0), PG_GETARG_JSONB_P(1),
									 PG_GETARG_INT32(3),
									 KeyArg(fcinfo, 4, "idempotency_key"),
									 OptionsFromArgs(fcinfo, 5),
									 Max(deadline,
										 TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
																	 RUN_CREATE_MIN_MS)),
									 &outcome);
	aw.deletes_itself = !PG_ARGISNULL(8) && PG_GETARG_BOOL(8);

	/*
	 * Usually it closed in the commit that created it, and we know how; a
	 * failed flow's outcome is read from the tables, for the step that
	 * failed it (the answer carries the message only).
	 */
	if (outcome.closed && outcome.completed)
		ClosedOutcome(aw.flow_id, &outcome, values, nulls);
	else
		AwaitFlow(&aw, TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline),
				  values, nulls);
	CompatUnpinSearchPath(pinned);
	PG_RETURN_DATUM(OutcomeDatum(fcinfo, values, nulls));
}
