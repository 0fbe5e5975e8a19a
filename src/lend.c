/*
 * lend.c
 *		The worker's side of slow steps: which tasks are slow, and lending
 *		their steps to runners (runner.c), one step a runner.
 *
 * Every step's run time is measured.  A task that once ran for
 * dwarf.long_step or more (or was preempted in a worker when it reached it,
 * see step.c) is marked slow in shared memory, for all the
 * workers of its database; from then on the owning worker lends each of
 * its steps to a runner, a dynamic background worker started for that one
 * step, at most dwarf.max_runners at a time (steps wait for a free one).
 * When the runner is done, the owner reloads the flow and moves it on.
 * While a step is lent, no other step of its flow runs, however often the
 * owner reloads it (FlowIsLent): the runner's copy of the flow
 * must stay the flow.  A step is lent before its batch starts (its input is
 * committed); the flow's other steps in that batch do not run.  A
 * slow task that runs quickly again comes back to the workers.
 *
 * A runner that dies before it is done gives its step back: the owner
 * reloads the flow, and the step runs again.
 *
 * Runners are shared fairly between roles (a role is a flow's owner), over
 * the scope dwarf.max_runners counts them in: the cluster.  A free runner
 * goes to the waiting step of the role that holds the fewest, whichever
 * worker (of whichever database) has it: each worker says which roles'
 * steps wait with it (DwarfLendWaits), and the others leave a free runner
 * to a role that holds fewer than theirs.  A role's fair share is the
 * runners (dwarf.max_runners, or as many as can start when the server's
 * background worker slots are short: see MaxRunners) over the number of
 * roles with running or waiting slow steps (at least 1).  When every runner
 * is taken and a step of a role below its share waits, the newest runner of
 * a role above its share is preempted: terminated, so its step's
 * transaction rolls back (nothing of it was committed), and its lender
 * gives the step back to wait for a runner again, neither failed nor
 * counted as an attempt nor taken for a crash.  Only a role above its share loses a runner, and only to one
 * below it, so no step is preempted back and forth; one preemption at a
 * time is in flight.
 */
#include "postgres.h"

#include <signal.h>

#include "commands/sequence.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "lograte.h"
#include "shmem.h"
#include "graph.h"
#include "flowrun.h"
#include "limits.h"
#include "worker.h"

/* A failed start's word on how many runners can start counts this long. */
#define DWARF_ROOM_FRESH_MS		10000

/* Runners may use at most this many background worker slots, as set. */
static int
RunnersSet(void)
{
	int			n = dwarf_max_runners >= 0 ? dwarf_max_runners : max_worker_processes / 2;

	return Min(n, DWARF_MAX_RUNNERS);
}

/*
 * Runners that may run at once: dwarf.max_runners (RunnersSet), or fewer
 * when fewer could really start lately.  The server's background worker
 * slots are shared with dwarf's own workers and launcher, the HTTP
 * processes and everyone else's workers, and a share of runners no runner
 * can fill would keep a role below its share waiting with nothing to
 * preempt: "every runner is taken" means every runner that can start.  A
 * runner that cannot be registered says how many there were (StartRunner,
 * which tries again as long as steps wait, up to dwarf.max_runners); one
 * that can, past that count, or DWARF_ROOM_FRESH_MS without a failure, lifts
 * the bound again.
 */
static int
MaxRunners(void)
{
	int			n = RunnersSet();
	int			room = -1;

	if (Dwarf->runner_room_at == 0)
		return n;				/* no failure lately: the common case */
	SpinLockAcquire(&Dwarf->mutex);
	if (Dwarf->runner_room_at != 0 &&
		!TimestampDifferenceExceeds(Dwarf->runner_room_at, GetCurrentTimestamp(),
									DWARF_ROOM_FRESH_MS))
		room = Dwarf->runner_room;
	SpinLockRelease(&Dwarf->mutex);
	return room >= 0 ? Min(n, room) : n;
}

