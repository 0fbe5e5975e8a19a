/*
 * rows.c
 *		dwarf's writes of its own rows without a statement: each step's row,
 *		the flows dwarf.run and dwarf.create make, and a flow's close.
 *
 * These are the hot path's writes: a statement for each would be planned,
 * set up and torn down per row (its check constraints parsed again each
 * time).  Instead the tables are opened once per transaction (a worker's
 * batch, or the caller's of dwarf.create) as the executor's result
 * relations, their defaults and constraints read once until the table
 * changes (see RowTable), and each row goes through the executor's
 * row machinery: ExecConstraints, table_tuple_insert or _update, and
 * ExecInsertIndexTuples, which keeps every index as a statement would
 * (unique checks, partial indexes' predicates, BRIN).  The rows are
 * dwarf's: no user trigger fires for them, as for any extension's own
 * bookkeeping.
 *
 * Steps are not inserted one by one: they wait in a buffer and are written
 * packed, a row of dwarf.step_log for each flow's steps in the buffer (an
 * array per column), those of a partition together with
 * table_multi_insert, as COPY writes its rows: one WAL record per heap
 * page instead of one per row, one index entry per flow instead of one per
 * step.  Nothing may see the difference: see "The step buffer" below for
 * what writes the rows, when, and under which transaction.
 *
 * Anything out of the ordinary goes back to the statements in flows.c and
 * store.c: a create with an idempotency key or an option this file does not
 * know, and a close that meets a concurrent change (a cancel), which the
 * UPDATE's re-check handles.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "rewrite/rewriteHandler.h"
#include "executor/execPartition.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "parser/parse_relation.h"
#include "partitioning/partdesc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "dwarf.h"
#include "json.h"
#include "partitions.h"
#include "rows.h"

/*
 * One of dwarf's tables, opened as a result relation for this transaction,
 * and what its definition says that dwarf needs to write its rows: where
 * the columns dwarf writes are (found by name, so that a column an
 * administrator added or dropped moves nothing), the defaults of the
 * columns dwarf does not know, and its CHECK constraints, ready to run.
 * That part, the table's shape, is kept across transactions until the
 * table's relcache entry is invalidated (ForgetShapes): a dwarf.run alone
 * is a batch of its own, and reading the defaults and constraints again
 * from their stored text at every open was 6% of its worker's CPU.
 */
typedef struct RowTable
{
	const char *name;
	const char *const *columns;	/* the columns dwarf writes, in its order */
	int			ncolumns;
	/* this transaction's */
	Relation	rel;
	ResultRelInfo *rri;
	TupleTableSlot *slot;		/* a row to write */
	TupleTableSlot *old;		/* a row read to update */
	Relation	pkey;			/* its primary key's index, among rri's */
	/* the shape, in shape_cxt, of the table whose OID is shape_of */
	Oid			shape_of;		/* InvalidOid: to be read again */
	MemoryContext shape_cxt;
	AttrNumber *column;			/* 0-based attribute of each of columns */
	int			ndefaults;		/* other columns that have a default: */
	AttrNumber *default_att;	/* ... which (0-based) */
	ExprState **default_expr;	/* ... and its expression */
	ExprState **checks;			/* its CHECK constraints, in the relcache's order */
} RowTable;

/* dwarf.step_log's columns this file writes: a row packs a flow's steps. */
enum
{
	PC_FLOW_ID, PC_FIRST_STEP, PC_LAST_STEP,
	PC_STEP_ID				/* then one array per step column after flow_id, in StepColumn order */
};
#define PC_COUNT	(PC_STEP_ID + SC_COUNT - SC_STEP_ID)
#define PackColumnOf(sc)	(PC_STEP_ID + (sc) - SC_STEP_ID)

static const char *const PackColumnNames[PC_COUNT] = {
	"flow_id", "first_step", "last_step",
	"step_id", "token", "task", "status", "attempt", "started_at",
	"finished_at", "changes", "goto_task", "wake_at", "signal", "error"
};

/* The type of each step column, in StepColumn order: an array's elements. */
static const Oid StepColumnTypes[SC_COUNT] = {
	INT8OID, INT8OID, INT4OID, TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, JSONBOID, TEXTOID, TIMESTAMPTZOID, JSONBOID, JSONBOID
};

/* dwarf.flow's columns this file writes. */
enum
{
	FC_ID, FC_GRAPH_ID, FC_STATUS, FC_OWNER, FC_PRIORITY, FC_INPUT, FC_STATE, FC_ERROR,
	FC_THREAD, FC_BAGGAGE, FC_FAIRNESS_KEY, FC_FAIRNESS_WEIGHT, FC_TIME_BUDGET,
	FC_DELETE_ON_COMPLETION, FC_CREATED_AT, FC_FINISHED_AT, FC_COUNT
};
static const char *const FlowColumnNames[FC_COUNT] = {
	"id", "graph_id", "status", "owner", "priority", "input", "state", "error",
	"thread", "baggage", "fairness_key", "fairness_weight", "time_budget",
	"delete_on_completion", "created_at", "finished_at"
};

static EState *RowsState = NULL;	/* this transaction's, or NULL */
static RowTable Steps = {"step_log", PackColumnNames, PC_COUNT};
static RowTable Flows = {"flow", FlowColumnNames, FC_COUNT};

