/*
 * store.c
 *		What a worker reads and writes: loading flows and replaying their
 *		steps, appending step rows, and writing a flow's row when it closes
 *		or parks.
 *
 * The tables are the truth.  A worker loads a flow from its row and, after
 * a restart or a rolled-back batch, replays its recorded steps over its
 * input to rebuild it in memory exactly as it was.
 *
 * So a flow need not stay in memory while it has nothing to run for a
 * while: one that sleeps past DWARF_EVICT_AFTER_MS, is interrupted, or
 * waits for child flows is evicted (QueueOrEvict, worker.c), and loaded
 * again from its rows when it is due (a sleeper, sleepers.c) or when a
 * note says it
 * changed (a resume, a child that closed, a cancel).  A worker that
 * starts does not load every flow it owns either: a scan reads when each
 * can next run, from its last steps, and loads only those due soon.
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "dwarf.h"
#include "shmem.h"
#include "graph.h"
#include "flowrun.h"
#include "json.h"
#include "flows.h"
#include "rows.h"
#include "offers.h"
#include "stats.h"
#include "worker.h"

/*
 * A compiled graph version in the worker's cache.  One that a loaded flow
 * runs stays (flows counts them); the others wait in Unused, the most
 * recently used first, and past DWARF_GRAPHS_KEPT of them the least
 * recently used is freed: a worker that ran 65,000 roles' graphs once kept
 * them all (1 GB), and memory must follow the flows a worker holds, not
 * how many graphs exist.  A freed one is compiled again if a flow needs it.
 */
#define DWARF_GRAPHS_KEPT	256

typedef struct GraphEntry
{
	int			id;				/* hash key */
	Graph	   *graph;
	int			flows;			/* loaded flows that run it */
	dlist_node	unused;			/* in Unused while flows is 0 */
} GraphEntry;

static dlist_head Unused = DLIST_STATIC_INIT(Unused);
static int	NUnused = 0;

static Oid StepSeq = InvalidOid;	/* dwarf.step_seq */
static int64 StepIdNext = 0;	/* the block of step ids being handed out */
static int64 StepIdEnd = 0;

/*
 * A new step id: the next of this process's block of dwarf.step_seq, whose
 * nextval hands out blocks of 64 (its INCREMENT BY).  Taking the worker's
 * ids one block at a time keeps nextval, and the reset of lastval() that
 * follows it (session.c), off most steps.
 */
static int64
NextStepId(void)
{
	if (StepIdNext == StepIdEnd)
	{
		if (!OidIsValid(StepSeq))
			StepSeq = get_relname_relid("step_seq", get_namespace_oid("dwarf", false));
		StepIdNext = nextval_internal(StepSeq, false);	/* ours: no privilege to check */
		StepIdEnd = StepIdNext + DWARF_STEP_ID_BLOCK;
		DwarfNextvalUsed = true;
	}
	return StepIdNext++;
}

/*
 * Another process (a runner) took step ids for a flow of ours from a later
 * block: the flow's next step must come after them, so from a new block.
 */
void
StepIdsFromNewBlock(void)
{
	StepIdEnd = StepIdNext;
}
static HTAB *Graphs = NULL;		/* compiled graph versions by id */

static SPIPlanPtr CloseFlowPlan = NULL;

/* The flows the condition picks, read as a worker takes a flow in (flows.h). */
#define LOAD_FLOWS_SQL(condition) \
	"SELECT " FLOW_ROW_COLUMNS " FROM dwarf.flow f WHERE " condition \
	" AND status IN ('running', 'interrupted')"

/* Up to this many flows to load are read one by one (see PreparePlans). */
#define LOAD_ONE_BY_ONE 16

/* The flows of ours that run or are interrupted: a full scan's first pass. */
#define SCAN_IDS_SQL \
	"SELECT id FROM dwarf.flow WHERE status IN ('running', 'interrupted')" \
	" AND ((id & 281474976710655) % $1) = $2"

/*
 * The earliest time one of the tokens of the flows listed can run, from
 * the last step of each token: the wake time of a sleep or a retry; never
 * ('infinity') for a token parked by an interrupt, or by a dwarf.subgraph
 * call whose child is still open (a resume, or the child's close, sends a
 * note); else now ('-infinity'), as for a flow with no step yet or with
 * dwarf.resume's data to take.  This is a lower bound: a flow loaded at
 * that time that has nothing to run is evicted again, with its exact time.
 */
#define WAKE_TIMES_SQL \
	"SELECT f.id, CASE WHEN f.resume_data IS NOT NULL THEN '-infinity'::timestamptz" \
	" ELSE coalesce((SELECT min(CASE" \
	"   WHEN s.status = 'interrupted' THEN 'infinity'::timestamptz" \
	"   WHEN s.status = 'waiting' AND EXISTS (SELECT 1 FROM dwarf.flow c" \
	"     WHERE c.id = (s.signal->>'child')::bigint AND c.status IN ('running', 'interrupted'))" \
	"     THEN 'infinity'" \
	"   ELSE coalesce(s.wake_at, '-infinity') END)" \
	"  FROM (SELECT DISTINCT ON (token) status, wake_at, signal FROM dwarf.step" \
	"   WHERE flow_id = f.id ORDER BY token, step_id DESC) s), '-infinity') END" \
	" FROM dwarf.flow f WHERE f.id = ANY($1) AND f.status IN ('running', 'interrupted')"

/* Rows of SCAN_IDS_SQL read at a time, and flows WAKE_TIMES_SQL reads at once. */
#define SCAN_FETCH		10000

/* The most flows Worker.flows held since it was last made (see ShrinkFlowTable). */
static long FlowsPeak = 0;

