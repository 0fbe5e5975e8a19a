/*
 * control.c
 *		Functions a task calls from inside its step: dwarf.goto,
 *		dwarf.step_key, dwarf.flow_id.  They act on the step the worker is
 *		running, so anywhere else they raise an error.
 */
#include "postgres.h"

#include "utils/builtins.h"

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