/*
 * The step buffer.
 *
 * RowsInsertStep keeps a step's row (its values, as a tuple of the step
 * columns) in the buffer; FlushSteps writes the rows waiting there, packed
 * (see dwarf.step_log): the waiting steps of one flow, in the order they
 * were recorded, become one row of arrays, routed by the executor's tuple
 * routing to the partition of dwarf.step_log that holds the flow, checked
 * there, and written with the other packs of that partition by one
 * table_multi_insert (one WAL record per heap page), then indexed, as
 * COPY FROM does.  The buffer is written
 *  - when it holds STEP_BUFFER_ROWS rows or STEP_BUFFER_BYTES of them;
 *  - at RowsEnd, before the batch's commit, and at XACT_EVENT_PRE_COMMIT
 *	  (and PRE_PREPARE) for any other way to commit: no commit loses a row;
 *  - before a statement of this process reads dwarf.step_log or one of
 *	  its partitions (or a view over them, dwarf.step: the rewritten
 *	  plan's range table names the table), from an ExecutorStart hook, so
 *	  that a task reading its own flow's history (dwarf.history,
 *	  dwarf.fork) sees its earlier steps as it did when each row was
 *	  inserted at once.
 * So a flow's steps are as few rows as the flushes of its batch: one, in
 * a batch whose tasks do not read the step log.
 *
 * A CHECK constraint that an administrator put on dwarf.step_log is
 * checked for each step when it is recorded, on a pack of that step
 * alone, so that a step that breaks it fails on its own (and its flow
 * with it, see RecordStep); the pack is checked again where it is written.
 *
 * Visibility.  A pack is written with the command id its first step had
 * when it was buffered (the smallest of the buffer's rows:
 * table_multi_insert takes one), not the command id current when the
 * buffer is written.  So a snapshot whose command id is past a row's,
 * which saw the row inserted at once, sees it written late too, with no
 * command counter increment and no change to the reading statement's
 * snapshot (setting its curcid would also change what it sees of the
 * other tables it reads, and of a snapshot it may share with the statement
 * that called it).  What a snapshot may see in addition is a row buffered
 * after it was taken but before the reading statement started: this
 * transaction's own row, which the statement would have seen had it run
 * with a newer command id, as SPI runs each statement that may write.
 *
 * Subtransactions.  A row is tagged with the subtransaction that buffered
 * it (its owner) and, once in the heap, with the one it was written under.
 * The buffer is written under the current subtransaction, whose xid the
 * packs get, so every step of a pack shares the fate of the subtransaction
 * it was written under; the start of a subtransaction cannot write the
 * rows under its parent's xid instead (when SUBXACT_EVENT_START_SUB is
 * called the child is already the current transaction), so nothing is
 * written then: the parent's rows stay buffered until the parent writes
 * them.  When a child has to write rows of an ancestor (a statement in it
 * reads the step log, or the buffer is full) they go into the heap under
 * the child's xid and stay held: when the child commits they are its
 * parent's (and done when that is their owner); when it rolls back they
 * are gone from the heap with it and wait again, to be written (packed
 * anew) by their owner.  A row that a subtransaction buffered is dropped
 * when it rolls back.
 */
#define STEP_BUFFER_ROWS	4000
#define STEP_BUFFER_BYTES	(512 * 1024)

/* A step row held in the buffer. */
typedef struct HeldRow
{
	HeapTuple	tuple;			/* the step's values, of StepDesc */
	int64		flow_id;
	CommandId	cid;			/* the command that buffered it */
	SubTransactionId owner;		/* the subtransaction that did; Invalid: dropped */
	SubTransactionId written;	/* the one it is in the heap under; Invalid: not yet */
} HeldRow;

/* The packs going to one partition of dwarf.step_log (or to it), in a flush. */
typedef struct PackBatch
{
	ResultRelInfo *rri;			/* the table's, with its indexes */
	TupleDesc	desc;			/* a copy of its descriptor, for the slots */
	TupleTableSlot **slots;		/* [0, n): this flush's packs; then spare */
	int			n;
	int			nslots;
	int			size;			/* length of slots */
} PackBatch;

static TupleDesc StepDesc = NULL;	/* the step columns, for a held row */
static int16 StepTypLen[SC_COUNT];
static bool StepTypByVal[SC_COUNT];
static char StepTypAlign[SC_COUNT];

/* this transaction's, in RowsState */
static HeldRow *Held = NULL;	/* [0, NHeld): held, in the order recorded */
static int	NHeld = 0;
static int	HeldSize = 0;
static int	NWaiting = 0;		/* held rows not in the heap yet */
static Size WaitingBytes = 0;	/* and their size */
static PackBatch *Batches = NULL;
static int	NBatches = 0;
static int	BatchesSize = 0;
static List *StepTables = NIL;	/* dwarf.step_log and every partition under it */
static bool Flushing = false;	/* writing the buffer: a read then must not */

/* dwarf.step_log partitioned: the executor's tuple routing, set up as COPY does */
static ModifyTableState *StepsRoutingState = NULL;
static PartitionTupleRouting *StepsRouting = NULL;

static bool RowsHooksRegistered = false;
static ExecutorStart_hook_type PrevExecutorStart = NULL;

static void RegisterRowsHooks(void);
static void FlushSteps(void);

/*
 * An expression of the table's definition (a default, a CHECK constraint)
 * made ready to run in any transaction, as ExecPrepareExpr makes it for
 * one: planned, and with no executor state of its own.
 */
static ExprState *
KeptExpr(Node *expr)
{
	return ExecInitExpr(expression_planner((Expr *) expr), NULL);
}

/*
 * Reads the table's shape (see RowTable) unless it is kept: where dwarf's
 * columns are, the defaults of the others (a column an administrator
 * added gets its default, as an INSERT that does not name it would give
 * it; a dropped one is skipped) and the CHECK constraints.  A column of
 * dwarf's that is gone is an error that says so.
 */
