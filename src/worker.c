/*
 * worker.c
 *		A dwarf worker: owns the flows of one database whose id maps to it,
 *		keeps them in memory, and runs their ready steps in batches, one
 *		transaction (one WAL flush) per batch.
 *
 * Per step the worker calls the task through fmgr with a cached FmgrInfo,
 * as the flow's owner, appends one dwarf.step row and moves the flow on in
 * memory.  The flow row is written only when the flow closes.  Successors
 * become runnable only once the batch has committed.
 *
 * A batch first runs optimistically with no subtransactions.  If anything in
 * it fails, the transaction is rolled back, the flows it touched are
 * reloaded from the tables, and the next batch runs each step in its own
 * subtransaction (at most DWARF_MAX_ISOLATED_BATCH of them), so a failing
 * task fails only its own step.
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "dwarf.h"

/* A runnable token in the ready queue: lower priority first, then FIFO. */
/* A fairness key's virtual clock: how far its flows have been served. */
typedef struct FairKey
{
	char		key[NAMEDATALEN];	/* hash key; "" for flows without one */
	double		pass;
} FairKey;

/*
 * A token in the ready queue or on the timer heap.  The ready queue runs
 * lower priority first; within a priority, lower virtual time first, which
 * serves fairness keys in proportion to their weights (stride scheduling);
 * then first come, first served.
 */
typedef struct ReadyEntry
{
	pairingheap_node ph;
	int64		flow_id;
	int			token_id;
	int32		priority;
	uint64		seq;
	TimestampTz due;
	FairKey    *fair;
	int32		weight;
	double		vtime;
} ReadyEntry;

typedef struct GraphEntry
{
	int			id;				/* hash key */
	Graph	   *graph;
} GraphEntry;

/* A flow to load: from a note, a run request or a table scan. */
typedef struct LoadItem
{
	int64		flow_id;
	bool		replay;			/* it may have steps already */
} LoadItem;

static DwarfWorkerSlot *MySlot = NULL;
static int	MySlotNo = -1;

static MemoryContext WorkerContext;	/* flows, graphs, queue entries */
static MemoryContext BatchContext;	/* reset after each batch */
static HTAB *Flows = NULL;
static HTAB *Graphs = NULL;
static pairingheap *Ready = NULL;
static pairingheap *Timers = NULL;	/* tokens due later, earliest first */
static HTAB *FairKeys = NULL;
static double VirtualTime = 0;	/* vtime of the last entry run */
static uint64 ReadySeq = 0;
static int64 ReadyCount = 0;

static List *ToLoad = NIL;		/* LoadItems */
static bool FullScan = true;
static bool IsolateNext = false;

static SPIPlanPtr CloseFlowPlan = NULL;
static SPIPlanPtr LoadFlowsPlan = NULL;
static SPIPlanPtr ScanFlowsPlan = NULL;
static SPIPlanPtr LoadStepsPlan = NULL;
static SPIPlanPtr LoadGraphPlan = NULL;
static SPIPlanPtr ParkFlowPlan = NULL;
static SPIPlanPtr DeleteFlowPlan = NULL;
static SPIPlanPtr ParkAncestorsPlan = NULL;
static SPIPlanPtr ResumedPlan = NULL;

/* ---------- the ready queue ---------- */

static int
ReadyCompare(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	const ReadyEntry *x = pairingheap_const_container(ReadyEntry, ph, a);
	const ReadyEntry *y = pairingheap_const_container(ReadyEntry, ph, b);

	if (x->priority != y->priority)
		return x->priority < y->priority ? 1 : -1;
	if (x->vtime != y->vtime)
		return x->vtime < y->vtime ? 1 : -1;
	return x->seq < y->seq ? 1 : (x->seq > y->seq ? -1 : 0);
}

/* Puts an entry on the ready queue, charging its fairness key. */
static void
MakeReady(ReadyEntry *entry)
{
	entry->fair->pass = Max(entry->fair->pass, VirtualTime) + 1.0 / entry->weight;
	entry->vtime = entry->fair->pass;
	pairingheap_add(Ready, &entry->ph);
	ReadyCount++;
}

static FairKey *
GetFairKey(const char *key)
{
	char		name[NAMEDATALEN] = {0};
	FairKey    *fair;
	bool		found;

	if (key)
		strlcpy(name, key, NAMEDATALEN);
	fair = hash_search(FairKeys, name, HASH_ENTER, &found);
	if (!found)
		fair->pass = VirtualTime;
	return fair;
}

static int
TimerCompare(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	const ReadyEntry *x = pairingheap_const_container(ReadyEntry, ph, a);
	const ReadyEntry *y = pairingheap_const_container(ReadyEntry, ph, b);

	return x->due < y->due ? 1 : (x->due > y->due ? -1 : 0);
}

/*
 * Queues every token of a running flow that can run and is not queued yet:
 * on the ready queue, or on the timer heap when it is due later.
 */
static void
EnqueueRunnable(FlowRun *flow)
{
	TimestampTz now = GetCurrentTimestamp();
	ListCell   *lc;

	if (flow->status != FLOW_RUNNING)
		return;
	foreach(lc, flow->tokens)
	{
		Token	   *token = lfirst(lc);
		ReadyEntry *entry;

		if (token->queued || token->running || token->parked)
			continue;
		entry = MemoryContextAlloc(WorkerContext, sizeof(ReadyEntry));
		entry->flow_id = flow->id;
		entry->token_id = token->id;
		entry->priority = flow->priority;
		entry->seq = ReadySeq++;
		entry->due = token->due;
		entry->fair = GetFairKey(flow->fairness_key);
		entry->weight = Max(flow->fairness_weight, 1);
		token->queued = true;
		if (token->due > now)
			pairingheap_add(Timers, &entry->ph);
		else
			MakeReady(entry);
	}
}

/*
 * Moves the timers that came due to the ready queue.  Returns how many
 * milliseconds until the next one, or -1 when none is waiting.
 */