/*
 * Do slow steps go to runners?  Then a task that runs past dwarf.long_step
 * in a worker is preempted (step.c) and its step lent; otherwise it runs
 * in the worker to its end.
 */
bool
LendingOn(void)
{
	return dwarf_long_step > 0 && RunnersSet() > 0;
}

/* Runner slots in use, by any worker of any database. */
static int
RunnersInUse(void)
{
	int			used = 0;
	int			i;

	SpinLockAcquire(&Dwarf->mutex);
	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
		if (Dwarf->runners[i].in_use)
			used++;
	SpinLockRelease(&Dwarf->mutex);
	return used;
}

/* ---------- which tasks are slow ---------- */

/*
 * This database's entry for a task, or NULL.  With make, a new entry if
 * there is none: a free one, else the one noted longest ago (the table
 * holds the tasks found slow lately; one evicted is found slow again the
 * next time it runs long).  Under slow_mutex.
 */
static DwarfSlowTask *
FindSlow(Oid fn, bool make)
{
	DwarfSlowTask *free_entry = NULL;
	DwarfSlowTask *oldest = NULL;
	int			i;

	for (i = 0; i < DWARF_SLOW_TASKS; i++)
	{
		DwarfSlowTask *t = &Dwarf->slow[(fn + i) % DWARF_SLOW_TASKS];

		if (t->dboid == MyDatabaseId && t->fn == fn)
			return t;
		if (t->dboid == InvalidOid)
		{
			if (free_entry == NULL)
				free_entry = t;
		}
		else if (oldest == NULL || t->noted_at < oldest->noted_at)
			oldest = t;
	}
	return !make ? NULL : free_entry ? free_entry : oldest;
}

/* Does this task's steps go to runners?  One atomic read when nothing changed. */
static bool
TaskIsSlow(GraphNode *node)
{
	uint32		epoch = pg_atomic_read_u32(&Dwarf->slow_epoch);

	if (node->slow_epoch != epoch)
	{
		DwarfSlowTask *t;

		SpinLockAcquire(&Dwarf->slow_mutex);
		t = FindSlow(node->fn, false);
		node->slow = t != NULL;
		SpinLockRelease(&Dwarf->slow_mutex);
		node->slow_epoch = epoch;
	}
	return node->slow;
}

/*
 * Records how long a step of this task ran: from dwarf.long_step on, the
 * task is slow (it takes an entry); quicker, it is not (any more: its
 * entry is freed).
 */
void
NoteTaskTime(GraphNode *node, int64 us)
{
	bool		slow = dwarf_long_step > 0 && us >= (int64) dwarf_long_step * 1000;
	DwarfSlowTask *t;
	TimestampTz now;

	if (slow == TaskIsSlow(node))
		return;
	now = GetCurrentTimestamp();
	SpinLockAcquire(&Dwarf->slow_mutex);
	t = FindSlow(node->fn, slow);
	if (t && slow)
	{
		t->dboid = MyDatabaseId;
		t->fn = node->fn;
		t->noted_at = now;
		t->own_process = false;
	}
	else if (t && !t->own_process)
		t->dboid = InvalidOid;
	pg_atomic_fetch_add_u32(&Dwarf->slow_epoch, 1);
	SpinLockRelease(&Dwarf->slow_mutex);
}

/*
 * Marks a task whose step left state in its worker's process that a
 * session reset cannot reach (session.c): its steps go to runners, one
 * process a step, from now on, however quick they are.
 */
void
NoteTaskOwnProcess(GraphNode *node)
{
	DwarfSlowTask *t;

	SpinLockAcquire(&Dwarf->slow_mutex);
	t = FindSlow(node->fn, true);
	t->dboid = MyDatabaseId;
	t->fn = node->fn;
	t->noted_at = GetCurrentTimestamp();
	t->own_process = true;
	pg_atomic_fetch_add_u32(&Dwarf->slow_epoch, 1);
	SpinLockRelease(&Dwarf->slow_mutex);
}

/* ---------- sharing the runners between roles ---------- */

