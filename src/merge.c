/*
 * merge.c
 *		Flow state: merging a step's changes into a state with the graph's
 *		per-field reducers; and dwarf_internal.fold_changes, the same merge in
 *		SQL.
 *
 * A state is a JSON object.  A task returns its changes, also an object;
 * each changed field is combined with the old value by the field's reducer
 * (replace when none is named).  JSON null removes a replaced field and is
 * ignored for a reduced one, so one branch cannot wipe the others' work.
 *
 * Many changes fold in one pass (FoldChanges): each changed field keeps a
 * running value (the elements of an append, the pairs of a merge, the
 * text of a concat) and the state is built once at the end, so folding n
 * changes costs O(n) however the state grows, where merging them one by
 * one would copy the growing state n times.  What a change needs only
 * while it is folded lives in a context reset after each change.
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
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

/* Raises: the reducer cannot combine a value of type old with new. */
static void
ReducerTypeError(ReducerKind kind, const char *field, const char *old, JsonbValue *new)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATATYPE_MISMATCH),
			 errmsg("reducer \"%s\" of field \"%s\" cannot combine %s with %s",
					ReducerNames[kind], field, old, JsonTypeName(new))));
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
	ReducerTypeError(kind, field, JsonTypeName(a), b);
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

/* How a field's running value is held while changes fold into it. */
typedef enum AccMode
{
	ACC_ABSENT,					/* not in the state */
	ACC_VALUE,					/* one value: value */
	ACC_ELEMS,					/* an array: items are its elements */
	ACC_STRING,					/* a string: text (concat) */
	ACC_PAIRS					/* an object: items are key, value, key, ... */
} AccMode;

/* A changed field's running value. */
typedef struct FieldAcc
{
	char	   *name;			/* NUL-terminated */
	ReducerKind kind;
	AccMode		mode;
	JsonbValue	value;			/* ACC_VALUE */
	bool		own_numeric;	/* value's numeric is the fold's, to free */
	List	   *items;			/* ACC_ELEMS, ACC_PAIRS: JsonbValue pointers */
	StringInfoData text;		/* ACC_STRING */
	int64		bytes;			/* about what it takes in the state */
} FieldAcc;

/* Fields are found by a list's scan up to this many, then by a hash table. */
#define FOLD_SCAN_FIELDS 16

typedef struct FieldEntry
{
	char	   *name;			/* hash key: the pointer, hashed as a string */
	FieldAcc   *acc;
} FieldEntry;

/* A fold under way. */
typedef struct Fold
{
	Jsonb	   *state;			/* what it starts from */
	Reducer    *reducers;
	int			nreducers;
	List	   *fields;			/* FieldAccs, first changed first */
	HTAB	   *index;			/* name -> FieldAcc, past FOLD_SCAN_FIELDS */
	MemoryContext cxt;			/* what the fold keeps */
	int64		size;			/* about the state's size */
} Fold;

static uint32
FieldHash(const void *key, Size keysize)
{
	const char *name = *(char *const *) key;

	return hash_bytes((const unsigned char *) name, strlen(name));
}

static int
FieldMatch(const void *a, const void *b, Size keysize)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* About what a value takes in a state: its data and its entry. */
static int64
ValueSize(JsonbValue *v)
{
	int64		size = sizeof(JEntry);

	switch (v->type)
	{
		case jbvBinary:
			return size + v->val.binary.len;
		case jbvString:
			return size + v->val.string.len;
		case jbvNumeric:
			return size + VARSIZE_ANY(v->val.numeric);
		default:
			return size;
	}
}

/* The running value of the field name, or NULL when no change named it. */
static FieldAcc *
FindField(Fold *f, char *name)
{
	ListCell   *lc;
	FieldEntry *entry;

	if (f->index)
	{
		entry = hash_search(f->index, &name, HASH_FIND, NULL);
		return entry ? entry->acc : NULL;
	}
	foreach(lc, f->fields)
		if (strcmp(((FieldAcc *) lfirst(lc))->name, name) == 0)
			return lfirst(lc);
	return NULL;
}

