/*
 * archive.c
 *		dwarf_internal.archive_steps(): the step half of dwarf.maintain's
 *		move.  It takes the steps of flows whose rows the pass just archived out of
 *		dwarf.step and appends them to the day partitions of
 *		dwarf.step_archive, sorted by flow.
 *
 * This is done in C for the sake of the write-ahead log, which is what a
 * workflow engine that commits every step runs out of first.  An
 * INSERT ... SELECT logs one record per row; a multi-insert (what COPY
 * uses) logs one per page, with a few bytes per row, which takes about a
 * fifth off the move's WAL.  The rows' index entries go in through the
 * executor (ExecInsertIndexTuples), as a statement's would, so that any
 * index a day partition has is kept right: its predicate, its uniqueness.
 * The ones dwarf_internal.make_archive_day makes are block-range indexes, which
 * cost nothing for rows appended to new pages; the ranges this call filled
 * are summarized before it returns, so that lookups of the flows just
 * archived find their pages at once.
 */
#include "postgres.h"

#include "access/brin.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am_d.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "nodes/makefuncs.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "dwarf.h"
#include "flows.h"

/* Rows handed to one multi-insert (as COPY does: a page or more of them). */
#define ARCHIVE_BATCH	1000

/* dwarf.step's columns; the archive's rows add the flow's close time. */
#define STEP_COLUMNS	13

/* A flow being archived, and when it closed (its step rows' partition key). */
typedef struct ClosedFlow
{
	int64		id;
	TimestampTz closed;
} ClosedFlow;

/* A step row to move, with what it is sorted by. */
typedef struct StepToMove
{
	int64		flow_id;
	int64		step_id;
	HeapTuple	tuple;
} StepToMove;

/*
 * One day partition of dwarf.step_archive, open as the executor's result
 * relation (with its indexes), with rows waiting to go in.
 */
typedef struct DayPartition
{
	char		name[NAMEDATALEN];
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slots[ARCHIVE_BATCH];
	int			nslots;
	BulkInsertState bistate;
	BlockNumber first_new;		/* its size in pages before this call */
} DayPartition;

static int
ClosedFlowCmp(const void *a, const void *b)
{
	int64		x = ((const ClosedFlow *) a)->id;
	int64		y = ((const ClosedFlow *) b)->id;

	return (x > y) - (x < y);
}

static int
StepToMoveCmp(const void *a, const void *b)
{
	const StepToMove *x = a;
	const StepToMove *y = b;

	if (x->flow_id != y->flow_id)
		return (x->flow_id > y->flow_id) - (x->flow_id < y->flow_id);
	return (x->step_id > y->step_id) - (x->step_id < y->step_id);
}

/*
 * The name of the partition of the day (UTC) a flow closed on, as
 * dwarf_internal.make_archive_day names it (the SQL side of the same scheme).
 */
static void
DayPartitionName(TimestampTz closed, char *name)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(closed, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("a flow's close time is out of range")));
	snprintf(name, NAMEDATALEN, "step_archive_%04d%02d%02d", tm.tm_year, tm.tm_mon, tm.tm_mday);
}

/* Opens a day partition (which dwarf.maintain made) and its indexes. */
static void
OpenDayPartition(DayPartition *part)
{
	Oid			relid = get_relname_relid(part->name, get_namespace_oid("dwarf", false));
	int			i;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("archive partition dwarf.%s does not exist", part->name),
				 errhint("dwarf.maintain makes the partitions of the days it moves flows into.")));
	part->rel = table_open(relid, RowExclusiveLock);
	if (RelationGetDescr(part->rel)->natts != STEP_COLUMNS + 1)
		elog(ERROR, "dwarf: dwarf.%s has %d columns, not %d", part->name,
			 RelationGetDescr(part->rel)->natts, STEP_COLUMNS + 1);
	part->estate = CreateExecutorState();
	part->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(part->rri, part->rel, 0, NULL, 0);
	ExecOpenIndices(part->rri, false);
	for (i = 0; i < ARCHIVE_BATCH; i++)
		part->slots[i] = table_slot_create(part->rel, NULL);
	part->nslots = 0;
	part->bistate = GetBulkInsertState();
	part->first_new = RelationGetNumberOfBlocks(part->rel);
}

