/*
 * flowrun.c
 *		A running flow in a worker's memory: its tokens (one per live branch),
 *		its cohorts (branches waiting to meet at a fan-in), and the transition
 *		that follows each step.
 *
 * FlowAdvance is a function of the flow, the token and the step's outcome
 * only, so running it over a flow's recorded steps, in order, rebuilds the
 * flow exactly: that is how a worker recovers after a restart.  It never
 * touches the database.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "dwarf.h"
#include "graph.h"
#include "flowrun.h"
#include "json.h"

static void Route(FlowRun *flow, Token *token, int target, Jsonb *state, bool owned);
static void BranchDone(FlowRun *flow, Cohort *cohort, int branch, List *deltas,
					   Jsonb *state, int fan_in);

/*
 * States are copied whole at every merge, so where they live decides how a
 * flow's memory grows.  A merge runs in a scratch context (its temporary
 * lists and trees are gone at once) and only its result is kept, in the
 * flow's context.  A token frees a state it owns when it moves past it, and
 * a for_each branch makes its state (the fork's state plus its element)
 * only when it runs: a fan-out of n elements holds one copy of the array,
 * not n.
 */
static MemoryContext Scratch = NULL;

/* A copy, in the current (the flow's) context, of a Jsonb made in Scratch. */
static Jsonb *
Keep(Jsonb *made, Jsonb *original)
{
	Jsonb	   *copy;

	if (made == original)
		return original;
	copy = palloc(VARSIZE(made));
	memcpy(copy, made, VARSIZE(made));
	return copy;
}

static void
EnterScratch(MemoryContext *old)
{
	if (Scratch == NULL)
		Scratch = AllocSetContextCreate(TopMemoryContext, "dwarf merges",
										ALLOCSET_DEFAULT_SIZES);
	MemoryContextReset(Scratch);
	*old = MemoryContextSwitchTo(Scratch);
}

/* MergeChanges, keeping only the result. */
static Jsonb *
Merged(FlowRun *flow, Jsonb *state, Jsonb *changes)
{
	MemoryContext old;
	Jsonb	   *made;

	EnterScratch(&old);
	made = MergeChanges(state, changes, flow->graph->reducers, flow->graph->nreducers);
	MemoryContextSwitchTo(old);
	return Keep(made, state);
}

/* Gives a token a new state, freeing the one it owned (unless it is the same). */
static void
SetTokenState(Token *token, Jsonb *state, bool owned)
{
	if (token->state == state)
		return;
	if (token->own_state && token->state)
		pfree(token->state);
	token->state = state;
	token->own_state = owned;
}

/*
 * A new token, placed (the step's successors are looked for among the
 * placed tokens).  Tokens are found by id through flow->by_id and dropped
 * from a doubly linked list, so that a flow of n branches costs O(1) a
 * step, not O(n).
 */
static Token *
NewToken(FlowRun *flow, int node, Jsonb *state, Cohort *cohort, int branch,
		 List *deltas)
{
	Token	   *token = palloc0(sizeof(Token));

	token->id = flow->next_token++;
	token->node = node;
	token->attempt = 1;
	token->due = flow->next_due;
	token->state = state;
	token->cohort = cohort;
	token->branch = branch;
	token->deltas = deltas;
	if (token->id >= flow->by_id_size)
	{
		int			size = Max(8, flow->by_id_size * 2);

		while (size <= token->id)
			size *= 2;
		if (flow->by_id == NULL)
			flow->by_id = palloc0(sizeof(Token *) * size);
		else
		{
			flow->by_id = repalloc(flow->by_id, sizeof(Token *) * size);
			memset(flow->by_id + flow->by_id_size, 0,
				   sizeof(Token *) * (size - flow->by_id_size));
		}
		flow->by_id_size = size;
	}
	flow->by_id[token->id] = token;
	dlist_push_tail(&flow->tokens, &token->node_in_flow);
	flow->ntokens++;
	flow->placed = lappend_int(flow->placed, token->id);
	return token;
}

/* Drops a token, and the state it owned unless that goes on as keep. */
static void
DropToken(FlowRun *flow, Token *token, Jsonb *keep)
{
	if (token->own_state && token->state && token->state != keep)
		pfree(token->state);
	if (flow->status == FLOW_RUNNING)	/* a closed flow forgot its tokens */
	{
		dlist_delete(&token->node_in_flow);
		flow->by_id[token->id] = NULL;
		flow->ntokens--;
	}
	pfree(token);
}