/* Indexes a field, building the index once there are many. */
static void
IndexField(Fold *f, FieldAcc *acc)
{
	FieldEntry *entry;
	ListCell   *lc;

	if (f->index == NULL)
	{
		HASHCTL		ctl;

		if (list_length(f->fields) <= FOLD_SCAN_FIELDS)
			return;
		ctl.keysize = sizeof(char *);
		ctl.entrysize = sizeof(FieldEntry);
		ctl.hash = FieldHash;
		ctl.match = FieldMatch;
		ctl.hcxt = f->cxt;
		f->index = hash_create("dwarf fold fields", 256, &ctl,
							   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
		foreach(lc, f->fields)
			IndexField(f, lfirst(lc));
		return;
	}
	entry = hash_search(f->index, &acc->name, HASH_ENTER, NULL);
	entry->acc = acc;
}

/* The running value of a field a change names: made from the state the first time. */
static FieldAcc *
GetField(Fold *f, JsonbValue *key)
{
	char	   *name = pnstrdup(key->val.string.val, key->val.string.len);
	FieldAcc   *acc = FindField(f, name);
	JsonbValue *old;
	MemoryContext prev;
	int			i;

	if (acc)
		return acc;
	prev = MemoryContextSwitchTo(f->cxt);
	acc = palloc0(sizeof(FieldAcc));
	acc->name = pstrdup(name);
	acc->kind = RED_REPLACE;
	for (i = 0; i < f->nreducers; i++)
		if (strcmp(f->reducers[i].field, name) == 0)
			acc->kind = f->reducers[i].kind;
	old = getKeyJsonValueFromContainer(&f->state->root, key->val.string.val,
									   key->val.string.len, NULL);
	if (old)
	{
		acc->mode = ACC_VALUE;
		acc->value = *old;
		acc->bytes = ValueSize(old);
	}
	f->fields = lappend(f->fields, acc);
	IndexField(f, acc);
	MemoryContextSwitchTo(prev);
	return acc;
}

/* Sets a field to one value (copied: v may be an iterator's). */
static void
SetValue(Fold *f, FieldAcc *acc, JsonbValue *v, bool copy_numeric)
{
	if (acc->own_numeric)
		pfree(acc->value.val.numeric);
	acc->own_numeric = false;
	acc->mode = ACC_VALUE;
	acc->items = NIL;
	acc->value = *v;
	if (copy_numeric && v->type == jbvNumeric)
	{
		acc->value.val.numeric = MemoryContextAlloc(f->cxt, VARSIZE(v->val.numeric));
		memcpy(acc->value.val.numeric, v->val.numeric, VARSIZE(v->val.numeric));
		acc->own_numeric = true;
	}
	acc->bytes = ValueSize(&acc->value);
}

/* Appends a copy of v to a field's items. */
static void
AddItem(Fold *f, FieldAcc *acc, JsonbValue *v)
{
	MemoryContext prev = MemoryContextSwitchTo(f->cxt);
	JsonbValue *copy = palloc(sizeof(JsonbValue));

	*copy = *v;
	acc->items = lappend(acc->items, copy);
	acc->bytes += ValueSize(v);
	MemoryContextSwitchTo(prev);
}

/* Appends v to a field's elements; with unique, unless it holds it already. */
static void
AddElement(Fold *f, FieldAcc *acc, JsonbValue *v, bool unique)
{
	ListCell   *lc;

	if (unique)
		foreach(lc, acc->items)
			if (ValuesEqual(v, lfirst(lc)))
				return;
	AddItem(f, acc, v);
}

/*
 * Appends the elements of v to a field's items (a scalar or object counts
 * as one element); with unique, only those it does not hold yet.
 */
static void
AddElements(Fold *f, FieldAcc *acc, JsonbValue *v, bool unique)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	e;

	if (!IsContainer(v, true))
	{
		AddElement(f, acc, v, unique);
		return;
	}
	it = JsonbIteratorInit(v->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &e, true)) != WJB_DONE)
		if (tok == WJB_ELEM)
			AddElement(f, acc, &e, unique);
}

/* Appends the pairs of an object to a field's items. */
static void
AddPairs(Fold *f, FieldAcc *acc, JsonbValue *obj)
{
	JsonbIterator *it = JsonbIteratorInit(obj->val.binary.data);
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;

	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		if (tok != WJB_KEY)
			continue;
		(void) JsonbIteratorNext(&it, &v, true);
		AddItem(f, acc, &k);
		AddItem(f, acc, &v);
	}
}