static SPIPlanPtr LoadFlowsPlan = NULL;
static SPIPlanPtr LoadFlowPlan = NULL;
static SPIPlanPtr ScanFlowsPlan = NULL;
static SPIPlanPtr WakeTimesPlan = NULL;
static SPIPlanPtr LoadStepsPlan = NULL;
static SPIPlanPtr LoadGraphPlan = NULL;
static SPIPlanPtr ParkFlowPlan = NULL;
static SPIPlanPtr DeleteFlowPlan = NULL;
static SPIPlanPtr ParkAncestorsPlan = NULL;
static SPIPlanPtr ResumedPlan = NULL;
static SPIPlanPtr FailFlowPlan = NULL;
static SPIPlanPtr OrphanPlan = NULL;
static SPIPlanPtr ChildClosedPlan = NULL;
static SPIPlanPtr StillRunsPlan = NULL;
static SPIPlanPtr AnswersPlan = NULL;
static SPIPlanPtr AnswersOfPlan = NULL;

/* The columns TakeAnswerRow reads of dwarf.answer, flow_id last. */
#define ANSWER_ROWS_SQL \
	"SELECT token, visits, attempt, status, changes, error, retryable, started_at," \
	" finished_at, flow_id FROM dwarf.answer"
static SPIPlanPtr DeleteAnswerPlan = NULL;

/* Prepares the worker's statements once; they stay for the worker's life. */
void
PreparePlans(void)
{
	Oid			park_types[3] = {INT8OID, JSONBOID, JSONBOID};
	Oid			fail_types[2] = {INT8OID, TEXTOID};
	Oid			close_types[4] = {INT8OID, TEXTOID, JSONBOID, TEXTOID};
	Oid			ids_type[1] = {INT8ARRAYOID};
	Oid			scan_types[2] = {INT4OID, INT4OID};
	Oid			int8_type[1] = {INT8OID};
	Oid			int4_type[1] = {INT4OID};
	Oid			answer_types[4] = {INT8OID, INT4OID, INT4OID, INT4OID};

	if (CloseFlowPlan != NULL)
		return;
	CloseFlowPlan = PrepareKept(
		"UPDATE dwarf.flow SET status = $2, state = $3, error = $4, finished_at = clock_timestamp()"
		" WHERE id = $1 AND status = 'running'",
		4, close_types);
	/*
	 * A few flows (a dwarf.run, a resume) are read one by one by primary
	 * key; many at once (a bulk create, a restart) with one statement run
	 * by ExecKeptByKeys.
	 */
	LoadFlowPlan = PrepareKept(LOAD_FLOWS_SQL("id = $1"), 1, int8_type);
	LoadFlowsPlan = PrepareKept(LOAD_FLOWS_SQL("id = ANY($1)"), 1, ids_type);
	ScanFlowsPlan = PrepareKept(SCAN_IDS_SQL, 2, scan_types);
	WakeTimesPlan = PrepareKept(WAKE_TIMES_SQL, 1, ids_type);
	LoadStepsPlan = PrepareKept(STEP_ROWS_SQL " ORDER BY step_id", 1, int8_type);
	LoadGraphPlan = PrepareKept(
		"SELECT definition, name, version FROM dwarf.graph WHERE id = $1",
		1, int4_type);
	ParkFlowPlan = PrepareKept(
		"UPDATE dwarf.flow SET status = 'interrupted', interrupt_payload = $2, state = $3"
		" WHERE id = $1 AND status = 'running'",
		3, park_types);
	ParkAncestorsPlan = PrepareKept(
		"WITH RECURSIVE up AS ("
		"  SELECT parent_id AS id FROM dwarf.flow WHERE id = $1"
		"  UNION ALL SELECT f.parent_id FROM dwarf.flow f JOIN up ON f.id = up.id"
		"   WHERE f.parent_id IS NOT NULL)"
		" UPDATE dwarf.flow f SET status = 'interrupted', interrupt_payload = $2,"
		"  state = dwarf.state_at(f.id)"
		" WHERE id IN (SELECT id FROM up) AND status = 'running'",
		3, park_types);
	DeleteFlowPlan = PrepareKept(
		"WITH f AS (DELETE FROM dwarf.flow WHERE id = $1 AND status = 'running'),"
		" s AS (DELETE FROM dwarf.step_log WHERE flow_id = $1) SELECT 1",
		1, int8_type);
	ChildClosedPlan = PrepareKept(
		"SELECT NOT EXISTS (SELECT 1 FROM dwarf.flow WHERE id = $1"
		" AND status IN ('running', 'interrupted'))",
		1, int8_type);
	OrphanPlan = PrepareKept(
		"UPDATE dwarf.flow SET status = 'cancelled', finished_at = clock_timestamp(),"
		" cancel_reason = 'parent flow ' || parent_id || ' is gone or closed'"
		" WHERE id = $1 AND status IN ('running', 'interrupted') RETURNING " CLOSED_FLOW_COLUMNS,
		1, int8_type);
	FailFlowPlan = PrepareKept(
		"UPDATE dwarf.flow SET status = 'failed', error = $2, finished_at = clock_timestamp()"
		" WHERE id = $1 AND status IN ('running', 'interrupted') RETURNING parent_id, "
		CLOSED_FLOW_COLUMNS,
		2, fail_types);
	ResumedPlan = PrepareKept(
		"UPDATE dwarf.flow SET resume_data = NULL WHERE id = $1",
		1, int8_type);
	StillRunsPlan = PrepareKept(
		"SELECT 1 FROM dwarf.flow WHERE id = $1 AND status = 'running' FOR SHARE",
		1, int8_type);
	AnswersPlan = PrepareKept(ANSWER_ROWS_SQL " WHERE flow_id = $1", 1, int8_type);
	DeleteAnswerPlan = PrepareKept(
		"DELETE FROM dwarf.answer WHERE flow_id = $1 AND token = $2 AND visits = $3"
		" AND attempt = $4",
		4, answer_types);
}

