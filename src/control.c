/*
 * control.c
 *		The functions a task calls from inside its step: dwarf.goto, retry,
 *		sleep, interrupt, subgraph, step_key, baggage and flow_id.  They act
 *		on the step the worker is running (DwarfCurrentStep), recording what
 *		the task asked for, which the worker applies when the task returns;
 *		anywhere else they raise an error.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"
#include "graph.h"
#include "flowrun.h"
#include "json.h"
#include "flows.h"
#include "names.h"

/* The step being run by this process, or NULL outside a task. */
StepContext *DwarfCurrentStep = NULL;

/* The step being run; outside a task, an error naming the function called. */
static StepContext *
CurrentStep(const char *function)
{
	if (DwarfCurrentStep == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s can only be called inside a dwarf task", function),
				 errhint("dwarf's workers call it while running a step of a flow.")));
	return DwarfCurrentStep;
}

DWARF_FUNCTION(dwarf_goto);

/* dwarf.goto(task): when this task returns, take its goto edge to task. */
Datum
dwarf_goto(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.goto()");
	char	   *target = text_to_cstring(PG_GETARG_TEXT_PP(0));
	Graph	   *graph = step->flow->graph;
	int			node = GraphNodeByName(graph, target);

	if (node < 0 || GraphGotoEdge(graph, step->token->node, node) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("task \"%s\" has no goto edge to \"%s\"",
						graph->nodes[step->token->node].name, target),
				 errhint("Declare it in the graph: {\"from\": \"%s\", \"to\": \"%s\", \"goto\": true}.",
						 graph->nodes[step->token->node].name, target)));
	step->goto_node = node;
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_step_key);

/*
 * The tag of this database's incarnation (dwarf.new_incarnation), or NULL
 * on a server that never took one.
 */
char *
IncarnationTag(void)
{
	static LocalTransactionId read_in = InvalidLocalTransactionId;
	static char tag[64];		/* "" for none */

	/* Read once a transaction: a batch's steps share what it read. */
	if (read_in != ProcLocalXid(MyProc))
	{
		tag[0] = '\0';
		SPI_connect();
		if (SPI_execute("SELECT tag FROM dwarf.incarnation", true, 1) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not read dwarf.incarnation");
		if (SPI_processed == 1)
			strlcpy(tag, SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1),
					sizeof(tag));
		SPI_finish();
		read_in = ProcLocalXid(MyProc);
	}
	return tag[0] ? tag : NULL;
}

/*
 * dwarf.step_key(): flow, branch, how many steps that branch took before,
 * and task, after the database's incarnation tag if it took one (a copy
 * that runs apart from its source).  Every attempt of the step, before or
 * after a crash, gets the same key; a loop back to the same task gets a new
 * one.
 */
Datum
dwarf_step_key(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.step_key()");
	char	   *tag = IncarnationTag();
	char	   *key = psprintf(INT64_FORMAT "-%d-%d-%s",
							   step->flow->id, step->token->id, step->token->visits,
							   step->flow->graph->nodes[step->token->node].name);

	if (tag)
		key = psprintf("%s/%s", tag, key);
	PG_RETURN_TEXT_P(cstring_to_text(key));
}

DWARF_FUNCTION(dwarf_flow_id);

/* dwarf.flow_id(): the flow this step belongs to. */
Datum
dwarf_flow_id(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(CurrentStep("dwarf.flow_id()")->flow->id);
}

DWARF_FUNCTION(dwarf_retry);

/*
 * dwarf.retry(initial, factor, max, give_up_after): asks for this step to
 * run again after min(initial * factor^(attempt-1), max), or after
 * dwarf.min_retry_delay if that is longer: a task that retries without end
 * must not write rows as fast as the worker can run it (a shorter delay is
 * raised, not refused, as a task cannot know the server's setting; the
 * step row's wake_at shows the delay taken).  Returns false,
 * asking for nothing, once that would end past give_up_after from the start
 * of the first attempt (NULL or zero: no limit); the task then raises.
 */