/*
 * Writes the rows waiting for a partition, then their index entries, as
 * COPY does after a multi-insert.
 */
static void
FlushDayPartition(DayPartition *part)
{
	int			i;

	if (part->nslots == 0)
		return;
	table_multi_insert(part->rel, part->slots, part->nslots, GetCurrentCommandId(true), 0,
					   part->bistate);
	for (i = 0; i < part->nslots; i++)
	{
		list_free(ExecInsertIndexTuples(part->rri, part->slots[i], part->estate,
										false, false, NULL, NIL));
		ResetPerTupleExprContext(part->estate);
		ExecClearTuple(part->slots[i]);
	}
	part->nslots = 0;
}

/*
 * Summarizes the block ranges this call filled in the partition's
 * block-range indexes.  A range that is not summarized matches every
 * lookup, so until then each read of an archived flow's steps would scan
 * all the pages appended since the last summary.
 */
static void
SummarizeNewRanges(DayPartition *part)
{
	BlockNumber nblocks = RelationGetNumberOfBlocks(part->rel);
	int			i;

	/*
	 * Summarizing takes the lock VACUUM takes.  If autovacuum is at this
	 * partition, leave the ranges to it (its cleanup summarizes them too):
	 * waiting would cancel it, and a partition whose autovacuum is always
	 * cancelled is never analyzed nor frozen.
	 */
	if (!ConditionalLockRelation(part->rel, ShareUpdateExclusiveLock))
		return;
	for (i = 0; i < part->rri->ri_NumIndices; i++)
	{
		Relation	index = part->rri->ri_IndexRelationDescs[i];
		BlockNumber per_range;
		BlockNumber block;

		if (index->rd_rel->relam != BRIN_AM_OID)
			continue;
		per_range = BrinGetPagesPerRange(index);
		for (block = part->first_new - part->first_new % per_range; block < nblocks;
			 block += per_range)
			(void) DirectFunctionCall2(brin_summarize_range,
									   ObjectIdGetDatum(RelationGetRelid(index)),
									   Int64GetDatum((int64) block));
	}
}

/* Writes what waits for a partition, summarizes it and closes it. */
static void
CloseDayPartition(DayPartition *part)
{
	int			i;

	FlushDayPartition(part);
	SummarizeNewRanges(part);
	for (i = 0; i < ARCHIVE_BATCH; i++)
		ExecDropSingleTupleTableSlot(part->slots[i]);
	FreeBulkInsertState(part->bistate);
	ExecCloseIndices(part->rri);
	FreeExecutorState(part->estate);
	table_close(part->rel, RowExclusiveLock);
}

DWARF_FUNCTION(dwarf_archive_steps);

/*
 * dwarf_internal.archive_steps(flow_ids, closed): deletes the steps of
 * those flows from dwarf.step and appends them to the partitions of
 * dwarf.step_archive of the days the flows closed (closed[i] for
 * flow_ids[i]), sorted by flow and step.  Returns how many steps moved.  For dwarf.maintain only, which
 * has moved the flows' rows in the same transaction.
 */
