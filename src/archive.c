/*
 * archive.c
 *		dwarf_internal.archive(flow): dwarf.maintain's insert of the flow rows
 *		it moves into dwarf.flow_archive.
 *
 * A pass moves closed flows out of dwarf.flow in chunks: a DELETE ...
 * RETURNING whose rows this aggregate writes into the archive's day
 * partitions.  An INSERT ... SELECT would log each row as a WAL record of
 * its own, with a record's header and a reference to its page every time
 * (about 55 of the 135 bytes a flow's row costs); here the rows of each
 * partition go in with table_multi_insert, as COPY writes them: one record
 * per heap page.  Each row still gets its index entries (one record each),
 * and is checked against the partition's constraints.  Routing is the
 * executor's (ExecFindPartition): a row finds its day by finished_at, and
 * one that has no partition fails with the executor's error that names it.
 *
 * An aggregate, so that the rows stream: they are written as they come,
 * ARCHIVE_BATCH_ROWS or ARCHIVE_BATCH_BYTES at a time (a flow's state can
 * be megabytes), never gathered into one value.
 *
 * The rows are dwarf's own bookkeeping: no user trigger fires for them, as
 * for the workers' writes of dwarf.flow and dwarf.step_log (rows.c).
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "executor/execPartition.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "nodes/execnodes.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/typcache.h"

#include "dwarf.h"
#include "partitions.h"

#define ARCHIVE_BATCH_ROWS	1000
#define ARCHIVE_BATCH_BYTES (8 * 1024 * 1024)

/* The rows going to one partition. */
typedef struct ArchiveBatch
{
	ResultRelInfo *rri;
	TupleTableSlot **slots;
	int			n;				/* rows waiting */
	int			nslots;			/* slots made, n of them in use */
	int			size;
} ArchiveBatch;

/* The aggregate's state: the archive open for the statement, rows waiting. */
typedef struct Archiving
{
	MemoryContext context;		/* the aggregate's: lives as long as this */
	Relation	archive;
	TupleDesc	flowdesc;
	int		   *map;			/* ColumnMap */
	Datum	   *values;			/* a row of dwarf.flow, deformed */
	bool	   *nulls;
	EState	   *estate;
	ResultRelInfo *root;
	ModifyTableState *mtstate;
	PartitionTupleRouting *proute;
	TupleTableSlot *slot;		/* a row as it came, in the archive's shape */
	ArchiveBatch *batches;
	int			nbatches;
	int			batchsize;
	int			waiting;
	Size		waiting_bytes;
	int64		written;
} Archiving;

/* The flow a row is of, for the error context of its routing and checks. */
static void
ArchiveRowContext(void *arg)
{
	errcontext("archiving flow %lld", (long long) *(int64 *) arg);
}

/*
 * Which column of dwarf.flow's row fills each column of the archive: the
 * columns that are not dropped, in order, as the INSERT ... SELECT * this
 * replaces took them (-1 for a dropped column of the archive).  A column
 * added to one table and not the other, or of another type, is an error.
 */
static int *
ColumnMap(TupleDesc from, TupleDesc to)
{
	int		   *map = palloc(sizeof(int) * to->natts);
	int			f = 0;
	int			t;

	for (t = 0; t < to->natts; t++)
	{
		Form_pg_attribute b = TupleDescAttr(to, t);
		Form_pg_attribute a;

		map[t] = -1;
		if (b->attisdropped)
			continue;
		while (f < from->natts && TupleDescAttr(from, f)->attisdropped)
			f++;
		if (f == from->natts)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("dwarf.flow_archive has column \"%s\", which dwarf.flow has not", NameStr(b->attname)),
					 errhint("dwarf.flow_archive must have dwarf.flow's columns, in the same order.")));
		a = TupleDescAttr(from, f);
		if (a->atttypid != b->atttypid)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("column \"%s\" of dwarf.flow does not match column \"%s\" of dwarf.flow_archive",
							NameStr(a->attname), NameStr(b->attname)),
					 errhint("dwarf.flow_archive must have dwarf.flow's columns, in the same order.")));
		map[t] = f++;
	}
	while (f < from->natts && TupleDescAttr(from, f)->attisdropped)
		f++;
	if (f < from->natts)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("dwarf.flow has column \"%s\", which dwarf.flow_archive has not",
						NameStr(TupleDescAttr(from, f)->attname)),
				 errhint("A column added to dwarf.flow must be added to dwarf.flow_archive too, in the same place.")));
	return map;
}

/*
 * Opens dwarf.flow_archive for the rows of dwarf.flow's row type, with the
 * executor's state and tuple routing, set up as COPY FROM does, in the
 * aggregate's memory context.
 */
