/*
 * json.h
 *		Helpers for JSON objects (json.c).
 */
#ifndef DWARF_JSON_H
#define DWARF_JSON_H

#include "utils/jsonb.h"

extern bool JsonbIsObject(Jsonb *jb);
extern JsonbValue *JsonbField(Jsonb *obj, const char *key);
extern Jsonb *JsonbEmptyObject(void);
extern Jsonb *JsonbWithKeys(Jsonb *state, int nkeys, const char **keys,
							JsonbValue *values);
extern Jsonb *JsonbWithoutKeys(Jsonb *state, int nkeys, const char **keys);
extern JsonbValue *JsonbAsBinary(JsonbValue *v);
extern void JsonbPushPairsExcept(JsonbParseState **state, JsonbContainer *obj, int nkeys,
								 const char **keys);

#endif							/* DWARF_JSON_H */
