/*
 * worker.c
 *		A dwarf worker: owns the flows of one database whose id maps to it,
 *		keeps them in memory, and runs their ready steps in batches, one
 *		transaction (one WAL flush) per batch.
 *
 * Per step the worker calls the task through fmgr with a cached FmgrInfo,
 * as the flow's owner in a security-restricted operation (step.c), appends
 * the step to the step log (rows.c) and moves the flow on in memory.  The
 * flow row is written only when the flow closes.  A successor that is ready
 * at once runs in the same batch (chaining); others are queued once the
 * batch has committed.  dwarf.run's creates join the batch too (intake.c),
 * so that a short flow is created, run and closed in one commit.
 * A batch stops starting steps after dwarf.batch_time; slow tasks' steps go
 * to runners (lend.c), and a task that runs past dwarf.long_step here is
 * preempted and its step lent (step.c); a step that met a lock conflict
 * while sharing the transaction runs again alone.
 *
 * A batch first runs optimistically with no subtransactions.  If anything in
 * it fails, the transaction is rolled back, the flows it touched are
 * reloaded from the tables, and the next batch runs each step in its own
 * subtransaction (at most DWARF_MAX_ISOLATED_BATCH of them), so a failing
 * task fails only its own step.
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "lograte.h"
#include "shmem.h"
#include "flowrun.h"
#include "flows.h"
#include "limits.h"
#include "request.h"
#include "rows.h"
#include "offers.h"
#include "worker.h"

static bool IsolateNext = false;
static List *Alone = NIL;		/* ReadyEntries to run one per transaction */

/* ---------- batches ---------- */

/*
 * Flows that something outside changed (cancel, resume, a runner's step)
 * since *seen: the reload notes that came on our ring while a batch ran,
 * and the trees a cancel reached (a flow is in the tree its root_id names).
 * Their steps still in the batch do not run: the flow is reloaded after
 * the commit, and a cancelled flow starts no further step.
 */
static bool
ChangedSince(uint32 *seen, int64 flow_id, int64 root_id)
{
	static DwarfNote *changed = NULL;	/* the notes that count, kind and id */
	static int	nchanged = 0;
	int			i;

	if (*seen == 0xFFFFFFFF)	/* a new batch: forget the last one's */
	{
		SpinLockAcquire(&Worker.slot->mutex);
		*seen = Worker.slot->tail;
		SpinLockRelease(&Worker.slot->mutex);
		nchanged = 0;
		return false;
	}
	if (Worker.slot->tail != *seen)	/* unlocked peek; read again under the lock */
	{
		if (changed == NULL)
			changed = MemoryContextAlloc(TopMemoryContext, sizeof(DwarfNote) * DWARF_RING_SIZE);
		SpinLockAcquire(&Worker.slot->mutex);
		if (Worker.slot->tail - *seen > DWARF_RING_SIZE)
			*seen = Worker.slot->tail - DWARF_RING_SIZE;
		for (; *seen != Worker.slot->tail && nchanged < DWARF_RING_SIZE; (*seen)++)
		{
			DwarfNote  *note = &Worker.slot->ring[*seen % DWARF_RING_SIZE];

			if (note->kind == NOTE_RELOAD_FLOW || note->kind == NOTE_CANCEL_FLOW ||
				note->kind == NOTE_CANCEL_TREE)
				changed[nchanged++] = *note;
		}
		SpinLockRelease(&Worker.slot->mutex);
	}
	for (i = 0; i < nchanged; i++)
		if (changed[i].kind == NOTE_CANCEL_TREE ? changed[i].flow_id == root_id :
			changed[i].flow_id == flow_id)
			return true;
	return false;
}

/*
 * Chaining: a step whose flow can go on at once (its successors are due
 * now, and none of the database's ready work comes first by priority) has
 * them run in the same transaction, while the batch has room (count and
 * time), so that a short flow commits once or twice rather than once a
 * step.  The successors see their predecessor's writes (same transaction);
 * no one else sees any of them before the commit, and a rolled-back batch
 * takes them all back, so replay and exactly-once are unchanged.  A step
 * for a runner is not chained: it is lent once its input has committed.
 *
 * Successors go in at position at (-1: at the end), after the flow's
 * entries that are there already.  The batch puts them right after their
 * predecessor: flows go depth first, so that when the batch fills up its
 * flows have completed one after another rather than all having moved on
 * a step or two (and a dwarf.run caller whose flow completed in the commit
 * that created it is told its outcome at once, see intake.c); a flow's
 * branches still take turns.
 */
static List *
ChainSuccessors(List *batch, FlowRun *flow, int max, int32 limit, int at)
{
	TimestampTz now = 0;
	ListCell   *lc;
	MemoryContext old;

	if (flow->status != FLOW_RUNNING || flow->priority > limit)
		return batch;
	/* after the flow's steps that are next already: its branches take turns */
	while (at >= 0 && at < list_length(batch) &&
		   ((ReadyEntry *) list_nth(batch, at))->flow_id == flow->id)
		at++;
	/* only what the step placed: a flow of n branches is not scanned a step */
	foreach(lc, flow->placed)
	{
		Token	   *token = FlowFindToken(flow, lfirst_int(lc));
		ReadyEntry *entry;

		if (list_length(batch) >= max)
			break;
		if (token == NULL || token->queued || token->running || token->parked ||
			token->offered)
			continue;
		if (flow->graph->nodes[token->node].kind != TASK_FUNCTION && token->answer == NULL)
			continue;			/* offered after the commit that led to it */
		if (token->due > 0 && token->due > (now ? now : (now = GetCurrentTimestamp())))
			continue;
		if (RunnerWants(flow, token))
			continue;			/* queued after the commit, and lent */
		entry = NewReadyEntry(flow, token);
		token->running = true;
		old = MemoryContextSwitchTo(Worker.batch_context);	/* outlives the SPI call */
		batch = at < 0 ? lappend(batch, entry) : list_insert_nth(batch, at++, entry);
		MemoryContextSwitchTo(old);
	}
	return batch;
}

/* Starts a batch's transaction. */
static void
BeginBatch(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "dwarf: running a batch");
	PreparePlans();
}

/*
 * Runs steps in one transaction.  After the commit, the steps' successors
 * are queued, closed flows are dropped from memory, and whoever awaits them
 * is woken.
 *
 * Alone, the batch is one step that met a lock conflict while sharing a
 * transaction: whatever it meets now is its own.  A batch stops taking
 * steps once it has run for dwarf.batch_time; the rest go back to the
 * queue.  Steps whose flow has a step at a runner wait for it (lend.c);
 * a step's ready successors join the batch (ChainSuccessors).
 */