/* Another worker's word on its waiting roles counts for this long. */
#define DWARF_WAITS_FRESH_MS	2000

/* Roles tallied at most (every runner's, and then waiting ones'). */
#define DWARF_TALLY_ROLES		(2 * DWARF_MAX_RUNNERS)

/* A role's runners and whether a step of its waits for one. */
typedef struct RoleShare
{
	Oid			role;
	int			running;		/* runners it holds, but those being preempted */
	bool		waiting;
} RoleShare;

/* The runners and the waiting roles of the cluster, as seen at a moment. */
typedef struct LendView
{
	int			used;			/* runner slots in use */
	bool		preempting;		/* a runner is being preempted */
	int			nroles;
	RoleShare	roles[DWARF_TALLY_ROLES];
} LendView;

/* The view's entry for a role; with add, a new one if there is room; or NULL. */
static RoleShare *
RoleIn(LendView *view, Oid role, bool add)
{
	int			i;

	for (i = 0; i < view->nroles; i++)
		if (view->roles[i].role == role)
			return &view->roles[i];
	if (!add || view->nroles == DWARF_TALLY_ROLES)
		return NULL;
	view->roles[view->nroles].role = role;
	view->roles[view->nroles].running = 0;
	view->roles[view->nroles].waiting = false;
	return &view->roles[view->nroles++];
}

/* Runners a role holds, in view. */
static int
RunningOf(LendView *view, Oid role)
{
	RoleShare  *r = RoleIn(view, role, false);

	return r ? r->running : 0;
}

/*
 * Takes a view of the runners and of the roles waiting for one: copied
 * under the lock, tallied outside it.
 */
static void
TakeLendView(LendView *view)
{
	Oid			running[DWARF_MAX_RUNNERS];
	Oid			waiting[DWARF_MAX_WORKERS * DWARF_WAIT_ROLES];
	int			nrunning = 0;
	int			nwaiting = 0;
	TimestampTz now = GetCurrentTimestamp();
	int			i;
	int			j;

	view->used = 0;
	view->preempting = false;
	view->nroles = 0;
	SpinLockAcquire(&Dwarf->mutex);
	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
	{
		DwarfRunnerSlot *slot = &Dwarf->runners[i];

		if (!slot->in_use)
			continue;
		view->used++;
		if (slot->preempted)
			view->preempting = true;
		else
			running[nrunning++] = slot->role;
	}
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfLendWaits *w = &Dwarf->lend_waits[i];

		/* the worker's pid is read unlocked: it is gone or not */
		if (w->nroles == 0 || w->pid != Dwarf->workers[i].pid ||
			TimestampDifferenceExceeds(w->at, now, DWARF_WAITS_FRESH_MS))
			continue;
		for (j = 0; j < w->nroles; j++)
			waiting[nwaiting++] = w->roles[j];
	}
	SpinLockRelease(&Dwarf->mutex);

	for (i = 0; i < nrunning; i++)
		RoleIn(view, running[i], true)->running++;
	for (i = 0; i < nwaiting; i++)
	{
		RoleShare  *r = RoleIn(view, waiting[i], true);

		if (r)
			r->waiting = true;
	}
}

/* Does a role hold fewer runners than role, while a step of its waits? */
static bool
FewerWait(LendView *view, Oid role)
{
	int			mine = RunningOf(view, role);
	int			i;

	for (i = 0; i < view->nroles; i++)
		if (view->roles[i].waiting && view->roles[i].role != role &&
			view->roles[i].running < mine)
			return true;
	return false;
}

/* The waiting step (runner < 0) whose role holds the fewest runners, or NULL. */
static Lent *
NextToLend(LendView *view)
{
	Lent	   *next = NULL;
	int			fewest = 0;
	ListCell   *lc;

	foreach(lc, Worker.lent)
	{
		Lent	   *lent = lfirst(lc);
		int			running;

		if (lent->runner >= 0)
			continue;
		running = RunningOf(view, lent->role);
		if (next == NULL || running < fewest)
		{
			next = lent;
			fewest = running;
		}
	}
	return next;
}

