/*
 * archive.c
 *		dwarf_internal.archive_flows(): dwarf.maintain's insert of the flow
 *		rows it moves into dwarf.flow_archive.
 *
 * A pass moves closed flows out of dwarf.flow in chunks: a DELETE ...
 * RETURNING whose rows this writes into the archive's day partitions.  An
 * INSERT ... SELECT would log each row as a WAL record of its own, with a
 * record's header and a reference to its page every time (about 55 of the
 * 135 bytes a flow's row costs); here the rows of each partition go in
 * with table_multi_insert, as COPY writes them: one record per heap page.
 * Each row still gets its index entries (one record each), and is checked
 * against the partition's constraints.  Routing is the executor's
 * (ExecFindPartition): a row finds its day by finished_at, and one that
 * has no partition fails with the executor's error that names it.
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
#include "funcapi.h"
#include "nodes/execnodes.h"
#include "utils/array.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/typcache.h"

#include "dwarf.h"

/* The rows going to one partition. */
typedef struct ArchiveBatch
{
	ResultRelInfo *rri;
	TupleTableSlot **slots;
	int			n;
	int			size;
} ArchiveBatch;

/* The flow a row is of, for the error context of its routing and checks. */
static void
ArchiveRowContext(void *arg)
{
	errcontext("archiving flow %lld", (long long) *(int64 *) arg);
}

/*
 * The archive's descriptor must be dwarf.flow's column for column, as the
 * INSERT ... SELECT * this replaces assumed: a row is copied by position.
 */
static void
CheckSameColumns(TupleDesc from, TupleDesc to)
{
	int			i;

	if (from->natts != to->natts)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("dwarf.flow has %d columns and dwarf.flow_archive %d", from->natts, to->natts),
				 errhint("A column added to dwarf.flow must be added to dwarf.flow_archive too, in the same place.")));
	for (i = 0; i < from->natts; i++)
	{
		Form_pg_attribute a = TupleDescAttr(from, i);
		Form_pg_attribute b = TupleDescAttr(to, i);

		if (a->attisdropped != b->attisdropped ||
			(!a->attisdropped && a->atttypid != b->atttypid))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("column %d of dwarf.flow (%s) does not match column %d of dwarf.flow_archive (%s)",
							i + 1, a->attisdropped ? "dropped" : NameStr(a->attname),
							i + 1, b->attisdropped ? "dropped" : NameStr(b->attname)),
					 errhint("dwarf.flow_archive must have dwarf.flow's columns, in the same order.")));
	}
}

static ArchiveBatch *
BatchOf(ArchiveBatch **batches, int *n, int *size, ResultRelInfo *rri)
{
	ArchiveBatch *b;
	int			i;

	for (i = 0; i < *n; i++)
		if ((*batches)[i].rri == rri)
			return &(*batches)[i];
	if (*n == *size)
	{
		*size *= 2;
		*batches = repalloc(*batches, sizeof(ArchiveBatch) * *size);
	}
	b = &(*batches)[(*n)++];
	b->rri = rri;
	b->n = 0;
	b->size = 64;
	b->slots = palloc(sizeof(TupleTableSlot *) * b->size);
	return b;
}

DWARF_FUNCTION(dwarf_archive_flows);

/*
 * dwarf_internal.archive_flows(flows dwarf.flow[]) returns bigint: writes
 * the rows into dwarf.flow_archive, under the current command, and returns
 * how many.  Only dwarf.maintain calls it (no PUBLIC execute): the rows go
 * in with no permission check and no row security, as the pass's own
 * INSERT as the extension's owner did.
 */