/* Deletes an external step's answer, recorded as its step. */
void
DeleteAnswer(int64 flow_id, int token_id, int visits, int attempt)
{
	Datum		args[4];

	args[0] = Int64GetDatum(flow_id);
	args[1] = Int32GetDatum(token_id);
	args[2] = Int32GetDatum(visits);
	args[3] = Int32GetDatum(attempt);
	if (SPI_execute_plan(DeleteAnswerPlan, args, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "dwarf: could not delete an answer of flow " INT64_FORMAT, flow_id);
}

/*
 * Hands one answer row (ANSWER_ROWS_SQL) to the branch of flow waiting for
 * it.  False when none waits for it: the branch moved on (the flow was
 * loaded again and its step offered anew) or is not at that step.
 */
static bool
TakeAnswerRow(FlowRun *flow, HeapTuple tup, TupleDesc desc)
{
	bool		isnull;
	int			token_id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	int			visits = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	int			attempt = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
	char	   *status = SPI_getvalue(tup, desc, 4);
	Token	   *token = FlowFindToken(flow, token_id);
	ExternalAnswer *answer;
	MemoryContext old;
	Datum		d;

	if (token == NULL || token->visits != visits || token->attempt != attempt ||
		flow->graph->nodes[token->node].kind == TASK_FUNCTION || token->parked ||
		token->answer != NULL)
		return false;
	old = MemoryContextSwitchTo(flow->cxt);
	answer = palloc0(sizeof(ExternalAnswer));
	answer->kind = strcmp(status, "completed") == 0 ? ANSWER_COMPLETED : ANSWER_FAILED;
	d = SPI_getbinval(tup, desc, 5, &isnull);
	answer->changes = isnull ? NULL : (Jsonb *) PG_DETOAST_DATUM_COPY(d);
	d = SPI_getbinval(tup, desc, 6, &isnull);
	answer->error = isnull ? NULL : (Jsonb *) PG_DETOAST_DATUM_COPY(d);
	answer->retryable = DatumGetBool(SPI_getbinval(tup, desc, 7, &isnull));
	answer->started = DatumGetTimestampTz(SPI_getbinval(tup, desc, 8, &isnull));
	answer->finished = DatumGetTimestampTz(SPI_getbinval(tup, desc, 9, &isnull));
	answer->in_table = true;
	MemoryContextSwitchTo(old);
	token->answer = answer;
	if (token->offered)
	{
		token->offered = false;
		flow->offered--;
	}
	return true;
}

/*
 * Hands the answers that outside workers gave to a flow's external steps
 * (dwarf.complete, dwarf.fail) to the branches waiting for them; the steps
 * that record them run in the next batch (step.c).  An answer for a step
 * the branch is no longer at (the flow moved on after a restart offered
 * the step again, say) is dropped.
 */
static void
TakeAnswers(FlowRun *flow)
{
	Datum		arg = Int64GetDatum(flow->id);
	uint64		i;

	if (SPI_execute_plan(AnswersPlan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read the answers of flow " INT64_FORMAT, flow->id);
	for (i = 0; i < SPI_processed; i++)
		if (!TakeAnswerRow(flow, SPI_tuptable->vals[i], SPI_tuptable->tupdesc))
		{
			bool		isnull;
			int			token_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
			int			visits = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull));
			int			attempt = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3, &isnull));

			ereport(DEBUG1,
					(errmsg("dwarf: dropping an answer for a step flow " INT64_FORMAT " is no longer at",
							flow->id)));
			DeleteAnswer(flow->id, token_id, visits, attempt);
		}
}

/*
 * Takes the answers of flows held in memory whose outside workers answered
 * (offers.c said so), in a transaction of its own: each answer goes to its
 * waiting branch, to be recorded by the next batch.  Returns the flows that
 * took one, to be queued.
 */
List *
LoadAnswers(int64 *ids, int n)
{
	Oid			types[1] = {INT8ARRAYOID};
	Datum		arg;
	Datum	   *datums = palloc(sizeof(Datum) * n);
	List	   *flows = NIL;
	MemoryContext outer = CurrentMemoryContext;
	uint64		i;
	int			j;

	for (j = 0; j < n; j++)
		datums[j] = Int64GetDatum(ids[j]);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "dwarf: taking answers of external steps");
	PreparePlans();
	arg = PointerGetDatum(construct_array(datums, n, INT8OID, 8, true, TYPALIGN_DOUBLE));
	if (AnswersOfPlan == NULL)
		AnswersOfPlan = PrepareKept(ANSWER_ROWS_SQL " WHERE flow_id = ANY($1)", 1, types);
	if (ExecKeptByKeys(AnswersOfPlan, &arg, true) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read the answers of external steps");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 10, &isnull));
		FlowRun    *flow = hash_search(Worker.flows, &id, HASH_FIND, NULL);

		if (flow && flow->status == FLOW_RUNNING &&
			TakeAnswerRow(flow, tup, SPI_tuptable->tupdesc))
		{
			MemoryContext old = MemoryContextSwitchTo(outer);

			flows = list_append_unique_ptr(flows, flow);
			MemoryContextSwitchTo(old);
		}
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(outer);
	pgstat_report_activity(STATE_IDLE, NULL);
	return flows;
}

/*
 * Does this flow still run?  Its row is locked against a change until the
 * transaction ends: a cancel (or an archive) from now on comes after it.
 */