/*
 * Says which roles' steps wait for a runner here, for the other workers to
 * leave a free runner to them (TakeLendView).  Once a loop while steps
 * wait, and once more when none does any longer.
 */
static void
PublishWaits(void)
{
	static bool published = false;
	DwarfLendWaits *w = &Dwarf->lend_waits[Worker.slot - Dwarf->workers];
	Oid			roles[DWARF_WAIT_ROLES];
	int			nroles = 0;
	TimestampTz now;
	ListCell   *lc;
	int			i;

	foreach(lc, Worker.lent)
	{
		Lent	   *lent = lfirst(lc);

		if (lent->runner >= 0)
			continue;
		for (i = 0; i < nroles; i++)
			if (roles[i] == lent->role)
				break;
		if (i == nroles && nroles < DWARF_WAIT_ROLES)
			roles[nroles++] = lent->role;
	}
	if (nroles == 0 && !published)
		return;
	now = GetCurrentTimestamp();
	SpinLockAcquire(&Dwarf->mutex);
	w->pid = MyProcPid;
	w->at = now;
	w->nroles = nroles;
	memcpy(w->roles, roles, nroles * sizeof(Oid));
	SpinLockRelease(&Dwarf->mutex);
	published = nroles > 0;
}

/* Wakes the other workers whose steps wait for a runner: one is free. */
static void
WakeWaitingWorkers(void)
{
	int			i;

	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];
		Latch	   *latch = NULL;

		if (slot == Worker.slot)
			continue;
		SpinLockAcquire(&Dwarf->mutex);
		if (Dwarf->lend_waits[i].nroles > 0 && Dwarf->lend_waits[i].pid == slot->pid)
			latch = slot->latch;
		SpinLockRelease(&Dwarf->mutex);
		if (latch)
			SetLatch(latch);
	}
}

/*
 * Every runner is taken and a step of ours waits: if its role (the one of
 * ours that holds the fewest) is below its fair share, preempts the newest
 * runner of a role above it (see the file's comment).  Its lender finds it
 * gone (RunnerFinished) and gives its step back; the freed runner goes to
 * the role that holds fewer.
 */
static void
PreemptForFairness(void)
{
	LendView	view;
	Lent	   *waiting;
	DwarfRunnerSlot *victim = NULL;
	Oid			over[DWARF_MAX_RUNNERS];	/* roles above their share */
	int			nover = 0;
	int			max;
	int			share;
	int			running;
	int64		flow_id = 0;
	Oid			role = InvalidOid;
	pid_t		pid;
	bool		done;
	int			i;

	TakeLendView(&view);
	if (view.preempting || view.used < (max = MaxRunners()) ||
		(waiting = NextToLend(&view)) == NULL)
		return;
	share = Max(1, max / Max(1, view.nroles));
	if (RunningOf(&view, waiting->role) >= share)
		return;
	for (i = 0; i < view.nroles; i++)
		if (view.roles[i].running > share)
			over[nover++] = view.roles[i].role;
	if (nover == 0)
		return;

	SpinLockAcquire(&Dwarf->mutex);
	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
	{
		DwarfRunnerSlot *slot = &Dwarf->runners[i];
		int			j;

		if (slot->preempted && slot->in_use)
		{
			victim = NULL;		/* another worker was quicker */
			break;
		}
		if (!slot->in_use)
			continue;
		for (j = 0; j < nover && over[j] != slot->role; j++)
			;
		if (j < nover && (victim == NULL || slot->lent_at > victim->lent_at))
			victim = slot;
	}
	if (victim)
	{
		victim->preempted = true;
		flow_id = victim->flow_id;
		role = victim->role;
	}
	SpinLockRelease(&Dwarf->mutex);
	if (victim == NULL)
		return;

	SpinLockAcquire(&victim->mutex);
	done = victim->done;
	pid = victim->pid;
	SpinLockRelease(&victim->mutex);
	if (done)
		return;					/* its runner is free already */
	running = RunningOf(&view, role);
	ereport(LOG,
			(errmsg("dwarf: a runner's step of flow " INT64_FORMAT " of role %u is preempted: the role holds %d of the %d runners that can start (dwarf.max_runners is %d), more than its share of %d, while a step of role %u waits",
					flow_id, role, running, max, RunnersSet(), share, waiting->role),
			 errdetail("The step is rolled back and waits for a runner again; nothing of it is kept.")));
	/* A runner not started yet stops as it starts: its lender sees it gone. */
	if (pid > 0)
		kill(pid, SIGTERM);
}

