/*
 * rows.h
 *		A worker's writes of dwarf's own rows without a statement (rows.c):
 *		step rows, the flows dwarf.run creates, a flow's close.  Step rows
 *		are buffered and written together (table_multi_insert): by RowsEnd,
 *		at the latest before the transaction commits, and before a statement
 *		of this process reads dwarf.step.
 */
#ifndef DWARF_ROWS_H
#define DWARF_ROWS_H

#include "utils/jsonb.h"

#include "dwarf.h"
#include "flows.h"

/* dwarf.step's columns, in the order RowsInsertStep takes them. */
typedef enum StepColumn
{
	SC_FLOW_ID, SC_STEP_ID, SC_TOKEN, SC_TASK, SC_STATUS, SC_ATTEMPT, SC_STARTED_AT,
	SC_FINISHED_AT, SC_CHANGES, SC_GOTO_TASK, SC_WAKE_AT, SC_SIGNAL, SC_ERROR, SC_COUNT
} StepColumn;

extern void RowsInsertStep(Datum *values, bool *nulls);
extern bool RowsInsertFlow(int64 id, int32 graph_id, Oid owner, int32 priority, Jsonb *input,
						   Jsonb *options, FlowRow *row);
extern bool RowsCloseFlow(int64 id, bool completed, Jsonb *state, const char *error);
extern void RowsEnd(void);
extern void RowsForget(void);

#endif							/* DWARF_ROWS_H */