/* A batch's state while it runs (RunEntries). */
typedef struct Batch
{
	List	   *entries;		/* ReadyEntries; grows as steps chain */
	List	   *broken;			/* entries whose flow must be reloaded */
	int			ran;			/* steps run */
	int64	   *parked;			/* flows interrupted in this batch */
	int			nparked;
	int			max;			/* entries it may grow to */
	uint32		seen;			/* ChangedSince's mark */
	TimestampTz deadline;		/* no step starts after it */
	int32		chain_limit;	/* the worst priority whose successors chain */
	bool		isolated;		/* each step in a subtransaction */
	bool		alone;			/* one step, which met a lock conflict */
	const char *task;			/* of the step run last */
	bool		discard;			/* roll back, quietly (a runner's cancelled flow) */
	bool		tasks_ran;		/* a task function was called, or a flow created */
	bool		full;			/* takes no more steps from the queue (RefillBatch) */
	Oid			owner;			/* the role whose steps it runs (session.c) */
} Batch;

/*
 * A shared batch takes its steps from the queue a part at a time
 * (dwarf.batch_size / DWARF_BATCH_PARTS), and the next part once it has run
 * those and their chained successors, while it has room (count and time).
 * So a backlog of many flows runs each flow's chain in one transaction
 * (depth first, see ChainSuccessors) rather than every flow a step a
 * commit, and a flow's steps are one row of the step log (rows.c), not one
 * per commit; one-step flows still fill the batch.
 */
#define DWARF_BATCH_PARTS	8

static int
BatchPart(void)
{
	return Max(1, dwarf_batch_size / DWARF_BATCH_PARTS);
}

/*
 * Takes the next part of a shared batch's steps, of its owner's, when all
 * it has are run and it has room (see DWARF_BATCH_PARTS).  A step that
 * would be lent to a runner stays in the batch without running (later), to
 * be queued again after the commit, and the batch takes no more: lending
 * takes a transaction of its own (LendSlowSteps), done before the next
 * batch.  (Queued again now, its flow could offer a sibling external step
 * that this batch placed, before the commit that leads to it.)
 */
static void
RefillBatch(Batch *b)
{
	int			room = b->max - list_length(b->entries);
	MemoryContext old;
	List	   *more;
	ListCell   *lc;

	if (b->full || b->isolated || b->alone || b->discard || Worker.is_runner ||
		!OidIsValid(b->owner) || room <= 0 || GetCurrentTimestamp() > b->deadline)
		return;
	old = MemoryContextSwitchTo(Worker.batch_context);	/* outlives the SPI call */
	more = PopBatch(Min(room, BatchPart()), b->owner);
	b->full = more == NIL;
	foreach(lc, more)
	{
		ReadyEntry *entry = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);
		Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;

		if (token && RunnerWants(flow, token))
		{
			entry->later = true;
			b->full = true;
		}
		b->entries = lappend(b->entries, entry);
	}
	list_free(more);
	MemoryContextSwitchTo(old);
}

/*
 * Each step of a batch sees what the steps before it wrote, as a statement
 * after another would: a command counter increment and a snapshot of its
 * own, as the logical replication apply worker takes per change.  A
 * STABLE task (or a SQL function inlined into one) reads through the
 * active snapshot, so the batch's first snapshot would hide its
 * predecessor's rows from it.
 */
static void
NewStepSnapshot(void)
{
	CommandCounterIncrement();
	PopActiveSnapshot();
	PushActiveSnapshot(GetTransactionSnapshot());
}

/*
 * Takes the limit the step's task names (dwarf.set_limit), if any, before
 * the step runs or is lent: it is held until the batch ends (GiveLimits)
 * or, lent, until the runner does (lend.c).  When the limit has no room,
 * the step is due again when it says (or in DWARF_LIMIT_RECHECK_MS, for a
 * place in progress), and the caller leaves it for the timer heap: nothing
 * is written.
 */
static bool
TakeLimit(FlowRun *flow, Token *token)
{
	GraphNode  *node = &flow->graph->nodes[token->node];
	TimestampTz now;
	TimestampTz retry_at;
	StepLimits	limits;

	if (node->nlimits == 0 || node->kind != TASK_FUNCTION)
		return true;			/* an external step's claim takes them */
	now = GetCurrentTimestamp();
	LimitsOfStep(flow->owner, node->nlimits, node->limits, FlowTokenState(flow, token), &limits);
	if (LimitStepTake(&limits, flow->id, token->id, now, &retry_at))
		return true;
	token->due = retry_at > 0 ? retry_at : now + DWARF_LIMIT_RECHECK_MS * 1000;
	return false;
}

/* The batch ended: its steps give back the limits they took (TakeLimit). */
static void
GiveLimits(Batch *b)
{
	ListCell   *lc;

	foreach(lc, b->entries)
		LimitStepGive(((ReadyEntry *) lfirst(lc))->flow_id, ((ReadyEntry *) lfirst(lc))->token_id);
}

/* Runs one entry's step, and chains its successors into the batch. */
static void
RunEntry(Batch *b, ReadyEntry *entry, int index)
{
	FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);
	Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;
	StepResult	result;
	MemoryContext old;

	if (token == NULL || flow->status != FLOW_RUNNING)
		return;					/* its flow closed or broke earlier in the batch */
	if (entry->later || ChangedSince(&b->seen, flow->id, flow->root_id) || FlowIsLent(flow->id) ||
		(b->ran > 0 && GetCurrentTimestamp() > b->deadline))
	{
		token->running = false; /* queued again after the commit */
		return;
	}
	if (!Worker.is_runner && !TakeLimit(flow, token))
	{
		token->running = false; /* on the timer heap after the commit */
		return;
	}
	NewStepSnapshot();
	b->task = flow->graph->nodes[token->node].name;
	if (flow->graph->nodes[token->node].kind == TASK_FUNCTION)
		b->tasks_ran = true;
	result = RunStep(flow, token, b->isolated,
					 b->alone ? entry->contended < DWARF_CONTENTION_TRIES : b->ran > 0,
					 !Worker.is_runner && !entry->kept && LendingOn());
	token = FlowFindToken(flow, entry->token_id);
	if (result == STEP_CONTENDED)
	{
		ReadyEntry *copy;

		old = MemoryContextSwitchTo(Worker.context);
		copy = palloc(sizeof(ReadyEntry));
		memcpy(copy, entry, sizeof(ReadyEntry));
		copy->contended++;
		Alone = lappend(Alone, copy);
		MemoryContextSwitchTo(old);
		return;					/* still "running": no one else queues it */
	}
	if (result == STEP_DEFERRED || result == STEP_STOPPED || result == STEP_OFFERED)
	{
		/*
		 * Deferred: on the timer heap after the commit.  Offered: it waits
		 * for an answer, or its lease to run out (SweepOffers).  Stopped: queued
		 * again, and lent (a preempted task is slow now), or its flow
		 * reloaded, cancelled (a runner's lender reloads it).
		 */
		if (token)
			token->running = false;
		return;
	}
	b->ran++;
	if (Worker.is_runner && !FlowStillRuns(flow->id))
	{
		/*
		 * The runner's flow was cancelled (or closed and archived) while
		 * its step ran: nothing of the step is kept.  The check locks the
		 * flow's row, so a cancel after it waits for our commit.
		 */
		b->discard = true;
		return;
	}
	if (token)
		token->running = false;
	if (result == STEP_BROKEN)
	{
		old = MemoryContextSwitchTo(Worker.batch_context);
		b->broken = lappend(b->broken, entry);
		MemoryContextSwitchTo(old);
		DropFlow(flow);
		return;
	}
	if (flow->status != FLOW_RUNNING)
	{
		WriteClose(flow);
		IntakeNoteClose(flow);
	}
	else if (token && token->parked && token->child == 0)
	{
		ParkRow(flow, token);
		if (b->nparked < b->max)
			b->parked[b->nparked++] = flow->id;
	}
	else if (!b->alone)
		b->entries = ChainSuccessors(b->entries, flow, b->max, b->chain_limit, index + 1);
}