Datum
dwarf_archive_flows(PG_FUNCTION_ARGS)
{
	ArrayType  *flows;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			nelems;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Oid			rowtype;
	TupleDesc	flowdesc;
	Relation	archive;
	EState	   *estate;
	ResultRelInfo *root;
	ModifyTableState *mtstate;
	PartitionTupleRouting *proute;
	TupleTableSlot *slot;
	ArchiveBatch *batches;
	int			nbatches = 0;
	int			batchsize = 4;
	CommandId	cid = GetCurrentCommandId(true);
	ErrorContextCallback context;
	int64		flow_id = 0;
	int64		written = 0;
	int			i,
				b;

	if (PG_ARGISNULL(0))
		PG_RETURN_INT64(0);
	flows = PG_GETARG_ARRAYTYPE_P(0);
	rowtype = ARR_ELEMTYPE(flows);		/* dwarf.flow's, by the signature */
	get_typlenbyvalalign(rowtype, &typlen, &typbyval, &typalign);
	if (array_contains_nulls(flows))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("the rows of dwarf_internal.archive_flows must not be NULL")));
	deconstruct_array(flows, rowtype, typlen, typbyval, typalign, &elems, &elem_nulls, &nelems);
	if (nelems == 0)
		PG_RETURN_INT64(0);

	flowdesc = lookup_rowtype_tupdesc_copy(rowtype, -1);
	archive = table_open(get_relname_relid("flow_archive", get_namespace_oid("dwarf", false)),
						 RowExclusiveLock);
	if (archive->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("dwarf.flow_archive is not partitioned")));
	CheckSameColumns(flowdesc, RelationGetDescr(archive));

	/* The executor's state and tuple routing, set up as COPY FROM does. */
	estate = CreateExecutorState();
	root = makeNode(ResultRelInfo);
	InitResultRelInfo(root, archive, 0, NULL, 0);
	mtstate = makeNode(ModifyTableState);
	mtstate->ps.state = estate;
	mtstate->operation = CMD_INSERT;
	mtstate->mt_nrels = 1;
	mtstate->resultRelInfo = root;
	mtstate->rootResultRelInfo = root;
	proute = ExecSetupPartitionTupleRouting(estate, archive);
	slot = table_slot_create(archive, NULL);
	batches = palloc(sizeof(ArchiveBatch) * batchsize);

	context.callback = ArchiveRowContext;
	context.arg = &flow_id;
	context.previous = error_context_stack;
	error_context_stack = &context;
	for (i = 0; i < nelems; i++)
	{
		HeapTupleHeader row;
		HeapTupleData tuple;
		ResultRelInfo *rri;
		TupleTableSlot *to = slot;
		ArchiveBatch *batch;

		row = DatumGetHeapTupleHeader(elems[i]);
		tuple.t_len = HeapTupleHeaderGetDatumLength(row);
		ItemPointerSetInvalid(&tuple.t_self);
		tuple.t_tableOid = InvalidOid;
		tuple.t_data = row;
		ExecClearTuple(slot);
		heap_deform_tuple(&tuple, flowdesc, slot->tts_values, slot->tts_isnull);
		ExecStoreVirtualTuple(slot);
		flow_id = slot->tts_isnull[0] ? 0 : DatumGetInt64(slot->tts_values[0]);

		rri = ExecFindPartition(mtstate, root, proute, slot, estate);
		if (rri->ri_RootToPartitionMap)
			to = execute_attr_map_slot(rri->ri_RootToPartitionMap->attrMap, slot,
									   rri->ri_PartitionTupleSlot);
		if (rri->ri_RelationDesc->rd_att->constr)
			ExecConstraints(rri, to, estate);
		batch = BatchOf(&batches, &nbatches, &batchsize, rri);
		if (batch->n == batch->size)
		{
			batch->size *= 2;
			batch->slots = repalloc(batch->slots, sizeof(TupleTableSlot *) * batch->size);
		}
		batch->slots[batch->n] = MakeSingleTupleTableSlot(RelationGetDescr(rri->ri_RelationDesc),
														  table_slot_callbacks(rri->ri_RelationDesc));
		ExecCopySlot(batch->slots[batch->n++], to);
		ResetPerTupleExprContext(estate);
	}
	error_context_stack = context.previous;

	for (b = 0; b < nbatches; b++)
	{
		ArchiveBatch *batch = &batches[b];

		table_multi_insert(batch->rri->ri_RelationDesc, batch->slots, batch->n, cid, 0, NULL);
		for (i = 0; i < batch->n; i++)
		{
			if (batch->rri->ri_NumIndices > 0)
				list_free(ExecInsertIndexTuples(batch->rri, batch->slots[i], estate,
												false, false, NULL, NIL));
			ResetPerTupleExprContext(estate);
			ExecDropSingleTupleTableSlot(batch->slots[i]);
		}
		written += batch->n;
	}

	ExecDropSingleTupleTableSlot(slot);
	ExecCleanupTupleRouting(mtstate, proute);
	FreeExecutorState(estate);
	table_close(archive, NoLock);
	PG_RETURN_INT64(written);
}