static long
MoveDueTimers(void)
{
	TimestampTz now = GetCurrentTimestamp();

	while (!pairingheap_is_empty(Timers))
	{
		ReadyEntry *entry = pairingheap_container(ReadyEntry, ph,
												  pairingheap_first(Timers));

		if (entry->due > now)
			return TimestampDifferenceMilliseconds(now, entry->due) + 1;
		(void) pairingheap_remove_first(Timers);
		MakeReady(entry);
	}
	return -1;
}

/* ---------- plans and graphs ---------- */

/*
 * Prepares a statement for the worker's life.  Its plan is generic: a
 * custom plan for every execution would plan again each time.
 */
static SPIPlanPtr
Prepare(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);

	if (plan == NULL)
		elog(ERROR, "dwarf: SPI_prepare failed for \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

/* Prepares the worker's statements once; they stay for the worker's life. */
static void
PreparePlans(void)
{
	Oid			park_types[3] = {INT8OID, JSONBOID, JSONBOID};
	Oid			close_types[4] = {INT8OID, TEXTOID, JSONBOID, TEXTOID};
	Oid			ids_type[1] = {INT8ARRAYOID};
	Oid			scan_types[2] = {INT4OID, INT4OID};
	Oid			int8_type[1] = {INT8OID};
	Oid			int4_type[1] = {INT4OID};

	if (CloseFlowPlan != NULL)
		return;
	CloseFlowPlan = Prepare(
		"UPDATE dwarf.flow SET status = $2, state = $3, error = $4, finished_at = clock_timestamp()"
		" WHERE id = $1 AND status = 'running'",
		4, close_types);
	LoadFlowsPlan = Prepare(
		"SELECT id, graph_id, owner::oid, priority, input, resume_data, baggage,"
		" fairness_key, fairness_weight,"
		" (extract(epoch FROM time_budget) * 1000)::bigint, delete_on_completion, start_task,"
		" parent_id, ARRAY(SELECT c.id FROM dwarf.flow c WHERE c.parent_id = flow.id"
		"   AND c.status IN ('completed', 'failed', 'cancelled'))"
		" FROM dwarf.flow WHERE id = ANY($1) AND status IN ('running', 'interrupted')",
		1, ids_type);
	ScanFlowsPlan = Prepare(
		"SELECT id FROM dwarf.flow WHERE status IN ('running', 'interrupted')"
		" AND ((id & 281474976710655) % $1) = $2",
		2, scan_types);
	LoadStepsPlan = Prepare(
		"SELECT token, task, status, changes, goto_task, error, wake_at, attempt,"
		" started_at, signal FROM dwarf.step WHERE flow_id = $1 ORDER BY step_id",
		1, int8_type);
	LoadGraphPlan = Prepare(
		"SELECT definition FROM dwarf.graph WHERE id = $1",
		1, int4_type);
	ParkFlowPlan = Prepare(
		"UPDATE dwarf.flow SET status = 'interrupted', interrupt_payload = $2, state = $3"
		" WHERE id = $1 AND status = 'running'",
		3, park_types);
	ParkAncestorsPlan = Prepare(
		"WITH RECURSIVE up AS ("
		"  SELECT parent_id AS id FROM dwarf.flow WHERE id = $1"
		"  UNION ALL SELECT f.parent_id FROM dwarf.flow f JOIN up ON f.id = up.id"
		"   WHERE f.parent_id IS NOT NULL)"
		" UPDATE dwarf.flow f SET status = 'interrupted', interrupt_payload = $2,"
		"  state = dwarf.fold_changes(f.input,"
		"   ARRAY(SELECT s.changes FROM dwarf.step s WHERE s.flow_id = f.id"
		"          AND s.status IN ('completed', 'retry') ORDER BY s.step_id),"
		"   (SELECT g.definition -> 'reducers' FROM dwarf.graph g WHERE g.id = f.graph_id))"
		" WHERE id IN (SELECT id FROM up) AND status = 'running'",
		3, park_types);
	DeleteFlowPlan = Prepare(
		"WITH f AS (DELETE FROM dwarf.flow WHERE id = $1 AND status = 'running'),"
		" s AS (DELETE FROM dwarf.step WHERE flow_id = $1) SELECT 1",
		1, int8_type);
	ResumedPlan = Prepare(
		"UPDATE dwarf.flow SET resume_data = NULL WHERE id = $1",
		1, int8_type);
}

/* A compiled graph version, from the cache or the table. */
static Graph *
GetGraph(int graph_id)
{
	GraphEntry *entry;
	bool		found;
	Datum		arg = Int32GetDatum(graph_id);
	bool		isnull;
	Datum		def;

	entry = hash_search(Graphs, &graph_id, HASH_ENTER, &found);
	if (found)
		return entry->graph;
	entry->graph = NULL;

	if (SPI_execute_plan(LoadGraphPlan, &arg, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
	{
		hash_search(Graphs, &graph_id, HASH_REMOVE, NULL);
		elog(ERROR, "dwarf: graph %d does not exist", graph_id);
	}
	def = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	PG_TRY();
	{
		entry->graph = GraphParse(DatumGetJsonbP(def), WorkerContext, false);
	}
	PG_CATCH();
	{
		hash_search(Graphs, &graph_id, HASH_REMOVE, NULL);
		PG_RE_THROW();
	}
	PG_END_TRY();
	entry->graph->id = graph_id;
	return entry->graph;
}

/* A function was created, replaced or dropped: look the tasks up again. */
static void
ProcInvalidated(Datum arg, int cacheid, uint32 hashvalue)
{
	HASH_SEQ_STATUS status;
	GraphEntry *entry;

	if (Graphs == NULL)
		return;
	hash_seq_init(&status, Graphs);
	while ((entry = hash_seq_search(&status)) != NULL)
		if (entry->graph)
			entry->graph->prepared = false;
}

/* ---------- loading flows ---------- */

static void
DropFlow(FlowRun *flow)
{
	int64		id = flow->id;

	FlowRunFree(flow);
	hash_search(Flows, &id, HASH_REMOVE, NULL);
}

static void
NoteLoad(int64 flow_id, bool replay)
{
	MemoryContext old = MemoryContextSwitchTo(WorkerContext);
	LoadItem   *item = palloc(sizeof(LoadItem));

	item->flow_id = flow_id;
	item->replay = replay;
	ToLoad = lappend(ToLoad, item);
	MemoryContextSwitchTo(old);
}

/* Replays a flow's recorded steps, in order, to rebuild where it stands. */
static void
ReplaySteps(FlowRun *flow)
{
	Datum		arg = Int64GetDatum(flow->id);
	uint64		i;
	SPITupleTable *tuptable;

	if (SPI_execute_plan(LoadStepsPlan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read the steps of flow " INT64_FORMAT, flow->id);
	tuptable = SPI_tuptable;
	for (i = 0; i < SPI_processed && flow->status == FLOW_RUNNING; i++)
	{
		HeapTuple	tup = tuptable->vals[i];
		TupleDesc	desc = tuptable->tupdesc;
		bool		isnull;
		int			token_id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		char	   *status = SPI_getvalue(tup, desc, 3);
		char	   *goto_task = SPI_getvalue(tup, desc, 5);
		Token	   *token = FlowFindToken(flow, token_id);
		StepOutcome outcome = {0};
		Datum		d;

		if (token == NULL)
		{
			ereport(WARNING,
					(errmsg("dwarf: step %llu of flow " INT64_FORMAT " names token %d, which the graph never made",
							(unsigned long long) i, flow->id, token_id)));
			break;
		}
		outcome.kind = strcmp(status, "completed") == 0 ? OUTCOME_OK :
			strcmp(status, "retry") == 0 ? OUTCOME_RETRY :
			strcmp(status, "interrupted") == 0 ? OUTCOME_INTERRUPT :
			strcmp(status, "resumed") == 0 ? OUTCOME_RESUMED :
			strcmp(status, "waiting") == 0 ? OUTCOME_WAITING : OUTCOME_ERROR;
		d = SPI_getbinval(tup, desc, 10, &isnull);
		outcome.signal = isnull ? NULL : DatumGetJsonbP(d);
		outcome.goto_node = goto_task ? GraphNodeByName(flow->graph, goto_task) : -1;
		d = SPI_getbinval(tup, desc, 4, &isnull);
		outcome.changes = isnull ? JsonbEmptyObject() : DatumGetJsonbP(d);
		d = SPI_getbinval(tup, desc, 6, &isnull);
		outcome.error = isnull ? JsonbEmptyObject() : DatumGetJsonbP(d);
		d = SPI_getbinval(tup, desc, 7, &isnull);
		outcome.wake_at = isnull ? 0 : DatumGetTimestampTz(d);
		if (DatumGetInt32(SPI_getbinval(tup, desc, 8, &isnull)) == 1)
			token->first_started = DatumGetTimestampTz(SPI_getbinval(tup, desc, 9, &isnull));
		FlowAdvance(flow, token, &outcome);
	}
}

/*
 * Writes a closed flow's row: its status, final state and error.  A flow
 * created with delete_on_completion that completed is deleted instead.
 */
static void
WriteClose(FlowRun *flow)
{
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	if (flow->parent_id != 0)
		NoteOnCommit(flow->parent_id, NOTE_RELOAD_FLOW, false);
	if (flow->delete_on_completion && flow->status == FLOW_COMPLETED)
	{
		args[0] = Int64GetDatum(flow->id);
		if (SPI_execute_plan(DeleteFlowPlan, args, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not delete flow " INT64_FORMAT, flow->id);
		return;
	}

	args[0] = Int64GetDatum(flow->id);
	args[1] = CStringGetTextDatum(flow->status == FLOW_COMPLETED ? "completed" : "failed");
	if (flow->final_state)
		args[2] = JsonbPGetDatum(flow->final_state);
	else
		nulls[2] = 'n';
	if (flow->error)
		args[3] = CStringGetTextDatum(flow->error);
	else
		nulls[3] = 'n';
	if (SPI_execute_plan(CloseFlowPlan, args, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "dwarf: could not close flow " INT64_FORMAT, flow->id);
}

/* Marks the flow's row interrupted, with a parked token's payload and state. */
static void
ParkRow(FlowRun *flow, Token *token)
{
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};

	args[0] = Int64GetDatum(flow->id);
	if (token->payload)
		args[1] = JsonbPGetDatum(token->payload);
	else
		nulls[1] = 'n';
	args[2] = JsonbPGetDatum(token->state);
	if (SPI_execute_plan(ParkFlowPlan, args, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "dwarf: could not mark flow " INT64_FORMAT " interrupted", flow->id);
	if (flow->parent_id != 0 &&
		SPI_execute_plan(ParkAncestorsPlan, args, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "dwarf: could not mark the parents of flow " INT64_FORMAT " interrupted",
			 flow->id);
}

static Token *
FirstParked(FlowRun *flow)
{
	ListCell   *lc;

	foreach(lc, flow->tokens)
	{
		Token	   *token = lfirst(lc);

		if (token->parked && token->child == 0)
			return token;
	}
	return NULL;
}

static void RecordStep(FlowRun *flow, int token_id, int node, int attempt,
					   StepOutcome *outcome, TimestampTz started, TimestampTz finished);
static void CloseSteps(void);

/*
 * Hands dwarf.resume's data to the first parked token, recording it as a
 * step so that replay sees it too.  A flow with another parked token is
 * interrupted again, with that token's payload.
 */
static void
ApplyResume(FlowRun *flow, Jsonb *data)
{
	Token	   *token = FirstParked(flow);
	Datum		arg = Int64GetDatum(flow->id);

	if (token)
	{
		StepOutcome outcome = {0};
		TimestampTz now = GetCurrentTimestamp();

		outcome.kind = OUTCOME_RESUMED;
		outcome.goto_node = -1;
		outcome.signal = data;
		RecordStep(flow, token->id, token->node, token->attempt, &outcome, now, now);
		FlowAdvance(flow, token, &outcome);
	}
	if (SPI_execute_plan(ResumedPlan, &arg, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "dwarf: could not record the resume of flow " INT64_FORMAT, flow->id);
	if ((token = FirstParked(flow)) != NULL)
		ParkRow(flow, token);
}

/*
 * Puts a flow in memory from its row as LoadFlowsPlan reads it (and, with
 * replay, its steps).  Returns the flow.
 */
static FlowRun *
AddFlow(HeapTuple tup, TupleDesc desc, bool replay)
{
	bool		isnull;
	int64		id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	Graph	   *graph = GetGraph(DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull)));
	bool		found;
	FlowRun    *flow;
	Datum		d;
	char	   *start_task;
	int			start = graph->entry;
	MemoryContext old;

	flow = hash_search(Flows, &id, HASH_ENTER, &found);
	if (found)
		return flow;
	start_task = SPI_getvalue(tup, desc, 12);
	if (start_task && GraphNodeByName(graph, start_task) >= 0)
		start = GraphNodeByName(graph, start_task);
	FlowRunCreate(flow, graph, start,
				  DatumGetJsonbP(SPI_getbinval(tup, desc, 5, &isnull)), WorkerContext);
	flow->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
	flow->priority = DatumGetInt32(SPI_getbinval(tup, desc, 4, &isnull));
	old = MemoryContextSwitchTo(flow->cxt);
	d = SPI_getbinval(tup, desc, 7, &isnull);
	flow->baggage = isnull ? NULL : (Jsonb *) PG_DETOAST_DATUM_COPY(d);
	flow->fairness_key = SPI_getvalue(tup, desc, 8);
	MemoryContextSwitchTo(old);
	flow->fairness_weight = DatumGetInt32(SPI_getbinval(tup, desc, 9, &isnull));
	d = SPI_getbinval(tup, desc, 10, &isnull);
	flow->time_budget_ms = isnull ? 0 : DatumGetInt64(d);
	flow->delete_on_completion = DatumGetBool(SPI_getbinval(tup, desc, 11, &isnull));
	d = SPI_getbinval(tup, desc, 13, &isnull);
	flow->parent_id = isnull ? 0 : DatumGetInt64(d);
	if (replay)
	{
		ListCell   *lc;
		Datum	   *closed;
		int			nclosed;

		ReplaySteps(flow);

		/* A step that waits for a child that has closed runs again. */
		deconstruct_array(DatumGetArrayTypeP(SPI_getbinval(tup, desc, 14, &isnull)),
						  INT8OID, 8, true, TYPALIGN_DOUBLE, &closed, NULL, &nclosed);
		foreach(lc, flow->tokens)
		{
			Token	   *token = lfirst(lc);

			for (int i = 0; token->child != 0 && i < nclosed; i++)
				if (DatumGetInt64(closed[i]) == token->child)
				{
					token->parked = false;
					token->child = 0;
				}
		}
	}
	pg_atomic_fetch_add_u64(&MySlot->flows_loaded, 1);
	return flow;
}

/* Loads the flows listed in ToLoad (and all of ours after a full scan). */
static void
LoadFlows(void)
{
	List	   *items;
	List	   *closed = NIL;	/* in outer: used after the commit */
	ListCell   *lc;
	Datum	   *ids;
	int			n = 0;
	bool		any_replay = false;
	MemoryContext outer = CurrentMemoryContext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "dwarf: loading flows");
	PreparePlans();

	if (FullScan)
	{
		Datum		args[2] = {Int32GetDatum(dwarf_workers), Int32GetDatum(MySlot->index)};
		uint64		i;

		FullScan = false;
		if (SPI_execute_plan(ScanFlowsPlan, args, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not scan dwarf.flow");
		for (i = 0; i < SPI_processed; i++)
		{
			bool		isnull;
			int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
														 SPI_tuptable->tupdesc, 1, &isnull));

			if (hash_search(Flows, &id, HASH_FIND, NULL) == NULL)
				NoteLoad(id, true);
		}
	}

	/* Taken only now: the scan above adds to ToLoad (in WorkerContext). */
	items = ToLoad;
	ToLoad = NIL;

	ids = palloc(sizeof(Datum) * Max(list_length(items), 1));
	foreach(lc, items)
	{
		LoadItem   *item = lfirst(lc);

		if (hash_search(Flows, &item->flow_id, HASH_FIND, NULL) != NULL)
			continue;
		ids[n++] = Int64GetDatum(item->flow_id);
		any_replay |= item->replay;
	}

	if (n > 0)
	{
		Datum		arg = PointerGetDatum(construct_array(ids, n, INT8OID, 8, true, TYPALIGN_DOUBLE));
		SPITupleTable *tuptable;
		uint64		i,
					count;

		if (SPI_execute_plan(LoadFlowsPlan, &arg, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not load flows");
		tuptable = SPI_tuptable;
		count = SPI_processed;
		for (i = 0; i < count; i++)
		{
			HeapTuple	tup = tuptable->vals[i];
			TupleDesc	desc = tuptable->tupdesc;
			bool		isnull;
			FlowRun    *flow;
			Datum		d;

			flow = AddFlow(tup, desc, any_replay);
			d = SPI_getbinval(tup, desc, 6, &isnull);
			if (!isnull)
				ApplyResume(flow, DatumGetJsonbP(d));
			if (flow->status != FLOW_RUNNING)
			{
				MemoryContext old;

				WriteClose(flow);
				old = MemoryContextSwitchTo(outer);
				closed = lappend(closed, flow);
				MemoryContextSwitchTo(old);
			}
		}
	}

	CloseSteps();
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	foreach(lc, closed)
	{
		FlowRun    *flow = lfirst(lc);
		int64		id = flow->id;

		DwarfWakeWaiters(&id, 1);
		DropFlow(flow);
	}
	foreach(lc, items)
	{
		LoadItem   *item = lfirst(lc);
		FlowRun    *flow = hash_search(Flows, &item->flow_id, HASH_FIND, NULL);

		if (flow)
			EnqueueRunnable(flow);
	}
	list_free_deep(items);
}

/* ---------- dwarf.run's create requests ---------- */

typedef struct Created
{
	int			procno;
	int64		flow_id;
	bool		is_new;
} Created;

static void
AnswerRequest(int procno, DwarfRequestState state, int64 flow_id, const char *msg)
{
	DwarfRequest *req = &Dwarf->requests[procno];

	SpinLockAcquire(&req->mutex);
	if (req->state == REQ_SUBMITTED || req->state == REQ_TAKEN)
	{
		req->state = state;
		req->flow_id = flow_id;
		strlcpy(req->errmsg, msg ? msg : "", sizeof(req->errmsg));
	}
	SpinLockRelease(&req->mutex);
	SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}

/* Inserts one request's flow; idempotency key conflicts find the first flow. */
static void
InsertRequestedFlow(RunRequest *r, Created *c)
{
	text	   *key = r->keylen > 0 ? cstring_to_text_with_len(r->data, r->keylen) : NULL;
	Jsonb	   *input = (Jsonb *) (r->data + r->keylen);
	Jsonb	   *options = (Jsonb *) (r->data + r->keylen + r->inputlen);

	c->flow_id = InsertFlow(r->flow_id, r->graph_id, r->owner, r->priority, key,
							input, options, &c->is_new);
}

/*
 * Commits the flows that dwarf.run callers handed over, all in one
 * transaction, then tells each caller its flow id.  The new flows are ours
 * (callers pick the owning worker): they are loaded right after.
 */
static void
ProcessRunRequests(List *procnos)
{
	MemoryContext cxt = CurrentMemoryContext;
	List	   *volatile created = NIL;
	ListCell   *lc;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	PreparePlans();
	PG_TRY();
	{
		foreach(lc, procnos)
		{
			int			procno = lfirst_int(lc);
			DwarfRequest *req = &Dwarf->requests[procno];
			dsm_handle	handle;
			dsm_segment *seg;
			Created    *c;

			bool		submitted;

			SpinLockAcquire(&req->mutex);
			submitted = req->state == REQ_SUBMITTED;
			if (submitted)
				req->state = REQ_TAKEN;
			handle = req->handle;
			SpinLockRelease(&req->mutex);
			if (!submitted)
				continue;		/* the caller gave up */
			seg = NULL;
			if (handle != DSM_HANDLE_INVALID && (seg = dsm_attach(handle)) == NULL)
				continue;		/* the caller gave up */

			c = MemoryContextAllocZero(cxt, sizeof(Created));
			c->procno = procno;
			{
				MemoryContext old = MemoryContextSwitchTo(cxt);

				/* The caller leaves the body alone while it is submitted. */
				InsertRequestedFlow(seg ? dsm_segment_address(seg) : (RunRequest *) req->body, c);
				created = lappend(created, c);
				MemoryContextSwitchTo(old);
			}
			if (seg)
				dsm_detach(seg);
		}
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("dwarf: could not create requested flows: %s", edata->message)));
		foreach(lc, procnos)
			AnswerRequest(lfirst_int(lc), REQ_FAILED, 0, edata->message);
		return;
	}
	PG_END_TRY();

	foreach(lc, created)
	{
		Created    *c = lfirst(lc);

		if (c->is_new)
			NoteLoad(c->flow_id, false);
		AnswerRequest(c->procno, REQ_DONE, c->flow_id, NULL);
	}
}

/* ---------- running steps ---------- */

/*
 * Calls a task's function on state as the flow's owner, with the step's
 * context set for dwarf.goto and friends.  Returns the task's changes.
 */
static Jsonb *
CallTask(FlowRun *flow, Token *token, StepContext *ctx)
{
	Graph	   *graph = flow->graph;
	GraphNode	   *node = &graph->nodes[token->node];
	LOCAL_FCINFO(fcinfo, 1);
	Oid			save_user;
	int			save_sec;
	int			nest;
	Datum		result;
	Jsonb	   *changes;

	if (!OidIsValid(node->fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function %s of task \"%s\" does not exist", node->fn_name, node->name)));
	if (!graph->prepared)
		GraphPrepareCalls(graph);
	if (pg_proc_aclcheck(node->fn, flow->owner, ACL_EXECUTE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for function %s of task \"%s\"",
						node->fn_name, node->name),
				 errdetail("The flow runs as role %s.", GetUserNameFromId(flow->owner, true))));

	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(flow->owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	nest = NewGUCNestLevel();
	DwarfCurrentStep = ctx;
	if (flow->time_budget_ms > 0)
		enable_timeout_after(STATEMENT_TIMEOUT, (int) Min(flow->time_budget_ms, INT_MAX));

	InitFunctionCallInfoData(*fcinfo, &node->flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = JsonbPGetDatum(token->state);
	fcinfo->args[0].isnull = false;
	result = FunctionCallInvoke(fcinfo);

	if (flow->time_budget_ms > 0)
		disable_timeout(STATEMENT_TIMEOUT, false);
	DwarfCurrentStep = NULL;
	AtEOXact_GUC(true, nest);
	SetUserIdAndSecContext(save_user, save_sec);

	if (fcinfo->isnull)
		return JsonbEmptyObject();
	changes = DatumGetJsonbP(result);
	if (!JsonbIsObject(changes))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("task \"%s\" returned a JSON value that is not an object", node->name),
				 errhint("A task returns its changes as a JSON object, or NULL for none.")));
	return changes;
}

/* The error document a failed step records: what onErr holds for a handler. */
static Jsonb *
ErrorDocument(ErrorData *edata, const char *task)
{
	const char *keys[5] = {"message", "sqlstate", "detail", "hint", "task"};
	const char *vals[5];
	JsonbValue	values[5];
	int			i;

	vals[0] = edata->message ? edata->message : "unknown error";
	vals[1] = unpack_sql_state(edata->sqlerrcode);
	vals[2] = edata->detail;
	vals[3] = edata->hint;
	vals[4] = task;
	for (i = 0; i < 5; i++)
	{
		if (vals[i] == NULL)
			values[i].type = jbvNull;
		else
		{
			values[i].type = jbvString;
			values[i].val.string.val = (char *) vals[i];
			values[i].val.string.len = strlen(vals[i]);
		}
	}
	return JsonbWithKeys(JsonbEmptyObject(), 5, keys, values);
}

/*
 * dwarf.step, opened once per batch for direct inserts.  The hot path
 * appends one row per step: forming the tuple and inserting it and its
 * index entries directly costs a fraction of an INSERT through the
 * executor (no plan, no expression setup per row).
 */
typedef struct StepTable
{
	Relation	rel;
	CatalogIndexState indexes;
	Oid			seq;			/* dwarf.step_seq */
} StepTable;

static StepTable Steps = {NULL, NULL, InvalidOid};

static void
OpenSteps(void)
{
	Oid			nsp = get_namespace_oid("dwarf", false);

	Steps.rel = table_open(get_relname_relid("step", nsp), RowExclusiveLock);
	Steps.indexes = CatalogOpenIndexes(Steps.rel);
	Steps.seq = get_relname_relid("step_seq", nsp);
}

static void
CloseSteps(void)
{
	if (Steps.rel == NULL)
		return;
	CatalogCloseIndexes(Steps.indexes);
	table_close(Steps.rel, NoLock);
	Steps.rel = NULL;
}

/* Appends the step's row to dwarf.step, in the batch's transaction. */
static void
RecordStep(FlowRun *flow, int token_id, int node, int attempt, StepOutcome *outcome,
		   TimestampTz started, TimestampTz finished)
{
	static const char *const status[] = {
		"completed", "failed", "retry", "interrupted", "resumed", "waiting"
	};
	Graph	   *graph = flow->graph;
	TupleDesc	desc;
	Datum		values[13];
	bool		nulls[13] = {0};
	HeapTuple	tuple;

	if (Steps.rel == NULL)
		OpenSteps();
	desc = RelationGetDescr(Steps.rel);
	if (desc->natts != lengthof(values))
		elog(ERROR, "dwarf: dwarf.step has %d columns, not %d", desc->natts, (int) lengthof(values));

	/* In the column order of dwarf.step. */
	values[0] = Int64GetDatum(flow->id);
	values[1] = DirectFunctionCall1(nextval_oid, ObjectIdGetDatum(Steps.seq));
	values[2] = Int32GetDatum(token_id);
	values[3] = CStringGetTextDatum(graph->nodes[node].name);
	values[4] = CStringGetTextDatum(status[outcome->kind]);
	values[5] = Int32GetDatum(attempt);
	values[6] = TimestampTzGetDatum(started);
	values[7] = TimestampTzGetDatum(finished);
	if (outcome->kind == OUTCOME_OK || outcome->kind == OUTCOME_RETRY)
		values[8] = JsonbPGetDatum(outcome->changes);
	else
		nulls[8] = true;
	if (outcome->kind == OUTCOME_OK && outcome->goto_node >= 0)
		values[9] = CStringGetTextDatum(graph->nodes[outcome->goto_node].name);
	else
		nulls[9] = true;
	values[10] = TimestampTzGetDatum(outcome->wake_at);
	nulls[10] = outcome->wake_at == 0;
	values[11] = JsonbPGetDatum(outcome->signal);
	nulls[11] = outcome->signal == NULL;
	values[12] = JsonbPGetDatum(outcome->error);
	nulls[12] = outcome->kind != OUTCOME_ERROR;

	tuple = heap_form_tuple(desc, values, nulls);
	CatalogTupleInsertWithInfo(Steps.rel, tuple, Steps.indexes);
	heap_freetuple(tuple);
}

/*
 * Runs one step.  Isolated, the task and the transition run in a
 * subtransaction, and an error there becomes the step's outcome; otherwise
 * an error aborts the whole batch.  Returns the flow when an error left its
 * memory half moved on (the caller reloads it), else NULL.
 */
static FlowRun *
RunStep(FlowRun *flow, Token *token, bool isolated)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	StepContext ctx = {flow, token, -1, false, 0, 0, false, NULL, 0, 0, CurrentMemoryContext};
	StepOutcome outcome = {0};
	TimestampTz started = GetCurrentTimestamp();
	int			token_id = token->id;
	int			node = token->node;
	int			attempt = token->attempt;
	volatile bool advancing = false;	/* set in PG_TRY, read in PG_CATCH */
	FlowRun    *broken = NULL;

	if (attempt == 1)
		token->first_started = started;
	if (isolated)
		BeginInternalSubTransaction(NULL);
	PG_TRY();
	{
		outcome.changes = CallTask(flow, token, &ctx);
		outcome.kind = ctx.interrupted ? OUTCOME_INTERRUPT :
			ctx.waiting_child ? OUTCOME_WAITING :
			ctx.retry ? OUTCOME_RETRY : OUTCOME_OK;
		outcome.goto_node = outcome.kind == OUTCOME_OK ? ctx.goto_node : -1;
		outcome.signal = ctx.payload;
		if (outcome.kind == OUTCOME_WAITING)
		{
			const char *key = "child";
			JsonbValue	child;

			child.type = jbvNumeric;
			child.val.numeric = int64_to_numeric(ctx.waiting_child);
			outcome.signal = JsonbWithKeys(JsonbEmptyObject(), 1, &key, &child);
		}
		if (outcome.kind == OUTCOME_OK || outcome.kind == OUTCOME_RETRY)
			if (ctx.retry || ctx.delay_us > 0)
				outcome.wake_at = GetCurrentTimestamp() + ctx.delay_us;
		advancing = true;
		FlowAdvance(flow, token, &outcome);
		if (isolated)
		{
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		DwarfCurrentStep = NULL;
		if (flow->time_budget_ms > 0)
			disable_timeout(STATEMENT_TIMEOUT, false);
		if (!isolated)
			PG_RE_THROW();
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && flow->time_budget_ms > 0)
			edata->message = psprintf("task \"%s\" ran past its time budget of " INT64_FORMAT " ms",
									  flow->graph->nodes[node].name, flow->time_budget_ms);
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;

		outcome.kind = OUTCOME_ERROR;
		outcome.changes = NULL;
		outcome.goto_node = -1;
		outcome.wake_at = 0;
		outcome.signal = NULL;
		outcome.error = ErrorDocument(edata, flow->graph->nodes[node].name);
		if (advancing)
			broken = flow;
		else
			FlowAdvance(flow, token, &outcome);
		pg_atomic_fetch_add_u64(&MySlot->steps_failed, 1);
	}
	PG_END_TRY();

	RecordStep(flow, token_id, node, attempt, &outcome, started, GetCurrentTimestamp());
	return broken;
}

/* ---------- batches ---------- */

/* The priority of the best ready step, or PG_INT32_MAX when none is ready. */
static int32
BestReadyPriority(void)
{
	if (pairingheap_is_empty(Ready))
		return PG_INT32_MAX;
	return pairingheap_container(ReadyEntry, ph, pairingheap_first(Ready))->priority;
}

/*
 * Publishes the priority of our best ready step for the other workers of
 * this database.  When it got worse, they may have been holding back
 * their own work for ours: wake them.
 */
static void
PublishPriority(void)
{
	int32		best = BestReadyPriority();
	int32		old = MySlot->best_priority;
	int			i;

	MySlot->best_priority = best;
	if (best <= old)
		return;
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];

		if (slot != MySlot && slot->dboid == MySlot->dboid && slot->latch)
			SetLatch(slot->latch);
	}
}

/*
 * The best priority of ready work anywhere in this database.  Priorities
 * are strict across workers: none starts a step while another worker has
 * ready work of a better (lower) priority.
 */
static int32
DatabaseBestPriority(void)
{
	int32		best = BestReadyPriority();
	int			i;

	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];

		if (slot != MySlot && slot->dboid == MySlot->dboid && slot->latch &&
			slot->best_priority < best)
			best = slot->best_priority;
	}
	return best;
}