/* ---------- the lending worker's side ---------- */

/*
 * Takes a free runner slot and starts a runner on it.  Returns false when
 * there is no slot, a role that holds fewer runners than the step's waits
 * for one, or no background worker could be started.
 */
static bool
StartRunner(Lent *lent)
{
	BackgroundWorker worker = {0};
	DwarfRunnerSlot *slot = NULL;
	MemoryContext old;
	LendView	view;
	bool		registered;
	int			used = 0;
	int			max = RunnersSet();	/* a start that fails says what MaxRunners says */
	int			i;

	TakeLendView(&view);
	if (view.used >= max || FewerWait(&view, lent->role))
		return false;
	SpinLockAcquire(&Dwarf->mutex);
	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
	{
		if (Dwarf->runners[i].in_use)
			used++;
		else if (slot == NULL)
			slot = &Dwarf->runners[i];
	}
	if (slot == NULL || used >= max)
	{
		SpinLockRelease(&Dwarf->mutex);
		return false;
	}
	slot->in_use = true;
	slot->preempted = false;
	slot->dboid = MyDatabaseId;
	slot->role = lent->role;
	slot->worker = Worker.slot->index;
	slot->flow_id = lent->flow_id;
	slot->token_id = lent->token_id;
	slot->lent_at = GetCurrentTimestamp();
	slot->pid = 0;
	slot->done = false;
	SpinLockRelease(&Dwarf->mutex);

	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "dwarf");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "DwarfRunnerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "dwarf runner for flow " INT64_FORMAT, lent->flow_id);
	snprintf(worker.bgw_type, BGW_MAXLEN, "dwarf runner");
	worker.bgw_main_arg = Int32GetDatum(slot - Dwarf->runners);
	worker.bgw_notify_pid = MyProcPid;
	old = MemoryContextSwitchTo(TopMemoryContext);	/* the handle lives on */
	registered = RegisterDynamicBackgroundWorker(&worker, &lent->handle);
	MemoryContextSwitchTo(old);
	SpinLockAcquire(&Dwarf->mutex);
	if (!registered)
	{
		/* No slot: the runners in use are all that can start now. */
		slot->in_use = false;
		Dwarf->runner_room = used;
		Dwarf->runner_room_at = GetCurrentTimestamp();
	}
	else if (Dwarf->runner_room_at != 0 && used + 1 > Dwarf->runner_room)
		Dwarf->runner_room_at = 0;	/* more could start than we thought */
	SpinLockRelease(&Dwarf->mutex);
	if (!registered)
	{
		static LogRate no_slot;
		int64		n;
		int			seconds;

		lent->handle = NULL;
		if ((n = LogRateDue(&no_slot, GetCurrentTimestamp(), &seconds)) > 0)
			ereport(LOG,
					(errmsg("dwarf: a runner could not start: no background worker slot is free, with %d runners running of dwarf.max_runners (%d)%s",
							used, max, LogRateCount(n, seconds)),
					 errdetail("Runners are shared between roles as if %d were all there are, until more can start.", used),
					 errhint("Raise max_worker_processes (now %d), or set dwarf.max_runners to what the server has room for.",
							 max_worker_processes)));
		return false;
	}
	lent->runner = slot - Dwarf->runners;
	return true;
}

