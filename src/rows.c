/*
 * rows.c
 *		A worker's writes of dwarf's own rows without a statement: each step's
 *		row, the flows dwarf.run creates, and a flow's close.
 *
 * These are the hot path's writes: a statement for each would be planned,
 * set up and torn down per row (its check constraints parsed again each
 * time).  Instead the tables are opened once per batch transaction as the
 * executor's result relations, and each row goes through the executor's
 * row machinery: ExecConstraints, table_tuple_insert or _update, and
 * ExecInsertIndexTuples, which keeps every index as a statement would
 * (unique checks, partial indexes' predicates, BRIN).  The rows are
 * dwarf's: no user trigger fires for them, as for any extension's own
 * bookkeeping.
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
#include "rewrite/rewriteHandler.h"
#include "executor/execPartition.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "parser/parse_relation.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "dwarf.h"
#include "json.h"
#include "rows.h"

/*
 * One of dwarf's tables, opened as a result relation for this transaction,
 * with where the columns dwarf writes are in it (found by name at each
 * open, so that a column an administrator added or dropped moves nothing)
 * and the defaults of the columns dwarf does not know.
 */
typedef struct RowTable
{
	const char *name;
	const char *const *columns;	/* the columns dwarf writes, in its order */
	int			ncolumns;
	Relation	rel;
	ResultRelInfo *rri;
	TupleTableSlot *slot;		/* a row to write */
	TupleTableSlot *old;		/* a row read to update */
	Relation	pkey;			/* its primary key's index, among rri's */
	ModifyTableState *mtstate;	/* a partitioned table's: where rows go */
	PartitionTupleRouting *proute;
	AttrNumber *column;			/* 0-based attribute of each of columns */
	int			ndefaults;		/* other columns that have a default: */
	AttrNumber *default_att;	/* ... which (0-based) */
	ExprState **default_expr;	/* ... and its expression */
} RowTable;

static const char *const StepColumnNames[SC_COUNT] = {
	"flow_id", "step_id", "token", "task", "status", "attempt", "started_at",
	"finished_at", "changes", "goto_task", "wake_at", "signal", "error"
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
static RowTable Steps = {"step", StepColumnNames, SC_COUNT};
static RowTable Flows = {"flow", FlowColumnNames, FC_COUNT};

/*
 * Finds where dwarf's columns are in the table, and prepares the defaults
 * of the others: a column an administrator added gets its default, as an
 * INSERT that does not name it would give it; a dropped one is skipped.
 * A column of dwarf's that is gone is an error that says so.
 */
static void
FindColumns(RowTable *t)
{
	TupleDesc	desc = RelationGetDescr(t->rel);
	bool	   *ours = palloc0(sizeof(bool) * desc->natts);
	int			i;

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
		t->default_expr[t->ndefaults++] = ExecPrepareExpr((Expr *) expr, RowsState);
	}
	pfree(ours);
}

static RowTable *
OpenTable(RowTable *t)
{
	MemoryContext old;
	int			i;

	if (t->rel != NULL)
		return t;
	if (RowsState == NULL)
	{
		old = MemoryContextSwitchTo(TopTransactionContext);
		RowsState = CreateExecutorState();
		MemoryContextSwitchTo(old);
	}
	old = MemoryContextSwitchTo(RowsState->es_query_cxt);
	t->rel = table_open(get_relname_relid(t->name, get_namespace_oid("dwarf", false)),
						RowExclusiveLock);
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, t->rel, 0, NULL, 0);
	ExecOpenIndices(t->rri, false);
	t->pkey = NULL;
	for (i = 0; i < t->rri->ri_NumIndices; i++)
		if (RelationGetRelid(t->rri->ri_IndexRelationDescs[i]) == RelationGetPrimaryKeyIndex(t->rel))
			t->pkey = t->rri->ri_IndexRelationDescs[i];
	t->slot = table_slot_create(t->rel, NULL);
	t->old = table_slot_create(t->rel, NULL);
	t->mtstate = NULL;
	t->proute = NULL;
	if (t->rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE)
	{
		/* as COPY routes its rows: no plan, the table as its own root */
		t->mtstate = makeNode(ModifyTableState);
		t->mtstate->ps.state = RowsState;
		t->mtstate->operation = CMD_INSERT;
		t->mtstate->mt_nrels = 1;
		t->mtstate->resultRelInfo = t->rri;
		t->mtstate->rootResultRelInfo = t->rri;
		t->proute = ExecSetupPartitionTupleRouting(RowsState, t->rel);
	}
	FindColumns(t);
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
		if (t->proute)
			ExecCleanupTupleRouting(t->mtstate, t->proute);
		ExecDropSingleTupleTableSlot(t->slot);
		ExecDropSingleTupleTableSlot(t->old);
		ExecCloseIndices(t->rri);
		table_close(t->rel, NoLock);
	}
	t->rel = NULL;
}

/* Before the batch's commit: closes what this transaction opened. */
void
RowsEnd(void)
{
	CloseTable(&Steps, true);
	CloseTable(&Flows, true);
	if (RowsState)
		FreeExecutorState(RowsState);
	RowsState = NULL;
}

/* After a rollback: the abort released it all. */
void
RowsForget(void)
{
	CloseTable(&Steps, false);
	CloseTable(&Flows, false);
	RowsState = NULL;
}

/* Inserts the row in t->slot, checked and indexed. */
static void
InsertSlot(RowTable *t)
{
	List	   *recheck;
	ResultRelInfo *rri = t->rri;
	TupleTableSlot *slot = t->slot;

	ExecStoreVirtualTuple(slot);
	if (t->proute)
	{
		TupleConversionMap *map;

		rri = ExecFindPartition(t->mtstate, t->rri, t->proute, slot, RowsState);
		map = rri->ri_RootToPartitionMap;
		if (map)
			slot = execute_attr_map_slot(map->attrMap, slot, rri->ri_PartitionTupleSlot);
	}
	if (rri->ri_RelationDesc->rd_att->constr)
		ExecConstraints(rri, slot, RowsState);
	table_tuple_insert(rri->ri_RelationDesc, slot, GetCurrentCommandId(true), 0, NULL);
	recheck = ExecInsertIndexTuples(rri, slot, RowsState, false, false, NULL, NIL);
	list_free(recheck);
	ResetPerTupleExprContext(RowsState);
}

/* Appends a step's row: values and nulls indexed by StepColumn. */
void
RowsInsertStep(Datum *values, bool *nulls)
{
	RowTable   *t = OpenTable(&Steps);
	int			i;

	NewRow(t);
	for (i = 0; i < SC_COUNT; i++)
	{
		t->slot->tts_values[t->column[i]] = values[i];
		t->slot->tts_isnull[t->column[i]] = nulls[i];
	}
	InsertSlot(t);
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
 * Inserts a new flow for dwarf.run, with no idempotency key, and fills *row
 * as InsertFlowRow would.  Returns false, having written nothing, when the
 * options hold something it does not handle: then use InsertFlowRow.
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
	bool		update_indexes;
	TM_Result	result;

	if (t->pkey == NULL)
		return false;

	/* The row as of now, this transaction's own writes included. */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	scan = index_beginscan(t->rel, t->pkey, snapshot, 1, 0);
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
	if (result == TM_Ok && update_indexes)
		list_free(ExecInsertIndexTuples(t->rri, t->slot, RowsState, true, false, NULL, NIL));
	ExecClearTuple(t->slot);
	ExecClearTuple(t->old);
	ResetPerTupleExprContext(RowsState);
	return result == TM_Ok;
}