/* Pops up to max runnable tokens, skipping entries whose flow moved on. */
static List *
PopBatch(int max)
{
	List	   *batch = NIL;
	int32		limit = DatabaseBestPriority();

	while (list_length(batch) < max && !pairingheap_is_empty(Ready) &&
		   BestReadyPriority() <= limit)
	{
		ReadyEntry *entry = pairingheap_container(ReadyEntry, ph,
												  pairingheap_remove_first(Ready));
		FlowRun    *flow = hash_search(Flows, &entry->flow_id, HASH_FIND, NULL);
		Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;

		ReadyCount--;
		VirtualTime = entry->vtime;
		if (token && token->queued && flow->status == FLOW_RUNNING)
		{
			token->queued = false;
			token->running = true;
			batch = lappend(batch, entry);
		}
		else
			pfree(entry);
	}
	return batch;
}

/*
 * Runs one batch of ready steps in one transaction.  After the commit, the
 * steps' successors are queued, closed flows are dropped from memory, and
 * whoever awaits them is woken.
 */
static void
RunBatch(void)
{
	bool		isolated = IsolateNext;
	List	   *volatile batch = PopBatch(isolated ? Min(dwarf_batch_size, DWARF_MAX_ISOLATED_BATCH)
								 : dwarf_batch_size);
	List	   *broken = NIL;	/* entries whose flow must be reloaded, in
								 * BatchContext: used after the commit */
	int			ran = 0;
	int64	   *parked;			/* flows interrupted in this batch */
	int			nparked = 0;
	int64	   *closed;
	int			nclosed = 0;
	ListCell   *lc;

	IsolateNext = false;
	if (batch == NIL)
		return;

	parked = palloc(sizeof(int64) * list_length(batch));
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "dwarf: running a batch");
	PreparePlans();

	PG_TRY();
	{
		foreach(lc, batch)
		{
			ReadyEntry *entry = lfirst(lc);
			FlowRun    *flow = hash_search(Flows, &entry->flow_id, HASH_FIND, NULL);
			Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;
			FlowRun    *bad;

			if (token == NULL || flow->status != FLOW_RUNNING)
				continue;		/* its flow closed or broke earlier in the batch */
			bad = RunStep(flow, token, isolated);
			ran++;
			token = FlowFindToken(flow, entry->token_id);
			if (token)
				token->running = false;
			if (bad)
			{
				MemoryContext old = MemoryContextSwitchTo(BatchContext);

				broken = lappend(broken, entry);
				MemoryContextSwitchTo(old);
				DropFlow(bad);
				continue;
			}
			if (flow->status != FLOW_RUNNING)
				WriteClose(flow);
			else if (token && token->parked && token->child == 0)
			{
				ParkRow(flow, token);
				parked[nparked++] = flow->id;
			}
		}
		CloseSteps();
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(BatchContext);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		Steps.rel = NULL;		/* closed by the abort */
		DwarfCurrentStep = NULL;
		pgstat_report_activity(STATE_IDLE, NULL);
		if (isolated)
			ereport(ERROR,
					(errmsg("dwarf: a batch failed outside its tasks: %s", edata->message)));
		ereport(LOG,
				(errmsg("dwarf: batch of %d steps rolled back, running it step by step: %s",
						list_length(batch), edata->message)));
		pg_atomic_fetch_add_u64(&MySlot->aborted_batches, 1);

		/* The tables are the truth: reload every flow the batch touched. */
		foreach(lc, batch)
		{
			ReadyEntry *entry = lfirst(lc);
			FlowRun    *flow = hash_search(Flows, &entry->flow_id, HASH_FIND, NULL);

			if (flow)
			{
				DropFlow(flow);
				NoteLoad(entry->flow_id, true);
			}
			pfree(entry);
		}
		IsolateNext = true;
		return;
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);

	closed = palloc(sizeof(int64) * list_length(batch));
	foreach(lc, batch)
	{
		ReadyEntry *entry = lfirst(lc);
		FlowRun    *flow = hash_search(Flows, &entry->flow_id, HASH_FIND, NULL);

		if (flow == NULL)
			continue;			/* closed above, or broken */
		if (flow->status != FLOW_RUNNING)
		{
			closed[nclosed++] = flow->id;
			pg_atomic_fetch_add_u64(&MySlot->flows_closed, 1);
			DropFlow(flow);
		}
		else
			EnqueueRunnable(flow);
	}
	foreach(lc, broken)
		NoteLoad(((ReadyEntry *) lfirst(lc))->flow_id, true);
	pg_atomic_fetch_add_u64(&MySlot->steps, ran);
	DwarfWakeWaiters(closed, nclosed);
	DwarfWakeWaiters(parked, nparked);
	pgstat_report_stat(false);	/* WAL and commit counters, at most once a second */
	pg_atomic_fetch_add_u64(&MySlot->batches, 1);
	list_free_deep(batch);
}

