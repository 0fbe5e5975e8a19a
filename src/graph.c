/*
 * graph.c
 *		Graph definitions: parse the JSON document, check it, and compile it
 *		into nodes and edges with resolved functions and compiled paths;
 *		then, in a worker, set up the calls of the tasks' functions.
 *
 * dwarf.define runs the checks once and stores the definition with every
 * function name schema-qualified; a worker compiles the stored document again
 * (cheaply, once per graph version) to get function oids and jsonpaths.
 */
#include "postgres.h"

#include "miscadmin.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/float.h"
#include "utils/numeric.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonpath.h"
#include "utils/lsyscache.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "dwarf.h"
#include "graph.h"
#include "flows.h"
#include "json.h"
#include "url.h"

#define DefinitionError(...) \
	ereport(ERROR, \
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE), \
			 errmsg(__VA_ARGS__)))

/* The names of the reducers, by ReducerKind: the definition's and the errors'. */
const char *const ReducerNames[] = {
	"replace", "append", "add", "min", "max", "union", "merge", "and", "or", "concat"
};

/* A NUL-terminated copy of a string JsonbValue, or an error naming what it is. */
static char *
StringValue(JsonbValue *v, const char *what)
{
	if (v == NULL || v->type != jbvString)
		DefinitionError("invalid graph definition: %s must be a string", what);
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/* A boolean JsonbValue's value, or an error naming what it is. */
static bool
BoolValue(JsonbValue *v, const char *what)
{
	if (v->type != jbvBool)
		DefinitionError("invalid graph definition: %s must be true or false", what);
	return v->val.boolean;
}

/*
 * The next key of an object iterated with IterateValue, its value in *val;
 * NULL after the last.
 */
static char *
NextKey(JsonbIterator **it, JsonbValue *val)
{
	JsonbIteratorToken tok;
	JsonbValue	k;

	while ((tok = JsonbIteratorNext(it, &k, true)) != WJB_DONE)
		if (tok == WJB_KEY)
		{
			(void) JsonbIteratorNext(it, val, true);
			return pnstrdup(k.val.string.val, k.val.string.len);
		}
	return NULL;
}

/* Iterates the top level of a container value (object or array). */
static JsonbIterator *
IterateValue(JsonbValue *v, bool want_object, const char *what)
{
	JsonbContainer *c;

	if (v->type != jbvBinary)
		DefinitionError("invalid graph definition: %s must be %s", what,
						want_object ? "an object" : "an array");
	c = v->val.binary.data;
	if (want_object ? !JsonContainerIsObject(c) : !JsonContainerIsArray(c))
		DefinitionError("invalid graph definition: %s must be %s", what,
						want_object ? "an object" : "an array");
	return JsonbIteratorInit(c);
}

/* A task's node number by name: NODE_END for END, -2 for none. */
int
GraphNodeByName(Graph *graph, const char *name)
{
	int			i;

	if (strcmp(name, "END") == 0)
		return NODE_END;
	for (i = 0; i < graph->nnodes; i++)
		if (strcmp(graph->nodes[i].name, name) == 0)
			return i;
	return -2;
}

/* A node number for a transition's endpoint, or an error naming the edge. */
static int
ResolveNode(Graph *graph, const char *name, const char *edge)
{
	int			node = GraphNodeByName(graph, name);

	if (node == -2)
		DefinitionError("invalid graph definition: %s names unknown task \"%s\"",
						edge, name);
	return node;
}

/*
 * Finds the task's function: fn(jsonb) RETURNS jsonb.  A name that exists
 * with other arguments, or that returns something else, gets its own error.
 */
static Oid
ResolveFunction(const char *task, const char *fn_name, bool strict)
{
	List	   *names = stringToQualifiedNameList(fn_name, NULL);
	Oid			argtypes[1] = {JSONBOID};
	Oid			fn = LookupFuncName(names, 1, argtypes, true);
	HeapTuple	tup;
	Form_pg_proc proc;

	if (!OidIsValid(fn) && !strict)
		return InvalidOid;
	if (!OidIsValid(fn))
	{
		if (FuncnameGetCandidates(names, -1, NIL, false, false, false, true) != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
					 errmsg("invalid graph definition: function %s of task \"%s\" does not take (jsonb)",
							fn_name, task),
					 errhint("A task's function is fn(state jsonb) RETURNS jsonb.")));
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("invalid graph definition: function %s(jsonb) of task \"%s\" does not exist",
						fn_name, task)));
	}

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u", fn);
	proc = (Form_pg_proc) GETSTRUCT(tup);
	if (proc->prokind != PROKIND_FUNCTION || proc->proretset ||
		proc->prorettype != JSONBOID)
	{
		ReleaseSysCache(tup);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
				 errmsg("invalid graph definition: function %s of task \"%s\" must return a single jsonb",
						fn_name, task),
				 errhint("A task's function is fn(state jsonb) RETURNS jsonb.")));
	}
	ReleaseSysCache(tup);
	return fn;
}

/* Compiles a when/switch predicate, with an error that names the edge. */
static Datum
CompilePath(const char *text, const char *edge)
{
	MemoryContext cxt = CurrentMemoryContext;
	Datum		path = (Datum) 0;

	PG_TRY();
	{
		path = DirectFunctionCall1(jsonpath_in, CStringGetDatum(text));
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: bad path \"%s\" in %s", text, edge),
				 errdetail("%s", edata->message)));
	}
	PG_END_TRY();
	return path;
}

/* A new edge of the task from, to nto tasks the caller fills in. */
static Edge *
NewEdge(Graph *graph, EdgeKind kind, int from, int nto)
{
	Edge	   *edge = palloc0(sizeof(Edge));

	edge->kind = kind;
	edge->from = from;
	edge->nto = nto;
	edge->to = palloc0(sizeof(int) * Max(nto, 1));
	edge->converge = -1;
	graph->nodes[from].edges = lappend(graph->nodes[from].edges, edge);
	return edge;
}

/* {"chain": ["A", "B", "C", "END"]}: plain edges between neighbours. */
static void
ParseChain(Graph *graph, JsonbValue *chain, const char *edge_desc)
{
	JsonbIterator *it = IterateValue(chain, false, "chain");
	JsonbIteratorToken tok;
	JsonbValue	v;
	int			prev = -2;
	int			count = 0;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		int			node;

		if (tok != WJB_ELEM)
			continue;
		node = ResolveNode(graph, StringValue(&v, "a chain element"), edge_desc);
		if (prev == NODE_END)
			DefinitionError("invalid graph definition: %s continues after END", edge_desc);
		if (prev != -2)
			NewEdge(graph, EDGE_PLAIN, prev, 1)->to[0] = node;
		prev = node;
		count++;
	}
	if (count < 2)
		DefinitionError("invalid graph definition: %s has a chain of %d task(s); a chain needs two or more", edge_desc, count);
}