/*
 * Is this step one for a runner: a slow task's, or one that ended its
 * process before (until it has done so too often: then the worker fails it
 * in CallTask)?
 */
bool
RunnerWants(FlowRun *flow, Token *token)
{
	GraphNode  *node = &flow->graph->nodes[token->node];
	int			crashes = CrashesOf(flow->id, token->id);

	return !Worker.is_runner && RunnersSet() > 0 && OidIsValid(node->fn) &&
		crashes < dwarf_step_crashes && (crashes > 0 || TaskIsSlow(node));
}

/*
 * Lends a step of a slow task to a runner, or keeps it for the next free
 * one.  Returns false when the worker should run the step itself: the task
 * is not slow, runners are off, or none can start and none runs anywhere
 * to make room (background worker slots are short).  While runners are
 * merely busy the step waits: run in the worker, it would be preempted.
 */
bool
RunnerLend(FlowRun *flow, Token *token)
{
	MemoryContext old;
	Lent	   *lent;

	if (!RunnerWants(flow, token))
		return false;
	old = MemoryContextSwitchTo(TopMemoryContext);
	lent = palloc0(sizeof(Lent));
	lent->flow_id = flow->id;
	lent->token_id = token->id;
	lent->role = flow->owner;
	lent->runner = -1;
	if (!StartRunner(lent) && Worker.lent == NIL && RunnersInUse() == 0)
	{
		pfree(lent);
		MemoryContextSwitchTo(old);
		return false;
	}
	Worker.lent = lappend(Worker.lent, lent);
	MemoryContextSwitchTo(old);
	if (lent->runner < 0)
		PublishWaits();
	return true;
}

/* Has the runner of this lent step finished, or died without finishing? */
static bool
RunnerFinished(Lent *lent)
{
	DwarfRunnerSlot *slot = &Dwarf->runners[lent->runner];
	pid_t		pid;
	bool		done;
	bool		gone;
	bool		preempted;

	if (lent->handle)
		gone = GetBackgroundWorkerPid(lent->handle, &pid) == BGWH_STOPPED;
	else
	{
		SpinLockAcquire(&slot->mutex);
		pid = slot->pid;
		SpinLockRelease(&slot->mutex);
		gone = pid != 0 ? kill(pid, 0) != 0 :
			TimestampDifferenceExceeds(slot->lent_at, GetCurrentTimestamp(), 60000);
	}
	SpinLockAcquire(&slot->mutex);
	done = slot->done;
	SpinLockRelease(&slot->mutex);
	if (!done && !gone)
		return false;
	SpinLockAcquire(&Dwarf->mutex);
	preempted = slot->preempted;
	SpinLockRelease(&Dwarf->mutex);
	if (!done && preempted)
		ereport(LOG,
				(errmsg("dwarf: the preempted step of flow " INT64_FORMAT " waits for a runner again",
						lent->flow_id)));
	else if (!done)
	{
		ereport(LOG,
				(errmsg("dwarf: the runner of a step of flow " INT64_FORMAT " ended before it was done",
						lent->flow_id)));
		CrashesRunnerDied(lent->runner);
	}
	return true;
}

/*
 * Looks after the lent steps: a finished runner's flow is reloaded (the
 * tables have its step), and steps waiting for a runner get one if there
 * is room, the role that holds the fewest first; if there is none, one may
 * be preempted for them (PreemptForFairness).  Returns milliseconds until
 * it should look again for room, or -1 when no step waits.
 */