/* ---------- notes and the main loop ---------- */

/*
 * Takes the notes queued for this worker: flows to load or reload, and
 * dwarf.run callers waiting for their create.  Returns whether any came.
 */
static bool
DrainNotes(List **requests)
{
	DwarfNote	notes[256];
	int			n,
				i;
	bool		any = false;

	do
	{
		SpinLockAcquire(&MySlot->mutex);
		n = 0;
		while (MySlot->head != MySlot->tail && n < lengthof(notes))
			notes[n++] = MySlot->ring[MySlot->head++ % DWARF_RING_SIZE];
		if (MySlot->overflow)
		{
			MySlot->overflow = false;
			FullScan = true;
		}
		SpinLockRelease(&MySlot->mutex);

		for (i = 0; i < n; i++)
		{
			FlowRun    *flow;

			any = true;
			switch ((DwarfNoteKind) notes[i].kind)
			{
				case NOTE_NEW_FLOW:
					if (hash_search(Flows, &notes[i].flow_id, HASH_FIND, NULL) == NULL)
						NoteLoad(notes[i].flow_id, false);
					break;
				case NOTE_RELOAD_FLOW:
					flow = hash_search(Flows, &notes[i].flow_id, HASH_FIND, NULL);
					if (flow)
						DropFlow(flow);
					NoteLoad(notes[i].flow_id, true);
					break;
				case NOTE_RUN_REQUEST:
					*requests = lappend_int(*requests, (int) notes[i].flow_id);
					break;
			}
		}
	} while (n == lengthof(notes));
	return any || FullScan;
}