/* A transition's keys, as written. */
typedef struct TransitionKeys
{
	char	   *from;
	JsonbValue	to;				/* jbvNull when absent */
	JsonbValue	chain;			/* jbvNull when absent */
	char	   *when;
	char	   *sw;				/* "switch" */
	char	   *for_each;
	char	   *as;
	bool		is_goto;
	bool		on_error;
} TransitionKeys;

/* Reads one element of "transitions" into keys; desc names it in errors. */
static void
ReadTransitionKeys(JsonbValue *elem, const char *desc, TransitionKeys *keys)
{
	JsonbIterator *it = IterateValue(elem, true, "a transition");
	char	   *key;
	JsonbValue	v;

	while ((key = NextKey(&it, &v)) != NULL)
	{
		if (strcmp(key, "from") == 0)
			keys->from = StringValue(&v, "\"from\"");
		else if (strcmp(key, "to") == 0)
			keys->to = v;
		else if (strcmp(key, "chain") == 0)
			keys->chain = v;
		else if (strcmp(key, "when") == 0)
			keys->when = StringValue(&v, "\"when\"");
		else if (strcmp(key, "switch") == 0)
			keys->sw = StringValue(&v, "\"switch\"");
		else if (strcmp(key, "for_each") == 0)
			keys->for_each = StringValue(&v, "\"for_each\"");
		else if (strcmp(key, "as") == 0)
			keys->as = StringValue(&v, "\"as\"");
		else if (strcmp(key, "goto") == 0)
			keys->is_goto = BoolValue(&v, "\"goto\"");
		else if (strcmp(key, "on_error") == 0)
			keys->on_error = BoolValue(&v, "\"on_error\"");
		else
			DefinitionError("invalid graph definition: unknown key \"%s\" in %s", key, desc);
	}
}

/* A new edge from from_node to "to": one task's name, or an array of them. */
static Edge *
NewEdgeTo(Graph *graph, EdgeKind kind, int from_node, JsonbValue *to, const char *desc)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	List	   *targets = NIL;
	ListCell   *lc;
	Edge	   *edge;
	int			nto;

	if (to->type == jbvString)
	{
		edge = NewEdge(graph, kind, from_node, 1);
		edge->to[0] = ResolveNode(graph, StringValue(to, "\"to\""), desc);
		return edge;
	}
	it = IterateValue(to, false, "\"to\"");
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		if (tok == WJB_ELEM)
			targets = lappend_int(targets,
								  ResolveNode(graph, StringValue(&v, "a \"to\" element"), desc));
	nto = list_length(targets);
	if (nto == 0)
		DefinitionError("invalid graph definition: %s has an empty \"to\"", desc);
	if (nto > 1 && kind != EDGE_PLAIN && kind != EDGE_WHEN)
		DefinitionError("invalid graph definition: %s: only plain and when edges may fan out to several tasks",
						desc);
	edge = NewEdge(graph, kind, from_node, nto);
	nto = 0;
	foreach(lc, targets)
		edge->to[nto++] = lfirst_int(lc);
	return edge;
}

/* One element of "transitions": a chain, or an edge of one kind. */
static void
ParseTransition(Graph *graph, JsonbValue *elem, int number)
{
	TransitionKeys t = {0};
	char		desc[256];
	EdgeKind	kind;
	Edge	   *edge;
	int			from_node;

	snprintf(desc, sizeof(desc), "transition %d", number);
	ReadTransitionKeys(elem, desc, &t);

	if (t.chain.type == jbvBinary)
	{
		if (t.from || t.to.type != jbvNull || t.when || t.sw || t.for_each || t.as ||
			t.is_goto || t.on_error)
			DefinitionError("invalid graph definition: %s has \"chain\" and other keys", desc);
		ParseChain(graph, &t.chain, desc);
		return;
	}
	if (t.from == NULL || t.to.type == jbvNull)
		DefinitionError("invalid graph definition: %s needs \"from\" and \"to\" (or \"chain\")", desc);

	from_node = ResolveNode(graph, t.from, desc);
	if (from_node == NODE_END)
		DefinitionError("invalid graph definition: %s starts at END", desc);

	if (t.to.type == jbvString)
		snprintf(desc, sizeof(desc), "transition %d (from \"%s\" to \"%.*s\")",
				 number, t.from, t.to.val.string.len, t.to.val.string.val);
	else
		snprintf(desc, sizeof(desc), "transition %d (from \"%s\")", number, t.from);

	if ((t.when != NULL) + (t.sw != NULL) + (t.for_each != NULL) + t.is_goto + t.on_error > 1)
		DefinitionError("invalid graph definition: %s combines more than one of when, switch, for_each, goto and on_error",
						desc);
	if (t.as && !t.for_each)
		DefinitionError("invalid graph definition: %s has \"as\" without \"for_each\"", desc);

	kind = t.when ? EDGE_WHEN : t.sw ? EDGE_SWITCH : t.for_each ? EDGE_FOR_EACH :
		t.is_goto ? EDGE_GOTO : t.on_error ? EDGE_ERROR : EDGE_PLAIN;
	edge = NewEdgeTo(graph, kind, from_node, &t.to, desc);

	if (kind == EDGE_GOTO && edge->to[0] == NODE_END)
		DefinitionError("invalid graph definition: %s: a goto edge must name a task", desc);
	if (t.when || t.sw)
	{
		edge->path_text = t.when ? t.when : t.sw;
		edge->path = CompilePath(edge->path_text, desc);
	}
	if (t.for_each)
	{
		edge->for_each = t.for_each;
		edge->as = t.as ? t.as : pstrdup("item");
	}
}

/* An interval written as a string ("30 s", "2 min"), in microseconds. */
static int64
IntervalValue(JsonbValue *v, const char *what)
{
	char	   *text = StringValue(v, what);
	Interval   *span;
	int64		us;

	span = DatumGetIntervalP(DirectFunctionCall3(interval_in, CStringGetDatum(text),
												 ObjectIdGetDatum(InvalidOid),
												 Int32GetDatum(-1)));
	us = IntervalMicros(span, what);
	return us;
}

/*
 * An interval of a task's definition that must be longer than zero and at
 * most max_us (most says how much, in words).
 */
static int64
BoundedInterval(JsonbValue *v, const char *what, int64 max_us, const char *most)
{
	int64		us = IntervalValue(v, what);

	if (us <= 0)
		DefinitionError("invalid graph definition: %s must be longer than zero", what);
	if (us > max_us)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: %s is longer than %s", what, most),
				 errhint("A month counts as 30 days.")));
	return us;
}

