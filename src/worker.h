/*
 * worker.h
 *		Declarations shared by the files of a dwarf worker.  They are
 *		layered, each using only those below it (scripts/module-deps.py
 *		checks), from the bottom: crashes.c (steps that end their process);
 *		sleepers.c (flows let go of until due); store.c (loads flows and
 *		records steps, and never queues them); queue.c (what runs next);
 *		lend.c (slow steps, lent to runners); step.c (one step); intake.c
 *		(dwarf.run's creates); worker.c (the loop and batches, the only one
 *		that queues what it loaded); runner.c (a runner, on worker.c's
 *		batches).
 */
#ifndef DWARF_WORKER_H
#define DWARF_WORKER_H

#include "executor/spi.h"
#include "postmaster/bgworker.h"
#include "utils/hsearch.h"

#include "dwarf.h"
#include "flowrun.h"
#include "flows.h"
#include "shmem.h"

struct FairKey;

/*
 * A token in the ready queue or on the timer heap.  The ready queue runs
 * lower priority first; within a priority, lower virtual time first, which
 * serves fairness keys in proportion to their weights (stride scheduling);
 * then first come, first served.
 */
typedef struct ReadyEntry
{
	pairingheap_node ph;
	int64		flow_id;
	int			token_id;
	int32		priority;
	uint64		seq;
	TimestampTz due;
	struct FairKey *fair;
	struct OwnerQueue *queue;	/* its owner role's ready queue */
	int32		weight;
	double		vtime;
	int			contended;		/* lock conflicts it met so far (worker.c) */
	bool		kept;			/* a slow step no runner could take: the worker
								 * runs it, and does not preempt it (lend.c) */
	bool		later;			/* not run in its batch: queued again after the
								 * commit, to be lent (RefillBatch) */
} ReadyEntry;

/*
 * At most this many flows are loaded at a time (LoadFlows), and the next
 * ones only once fewer steps than that are ready (worker.c).
 */
#define DWARF_LOAD_CHUNK	1000

/*
 * A flow with nothing to run sooner than this is evicted from memory; it is
 * loaded again DWARF_WAKE_AHEAD_MS before it is due, so that its timer
 * fires on time.
 */
#define DWARF_EVICT_AFTER_MS	5000
#define DWARF_WAKE_AHEAD_MS		1000

/* A flow to load: from a note, a run request or a table scan. */
typedef struct LoadItem
{
	int64		flow_id;
	bool		replay;			/* it may have steps already */
} LoadItem;

/* A step this worker lent, or is about to lend once a runner is free (lend.c). */
typedef struct Lent
{
	int64		flow_id;
	int32		token_id;
	Oid			role;			/* the flow's owner: runners are shared by role */
	int			runner;			/* index in DwarfShared.runners; -1: waiting */
	BackgroundWorkerHandle *handle; /* NULL for a runner of an earlier worker */
} Lent;

/*
 * A worker's (or a runner's) own state, shared by the worker's files; one
 * per process.  A field a module keeps is marked with the module's name:
 * only that module and those above it use it (scripts/module-deps.py
 * checks); the rest are the process's own, set up once (globals.c).
 */
typedef struct WorkerState
{
	DwarfWorkerSlot *slot;		/* our slot in shared memory */
	bool		is_runner;		/* this process is a runner, not a worker */
	MemoryContext context;		/* flows, graphs, queue entries */
	MemoryContext batch_context;	/* reset after each loop */
	HTAB	   *flows;			/* FlowRun by id (store.c) */
	List	   *to_load;		/* LoadItems (store.c) */
	bool		full_scan;		/* load every running flow of ours (store.c) */
	int64		ready_count;	/* entries on the ready queue (queue.c) */
	List	   *lent;			/* Lents (lend.c), in TopMemoryContext */
} WorkerState;

extern WorkerState Worker;

/* step.c */

/* What became of a step RunStep was given. */
typedef enum StepResult
{
	STEP_DONE,					/* ran, and its row is recorded */
	STEP_BROKEN,				/* an error left the flow half moved on: reload it */
	STEP_CONTENDED,				/* met a lock conflict while sharing: run it alone */
	STEP_DEFERRED,				/* met server trouble (disk full): run it later */
	STEP_OFFERED,				/* an external task's: offered to claims, it
								 * waits for an answer (token->offered) */
	STEP_STOPPED				/* preempted, or its flow cancelled: given back
								 * untouched */
} StepResult;

/* Backoff of a step put off by server trouble: doubling, from and up to. */
#define DWARF_DEFER_FIRST_MS	500
#define DWARF_DEFER_MAX_MS		60000
#define DWARF_MAX_DEFERRALS		10000