static void
FindShape(RowTable *t)
{
	TupleDesc	desc = RelationGetDescr(t->rel);
	TupleConstr *constr = desc->constr;
	MemoryContext old;
	bool	   *ours;
	int			i;

	if (t->shape_of == RelationGetRelid(t->rel))
		return;
	if (t->shape_cxt == NULL)
		t->shape_cxt = AllocSetContextCreate(TopMemoryContext, "dwarf table shape",
											 ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(t->shape_cxt);
	old = MemoryContextSwitchTo(t->shape_cxt);
	ours = palloc0(sizeof(bool) * desc->natts);
	t->column = palloc(sizeof(AttrNumber) * t->ncolumns);
	for (i = 0; i < t->ncolumns; i++)
	{
		AttrNumber	attnum = attnameAttNum(t->rel, t->columns[i], false);

		if (attnum <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_COLUMN),
					 errmsg("dwarf.%s has no column \"%s\"", t->name, t->columns[i]),
					 errdetail("dwarf writes that column for every row."),
					 errhint("Add the column back as the extension made it, or drop and create the extension again.")));
		t->column[i] = attnum - 1;
		ours[attnum - 1] = true;
	}
	t->ndefaults = 0;
	t->default_att = palloc(sizeof(AttrNumber) * desc->natts);
	t->default_expr = palloc(sizeof(ExprState *) * desc->natts);
	for (i = 0; i < desc->natts; i++)
	{
		Node	   *expr;

		if (ours[i] || TupleDescAttr(desc, i)->attisdropped ||
			(expr = build_column_default(t->rel, i + 1)) == NULL)
			continue;
		t->default_att[t->ndefaults] = i;
		t->default_expr[t->ndefaults++] = KeptExpr(expr);
	}
	t->checks = NULL;
	if (constr != NULL && constr->num_check > 0)
	{
		/* what ExecConstraints would make from the same strings */
		t->checks = palloc(sizeof(ExprState *) * constr->num_check);
		for (i = 0; i < constr->num_check; i++)
			t->checks[i] = KeptExpr(stringToNode(constr->check[i].ccbin));
	}
	MemoryContextSwitchTo(old);
	t->shape_of = RelationGetRelid(t->rel);
}

/*
 * Opens t for this transaction, once: as a result relation with its
 * indexes (none for a partitioned table, whose rows are its partitions').
 * Relations and slots are the top transaction's resources even when this
 * runs in a subtransaction: they stay open until RowsEnd, whatever a
 * subtransaction does meanwhile.
 */
static RowTable *
OpenTable(RowTable *t)
{
	MemoryContext old;
	ResourceOwner owner = CurrentResourceOwner;
	int			i;

	if (t->rel != NULL)
		return t;
	if (!RowsHooksRegistered)
		RegisterRowsHooks();
	if (RowsState == NULL)
	{
		old = MemoryContextSwitchTo(TopTransactionContext);
		RowsState = CreateExecutorState();
		MemoryContextSwitchTo(old);
	}
	old = MemoryContextSwitchTo(RowsState->es_query_cxt);
	CurrentResourceOwner = TopTransactionResourceOwner;
	t->rel = table_open(get_relname_relid(t->name, get_namespace_oid("dwarf", false)),
						RowExclusiveLock);
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, t->rel, 0, NULL, 0);
	if (t->rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ExecOpenIndices(t->rri, false);
	t->pkey = NULL;
	for (i = 0; i < t->rri->ri_NumIndices; i++)
		if (RelationGetRelid(t->rri->ri_IndexRelationDescs[i]) == RelationGetPrimaryKeyIndex(t->rel, false))
			t->pkey = t->rri->ri_IndexRelationDescs[i];
	t->slot = table_slot_create(t->rel, NULL);
	t->old = table_slot_create(t->rel, NULL);
	FindShape(t);
	t->rri->ri_CheckConstraintExprs = t->checks;	/* NULL: ExecConstraints makes them */
	CurrentResourceOwner = owner;
	MemoryContextSwitchTo(old);
	return t;
}

/*
 * Starts a new row in t->slot: every column NULL but the defaults of the
 * columns dwarf does not write.  Returns the slot's values and nulls.
 */
static void
NewRow(RowTable *t)
{
	TupleTableSlot *slot = t->slot;
	ExprContext *econtext = GetPerTupleExprContext(RowsState);
	int			i;

	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * RelationGetDescr(t->rel)->natts);
	for (i = 0; i < t->ndefaults; i++)
		slot->tts_values[t->default_att[i]] =
			ExecEvalExprSwitchContext(t->default_expr[i], econtext,
									  &slot->tts_isnull[t->default_att[i]]);
}

static void
CloseTable(RowTable *t, bool committing)
{
	if (t->rel == NULL)
		return;
	if (committing)
	{
		ExecDropSingleTupleTableSlot(t->slot);
		ExecDropSingleTupleTableSlot(t->old);
		ExecCloseIndices(t->rri);
		table_close(t->rel, NoLock);
	}
	t->rel = NULL;
}

/*
 * Closes the pack batches' slots and the partitions the routing opened.
 * The buffer is written (empty).
 */
static void
CloseSteps(void)
{
	int			b,
				i;

	Assert(NHeld == 0);
	for (b = 0; b < NBatches; b++)
		for (i = 0; i < Batches[b].nslots; i++)
			ExecDropSingleTupleTableSlot(Batches[b].slots[i]);
	if (StepsRouting)
		ExecCleanupTupleRouting(StepsRoutingState, StepsRouting);
}

/* Forgets the step buffer: its memory and resources went with RowsState. */
static void
ForgetSteps(void)
{
	Held = NULL;
	NHeld = HeldSize = 0;
	NWaiting = 0;
	WaitingBytes = 0;
	Batches = NULL;
	NBatches = BatchesSize = 0;
	StepTables = NIL;
	Flushing = false;
	StepsRoutingState = NULL;
	StepsRouting = NULL;
}

/*
 * Before the batch's commit: writes the buffered step rows and closes what
 * this transaction opened.
 */