Datum
dwarf_retry(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.retry()");
	int64		initial,
				max,
				horizon = 0,
				delay;
	double		factor,
				backoff;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dwarf.retry needs initial, factor and max")));
	initial = IntervalMicros(PG_GETARG_INTERVAL_P(0), "initial");
	factor = PG_GETARG_FLOAT8(1);
	max = IntervalMicros(PG_GETARG_INTERVAL_P(2), "max");
	if (!PG_ARGISNULL(3))
		horizon = IntervalMicros(PG_GETARG_INTERVAL_P(3), NULL);
	if (!(factor >= 1.0) || isinf(factor))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry factor must be a finite number of at least 1")));

	backoff = (double) initial * pow(factor, step->token->attempt - 1);
	delay = backoff >= (double) max ? max : (int64) backoff;
	delay = Max(delay, (int64) dwarf_min_retry_delay * 1000);
	if (horizon > 0 &&
		GetCurrentTimestamp() + delay - step->token->first_started > horizon)
		PG_RETURN_BOOL(false);
	if (!step->retry)
		step->delay_us += delay;
	step->retry = true;
	PG_RETURN_BOOL(true);
}

DWARF_FUNCTION(dwarf_sleep);

/*
 * dwarf.sleep(duration): what follows this step runs only after duration.
 * The flow holds no worker while it waits, and the wait survives restarts.
 * Several calls (and a retry's backoff) add up.  One sleep is at most
 * DWARF_MAX_SLEEP, and what a step's calls add up to at most
 * DWARF_MAX_INTERVAL.
 */
Datum
dwarf_sleep(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.sleep()");
	int64		us = IntervalMicros(PG_GETARG_INTERVAL_P(0), "sleep duration");

	if (us > DWARF_MAX_SLEEP)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sleep duration is longer than 366 days, the most dwarf.sleep() waits"),
				 errhint("A month counts as 30 days, so '1 year' is 360 days.")));
	if (step->delay_us + us > DWARF_MAX_INTERVAL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("this step's sleeps and backoff add up to more than 100 years")));
	step->delay_us += us;
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_interrupt);

/*
 * dwarf.interrupt(payload): NULL the first time; once the task returns, the
 * flow parks as interrupted with the payload.  After dwarf.resume(flow,
 * data) the task runs again and the same call (the same in call order)
 * returns data, as if the first call had waited for it.
 */
Datum
dwarf_interrupt(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.interrupt()");
	int			call = step->interrupt_calls++;
	MemoryContext old;

	if (call < list_length(step->token->resumes))
	{
		Jsonb	   *data = list_nth(step->token->resumes, call);

		PG_RETURN_DATUM(datumCopy(JsonbPGetDatum(data), false, -1));
	}
	if (!step->interrupted)
	{
		step->interrupted = true;
		old = MemoryContextSwitchTo(step->cxt);
		step->payload = PG_ARGISNULL(0) ? NULL :
			(Jsonb *) PG_DETOAST_DATUM_COPY(PG_GETARG_DATUM(0));
		MemoryContextSwitchTo(old);
	}
	PG_RETURN_NULL();
}

DWARF_FUNCTION(dwarf_baggage);

/* dwarf.baggage(): the JSON the flow was created with, or NULL. */
Datum
dwarf_baggage(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.baggage()");

	if (step->flow->baggage == NULL)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(datumCopy(JsonbPGetDatum(step->flow->baggage), false, -1));
}

/*
 * Counts a new flow in the tree whose top is root (flows.c says how), and
 * refuses it past dwarf.max_tree_flows: the call fails, and the top's
 * worker is told at once (not at commit: this transaction is about to
 * roll back) to fail the whole tree.  The UPDATE waits for, and then sees,
 * a cancel of the top; a top that is no longer open starts no child.  The
 * caller is connected to SPI, as the extension owner.
 */