/* Forgets every token (the flow closed, or is freed). */
static void
ForgetTokens(FlowRun *flow)
{
	dlist_init(&flow->tokens);
	flow->ntokens = 0;
	flow->by_id = NULL;
	flow->by_id_size = 0;
	flow->placed = NIL;
}

/*
 * Sets up a flow that starts at task start with its input as state.  Every
 * field but the id (a hash table's key) starts at zero: an entry a hash
 * table hands out holds whatever its last use left.
 */
FlowRun *
FlowRunCreate(FlowRun *flow, Graph *graph, int start, Jsonb *input, MemoryContext parent)
{
	MemoryContext old;
	int64		id = flow->id;

	memset(flow, 0, sizeof(FlowRun));
	flow->id = id;
	flow->cxt = AllocSetContextCreate(parent, "dwarf flow", ALLOCSET_SMALL_SIZES);
	flow->graph = graph;
	flow->status = FLOW_RUNNING;
	flow->final_state = NULL;
	flow->error = NULL;
	flow->next_token = 0;
	flow->next_due = 0;
	flow->steps = 0;
	flow->enqueued = 0;
	ForgetTokens(flow);
	old = MemoryContextSwitchTo(flow->cxt);
	NewToken(flow, start, (Jsonb *) PG_DETOAST_DATUM_COPY(JsonbPGetDatum(input)),
			 NULL, 0, NIL);
	MemoryContextSwitchTo(old);
	return flow;
}

void
FlowRunFree(FlowRun *flow)
{
	MemoryContextDelete(flow->cxt);
	flow->cxt = NULL;
	ForgetTokens(flow);
}

/*
 * Where a flow stands, as one state: a closed flow's final state, or the
 * state its one live branch's next step will see.  NULL while several
 * branches run (no single state is the flow's yet).
 */
Jsonb *
FlowStateSoFar(FlowRun *flow)
{
	if (flow->status != FLOW_RUNNING)
		return flow->final_state;
	if (flow->ntokens == 1)
		return FlowTokenState(flow, dlist_head_element(Token, node_in_flow, &flow->tokens));
	return NULL;
}

/* A live token of the flow by its id, or NULL. */
Token *
FlowFindToken(FlowRun *flow, int token_id)
{
	if (token_id < 0 || token_id >= flow->by_id_size)
		return NULL;
	return flow->by_id[token_id];
}

/*
 * Does the flow hold offers (offers.c) that must be withdrawn when it is
 * dropped or closed?  Its tokens offered, and those whose answer it took
 * but has not recorded yet: their offers stay answering until recorded,
 * and a flow that closes first would leave them so for good, holding
 * room of dwarf.max_external_steps (a failed for_each of HTTP calls left
 * 32,827).
 */
bool
FlowHoldsOffers(FlowRun *flow)
{
	dlist_iter	iter;

	if (flow->offered > 0)
		return true;
	if (!flow->graph->has_external)
		return false;
	foreach_token(iter, flow)
		if (iter_token(iter)->answer != NULL)
			return true;
	return false;
}

/*
 * Closes the flow; its remaining tokens will never run.  Whether it held
 * offers is kept in offered (as 1 when only answers held them), for
 * WriteClose to withdraw them once the tokens are gone.
 */
static void
CloseFlow(FlowRun *flow, FlowStatus status, Jsonb *state, const char *error)
{
	if (flow->offered == 0 && FlowHoldsOffers(flow))
		flow->offered = 1;
	flow->status = status;
	flow->final_state = state;
	flow->error = error ? pstrdup(error) : NULL;
	if (flow->by_id)
		pfree(flow->by_id);
	ForgetTokens(flow);
}

/* Does a when/switch predicate hold on the state?  Unknown counts as no. */
static bool
PathMatches(Edge *edge, Jsonb *state)
{
	LOCAL_FCINFO(fcinfo, 2);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, NULL, 2, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = JsonbPGetDatum(state);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = edge->path;
	fcinfo->args[1].isnull = false;
	result = jsonb_path_match_opr(fcinfo);
	return !fcinfo->isnull && DatumGetBool(result);
}

