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
extern void WakeOwnerOnCommit(int64 flow_id);
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
extern int	ExecKeptByKeys(SPIPlanPtr plan, Datum *args, bool read_only);
extern void ExecKept(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *args,
					 int expect);

/* ---------- graphs and flows ---------- */

extern int64 NewFlowId(void);
extern pg_noreturn void FlowNotFound(int64 flow_id);
extern int64 InsertFlow(int64 flow_id, int32 graph_id, Oid owner, int32 priority,
						text *key, Jsonb *input, Jsonb *options, bool *is_new);
extern int64 InsertFlowRow(int64 flow_id, int32 graph_id, Oid owner, int32 priority,
						   text *key, Jsonb *input, Jsonb *options, bool *is_new,
						   HeapTuple *row, TupleDesc *desc);

/* ---------- trees of subgraphs ---------- */

extern int64 CancelDescendants(int64 flow_id, int64 root, const char *reason);
extern void FailTreeOnCap(int64 root);
extern bool MayUsePriority(Oid role, int32 priority);
extern void CheckPriorityOf(Oid role, int32 priority, const char *function);

/* A flow's row as a worker takes it in (see FLOW_ROW_COLUMNS). */
typedef struct FlowRow
{
	int64		id;
	int32		graph_id;
	Oid			owner;
	int32		priority;
	Jsonb	   *input;
	Jsonb	   *resume_data;	/* NULL: none */
	Jsonb	   *baggage;		/* NULL: none */
	char	   *fairness_key;	/* NULL: none */
	int32		fairness_weight;
	int64		time_budget_ms; /* 0: none */
	bool		delete_on_completion;
	char	   *start_task;		/* NULL: the graph's entry */
	int64		parent_id;		/* 0: none */
	bool		orphan;			/* a child whose parent has closed or gone */
	int64		root_id;		/* the top of its tree of subgraphs; 0: itself */
	TimestampTz created_at;		/* 0: now (a row the worker wrote itself) */
} FlowRow;

/*
 * A flow's row as a worker takes it in: what LoadFlows reads of the flows
 * it loads, and what InsertFlowRow returns of a flow it creates (table
 * alias f).  "orphan": a child whose parent has closed or gone.
 */
enum
{
	Anum_flowrow_id = 1,
	Anum_flowrow_graph_id,
	Anum_flowrow_owner,
	Anum_flowrow_priority,
	Anum_flowrow_input,
	Anum_flowrow_resume_data,
	Anum_flowrow_baggage,
	Anum_flowrow_fairness_key,
	Anum_flowrow_fairness_weight,
	Anum_flowrow_time_budget_ms,
	Anum_flowrow_delete_on_completion,
	Anum_flowrow_start_task,
	Anum_flowrow_parent_id,
	Anum_flowrow_orphan,
	Anum_flowrow_root_id,
	Anum_flowrow_created_at
};
#define FLOW_ROW_COLUMNS \
	"f.id, f.graph_id, f.owner::oid, f.priority, f.input, f.resume_data, f.baggage," \
	" f.fairness_key, f.fairness_weight," \
	" (extract(epoch FROM f.time_budget) * 1000)::bigint, f.delete_on_completion, f.start_task," \
	" f.parent_id," \
	" f.parent_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dwarf.flow p WHERE p.id = f.parent_id" \
	"  AND p.status IN ('running', 'interrupted'))," \
	" f.root_id, f.created_at"

/* ---------- arguments ---------- */

extern void CheckInput(Jsonb *input);
extern void CheckNotStandby(const char *function);
extern void CheckNotNull(FunctionCallInfo fcinfo, int arg, const char *name);
extern int64 IntervalMicros(Interval *span, const char *what);

#endif							/* DWARF_FLOWS_H */
