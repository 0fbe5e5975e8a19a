/*
 * merge.c
 *		Flow state: merging a step's changes into a state with the graph's
 *		per-field reducers; and dwarf.fold_changes, the same merge in SQL.
 *
 * A state is a JSON object.  A task returns its changes, also an object;
 * each changed field is combined with the old value by the field's reducer
 * (replace when none is named).  JSON null removes a replaced field and is
 * ignored for a reduced one, so one branch cannot wipe the others' work.
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/numeric.h"
#include "utils/varlena.h"

#include "dwarf.h"
#include "graph.h"
#include "json.h"

/* A JSON value's type, with its article, for error messages. */
static const char *
JsonTypeName(JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return "null";
		case jbvString:
			return "a string";
		case jbvNumeric:
			return "a number";
		case jbvBool:
			return "a boolean";
		case jbvBinary:
			return JsonContainerIsArray(v->val.binary.data) ? "an array" : "an object";
		default:
			return "a value";
	}
}

/* Is v an array (array) or an object (!array)? */
static bool
IsContainer(JsonbValue *v, bool array)
{
	return v->type == jbvBinary &&
		(array ? JsonContainerIsArray(v->val.binary.data) :
		 JsonContainerIsObject(v->val.binary.data));
}

/* Raises: the reducer cannot combine these two values. */
static void
ReducerTypeError(ReducerKind kind, const char *field, JsonbValue *old, JsonbValue *new)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATATYPE_MISMATCH),
			 errmsg("reducer \"%s\" of field \"%s\" cannot combine %s with %s",
					ReducerNames[kind], field, JsonTypeName(old), JsonTypeName(new))));
}

/* JSON equality of two values, scalars or containers. */
static bool
ValuesEqual(JsonbValue *a, JsonbValue *b)
{
	if (a->type != b->type)
		return false;
	switch (a->type)
	{
		case jbvNull:
			return true;
		case jbvBool:
			return a->val.boolean == b->val.boolean;
		case jbvString:
			return a->val.string.len == b->val.string.len &&
				memcmp(a->val.string.val, b->val.string.val, a->val.string.len) == 0;
		case jbvNumeric:
			return DatumGetInt32(DirectFunctionCall2(numeric_cmp,
													 NumericGetDatum(a->val.numeric),
													 NumericGetDatum(b->val.numeric))) == 0;
		case jbvBinary:
			return compareJsonbContainers(a->val.binary.data, b->val.binary.data) == 0;
		default:
			return false;
	}
}

/* The elements of an array value; a scalar or object counts as one element. */
static List *
Elements(JsonbValue *v)
{
	List	   *result = NIL;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	e;

	if (!IsContainer(v, true))
		return list_make1(v);
	it = JsonbIteratorInit(v->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &e, true)) != WJB_DONE)
		if (tok == WJB_ELEM)
		{
			JsonbValue *copy = palloc(sizeof(JsonbValue));

			*copy = e;
			result = lappend(result, copy);
		}
	return result;
}

/* An array value of the given elements. */
static JsonbValue *
ArrayOf(List *elems)
{
	JsonbParseState *state = NULL;
	ListCell   *lc;

	pushJsonbValue(&state, WJB_BEGIN_ARRAY, NULL);
	foreach(lc, elems)
		pushJsonbValue(&state, WJB_ELEM, lfirst(lc));
	return JsonbAsBinary(pushJsonbValue(&state, WJB_END_ARRAY, NULL));
}

/* Compares two numbers, or two strings in the C collation; else raises. */
static int
CompareScalars(ReducerKind kind, const char *field, JsonbValue *a, JsonbValue *b)
{
	if (a->type == jbvNumeric && b->type == jbvNumeric)
		return DatumGetInt32(DirectFunctionCall2(numeric_cmp,
												 NumericGetDatum(a->val.numeric),
												 NumericGetDatum(b->val.numeric)));
	if (a->type == jbvString && b->type == jbvString)
		return varstr_cmp(a->val.string.val, a->val.string.len,
						  b->val.string.val, b->val.string.len, C_COLLATION_OID);
	ReducerTypeError(kind, field, a, b);
	return 0;
}