/* One branch a transition starts: where it goes and what it sees extra. */
typedef struct Branch
{
	int			target;
	Edge	   *edge;			/* for_each edge, or NULL */
	JsonbValue	element;
	int			index;
	int			count;
} Branch;

/* The edges that fire after a successful step, in definition order. */
static List *
FiringEdges(FlowRun *flow, Token *token, Jsonb *state, int goto_node)
{
	GraphNode	   *node = &flow->graph->nodes[token->node];
	List	   *result = NIL;
	ListCell   *lc;

	if (goto_node >= 0)
		return list_make1(GraphGotoEdge(flow->graph, token->node, goto_node));

	foreach(lc, node->edges)
	{
		Edge	   *edge = lfirst(lc);

		switch (edge->kind)
		{
			case EDGE_PLAIN:
			case EDGE_FOR_EACH:
				result = lappend(result, edge);
				break;
			case EDGE_WHEN:
				if (PathMatches(edge, state))
					result = lappend(result, edge);
				break;
			case EDGE_SWITCH:
				if (PathMatches(edge, state))
					return list_make1(edge);
				break;
			case EDGE_GOTO:
			case EDGE_ERROR:
				break;
		}
	}
	return result;
}

/*
 * Expands firing edges into branches.  Sets *converge to the fan-in an empty
 * for_each leads to, and *error when a for_each field is not an array.
 */
static List *
ExpandBranches(FlowRun *flow, List *edges, Jsonb *state, int *converge,
			   char **error)
{
	List	   *result = NIL;
	ListCell   *lc;

	*converge = -1;
	*error = NULL;
	foreach(lc, edges)
	{
		Edge	   *edge = lfirst(lc);
		int			i;

		if (edge->kind == EDGE_FOR_EACH)
		{
			JsonbValue *array = JsonbField(state, edge->for_each);
			JsonbIterator *it;
			JsonbIteratorToken tok;
			JsonbValue	v;
			int			count,
						index = 0;

			if (array == NULL || array->type != jbvBinary ||
				!JsonContainerIsArray(array->val.binary.data))
			{
				*error = psprintf("for_each field \"%s\" of task \"%s\" is not an array",
								  edge->for_each, flow->graph->nodes[edge->from].name);
				return NIL;
			}
			count = JsonContainerSize(array->val.binary.data);
			if (count == 0 && edge->converge >= 0)
				*converge = edge->converge;
			it = JsonbIteratorInit(array->val.binary.data);
			while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
			{
				Branch	   *b;

				if (tok != WJB_ELEM)
					continue;
				b = palloc0(sizeof(Branch));
				b->target = edge->to[0];
				b->edge = edge;
				b->element = v;
				b->index = index++;
				b->count = count;
				result = lappend(result, b);
			}
			continue;
		}
		for (i = 0; i < edge->nto; i++)
		{
			Branch	   *b = palloc0(sizeof(Branch));

			b->target = edge->to[i];
			result = lappend(result, b);
		}
	}
	return result;
}

/*
 * The state a token's next step starts from.  A for_each branch that has
 * not run yet makes it now: the fork's state with its element, index and
 * count, less the array it forks over (it comes back at the fan-in, from
 * the fork's state): a branch that carried the array would cost O(n), and
 * the fan-out O(n^2).
 */
Jsonb *
FlowTokenState(FlowRun *flow, Token *token)
{
	if (token->state == NULL)
	{
		MemoryContext old;
		const char *keys[4];
		JsonbValue	values[3];
		JsonbParseState *ps = NULL;
		Jsonb	   *made;
		int			i;

		EnterScratch(&old);
		keys[0] = token->each_edge->as;
		keys[1] = psprintf("%sIndex", token->each_edge->as);
		keys[2] = psprintf("%sCount", token->each_edge->as);
		keys[3] = token->each_edge->for_each;
		values[0] = token->each_element;
		values[1].type = jbvNumeric;
		values[1].val.numeric = int64_to_numeric(token->each_index);
		values[2].type = jbvNumeric;
		values[2].val.numeric = int64_to_numeric(token->each_count);
		pushJsonbValue(&ps, WJB_BEGIN_OBJECT, NULL);
		JsonbPushPairsExcept(&ps, &token->cohort->fork_state->root, 4, keys);
		for (i = 0; i < 3; i++)
		{
			JsonbValue	k;

			k.type = jbvString;
			k.val.string.val = (char *) keys[i];
			k.val.string.len = strlen(keys[i]);
			pushJsonbValue(&ps, WJB_KEY, &k);
			pushJsonbValue(&ps, WJB_VALUE, &values[i]);
		}
		made = JsonbValueToJsonb(pushJsonbValue(&ps, WJB_END_OBJECT, NULL));
		MemoryContextSwitchTo(flow->cxt);
		token->state = Keep(made, NULL);
		token->own_state = true;
		MemoryContextSwitchTo(old);
	}
	return token->state;
}