/* A number JsonbValue as a double, or an error naming what it is. */
static double
NumberValue(JsonbValue *v, const char *what)
{
	if (v->type != jbvNumeric)
		DefinitionError("invalid graph definition: %s must be a number", what);
	return DatumGetFloat8(DirectFunctionCall1(numeric_float8,
											  NumericGetDatum(v->val.numeric)));
}

/*
 * The errors a function task retries when its policy says nothing of them:
 * those a later attempt can escape (a serialization failure, a deadlock, a
 * lock not available, a statement cancelled, a lost connection of class
 * 08, a resource run short of class 53).
 */
static const char *const TransientErrors[] = {
	"40001", "40P01", "55P03", "57014", "08", "53"
};

/* Adds a SQLSTATE ("40001") or class ("08") to policy's "on". */
static void
AddRetryOn(RetryPolicy *policy, const char *code, const char *task)
{
	int			len = strlen(code);
	int			i;

	for (i = 0; i < len; i++)
		if (!(isdigit((unsigned char) code[i]) || isupper((unsigned char) code[i])))
			break;
	if ((len != 5 && len != 2) || i < len)
		DefinitionError("invalid graph definition: \"%s\" in the retry \"on\" of task \"%s\" is neither a SQLSTATE nor a class",
						code, task);
	policy->on[policy->non] = len == 5 ?
		MAKE_SQLSTATE(code[0], code[1], code[2], code[3], code[4]) :
		MAKE_SQLSTATE(code[0], code[1], '0', '0', '0');
	policy->on_class[policy->non] = len == 2;
	policy->non++;
}

/*
 * "retry": {"attempts": 5, "initial": "1 s", "factor": 2, "max": "1 min",
 * "give_up_after": "1 h", "on": ["40001", "08"]}; every key optional.
 */
static void
ParseRetry(GraphNode *node, JsonbValue *retry)
{
	RetryPolicy *policy = &node->retry;
	JsonbIterator *it = IterateValue(retry, true,
									 psprintf("the retry of task \"%s\"", node->name));
	JsonbIteratorToken tok;
	JsonbValue	v;
	char	   *key;
	bool		has_on = false;

	while ((key = NextKey(&it, &v)) != NULL)
	{
		char	   *what = psprintf("the retry %s of task \"%s\"", key, node->name);

		if (strcmp(key, "attempts") == 0)
		{
			double		n = NumberValue(&v, what);

			if (!(n >= 1 && n <= INT_MAX) || n != floor(n))
				DefinitionError("invalid graph definition: %s must be a whole number of at least 1", what);
			policy->attempts = (int) n;
		}
		else if (strcmp(key, "initial") == 0)
			policy->initial_us = IntervalValue(&v, what);
		else if (strcmp(key, "max") == 0)
			policy->max_us = IntervalValue(&v, what);
		else if (strcmp(key, "give_up_after") == 0)
			policy->give_up_us = IntervalValue(&v, what);
		else if (strcmp(key, "factor") == 0)
		{
			policy->factor = NumberValue(&v, what);
			if (!(policy->factor >= 1.0) || isinf(policy->factor))
				DefinitionError("invalid graph definition: %s must be a finite number of at least 1", what);
		}
		else if (strcmp(key, "on") == 0)
		{
			JsonbIterator *on = IterateValue(&v, false, what);
			JsonbValue	e;

			if (node->kind != TASK_FUNCTION)
				DefinitionError("invalid graph definition: %s is for function tasks only", what);
			has_on = true;
			policy->on = palloc(sizeof(int) * Max(JsonContainerSize(v.val.binary.data), 1));
			policy->on_class = palloc(sizeof(bool) * Max(JsonContainerSize(v.val.binary.data), 1));
			while ((tok = JsonbIteratorNext(&on, &e, true)) != WJB_DONE)
				if (tok == WJB_ELEM)
					AddRetryOn(policy, StringValue(&e, what), node->name);
		}
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid graph definition: unknown key \"%s\" in the retry of task \"%s\"",
							key, node->name),
					 errhint("A retry policy has \"attempts\", \"initial\", \"factor\", \"max\", \"give_up_after\" and, for a function task, \"on\".")));
	}
	if (policy->max_us < policy->initial_us)
		policy->max_us = policy->initial_us;
	if (!has_on && node->kind == TASK_FUNCTION)
	{
		int			i;

		policy->on = palloc(sizeof(TransientErrors));
		policy->on_class = palloc(sizeof(TransientErrors));
		for (i = 0; i < lengthof(TransientErrors); i++)
			AddRetryOn(policy, TransientErrors[i], node->name);
	}
}

/*
 * One limit of a task: "name", or {"name": "name", "key": "$.path"} for one
 * count per value of the key in the step's input state (limits.c).  A name
 * must fit a limit's (dwarf.limit): 1 to NAMEDATALEN - 1 bytes, "role." not
 * counted.
 */
static void
ParseOneLimit(GraphNode *node, JsonbValue *v, const char *what)
{
	TaskLimit  *limit;
	const char *bare;
	int			i;

	if (node->nlimits == DWARF_MAX_TASK_LIMITS)
		DefinitionError("invalid graph definition: task \"%s\" names more than %d limits",
						node->name, DWARF_MAX_TASK_LIMITS);
	limit = &node->limits[node->nlimits];
	limit->name = NULL;
	limit->key = (Datum) 0;
	if (v->type == jbvBinary && JsonContainerIsObject(v->val.binary.data))
	{
		JsonbIterator *it = IterateValue(v, true, what);
		char	   *key;
		JsonbValue	val;

		while ((key = NextKey(&it, &val)) != NULL)
		{
			if (strcmp(key, "name") == 0)
				limit->name = StringValue(&val, psprintf("the limit name of task \"%s\"", node->name));
			else if (strcmp(key, "key") == 0)
			{
				char	   *path = StringValue(&val, psprintf("the limit key of task \"%s\"", node->name));

				limit->key = CompilePath(path, psprintf("the limit key of task \"%s\"", node->name));
			}
			else
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("invalid graph definition: unknown key \"%s\" in the limit of task \"%s\"",
								key, node->name),
						 errhint("A limit is a name, or {\"name\": \"openai\", \"key\": \"$.customer\"} for one count per value of the key.")));
		}
		if (limit->name == NULL)
			DefinitionError("invalid graph definition: the limit of task \"%s\" has no \"name\"",
							node->name);
	}
	else
		limit->name = StringValue(v, what);
	bare = strchr(limit->name, '.') ? strchr(limit->name, '.') + 1 : limit->name;
	if (limit->name[0] == '\0' || bare[0] == '\0' || strlen(bare) > NAMEDATALEN - 1)
		DefinitionError("invalid graph definition: \"%s\" cannot name the limit of task \"%s\"",
						limit->name, node->name);
	for (i = 0; i < node->nlimits; i++)
		if (strcmp(node->limits[i].name, limit->name) == 0)
			DefinitionError("invalid graph definition: task \"%s\" names limit \"%s\" twice",
							node->name, limit->name);
	node->nlimits++;
}