/*
 * After a rollback: the tables are the truth, so every flow the batch
 * touched is reloaded (and dwarf.run's creates it held are made again).
 */
static void
ReloadBatch(Batch *b)
{
	ListCell   *lc;

	pg_atomic_fetch_add_u64(&Worker.slot->aborted_batches, 1);
	IntakeRolledBack();			/* its creates are made again, apart */
	foreach(lc, b->entries)
	{
		ReadyEntry *entry = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);

		if (flow)
		{
			DropFlow(flow);
			NoteLoad(entry->flow_id, true);
		}
		pfree(entry);
	}
	list_free_deep(Alone);		/* they are reloaded too */
	Alone = NIL;
}

/*
 * A shared batch rolled back because a step failed: the next batch runs
 * each step in its own subtransaction, so that only that step fails.
 */
static void
BatchRolledBack(Batch *b, ErrorData *edata)
{
	static LogRate rolled_back;
	int64		n;
	int			seconds;

	if ((n = LogRateDue(&rolled_back, GetCurrentTimestamp(), &seconds)) > 0)
		ereport(LOG,
				(errmsg("dwarf: batch of %d steps rolled back, running it step by step: %s%s",
						list_length(b->entries), edata->message, LogRateCount(n, seconds))));
	ReloadBatch(b);
	IsolateNext = true;
}

/* ---------- errors outside the tasks ---------- */

/*
 * An error outside any task (recording a step, closing a flow, the commit,
 * loading flows) is not a task's, and must not become a restart loop: the
 * worker says what it is, reloads what it holds from the tables, and backs
 * off, from DWARF_BACKOFF_FIRST_MS doubling up to DWARF_BACKOFF_MAX_MS for
 * as long as such errors keep coming without a commit between them.  A
 * batch of several steps that failed so runs again one step a batch, to
 * find whose step it is; a step that fails alone outside its task
 * DWARF_OUTSIDE_TRIES times while other batches commit (so the trouble is
 * its own, not the worker's) fails its flow with an error that says so.
 */
#define DWARF_BACKOFF_FIRST_MS	100
#define DWARF_BACKOFF_MAX_MS	30000
#define DWARF_OUTSIDE_TRIES		3

static int	OutsideErrors = 0;	/* in a row, without a commit between */
static TimestampTz BackoffUntil = 0;
static int	SingleNext = 0;		/* batches still to run one step each */
static uint64 Commits = 0;		/* batches committed */

/* A step whose batch of one failed outside its task. */
typedef struct OutsideSuspect
{
	int64		flow_id;		/* key: flow and token */
	int			token_id;
	int			times;
	uint64		commits;		/* Commits at its first failure */
} OutsideSuspect;

static HTAB *OutsideSuspects = NULL;

/* One more error outside the tasks: the next batch waits a while. */
static void
BackOff(ErrorData *edata)
{
	int64		ms;

	OutsideErrors++;
	ms = Min((int64) DWARF_BACKOFF_FIRST_MS << Min(OutsideErrors - 1, 20), DWARF_BACKOFF_MAX_MS);
	BackoffUntil = GetCurrentTimestamp() + ms * 1000;
	ereport(LOG,
			(errmsg("dwarf worker %d: error outside any task (%d in a row), trying again in " INT64_FORMAT " ms: %s",
					Worker.slot->index, OutsideErrors, ms, edata->message),
			 errdetail("SQLSTATE %s.%s%s", unpack_sql_state(edata->sqlerrcode),
					   edata->detail ? " " : "", edata->detail ? edata->detail : "")));
}

/*
 * The step of a batch of one failed outside its task.  Its flow fails once
 * that has happened DWARF_OUTSIDE_TRIES times and other batches committed
 * meanwhile; before, it is only counted.
 */