void
RowsEnd(void)
{
	ResourceOwner owner = CurrentResourceOwner;

	if (RowsState == NULL)
		return;
	FlushSteps();
	CurrentResourceOwner = TopTransactionResourceOwner;
	if (Steps.rel != NULL)
		CloseSteps();
	ForgetSteps();
	CloseTable(&Steps, true);
	CloseTable(&Flows, true);
	ExecResetTupleTable(RowsState->es_tupleTable, false);
	FreeExecutorState(RowsState);
	RowsState = NULL;
	CurrentResourceOwner = owner;
}

/* After a rollback: the abort released it all, buffered rows included. */
void
RowsForget(void)
{
	CloseTable(&Steps, false);
	CloseTable(&Flows, false);
	ForgetSteps();
	RowsState = NULL;
}

/* Inserts the row in t->slot, checked and indexed. */
static void
InsertSlot(RowTable *t)
{
	List	   *recheck;

	ExecStoreVirtualTuple(t->slot);
	if (t->rel->rd_att->constr)
		ExecConstraints(t->rri, t->slot, RowsState);
	table_tuple_insert(t->rel, t->slot, GetCurrentCommandId(true), 0, NULL);
	recheck = ExecInsertIndexTuples(t->rri, t->slot, RowsState, false, false, NULL, NIL,
									false);
	list_free(recheck);
	ResetPerTupleExprContext(RowsState);
}

/*
 * Sets up the routing of packs to dwarf.step_log's partitions, once per
 * transaction, as COPY FROM does for a partitioned table: the executor's
 * own tuple routing (ExecFindPartition) finds a row's partition by its
 * flow_id in the parent's partition descriptor (a binary search of the
 * range bounds, the default partition when none holds it, an error that
 * names the key when there is no default either), opens each partition
 * once with its indexes as a result relation, converts a row for a
 * partition whose columns are laid out otherwise, and re-checks the default
 * partition's constraint (a partition attached concurrently).  The parent
 * is locked RowExclusiveLock (OpenTable) before its descriptor is read,
 * which is built anew if the one kept may have been built while a segment
 * was attached (FreshPartitionDesc: such a one would send the steps of the
 * segment's flows to the default partition).
 */
static void
SetUpRouting(void)
{
	MemoryContext old = MemoryContextSwitchTo(RowsState->es_query_cxt);
	ResourceOwner owner = CurrentResourceOwner;

	CurrentResourceOwner = TopTransactionResourceOwner;
	FreshPartitionDesc(Steps.rel);
	StepsRoutingState = makeNode(ModifyTableState);
	StepsRoutingState->ps.plan = NULL;
	StepsRoutingState->ps.state = RowsState;
	StepsRoutingState->operation = CMD_INSERT;
	StepsRoutingState->mt_nrels = 1;
	StepsRoutingState->resultRelInfo = Steps.rri;
	StepsRoutingState->rootResultRelInfo = Steps.rri;
	StepsRouting = ExecSetupPartitionTupleRouting(RowsState, Steps.rel);
	CurrentResourceOwner = owner;
	MemoryContextSwitchTo(old);
}

/* The step columns' descriptor and element types, once per process. */
static void
MakeStepDesc(void)
{
	MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
	TupleDesc	desc = CreateTemplateTupleDesc(SC_COUNT);
	int			c;

	for (c = 0; c < SC_COUNT; c++)
	{
		TupleDescInitEntry(desc, c + 1, NULL, StepColumnTypes[c], -1, 0);
		get_typlenbyvalalign(StepColumnTypes[c], &StepTypLen[c], &StepTypByVal[c],
							 &StepTypAlign[c]);
	}
	StepDesc = desc;
	MemoryContextSwitchTo(old);
}

/*
 * The batch of the table rri is for, made if there is none yet.  Its slots
 * are made over a copy of the table's descriptor: a copy is counted by no
 * resource owner, so a slot is only memory of RowsState, which lives as
 * long as the transaction.
 */
static PackBatch *
BatchOf(ResultRelInfo *rri)
{
	MemoryContext old;
	PackBatch  *batch;
	int			b;

	for (b = 0; b < NBatches; b++)
		if (Batches[b].rri == rri)
			return &Batches[b];
	old = MemoryContextSwitchTo(RowsState->es_query_cxt);
	if (NBatches == BatchesSize)
	{
		BatchesSize = Max(4, BatchesSize * 2);
		Batches = Batches ? repalloc(Batches, sizeof(PackBatch) * BatchesSize) :
			palloc(sizeof(PackBatch) * BatchesSize);
	}
	batch = &Batches[NBatches++];
	memset(batch, 0, sizeof(PackBatch));
	batch->rri = rri;
	batch->desc = CreateTupleDescCopy(RelationGetDescr(rri->ri_RelationDesc));
	MemoryContextSwitchTo(old);
	return batch;
}

/* A slot of batch for the next pack: a spare one, or a new one. */
static TupleTableSlot *
BatchSlot(PackBatch *batch)
{
	MemoryContext old = MemoryContextSwitchTo(RowsState->es_query_cxt);

	if (batch->n == batch->size)
	{
		batch->size = Max(16, batch->size * 2);
		batch->slots = batch->slots ?
			repalloc(batch->slots, sizeof(TupleTableSlot *) * batch->size) :
			palloc(sizeof(TupleTableSlot *) * batch->size);
	}
	if (batch->n == batch->nslots)
		batch->slots[batch->nslots++] =
			MakeSingleTupleTableSlot(batch->desc,
									 table_slot_callbacks(batch->rri->ri_RelationDesc));
	MemoryContextSwitchTo(old);
	return batch->slots[batch->n++];
}

/*
 * Lets go of the held rows that are done (in the heap under the
 * subtransaction that owns them) or dropped (their owner rolled back),
 * keeping the others in order; counts the rows still waiting.
 */