/*
 * "limit": one limit (ParseOneLimit), or an array of up to
 * DWARF_MAX_TASK_LIMITS of them, all of which a step takes before it
 * starts (a per-customer concurrency and a global rate on the same call).
 */
static void
ParseLimit(GraphNode *node, JsonbValue *v, const char *what)
{
	if (v->type == jbvBinary && JsonContainerIsArray(v->val.binary.data))
	{
		JsonbIterator *it = IterateValue(v, false, what);
		JsonbIteratorToken tok;
		JsonbValue	elem;

		while ((tok = JsonbIteratorNext(&it, &elem, true)) != WJB_DONE)
			if (tok == WJB_ELEM)
				ParseOneLimit(node, &elem, what);
		if (node->nlimits == 0)
			DefinitionError("invalid graph definition: %s is an empty array", what);
	}
	else
		ParseOneLimit(node, v, what);
}

/* Headers dwarf sets on every HTTP call, or that the transfer owns. */
static const char *const HttpOwnHeaders[] = {
	"idempotency-key", "content-type", "content-length", "host", "transfer-encoding",
	"expect", "connection"
};

/*
 * One header of an HTTP task: a name, and a value that is a string or
 * {"baggage": "key"} (the flow's baggage->>'key', read at each call, so that
 * a secret need not sit in the graph).  Added to the call's headers object.
 */
static void
ParseHttpHeader(JsonbParseState **state, const char *task, const char *name, JsonbValue *value)
{
	JsonbValue	k;
	int			i;

	if (name[0] == '\0' || strspn(name, "!#$%&'*+-.^_`|~0123456789"
								  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(name))
		DefinitionError("invalid graph definition: \"%s\" cannot name a header of task \"%s\"",
						name, task);
	for (i = 0; i < lengthof(HttpOwnHeaders); i++)
		if (pg_strcasecmp(name, HttpOwnHeaders[i]) == 0 || pg_strncasecmp(name, "dwarf-", 6) == 0)
			DefinitionError("invalid graph definition: task \"%s\" may not set header \"%s\": dwarf sets it",
							task, name);
	if (value->type == jbvString)
	{
		if (memchr(value->val.string.val, '\r', value->val.string.len) ||
			memchr(value->val.string.val, '\n', value->val.string.len))
			DefinitionError("invalid graph definition: header \"%s\" of task \"%s\" spans lines",
							name, task);
	}
	else if (value->type != jbvBinary || !JsonContainerIsObject(value->val.binary.data) ||
			 JsonContainerSize(value->val.binary.data) != 1 ||
			 JsonbField(JsonbValueToJsonb(value), "baggage") == NULL ||
			 JsonbField(JsonbValueToJsonb(value), "baggage")->type != jbvString)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: header \"%s\" of task \"%s\" must be a string or {\"baggage\": \"key\"}",
						name, task)));
	k.type = jbvString;
	k.val.string.val = (char *) name;
	k.val.string.len = strlen(name);
	pushJsonbValue(state, WJB_KEY, &k);
	pushJsonbValue(state, WJB_VALUE, value);
}

/*
 * An HTTP task's call: "POST http://host/path" (a URL alone is a POST), or
 * {"method", "url", "headers"}.  Checked here, at define: the method, an
 * http or https URL that has a normal form (url.c: no user information),
 * the headers.  Returns {"method", "url", "headers"}, the URL in normal
 * form, which is what the HTTP process checks against dwarf.http_allow and
 * calls.
 */
static Jsonb *
ParseHttp(GraphNode *node, JsonbValue *v)
{
	static const char *const methods[] = {"GET", "POST", "PUT", "PATCH", "DELETE"};
	const char *what = psprintf("the call (\"http\") of task \"%s\"", node->name);
	char	   *method = "POST";
	char	   *url = NULL;
	JsonbValue *headers = NULL;
	JsonbParseState *state = NULL;
	JsonbValue	k,
				val;
	char	   *normal;
	const char *why;
	bool		known = false;
	int			i;

	if (v->type == jbvString)
	{
		char	   *text = StringValue(v, what);
		char	   *space = strchr(text, ' ');

		url = text;
		if (space)
		{
			*space = '\0';
			method = text;
			url = space + 1;
		}
	}
	else
	{
		JsonbIterator *it = IterateValue(v, true, what);
		char	   *key;

		while ((key = NextKey(&it, &val)) != NULL)
		{
			if (strcmp(key, "method") == 0)
				method = StringValue(&val, psprintf("the method of task \"%s\"", node->name));
			else if (strcmp(key, "url") == 0)
				url = StringValue(&val, psprintf("the url of task \"%s\"", node->name));
			else if (strcmp(key, "headers") == 0)
			{
				headers = palloc(sizeof(JsonbValue));
				*headers = val;
			}
			else
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("invalid graph definition: unknown key \"%s\" in the call of task \"%s\"",
								key, node->name),
						 errhint("An HTTP call is \"METHOD url\", or an object with \"method\", \"url\" and \"headers\".")));
		}
		if (url == NULL)
			DefinitionError("invalid graph definition: the call of task \"%s\" has no \"url\"", node->name);
	}
	for (i = 0; i < lengthof(methods); i++)
		if (strcmp(method, methods[i]) == 0)
			known = true;
	if (!known)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: \"%s\" is not a method task \"%s\" may call with",
						method, node->name),
				 errhint("An HTTP task's method is GET, POST, PUT, PATCH or DELETE (in capitals).")));
	normal = UrlNormalize(url, &why);
	if (normal == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: \"%s\" is not a URL task \"%s\" may call", url, node->name),
				 errdetail("The URL cannot be used: %s.", why),
				 errhint("An HTTP task calls an http:// or https:// URL with a host, of at most %d characters, without spaces or user information.",
						 DWARF_MAX_URL)));
	url = normal;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	k.type = jbvString;
	val.type = jbvString;
	k.val.string.val = "method";
	k.val.string.len = 6;
	val.val.string.val = method;
	val.val.string.len = strlen(method);
	pushJsonbValue(&state, WJB_KEY, &k);
	pushJsonbValue(&state, WJB_VALUE, &val);
	k.val.string.val = "url";
	k.val.string.len = 3;
	val.val.string.val = url;
	val.val.string.len = strlen(url);
	pushJsonbValue(&state, WJB_KEY, &k);
	pushJsonbValue(&state, WJB_VALUE, &val);
	k.val.string.val = "headers";
	k.val.string.len = 7;
	pushJsonbValue(&state, WJB_KEY, &k);
	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	if (headers)
	{
		JsonbIterator *it = IterateValue(headers, true,
										 psprintf("the headers of task \"%s\"", node->name));
		JsonbIteratorToken tok;
		JsonbValue	h;

		while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
		{
			if (tok != WJB_KEY)
				continue;
			(void) JsonbIteratorNext(&it, &h, true);
			ParseHttpHeader(&state, node->name, pnstrdup(k.val.string.val, k.val.string.len), &h);
		}
	}
	pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/*
 * A task written as an object: {"function": "schema.fn"},
 * {"external": "queue"} or {"http": call}, with "retry", "time_budget",
 * "limit", (external) "lease" and (HTTP) "timeout".
 */
