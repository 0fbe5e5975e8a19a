/*
 * control.c
 *		Functions a task calls from inside its step: dwarf.goto,
 *		dwarf.step_key, dwarf.flow_id.  They act on the step the worker is
 *		running, so anywhere else they raise an error.
 */
#include "postgres.h"

#include <math.h>

#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/timestamp.h"

#include "dwarf.h"

/* The step being run by this process, or NULL outside a task. */
StepContext *DwarfCurrentStep = NULL;

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

PG_FUNCTION_INFO_V1(dwarf_goto);

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

PG_FUNCTION_INFO_V1(dwarf_step_key);

/*
 * dwarf.step_key(): flow, branch, how many steps that branch took before,
 * and task.  Every attempt of the step, before or after a crash, gets the
 * same key; a loop back to the same task gets a new one.
 */
Datum
dwarf_step_key(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.step_key()");

	PG_RETURN_TEXT_P(cstring_to_text(psprintf(INT64_FORMAT "-%d-%d-%s",
											  step->flow->id, step->token->id,
											  step->token->visits,
											  step->flow->graph->nodes[step->token->node].name)));
}

PG_FUNCTION_INFO_V1(dwarf_flow_id);

/* dwarf.flow_id(): the flow this step belongs to. */
Datum
dwarf_flow_id(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(CurrentStep("dwarf.flow_id()")->flow->id);
}

/* Microseconds in an interval argument; months count as 30 days. */
static int64
IntervalMicros(Interval *span, const char *what)
{
	int64		us = span->time + (int64) span->day * USECS_PER_DAY +
		(int64) span->month * DAYS_PER_MONTH * USECS_PER_DAY;

	if (us < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", what)));
	return us;
}

PG_FUNCTION_INFO_V1(dwarf_retry);

/*
 * dwarf.retry(initial, factor, max, give_up_after): asks for this step to
 * run again after min(initial * factor^(attempt-1), max).  Returns false,
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
		horizon = PG_GETARG_INTERVAL_P(3)->time +
			(int64) PG_GETARG_INTERVAL_P(3)->day * USECS_PER_DAY +
			(int64) PG_GETARG_INTERVAL_P(3)->month * DAYS_PER_MONTH * USECS_PER_DAY;
	if (!(factor >= 1.0) || isinf(factor))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry factor must be a finite number of at least 1")));

	backoff = (double) initial * pow(factor, step->token->attempt - 1);
	delay = backoff >= (double) max ? max : (int64) backoff;
	if (horizon > 0 &&
		GetCurrentTimestamp() + delay - step->token->first_started > horizon)
		PG_RETURN_BOOL(false);
	if (!step->retry)
		step->delay_us += delay;
	step->retry = true;
	PG_RETURN_BOOL(true);
}

PG_FUNCTION_INFO_V1(dwarf_sleep);

/*
 * dwarf.sleep(duration): what follows this step runs only after duration.
 * The flow holds no worker while it waits, and the wait survives restarts.
 * Several calls (and a retry's backoff) add up.
 */
Datum
dwarf_sleep(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.sleep()");

	step->delay_us += IntervalMicros(PG_GETARG_INTERVAL_P(0), "sleep duration");
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(dwarf_interrupt);

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

PG_FUNCTION_INFO_V1(dwarf_baggage);

/* dwarf.baggage(): the JSON the flow was created with, or NULL. */
Datum
dwarf_baggage(PG_FUNCTION_ARGS)
{
	StepContext *step = CurrentStep("dwarf.baggage()");

	if (step->flow->baggage == NULL)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(datumCopy(JsonbPGetDatum(step->flow->baggage), false, -1));
}