/* A field held as one value becomes a list of items: elements, or pairs. */
static void
ToItems(Fold *f, FieldAcc *acc, AccMode mode)
{
	JsonbValue	old = acc->value;

	acc->mode = mode;
	acc->items = NIL;
	acc->bytes = 0;
	if (mode == ACC_PAIRS)
		AddPairs(f, acc, &old);
	else
		AddElements(f, acc, &old, false);
}

/* A field held as one string becomes a growing text. */
static void
ToText(Fold *f, FieldAcc *acc)
{
	MemoryContext prev = MemoryContextSwitchTo(f->cxt);

	initStringInfo(&acc->text);
	appendBinaryStringInfo(&acc->text, acc->value.val.string.val,
						   acc->value.val.string.len);
	acc->mode = ACC_STRING;
	MemoryContextSwitchTo(prev);
}

/* The type of a field's running value, for error messages. */
static const char *
FieldTypeName(FieldAcc *acc)
{
	switch (acc->mode)
	{
		case ACC_ELEMS:
			return "an array";
		case ACC_STRING:
			return "a string";
		case ACC_PAIRS:
			return "an object";
		default:
			return JsonTypeName(&acc->value);
	}
}

/* The first value of a reduced field (absent, or JSON null, before). */
static void
FirstValue(Fold *f, FieldAcc *acc, JsonbValue *new)
{
	/* Taken as it is, but append makes it an array, union drops duplicates. */
	CheckFirstValue(acc->kind, acc->name, new);
	acc->bytes = 0;
	acc->items = NIL;
	switch (acc->kind)
	{
		case RED_APPEND:
		case RED_UNION:
			acc->mode = ACC_ELEMS;
			AddElements(f, acc, new, acc->kind == RED_UNION);
			break;
		case RED_CONCAT:
			SetValue(f, acc, new, false);
			if (new->type == jbvString)
				ToText(f, acc);
			else
				ToItems(f, acc, ACC_ELEMS);
			break;
		case RED_MERGE:
			acc->mode = ACC_PAIRS;
			AddPairs(f, acc, new);
			break;
		default:
			SetValue(f, acc, new, false);
			break;
	}
}

/*
 * Folds one change of a field into its running value with the field's
 * reducer.  JSON null removes a replaced field and is ignored otherwise.
 */
static void
FoldField(Fold *f, FieldAcc *acc, JsonbValue *new)
{
	ReducerKind kind = acc->kind;
	JsonbValue *result;

	if (new->type == jbvNull)
	{
		if (kind == RED_REPLACE)
		{
			SetValue(f, acc, new, false);
			acc->mode = ACC_ABSENT;
			acc->bytes = 0;
		}
		return;
	}
	if (kind == RED_REPLACE)
	{
		SetValue(f, acc, new, false);
		return;
	}
	if (acc->mode == ACC_ABSENT ||
		(acc->mode == ACC_VALUE && acc->value.type == jbvNull))
	{
		FirstValue(f, acc, new);
		return;
	}

	switch (kind)
	{
		case RED_APPEND:
			/* An array appends its elements; wrap it ([[...]]) to append it whole. */
			if (acc->mode == ACC_VALUE)
				ToItems(f, acc, ACC_ELEMS);
			AddElements(f, acc, new, false);
			return;
		case RED_CONCAT:
			if (acc->mode == ACC_VALUE && acc->value.type == jbvString &&
				new->type == jbvString)
				ToText(f, acc);
			if (acc->mode == ACC_STRING)
			{
				if (new->type != jbvString)
					ReducerTypeError(kind, acc->name, "a string", new);
				appendBinaryStringInfo(&acc->text, new->val.string.val, new->val.string.len);
				acc->bytes += new->val.string.len;
				return;
			}
			if (acc->mode == ACC_VALUE && !IsContainer(&acc->value, true))
				ReducerTypeError(kind, acc->name, FieldTypeName(acc), new);
			if (acc->mode == ACC_VALUE)
				ToItems(f, acc, ACC_ELEMS);
			AddElements(f, acc, new, false);
			return;
		case RED_UNION:
			if (acc->mode == ACC_VALUE && !IsContainer(&acc->value, true))
				ReducerTypeError(kind, acc->name, FieldTypeName(acc), new);
			if (acc->mode == ACC_VALUE)
				ToItems(f, acc, ACC_ELEMS);
			AddElements(f, acc, new, true);
			return;
		case RED_MERGE:
			if ((acc->mode == ACC_VALUE && !IsContainer(&acc->value, false)) ||
				!IsContainer(new, false))
				ReducerTypeError(kind, acc->name, FieldTypeName(acc), new);
			if (acc->mode == ACC_VALUE)
				ToItems(f, acc, ACC_PAIRS);
			AddPairs(f, acc, new);
			return;
		case RED_ADD:
			if (acc->value.type != jbvNumeric || new->type != jbvNumeric)
				ReducerTypeError(kind, acc->name, FieldTypeName(acc), new);
			result = palloc(sizeof(JsonbValue));
			result->type = jbvNumeric;
			result->val.numeric =
				DatumGetNumeric(DirectFunctionCall2(numeric_add,
													NumericGetDatum(acc->value.val.numeric),
													NumericGetDatum(new->val.numeric)));
			SetValue(f, acc, result, true);
			return;
		case RED_MIN:
		case RED_MAX:
			{
				int			cmp = CompareScalars(kind, acc->name, &acc->value, new);

				if (kind == RED_MIN ? cmp > 0 : cmp < 0)
					SetValue(f, acc, new, false);
				return;
			}
		case RED_AND:
		case RED_OR:
			if (acc->value.type != jbvBool || new->type != jbvBool)
				ReducerTypeError(kind, acc->name, FieldTypeName(acc), new);
			acc->value.val.boolean = kind == RED_AND ?
				(acc->value.val.boolean && new->val.boolean) :
				(acc->value.val.boolean || new->val.boolean);
			return;
		case RED_REPLACE:
			break;
	}
}