static void
ParseTaskObject(GraphNode *node, JsonbValue *v)
{
	JsonbIterator *it = IterateValue(v, true, psprintf("task \"%s\"", node->name));
	char	   *key;
	JsonbValue	val;
	JsonbValue *retry = NULL;
	int			kinds = 0;
	int64		timeout_us = 0;

	while ((key = NextKey(&it, &val)) != NULL)
	{
		char	   *what = psprintf("the %s of task \"%s\"", key, node->name);

		if (strcmp(key, "function") == 0)
		{
			node->kind = TASK_FUNCTION;
			node->fn_name = StringValue(&val, what);
			kinds++;
		}
		else if (strcmp(key, "external") == 0)
		{
			node->kind = TASK_EXTERNAL;
			node->queue = StringValue(&val, psprintf("the queue (\"external\") of task \"%s\"",
													 node->name));
			if (node->queue[0] == '\0' || strlen(node->queue) > NAMEDATALEN - 1 ||
				strncmp(node->queue, DWARF_OWN_QUEUES, strlen(DWARF_OWN_QUEUES)) == 0)
				DefinitionError("invalid graph definition: \"%s\" cannot name the queue of task \"%s\"",
								node->queue, node->name);
			kinds++;
		}
		else if (strcmp(key, "http") == 0)
		{
			node->kind = TASK_HTTP;
			node->http = ParseHttp(node, &val);
			kinds++;
		}
		else if (strcmp(key, "timeout") == 0)
			timeout_us = BoundedInterval(&val, what, DWARF_MAX_HTTP_TIMEOUT,
										 "1 day, the most an HTTP call may take");
		else if (strcmp(key, "lease") == 0)
		{
			node->lease_us = IntervalValue(&val, what);
			if (node->lease_us <= 0)
				DefinitionError("invalid graph definition: %s must be longer than zero", what);
		}
		else if (strcmp(key, "time_budget") == 0)
			node->time_budget_us = BoundedInterval(&val, what, DWARF_MAX_TIME_BUDGET,
												   "7 days, the most a step's time_budget may be");
		else if (strcmp(key, "limit") == 0)
			ParseLimit(node, &val, what);
		else if (strcmp(key, "retry") == 0)
		{
			retry = palloc(sizeof(JsonbValue));
			*retry = val;
		}
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid graph definition: unknown key \"%s\" in task \"%s\"",
							key, node->name),
					 errhint("A task is a function name, or an object with \"function\", \"external\" or \"http\" and optionally \"retry\", \"time_budget\", \"limit\", (external) \"lease\" and (HTTP) \"timeout\".")));
	}
	if (kinds != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: task \"%s\" must have one of \"function\", \"external\" and \"http\"",
						node->name),
				 errhint("{\"function\": \"schema.fn\"} is a SQL function; {\"external\": \"queue\"} is done by a worker outside the server (dwarf.claim); {\"http\": \"POST https://host/path\"} is an HTTP call the server makes.")));
	if (timeout_us > 0 && node->kind != TASK_HTTP)
		DefinitionError("invalid graph definition: only an HTTP task has a timeout (task \"%s\")",
						node->name);
	if (node->time_budget_us > 0 && node->kind == TASK_HTTP)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: HTTP task \"%s\" has no time_budget", node->name),
				 errhint("Its \"timeout\" limits how long one call may take.")));
	if (node->lease_us > 0 && node->kind != TASK_EXTERNAL)
		DefinitionError("invalid graph definition: only an external task has a lease (task \"%s\")",
						node->name);
	if (node->time_budget_us > 0 && node->kind == TASK_EXTERNAL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: external task \"%s\" has no time_budget", node->name),
				 errhint("Its lease limits how long a worker outside may take: an attempt whose lease runs out fails.")));
	if (node->kind == TASK_EXTERNAL && node->lease_us == 0)
		node->lease_us = DWARF_DEFAULT_LEASE_MS * INT64CONST(1000);
	if (node->kind == TASK_HTTP)
	{
		const char *key = "timeout_ms";
		JsonbValue	ms;

		if (timeout_us == 0)
			timeout_us = DWARF_DEFAULT_HTTP_TIMEOUT_MS * INT64CONST(1000);
		timeout_us = Max(timeout_us, 1000);
		ms.type = jbvNumeric;
		ms.val.numeric = int64_to_numeric((timeout_us + 999) / 1000);
		node->http = JsonbWithKeys(node->http, 1, &key, &ms);
		node->queue = DWARF_HTTP_QUEUE;
		node->lease_us = timeout_us + DWARF_HTTP_LEASE_MARGIN_MS * INT64CONST(1000);
	}
	if (retry)
		ParseRetry(node, retry);
}

/*
 * "tasks": {"name": "function" or {...}, ...}, each function resolved
 * (strict: it must exist).
 */