static void
BlameOutside(ReadyEntry *entry, const char *task, ErrorData *edata)
{
	OutsideSuspect key = {entry->flow_id, entry->token_id, 0, 0};
	OutsideSuspect *suspect;
	bool		found;
	char	   *error;

	if (task == NULL)
		return;					/* the error came before the step ran */
	if (OutsideSuspects == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = offsetof(OutsideSuspect, times);
		ctl.entrysize = sizeof(OutsideSuspect);
		ctl.hcxt = TopMemoryContext;
		OutsideSuspects = hash_create("dwarf outside suspects", 16, &ctl,
									  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	suspect = hash_search(OutsideSuspects, &key, HASH_ENTER, &found);
	if (!found)
	{
		suspect->times = 0;
		suspect->commits = Commits;
	}
	if (++suspect->times < DWARF_OUTSIDE_TRIES || Commits == suspect->commits)
		return;
	hash_search(OutsideSuspects, &key, HASH_REMOVE, NULL);

	error = psprintf("dwarf could not record the step of task \"%s\" (%d tries, while other steps could be recorded): %s",
					 task, DWARF_OUTSIDE_TRIES, edata->message);
	ereport(LOG,
			(errmsg("dwarf: failing flow " INT64_FORMAT ": %s", entry->flow_id, error)));
	BeginBatch();
	FailFlowRow(entry->flow_id, error);
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
}

/*
 * An isolated batch failed outside its tasks, and is rolled back: its
 * flows are reloaded, and the worker backs off.
 */
static void
BatchFailedOutside(Batch *b, ErrorData *edata)
{
	if (list_length(b->entries) == 1)
		BlameOutside(linitial(b->entries), b->task, edata);
	else
		SingleNext = Max(SingleNext, list_length(b->entries));
	BackOff(edata);
	ReloadBatch(b);
}

/*
 * Has this flow nothing to run for a while?  Then *wake is when it has
 * (0: never by itself; a note will say).  Each live token must be parked
 * (an interrupt, a child flow) or due past DWARF_EVICT_AFTER_MS, and none
 * on the ready queue or in a batch.
 */
static bool
FlowSleeps(FlowRun *flow, TimestampTz *wake)
{
	TimestampTz later = GetCurrentTimestamp() + (TimestampTz) DWARF_EVICT_AFTER_MS * 1000;
	dlist_iter	iter;

	*wake = 0;
	if (Worker.is_runner || flow->status != FLOW_RUNNING || flow->ntokens == 0)
		return false;
	foreach_token(iter, flow)
	{
		Token	   *token = iter_token(iter);

		if (token->running || token->offered || (token->queued && token->timer == NULL))
			return false;
		if (token->parked)
			continue;
		if (token->due <= later)
			return false;
		if (*wake == 0 || token->due < *wake)
			*wake = token->due;
	}
	return true;
}

/*
 * Queues a running flow's runnable tokens (EnqueueRunnable) or, when it
 * has nothing to run for a while (FlowSleeps), evicts it from memory: a
 * sleeper is remembered by its id and the time to load it again
 * (sleepers.c), a flow parked on an interrupt or a child flow not at all
 * (dwarf.resume, and a child's close, send a note that loads it).  A flow
 * with a step at a runner waits for it (lend.c queues it again).
 */
void
QueueOrEvict(FlowRun *flow)
{
	TimestampTz wake;

	if (FlowIsLent(flow->id))
		return;
	if (!FlowSleeps(flow, &wake))
	{
		EnqueueRunnable(flow);
		return;
	}
	UnqueueTimers(flow);
	if (wake != 0)
		SleeperAdd(flow->id, wake - (TimestampTz) DWARF_WAKE_AHEAD_MS * 1000);
	DropFlow(flow);
}

/*
 * Loads up to max of the flows to load (LoadFlows), and queues or evicts
 * each.
 */
static void
LoadAndQueue(int max)
{
	List	   *items = LoadFlows(max);
	ListCell   *lc;

	foreach(lc, items)
	{
		LoadItem   *item = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &item->flow_id, HASH_FIND, NULL);

		if (flow)
			QueueOrEvict(flow);
	}
	list_free_deep(items);
}

/*
 * After the commit: the steps' successors are queued, closed flows are
 * dropped from memory, and whoever awaits them is woken.
 */
static void
BatchCommitted(Batch *b)
{
	int64	   *closed = palloc(sizeof(int64) * list_length(b->entries));
	int			nclosed = 0;
	ListCell   *lc;

	foreach(lc, b->entries)
	{
		ReadyEntry *entry = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);

		if (flow == NULL)
			continue;			/* closed above, or broken */
		if (flow->status != FLOW_RUNNING)
		{
			closed[nclosed++] = flow->id;
			pg_atomic_fetch_add_u64(&Worker.slot->flows_closed, 1);
			DropFlow(flow);
		}
		else if (flow->enqueued != Commits + 1)
		{
			flow->enqueued = Commits + 1;	/* once a flow a batch: it scans its tokens */
			QueueOrEvict(flow); /* evicted when it sleeps or waits */
		}
	}
	foreach(lc, b->broken)
		NoteLoad(((ReadyEntry *) lfirst(lc))->flow_id, true);
	IntakeCommitted();
	pg_atomic_fetch_add_u64(&Worker.slot->steps, b->ran);
	DwarfWakeWaiters(closed, nclosed);
	DwarfWakeWaiters(b->parked, b->nparked);
	pgstat_report_stat(false);	/* WAL and commit counters, at most once a second */
	pg_atomic_fetch_add_u64(&Worker.slot->batches, 1);
	Commits++;
	OutsideErrors = 0;
	list_free_deep(b->entries);
}

/*
 * A batch that called no task and created no flow (it recorded answers of
 * external steps, and offered what follows) commits without waiting for
 * its WAL to reach the disk: the outside worker's commit of each answer
 * was the durable one.  What the batch wrote follows from those answers
 * alone, and they stay in dwarf.answer until its delete of them is
 * durable: a crash that loses the batch records them again, the same way.
 * A later commit that depends on it (the answer to a step it offered)
 * flushes it first, the WAL being one sequence.  So a step done outside
 * costs one durable commit, the outside worker's, batched or not.
 */
static void
CommitQuietly(void)
{
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_LOCAL, true, 0, false);
}

/*
 * The role whose steps a batch runs: its entries' owner (PopBatch takes one
 * role's), or with none, the owner of the first dwarf.run create it takes
 * (RunBatch leaves it only that role's).  InvalidOid: neither (the
 * requests' callers gave up).
 */
static Oid
BatchOwner(List *entries, List *requests)
{
	ListCell   *lc;

	foreach(lc, entries)
	{
		FlowRun    *flow = hash_search(Worker.flows, &((ReadyEntry *) lfirst(lc))->flow_id,
									   HASH_FIND, NULL);

		if (flow)
			return flow->owner;
	}
	foreach(lc, requests)
	{
		Oid			owner = RequestOwner(lfirst_int(lc));

		if (OidIsValid(owner))
			return owner;
	}
	return InvalidOid;
}

/*
 * Exits to be replaced at once, when a task of another role left state in
 * this process that a session reset cannot reach (session.c), and the
 * next batch is not that role's.  Nothing is lost: everything the worker
 * holds is in the tables, its taken dwarf.run creates are given back at
 * exit (intake.c), and its replacement loads its flows and adopts its
 * runners.
 */
static void
ReplaceIfServedOthers(Oid owner)
{
	if (Worker.is_runner || !OidIsValid(owner) || !SessionMustReplace(owner))
		return;
	ereport(LOG,
			(errmsg("dwarf worker %d exits to be replaced before it runs steps of role %s",
					Worker.slot->index, SessionRoleName(owner))));
	Worker.slot->replaced = true;
	proc_exit(0);
}