static void
CountTreeFlow(int64 root, const char *graph)
{
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(root)};
	bool		isnull;
	int64		flows;

	Exec("UPDATE dwarf.flow SET tree_flows = tree_flows + 1"
		 " WHERE id = $1 AND status IN ('running', 'interrupted') RETURNING tree_flows",
		 1, types, args, NULL, SPI_OK_UPDATE_RETURNING);
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("subgraph \"%s\" cannot start: flow " INT64_FORMAT ", the top of this flow's tree, has closed",
						graph, root),
				 errdetail("The tree was cancelled or failed; it starts no new flow.")));
	flows = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (flows > dwarf_max_tree_flows)
	{
		DwarfWorkerSlot *slot = DwarfOwnerSlot(MyDatabaseId, root);

		if (slot)
			(void) DwarfPushNote(slot, root, NOTE_TREE_CAP);
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("subgraph \"%s\" would be flow %d of the tree of flow " INT64_FORMAT ", past the %d dwarf.max_tree_flows allows",
						graph, (int) flows, root, dwarf_max_tree_flows),
				 errdetail("Flow " INT64_FORMAT " fails, and every flow of its tree is cancelled.", root),
				 errhint("End the recursion in the task, or ask a superuser to raise dwarf.max_tree_flows.")));
	}
}

/*
 * Starts the child flow of a dwarf.subgraph call, named by key, if the
 * parents above it leave room; returns its id.  The child inherits the
 * parent's owner and priority (a priority below 0 only while the owner
 * may have one), and names the top of the tree in root_id.  The caller is
 * connected to SPI.
 */
static int64
StartChildFlow(FlowRun *flow, const char *graph, char *key, Jsonb *input)
{
	const char *keys[3] = {"parent_id", "parent_key", "root_id"};
	JsonbValue	values[3];
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(flow->id)};
	bool		isnull;
	int32		graph_id;
	bool		is_new;
	int64		child;
	int64		root;
	Datum		d;
	SavedUser	saved;

	/* Each child is one level deeper than its parent: bounded. */
	if (SPI_execute_with_args("WITH RECURSIVE up AS ("
							  "  SELECT parent_id FROM dwarf.flow WHERE id = $1"
							  "  UNION ALL SELECT f.parent_id FROM dwarf.flow f"
							  "   JOIN up ON f.id = up.parent_id)"
							  " SELECT count(parent_id) FROM up",
							  1, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not count the parents of flow " INT64_FORMAT, flow->id);
	if (DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull))
		>= DWARF_MAX_DEPTH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("subgraph \"%s\" would nest flows more than %d deep", graph,
						DWARF_MAX_DEPTH),
				 errhint("A task that starts a subgraph of its own graph needs a condition that ends the recursion.")));
	CheckPriorityOf(flow->owner, flow->priority, "dwarf.subgraph");
	/* The name means what it means to the flow's owner, not to its graph's definer. */
	graph_id = ResolveGraph(cstring_to_text(graph), flow->owner, false);

	/*
	 * The top of the tree first, then the parent: a cancel takes them in
	 * that order (dwarf_cancel).  The parent's row locked FOR SHARE makes
	 * a cancel of it (or of a flow above it) wait for this transaction, and
	 * makes this one see a cancel that came first.
	 */
	saved = BecomeOwner();
	Exec("SELECT root_id FROM dwarf.flow WHERE id = $1", 1, types, args, NULL, SPI_OK_SELECT);
	d = SPI_processed == 1 ?
		SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull) : (Datum) 0;
	root = (SPI_processed == 1 && !isnull) ? DatumGetInt64(d) : flow->id;
	CountTreeFlow(root, graph);
	if (root != flow->id)
	{
		Exec("SELECT 1 FROM dwarf.flow WHERE id = $1 AND status IN ('running', 'interrupted')"
			 " FOR SHARE", 1, types, args, NULL, SPI_OK_SELECT);
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("subgraph \"%s\" cannot start: flow " INT64_FORMAT " has closed",
							graph, flow->id),
					 errdetail("The flow was cancelled; it starts no new flow.")));
	}
	RestoreUser(saved);

	values[0].type = jbvNumeric;
	values[0].val.numeric = int64_to_numeric(flow->id);
	values[1].type = jbvString;
	values[1].val.string.val = key;
	values[1].val.string.len = strlen(key);
	values[2].type = jbvNumeric;
	values[2].val.numeric = int64_to_numeric(root);
	child = InsertFlow(NewFlowId(), graph_id, flow->owner, flow->priority, NULL, input,
					   JsonbWithKeys(JsonbEmptyObject(), 3, keys, values), &is_new);
	NoteOnCommit(child, NOTE_NEW_FLOW, false);
	return child;
}