/*
 * Takes the firing edges from a token whose step produced state.  One plain
 * target moves the token; several (or a for_each) fork a cohort.
 */
static void
Fire(FlowRun *flow, Token *token, List *edges, Jsonb *state, bool owned)
{
	int			converge;
	char	   *error;
	List	   *branches = ExpandBranches(flow, edges, state, &converge, &error);
	Cohort	   *cohort;
	int			n = list_length(branches),
				b;

	if (error)
	{
		CloseFlow(flow, FLOW_FAILED, state, error);
		return;
	}
	if (n == 0)
	{
		Route(flow, token, converge >= 0 ? converge : NODE_END, state, owned);
		return;
	}
	if (n == 1 && ((Branch *) linitial(branches))->edge == NULL &&
		((Edge *) linitial(edges))->nto == 1)
	{
		Route(flow, token, ((Branch *) linitial(branches))->target, state, owned);
		list_free_deep(branches);
		return;
	}

	cohort = palloc0(sizeof(Cohort));
	cohort->parent = token->cohort;
	cohort->parent_branch = token->branch;
	cohort->parent_deltas = token->deltas;
	cohort->fork_state = state;
	cohort->own_fork = owned;
	cohort->nbranches = n;
	cohort->pending = n;
	cohort->fan_in = -1;
	cohort->deltas = palloc0(sizeof(List *) * n);
	for (b = 0; b < n; b++)
	{
		Edge	   *edge = ((Branch *) list_nth(branches, b))->edge;

		if (edge && !list_member_ptr(cohort->drop_keys, edge->as))
			cohort->drop_keys = list_concat(cohort->drop_keys,
											list_make3(edge->as,
													   psprintf("%sIndex", edge->as),
													   psprintf("%sCount", edge->as)));
	}
	DropToken(flow, token, state);

	for (b = 0; b < n; b++)
	{
		Branch	   *br = list_nth(branches, b);
		Token	   *t;

		if (br->edge == NULL)	/* a static branch shares the fork's state */
		{
			t = NewToken(flow, br->target, state, cohort, b, NIL);
			Route(flow, t, br->target, state, false);
		}
		else					/* a for_each branch makes its own when it runs */
		{
			t = NewToken(flow, br->target, NULL, cohort, b, NIL);
			t->each_edge = br->edge;
			t->each_element = br->element;
			t->each_index = br->index;
			t->each_count = br->count;
			Route(flow, t, br->target, NULL, false);
		}
		if (flow->status != FLOW_RUNNING)
			break;
	}
	list_free_deep(branches);
}

/*
 * Puts a token at target: END ends its branch, a fan-in makes it wait for
 * its cohort, any other task makes it runnable.
 */
static void
Route(FlowRun *flow, Token *token, int target, Jsonb *state, bool owned)
{
	Cohort	   *cohort = token->cohort;

	if (target == NODE_END ||
		(cohort != NULL && flow->graph->nodes[target].fan_in))
	{
		int			branch = token->branch;
		List	   *deltas = token->deltas;

		DropToken(flow, token, state);
		if (cohort == NULL)
			CloseFlow(flow, FLOW_COMPLETED, state, NULL);
		else
		{
			BranchDone(flow, cohort, branch, deltas, state,
					   target == NODE_END ? -1 : target);
			if (owned && state)
				pfree(state);	/* the cohort keeps the branch's changes, not its state */
		}
		return;
	}
	token->node = target;
	SetTokenState(token, state, owned);
	token->attempt = 1;
	token->due = flow->next_due;
	/* placed: its successor (a token made by this step is listed already) */
	if (flow->placed == NIL || llast_int(flow->placed) != token->id)
		flow->placed = lappend_int(flow->placed, token->id);
}