static void
ParseTasks(Graph *graph, JsonbValue *tasks, bool strict)
{
	JsonbIterator *it = IterateValue(tasks, true, "\"tasks\"");
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;
	int			n = 0;

	if (JsonContainerSize(tasks->val.binary.data) > DWARF_MAX_TASKS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("invalid graph definition: %d tasks is more than the %d a graph may have",
						(int) JsonContainerSize(tasks->val.binary.data), DWARF_MAX_TASKS),
				 errhint("Split the workflow into graphs that call each other with dwarf.subgraph().")));
	graph->nodes = palloc0(sizeof(GraphNode) * (JsonContainerSize(tasks->val.binary.data) + 1));
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		GraphNode	   *node;
		char	   *name;

		if (tok != WJB_KEY)
			continue;
		name = pnstrdup(k.val.string.val, k.val.string.len);
		(void) JsonbIteratorNext(&it, &v, true);
		if (name[0] == '\0' || strcmp(name, "END") == 0 || strlen(name) > NAMEDATALEN - 1)
			DefinitionError("invalid graph definition: \"%s\" cannot name a task", name);
		node = &graph->nodes[n++];
		node->name = name;
		node->kind = TASK_FUNCTION;
		node->retry.attempts = 1;
		node->retry.initial_us = USECS_PER_SEC;
		node->retry.factor = 2.0;
		node->retry.max_us = 5 * 60 * USECS_PER_SEC;
		if (v.type == jbvBinary && JsonContainerIsObject(v.val.binary.data))
		{
			node->spec = JsonbValueToJsonb(&v);
			ParseTaskObject(node, &v);
			if (node->kind == TASK_EXTERNAL || node->kind == TASK_HTTP)
				graph->has_external = true;
		}
		else
			node->fn_name = StringValue(&v, psprintf("the function of task \"%s\"", name));
		if (node->kind != TASK_FUNCTION)
			continue;
		node->fn = ResolveFunction(name, node->fn_name, strict);
		if (OidIsValid(node->fn))
			node->fn_name = quote_qualified_identifier(get_namespace_name(get_func_namespace(node->fn)),
													   get_func_name(node->fn));
	}
	graph->nnodes = n;
	if (n == 0)
		DefinitionError("invalid graph definition: \"tasks\" is empty");
}

/*
 * Is another attempt due after attempt failed (with sqlerrcode, for a
 * function task; 0 otherwise)?  Then *delay_us is its backoff:
 * min(initial * factor^(attempt - 1), max), at least dwarf.min_retry_delay.
 * No: the policy's attempts are used up, the error is not one it retries,
 * or the next attempt would start past give_up_after.
 */
bool
RetryAgain(RetryPolicy *policy, int attempt, TimestampTz first_started,
		   TimestampTz now, int sqlerrcode, int64 *delay_us)
{
	double		backoff;
	int64		delay;

	if (attempt >= policy->attempts)
		return false;
	if (sqlerrcode != 0)
	{
		int			i;

		for (i = 0; i < policy->non; i++)
			if (policy->on_class[i] ?
				ERRCODE_TO_CATEGORY(sqlerrcode) == policy->on[i] :
				sqlerrcode == policy->on[i])
				break;
		if (i == policy->non)
			return false;
	}
	backoff = (double) policy->initial_us * pow(policy->factor, attempt - 1);
	delay = backoff >= (double) policy->max_us ? policy->max_us : (int64) backoff;
	delay = Max(delay, (int64) dwarf_min_retry_delay * 1000);
	if (policy->give_up_us > 0 && now + delay - first_started > policy->give_up_us)
		return false;
	*delay_us = delay;
	return true;
}

/* "fan_in": ["task", ...], the tasks that wait for every branch of a fan-out. */
static void
ParseFanIn(Graph *graph, JsonbValue *fan_in)
{
	JsonbIterator *it = IterateValue(fan_in, false, "\"fan_in\"");
	JsonbIteratorToken tok;
	JsonbValue	v;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		int			node;

		if (tok != WJB_ELEM)
			continue;
		node = ResolveNode(graph, StringValue(&v, "a \"fan_in\" element"), "\"fan_in\"");
		if (node == NODE_END)
			DefinitionError("invalid graph definition: END cannot be a fan-in");
		graph->nodes[node].fan_in = true;
	}
}

/* "reducers": {"field": "append", ...}; also used by fold_changes (merge.c). */
Reducer *
ReducersParse(JsonbValue *reducers, int *nreducers)
{
	JsonbIterator *it = IterateValue(reducers, true, "\"reducers\"");
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;
	Reducer    *result;
	int			n = 0;

	result = palloc0(sizeof(Reducer) * (JsonContainerSize(reducers->val.binary.data) + 1));
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		char	   *field,
				   *name;
		int			r;

		if (tok != WJB_KEY)
			continue;
		field = pnstrdup(k.val.string.val, k.val.string.len);
		(void) JsonbIteratorNext(&it, &v, true);
		name = StringValue(&v, psprintf("the reducer of field \"%s\"", field));
		for (r = 0; r < lengthof(ReducerNames); r++)
			if (strcmp(name, ReducerNames[r]) == 0)
				break;
		if (r == lengthof(ReducerNames))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid graph definition: unknown reducer \"%s\" for field \"%s\"",
							name, field),
					 errhint("Reducers are replace, append, add, min, max, union, merge, and, or and concat.")));
		result[n].field = field;
		result[n].kind = (ReducerKind) r;
		n++;
	}
	*nreducers = n;
	return result;
}