Datum
dwarf_archive_steps(PG_FUNCTION_ARGS)
{
	ArrayType  *ids_array = PG_GETARG_ARRAYTYPE_P(0);
	ArrayType  *closed_array = PG_GETARG_ARRAYTYPE_P(1);
	Datum	   *ids;
	Datum	   *closed;
	bool	   *nulls;
	int			nids,
				nclosed;
	ClosedFlow *flows;
	StepToMove *steps;
	DayPartition *parts = NULL;
	int			nparts = 0;
	Oid			types[1] = {INT8ARRAYOID};
	Datum		args[1] = {PointerGetDatum(ids_array)};
	SPITupleTable *tuptable;
	uint64		nsteps,
				i;
	int			p;

	if (!superuser() && GetUserId() != DwarfExtensionOwner())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("dwarf_internal.archive_steps is for dwarf.maintain only")));

	deconstruct_array(ids_array, INT8OID, 8, true, TYPALIGN_DOUBLE, &ids, &nulls, &nids);
	deconstruct_array(closed_array, TIMESTAMPTZOID, 8, true, TYPALIGN_DOUBLE, &closed, NULL,
					  &nclosed);
	if (nids != nclosed)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dwarf_internal.archive_steps needs one close time per flow")));
	if (nids == 0)
		PG_RETURN_INT64(0);
	flows = palloc(sizeof(ClosedFlow) * nids);
	for (p = 0; p < nids; p++)
	{
		flows[p].id = DatumGetInt64(ids[p]);
		flows[p].closed = DatumGetTimestampTz(closed[p]);
	}
	qsort(flows, nids, sizeof(ClosedFlow), ClosedFlowCmp);

	Connect();
	/* dwarf's own columns, by name: one an administrator added stays behind */
	Exec("DELETE FROM dwarf.step WHERE flow_id = ANY ($1) RETURNING flow_id, step_id, token,"
		 " task, status, attempt, started_at, finished_at, changes, goto_task, wake_at, signal,"
		 " error",
		 1, types, args, NULL, SPI_OK_DELETE_RETURNING);
	tuptable = SPI_tuptable;
	nsteps = SPI_processed;
	Assert(tuptable->tupdesc->natts == STEP_COLUMNS);

	/* Sorted by flow, so that a flow's steps share a page or two. */
	steps = palloc(sizeof(StepToMove) * Max(nsteps, 1));
	for (i = 0; i < nsteps; i++)
	{
		bool		isnull;

		steps[i].tuple = tuptable->vals[i];
		steps[i].flow_id = DatumGetInt64(heap_getattr(steps[i].tuple, 1, tuptable->tupdesc, &isnull));
		steps[i].step_id = DatumGetInt64(heap_getattr(steps[i].tuple, 2, tuptable->tupdesc, &isnull));
	}
	qsort(steps, nsteps, sizeof(StepToMove), StepToMoveCmp);

	for (i = 0; i < nsteps; i++)
	{
		ClosedFlow	key = {.id = steps[i].flow_id};
		ClosedFlow *flow = bsearch(&key, flows, nids, sizeof(ClosedFlow), ClosedFlowCmp);
		char		name[NAMEDATALEN];
		DayPartition *part = NULL;
		TupleTableSlot *slot;

		if (flow == NULL)
			elog(ERROR, "dwarf: step of flow " INT64_FORMAT " deleted but not asked for",
				 steps[i].flow_id);
		DayPartitionName(flow->closed, name);
		for (p = 0; p < nparts; p++)
			if (strcmp(parts[p].name, name) == 0)
				part = &parts[p];
		if (part == NULL)
		{
			parts = nparts == 0 ? palloc(sizeof(DayPartition)) :
				repalloc(parts, sizeof(DayPartition) * (nparts + 1));
			part = &parts[nparts++];
			strlcpy(part->name, name, NAMEDATALEN);
			OpenDayPartition(part);
		}
		slot = part->slots[part->nslots++];
		ExecClearTuple(slot);
		heap_deform_tuple(steps[i].tuple, tuptable->tupdesc, slot->tts_values, slot->tts_isnull);
		slot->tts_values[STEP_COLUMNS] = TimestampTzGetDatum(flow->closed);
		slot->tts_isnull[STEP_COLUMNS] = false;
		ExecStoreVirtualTuple(slot);
		if (part->nslots == ARCHIVE_BATCH)
			FlushDayPartition(part);
	}
	for (p = 0; p < nparts; p++)
		CloseDayPartition(&parts[p]);
	SPI_finish();
	PG_RETURN_INT64((int64) nsteps);
}