static Archiving *
StartArchiving(MemoryContext context, Oid rowtype)
{
	MemoryContext old = MemoryContextSwitchTo(context);
	Archiving  *a = palloc0(sizeof(Archiving));

	a->context = context;
	a->flowdesc = lookup_rowtype_tupdesc_copy(rowtype, -1);
	a->archive = table_open(get_relname_relid("flow_archive", get_namespace_oid("dwarf", false)),
							RowExclusiveLock);
	if (a->archive->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("dwarf.flow_archive is not partitioned")));
	a->map = ColumnMap(a->flowdesc, RelationGetDescr(a->archive));
	a->values = palloc(sizeof(Datum) * a->flowdesc->natts);
	a->nulls = palloc(sizeof(bool) * a->flowdesc->natts);
	a->estate = CreateExecutorState();
	a->root = makeNode(ResultRelInfo);
	InitResultRelInfo(a->root, a->archive, 0, NULL, 0);
	a->mtstate = makeNode(ModifyTableState);
	a->mtstate->ps.state = a->estate;
	a->mtstate->operation = CMD_INSERT;
	a->mtstate->mt_nrels = 1;
	a->mtstate->resultRelInfo = a->root;
	a->mtstate->rootResultRelInfo = a->root;
	FreshPartitionDesc(a->archive);
	a->proute = ExecSetupPartitionTupleRouting(a->estate, a->archive);
	a->slot = MakeSingleTupleTableSlot(RelationGetDescr(a->archive), &TTSOpsVirtual);
	a->batchsize = 4;
	a->batches = palloc(sizeof(ArchiveBatch) * a->batchsize);
	MemoryContextSwitchTo(old);
	return a;
}

/* The batch of the partition rri is for, made if there is none yet. */
static ArchiveBatch *
BatchOf(Archiving *a, ResultRelInfo *rri)
{
	MemoryContext old;
	ArchiveBatch *b;
	int			i;

	for (i = 0; i < a->nbatches; i++)
		if (a->batches[i].rri == rri)
			return &a->batches[i];
	old = MemoryContextSwitchTo(a->context);
	if (a->nbatches == a->batchsize)
	{
		a->batchsize *= 2;
		a->batches = repalloc(a->batches, sizeof(ArchiveBatch) * a->batchsize);
	}
	b = &a->batches[a->nbatches++];
	memset(b, 0, sizeof(ArchiveBatch));
	b->rri = rri;
	b->size = 64;
	b->slots = palloc(sizeof(TupleTableSlot *) * b->size);
	MemoryContextSwitchTo(old);
	return b;
}

/* A slot of batch for the next row: a spare one, or a new one. */
static TupleTableSlot *
BatchSlot(Archiving *a, ArchiveBatch *batch)
{
	MemoryContext old = MemoryContextSwitchTo(a->context);

	if (batch->n == batch->size)
	{
		batch->size *= 2;
		batch->slots = repalloc(batch->slots, sizeof(TupleTableSlot *) * batch->size);
	}
	if (batch->n == batch->nslots)
		batch->slots[batch->nslots++] =
			MakeSingleTupleTableSlot(RelationGetDescr(batch->rri->ri_RelationDesc),
									 table_slot_callbacks(batch->rri->ri_RelationDesc));
	MemoryContextSwitchTo(old);
	return batch->slots[batch->n++];
}

/* Routes and checks one row, and adds it to its partition's batch. */
static void
AddRow(Archiving *a, HeapTupleHeader row)
{
	HeapTupleData tuple;
	ResultRelInfo *rri;
	TupleConversionMap *map;
	TupleTableSlot *to = a->slot;
	ErrorContextCallback context;
	MemoryContext old;
	int64		flow_id;
	int			i;

	tuple.t_len = HeapTupleHeaderGetDatumLength(row);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = row;
	heap_deform_tuple(&tuple, a->flowdesc, a->values, a->nulls);
	ExecClearTuple(a->slot);
	for (i = 0; i < a->slot->tts_tupleDescriptor->natts; i++)
	{
		a->slot->tts_isnull[i] = a->map[i] < 0 || a->nulls[a->map[i]];
		a->slot->tts_values[i] = a->slot->tts_isnull[i] ? (Datum) 0 : a->values[a->map[i]];
	}
	ExecStoreVirtualTuple(a->slot);
	flow_id = a->nulls[0] ? 0 : DatumGetInt64(a->values[0]);	/* id comes first */

	context.callback = ArchiveRowContext;
	context.arg = &flow_id;
	context.previous = error_context_stack;
	error_context_stack = &context;
	/* partitions it opens, and their slots, live as long as the state */
	old = MemoryContextSwitchTo(a->context);
	rri = ExecFindPartition(a->mtstate, a->root, a->proute, a->slot, a->estate);
	MemoryContextSwitchTo(old);
	map = ExecGetRootToChildMap(rri, a->estate);
	if (map)
		to = execute_attr_map_slot(map->attrMap, a->slot, rri->ri_PartitionTupleSlot);
	if (rri->ri_RelationDesc->rd_att->constr)
		ExecConstraints(rri, to, a->estate);
	error_context_stack = context.previous;

	/* a copy in the slot's own memory, freed when WriteRows clears it */
	ExecCopySlot(BatchSlot(a, BatchOf(a, rri)), to);
	ResetPerTupleExprContext(a->estate);
	a->waiting++;
	a->waiting_bytes += tuple.t_len;
}