/* The reducers of a stand-alone "reducers" object. */
Reducer *
ReducersFromJsonb(Jsonb *reducers, int *nreducers)
{
	JsonbValue	v;

	if (!JsonbIsObject(reducers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reducers must be a JSON object")));
	v.type = jbvBinary;
	v.val.binary.data = &reducers->root;
	v.val.binary.len = VARSIZE(reducers) - VARHDRSZ;
	return ReducersParse(&v, nreducers);
}

/* The entry: named, or else the one task no edge leads to. */
static void
FindEntry(Graph *graph, JsonbValue *entry)
{
	bool	   *has_incoming = palloc0(sizeof(bool) * graph->nnodes);
	int			i,
				j,
				candidates = 0;

	if (entry)
	{
		graph->entry = ResolveNode(graph, StringValue(entry, "\"entry\""), "\"entry\"");
		if (graph->entry == NODE_END)
			DefinitionError("invalid graph definition: the entry cannot be END");
		return;
	}
	for (i = 0; i < graph->nnodes; i++)
	{
		ListCell   *lc;

		foreach(lc, graph->nodes[i].edges)
		{
			Edge	   *edge = lfirst(lc);

			for (j = 0; j < edge->nto; j++)
				if (edge->to[j] >= 0)
					has_incoming[edge->to[j]] = true;
		}
	}
	for (i = 0; i < graph->nnodes; i++)
		if (!has_incoming[i])
		{
			graph->entry = i;
			candidates++;
		}
	if (candidates != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid graph definition: cannot tell the entry task"),
				 errdetail("%d tasks have no incoming edge.", candidates),
				 errhint("Name it with \"entry\".")));
}

/* Every task must be reachable from the entry, through edges of any kind. */
static void
CheckReachable(Graph *graph)
{
	bool	   *seen = palloc0(sizeof(bool) * graph->nnodes);
	int		   *stack = palloc(sizeof(int) * graph->nnodes);
	int			top = 0,
				i;

	seen[graph->entry] = true;
	stack[top++] = graph->entry;
	while (top > 0)
	{
		ListCell   *lc;

		foreach(lc, graph->nodes[stack[--top]].edges)
		{
			Edge	   *edge = lfirst(lc);

			for (i = 0; i < edge->nto; i++)
				if (edge->to[i] >= 0 && !seen[edge->to[i]])
				{
					seen[edge->to[i]] = true;
					stack[top++] = edge->to[i];
				}
		}
	}
	for (i = 0; i < graph->nnodes; i++)
		if (!seen[i])
			DefinitionError("invalid graph definition: task \"%s\" is unreachable from the entry \"%s\"",
							graph->nodes[i].name, graph->nodes[graph->entry].name);
}

/* A task may not mix switch edges with edges that fire by themselves. */
static void
CheckSwitchNotMixed(Graph *graph)
{
	int			i;

	for (i = 0; i < graph->nnodes; i++)
	{
		ListCell   *lc;
		bool		has_switch = false,
					has_other = false;

		foreach(lc, graph->nodes[i].edges)
		{
			Edge	   *edge = lfirst(lc);

			if (edge->kind == EDGE_SWITCH)
				has_switch = true;
			else if (edge->kind != EDGE_GOTO && edge->kind != EDGE_ERROR)
				has_other = true;
		}
		if (has_switch && has_other)
			DefinitionError("invalid graph definition: task \"%s\" mixes switch edges with other edges",
							graph->nodes[i].name);
	}
}

/*
 * A cycle of plain edges runs forever: each of its edges fires every time.
 * Only a goto edge on the way (the task may take it instead) lets a flow
 * leave such a cycle, so nodes with one are exempt.  Depth-first search,
 * colouring nodes white (0), on the stack (1) and done (2).
 */
static bool
FindPlainCycle(Graph *graph, int node, int *colour, int *path, int depth)
{
	ListCell   *lc;

	check_stack_depth();		/* one level per node on the path */
	CHECK_FOR_INTERRUPTS();
	colour[node] = 1;
	path[depth] = node;
	foreach(lc, graph->nodes[node].edges)
	{
		Edge	   *edge = lfirst(lc);

		if (edge->kind == EDGE_GOTO)
		{
			colour[node] = 2;
			return false;
		}
	}
	foreach(lc, graph->nodes[node].edges)
	{
		Edge	   *edge = lfirst(lc);
		int			i;

		if (edge->kind != EDGE_PLAIN)
			continue;
		for (i = 0; i < edge->nto; i++)
		{
			int			next = edge->to[i];

			if (next < 0)
				continue;
			if (colour[next] == 1)
			{
				StringInfoData cycle;
				int			d;

				initStringInfo(&cycle);
				for (d = 0; d <= depth && path[d] != next; d++)
					;
				for (; d <= depth; d++)
					appendStringInfo(&cycle, "%s -> ", graph->nodes[path[d]].name);
				appendStringInfoString(&cycle, graph->nodes[next].name);
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("invalid graph definition: the cycle %s can never be left",
								cycle.data),
						 errdetail("All its edges are unconditional."),
						 errhint("Make one of them a \"when\", \"switch\" or \"goto\" edge.")));
			}
			if (colour[next] == 0 &&
				FindPlainCycle(graph, next, colour, path, depth + 1))
				return true;
		}
	}
	colour[node] = 2;
	return false;
}

/* For an empty for_each: the first fan-in downstream of an edge's targets. */
static int
FindConvergence(Graph *graph, Edge *edge)
{
	bool	   *seen = palloc0(sizeof(bool) * graph->nnodes);
	int		   *queue = palloc(sizeof(int) * graph->nnodes);
	int			head = 0,
				tail = 0,
				i;

	for (i = 0; i < edge->nto; i++)
		if (edge->to[i] >= 0 && !seen[edge->to[i]])
		{
			seen[edge->to[i]] = true;
			queue[tail++] = edge->to[i];
		}
	while (head < tail)
	{
		int			node = queue[head++];
		ListCell   *lc;

		if (graph->nodes[node].fan_in)
		{
			pfree(seen);
			pfree(queue);
			return node;
		}
		foreach(lc, graph->nodes[node].edges)
		{
			Edge	   *e = lfirst(lc);

			if (e->kind == EDGE_ERROR || e->kind == EDGE_GOTO)
				continue;
			for (i = 0; i < e->nto; i++)
				if (e->to[i] >= 0 && !seen[e->to[i]])
				{
					seen[e->to[i]] = true;
					queue[tail++] = e->to[i];
				}
		}
	}
	pfree(seen);
	pfree(queue);
	return -1;
}

/*
 * Parses and checks a definition; the result lives in a new child of cxt.
 * Raises an error that names the offending node or edge.  Not strict (in a
 * worker, for a stored definition), a task whose function has since been
 * dropped gets an invalid oid, and only its steps fail.
 */
Graph *
GraphParse(Jsonb *definition, MemoryContext cxt, bool strict)
{
	MemoryContext gcxt = AllocSetContextCreate(cxt, "dwarf graph", ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(gcxt);
	Graph	   *graph = palloc0(sizeof(Graph));
	JsonbValue *tasks,
			   *transitions,
			   *fan_in,
			   *reducers,
			   *entry;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	int			number = 0,
				i;
	int		   *colour,
			   *path;

	graph->cxt = gcxt;
	if (!JsonbIsObject(definition))
		DefinitionError("invalid graph definition: it must be a JSON object");

	it = JsonbIteratorInit(&definition->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok != WJB_KEY)
			continue;
		if (!(v.val.string.len == 5 && strncmp(v.val.string.val, "tasks", 5) == 0) &&
			!(v.val.string.len == 11 && strncmp(v.val.string.val, "transitions", 11) == 0) &&
			!(v.val.string.len == 6 && strncmp(v.val.string.val, "fan_in", 6) == 0) &&
			!(v.val.string.len == 8 && strncmp(v.val.string.val, "reducers", 8) == 0) &&
			!(v.val.string.len == 5 && strncmp(v.val.string.val, "entry", 5) == 0))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid graph definition: unknown key \"%.*s\"",
							v.val.string.len, v.val.string.val),
					 errhint("A definition has \"tasks\", \"transitions\", and optionally \"entry\", \"fan_in\" and \"reducers\".")));
	}

	tasks = JsonbField(definition, "tasks");
	if (tasks == NULL)
		DefinitionError("invalid graph definition: \"tasks\" is missing");
	ParseTasks(graph, tasks, strict);

	transitions = JsonbField(definition, "transitions");
	if (transitions)
	{
		it = IterateValue(transitions, false, "\"transitions\"");
		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
			if (tok == WJB_ELEM)
				ParseTransition(graph, &v, ++number);
	}

	if ((fan_in = JsonbField(definition, "fan_in")) != NULL)
		ParseFanIn(graph, fan_in);
	if ((reducers = JsonbField(definition, "reducers")) != NULL)
		graph->reducers = ReducersParse(reducers, &graph->nreducers);

	entry = JsonbField(definition, "entry");
	FindEntry(graph, entry);
	CheckReachable(graph);
	CheckSwitchNotMixed(graph);

	colour = palloc0(sizeof(int) * graph->nnodes);
	path = palloc(sizeof(int) * (graph->nnodes + 1));
	for (i = 0; i < graph->nnodes; i++)
		if (colour[i] == 0)
			(void) FindPlainCycle(graph, i, colour, path, 0);

	for (i = 0; i < graph->nnodes; i++)
	{
		ListCell   *lc;

		/* Only an empty for_each needs it (the search is per edge: keep it rare). */
		foreach(lc, graph->nodes[i].edges)
			if (((Edge *) lfirst(lc))->kind == EDGE_FOR_EACH)
				((Edge *) lfirst(lc))->converge = FindConvergence(graph, lfirst(lc));
	}

	MemoryContextSwitchTo(old);
	return graph;
}