static void
SettleRows(void)
{
	int			kept = 0;
	int			i;

	NWaiting = 0;
	WaitingBytes = 0;
	for (i = 0; i < NHeld; i++)
	{
		HeldRow		row = Held[i];

		if (row.owner == InvalidSubTransactionId || row.written == row.owner)
		{
			heap_freetuple(row.tuple);
			continue;
		}
		if (row.written == InvalidSubTransactionId)
		{
			NWaiting++;
			WaitingBytes += row.tuple->t_len;
		}
		Held[kept++] = row;
	}
	NHeld = kept;
}

/* Error context of a pack's routing and checks: the flow it is of. */
static void
StepRowContext(void *arg)
{
	errcontext("steps of flow " INT64_FORMAT " for dwarf.step_log", *(int64 *) arg);
}

/*
 * Makes the pack of rows (n steps of one flow, in order) in Steps.slot:
 * each step column an array with an element per step, NULL when every
 * element is; first_step and last_step the least and greatest step id.
 * What it allocates is in the per-tuple context.
 */
static void
FormPack(HeldRow **rows, int n)
{
	RowTable   *t = &Steps;
	MemoryContext old = MemoryContextSwitchTo(GetPerTupleMemoryContext(RowsState));
	Datum	   *elems[SC_COUNT];
	bool	   *elem_nulls[SC_COUNT];
	bool		any[SC_COUNT] = {0};
	Datum		values[SC_COUNT];
	bool		nulls[SC_COUNT];
	Datum	   *slot_values;
	bool	   *slot_nulls;
	int64		least = PG_INT64_MAX;
	int64		greatest = PG_INT64_MIN;
	int			lbound = 1;
	int			i,
				c;

	for (c = SC_STEP_ID; c < SC_COUNT; c++)
	{
		elems[c] = palloc(sizeof(Datum) * n);
		elem_nulls[c] = palloc(sizeof(bool) * n);
	}
	for (i = 0; i < n; i++)
	{
		int64		step_id;

		heap_deform_tuple(rows[i]->tuple, StepDesc, values, nulls);
		for (c = SC_STEP_ID; c < SC_COUNT; c++)
		{
			elems[c][i] = values[c];
			elem_nulls[c][i] = nulls[c];
			any[c] |= !nulls[c];
		}
		step_id = DatumGetInt64(values[SC_STEP_ID]);
		least = Min(least, step_id);
		greatest = Max(greatest, step_id);
	}

	NewRow(t);
	slot_values = t->slot->tts_values;
	slot_nulls = t->slot->tts_isnull;
	slot_values[t->column[PC_FLOW_ID]] = Int64GetDatum(rows[0]->flow_id);
	slot_nulls[t->column[PC_FLOW_ID]] = false;
	slot_values[t->column[PC_FIRST_STEP]] = Int64GetDatum(least);
	slot_nulls[t->column[PC_FIRST_STEP]] = false;
	slot_values[t->column[PC_LAST_STEP]] = Int64GetDatum(greatest);
	slot_nulls[t->column[PC_LAST_STEP]] = false;
	for (c = SC_STEP_ID; c < SC_COUNT; c++)
	{
		int			att = t->column[PackColumnOf(c)];

		slot_nulls[att] = !any[c];
		if (any[c])
			slot_values[att] = PointerGetDatum(construct_md_array(elems[c], elem_nulls[c], 1, &n, &lbound,
																  StepColumnTypes[c], StepTypLen[c],
																  StepTypByVal[c], StepTypAlign[c]));
	}
	ExecStoreVirtualTuple(t->slot);
	MemoryContextSwitchTo(old);
}

/* Orders held rows (by index into Held) by flow, then as recorded. */
static int
CompareHeld(const void *a, const void *b)
{
	int			i = *(const int *) a;
	int			j = *(const int *) b;

	if (Held[i].flow_id != Held[j].flow_id)
		return Held[i].flow_id < Held[j].flow_id ? -1 : 1;
	return i < j ? -1 : i > j ? 1 : 0;
}

/*
 * Writes the held rows that are not in the heap yet, packed, under the
 * current subtransaction.  An error on the way (a constraint, a unique
 * violation) leaves them waiting; a subtransaction that catches it rolls
 * back what was written, and they are written again later.  No
 * BulkInsertState: its ring of buffers would have the pages just written
 * evicted first, while they are the hottest of the table (the next batch
 * appends to the last one, reads of a running flow's history find them),
 * and it would keep the last page pinned between writes.
 */