/* Writes the waiting rows, each partition's with one table_multi_insert. */
static void
WriteRows(Archiving *a)
{
	CommandId	cid = GetCurrentCommandId(true);
	int			b,
				i;

	for (b = 0; b < a->nbatches; b++)
	{
		ArchiveBatch *batch = &a->batches[b];

		if (batch->n == 0)
			continue;
		table_multi_insert(batch->rri->ri_RelationDesc, batch->slots, batch->n, cid, 0, NULL);
		for (i = 0; i < batch->n; i++)
		{
			if (batch->rri->ri_NumIndices > 0)
				list_free(ExecInsertIndexTuples(batch->rri, batch->slots[i], a->estate,
												false, false, NULL, NIL, false));
			ResetPerTupleExprContext(a->estate);
			ExecClearTuple(batch->slots[i]);
		}
		a->written += batch->n;
		batch->n = 0;
	}
	a->waiting = 0;
	a->waiting_bytes = 0;
}

static void
EndArchiving(Archiving *a)
{
	int			b,
				i;

	for (b = 0; b < a->nbatches; b++)
		for (i = 0; i < a->batches[b].nslots; i++)
			ExecDropSingleTupleTableSlot(a->batches[b].slots[i]);
	ExecDropSingleTupleTableSlot(a->slot);
	ExecCleanupTupleRouting(a->mtstate, a->proute);
	ExecResetTupleTable(a->estate->es_tupleTable, false);	/* the routing's slots */
	FreeExecutorState(a->estate);
	table_close(a->archive, NoLock);
}

DWARF_FUNCTION(dwarf_archive_add);

/*
 * The aggregate's transition: dwarf_internal.archive_add(state, flow).  The
 * first row opens the archive; a row adds to the waiting rows, written
 * once there are enough of them.
 */
Datum
dwarf_archive_add(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	Archiving  *a = PG_ARGISNULL(0) ? NULL : (Archiving *) PG_GETARG_POINTER(0);

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		elog(ERROR, "dwarf_internal.archive_add called in non-aggregate context");
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("dwarf_internal.archive takes no NULL flow")));
	if (a == NULL)
		a = StartArchiving(aggcontext, get_fn_expr_argtype(fcinfo->flinfo, 1));
	AddRow(a, PG_GETARG_HEAPTUPLEHEADER(1));
	if (a->waiting >= ARCHIVE_BATCH_ROWS || a->waiting_bytes >= ARCHIVE_BATCH_BYTES)
		WriteRows(a);
	PG_RETURN_POINTER(a);
}

DWARF_FUNCTION(dwarf_archive_done);

/* The aggregate's final function: writes what waits; how many rows in all. */
Datum
dwarf_archive_done(PG_FUNCTION_ARGS)
{
	Archiving  *a = PG_ARGISNULL(0) ? NULL : (Archiving *) PG_GETARG_POINTER(0);
	int64		written;

	if (!AggCheckCallContext(fcinfo, NULL))
		elog(ERROR, "dwarf_internal.archive_done called in non-aggregate context");
	if (a == NULL)
		PG_RETURN_INT64(0);
	WriteRows(a);
	written = a->written;
	EndArchiving(a);
	PG_RETURN_INT64(written);
}

DWARF_FUNCTION(dwarf_lock_maintain);

/*
 * dwarf_internal.lock_maintain(): one dwarf.maintain pass at a time in a
 * database; a second waits for the first's commit, then finds less to do.
 * The lock is dwarf's own (dwarf.h): an advisory key that any role could
 * hold would let an idle session keep every pass waiting.
 */
Datum
dwarf_lock_maintain(PG_FUNCTION_ARGS)
{
	DwarfLockXact(DWARF_LOCK_MAINTAIN, 0, 0);
	PG_RETURN_VOID();
}