void
RunEntries(List *entries, bool isolated, bool alone, List *requests)
{
	Batch	   *b = palloc0(sizeof(Batch));	/* in memory: the handler sees it as it is */
	ListCell   *lc;

	b->entries = entries;
	b->isolated = isolated;
	b->alone = alone;
	b->max = isolated ? Min(dwarf_batch_size, DWARF_MAX_ISOLATED_BATCH) : dwarf_batch_size;
	b->parked = palloc(sizeof(int64) * Max(list_length(entries), b->max));
	b->seen = 0xFFFFFFFF;
	b->owner = BatchOwner(entries, requests);
	if (OidIsValid(b->owner))
		SessionServe(b->owner);
	BeginBatch();
	SessionReadSettings();
	(void) ChangedSince(&b->seen, 0, 0);
	StepTimerArm(b->seen);
	b->deadline = GetCurrentTimestamp() + (TimestampTz) dwarf_batch_time * 1000;
	if (!Worker.is_runner)
		SetRunningPriority(entries);

	/*
	 * The worst priority whose successors chain, read once per batch: no
	 * better work ready or running elsewhere, and not above 0 (a flow of
	 * lower priority than the default yields after every step, so that
	 * better work, even work another worker has not loaded yet, comes
	 * first).
	 */
	b->chain_limit = Min(0, Min(DatabaseBestPriority(), OthersRunningPriority()));

	/*
	 * dwarf.run's creates join the batch: the new flows' first steps chain
	 * into it, so that a short flow is created, run and closed in one
	 * commit (intake.c).
	 */
	if (requests != NIL)
	{
		List	   *flows;

		if (!IntakeInBatch(requests, &flows))
		{
			BeginBatch();		/* rolled back: they were created apart */
			SessionReadSettings();
		}
		foreach(lc, flows)
			if (((FlowRun *) lfirst(lc))->owner == b->owner)	/* RunBatch's choice */
				b->entries = ChainSuccessors(b->entries, lfirst(lc), b->max, b->chain_limit, -1);
		list_free(flows);
	}

	PG_TRY();
	{
		foreach(lc, b->entries)
		{
			RunEntry(b, lfirst(lc), foreach_current_index(lc));
			if (foreach_current_index(lc) == list_length(b->entries) - 1)
				RefillBatch(b);
		}
		RowsEnd();
		StepTimerDisarm();
		if (b->discard)
		{
			PopActiveSnapshot();
			SPI_finish();
			AbortCurrentTransaction();
			CrashesNoteStep(0, 0);
			GiveLimits(b);
			return;
		}
		PopActiveSnapshot();
		SPI_finish();
		if (!b->tasks_ran && requests == NIL && !Worker.is_runner)
			CommitQuietly();
		CommitTransactionCommand();
		CrashesNoteStep(0, 0);
		GiveLimits(b);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		CrashesNoteStep(0, 0);
		GiveLimits(b);
		StepTimerDisarm();
		if (!Worker.is_runner)
			ClearRunningPriority();
		edata = AbortAfterError(Worker.batch_context);
		DwarfCurrentStep = NULL;
		pgstat_report_activity(STATE_IDLE, NULL);
		if (isolated && Worker.is_runner)	/* its worker blames the step */
			ereport(ERROR,
					(errcode(edata->sqlerrcode),
					 errmsg("dwarf: a step failed outside its task: %s", edata->message)));
		if (StepWasStopped())
			ReloadBatch(b);		/* a task was stopped (step.c), nothing failed: its
								 * steps run again as they were, the stopped one
								 * lent or its flow found cancelled */
		else if (isolated)
			BatchFailedOutside(b, edata);
		else
			BatchRolledBack(b, edata);
		return;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(Worker.batch_context);	/* the commit left us in TopMemoryContext */
	pgstat_report_activity(STATE_IDLE, NULL);
	if (!Worker.is_runner)
		ClearRunningPriority();
	BatchCommitted(b);
}

/*
 * Takes out of a batch, before it starts, the steps to lend to runners: a
 * slow task's step, the first of its flow in the batch (see lend.c).  The
 * flow's other steps in the batch then do not run (RunEntry): they wait
 * for the runner.  (A slow step left in the batch with them would be
 * preempted, given back, and left there again, for ever.)  A slow step no
 * runner can take is kept: the worker runs it, to its end.  A step whose
 * limit has no room waits on the timer heap (TakeLimit).
 */
static List *
LendSlowSteps(List *batch)
{
	MemoryContext cxt = CurrentMemoryContext;
	MemoryContext old;
	bool		xact = false;
	List	   *waiting = NIL;
	ListCell   *lc;

	foreach(lc, batch)
	{
		ReadyEntry *entry = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);
		Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;

		if (token == NULL || FlowIsLent(flow->id) || !RunnerWants(flow, token))
			continue;
		if (!xact && flow->graph->nodes[token->node].nlimits > 0)
		{
			StartTransactionCommand();	/* TakeLimit reads dwarf.limit */
			xact = true;
		}
		if (!TakeLimit(flow, token))
		{
			batch = foreach_delete_current(batch, lc);
			pfree(entry);
			token->running = false;
			old = MemoryContextSwitchTo(cxt);	/* outlives the transaction */
			waiting = lappend(waiting, flow);	/* on the timer heap, below */
			MemoryContextSwitchTo(old);
			continue;
		}
		if (RunnerLend(flow, token))
		{
			batch = foreach_delete_current(batch, lc);
			pfree(entry);		/* the token stays "running" until the runner is done */
		}
		else
			entry->kept = true;
	}
	if (xact)
	{
		CommitTransactionCommand();
		MemoryContextSwitchTo(cxt);
	}
	/* queued outside the transaction: no step is offered inside one */
	foreach(lc, waiting)
		EnqueueRunnable(lfirst(lc));
	list_free(waiting);
	return batch;
}

/*
 * Runs the next step waiting to run alone, if any.  Returns whether one ran.
 */
bool
RunAloneStep(void)
{
	while (Alone != NIL)
	{
		ReadyEntry *entry = linitial(Alone);
		FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);
		Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;

		Alone = list_delete_first(Alone);
		/* A reload since gave the flow new tokens, queued as usual. */
		if (token && token->running && !token->queued && flow->status == FLOW_RUNNING)
		{
			ReplaceIfServedOthers(flow->owner);
			RunEntries(list_make1(entry), true, true, NIL);
			return true;
		}
		pfree(entry);
	}
	return false;
}

static bool BatchTakesRequests(void);

/*
 * The dwarf.run creates of the batch's role, which join its batch; the
 * other roles' are created apart, now (their flows' steps then queue as
 * any other's).
 */
static List *
OwnersRequests(Oid owner, List *requests)
{
	List	   *others = NIL;
	ListCell   *lc;

	foreach(lc, requests)
	{
		if (RequestOwner(lfirst_int(lc)) == owner)
			continue;
		others = lappend_int(others, lfirst_int(lc));
		requests = foreach_delete_current(requests, lc);
	}
	if (others != NIL)
		IntakeApart(others);
	return requests;
}

/*
 * Runs the next batch: a step that must run alone, if one is waiting, else
 * up to dwarf.batch_size ready steps (fewer when isolated: each then has a
 * subtransaction).
 */
static void
RunBatch(List *requests)
{
	bool		isolated = IsolateNext;
	List	   *batch;

	Assert(requests == NIL || BatchTakesRequests());
	if (RunAloneStep())
		return;
	if (SingleNext > 0)			/* one step, unchained: whose is the error? */
	{
		SingleNext--;
		batch = PopBatch(1, InvalidOid);
		ReplaceIfServedOthers(BatchOwner(batch, NIL));
		batch = LendSlowSteps(batch);
		if (batch != NIL)
			RunEntries(batch, true, true, NIL);
		return;
	}
	batch = PopBatch(isolated ? Min(dwarf_batch_size, DWARF_MAX_ISOLATED_BATCH) : BatchPart(),
					 InvalidOid);
	requests = OwnersRequests(BatchOwner(batch, requests), requests);
	ReplaceIfServedOthers(BatchOwner(batch, requests));
	batch = LendSlowSteps(batch);
	if (batch == NIL && requests == NIL)
		return;					/* an isolated batch is still owed: keep the flag */
	IsolateNext = false;
	RunEntries(batch, isolated, false, requests);
}

