/*
 * stats.h
 *		Cumulative statistics per database, graph and task (stats.c): what
 *		the writers of flows and steps count, and the shared memory that
 *		keeps it.
 */
#ifndef DWARF_STATS_H
#define DWARF_STATS_H

#include "access/xact.h"
#include "utils/timestamp.h"

#include "dwarf.h"

/*
 * What happened, counted in the transaction that wrote it and added to the
 * shared counters when that transaction commits.  The first four count on
 * the graph's own entry (a flow), the rest on the task's (a step).
 */
typedef enum StatsEvent
{
	STATS_CREATED,				/* a flow was created */
	STATS_COMPLETED,			/* a flow closed: completed */
	STATS_FAILED,				/* ... failed */
	STATS_CANCELLED,			/* ... cancelled */
	STATS_STEP,					/* a step ran (its row: completed, interrupted,
								 * waiting) */
	STATS_STEP_FAILED,			/* ... and failed */
	STATS_STEP_RETRIED			/* ... and is retried (a 'retry' row) */
} StatsEvent;

/*
 * What a statement that closes flows returns of each (UPDATE dwarf.flow
 * ... RETURNING), for StatsFlowClosed: graph id, graph name, created_at.
 */
#define CLOSED_FLOW_COLUMNS \
	"graph_id, (SELECT g.name FROM dwarf.graph g WHERE g.id = graph_id), created_at"

extern void StatsShmemRequest(void);
extern void StatsShmemStartup(void);
extern void StatsXactCallback(XactEvent event, void *arg);
extern void StatsSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

extern void StatsFlowCreated(int32 graph_id, const char *graph);
extern void StatsFlowClosed(int32 graph_id, const char *graph, StatsEvent end,
							TimestampTz created_at);
extern void StatsClosedRows(int first, StatsEvent end);
extern void StatsStep(int32 graph_id, const char *graph, int node, const char *task,
					  StatsEvent event, TimestampTz started, TimestampTz finished);

#endif							/* DWARF_STATS_H */