/*
 * A branch of a cohort arrived at a fan-in (fan_in >= 0) or ended.  When it
 * was the last, the cohort's changes are folded in branch order onto the
 * forking state, in one pass (FoldChanges: O(n) for n branches, where a
 * merge per change would copy the growing state n times), and one token
 * goes on: at the fan-in, or, when no branch reached one, as the end of the
 * forking token's own branch.
 */
static void
BranchDone(FlowRun *flow, Cohort *cohort, int branch, List *deltas,
		   Jsonb *state, int fan_in)
{
	Jsonb	   *merged;
	Jsonb	  **changes;
	List	   *all_deltas = NIL;
	const char **keys;
	int			nchanges = 0,
				nkeys = 0,
				b;
	ListCell   *lc;
	MemoryContext old;

	cohort->deltas[branch] = deltas;
	if (fan_in >= 0 && cohort->fan_in < 0)
		cohort->fan_in = fan_in;
	if (--cohort->pending > 0)
		return;

	for (b = 0; b < cohort->nbranches; b++)
		nchanges += list_length(cohort->deltas[b]);
	changes = palloc(sizeof(Jsonb *) * Max(nchanges, 1));
	nchanges = 0;
	if (cohort->parent != NULL)
		all_deltas = list_copy(cohort->parent_deltas);
	for (b = 0; b < cohort->nbranches; b++)
		foreach(lc, cohort->deltas[b])
		{
			changes[nchanges++] = lfirst(lc);
			if (cohort->parent != NULL)
				all_deltas = lappend(all_deltas, lfirst(lc));
		}
	keys = palloc(sizeof(char *) * Max(list_length(cohort->drop_keys), 1));
	foreach(lc, cohort->drop_keys)
		keys[nkeys++] = lfirst(lc);

	EnterScratch(&old);
	merged = FoldChanges(cohort->fork_state, nchanges, changes,
						 flow->graph->reducers, flow->graph->nreducers,
						 nkeys, keys, 0);
	MemoryContextSwitchTo(old);
	merged = Keep(merged, cohort->fork_state);
	pfree(changes);
	pfree(keys);
	if (merged != cohort->fork_state && cohort->own_fork)
	{
		pfree(cohort->fork_state);	/* every branch is done with it */
		cohort->fork_state = NULL;
	}

	if (cohort->fan_in >= 0)
	{
		Token	   *t = NewToken(flow, cohort->fan_in, merged, cohort->parent,
								 cohort->parent_branch, all_deltas);

		t->own_state = merged != cohort->fork_state || cohort->own_fork;
	}
	else if (cohort->parent == NULL)
		CloseFlow(flow, FLOW_COMPLETED, merged, NULL);
	else
		BranchDone(flow, cohort->parent, cohort->parent_branch, all_deltas, merged, -1);

	/* At the top level no one holds the branches' changes any more. */
	if (cohort->parent == NULL)
	{
		for (b = 0; b < cohort->nbranches; b++)
			list_free_deep(cohort->deltas[b]);
		pfree(cohort->deltas);
		list_free(cohort->drop_keys);	/* each edge's "as" is the graph's */
		pfree(cohort);
	}
}

/* The message of an error document, for the flow's error column. */
static char *
ErrorMessage(Jsonb *error)
{
	JsonbValue *msg = JsonbField(error, "message");

	if (msg && msg->type == jbvString)
		return pnstrdup(msg->val.string.val, msg->val.string.len);
	return pstrdup("task failed");
}

/* Is this outcome a step refused on the cap named by setting? */
static bool
RefusedOn(StepOutcome *outcome, const char *setting)
{
	JsonbValue *cap;

	if (outcome->kind != OUTCOME_ERROR || outcome->error == NULL)
		return false;
	cap = JsonbField(outcome->error, "cap");
	return cap && cap->type == jbvString &&
		cap->val.string.len == strlen(setting) &&
		memcmp(cap->val.string.val, setting, cap->val.string.len) == 0;
}

/*
 * Turns a step that ran into a step the engine refuses: a failed step,
 * whose error document is a task error's (message, sqlstate, detail, hint,
 * task) plus the setting whose cap it met.  The caller records outcome
 * after FlowAdvance, so the step's row says it failed and why, and replay
 * reads it as the failure it was whatever the setting is by then.  Made in
 * cxt, the caller's context: the row is written from it.
 */