/*
 * Does the next batch take dwarf.run's creates?  Not when it runs a step
 * alone or isolated: a create's error would fail that batch.
 */
static bool
BatchTakesRequests(void)
{
	return !IsolateNext && Alone == NIL && SingleNext == 0;
}

/* ---------- notes and the main loop ---------- */

/*
 * Drops from memory the flows whose ids the last statement returned (they
 * closed behind this worker's back), and adds them to *woken (in cxt), for
 * their waiters to be woken.
 */
static void
DropReturnedFlows(MemoryContext cxt, int64 **woken, int *nwoken)
{
	uint64		i;

	*woken = *woken ? repalloc(*woken, sizeof(int64) * (*nwoken + SPI_processed + 1)) :
		MemoryContextAlloc(cxt, sizeof(int64) * (SPI_processed + 1));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													 SPI_tuptable->tupdesc, 1, &isnull));
		FlowRun    *flow = hash_search(Worker.flows, &id, HASH_FIND, NULL);

		if (flow)
		{
			if (FlowHoldsOffers(flow))
				OfferWithdrawFlow(MyDatabaseId, flow->id);
			DropFlow(flow);
		}
		(*woken)[(*nwoken)++] = id;
	}
}

/*
 * Acts on the trees named by NOTE_CANCEL_TREE and NOTE_TREE_CAP notes, in a
 * transaction of its own: a tree that met dwarf.max_tree_flows fails (its
 * top) and is cancelled (the rest), and the flows of a cancelled tree that
 * this worker holds are dropped from memory, their waiters woken.  One
 * statement per tree, however many flows it holds, so that a cancel of
 * 100,000 flows costs each worker one index scan, not 100,000 notes.  With
 * prune (notes were lost to a full ring, a cancel's among them perhaps),
 * every flow held that is no longer open in the table is dropped too.
 */
static void
HandleTreeNotes(List *cancelled, List *capped, bool prune)
{
	MemoryContext outer = CurrentMemoryContext;
	int64	   *woken = NULL;
	int			nwoken = 0;
	ListCell   *lc;

	if (cancelled == NIL && capped == NIL && !prune)
		return;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	Connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "dwarf: cancelling trees of flows");
	foreach(lc, capped)
		FailTreeOnCap(*(int64 *) lfirst(lc));
	foreach(lc, cancelled)
	{
		Oid			types[3] = {INT8OID, INT4OID, INT4OID};
		Datum		args[3] = {Int64GetDatum(*(int64 *) lfirst(lc)), Int32GetDatum(dwarf_workers),
		Int32GetDatum(Worker.slot->index)};

		Exec("SELECT id FROM dwarf.flow WHERE (id = $1 OR root_id = $1)"
			 " AND status NOT IN ('running', 'interrupted')"
			 " AND ((id & 281474976710655) % $2) = $3",
			 3, types, args, NULL, SPI_OK_SELECT);
		DropReturnedFlows(outer, &woken, &nwoken);
	}
	if (prune && hash_get_num_entries(Worker.flows) > 0)
	{
		Oid			types[1] = {INT8ARRAYOID};
		Datum	   *ids = palloc(sizeof(Datum) * hash_get_num_entries(Worker.flows));
		int			n = 0;
		Datum		arg;
		HASH_SEQ_STATUS seq;
		FlowRun    *flow;

		hash_seq_init(&seq, Worker.flows);
		while ((flow = hash_seq_search(&seq)) != NULL)
			ids[n++] = Int64GetDatum(flow->id);
		arg = PointerGetDatum(construct_array(ids, n, INT8OID, 8, true, TYPALIGN_DOUBLE));
		Exec("SELECT u.id FROM unnest($1) u(id) WHERE NOT EXISTS (SELECT 1 FROM dwarf.flow f"
			 " WHERE f.id = u.id AND f.status IN ('running', 'interrupted'))",
			 1, types, &arg, NULL, SPI_OK_SELECT);
		DropReturnedFlows(outer, &woken, &nwoken);
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(outer);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (nwoken > 0)
		DwarfWakeWaiters(woken, nwoken);
}

/* Adds a flow id to a list of them, once. */
static List *
AddTree(List *trees, int64 root)
{
	ListCell   *lc;
	int64	   *item;

	foreach(lc, trees)
		if (*(int64 *) lfirst(lc) == root)
			return trees;
	item = palloc(sizeof(int64));
	*item = root;
	return lappend(trees, item);
}

/*
 * When the last full scan of the tables ended (LoadFlows): 0 for none yet.
 * A new flow's note that comes around a scan may name a flow the scan
 * already loaded, ran and evicted since (a sleeper): loaded again as new,
 * without its steps, it would run its first step twice.
 */
static TimestampTz LastScan = 0;

/*
 * May a new flow's note be for a flow a scan took in already?  The notes
 * of the flows a scan saw are on the ring when it ends, and drained in the
 * next round of the loop; ten seconds leave a loaded machine a wide margin.
 */
static bool
NoteMayBeStale(void)
{
	return Worker.full_scan ||
		(LastScan != 0 && GetCurrentTimestamp() - LastScan < 10 * USECS_PER_SEC);
}

/*
 * Takes the notes queued for this worker: flows to load or reload, and
 * dwarf.run callers waiting for their create.  Returns whether any came.
 */
static bool
DrainNotes(List **requests)
{
	DwarfNote	notes[256];
	int			n,
				i;
	bool		any = false;
	List	   *cancelled = NIL;
	List	   *capped = NIL;
	bool		prune = false;

	do
	{
		SpinLockAcquire(&Worker.slot->mutex);
		n = 0;
		while (Worker.slot->head != Worker.slot->tail && n < lengthof(notes))
			notes[n++] = Worker.slot->ring[Worker.slot->head++ % DWARF_RING_SIZE];
		if (Worker.slot->overflow)
		{
			Worker.slot->overflow = false;
			Worker.full_scan = true;
			prune = true;
		}
		SpinLockRelease(&Worker.slot->mutex);

		for (i = 0; i < n; i++)
		{
			FlowRun    *flow;

			any = true;
			switch ((DwarfNoteKind) notes[i].kind)
			{
				case NOTE_NEW_FLOW:
					if (hash_search(Worker.flows, &notes[i].flow_id, HASH_FIND, NULL) == NULL)
						NoteLoad(notes[i].flow_id, NoteMayBeStale());
					break;
				case NOTE_RELOAD_FLOW:
				case NOTE_CANCEL_FLOW:
					flow = hash_search(Worker.flows, &notes[i].flow_id, HASH_FIND, NULL);
					if (flow && notes[i].kind == NOTE_CANCEL_FLOW && FlowHoldsOffers(flow))
						OfferWithdrawFlow(MyDatabaseId, flow->id);
					if (flow)
						DropFlow(flow);
					NoteLoad(notes[i].flow_id, true);
					break;
				case NOTE_RUN_REQUEST:
					*requests = lappend_int(*requests, (int) notes[i].flow_id);
					break;
				case NOTE_CANCEL_TREE:
					cancelled = AddTree(cancelled, notes[i].flow_id);
					break;
				case NOTE_TREE_CAP:
					capped = AddTree(capped, notes[i].flow_id);
					break;
			}
		}
	} while (n == lengthof(notes));
	HandleTreeNotes(cancelled, capped, prune);
	return any || Worker.full_scan;
}