static void
WritePacks(void)
{
	SubTransactionId current = GetCurrentSubTransactionId();
	CommandId	cid = InvalidCommandId;
	ErrorContextCallback context;
	HeldRow   **group;
	int		   *order;
	int			n = 0;
	int			i,
				b;

	order = palloc(sizeof(int) * NWaiting);
	group = palloc(sizeof(HeldRow *) * NWaiting);
	for (i = 0; i < NHeld; i++)
		if (Held[i].written == InvalidSubTransactionId)
		{
			order[n++] = i;
			if (cid == InvalidCommandId || Held[i].cid < cid)
				cid = Held[i].cid;
		}
	Assert(n == NWaiting);
	qsort(order, n, sizeof(int), CompareHeld);
	for (b = 0; b < NBatches; b++)
	{
		for (i = 0; i < Batches[b].n; i++)
			ExecClearTuple(Batches[b].slots[i]);
		Batches[b].n = 0;
	}

	context.callback = StepRowContext;
	context.previous = error_context_stack;
	error_context_stack = &context;
	for (i = 0; i < n;)
	{
		ResultRelInfo *rri = Steps.rri;
		TupleTableSlot *slot = Steps.slot;
		int64		flow_id = Held[order[i]].flow_id;
		int			k = 0;

		while (i < n && Held[order[i]].flow_id == flow_id)
			group[k++] = &Held[order[i++]];
		context.arg = &flow_id;
		FormPack(group, k);
		if (Steps.rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE)
		{
			ResourceOwner owner = CurrentResourceOwner;
			TupleConversionMap *map;

			if (StepsRouting == NULL)
				SetUpRouting();
			/* a partition it opens is the top transaction's, as in OpenTable */
			CurrentResourceOwner = TopTransactionResourceOwner;
			rri = ExecFindPartition(StepsRoutingState, Steps.rri, StepsRouting, slot, RowsState);
			CurrentResourceOwner = owner;
			map = ExecGetRootToChildMap(rri, RowsState);
			if (map)
				slot = execute_attr_map_slot(map->attrMap, slot, rri->ri_PartitionTupleSlot);
		}
		if (rri->ri_RelationDesc->rd_att->constr)
			ExecConstraints(rri, slot, RowsState);
		ExecCopySlot(BatchSlot(BatchOf(rri)), slot);
		ExecClearTuple(Steps.slot);
		ResetPerTupleExprContext(RowsState);
	}
	error_context_stack = context.previous;

	for (b = 0; b < NBatches; b++)
	{
		PackBatch  *batch = &Batches[b];
		MemoryContext old;

		if (batch->n == 0)
			continue;
		old = MemoryContextSwitchTo(GetPerTupleMemoryContext(RowsState));
		table_multi_insert(batch->rri->ri_RelationDesc, batch->slots, batch->n, cid, 0, NULL);
		MemoryContextSwitchTo(old);
		ResetPerTupleExprContext(RowsState);
		if (batch->rri->ri_NumIndices > 0)
			for (i = 0; i < batch->n; i++)
			{
				list_free(ExecInsertIndexTuples(batch->rri, batch->slots[i], RowsState,
												false, false, NULL, NIL, false));
				ResetPerTupleExprContext(RowsState);
			}
		for (i = 0; i < batch->n; i++)
			ExecClearTuple(batch->slots[i]);
		batch->n = 0;
	}
	for (i = 0; i < n; i++)
		Held[order[i]].written = current;
	pfree(order);
	pfree(group);
	SettleRows();
}

/* Writes every step row not in the heap yet (see WritePacks). */
static void
FlushSteps(void)
{
	if (NWaiting == 0 || Flushing)
		return;
	Flushing = true;
	PG_TRY();
	{
		WritePacks();
	}
	PG_FINALLY();
	{
		Flushing = false;
	}
	PG_END_TRY();
}

/*
 * Checks a step alone against the CHECK constraints an administrator put
 * on dwarf.step_log (see "The step buffer"), as a pack of that one step.
 */
static void
CheckAlone(Datum *values, bool *nulls)
{
	MemoryContext old = MemoryContextSwitchTo(GetPerTupleMemoryContext(RowsState));
	HeldRow		row;
	HeldRow    *rows[1] = {&row};
	ErrorContextCallback context;

	row.tuple = heap_form_tuple(StepDesc, values, nulls);
	row.flow_id = DatumGetInt64(values[SC_FLOW_ID]);
	MemoryContextSwitchTo(old);
	context.callback = StepRowContext;
	context.arg = &row.flow_id;
	context.previous = error_context_stack;
	error_context_stack = &context;
	FormPack(rows, 1);
	ExecConstraints(Steps.rri, Steps.slot, RowsState);
	error_context_stack = context.previous;
	ExecClearTuple(Steps.slot);
	ResetPerTupleExprContext(RowsState);
}

/*
 * Appends a step's row: values and nulls indexed by StepColumn.  The row is
 * copied into the buffer (the caller may free what values point to); see
 * "The step buffer" for when and how it is written.
 */
void
RowsInsertStep(Datum *values, bool *nulls)
{
	RowTable   *t = OpenTable(&Steps);
	MemoryContext old;
	HeldRow    *row;

	if (StepDesc == NULL)
		MakeStepDesc();
	if (t->checks != NULL)
		CheckAlone(values, nulls);
	old = MemoryContextSwitchTo(RowsState->es_query_cxt);
	if (NHeld == HeldSize)
	{
		HeldSize = Max(64, HeldSize * 2);
		Held = Held ? repalloc(Held, sizeof(HeldRow) * HeldSize) :
			palloc(sizeof(HeldRow) * HeldSize);
	}
	row = &Held[NHeld++];
	row->tuple = heap_form_tuple(StepDesc, values, nulls);
	MemoryContextSwitchTo(old);
	row->flow_id = DatumGetInt64(values[SC_FLOW_ID]);
	row->cid = GetCurrentCommandId(true);
	row->owner = GetCurrentSubTransactionId();
	row->written = InvalidSubTransactionId;
	NWaiting++;
	WaitingBytes += row->tuple->t_len;
	if (NWaiting >= STEP_BUFFER_ROWS || WaitingBytes >= STEP_BUFFER_BYTES)
		FlushSteps();
}

/*
 * Transaction callback: a commit (or a prepare) writes what is buffered
 * first, whatever path it comes by; an abort drops it.
 */
static void
RowsXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (RowsState != NULL)
			{
				/* a toasted value is written under a snapshot */
				bool		pushed = NWaiting > 0 && !ActiveSnapshotSet();

				if (pushed)
					PushActiveSnapshot(GetTransactionSnapshot());
				RowsEnd();
				if (pushed)
					PopActiveSnapshot();
			}
			break;
		case XACT_EVENT_ABORT:
			RowsForget();
			break;
		default:
			break;
	}
}

/*
 * Subtransaction callback: the rows a subtransaction buffered are its
 * parent's when it commits and dropped when it rolls back; rows of its
 * ancestors that it wrote (in the heap under its xid) are its parent's
 * when it commits, and wait again when it rolls back.  The subtransaction
 * ending is still the current one; any subtransaction started after it is
 * one of its children, ended before it.
 */