/*
 * A step that met a lock conflict runs alone, up to this many times: even
 * alone, it can be the victim of a deadlock between other workers' batches
 * (it queues for a row behind them).  Only then is the conflict its own.
 */
#define DWARF_CONTENTION_TRIES	5

extern void PinSearchPath(void);
extern StepResult RunStep(FlowRun *flow, Token *token, bool isolated, bool shared,
						  bool preemptible);
extern void StepTimerInit(void);
extern void StepTimerArm(uint32 seen);
extern void StepTimerDisarm(void);
extern bool StepWasStopped(void);

/* worker.c */
extern void WorkerInit(void);
extern void QueueOrEvict(FlowRun *flow);
extern void RunEntries(List *batch, bool isolated, bool alone, List *requests);
extern bool RunAloneStep(void);

/* intake.c */
extern void IntakeApart(List *procnos);
extern bool IntakeInBatch(List *procnos, List **flows);
extern void IntakeNoteClose(FlowRun *flow);
extern void IntakeCommitted(void);
extern void IntakeRolledBack(void);
extern List *IntakeRedo(List *requests);
extern void IntakeAnswer(void);

/* lend.c */
extern bool LendingOn(void);
extern bool RunnerWants(FlowRun *flow, Token *token);
extern bool RunnerLend(FlowRun *flow, Token *token);
extern long RunnerPoll(void);
extern long RunnerWaitMs(void);
extern void RunnerAdopt(void);
extern bool FlowIsLent(int64 flow_id);
extern void NoteTaskTime(GraphNode *node, int64 us);
extern void NoteTaskOwnProcess(GraphNode *node);

/* session.c */
extern void SessionInit(void);
extern const char *SessionRoleName(Oid role);
extern bool SessionMustReplace(Oid owner);
extern void SessionServe(Oid owner);
extern void SessionReadSettings(void);
extern void SessionTaskBegins(void);
extern void SessionAfterTask(GraphNode *node);

/* crashes.c */
extern void CrashesInitWorker(void);
extern void CrashesInitRunner(int runner);
extern void CrashesNoteStep(int64 flow_id, int token_id);
extern void CrashesRunnerDied(int runner);
extern int	CrashesOf(int64 flow_id, int token_id);
extern int	CrashesSuspects(void);

/* queue.c */
extern void QueueInit(void);
extern void QueuePruneFairKeys(void);
extern void EnqueueRunnable(FlowRun *flow);
extern bool OfferExternalStep(FlowRun *flow, Token *token);
extern ReadyEntry *NewReadyEntry(FlowRun *flow, Token *token);
extern long MoveDueTimers(void);
extern void UnqueueTimers(FlowRun *flow);
extern List *PopBatch(int max, Oid owner);
extern void PublishPriority(void);
extern int32 BestReadyPriority(void);
extern int32 DatabaseBestPriority(void);
extern int32 OthersRunningPriority(void);
extern void SetRunningPriority(List *batch);
extern void ClearRunningPriority(void);
extern bool QueueHasRunnable(void);
extern bool QueueHasReady(void);
extern int	QueueTimerCount(void);

/* sleepers.c */
extern void SleeperAdd(int64 flow_id, TimestampTz due);
extern bool TakeDueSleeper(int64 *flow_id);
extern void SleepersForget(void);
extern int64 *SleeperIds(int *n);
extern long SleepersNextMs(void);
extern int	SleeperCount(void);

/* store.c */
extern void StoreInit(void);
extern void PreparePlans(void);
extern List *LoadFlows(int max);
extern void ShrinkFlowTable(void);
extern ErrorData *AbortAfterError(MemoryContext cxt);
extern void FlowRowFromTuple(HeapTuple tup, TupleDesc desc, FlowRow *row);
extern FlowRun *TakeInFlow(const FlowRow *row);
extern void NoteLoad(int64 flow_id, bool replay);
extern void DropFlow(FlowRun *flow);
extern void FailFlowRow(int64 id, const char *error);
extern bool FlowStillRuns(int64 flow_id);
extern void StepIdsFromNewBlock(void);
extern void WriteClose(FlowRun *flow);
extern void ParkRow(FlowRun *flow, Token *token);
extern void DeleteAnswer(int64 flow_id, int token_id, int visits, int attempt);
extern List *LoadAnswers(int64 *ids, int n);
extern void RecordStep(FlowRun *flow, int token_id, int node, int attempt,
					   StepOutcome *outcome, TimestampTz started, TimestampTz finished);

#endif							/* DWARF_WORKER_H */