/* Is key one of the keys to drop? */
static bool
Dropped(const char *name, int len, int ndrop, const char **drop)
{
	int			i;

	for (i = 0; i < ndrop; i++)
		if (strlen(drop[i]) == len && memcmp(drop[i], name, len) == 0)
			return true;
	return false;
}

/* Pushes a field's running value under its key. */
static void
PushField(JsonbParseState **ps, FieldAcc *acc)
{
	JsonbValue	k;
	ListCell   *lc;
	int			i;

	k.type = jbvString;
	k.val.string.val = acc->name;
	k.val.string.len = strlen(acc->name);
	pushJsonbValue(ps, WJB_KEY, &k);
	switch (acc->mode)
	{
		case ACC_ABSENT:
			Assert(false);
			break;
		case ACC_VALUE:
			pushJsonbValue(ps, WJB_VALUE, &acc->value);
			break;
		case ACC_STRING:
			k.val.string.val = acc->text.data;
			k.val.string.len = acc->text.len;
			pushJsonbValue(ps, WJB_VALUE, &k);
			break;
		case ACC_ELEMS:
			pushJsonbValue(ps, WJB_BEGIN_ARRAY, NULL);
			foreach(lc, acc->items)
				pushJsonbValue(ps, WJB_ELEM, lfirst(lc));
			pushJsonbValue(ps, WJB_END_ARRAY, NULL);
			break;
		case ACC_PAIRS:
			/* a key met twice keeps its last value (as jsonb does) */
			pushJsonbValue(ps, WJB_BEGIN_OBJECT, NULL);
			for (i = 0; i + 1 < list_length(acc->items); i += 2)
			{
				pushJsonbValue(ps, WJB_KEY, list_nth(acc->items, i));
				pushJsonbValue(ps, WJB_VALUE, list_nth(acc->items, i + 1));
			}
			pushJsonbValue(ps, WJB_END_OBJECT, NULL);
			break;
	}
}

/*
 * The state after the changes, in order, each changed field combined with
 * its value so far by its reducer, less the keys in drop (the for_each
 * keys at a fan-in).  Made in the caller's context; returns state itself
 * when there is nothing to do.  With max_kb > 0, a state that would grow
 * past max_kb kilobytes (dwarf.max_state_size) raises an error as soon as
 * a change takes it there, so that a fold is bounded in memory as well as
 * linear in time.
 */