static void
RefuseStep(FlowRun *flow, Token *token, StepOutcome *outcome, MemoryContext cxt,
		   const char *setting, const char *message, const char *detail,
		   const char *hint)
{
	const char *keys[6] = {"message", "sqlstate", "detail", "hint", "task", "cap"};
	const char *vals[6];
	JsonbValue	values[6];
	MemoryContext old = MemoryContextSwitchTo(cxt);
	int			i;

	vals[0] = message;
	vals[1] = unpack_sql_state(ERRCODE_PROGRAM_LIMIT_EXCEEDED);
	vals[2] = detail;
	vals[3] = hint;
	vals[4] = flow->graph->nodes[token->node].name;
	vals[5] = setting;
	for (i = 0; i < 6; i++)
	{
		values[i].type = jbvString;
		values[i].val.string.val = (char *) vals[i];
		values[i].val.string.len = strlen(vals[i]);
	}
	outcome->kind = OUTCOME_ERROR;
	outcome->changes = NULL;
	outcome->goto_node = -1;
	outcome->wake_at = 0;
	outcome->signal = NULL;
	outcome->error = JsonbWithKeys(JsonbEmptyObject(), 6, keys, values);
	MemoryContextSwitchTo(old);
}

/* The for_each branches the firing edges would start on state. */
static int64
ForEachWidth(List *edges, Jsonb *state)
{
	int64		width = 0;
	ListCell   *lc;

	foreach(lc, edges)
	{
		Edge	   *edge = lfirst(lc);
		JsonbValue *array;

		if (edge->kind != EDGE_FOR_EACH)
			continue;
		array = JsonbField(state, edge->for_each);
		if (array != NULL && array->type == jbvBinary &&
			JsonContainerIsArray(array->val.binary.data))
			width += JsonContainerSize(array->val.binary.data);
	}
	return width;
}

/*
 * Merges a step's changes into its token's state and moves on: a retry
 * stays where it is, due later; a success takes the edges that fire, an
 * error the on_error edges it is given.  Returns 0, or, having changed
 * nothing, how many for_each branches a success would start when that is
 * more than dwarf.max_for_each.
 */
static int64
TakeChanges(FlowRun *flow, Token *token, StepOutcome *outcome, Jsonb *changes,
			List *edges)
{
	Jsonb	   *before;
	Jsonb	   *state;
	bool		owned;

	changes = (Jsonb *) PG_DETOAST_DATUM_COPY(JsonbPGetDatum(changes));
	before = FlowTokenState(flow, token);
	state = Merged(flow, before, changes);
	owned = state != before || token->own_state;	/* no changes: the same state */

	if (outcome->kind == OUTCOME_OK)
	{
		int64		width;

		edges = FiringEdges(flow, token, state, outcome->goto_node);
		width = ForEachWidth(edges, state);
		if (width > dwarf_max_for_each)
		{
			if (state != before)
				pfree(state);
			pfree(changes);
			list_free(edges);
			return width;
		}
	}
	if (token->cohort != NULL)
		token->deltas = lappend(token->deltas, changes);
	else
		pfree(changes);			/* merged: a top-level token keeps no deltas */

	if (outcome->kind == OUTCOME_RETRY)
	{
		/* The same step again, on the state this attempt left, later. */
		SetTokenState(token, state, owned);
		token->attempt++;
		token->due = outcome->wake_at;
		flow->placed = lappend_int(flow->placed, token->id);
		return 0;
	}

	token->visits++;
	token->resumes = NIL;
	flow->next_due = outcome->wake_at;
	Fire(flow, token, edges, state, owned);
	flow->next_due = 0;
	if (outcome->kind == OUTCOME_OK)
		list_free(edges);		/* FiringEdges made it */
	return 0;
}

/*
 * A failed step: the task's on_error edges, with the error in field onErr,
 * or, without any, the flow fails with its message.  A step refused on
 * dwarf.max_flow_steps fails the flow whatever edges it has: a handler
 * would only be one more step past the cap.
 */