/*
 * Exits quietly, for the launcher to see, when dwarf is not installed here
 * or is not the installation this worker started with: after DROP and
 * CREATE EXTENSION, everything it keeps in memory belongs to tables that
 * are gone, and a new worker starts afresh.
 */
static void
ExitIfNotInstalled(void)
{
	static Oid	installed_as = InvalidOid;
	Oid			extension;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	extension = get_extension_oid("dwarf", true);
	CommitTransactionCommand();
	if (!OidIsValid(installed_as))
		installed_as = extension;
	if (!OidIsValid(extension) || extension != installed_as)
	{
		MySlot->no_extension = true;
		proc_exit(0);
	}
}

static void
WorkerShutdown(int code, Datum arg)
{
	SpinLockAcquire(&MySlot->mutex);
	MySlot->latch = NULL;
	MySlot->pid = 0;
	SpinLockRelease(&MySlot->mutex);
}

/*
 * Entry point of a dwarf worker.  bgw_main_arg is its slot, which the
 * launcher filled with the database and the worker number.
 */
void
DwarfWorkerMain(Datum arg)
{
	HASHCTL		ctl;

	MySlotNo = DatumGetInt32(arg);
	MySlot = &Dwarf->workers[MySlotNo];

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(MySlot->dboid, InvalidOid, 0);
	pgstat_report_appname(psprintf("dwarf worker %d", MySlot->index));

	ExitIfNotInstalled();

	WorkerContext = AllocSetContextCreate(TopMemoryContext, "dwarf worker",
										  ALLOCSET_DEFAULT_SIZES);
	BatchContext = AllocSetContextCreate(TopMemoryContext, "dwarf batch",
										 ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(FlowRun);
	ctl.hcxt = WorkerContext;
	Flows = hash_create("dwarf flows", 1024, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	ctl.keysize = sizeof(int);
	ctl.entrysize = sizeof(GraphEntry);
	Graphs = hash_create("dwarf graphs", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(FairKey);
	FairKeys = hash_create("dwarf fairness keys", 64, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	Ready = pairingheap_allocate(ReadyCompare, NULL);
	Timers = pairingheap_allocate(TimerCompare, NULL);
	CacheRegisterSyscacheCallback(PROCOID, ProcInvalidated, (Datum) 0);

	before_shmem_exit(WorkerShutdown, (Datum) 0);
	SpinLockAcquire(&MySlot->mutex);
	MySlot->pid = MyProcPid;
	MySlot->latch = MyLatch;
	SpinLockRelease(&MySlot->mutex);

	ereport(LOG, (errmsg("dwarf worker %d started", MySlot->index)));

	for (;;)
	{
		List	   *requests = NIL;
		long		next_timer;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		MemoryContextSwitchTo(BatchContext);
		(void) DrainNotes(&requests);
		if (requests != NIL)
			ProcessRunRequests(requests);
		if (ToLoad != NIL || FullScan)
			LoadFlows();
		(void) MoveDueTimers();
		RunBatch();
		pg_atomic_write_u64(&MySlot->ready, ReadyCount);
		MemoryContextSwitchTo(TopMemoryContext);
		MemoryContextReset(BatchContext);

		next_timer = MoveDueTimers();
		PublishPriority();

		/*
		 * Go round again if there is work, or a note came after we drained
		 * the ring: a lock wait inside the transactions above may have
		 * consumed the latch its sender set.
		 */
		if (ToLoad != NIL || MySlot->head != MySlot->tail || MySlot->overflow ||
			(!pairingheap_is_empty(Ready) && BestReadyPriority() <= DatabaseBestPriority()))
			continue;
		if (!pairingheap_is_empty(Ready))
			next_timer = next_timer < 0 ? 100 : Min(next_timer, 100);	/* held back */

		/*
		 * Nothing to run: flush our statistics, then sleep until a note, a
		 * signal or the next timer.
		 */
		pgstat_report_stat(true);
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
						 (next_timer >= 0 ? WL_TIMEOUT : 0),
						 next_timer, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if (MySlot->head == MySlot->tail && !MySlot->overflow)
			ExitIfNotInstalled();	/* woken by DROP EXTENSION, perhaps */
	}
}
