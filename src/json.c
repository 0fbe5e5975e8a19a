/*
 * json.c
 *		Small helpers for reading and building the JSON objects dwarf passes
 *		around (states, changes, options), on top of PostgreSQL's jsonb API.
 */
#include "postgres.h"

#include "utils/jsonb.h"

#include "json.h"

bool
JsonbIsObject(Jsonb *jb)
{
	return JB_ROOT_IS_OBJECT(jb) && !JB_ROOT_IS_SCALAR(jb);
}

/* The value of a top-level key of an object, or NULL. */
JsonbValue *
JsonbField(Jsonb *obj, const char *key)
{
	if (!JsonbIsObject(obj))
		return NULL;
	return getKeyJsonValueFromContainer(&obj->root, key, strlen(key), NULL);
}

Jsonb *
JsonbEmptyObject(void)
{
	JsonbParseState *state = NULL;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/* An in-memory array or object as a binary value, so it can be pushed. */
JsonbValue *
JsonbAsBinary(JsonbValue *v)
{
	JsonbValue *b;
	Jsonb	   *jb;

	if (v->type != jbvArray && v->type != jbvObject)
		return v;
	jb = JsonbValueToJsonb(v);
	b = palloc(sizeof(JsonbValue));
	b->type = jbvBinary;
	b->val.binary.data = &jb->root;
	b->val.binary.len = VARSIZE(jb) - VARHDRSZ;
	return b;
}

static bool
KeyIn(JsonbValue *key, int nkeys, const char **keys)
{
	int			i;

	for (i = 0; i < nkeys; i++)
		if (key->val.string.len == strlen(keys[i]) &&
			memcmp(key->val.string.val, keys[i], key->val.string.len) == 0)
			return true;
	return false;
}

static void
PushKey(JsonbParseState **state, const char *key)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	pushJsonbValue(state, WJB_KEY, &k);
}

/* Pushes the pairs of an object, less the listed keys. */
void
JsonbPushPairsExcept(JsonbParseState **state, JsonbContainer *obj, int nkeys, const char **keys)
{
	JsonbIterator *it = JsonbIteratorInit(obj);
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;

	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		if (tok != WJB_KEY)
			continue;
		(void) JsonbIteratorNext(&it, &v, true);
		if (KeyIn(&k, nkeys, keys))
			continue;
		pushJsonbValue(state, WJB_KEY, &k);
		pushJsonbValue(state, WJB_VALUE, &v);
	}
}

/* A copy of an object with the given keys set to the given values. */
Jsonb *
JsonbWithKeys(Jsonb *obj, int nkeys, const char **keys, JsonbValue *values)
{
	JsonbParseState *state = NULL;
	int			i;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	JsonbPushPairsExcept(&state, &obj->root, nkeys, keys);
	for (i = 0; i < nkeys; i++)
	{
		PushKey(&state, keys[i]);
		pushJsonbValue(&state, WJB_VALUE, JsonbAsBinary(&values[i]));
	}
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}

/* A copy of an object without the given keys. */
Jsonb *
JsonbWithoutKeys(Jsonb *obj, int nkeys, const char **keys)
{
	JsonbParseState *state = NULL;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	JsonbPushPairsExcept(&state, &obj->root, nkeys, keys);
	return JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL));
}
