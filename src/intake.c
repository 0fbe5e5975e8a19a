/*
 * intake.c
 *		The worker's end of dwarf.run: creating the flows that callers
 *		handed over (request.c), and answering them once the creates are on
 *		disk.
 *
 * Usually the creates join the next batch's transaction (IntakeInBatch):
 * the new flows are inserted directly (rows.c; with an idempotency key, by
 * statement) and put in memory from the rows written, and
 * their first steps chain into the batch, so that a short flow is created,
 * run and closed in one commit.  If a create fails there, before any step
 * has run, the transaction is rolled back and the requests are created
 * apart, one at a time if need be, so that only the bad one fails.  If the
 * batch rolls back later, its requests are given back and created apart
 * next time round.  Apart (IntakeApart), the creates commit in a
 * transaction of their own and the new flows are loaded as any other.
 *
 * Either way a caller is answered only once its create's commit is
 * flushed, and replicated as synchronous_commit asks: a flow id it is told
 * exists after a crash, and after a failover to a synchronous standby.  A
 * worker that exits answers what it committed and gives back the rest
 * (IntakeAtExit), so that no caller waits for it.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "dwarf.h"
#include "shmem.h"
#include "flowrun.h"
#include "flows.h"
#include "request.h"
#include "rows.h"
#include "worker.h"

/* A request whose flow this worker created (or found, by its key). */
typedef struct Created
{
	int			procno;
	uint32		generation;		/* of the request taken */
	int64		flow_id;
	bool		is_new;
	RunOutcome	outcome;		/* if it closed in the batch that created it */
} Created;

/* All in Worker.context. */
static List *InBatch = NIL;		/* created in the open batch transaction */
static List *Unanswered = NIL;	/* committed, to answer once flushed */
static XLogRecPtr CreatedEnd = InvalidXLogRecPtr;	/* the creates' commit */
static List *Redo = NIL;		/* procnos given back by a rolled-back batch */

static void
FreeCreated(Created *c)
{
	if (c->outcome.state)
		pfree(c->outcome.state);
	if (c->outcome.error)
		pfree(c->outcome.error);
	pfree(c);
}

static void IntakeAtExit(int code, Datum arg);

/*
 * Takes a caller's request, if it is still there, and returns its entry
 * (in Worker.context), which the caller of this keeps in a list at once:
 * whatever happens next, the request is answered or given back from there.
 * The first take sets up the worker's exit callback.
 */
static Created *
Take(int procno, TakenRequest *taken)
{
	static bool at_exit = false;
	Created    *c;

	if (!at_exit)
	{
		before_shmem_exit(IntakeAtExit, (Datum) 0);
		at_exit = true;
	}
	if (!RequestTake(procno, taken))
		return NULL;
	c = MemoryContextAllocZero(Worker.context, sizeof(Created));
	c->procno = procno;
	c->generation = taken->generation;
	c->flow_id = taken->body->flow_id;
	return c;
}

/*
 * Creates the flow of one taken request (the caller is connected to SPI),
 * with its row when row is given.  Releases the request's body.
 */
static void
CreateRequested(TakenRequest *taken, Created *c, HeapTuple *row, TupleDesc *desc)
{
	RunRequest *r = taken->body;

	c->flow_id = InsertFlowRow(r->flow_id, r->graph_id, r->owner, r->priority, taken->key,
							   taken->input, taken->options, &c->is_new, row, desc);
	RequestRelease(taken);
}

/*
 * Creates the requested flows in a transaction of their own, then loads
 * them (NoteLoad).  A request that spoils the transaction has the rest
 * created one at a time, so that only it fails.
 */