static void
TakeError(FlowRun *flow, Token *token, StepOutcome *outcome)
{
	GraphNode  *node = &flow->graph->nodes[token->node];
	List	   *edges = NIL;
	ListCell   *lc;
	const char *key = "onErr";
	JsonbValue	err;

	if (!RefusedOn(outcome, "dwarf.max_flow_steps"))
		foreach(lc, node->edges)
			if (((Edge *) lfirst(lc))->kind == EDGE_ERROR)
				edges = lappend(edges, lfirst(lc));
	if (edges == NIL)
	{
		CloseFlow(flow, FLOW_FAILED, FlowTokenState(flow, token), ErrorMessage(outcome->error));
		return;
	}
	err.type = jbvBinary;
	err.val.binary.data = &outcome->error->root;
	err.val.binary.len = VARSIZE(outcome->error) - VARHDRSZ;
	(void) TakeChanges(flow, token, outcome,
					   JsonbWithKeys(JsonbEmptyObject(), 1, &key, &err), edges);
	list_free(edges);
}

/*
 * Moves a flow on after one step of token.  A success merges the task's
 * changes and takes the edges that fire; an error takes the task's
 * on_error edges with the error in field onErr, or fails the flow; a retry
 * merges the changes and leaves the token where it is, due later; an
 * interrupt parks the token until a resume hands it data.  What the step
 * placed becomes runnable at outcome->wake_at.
 *
 * Two caps keep a flow from taking the engine: a flow that has taken
 * dwarf.max_flow_steps steps (every row counts, each attempt too) fails at
 * its next one, and a step whose for_each edges would start more than
 * dwarf.max_for_each branches fails as if its task had raised (on_error
 * edges are taken).  Either rewrites outcome into that failure, so the row
 * the caller records after this call (RunStep) is the failure.  The task
 * did return: its own SQL writes stand, its changes are dropped.
 */
void
FlowAdvance(FlowRun *flow, Token *token, StepOutcome *outcome)
{
	MemoryContext caller = CurrentMemoryContext;
	MemoryContext old = MemoryContextSwitchTo(flow->cxt);
	int64		width;

	list_free(flow->placed);
	flow->placed = NIL;
	if (outcome->kind != OUTCOME_RESUMED && flow->steps >= dwarf_max_flow_steps &&
		!RefusedOn(outcome, "dwarf.max_flow_steps"))
		RefuseStep(flow, token, outcome, caller, "dwarf.max_flow_steps",
				   psprintf("the flow has taken " INT64_FORMAT " steps, the most dwarf.max_flow_steps allows",
							flow->steps),
				   outcome->kind == OUTCOME_ERROR ?
				   psprintf("Its last step failed too: %s", ErrorMessage(outcome->error)) :
				   "Every step counts, each attempt of a retry too: a task that goes to itself or retries without end stops here.",
				   "End the loop in the task, or ask a superuser to raise dwarf.max_flow_steps.");
	flow->steps++;

	switch (outcome->kind)
	{
		case OUTCOME_INTERRUPT:
			/* Parked until resumed; the attempt's changes are not kept. */
			token->parked = true;
			token->payload = outcome->signal ?
				(Jsonb *) PG_DETOAST_DATUM_COPY(JsonbPGetDatum(outcome->signal)) : NULL;
			break;
		case OUTCOME_WAITING:
			{
				/* Parked until the child closes; then the task runs again. */
				JsonbValue *child = JsonbField(outcome->signal, "child");

				token->parked = true;
				token->child = DatumGetInt64(DirectFunctionCall1(numeric_int8,
																 NumericGetDatum(child->val.numeric)));
				break;
			}
		case OUTCOME_RESUMED:
			token->parked = false;
			token->payload = NULL;
			token->due = 0;
			token->resumes = lappend(token->resumes,
									 PG_DETOAST_DATUM_COPY(JsonbPGetDatum(outcome->signal)));
			flow->placed = lappend_int(flow->placed, token->id);
			break;
		case OUTCOME_ERROR:
			TakeError(flow, token, outcome);
			break;
		case OUTCOME_OK:
		case OUTCOME_RETRY:
			width = TakeChanges(flow, token, outcome, outcome->changes, NIL);
			if (width > 0)
			{
				RefuseStep(flow, token, outcome, caller, "dwarf.max_for_each",
						   psprintf("task \"%s\" would start " INT64_FORMAT " for_each branches, more than dwarf.max_for_each allows (%d)",
									flow->graph->nodes[token->node].name, width,
									dwarf_max_for_each),
						   "A for_each starts one branch per element of its array.",
						   "Split the array into chunks and run each chunk as a subgraph, or ask a superuser to raise dwarf.max_for_each.");
				TakeError(flow, token, outcome);
			}
			break;
	}
	MemoryContextSwitchTo(old);
}