/* The child flow a dwarf.subgraph call started, by its parent and key. */
enum
{
	Anum_child_id = 1,
	Anum_child_status,
	Anum_child_state,
	Anum_child_error
};
#define CHILD_FLOW_SQL \
	"SELECT id, status, state, error FROM dwarf.flow" \
	" WHERE parent_id = $1 AND parent_key = $2"

DWARF_FUNCTION(dwarf_subgraph);

/*
 * dwarf.subgraph(graph, input): the first time, starts a child flow of the
 * graph (owned by the same role) and returns NULL; the step then waits for
 * the child without holding a worker.  When the child has closed, the task
 * runs again and the same call returns the child's final state, or raises
 * the child's error.  Calls are told apart by their order in the task.
 */
Datum
dwarf_subgraph(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.subgraph()");
	FlowRun    *flow = step->flow;
	char	   *key;
	Oid			types[2] = {INT8OID, TEXTOID};
	Datum		args[2];
	Datum		result = (Datum) 0;
	bool		isnull = true;
	char	   *status;
	char	   *graph;
	Jsonb	   *input;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dwarf.subgraph needs a graph name")));
	graph = text_to_cstring(PG_GETARG_TEXT_PP(0));
	input = PG_ARGISNULL(1) ? JsonbEmptyObject() : PG_GETARG_JSONB_P(1);
	if (!JsonbIsObject(input))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("flow input must be a JSON object")));
	key = psprintf("%d-%d-%s#%d", step->token->id, step->token->visits,
				   flow->graph->nodes[step->token->node].name, step->subgraph_calls++);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "dwarf: SPI_connect failed");
	args[0] = Int64GetDatum(flow->id);
	args[1] = CStringGetTextDatum(key);
	if (SPI_execute_with_args(CHILD_FLOW_SQL, 2, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not look up a child flow");

	if (SPI_processed == 0)
	{
		if (step->subgraph_calls > dwarf_max_step_children)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("subgraph \"%s\" would be child flow %d of this step, past the %d dwarf.max_step_children allows",
							graph, step->subgraph_calls, dwarf_max_step_children),
					 errhint("Start fewer subgraphs in one task (a for_each edge spreads them over steps), or ask a superuser to raise dwarf.max_step_children.")));
		step->waiting_child = StartChildFlow(flow, graph, key, input);
		SPI_finish();
		PG_RETURN_NULL();
	}

	status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, Anum_child_status);
	if (strcmp(status, "completed") == 0)
	{
		result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, Anum_child_state,
							   &isnull);
		if (!isnull)
			result = SPI_datumTransfer(result, false, -1);
	}
	else if (strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("subgraph \"%s\" (flow %s) %s: %s", graph,
						SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, Anum_child_id),
						status,
						strcmp(status, "failed") == 0 ?
						SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
									 Anum_child_error) :
						"cancelled")));
	else
		step->waiting_child = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
														  SPI_tuptable->tupdesc, Anum_child_id,
														  &isnull));
	SPI_finish();
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}