/* Checks that a reducer can take a field's first value, or raises. */
static void
CheckFirstValue(ReducerKind kind, const char *field, JsonbValue *new)
{
	bool		fits;

	switch (kind)
	{
		case RED_ADD:
			fits = new->type == jbvNumeric;
			break;
		case RED_MIN:
		case RED_MAX:
			fits = new->type == jbvNumeric || new->type == jbvString;
			break;
		case RED_AND:
		case RED_OR:
			fits = new->type == jbvBool;
			break;
		case RED_MERGE:
			fits = IsContainer(new, false);
			break;
		case RED_CONCAT:
			fits = new->type == jbvString || IsContainer(new, true);
			break;
		default:
			fits = true;
			break;
	}
	if (!fits)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("reducer \"%s\" of field \"%s\" cannot take %s",
						ReducerNames[kind], field, JsonTypeName(new))));
}

/* Two strings, one after the other. */
static JsonbValue *
ConcatStrings(JsonbValue *a, JsonbValue *b)
{
	JsonbValue *result = palloc(sizeof(JsonbValue));

	result->type = jbvString;
	result->val.string.len = a->val.string.len + b->val.string.len;
	result->val.string.val = palloc(result->val.string.len + 1);
	memcpy(result->val.string.val, a->val.string.val, a->val.string.len);
	memcpy(result->val.string.val + a->val.string.len,
		   b->val.string.val, b->val.string.len);
	return result;
}

/* The array old with each element of new it does not hold yet appended. */
static JsonbValue *
ArrayUnion(JsonbValue *old, JsonbValue *new)
{
	List	   *elems = Elements(old);
	ListCell   *lc;

	foreach(lc, Elements(new))
	{
		ListCell   *lc2;
		bool		present = false;

		foreach(lc2, elems)
			if (ValuesEqual(lfirst(lc), lfirst(lc2)))
				present = true;
		if (!present)
			elems = lappend(elems, lfirst(lc));
	}
	return ArrayOf(elems);
}