void
IntakeApart(List *procnos)
{
	MemoryContext cxt = CurrentMemoryContext;
	List	   *volatile created = NIL;
	ListCell   *lc;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	PreparePlans();

	/*
	 * The creates need not wait for their own WAL flush (nor for a
	 * synchronous standby): the callers are answered only once it is
	 * flushed and replicated (IntakeAnswer), which the batch that runs the
	 * new flows' first steps, right after, usually does.
	 */
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_LOCAL, true, 0, false);
	PG_TRY();
	{
		foreach(lc, procnos)
		{
			TakenRequest taken;
			Created    *c = Take(lfirst_int(lc), &taken);

			if (c == NULL)
				continue;
			created = lappend(created, c);
			CreateRequested(&taken, c, NULL, NULL);
		}
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
		MemoryContextSwitchTo(cxt); /* the commit left us in TopMemoryContext */
	}
	PG_CATCH();
	{
		ErrorData  *edata = AbortAfterError(cxt);

		foreach(lc, created)
		{
			Created    *c = lfirst(lc);

			if (list_length(procnos) == 1)
				RequestAnswer(c->procno, c->generation, 0, edata, NULL);
			else
				RequestGiveBack(c->procno, c->generation);
		}
		list_free_deep(created);	/* no outcomes yet */
		if (list_length(procnos) > 1)
			foreach(lc, procnos)
				IntakeApart(list_make1_int(lfirst_int(lc)));
		return;
	}
	PG_END_TRY();

	CreatedEnd = XactLastCommitEnd;
	foreach(lc, created)
	{
		Created    *c = lfirst(lc);
		MemoryContext old = MemoryContextSwitchTo(Worker.context);

		if (c->is_new)
			NoteLoad(c->flow_id, false);
		Unanswered = lappend(Unanswered, c);
		MemoryContextSwitchTo(old);
	}
}

/* Forgets the creates of a transaction that rolled back, giving their requests back. */
static void
ForgetInBatch(void)
{
	ListCell   *lc;

	foreach(lc, InBatch)
	{
		Created    *c = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &c->flow_id, HASH_FIND, NULL);

		if (flow && c->is_new)
			DropFlow(flow);
		RequestGiveBack(c->procno, c->generation);
		FreeCreated(c);
	}
	list_free(InBatch);
	InBatch = NIL;
}

/*
 * In the batch's transaction, before any of its steps has run: creates the
 * requested flows and puts the new ones in memory (*flows), to chain their
 * first steps into the batch.  Returns false if a create failed: then the
 * transaction is rolled back, the requests have been created apart, and
 * the caller starts its transaction again.
 */