long
RunnerPoll(void)
{
	ListCell   *lc;
	bool		waiting = false;
	bool		freed = false;

	foreach(lc, Worker.lent)
	{
		Lent	   *lent = lfirst(lc);

		if (lent->runner < 0)
		{
			FlowRun    *flow = hash_search(Worker.flows, &lent->flow_id, HASH_FIND, NULL);
			Token	   *token = flow ? FlowFindToken(flow, lent->token_id) : NULL;

			/* Quick again (a runner said so), or gone: the worker takes it back. */
			if (token == NULL || !TaskIsSlow(&flow->graph->nodes[token->node]))
			{
				LimitStepGive(lent->flow_id, lent->token_id);
				Worker.lent = foreach_delete_current(Worker.lent, lc);
				pfree(lent);
				if (token)
				{
					token->running = false;
					EnqueueRunnable(flow);
				}
				continue;
			}
			waiting = true;
			continue;
		}
		if (!RunnerFinished(lent))
			continue;

		/*
		 * The runner took its step's id from a block of dwarf.step_seq
		 * above ours: ours must come from a new block, or the flow's next
		 * step would sort before the runner's, and replay in the wrong order.
		 */
		StepIdsFromNewBlock();
		{
			FlowRun    *flow = hash_search(Worker.flows, &lent->flow_id, HASH_FIND, NULL);

			if (flow)
				DropFlow(flow);
			NoteLoad(lent->flow_id, true);
		}
		SpinLockAcquire(&Dwarf->mutex);
		Dwarf->runners[lent->runner].in_use = false;
		Dwarf->runners[lent->runner].preempted = false;
		SpinLockRelease(&Dwarf->mutex);
		LimitStepGive(lent->flow_id, lent->token_id);	/* held from lending on */
		freed = true;
		if (lent->handle)
			pfree(lent->handle);
		Worker.lent = foreach_delete_current(Worker.lent, lc);
		pfree(lent);
	}

	while (waiting)
	{
		LendView	view;
		Lent	   *next;

		TakeLendView(&view);
		if ((next = NextToLend(&view)) == NULL)
			waiting = false;
		else if (!StartRunner(next))
			break;
	}
	PublishWaits();
	if (waiting)
		PreemptForFairness();
	if (freed)
		WakeWaitingWorkers();
	return waiting ? RunnerWaitMs() : -1;
}

/*
 * Milliseconds until the worker should look again for a runner (100) when a
 * step waits for one, or -1.  For the loop's sleep after a batch: a step
 * the batch lent (RunnerLend) came after this loop's RunnerPoll, and
 * nothing else need wake the worker for it: a worker that slept until a
 * runner finished left a role below its share waiting out the steps of one
 * above it, with no preemption.
 */
long
RunnerWaitMs(void)
{
	ListCell   *lc;

	foreach(lc, Worker.lent)
		if (((Lent *) lfirst(lc))->runner < 0)
			return 100;
	return -1;
}

/*
 * Has this flow a step at a runner?  Then no other step of it runs until
 * the runner is done: the runner works from the flow's committed steps, and
 * a step of the worker's meanwhile would make tokens the runner's copy
 * knows nothing of.
 */
bool
FlowIsLent(int64 flow_id)
{
	ListCell   *lc;

	foreach(lc, Worker.lent)
		if (((Lent *) lfirst(lc))->flow_id == flow_id)
			return true;
	return false;
}

/*
 * At a worker's start: the runners an earlier worker of this number (in
 * this database: the slot may differ) lent steps to may still run.  Their
 * steps stay lent until they finish, and then their runner slots are freed
 * (RunnerPoll).
 */
void
RunnerAdopt(void)
{
	int			i;

	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
	{
		DwarfRunnerSlot *slot = &Dwarf->runners[i];
		MemoryContext old;
		Lent	   *lent;

		SpinLockAcquire(&Dwarf->mutex);
		if (!slot->in_use || slot->dboid != MyDatabaseId ||
			slot->worker != Worker.slot->index)
		{
			SpinLockRelease(&Dwarf->mutex);
			continue;
		}
		SpinLockRelease(&Dwarf->mutex);
		old = MemoryContextSwitchTo(TopMemoryContext);
		lent = palloc0(sizeof(Lent));
		lent->flow_id = slot->flow_id;
		lent->token_id = slot->token_id;
		lent->role = slot->role;
		lent->runner = i;
		Worker.lent = lappend(Worker.lent, lent);
		MemoryContextSwitchTo(old);
	}
}