/* Is this flow in memory?  (OffersSweep asks, of each offer.) */
static bool
FlowHeld(int64 flow_id)
{
	return hash_search(Worker.flows, &flow_id, HASH_FIND, NULL) != NULL;
}

/*
 * Takes the answers outside workers committed for this worker's external
 * steps (dwarf.complete, dwarf.fail; offers.c keeps which): a flow in
 * memory gets each answer on its waiting branch, and is queued for the
 * next batch to record it; a flow out of memory is loaded, and takes its
 * answers as it loads.  One statement for all of them: no flow is loaded
 * again for an answer.
 */
static void
TakeAnsweredSteps(void)
{
	List	   *answered;
	ListCell   *lc;
	int64	   *ids;
	int			n = 0;

	if (!OffersAnsweredPending())
		return;
	answered = OffersTakeAnswered(Worker.slot->index);
	if (answered == NIL)
		return;
	ids = palloc(sizeof(int64) * list_length(answered));
	foreach(lc, answered)
	{
		AnsweredStep *step = lfirst(lc);

		if (hash_search(Worker.flows, &step->key.flow_id, HASH_FIND, NULL) != NULL)
			ids[n++] = step->key.flow_id;
		else
			NoteLoad(step->key.flow_id, true);
	}
	if (n > 0)
	{
		List	   *flows = LoadAnswers(ids, n);

		foreach(lc, flows)
			QueueOrEvict(lfirst(lc));
		list_free(flows);
	}
	list_free_deep(answered);
	pfree(ids);
}

/* When the offers are swept next (SweepOffers). */
static TimestampTz NextSweep = 0;

/*
 * Looks up the flows whose offered steps the sweep found long out of
 * memory (OffersSweep's absent), in one statement: the offers of one that
 * closed or was cancelled (or left the live table) are withdrawn; one
 * still open is loaded, so that it takes its answers.  A lease is never
 * given up only because its flow waits to be loaded (after a restart,
 * behind many others): its outside worker's complete must go through.
 */
static void
CheckAbsentFlows(List *absent)
{
	MemoryContext outer = CurrentMemoryContext;
	Oid			types[1] = {INT8ARRAYOID};
	Datum	   *ids = palloc(sizeof(Datum) * list_length(absent));
	Datum		arg;
	int			n = 0;
	uint64		i;
	ListCell   *lc;

	foreach(lc, absent)
		ids[n++] = Int64GetDatum(*(int64 *) lfirst(lc));
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	Connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "dwarf: looking up flows of offered steps");
	arg = PointerGetDatum(construct_array(ids, n, INT8OID, 8, true, TYPALIGN_DOUBLE));
	Exec("SELECT DISTINCT u.id, EXISTS (SELECT 1 FROM dwarf.flow f WHERE f.id = u.id"
		 " AND f.status IN ('running', 'interrupted')) FROM unnest($1) u(id)",
		 1, types, &arg, NULL, SPI_OK_SELECT);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													 SPI_tuptable->tupdesc, 1, &isnull));

		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull)))
			NoteLoad(id, true);
		else
			OfferWithdrawFlow(MyDatabaseId, id);	/* at the commit below */
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	MemoryContextSwitchTo(outer);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Sweeps this worker's offers of external steps (offers.c) once a second,
 * and when a lease is due to run out: a step whose lease ran out gets the
 * failed attempt as its answer, recorded by the next batch (step.c), after
 * which the task's retry policy offers it again or fails it.  Returns the
 * milliseconds until the next sweep.
 */
static long
SweepOffers(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next_due;
	List	   *expired;
	List	   *absent;
	ListCell   *lc;

	if (now < NextSweep)
		return TimestampDifferenceMilliseconds(now, NextSweep) + 1;
	expired = OffersSweep(Worker.slot->index, now, FlowHeld, &next_due, &absent);
	if (absent != NIL)
		CheckAbsentFlows(absent);
	list_free_deep(absent);
	foreach(lc, expired)
	{
		ExpiredLease *e = lfirst(lc);
		FlowRun    *flow = hash_search(Worker.flows, &e->key.flow_id, HASH_FIND, NULL);
		Token	   *token = flow ? FlowFindToken(flow, e->key.token_id) : NULL;
		ExternalAnswer *answer;

		if (token == NULL || !token->offered || token->visits != e->visits ||
			token->attempt != e->attempt)
			continue;			/* offered again when its flow loads */
		answer = MemoryContextAllocZero(flow->cxt, sizeof(ExternalAnswer));
		answer->kind = ANSWER_EXPIRED;
		answer->started = e->leased_at;
		answer->finished = e->lease_until;
		token->answer = answer;
		token->offered = false;
		flow->offered--;
		QueueOrEvict(flow);
	}
	list_free_deep(expired);
	NextSweep = now + USECS_PER_SEC;
	if (next_due != 0 && next_due < NextSweep)
		NextSweep = next_due;
	return TimestampDifferenceMilliseconds(now, NextSweep) + 1;
}

/*
 * Exits quietly, for the launcher to see, when dwarf is not installed here
 * or is not the installation this worker started with: after DROP and
 * CREATE EXTENSION, everything it keeps in memory belongs to tables that
 * are gone, and a new worker starts afresh.
 */
static void
ExitIfNotInstalled(void)
{
	static Oid	installed_as = InvalidOid;
	Oid			extension;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	extension = get_extension_oid("dwarf", true);

	/*
	 * A DROP EXTENSION in progress holds this lock (dwarf.c): wait for it
	 * here, holding no other, then look again.
	 */
	if (OidIsValid(extension))
	{
		LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
		extension = get_extension_oid("dwarf", true);
	}
	CommitTransactionCommand();
	if (!OidIsValid(installed_as))
		installed_as = extension;
	if (!OidIsValid(extension) || extension != installed_as)
	{
		Worker.slot->no_extension = true;
		proc_exit(0);
	}
}

/*
 * Recovers from an error that reached the worker's loop (outside any
 * batch's own handling: loading flows, a create made apart, failing a
 * flow): the transaction is rolled back, every flow in memory is dropped
 * and loaded again from the tables, and the worker backs off.
 */