static void
RowsSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
					SubTransactionId parentSubid, void *arg)
{
	bool		commit = event == SUBXACT_EVENT_COMMIT_SUB;
	int			i;

	if (NHeld == 0 || (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB))
		return;
	for (i = 0; i < NHeld; i++)
	{
		HeldRow    *row = &Held[i];
		bool		in_heap_under_it = row->written != InvalidSubTransactionId &&
			row->written >= mySubid;

		if (row->owner >= mySubid)
			row->owner = commit ? parentSubid : InvalidSubTransactionId;
		if (in_heap_under_it)
			row->written = commit ? parentSubid : InvalidSubTransactionId;
	}
	SettleRows();
}

/*
 * Whether a plan's range table names dwarf.step_log or a partition under
 * it.  Only a partition (a syscache test) has the partitions listed, once
 * per transaction.
 */
static bool
ReadsSteps(List *rtable)
{
	Oid			steps = RelationGetRelid(Steps.rel);
	ListCell   *lc;

	foreach(lc, rtable)
	{
		RangeTblEntry *rte = lfirst(lc);

		if (rte->rtekind != RTE_RELATION)
			continue;
		if (rte->relid == steps)
			return true;
		if (!get_rel_relispartition(rte->relid))
			continue;
		if (StepTables == NIL)
		{
			MemoryContext old = MemoryContextSwitchTo(RowsState->es_query_cxt);

			StepTables = find_all_inheritors(steps, NoLock, NULL);
			MemoryContextSwitchTo(old);
		}
		if (list_member_oid(StepTables, rte->relid))
			return true;
	}
	return false;
}

/*
 * ExecutorStart hook: a statement that reads buffered step rows' tables
 * has them written first (see "The step buffer").  With nothing buffered
 * it costs one test.
 */
static void
RowsExecutorStart(QueryDesc *queryDesc, int eflags)
{
	if (NWaiting > 0 && !Flushing && (eflags & EXEC_FLAG_EXPLAIN_ONLY) == 0 &&
		Steps.rel != NULL && ReadsSteps(queryDesc->plannedstmt->rtable))
		FlushSteps();
	if (PrevExecutorStart)
		PrevExecutorStart(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * A relcache invalidation of one of dwarf's tables (an ALTER TABLE, an
 * ANALYZE), or of all of them: its shape is read again at its next open.
 * Only forgotten here: a transaction that has the table open goes on with
 * the shape it read, which its lock keeps true (a change of the table's
 * columns, defaults or constraints waits for that lock).
 */
static void
ForgetShapes(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == Steps.shape_of)
		Steps.shape_of = InvalidOid;
	if (relid == InvalidOid || relid == Flows.shape_of)
		Flows.shape_of = InvalidOid;
}

/*
 * Registers the callbacks and the hook above, once per process, when it
 * first opens one of dwarf's tables here: a process that never does pays
 * nothing for them.
 */
static void
RegisterRowsHooks(void)
{
	CacheRegisterRelcacheCallback(ForgetShapes, (Datum) 0);
	RegisterXactCallback(RowsXactCallback, NULL);
	RegisterSubXactCallback(RowsSubXactCallback, NULL);
	PrevExecutorStart = ExecutorStart_hook;
	ExecutorStart_hook = RowsExecutorStart;
	RowsHooksRegistered = true;
}

/* A string field of the options, as text; false if it is there but not a string. */
static bool
OptionText(Jsonb *options, const char *key, char **out)
{
	JsonbValue *v = JsonbField(options, key);

	*out = NULL;
	if (v == NULL || v->type == jbvNull)
		return true;
	if (v->type != jbvString)
		return false;
	*out = pnstrdup(v->val.string.val, v->val.string.len);
	return true;
}

/*
 * Reads dwarf.run's options (api.c, OptionsFromArgs) into the row's
 * fields.  Returns false for anything else, which the INSERT handles.
 */
static bool
ReadOptions(Jsonb *options, FlowRow *row, char **thread, Interval **budget)
{
	static const char *const known[] = {
		"fairness_key", "fairness_weight", "time_budget", "delete_on_completion",
		"baggage", "thread"
	};
	JsonbIterator *it = JsonbIteratorInit(&options->root);
	JsonbValue	v;
	JsonbIteratorToken tok;
	JsonbValue *field;
	char	   *text;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		int			i;
		bool		found = false;

		if (tok != WJB_KEY)
			continue;
		for (i = 0; i < lengthof(known); i++)
			found |= strlen(known[i]) == v.val.string.len &&
				strncmp(known[i], v.val.string.val, v.val.string.len) == 0;
		if (!found)
			return false;
	}
	if (!OptionText(options, "fairness_key", &row->fairness_key) ||
		!OptionText(options, "thread", thread) ||
		!OptionText(options, "time_budget", &text))
		return false;
	row->fairness_weight = 1;
	if ((field = JsonbField(options, "fairness_weight")) != NULL)
	{
		if (field->type != jbvNumeric)
			return false;
		row->fairness_weight = DatumGetInt32(DirectFunctionCall1(numeric_int4,
																 NumericGetDatum(field->val.numeric)));
	}
	*budget = NULL;
	row->time_budget_ms = 0;
	if (text)
	{
		Numeric		epoch;

		*budget = DatumGetIntervalP(DirectFunctionCall3(interval_in, CStringGetDatum(text),
														ObjectIdGetDatum(InvalidOid),
														Int32GetDatum(-1)));
		/* as (extract(epoch FROM time_budget) * 1000)::bigint */
		epoch = DatumGetNumeric(DirectFunctionCall2(extract_interval,
													CStringGetTextDatum("epoch"),
													IntervalPGetDatum(*budget)));
		epoch = numeric_mul_opt_error(epoch, int64_to_numeric(1000), NULL);
		row->time_budget_ms = DatumGetInt64(DirectFunctionCall1(numeric_int8,
																NumericGetDatum(epoch)));
	}
	row->delete_on_completion = false;
	if ((field = JsonbField(options, "delete_on_completion")) != NULL)
	{
		if (field->type != jbvBool)
			return false;
		row->delete_on_completion = field->val.boolean;
	}
	row->baggage = NULL;
	if ((field = JsonbField(options, "baggage")) != NULL && field->type != jbvNull)
		row->baggage = JsonbValueToJsonb(JsonbAsBinary(field));
	return true;
}

