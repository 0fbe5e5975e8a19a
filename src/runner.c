/*
 * runner.c
 *		Runners: background workers that each run one slow step in a
 *		transaction of its own, so that a task that takes seconds holds up
 *		no other flow.  The owning worker lends the step (lend.c).
 *
 * The runner loads the flow from the tables as a restart would, runs the
 * step as a batch of one, isolated, commits, and says it is done.  A
 * runner preempted to make room for another role's step (lend.c) is
 * terminated instead: its transaction rolls back, and its lender gives the
 * step back.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"

#include "dwarf.h"
#include "shmem.h"
#include "flowrun.h"
#include "worker.h"

/*
 * The slot of the worker that lent the step, found by its number in the
 * database (a restarted worker may have another slot).  While that worker
 * is not running, a slot of our own stands in: the runner reads its
 * worker's notes (a cancel) and adds to its counters, and may do without.
 */
static DwarfWorkerSlot *
LenderSlot(DwarfRunnerSlot *slot)
{
	DwarfWorkerSlot *lender = DwarfWorkerSlotOf(slot->dboid, slot->worker);

	if (lender == NULL)
	{
		lender = MemoryContextAllocZero(TopMemoryContext, sizeof(DwarfWorkerSlot));
		SpinLockInit(&lender->mutex);
		lender->dboid = slot->dboid;
		lender->index = slot->worker;
	}
	return lender;
}

/*
 * Entry point of a runner: runs the one step its slot names, if its flow
 * still runs and the step is still where it was lent, then says so.
 */
void
DwarfRunnerMain(Datum arg)
{
	DwarfRunnerSlot *slot = &Dwarf->runners[DatumGetInt32(arg)];
	FlowRun    *flow;
	Token	   *token;
	DwarfWorkerSlot *lender;
	Latch	   *latch;
	bool		preempted;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	SpinLockAcquire(&slot->mutex);
	slot->pid = MyProcPid;
	SpinLockRelease(&slot->mutex);

	/*
	 * Preempted before the pid above could be signalled (lend.c): gone
	 * without a word, as a terminated runner goes, its lender gives the step
	 * back.
	 */
	SpinLockAcquire(&Dwarf->mutex);
	preempted = slot->preempted;
	SpinLockRelease(&Dwarf->mutex);
	if (preempted)
		proc_exit(0);
	BackgroundWorkerInitializeConnectionByOid(slot->dboid, InvalidOid, 0);
	pgstat_report_appname("dwarf runner");

	Worker.is_runner = true;
	Worker.slot = LenderSlot(slot);
	WorkerInit();
	CrashesInitRunner(DatumGetInt32(arg));
	Worker.full_scan = false;
	NoteLoad(slot->flow_id, true);
	list_free_deep(LoadFlows(1));	/* not queued: the step below is all it runs */

	flow = hash_search(Worker.flows, &slot->flow_id, HASH_FIND, NULL);
	token = flow ? FlowFindToken(flow, slot->token_id) : NULL;
	if (token && flow->status == FLOW_RUNNING && !token->parked)
	{
		ReadyEntry *entry = palloc0(sizeof(ReadyEntry));

		entry->flow_id = flow->id;
		entry->token_id = token->id;
		token->running = true;
		MemoryContextSwitchTo(Worker.batch_context);
		RunEntries(list_make1(entry), true, true, NIL);
		while (RunAloneStep())	/* it met a lock conflict: again */
			;
	}

	SpinLockAcquire(&slot->mutex);
	slot->done = true;
	SpinLockRelease(&slot->mutex);
	lender = DwarfWorkerSlotOf(slot->dboid, slot->worker);	/* it may have restarted */
	latch = lender ? lender->latch : NULL;
	if (latch)
		SetLatch(latch);
	proc_exit(0);
}