static void
RecoverFromError(void)
{
	ErrorData  *edata;
	HASH_SEQ_STATUS seq;
	FlowRun    *flow;

	HOLD_INTERRUPTS();
	error_context_stack = NULL;
	disable_all_timeouts(false);
	StepTimerDisarm();
	QueryCancelPending = false;
	DwarfCurrentStep = NULL;
	CrashesNoteStep(0, 0);
	EmitErrorReport();
	edata = AbortAfterError(Worker.batch_context);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (!Worker.is_runner)
		ClearRunningPriority();
	IntakeRolledBack();
	LimitStepGiveUnless(FlowIsLent);	/* a batch's, taken before it ran */
	list_free_deep(Alone);
	Alone = NIL;
	hash_seq_init(&seq, Worker.flows);
	while ((flow = hash_seq_search(&seq)) != NULL)
		DropFlow(flow);
	list_free_deep(Worker.to_load);
	Worker.to_load = NIL;
	SleepersForget();			/* the scan finds them again */
	Worker.full_scan = true;
	BackOff(edata);
	RESUME_INTERRUPTS();
}

static void
WorkerShutdown(int code, Datum arg)
{
	IntakeAnswer();				/* their flows exist: say so, even as we go */
	SpinLockAcquire(&Worker.slot->mutex);
	Worker.slot->latch = NULL;
	Worker.slot->pid = 0;
	SpinLockRelease(&Worker.slot->mutex);
}

/*
 * Sets up what a worker (or a runner) keeps for its life: its memory, the
 * flows and graphs it holds, its queue, and its pinned search_path.
 */
void
WorkerInit(void)
{
	HASHCTL		ctl;

	PinSearchPath();
	StepTimerInit();
	Worker.context = AllocSetContextCreate(TopMemoryContext, "dwarf worker",
										  ALLOCSET_DEFAULT_SIZES);
	Worker.batch_context = AllocSetContextCreate(TopMemoryContext, "dwarf batch",
										 ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(FlowRun);
	ctl.hcxt = Worker.context;
	Worker.flows = hash_create("dwarf flows", 1024, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	QueueInit();
	StoreInit();
	SessionInit();
}

/*
 * Entry point of a dwarf worker.  bgw_main_arg is its slot, which the
 * launcher filled with the database and the worker number.
 */
void
DwarfWorkerMain(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;

	Worker.slot = &Dwarf->workers[DatumGetInt32(arg)];

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(Worker.slot->dboid, InvalidOid, 0);
	pgstat_report_appname(psprintf("dwarf worker %d", Worker.slot->index));

	ExitIfNotInstalled();
	WorkerInit();
	CrashesInitWorker();
	RunnerAdopt();

	before_shmem_exit(WorkerShutdown, (Datum) 0);
	SpinLockAcquire(&Worker.slot->mutex);
	Worker.slot->pid = MyProcPid;
	Worker.slot->latch = MyLatch;
	SpinLockRelease(&Worker.slot->mutex);

	ereport(LOG, (errmsg("dwarf worker %d started", Worker.slot->index)));

	/* An error that escapes a batch comes back here (RecoverFromError). */
	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		RecoverFromError();
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		List	   *requests = NIL;
		long		next_timer;
		long		runner_timer;
		long		sleeper_timer;
		long		offers_timer;
		TimestampTz now;
		int64		sleeper;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			PinSearchPath();
		}
		if (BackoffUntil > (now = GetCurrentTimestamp()))
		{
			ExitIfNotInstalled();	/* the error may be DROP EXTENSION's doing */
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 TimestampDifferenceMilliseconds(now, BackoffUntil) + 1,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			continue;
		}

		MemoryContextSwitchTo(Worker.batch_context);
		runner_timer = RunnerPoll();
		(void) DrainNotes(&requests);
		TakeAnsweredSteps();
		offers_timer = SweepOffers();
		requests = IntakeRedo(requests);
		if (requests != NIL && !BatchTakesRequests())
		{
			IntakeApart(requests);
			requests = NIL;
		}
		while (list_length(Worker.to_load) < DWARF_LOAD_CHUNK && TakeDueSleeper(&sleeper))
			NoteLoad(sleeper, true);
		/*
		 * A chunk of flows to load while the ready queue is short, and only
		 * a batch's worth a round while it is long: memory follows work, and
		 * yet a queue that never drains (flows that loop) starves no flow
		 * waiting to load.
		 */
		if (Worker.full_scan)
		{
			LoadAndQueue(DWARF_LOAD_CHUNK);
			LastScan = GetCurrentTimestamp();	/* when it ended */
		}
		else if (Worker.to_load != NIL)
			LoadAndQueue(Worker.ready_count < DWARF_LOAD_CHUNK || !QueueHasRunnable() ?
						 DWARF_LOAD_CHUNK : Max(dwarf_batch_size, 1));
		MemoryContextSwitchTo(Worker.batch_context);	/* whatever a commit above left */
		(void) MoveDueTimers();
		RunBatch(requests);
		IntakeAnswer();
		pg_atomic_write_u64(&Worker.slot->ready, Worker.ready_count);
		Worker.slot->timers = QueueTimerCount() + SleeperCount();
		Worker.slot->poison_steps = CrashesSuspects();
		MemoryContextSwitchTo(TopMemoryContext);
		MemoryContextReset(Worker.batch_context);

		next_timer = MoveDueTimers();
		sleeper_timer = SleepersNextMs();
		if (sleeper_timer >= 0)	/* a flow to load again */
			next_timer = next_timer < 0 ? sleeper_timer : Min(next_timer, sleeper_timer);
		PublishPriority();

		/*
		 * Go round again if there is work, or a note came after we drained
		 * the ring: a lock wait inside the transactions above may have
		 * consumed the latch its sender set.
		 */
		if (Worker.to_load != NIL || Alone != NIL || Worker.slot->head != Worker.slot->tail ||
			Worker.slot->overflow || QueueHasRunnable())
			continue;
		if (QueueHasReady())
			next_timer = next_timer < 0 ? 100 : Min(next_timer, 100);	/* held back */
		if (runner_timer < 0)
			runner_timer = RunnerWaitMs();	/* a step the batch lent may wait */
		if (runner_timer >= 0)	/* steps wait for a runner */
			next_timer = next_timer < 0 ? runner_timer : Min(next_timer, runner_timer);
		if (OffersPending())	/* leases to sweep */
			next_timer = next_timer < 0 ? offers_timer : Min(next_timer, offers_timer);

		/*
		 * Nothing to run: flush our statistics, then sleep until a note, a
		 * signal or the next timer.
		 */
		pgstat_report_stat(true);
		QueuePruneFairKeys();
		ShrinkFlowTable();
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
						 (next_timer >= 0 ? WL_TIMEOUT : 0),
						 next_timer, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if (Worker.slot->head == Worker.slot->tail && !Worker.slot->overflow)
			ExitIfNotInstalled();	/* woken by DROP EXTENSION, perhaps */
	}
}
