/*
 * api.h
 *		Helpers shared by the SQL-callable functions of api.c and ops.c.
 */
#ifndef DWARF_API_H
#define DWARF_API_H

#include "utils/timestamp.h"

/* The user a function switched from to act as the extension owner. */
typedef struct SavedUser
{
	Oid			user;
	int			sec;
	int			nest;			/* GUC nest level of the pinned search_path */
} SavedUser;

extern SavedUser BecomeOwner(void);
extern void RestoreUser(SavedUser saved);
extern void Connect(void);
extern void Exec(const char *sql, int nargs, Oid *types, Datum *args, const char *nulls,
				 int expect);
extern void CheckInput(Jsonb *input);
extern void CheckNotStandby(const char *function);
extern void CheckNotNull(FunctionCallInfo fcinfo, int arg, const char *name);

#endif							/* DWARF_API_H */