bool
IntakeInBatch(List *procnos, List **flows)
{
	/*
	 * Where the error is copied to after a failure: not the current
	 * context, which belongs to the batch's transaction (SPI's) and goes
	 * with its rollback.
	 */
	MemoryContext cxt = Worker.batch_context;
	ListCell   *lc;

	*flows = NIL;
	PG_TRY();
	{
		foreach(lc, procnos)
		{
			TakenRequest taken;
			RunRequest *r;
			HeapTuple	row;
			TupleDesc	desc;
			FlowRow		flowrow;
			Created    *c = Take(lfirst_int(lc), &taken);
			MemoryContext old;

			if (c == NULL)
				continue;
			old = MemoryContextSwitchTo(Worker.context);
			InBatch = lappend(InBatch, c);
			MemoryContextSwitchTo(old);
			r = taken.body;
			if (taken.key == NULL &&
				RowsInsertFlow(r->flow_id, r->graph_id, r->owner, r->priority, taken.input,
							   taken.options, &flowrow))
			{
				c->is_new = true;
				RequestRelease(&taken);
			}
			else
			{
				CreateRequested(&taken, c, &row, &desc);
				if (c->is_new)
					FlowRowFromTuple(row, desc, &flowrow);
			}
			if (c->is_new)
			{
				FlowRun    *flow = TakeInFlow(&flowrow);

				if (flow)
					*flows = lappend(*flows, flow);
			}
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata = AbortAfterError(cxt);

		ereport(DEBUG1,
				(errmsg("dwarf: creating %d flows in a batch failed, creating them apart: %s",
						list_length(procnos), edata->message)));
		FreeErrorData(edata);
		ForgetInBatch();		/* the one taken when it failed too */
		IntakeApart(procnos);
		MemoryContextSwitchTo(cxt);
		*flows = NIL;
		return false;
	}
	PG_END_TRY();
	return true;
}

/*
 * A flow closed in the batch (its row is written): if the batch created it,
 * its caller is told how it ended with its flow id, and need not read it.
 * A flow deleted on completion has no outcome to tell, as dwarf.await says.
 */
void
IntakeNoteClose(FlowRun *flow)
{
	ListCell   *lc;

	if (flow->delete_on_completion)
		return;
	foreach(lc, InBatch)
	{
		Created    *c = lfirst(lc);

		if (c->flow_id == flow->id && c->is_new)
		{
			MemoryContext old = MemoryContextSwitchTo(Worker.context);

			c->outcome.closed = true;
			c->outcome.completed = flow->status == FLOW_COMPLETED;
			c->outcome.state = flow->final_state ?
				(Jsonb *) PG_DETOAST_DATUM_COPY(JsonbPGetDatum(flow->final_state)) : NULL;
			c->outcome.error = flow->error ? pstrdup(flow->error) : NULL;
			MemoryContextSwitchTo(old);
			return;
		}
	}
}

/*
 * After the batch's commit: its creates are answered once flushed, and the
 * new flows' steps that did not fit in the batch are queued.
 */
void
IntakeCommitted(void)
{
	ListCell   *lc;
	MemoryContext old;

	if (InBatch == NIL)
		return;
	CreatedEnd = XactLastCommitEnd;
	foreach(lc, InBatch)
	{
		Created    *c = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &c->flow_id, HASH_FIND, NULL);

		if (flow && c->is_new)
			EnqueueRunnable(flow);
	}
	old = MemoryContextSwitchTo(Worker.context);
	Unanswered = list_concat(Unanswered, InBatch);
	MemoryContextSwitchTo(old);
	list_free(InBatch);
	InBatch = NIL;
}

/* After the batch's rollback: its requests are created again, apart, next time round. */
void
IntakeRolledBack(void)
{
	ListCell   *lc;
	MemoryContext old = MemoryContextSwitchTo(Worker.context);

	foreach(lc, InBatch)
		Redo = lappend_int(Redo, ((Created *) lfirst(lc))->procno);
	MemoryContextSwitchTo(old);
	ForgetInBatch();
	if (Redo != NIL)
		SetLatch(MyLatch);		/* the main loop comes round for them */
}

/* Adds to requests (in the current context) those a rolled-back batch gave back. */
List *
IntakeRedo(List *requests)
{
	List	   *all = list_concat(requests, Redo);

	list_free(Redo);
	Redo = NIL;
	return all;
}

/*
 * Tells the dwarf.run callers their flow ids, once the creates are on disk
 * and on the synchronous standbys that synchronous_commit waits for, as a
 * commit of the worker's own would be (after the batch's commit, which
 * waited for both, this costs nothing more).
 */
void
IntakeAnswer(void)
{
	ListCell   *lc;

	if (Unanswered == NIL)
		return;
	XLogFlush(CreatedEnd);
	SyncRepWaitForLSN(CreatedEnd, true);
	foreach(lc, Unanswered)
	{
		Created    *c = lfirst(lc);

		RequestAnswer(c->procno, c->generation, c->flow_id, NULL, &c->outcome);
		FreeCreated(c);
	}
	list_free(Unanswered);
	Unanswered = NIL;
}

/*
 * before_shmem_exit, set up by the first take: a worker that exits answers
 * the creates it committed and gives back those its open transaction
 * holds, which roll back with it; their callers hand them to the next
 * worker.  It runs before the transaction is aborted, and before the
 * worker clears its slot, so that a caller that sees the worker gone sees
 * its request given back.
 */
static void
IntakeAtExit(int code, Datum arg)
{
	IntakeAnswer();
	RequestGiveBackAll();
}