bool
FlowStillRuns(int64 flow_id)
{
	Datum		arg = Int64GetDatum(flow_id);

	if (SPI_execute_plan(StillRunsPlan, &arg, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read flow " INT64_FORMAT, flow_id);
	return SPI_processed == 1;
}

/* Frees unused graph versions, the least recently used first, past the bound. */
static void
TrimGraphs(void)
{
	while (NUnused > DWARF_GRAPHS_KEPT)
	{
		GraphEntry *entry = dlist_container(GraphEntry, unused, dlist_pop_head_node(&Unused));

		NUnused--;
		MemoryContextDelete(entry->graph->cxt);
		hash_search(Graphs, &entry->id, HASH_REMOVE, NULL);
	}
}

/*
 * A loaded flow runs this graph version (GraphRelease when it goes): it
 * stays in the cache until none does.
 */
static void
GraphHold(Graph *graph)
{
	GraphEntry *entry = hash_search(Graphs, &graph->id, HASH_FIND, NULL);

	Assert(entry != NULL && entry->graph == graph);
	if (entry->flows++ == 0)
	{
		dlist_delete(&entry->unused);
		NUnused--;
	}
}

/* A loaded flow that ran this graph version went. */
static void
GraphRelease(Graph *graph)
{
	GraphEntry *entry = hash_search(Graphs, &graph->id, HASH_FIND, NULL);

	Assert(entry != NULL && entry->graph == graph && entry->flows > 0);
	if (--entry->flows == 0)
	{
		dlist_push_tail(&Unused, &entry->unused);	/* the most recent last */
		NUnused++;
		TrimGraphs();
	}
}

/*
 * A compiled graph version, from the cache or the table; NULL if there is
 * none.  Valid until the next call: hold it (GraphHold) to keep it longer.
 */
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
	{
		if (entry->flows == 0)
			dlist_move_tail(&Unused, &entry->unused);	/* used now */
		return entry->graph;
	}
	entry->graph = NULL;
	entry->flows = 0;

	if (SPI_execute_plan(LoadGraphPlan, &arg, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
	{
		hash_search(Graphs, &graph_id, HASH_REMOVE, NULL);
		return NULL;
	}
	def = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	PG_TRY();
	{
		entry->graph = GraphParse(DatumGetJsonbP(def), Worker.context, false);
	}
	PG_CATCH();
	{
		hash_search(Graphs, &graph_id, HASH_REMOVE, NULL);
		PG_RE_THROW();
	}
	PG_END_TRY();
	entry->graph->id = graph_id;
	entry->graph->name = MemoryContextStrdup(entry->graph->cxt,
											 SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2));
	entry->graph->version = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
														 SPI_tuptable->tupdesc, 3, &isnull));
	dlist_push_tail(&Unused, &entry->unused);
	NUnused++;
	TrimGraphs();				/* never this one: it is the most recent */
	return entry->graph;
}

/*
 * A function was created, replaced, dropped or had its privileges changed,
 * or a role or membership changed: look the tasks up and check again.
 */
static void
CallsInvalidated(Datum arg, int cacheid, uint32 hashvalue)
{
	HASH_SEQ_STATUS status;
	GraphEntry *entry;

	if (Graphs == NULL)
		return;
	hash_seq_init(&status, Graphs);
	while ((entry = hash_seq_search(&status)) != NULL)
		if (entry->graph &&
			(cacheid != PROCOID || GraphCallsFunction(entry->graph, hashvalue)))
			entry->graph->prepared = false;
}

void
DropFlow(FlowRun *flow)
{
	int64		id = flow->id;

	GraphRelease(flow->graph);
	FlowRunFree(flow);
	hash_search(Worker.flows, &id, HASH_REMOVE, NULL);
}

void
NoteLoad(int64 flow_id, bool replay)
{
	MemoryContext old = MemoryContextSwitchTo(Worker.context);
	LoadItem   *item = palloc(sizeof(LoadItem));

	item->flow_id = flow_id;
	item->replay = replay;
	Worker.to_load = lappend(Worker.to_load, item);
	MemoryContextSwitchTo(old);
}

/*
 * Moves a flow on by one recorded step, a row in the column order of
 * LoadStepsPlan.  Returns false when the row names a token the flow never
 * made (then replay stops there).
 */
bool
ReplayStepRow(FlowRun *flow, HeapTuple tup, TupleDesc desc)
{
	bool		isnull;
	int			token_id = DatumGetInt32(SPI_getbinval(tup, desc, Anum_steprow_token, &isnull));
	char	   *status = SPI_getvalue(tup, desc, Anum_steprow_status);
	char	   *goto_task = SPI_getvalue(tup, desc, Anum_steprow_goto_task);
	Token	   *token = FlowFindToken(flow, token_id);
	StepOutcome outcome = {0};
	Datum		d;

	if (token == NULL)
	{
		ereport(WARNING,
				(errmsg("dwarf: a step of flow " INT64_FORMAT " names token %d, which the graph never made",
						flow->id, token_id)));
		return false;
	}
	outcome.kind = strcmp(status, "completed") == 0 ? OUTCOME_OK :
		strcmp(status, "retry") == 0 ? OUTCOME_RETRY :
		strcmp(status, "interrupted") == 0 ? OUTCOME_INTERRUPT :
		strcmp(status, "resumed") == 0 ? OUTCOME_RESUMED :
		strcmp(status, "waiting") == 0 ? OUTCOME_WAITING : OUTCOME_ERROR;
	d = SPI_getbinval(tup, desc, Anum_steprow_signal, &isnull);
	outcome.signal = isnull ? NULL : DatumGetJsonbP(d);
	outcome.goto_node = goto_task ? GraphNodeByName(flow->graph, goto_task) : -1;
	d = SPI_getbinval(tup, desc, Anum_steprow_changes, &isnull);
	outcome.changes = isnull ? JsonbEmptyObject() : DatumGetJsonbP(d);
	d = SPI_getbinval(tup, desc, Anum_steprow_error, &isnull);
	outcome.error = isnull ? JsonbEmptyObject() : DatumGetJsonbP(d);
	d = SPI_getbinval(tup, desc, Anum_steprow_wake_at, &isnull);
	outcome.wake_at = isnull ? 0 : DatumGetTimestampTz(d);
	if (DatumGetInt32(SPI_getbinval(tup, desc, Anum_steprow_attempt, &isnull)) == 1)
		token->first_started = DatumGetTimestampTz(SPI_getbinval(tup, desc, Anum_steprow_started_at, &isnull));
	FlowAdvance(flow, token, &outcome);
	return true;
}