/*
 * The definition as dwarf.define stores it: the entry named, and every task's
 * function schema-qualified so that any search_path finds the same one (a
 * task written as an object keeps its other keys).
 */
Jsonb *
GraphNormalized(Graph *graph, Jsonb *definition)
{
	JsonbParseState *state = NULL;
	JsonbValue	keys[2];
	JsonbValue *tasks;
	const char *names[2] = {"entry", "tasks"};
	int			i;

	keys[0].type = jbvString;
	keys[0].val.string.val = graph->nodes[graph->entry].name;
	keys[0].val.string.len = strlen(graph->nodes[graph->entry].name);

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (i = 0; i < graph->nnodes; i++)
	{
		JsonbValue	k,
					v;

		k.type = jbvString;
		k.val.string.val = graph->nodes[i].name;
		k.val.string.len = strlen(graph->nodes[i].name);
		if (graph->nodes[i].spec == NULL)
		{
			v.type = jbvString;
			v.val.string.val = graph->nodes[i].fn_name;
			v.val.string.len = strlen(graph->nodes[i].fn_name);
		}
		else
		{
			Jsonb	   *spec = graph->nodes[i].spec;

			if (graph->nodes[i].kind == TASK_FUNCTION)
			{
				const char *fn_key = "function";
				JsonbValue	fn;

				fn.type = jbvString;
				fn.val.string.val = graph->nodes[i].fn_name;
				fn.val.string.len = strlen(graph->nodes[i].fn_name);
				spec = JsonbWithKeys(spec, 1, &fn_key, &fn);
			}
			v.type = jbvBinary;
			v.val.binary.data = &spec->root;
			v.val.binary.len = VARSIZE(spec) - VARHDRSZ;
		}
		pushJsonbValue(&state, WJB_KEY, &k);
		pushJsonbValue(&state, WJB_VALUE, &v);
	}
	tasks = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	keys[1].type = jbvBinary;
	keys[1].val.binary.data = &JsonbValueToJsonb(tasks)->root;
	keys[1].val.binary.len = 0;
	return JsonbWithKeys(definition, 2, names, keys);
}

/* One function's call, shared by the tasks that name it. */
typedef struct SharedCall
{
	Oid			fn;				/* hash key */
	FmgrInfo	flinfo;
} SharedCall;

/*
 * Looks up each task's function for calling, and forgets which roles may
 * execute them; once per graph in a worker, again after invalidations.
 */
void
GraphPrepareCalls(Graph *graph)
{
	int			i;
	HASHCTL		ctl;
	HTAB	   *calls;

	/*
	 * What the calls keep (a SQL function's plans, say) lives in a context
	 * of its own, emptied when they are set up again: memory does not grow
	 * with every CREATE FUNCTION.
	 */
	if (graph->calls_cxt == NULL)
		graph->calls_cxt = AllocSetContextCreate(graph->cxt, "dwarf task calls",
												 ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(graph->calls_cxt);
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(SharedCall);
	ctl.hcxt = graph->calls_cxt;
	calls = hash_create("dwarf task calls", 16, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (i = 0; i < graph->nnodes; i++)
	{
		GraphNode  *node = &graph->nodes[i];

		/*
		 * A function dropped (and perhaps made again) since: look its name
		 * up again; missing, the task's steps fail saying so.
		 */
		node->may_execute = InvalidOid;
		if (node->fn_name &&
			(!OidIsValid(node->fn) || !SearchSysCacheExists1(PROCOID, ObjectIdGetDatum(node->fn))))
			node->fn = ResolveFunction(node->name, node->fn_name, false);
		if (!OidIsValid(node->fn))
			continue;
		/* Tasks of one function share its call (and what it caches). */
		{
			bool		found;
			SharedCall *call = hash_search(calls, &node->fn, HASH_ENTER, &found);

			if (!found)
				fmgr_info_cxt(node->fn, &call->flinfo, graph->calls_cxt);
			node->flinfo = &call->flinfo;
		}
		node->fn_hash = GetSysCacheHashValue1(PROCOID, ObjectIdGetDatum(node->fn));
	}
	graph->prepared = true;
}

/*
 * Does a change to pg_proc with this syscache hash touch one of the graph's
 * functions?  (0: any change.)
 */
bool
GraphCallsFunction(Graph *graph, uint32 hashvalue)
{
	int			i;

	if (hashvalue == 0)
		return true;
	for (i = 0; i < graph->nnodes; i++)
		if (graph->nodes[i].fn_hash == hashvalue)
			return true;
	return false;
}

/* Where a flow starts: its start_task (fork, continue) if the graph has it, else the entry. */
int
GraphStartNode(Graph *graph, const char *start_task)
{
	int			node = start_task ? GraphNodeByName(graph, start_task) : -1;

	return node >= 0 ? node : graph->entry;
}

/* The goto edge from one task to another, or NULL. */
Edge *
GraphGotoEdge(Graph *graph, int from, int to)
{
	ListCell   *lc;

	foreach(lc, graph->nodes[from].edges)
	{
		Edge	   *edge = lfirst(lc);

		if (edge->kind == EDGE_GOTO && edge->to[0] == to)
			return edge;
	}
	return NULL;
}
