/*
 * flows.h
 *		The flow table's writers' tools (flows.c): flow ids and rows, acting
 *		as the extension's owner, kept statements, commit-time notes to the
 *		workers, argument checks.
 */
#ifndef DWARF_FLOWS_H
#define DWARF_FLOWS_H

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"

/* ---------- notes handed to the workers when the transaction commits ---------- */

extern void NoteOnCommit(int64 flow_id, DwarfNoteKind kind, bool wake_waiters);
extern void DwarfRescanOnCommit(void);
extern void DwarfXactCallback(XactEvent event, void *arg);

/* ---------- acting as the extension owner ---------- */

/* The user a function switched from to act as the extension owner. */
typedef struct SavedUser
{
	Oid			user;
	int			sec;
	int			nest;			/* GUC nest level of the pinned search_path */
} SavedUser;

extern Oid	DwarfExtensionOwner(void);
extern SavedUser BecomeOwner(void);
extern void RestoreUser(SavedUser saved);

/* ---------- statements ---------- */

extern void Connect(void);
extern void Exec(const char *sql, int nargs, Oid *types, Datum *args, const char *nulls,
				 int expect);
extern SPIPlanPtr PrepareKept(const char *sql, int nargs, Oid *types);
extern SPIPlanPtr PrepareKeptReplanned(const char *sql, int nargs, Oid *types, bool replan);
extern void ExecKept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *args,
					 int expect);

/* ---------- graphs and flows ---------- */

extern int32 LatestGraph(text *name, bool committed);
extern int64 NewFlowId(void);
extern int64 InsertFlow(int64 flow_id, int32 graph_id, Oid owner, int32 priority,
						text *key, Jsonb *input, Jsonb *options, bool *is_new);

/* ---------- arguments ---------- */

extern void CheckInput(Jsonb *input);
extern void CheckNotStandby(const char *function);
extern void CheckNotNull(FunctionCallInfo fcinfo, int arg, const char *name);
extern int64 IntervalMicros(Interval *span, const char *what);

#endif							/* DWARF_FLOWS_H */