/* Replays a flow's recorded steps, in order, to rebuild where it stands. */
static void
ReplaySteps(FlowRun *flow)
{
	Datum		arg = Int64GetDatum(flow->id);
	uint64		i;
	SPITupleTable *tuptable;
	MemoryContext row_cxt;
	MemoryContext old;

	if (SPI_execute_plan(LoadStepsPlan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read the steps of flow " INT64_FORMAT, flow->id);
	tuptable = SPI_tuptable;
	/* what a row's replay reads is dropped after it: the flow keeps its own */
	row_cxt = AllocSetContextCreate(CurrentMemoryContext, "dwarf replay row",
									ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(row_cxt);
	for (i = 0; i < SPI_processed && flow->status == FLOW_RUNNING; i++)
	{
		if (!ReplayStepRow(flow, tuptable->vals[i], tuptable->tupdesc))
			break;
		MemoryContextReset(row_cxt);
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(row_cxt);
}

/*
 * Writes a closed flow's row: its status, final state and error.  A flow
 * created with delete_on_completion that completed is deleted instead.
 */
void
WriteClose(FlowRun *flow)
{
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	if (flow->parent_id != 0)
		NoteOnCommit(flow->parent_id, NOTE_RELOAD_FLOW, false);
	if (flow->offered > 0)		/* external steps no one will answer now */
		OfferWithdrawFlow(MyDatabaseId, flow->id);
	if (flow->delete_on_completion && flow->status == FLOW_COMPLETED)
	{
		args[0] = Int64GetDatum(flow->id);
		if (SPI_execute_plan(DeleteFlowPlan, args, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not delete flow " INT64_FORMAT, flow->id);
		StatsFlowClosed(flow->graph->id, flow->graph->name, STATS_COMPLETED, flow->created_at);
		return;
	}

	/*
	 * Counted when the row is written; RowsCloseFlow also says true when a
	 * cancel committed first (the row is no longer running), which then
	 * counts twice, once as cancelled.
	 */
	if (RowsCloseFlow(flow->id, flow->status == FLOW_COMPLETED, flow->final_state, flow->error))
	{
		StatsFlowClosed(flow->graph->id, flow->graph->name,
						flow->status == FLOW_COMPLETED ? STATS_COMPLETED : STATS_FAILED,
						flow->created_at);
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
	if (SPI_processed == 1)
		StatsFlowClosed(flow->graph->id, flow->graph->name,
						flow->status == FLOW_COMPLETED ? STATS_COMPLETED : STATS_FAILED,
						flow->created_at);
}

/* Marks the flow's row interrupted, with a parked token's payload and state. */
void
ParkRow(FlowRun *flow, Token *token)
{
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};

	args[0] = Int64GetDatum(flow->id);
	if (token->payload)
		args[1] = JsonbPGetDatum(token->payload);
	else
		nulls[1] = 'n';
	args[2] = JsonbPGetDatum(FlowTokenState(flow, token));
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
	dlist_iter	iter;

	foreach_token(iter, flow)
	{
		Token	   *token = iter_token(iter);

		if (token->parked && token->child == 0)
			return token;
	}
	return NULL;
}

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

/* A flow's row as LoadFlowsPlan reads it (and InsertFlowRow returns it). */
void
FlowRowFromTuple(HeapTuple tup, TupleDesc desc, FlowRow *row)
{
	bool		isnull;
	Datum		d;

	memset(row, 0, sizeof(FlowRow));
	row->id = DatumGetInt64(SPI_getbinval(tup, desc, Anum_flowrow_id, &isnull));
	row->graph_id = DatumGetInt32(SPI_getbinval(tup, desc, Anum_flowrow_graph_id, &isnull));
	row->owner = DatumGetObjectId(SPI_getbinval(tup, desc, Anum_flowrow_owner, &isnull));
	row->priority = DatumGetInt32(SPI_getbinval(tup, desc, Anum_flowrow_priority, &isnull));
	row->input = DatumGetJsonbP(SPI_getbinval(tup, desc, Anum_flowrow_input, &isnull));
	d = SPI_getbinval(tup, desc, Anum_flowrow_resume_data, &isnull);
	row->resume_data = isnull ? NULL : DatumGetJsonbP(d);
	d = SPI_getbinval(tup, desc, Anum_flowrow_baggage, &isnull);
	row->baggage = isnull ? NULL : DatumGetJsonbP(d);
	row->fairness_key = SPI_getvalue(tup, desc, Anum_flowrow_fairness_key);
	row->fairness_weight = DatumGetInt32(SPI_getbinval(tup, desc, Anum_flowrow_fairness_weight, &isnull));
	d = SPI_getbinval(tup, desc, Anum_flowrow_time_budget_ms, &isnull);
	row->time_budget_ms = isnull ? 0 : DatumGetInt64(d);
	row->delete_on_completion = DatumGetBool(SPI_getbinval(tup, desc, Anum_flowrow_delete_on_completion, &isnull));
	row->start_task = SPI_getvalue(tup, desc, Anum_flowrow_start_task);
	d = SPI_getbinval(tup, desc, Anum_flowrow_parent_id, &isnull);
	row->parent_id = isnull ? 0 : DatumGetInt64(d);
	row->orphan = DatumGetBool(SPI_getbinval(tup, desc, Anum_flowrow_orphan, &isnull));
	d = SPI_getbinval(tup, desc, Anum_flowrow_root_id, &isnull);
	row->root_id = isnull ? 0 : DatumGetInt64(d);
	row->created_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, Anum_flowrow_created_at, &isnull));
}

/*
 * Puts a flow in memory from its row (and, with replay, its steps).
 * Returns the flow, or NULL when it cannot run.
 */
static FlowRun *
AddFlow(const FlowRow *row, bool replay)
{
	int64		id = row->id;
	Graph	   *graph = GetGraph(row->graph_id);
	bool		found;
	FlowRun    *flow;
	MemoryContext old;

	/*
	 * A child whose parent was cancelled (or deleted) before the child was
	 * committed missed the cancel's cascade: it goes the same way now.
	 */
	if (row->orphan)
	{
		Datum		arg = Int64GetDatum(id);

		if (SPI_execute_plan(OrphanPlan, &arg, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "dwarf: could not cancel orphaned flow " INT64_FORMAT, id);
		StatsClosedRows(1, STATS_CANCELLED);
		return NULL;
	}
	if (graph == NULL)
	{
		/*
		 * Its graph version is not there: it was defined in a transaction
		 * that rolled back (dwarf.run commits its create on its own).  The
		 * flow can never run: fail it.
		 */
		FailFlowRow(id, psprintf("graph version %d of this flow does not exist", row->graph_id));
		return NULL;
	}
	flow = hash_search(Worker.flows, &id, HASH_ENTER, &found);
	if (found)
		return flow;
	FlowsPeak = Max(FlowsPeak, hash_get_num_entries(Worker.flows));
	FlowRunCreate(flow, graph, GraphStartNode(graph, row->start_task), row->input, Worker.context);
	GraphHold(graph);
	flow->owner = row->owner;
	flow->priority = row->priority;
	old = MemoryContextSwitchTo(flow->cxt);
	flow->baggage = row->baggage ? (Jsonb *) PG_DETOAST_DATUM_COPY(JsonbPGetDatum(row->baggage)) : NULL;
	flow->fairness_key = row->fairness_key ? pstrdup(row->fairness_key) : NULL;
	MemoryContextSwitchTo(old);
	flow->fairness_weight = row->fairness_weight;
	flow->time_budget_ms = row->time_budget_ms;
	flow->delete_on_completion = row->delete_on_completion;
	flow->parent_id = row->parent_id;
	flow->root_id = row->root_id ? row->root_id : row->id;
	/* a row the worker wrote itself has its transaction's start (rows.c) */
	flow->created_at = row->created_at ? row->created_at : GetCurrentTransactionStartTimestamp();
	if (replay)
	{
		dlist_iter	iter;

		ReplaySteps(flow);

		/* A step that waits for a child that has closed (or gone) runs again. */
		foreach_token(iter, flow)
		{
			Token	   *token = iter_token(iter);
			Datum		child = Int64GetDatum(token->child);
			bool		isnull;

			if (token->child == 0)
				continue;
			if (SPI_execute_plan(ChildClosedPlan, &child, NULL, true, 1) != SPI_OK_SELECT)
				elog(ERROR, "dwarf: could not read child flow " INT64_FORMAT, token->child);
			if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
			{
				token->parked = false;
				token->child = 0;
			}
		}
		if (graph->has_external && flow->status == FLOW_RUNNING)
			TakeAnswers(flow);
	}
	pg_atomic_fetch_add_u64(&Worker.slot->flows_loaded, 1);
	return flow;
}

/*
 * Puts in memory a flow this worker has just created, from its row (what
 * InsertFlowRow returned, or what InsertFlowDirect wrote).  Returns NULL
 * when it cannot run.
 */
FlowRun *
TakeInFlow(const FlowRow *row)
{
	Graph	   *graph = GetGraph(row->graph_id);

	StatsFlowCreated(row->graph_id, graph ? graph->name : NULL);
	return AddFlow(row, false);
}

/*
 * Puts in memory the flows of the last load statement's rows.  Adds the
 * ids of those that cannot load to failed, and the flows found closed
 * (their close just written) to *closed, in outer.
 */
static void
TakeLoadedRows(bool any_replay, MemoryContext outer, int64 *failed, int *nfailed, List **closed)
{
	SPITupleTable *tuptable = SPI_tuptable;
	uint64		count = SPI_processed;
	uint64		i;

	for (i = 0; i < count; i++)
	{
		FlowRow		row;
		FlowRun    *flow;

		FlowRowFromTuple(tuptable->vals[i], tuptable->tupdesc, &row);
		flow = AddFlow(&row, any_replay);
		if (flow == NULL)
		{
			failed[(*nfailed)++] = row.id;
			continue;
		}
		/*
		 * A runner reads the flow only to run its one step: resumes and
		 * closes found on the way are the owning worker's to write.
		 */
		if (Worker.is_runner)
			continue;
		if (row.resume_data)
			ApplyResume(flow, row.resume_data);
		if (flow->status != FLOW_RUNNING)
		{
			MemoryContext old;

			WriteClose(flow);
			old = MemoryContextSwitchTo(outer);
			*closed = lappend(*closed, flow);
			MemoryContextSwitchTo(old);
		}
	}
}

/*
 * Reads when each of the n flows listed can next run (WAKE_TIMES_SQL):
 * those that can run soon are listed to load, those that sleep longer are
 * remembered with the time to load them (queue.c), and those that wait for
 * a resume or a child are left to the note that will come.
 */
static void
SortOutFlows(Datum *ids, int n)
{
	TimestampTz soon = GetCurrentTimestamp() + (TimestampTz) DWARF_EVICT_AFTER_MS * 1000;
	Datum		arg = PointerGetDatum(construct_array(ids, n, INT8OID, 8, true, TYPALIGN_DOUBLE));
	uint64		i;

	if (ExecKeptByKeys(WakeTimesPlan, &arg, true) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read when flows wake");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
		TimestampTz wake = DatumGetTimestampTz(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull));

		if (TIMESTAMP_IS_NOEND(wake))
			continue;
		if (wake <= soon)
			NoteLoad(id, true);
		else
			SleeperAdd(id, wake - (TimestampTz) DWARF_WAKE_AHEAD_MS * 1000);
	}
	SPI_freetuptable(SPI_tuptable);
	pfree(DatumGetPointer(arg));
}

/* Orders flow ids, for bsearch. */
static int
CompareIds(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : (x > y ? 1 : 0);
}

/*
 * Finds the running or interrupted flows of ours that are neither in
 * memory nor remembered as sleepers (a worker that starts, or recovers,
 * remembers none; after a note ring's overflow, those are the flows whose
 * notes it may have missed), and sorts them out (SortOutFlows).  The ids
 * are read through a cursor, a batch at a time, so that the scan's memory
 * does not grow with the number of flows.
 */
static void
ScanFlows(void)
{
	Datum		args[2] = {Int32GetDatum(dwarf_workers), Int32GetDatum(Worker.slot->index)};
	int			nknown;
	int64	   *known = SleeperIds(&nknown);
	Datum	   *ids = palloc(sizeof(Datum) * SCAN_FETCH);
	int			n = 0;
	Portal		portal;

	qsort(known, nknown, sizeof(int64), CompareIds);
	portal = SPI_cursor_open(NULL, ScanFlowsPlan, args, NULL, true);
	for (;;)
	{
		SPITupleTable *tuptable;
		uint64		count;
		uint64		i;

		SPI_cursor_fetch(portal, true, SCAN_FETCH);
		tuptable = SPI_tuptable;
		count = SPI_processed;
		for (i = 0; i < count; i++)
		{
			bool		isnull;
			int64		id = DatumGetInt64(SPI_getbinval(tuptable->vals[i], tuptable->tupdesc, 1, &isnull));

			if (hash_search(Worker.flows, &id, HASH_FIND, NULL) != NULL ||
				(nknown > 0 && bsearch(&id, known, nknown, sizeof(int64), CompareIds)))
				continue;
			ids[n++] = Int64GetDatum(id);
			if (n == SCAN_FETCH)
			{
				SortOutFlows(ids, n);
				n = 0;
			}
		}
		SPI_freetuptable(tuptable);
		if (count == 0)
			break;
	}
	SPI_cursor_close(portal);
	if (n > 0)
		SortOutFlows(ids, n);
	pfree(ids);
	pfree(known);
}

/*
 * Makes Worker.flows anew when it holds far fewer flows than it once did: a
 * hash table keeps the buckets and entries it grew to (a burst of a
 * million flows would hold their space for good).  Only between batches,
 * when no one holds a pointer to a flow: the flows move to the new table.
 */
void
ShrinkFlowTable(void)
{
	long		count = hash_get_num_entries(Worker.flows);
	HTAB	   *flows;
	HASHCTL		ctl;
	HASH_SEQ_STATUS seq;
	FlowRun    *flow;

	if (FlowsPeak < 8 * DWARF_LOAD_CHUNK || count > FlowsPeak / 8)
		return;
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(FlowRun);
	ctl.hcxt = Worker.context;
	flows = hash_create("dwarf flows", Max(count, 1024), &ctl,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	hash_seq_init(&seq, Worker.flows);
	while ((flow = hash_seq_search(&seq)) != NULL)
	{
		FlowRun    *moved = hash_search(flows, &flow->id, HASH_ENTER, NULL);

		memcpy(moved, flow, sizeof(FlowRun));

		/*
		 * The list of its tokens is circular through its head, which has
		 * moved: its first and last tokens point at the old one.
		 */
		if (dlist_is_empty(&flow->tokens))
			dlist_init(&moved->tokens);
		else
		{
			moved->tokens.head.next->prev = &moved->tokens.head;
			moved->tokens.head.prev->next = &moved->tokens.head;
		}
	}
	hash_destroy(Worker.flows);
	Worker.flows = flows;
	FlowsPeak = count;
}

/*
 * Loads the flows listed in Worker.to_load, up to max of them
 * (after a full scan, those of ours that can run soon, see ScanFlows).
 * Returns what it took, LoadItems (the caller frees them): the caller
 * queues those in memory, as the store queues nothing.
 */
List *
LoadFlows(int max)
{
	List	   *items;
	List	   *closed = NIL;	/* in outer: used after the commit */
	int64	   *failed = NULL;	/* flows that could not load, in outer */
	int			nfailed = 0;
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

	if (Worker.full_scan)
	{
		Worker.full_scan = false;
		ScanFlows();
	}

	/*
	 * Taken only now: the scan above adds to Worker.to_load (in
	 * Worker.context).  A chunk at a time, so that a worker with many flows
	 * to load (after a restart, a bulk create) holds only a chunk more
	 * than it runs: the sleepers among them leave memory again as soon as
	 * they are loaded.
	 */
	if (list_length(Worker.to_load) <= max)
	{
		items = Worker.to_load;
		Worker.to_load = NIL;
	}
	else
	{
		MemoryContext old = MemoryContextSwitchTo(Worker.context);

		items = list_copy_head(Worker.to_load, max);
		Worker.to_load = list_delete_first_n(Worker.to_load, max);
		MemoryContextSwitchTo(old);
	}

	ids = palloc(sizeof(Datum) * Max(list_length(items), 1));
	foreach(lc, items)
	{
		LoadItem   *item = lfirst(lc);

		if (hash_search(Worker.flows, &item->flow_id, HASH_FIND, NULL) != NULL)
			continue;
		ids[n++] = Int64GetDatum(item->flow_id);
		any_replay |= item->replay;
	}

	failed = MemoryContextAlloc(outer, sizeof(int64) * Max(n, 1));
	if (n > LOAD_ONE_BY_ONE)
	{
		Datum		arg = PointerGetDatum(construct_array(ids, n, INT8OID, 8, true, TYPALIGN_DOUBLE));

		if (ExecKeptByKeys(LoadFlowsPlan, &arg, false) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not load flows");
		TakeLoadedRows(any_replay, outer, failed, &nfailed, &closed);
	}
	else
	{
		int			i;

		for (i = 0; i < n; i++)
		{
			if (SPI_execute_plan(LoadFlowPlan, &ids[i], NULL, false, 0) != SPI_OK_SELECT)
				elog(ERROR, "dwarf: could not load flow " INT64_FORMAT, DatumGetInt64(ids[i]));
			TakeLoadedRows(any_replay, outer, failed, &nfailed, &closed);
		}
	}

	RowsEnd();
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(outer);	/* the commit left us in TopMemoryContext */
	pgstat_report_activity(STATE_IDLE, NULL);

	DwarfWakeWaiters(failed, nfailed);
	foreach(lc, closed)
	{
		FlowRun    *flow = lfirst(lc);
		int64		id = flow->id;

		DwarfWakeWaiters(&id, 1);
		DropFlow(flow);
	}
	return items;
}

/*
 * Marks a flow failed with error, by its row alone (no step is recorded),
 * and has its parent, if any, reload it.  For flows that cannot run or
 * whose step cannot be recorded.
 */
void
FailFlowRow(int64 id, const char *error)
{
	Datum		args[2] = {Int64GetDatum(id), CStringGetTextDatum(error)};
	bool		isnull;
	Datum		parent;

	if (SPI_execute_plan(FailFlowPlan, args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "dwarf: could not fail flow " INT64_FORMAT, id);
	if (SPI_processed == 0)
		return;
	StatsClosedRows(2, STATS_FAILED);
	NoteOnCommit(id, NOTE_RELOAD_FLOW, true);	/* wakes its waiters */
	parent = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		NoteOnCommit(DatumGetInt64(parent), NOTE_RELOAD_FLOW, false);
}

/* Appends the step to the step log (dwarf.step), in the batch's transaction. */
void
RecordStep(FlowRun *flow, int token_id, int node, int attempt, StepOutcome *outcome,
		   TimestampTz started, TimestampTz finished)
{
	static const char *const status[] = {
		"completed", "failed", "retry", "interrupted", "resumed", "waiting"
	};
	Graph	   *graph = flow->graph;
	Datum		values[SC_COUNT];
	bool		nulls[SC_COUNT] = {0};

	values[SC_FLOW_ID] = Int64GetDatum(flow->id);
	/*
	 * A step id carries its flow's shard in bits 48 to 62, as the flow id
	 * does (taken from the flow, not from dwarf.shard_id, which could change
	 * under a running flow and reorder its steps), so that a step id alone
	 * names the shard that holds it.
	 */
	values[SC_STEP_ID] = Int64GetDatum((flow->id & ~((INT64CONST(1) << DWARF_SHARD_SHIFT) - 1)) |
							  NextStepId());
	values[SC_TOKEN] = Int32GetDatum(token_id);
	values[SC_TASK] = CStringGetTextDatum(graph->nodes[node].name);
	values[SC_STATUS] = CStringGetTextDatum(status[outcome->kind]);
	values[SC_ATTEMPT] = Int32GetDatum(attempt);
	values[SC_STARTED_AT] = TimestampTzGetDatum(started);
	values[SC_FINISHED_AT] = TimestampTzGetDatum(finished);
	/* an attempt retried after an error has none, as a failed step */
	if (outcome->kind == OUTCOME_OK ||
		(outcome->kind == OUTCOME_RETRY && outcome->error == NULL))
		values[SC_CHANGES] = JsonbPGetDatum(outcome->changes);
	else
		nulls[SC_CHANGES] = true;
	if (outcome->kind == OUTCOME_OK && outcome->goto_node >= 0)
		values[SC_GOTO_TASK] = CStringGetTextDatum(graph->nodes[outcome->goto_node].name);
	else
		nulls[SC_GOTO_TASK] = true;
	values[SC_WAKE_AT] = TimestampTzGetDatum(outcome->wake_at);
	nulls[SC_WAKE_AT] = outcome->wake_at == 0;
	values[SC_SIGNAL] = JsonbPGetDatum(outcome->signal);
	nulls[SC_SIGNAL] = outcome->signal == NULL;
	/* a failed step's error, or the one its retried attempt failed with */
	values[SC_ERROR] = JsonbPGetDatum(outcome->error);
	nulls[SC_ERROR] = outcome->error == NULL ||
		(outcome->kind != OUTCOME_ERROR && outcome->kind != OUTCOME_RETRY);

	RowsInsertStep(values, nulls);
	if (outcome->kind != OUTCOME_RESUMED)	/* a resume's row ran no task */
		StatsStep(graph->id, graph->name, node, graph->nodes[node].name,
				  outcome->kind == OUTCOME_ERROR ? STATS_STEP_FAILED :
				  outcome->kind == OUTCOME_RETRY ? STATS_STEP_RETRIED : STATS_STEP,
				  started, finished);
}

/* Sets up the graph cache; once, when the worker starts. */
void
StoreInit(void)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(int);
	ctl.entrysize = sizeof(GraphEntry);
	ctl.hcxt = Worker.context;
	Graphs = hash_create("dwarf graphs", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	CacheRegisterSyscacheCallback(PROCOID, CallsInvalidated, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, CallsInvalidated, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, CallsInvalidated, (Datum) 0);
	CacheRegisterSyscacheCallback(NAMESPACEOID, CallsInvalidated, (Datum) 0);
}

/*
 * Ends a worker's transaction after an error: the error is copied into
 * cxt (and returned), the transaction rolled back, and what rows.c had open
 * forgotten (the abort closed it).
 */
ErrorData *
AbortAfterError(MemoryContext cxt)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	AbortCurrentTransaction();
	RowsForget();
	return edata;
}