/* The object old with new's pairs on top. */
static JsonbValue *
MergeObjects(JsonbValue *old, JsonbValue *new)
{
	JsonbParseState *state = NULL;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	JsonbPushPairsExcept(&state, old->val.binary.data, 0, NULL);
	JsonbPushPairsExcept(&state, new->val.binary.data, 0, NULL);
	return JsonbAsBinary(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/* Combines two present values with a reducer other than replace. */
static JsonbValue *
Combine(ReducerKind kind, const char *field, JsonbValue *old, JsonbValue *new)
{
	JsonbValue *result;

	switch (kind)
	{
		case RED_APPEND:
			/* An array appends its elements; wrap it ([[...]]) to append it whole. */
			return ArrayOf(list_concat(Elements(old), Elements(new)));
		case RED_CONCAT:
			if (old->type == jbvString && new->type == jbvString)
				return ConcatStrings(old, new);
			if (!IsContainer(old, true))
				ReducerTypeError(kind, field, old, new);
			return ArrayOf(list_concat(Elements(old), Elements(new)));
		case RED_UNION:
			if (!IsContainer(old, true))
				ReducerTypeError(kind, field, old, new);
			return ArrayUnion(old, new);
		case RED_ADD:
			if (old->type != jbvNumeric || new->type != jbvNumeric)
				ReducerTypeError(kind, field, old, new);
			result = palloc(sizeof(JsonbValue));
			result->type = jbvNumeric;
			result->val.numeric =
				DatumGetNumeric(DirectFunctionCall2(numeric_add,
													NumericGetDatum(old->val.numeric),
													NumericGetDatum(new->val.numeric)));
			return result;
		case RED_MIN:
			return CompareScalars(kind, field, old, new) <= 0 ? old : new;
		case RED_MAX:
			return CompareScalars(kind, field, old, new) >= 0 ? old : new;
		case RED_AND:
		case RED_OR:
			if (old->type != jbvBool || new->type != jbvBool)
				ReducerTypeError(kind, field, old, new);
			result = palloc(sizeof(JsonbValue));
			result->type = jbvBool;
			result->val.boolean = kind == RED_AND ?
				(old->val.boolean && new->val.boolean) :
				(old->val.boolean || new->val.boolean);
			return result;
		case RED_MERGE:
			if (!IsContainer(old, false) || !IsContainer(new, false))
				ReducerTypeError(kind, field, old, new);
			return MergeObjects(old, new);
		case RED_REPLACE:
			break;
	}
	return new;
}

/*
 * Combines a field's old value (NULL when absent) with a change.  Returns
 * NULL when the field should be absent afterwards.
 */
static JsonbValue *
Reduce(ReducerKind kind, const char *field, JsonbValue *old, JsonbValue *new)
{
	if (new->type == jbvNull)
		return kind == RED_REPLACE ? NULL : old;
	if (kind == RED_REPLACE)
		return new;
	if (old == NULL || old->type == jbvNull)
	{
		/* The first value: taken as it is, but union drops its duplicates. */
		CheckFirstValue(kind, field, new);
		if (kind == RED_APPEND)
			return ArrayOf(Elements(new));
		if (kind != RED_UNION)
			return new;
		old = ArrayOf(NIL);
	}
	return Combine(kind, field, old, new);
}

/* The reducer of the field named by key; replace when none is named. */
static ReducerKind
ReducerFor(Reducer *reducers, int nreducers, JsonbValue *key)
{
	int			i;

	for (i = 0; i < nreducers; i++)
		if (strlen(reducers[i].field) == key->val.string.len &&
			memcmp(reducers[i].field, key->val.string.val, key->val.string.len) == 0)
			return reducers[i].kind;
	return RED_REPLACE;
}

/*
 * The state after a step: each changed field combined with its old value by
 * its reducer.  Returns state itself when there is nothing to change.
 */
Jsonb *
MergeChanges(Jsonb *state, Jsonb *changes, Reducer *reducers, int nreducers)
{
	JsonbParseState *ps = NULL;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;
	int			nchanges = JsonContainerSize(&changes->root);
	JsonbValue *ckeys,
			   *cvals;
	bool	   *used;
	int			n = 0,
				i;

	if (nchanges == 0)
		return state;

	ckeys = palloc(sizeof(JsonbValue) * nchanges);
	cvals = palloc(sizeof(JsonbValue) * nchanges);
	used = palloc0(sizeof(bool) * nchanges);
	it = JsonbIteratorInit(&changes->root);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		if (tok != WJB_KEY)
			continue;
		ckeys[n] = k;
		(void) JsonbIteratorNext(&it, &cvals[n], true);
		n++;
	}

	pushJsonbValue(&ps, WJB_BEGIN_OBJECT, NULL);
	it = JsonbIteratorInit(&state->root);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		JsonbValue *result = NULL;

		if (tok != WJB_KEY)
			continue;
		(void) JsonbIteratorNext(&it, &v, true);
		for (i = 0; i < n; i++)
			if (!used[i] && ckeys[i].val.string.len == k.val.string.len &&
				memcmp(ckeys[i].val.string.val, k.val.string.val, k.val.string.len) == 0)
				break;
		if (i == n)
			result = &v;
		else
		{
			char	   *field = pnstrdup(k.val.string.val, k.val.string.len);

			used[i] = true;
			result = Reduce(ReducerFor(reducers, nreducers, &k), field, &v, &cvals[i]);
		}
		if (result)
		{
			pushJsonbValue(&ps, WJB_KEY, &k);
			pushJsonbValue(&ps, WJB_VALUE, result);
		}
	}
	for (i = 0; i < n; i++)
	{
		JsonbValue *result;

		if (used[i])
			continue;
		result = Reduce(ReducerFor(reducers, nreducers, &ckeys[i]),
						pnstrdup(ckeys[i].val.string.val, ckeys[i].val.string.len),
						NULL, &cvals[i]);
		if (result)
		{
			pushJsonbValue(&ps, WJB_KEY, &ckeys[i]);
			pushJsonbValue(&ps, WJB_VALUE, result);
		}
	}
	return JsonbValueToJsonb(pushJsonbValue(&ps, WJB_END_OBJECT, NULL));
}

DWARF_FUNCTION(dwarf_fold_changes);

/*
 * dwarf.fold_changes(input, changes[], reducers): input with each change
 * merged in order.  dwarf.snapshot uses it for a running flow's state.
 */
Datum
dwarf_fold_changes(PG_FUNCTION_ARGS)
{
	Jsonb	   *state;
	Reducer    *reducers = NULL;
	int			nreducers = 0;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems,
				i;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	state = PG_GETARG_JSONB_P(0);
	if (PG_ARGISNULL(1))
		PG_RETURN_JSONB_P(state);
	if (!PG_ARGISNULL(2))
		reducers = ReducersFromJsonb(PG_GETARG_JSONB_P(2), &nreducers);
	if (!JsonbIsObject(state))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a flow state must be a JSON object")));

	deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), JSONBOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);
	for (i = 0; i < nelems; i++)
	{
		Jsonb	   *changes;

		if (nulls[i])
			continue;
		changes = DatumGetJsonbP(elems[i]);
		if (JsonbIsObject(changes))
			state = MergeChanges(state, changes, reducers, nreducers);
	}
	PG_RETURN_JSONB_P(state);
}