/*
 * Inserts a new flow with no idempotency key (dwarf.run's, dwarf.create's:
 * see InsertFlow), and fills *row as InsertFlowRow would.  Returns false,
 * having written nothing, when the options hold something it does not
 * handle: then use InsertFlowRow.
 */
bool
RowsInsertFlow(int64 id, int32 graph_id, Oid owner, int32 priority, Jsonb *input,
			   Jsonb *options, FlowRow *row)
{
	RowTable   *t;
	char	   *thread;
	Interval   *budget;
	Datum	   *values;
	bool	   *nulls;

	memset(row, 0, sizeof(FlowRow));
	if (!ReadOptions(options, row, &thread, &budget))
		return false;
	t = OpenTable(&Flows);
	row->id = id;
	row->graph_id = graph_id;
	row->owner = owner;
	row->priority = priority;
	row->input = input;

	NewRow(t);
	values = t->slot->tts_values;
	nulls = t->slot->tts_isnull;
#define SET(col, datum) (values[t->column[col]] = (datum), nulls[t->column[col]] = false)
	SET(FC_ID, Int64GetDatum(id));
	SET(FC_GRAPH_ID, Int32GetDatum(graph_id));
	SET(FC_STATUS, CStringGetTextDatum("running"));
	SET(FC_OWNER, ObjectIdGetDatum(owner));
	SET(FC_PRIORITY, Int32GetDatum(priority));
	SET(FC_INPUT, JsonbPGetDatum(input));
	if (thread)
		SET(FC_THREAD, CStringGetTextDatum(thread));
	if (row->baggage)
		SET(FC_BAGGAGE, JsonbPGetDatum(row->baggage));
	if (row->fairness_key)
		SET(FC_FAIRNESS_KEY, CStringGetTextDatum(row->fairness_key));
	SET(FC_FAIRNESS_WEIGHT, Int32GetDatum(row->fairness_weight));
	if (budget)
		SET(FC_TIME_BUDGET, IntervalPGetDatum(budget));
	SET(FC_DELETE_ON_COMPLETION, BoolGetDatum(row->delete_on_completion));
	SET(FC_CREATED_AT, TimestampTzGetDatum(GetCurrentTransactionStartTimestamp())); /* now() */
#undef SET
	InsertSlot(t);
	return true;
}

/*
 * Writes a flow's close: status, final state, error, finished_at, on the
 * row if it is still running (none: nothing to do).  Returns false, having
 * written nothing, when a concurrent transaction has changed the row (a
 * cancel, say): then the UPDATE statement, which re-checks the newer row,
 * is to do it.
 */
bool
RowsCloseFlow(int64 id, bool completed, Jsonb *state, const char *error)
{
	RowTable   *t = OpenTable(&Flows);
	ScanKeyData key;
	IndexScanDesc scan;
	Snapshot	snapshot;
	bool		found;
	int			natts = RelationGetDescr(t->rel)->natts;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	TU_UpdateIndexes update_indexes;
	TM_Result	result;

	if (t->pkey == NULL)
		return false;

	/* The row as of now, this transaction's own writes included. */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	scan = index_beginscan(t->rel, t->pkey, snapshot, NULL, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, t->old);
	index_endscan(scan);
	if (found)
		slot_getallattrs(t->old);
	if (!found || t->old->tts_isnull[t->column[FC_STATUS]] ||
		strcmp(TextDatumGetCString(t->old->tts_values[t->column[FC_STATUS]]), "running") != 0)
	{
		/* gone or closed: the UPDATE's WHERE would leave it, as we do */
		ExecClearTuple(t->old);
		UnregisterSnapshot(snapshot);
		return true;
	}

	ExecClearTuple(t->slot);
	memcpy(t->slot->tts_values, t->old->tts_values, sizeof(Datum) * natts);
	memcpy(t->slot->tts_isnull, t->old->tts_isnull, sizeof(bool) * natts);
	t->slot->tts_values[t->column[FC_STATUS]] = CStringGetTextDatum(completed ? "completed" : "failed");
	t->slot->tts_values[t->column[FC_STATE]] = state ? JsonbPGetDatum(state) : (Datum) 0;
	t->slot->tts_isnull[t->column[FC_STATE]] = state == NULL;
	t->slot->tts_values[t->column[FC_ERROR]] = error ? CStringGetTextDatum(error) : (Datum) 0;
	t->slot->tts_isnull[t->column[FC_ERROR]] = error == NULL;
	t->slot->tts_values[t->column[FC_FINISHED_AT]] = TimestampTzGetDatum(GetCurrentTimestamp()); /* clock_timestamp() */
	t->slot->tts_isnull[t->column[FC_FINISHED_AT]] = false;
	ExecStoreVirtualTuple(t->slot);
	if (t->rel->rd_att->constr)
		ExecConstraints(t->rri, t->slot, RowsState);

	result = table_tuple_update(t->rel, &t->old->tts_tid, t->slot, GetCurrentCommandId(true),
								snapshot, InvalidSnapshot, true, &tmfd, &lockmode,
								&update_indexes);
	UnregisterSnapshot(snapshot);
	if (result == TM_Ok && CompatUpdateIndexes(update_indexes))
		list_free(ExecInsertIndexTuples(t->rri, t->slot, RowsState, true, false, NULL, NIL,
										CompatOnlySummarizing(update_indexes)));
	ExecClearTuple(t->slot);
	ExecClearTuple(t->old);
	ResetPerTupleExprContext(RowsState);
	return result == TM_Ok;
}