Jsonb *
FoldChanges(Jsonb *state, int nchanges, Jsonb **changes,
			Reducer *reducers, int nreducers, int ndrop, const char **drop,
			int max_kb)
{
	MemoryContext caller = CurrentMemoryContext;
	MemoryContext tmp;
	JsonbParseState *ps = NULL;
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;
	ListCell   *lc;
	Fold		f = {0};
	Jsonb	   *result;
	int			i;

	if (nchanges == 0 && ndrop == 0)
		return state;
	f.state = state;
	f.reducers = reducers;
	f.nreducers = nreducers;
	f.size = VARSIZE(state);
	/* one change (a step's merge) leaves its little garbage to the caller */
	f.cxt = tmp = caller;
	if (nchanges > 1)
	{
		f.cxt = AllocSetContextCreate(caller, "dwarf fold", ALLOCSET_DEFAULT_SIZES);
		tmp = AllocSetContextCreate(f.cxt, "dwarf fold change", ALLOCSET_DEFAULT_SIZES);
	}

	for (i = 0; i < nchanges; i++)
	{
		CHECK_FOR_INTERRUPTS();
		MemoryContextSwitchTo(tmp);
		it = JsonbIteratorInit(&changes[i]->root);
		while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
		{
			FieldAcc   *acc;
			int64		before;

			if (tok != WJB_KEY)
				continue;
			(void) JsonbIteratorNext(&it, &v, true);
			acc = GetField(&f, &k);
			before = acc->bytes;
			FoldField(&f, acc, &v);
			f.size += acc->bytes - before;
		}
		MemoryContextSwitchTo(caller);
		if (tmp != caller)
			MemoryContextReset(tmp);
		if (max_kb > 0 && f.size > (int64) max_kb * 1024)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("the state would be larger than dwarf.max_state_size allows (%d kB)",
							max_kb),
					 errdetail("After %d of %d changes it holds about " INT64_FORMAT " kB.",
							   i + 1, nchanges, f.size / 1024),
					 errhint("Fold fewer changes, or ask a superuser to raise dwarf.max_state_size.")));
	}

	/* The state's fields no change named, then the changed ones. */
	pushJsonbValue(&ps, WJB_BEGIN_OBJECT, NULL);
	it = JsonbIteratorInit(&state->root);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		if (tok != WJB_KEY)
			continue;
		(void) JsonbIteratorNext(&it, &v, true);
		if (Dropped(k.val.string.val, k.val.string.len, ndrop, drop))
			continue;
		if (f.fields != NIL)
		{
			char	   *name = pnstrdup(k.val.string.val, k.val.string.len);
			bool		changed = FindField(&f, name) != NULL;

			pfree(name);
			if (changed)
				continue;
		}
		pushJsonbValue(&ps, WJB_KEY, &k);
		pushJsonbValue(&ps, WJB_VALUE, &v);
	}
	foreach(lc, f.fields)
	{
		FieldAcc   *acc = lfirst(lc);

		if (acc->mode != ACC_ABSENT &&
			!Dropped(acc->name, strlen(acc->name), ndrop, drop))
			PushField(&ps, acc);
	}
	result = JsonbValueToJsonb(pushJsonbValue(&ps, WJB_END_OBJECT, NULL));
	if (f.cxt != caller)
		MemoryContextDelete(f.cxt);
	return result;
}

/*
 * The state after a step: each changed field combined with its old value by
 * its reducer.  Returns state itself when there is nothing to change.
 */
Jsonb *
MergeChanges(Jsonb *state, Jsonb *changes, Reducer *reducers, int nreducers)
{
	if (JsonContainerSize(&changes->root) == 0)
		return state;
	return FoldChanges(state, 1, &changes, reducers, nreducers, 0, NULL, 0);
}

DWARF_FUNCTION(dwarf_fold_changes);

/*
 * dwarf_internal.fold_changes(input, changes[], reducers): input with each
 * change merged in order.  dwarf.snapshot and dwarf.state_at use it for a
 * running flow's state.  Linear in the changes, and bounded by
 * dwarf.max_state_size: a fold that would build a larger state fails with
 * an error that names the setting, before it takes the memory.
 */
Datum
dwarf_fold_changes(PG_FUNCTION_ARGS)
{
	Jsonb	   *state;
	Reducer    *reducers = NULL;
	int			nreducers = 0;
	Datum	   *elems;
	bool	   *nulls;
	Jsonb	  **changes;
	int			nelems,
				n = 0,
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
	changes = palloc(sizeof(Jsonb *) * Max(nelems, 1));
	for (i = 0; i < nelems; i++)
	{
		Jsonb	   *change;

		if (nulls[i])
			continue;
		change = DatumGetJsonbP(elems[i]);
		if (JsonbIsObject(change))
			changes[n++] = change;
	}
	PG_RETURN_JSONB_P(FoldChanges(state, n, changes, reducers, nreducers, 0, NULL,
								  dwarf_max_state_size));
}
