/*
 * request.c
 *		dwarf.run's create requests, both ends.
 *
 * dwarf.run must commit its flow on its own (the caller may be in a
 * transaction it will roll back), and a backend cannot commit inside a
 * function call.  So the caller hands the create to the worker that will
 * own the flow: it writes the request into its slot in shared memory (or a
 * DSM segment, when large), pushes a note on the worker's ring naming its
 * pgprocno, and sleeps on its latch.  The worker takes the request, creates
 * the flow in its own transaction, and answers with the flow id once that
 * transaction is flushed (worker.c); the caller then awaits the flow.
 *
 * A slot's states: FREE -> SUBMITTED (the caller) -> TAKEN (a worker copies
 * it out and creates the flow) -> DONE or FAILED (the worker's answer).  A
 * worker whose transaction rolled back gives a taken request back (TAKEN ->
 * SUBMITTED), and so does one that exits before its create committed
 * (RequestGiveBackAll, from its exit callback): the caller then tells the
 * worker that runs next.
 *
 * Either end may go away at any time and no slot is left behind.  Each
 * request has a generation, and a worker's answer or give-back counts only
 * for the generation it took; a worker copies a request out whole when it
 * takes it (a large one's segment stays mapped for it).  So a caller that
 * gives up (its deadline, an error, its exit) frees its slot at once, and
 * its next request never waits for an earlier one.  A worker that finds a
 * request's segment gone knows its caller left.  A caller watches the
 * worker that took its request: one that exited without answering (a
 * crash does not, since the whole server restarts) is reported, not
 * waited for.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/builtins.h"

#include "dwarf.h"
#include "shmem.h"
#include "request.h"

/* Where a request's parts lie in its body: input, options, then the key. */
#define INPUT_OFFSET			0
#define OPTIONS_OFFSET(r)		MAXALIGN((r)->inputlen)
#define KEY_OFFSET(r)			(OPTIONS_OFFSET(r) + MAXALIGN((r)->optionslen))

/* Sleeps on the latch for up to ms, then checks for interrupts. */
static void
Nap(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms,
					 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

/* ---------- the caller's end ---------- */

/* The size of a request's body, from its head. */
static Size
BodySize(const RunRequest *r)
{
	return offsetof(RunRequest, data) + KEY_OFFSET(r) + r->keylen;
}

/*
 * before_shmem_exit: a caller that exits (terminated while it waited, say)
 * leaves its request, so that no worker creates a flow for it after all,
 * and the next backend in its place finds the slot free.
 */
static void
LeaveAtExit(int code, Datum arg)
{
	DwarfRequest *req = &Dwarf->requests[GetNumberFromPGProc(MyProc)];

	SpinLockAcquire(&req->mutex);
	req->state = REQ_FREE;
	SpinLockRelease(&req->mutex);
}

/* Writes the request's body: in the slot when it fits, else in DSM (*seg). */
static void
WriteBody(DwarfRequest *req, dsm_segment **seg, int64 flow_id, int32 graph_id,
		  int32 priority, text *key, Jsonb *input, Jsonb *options)
{
	RunRequest	head;
	RunRequest *r;
	Size		size;

	head.flow_id = flow_id;
	head.graph_id = graph_id;
	head.owner = GetUserId();
	head.priority = priority;
	head.keylen = key ? VARSIZE_ANY_EXHDR(key) : 0;
	head.inputlen = VARSIZE(input);
	head.optionslen = VARSIZE(options);
	size = BodySize(&head);
	if (size <= DWARF_INLINE_REQUEST)
	{
		*seg = NULL;
		r = (RunRequest *) req->body;
	}
	else
	{
		*seg = dsm_create(size, 0);
		r = dsm_segment_address(*seg);
	}
	memcpy(r, &head, offsetof(RunRequest, data));
	memcpy(r->data + INPUT_OFFSET, input, head.inputlen);
	memcpy(r->data + OPTIONS_OFFSET(&head), options, head.optionslen);
	if (head.keylen)
		memcpy(r->data + KEY_OFFSET(&head), VARDATA_ANY(key), head.keylen);
}

/*
 * Copies the outcome the worker left with its answer, if any.  The slot is
 * ours again: no worker writes to a slot whose request it no longer holds.
 */
static void
ReadOutcome(DwarfRequest *req, RunOutcome *outcome)
{
	memset(outcome, 0, sizeof(RunOutcome));
	if (!req->closed)
		return;
	outcome->closed = true;
	outcome->completed = req->completed;
	if (req->state_len > 0)
	{
		outcome->state = palloc(req->state_len);
		memcpy(outcome->state, req->body, req->state_len);
	}
	if (req->error_len > 0)
		outcome->error = pnstrdup(req->body + MAXALIGN(req->state_len), req->error_len);
}

/* Is pid a dwarf worker that still runs (it clears its slot's pid as it exits)? */
static bool
WorkerRuns(pid_t pid)
{
	int			i;

	for (i = 0; i < DWARF_MAX_WORKERS; i++)
		if (pid != 0 && Dwarf->workers[i].pid == pid)
			return true;
	return false;
}

/*
 * Past the deadline, or when the worker that took the request exited
 * without answering: leaves the request and says why.  Returns only when
 * an answer came first (the state, re-read, is DONE or FAILED).
 */
static DwarfRequestState
GiveUp(DwarfRequest *req, int64 flow_id, bool worker_runs, bool taker_gone)
{
	DwarfRequestState state;

	SpinLockAcquire(&req->mutex);
	state = req->state;
	if (state == REQ_SUBMITTED || state == REQ_TAKEN)
		req->state = REQ_FREE;
	SpinLockRelease(&req->mutex);

	if (state == REQ_SUBMITTED && !worker_runs)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("no dwarf worker is running in this database"),
				 errdetail("dwarf.run timed out before a worker could create its flow; no flow was created."),
				 errhint("Check max_worker_processes and the server log.")));
	if (state == REQ_SUBMITTED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("dwarf.run timed out before the engine took its create"),
				 errdetail("No flow was created."),
				 errhint("The workers of this database may be busy or stuck (see dwarf.stats); retry, or give dwarf.run a longer timeout.")));
	if (state == REQ_TAKEN)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_STATEMENT_COMPLETION_UNKNOWN),
				 taker_gone ?
				 errmsg("the dwarf worker creating flow " INT64_FORMAT " exited before it answered",
						flow_id) :
				 errmsg("dwarf.run timed out while the engine was creating flow " INT64_FORMAT,
						flow_id),
				 errdetail("The flow may or may not have been created."),
				 errhint("dwarf.await(" INT64_FORMAT ", '0 s') says whether it exists; with an idempotency key, dwarf.run with the same key finds it.",
						 flow_id)));
	return state;
}

/*
 * Hands the create of flow_id to its owning worker, which commits it
 * (with other callers' creates, and usually the flow's first steps) and
 * answers.  Returns the flow's id: flow_id, or with an idempotency key the
 * owner already used, that flow's; and in *outcome, how the flow ended if
 * it closed in the create's commit and the worker could say so.  Raises an
 * error by the deadline if no answer came, saying whether the flow may
 * still be created.
 */
int64
RequestCreate(int64 flow_id, int32 graph_id, int32 priority, text *key, Jsonb *input,
			  Jsonb *options, TimestampTz deadline, RunOutcome *outcome)
{
	static bool leaves_at_exit = false;
	DwarfRequest *req;
	dsm_segment *seg;
	volatile int64 result = 0;
	char		errmsg_buf[sizeof(req->errmsg)];
	volatile int sqlerrcode = 0;
	volatile DwarfRequestState state = REQ_SUBMITTED;

	if (Dwarf == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dwarf is not loaded through shared_preload_libraries"),
				 errhint("Add dwarf to shared_preload_libraries and restart the server.")));
	req = &Dwarf->requests[GetNumberFromPGProc(MyProc)];
	if (!leaves_at_exit)
	{
		before_shmem_exit(LeaveAtExit, (Datum) 0);
		leaves_at_exit = true;
	}

	/*
	 * A new generation: a worker still holding an earlier request of ours
	 * can no longer answer into the slot, and no worker reads a free one.
	 */
	SpinLockAcquire(&req->mutex);
	req->state = REQ_FREE;
	req->generation++;
	SpinLockRelease(&req->mutex);
	WriteBody(req, &seg, flow_id, graph_id, priority, key, input, options);
	SpinLockAcquire(&req->mutex);
	req->owner = GetUserId();
	req->state = REQ_SUBMITTED;
	req->taker = 0;
	req->handle = seg ? dsm_segment_handle(seg) : DSM_HANDLE_INVALID;
	req->flow_id = 0;
	req->closed = false;
	SpinLockRelease(&req->mutex);

	PG_TRY();
	{
		pid_t		told = 0;	/* the worker our note went to */

		for (;;)
		{
			DwarfWorkerSlot *owner = DwarfOwnerSlot(MyDatabaseId, flow_id);
			pid_t		owner_pid = owner ? owner->pid : 0;
			pid_t		taker;
			long		remaining;

			SpinLockAcquire(&req->mutex);
			state = req->state;
			taker = req->taker;
			result = req->flow_id;
			strlcpy(errmsg_buf, req->errmsg, sizeof(errmsg_buf));
			sqlerrcode = req->sqlerrcode;
			SpinLockRelease(&req->mutex);
			if (state == REQ_DONE || state == REQ_FAILED)
				break;

			/*
			 * Tell the owner, and tell it again when another worker took
			 * its place: a worker that exits gives back what it took.
			 */
			if (state == REQ_SUBMITTED && owner_pid != 0 && owner_pid != told &&
				DwarfPushNote(owner, GetNumberFromPGProc(MyProc), NOTE_RUN_REQUEST))
				told = owner_pid;
			if (state == REQ_TAKEN && !WorkerRuns(taker))
			{
				bool		orphaned;

				/* re-read: it exits after giving back what it took */
				SpinLockAcquire(&req->mutex);
				orphaned = req->state == REQ_TAKEN && req->taker == taker;
				SpinLockRelease(&req->mutex);
				if (orphaned)
					state = GiveUp(req, flow_id, false, true);
				continue;
			}
			remaining = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
			if (remaining <= 0)
			{
				state = GiveUp(req, flow_id, owner_pid != 0, false);
				continue;
			}
			/* the answer, a give-back and a note all set our latch */
			Nap(state == REQ_SUBMITTED && told != owner_pid ? Min(remaining, 10) :
				Min(remaining, 1000));
		}
	}
	PG_FINALLY();
	{
		SpinLockAcquire(&req->mutex);
		req->state = REQ_FREE;
		req->handle = DSM_HANDLE_INVALID;
		SpinLockRelease(&req->mutex);
		if (seg)
			dsm_detach(seg);
	}
	PG_END_TRY();

	if (state == REQ_FAILED)
		ereport(ERROR,
				(errcode(sqlerrcode ? sqlerrcode : ERRCODE_INTERNAL_ERROR),
				 errmsg("dwarf could not create the flow: %s", errmsg_buf)));
	ReadOutcome(req, outcome);
	return result;
}

/* ---------- the worker's end ---------- */

/* Frees the slot of a request whose caller left, if it is still the one we took. */
static void
Forget(int procno, uint32 generation)
{
	DwarfRequest *req = &Dwarf->requests[procno];

	SpinLockAcquire(&req->mutex);
	if (req->state == REQ_TAKEN && req->generation == generation)
		req->state = REQ_FREE;
	SpinLockRelease(&req->mutex);
}

/*
 * The role of a caller's request, while it waits to be taken (else
 * InvalidOid): the worker creates a role's flows in that role's batch.
 */
Oid
RequestOwner(int procno)
{
	DwarfRequest *req = &Dwarf->requests[procno];
	Oid			owner;

	SpinLockAcquire(&req->mutex);
	owner = req->state == REQ_SUBMITTED ? req->owner : InvalidOid;
	SpinLockRelease(&req->mutex);
	return owner;
}

/*
 * Takes the request of the caller with this pgprocno, if it is still
 * submitted (the caller may have given up), and copies its parts out: a
 * request in the slot is copied whole under the slot's lock, one in DSM
 * is read from the caller's segment, which stays mapped for us.  The
 * request stays taken until answered or given back.
 */
bool
RequestTake(int procno, TakenRequest *taken)
{
	DwarfRequest *req = &Dwarf->requests[procno];
	char	   *copy = palloc(DWARF_INLINE_REQUEST);
	dsm_handle	handle = DSM_HANDLE_INVALID;
	bool		submitted;
	RunRequest *volatile r = NULL;

	SpinLockAcquire(&req->mutex);
	submitted = req->state == REQ_SUBMITTED;
	if (submitted)
	{
		req->state = REQ_TAKEN;
		req->taker = MyProcPid;
		taken->generation = req->generation;
		handle = req->handle;
		/* a bounded copy, as the walreceiver copies its conninfo under its spinlock */
		if (handle == DSM_HANDLE_INVALID)
			memcpy(copy, req->body,
				   Min(BodySize((RunRequest *) req->body), DWARF_INLINE_REQUEST));
	}
	SpinLockRelease(&req->mutex);
	if (!submitted || handle != DSM_HANDLE_INVALID)
		pfree(copy);
	if (!submitted)
		return false;
	taken->procno = procno;
	taken->seg = NULL;
	PG_TRY();
	{
		if (handle == DSM_HANDLE_INVALID)
			r = (RunRequest *) copy;
		else if ((taken->seg = dsm_attach(handle)) != NULL)
			r = dsm_segment_address(taken->seg);
		if (r != NULL)
		{
			taken->body = r;
			taken->input = palloc(r->inputlen);
			memcpy(taken->input, r->data + INPUT_OFFSET, r->inputlen);
			taken->options = palloc(r->optionslen);
			memcpy(taken->options, r->data + OPTIONS_OFFSET(r), r->optionslen);
			taken->key = r->keylen > 0 ?
				cstring_to_text_with_len(r->data + KEY_OFFSET(r), r->keylen) : NULL;
		}
	}
	PG_CATCH();
	{
		RequestGiveBack(procno, taken->generation);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (r == NULL)
	{
		/* its segment is gone: the caller left, its slot is free */
		Forget(procno, taken->generation);
		return false;
	}
	return true;
}

/* Done with a taken request's body (it is still taken until answered). */
void
RequestRelease(TakenRequest *taken)
{
	if (taken->seg)
		dsm_detach(taken->seg);
	else if (taken->body)
		pfree(taken->body);
	taken->seg = NULL;
	taken->body = NULL;
}

/* Makes a taken request submitted again, waking its caller. */
static void
GiveBack(int procno, uint32 generation, bool any_generation)
{
	DwarfRequest *req = &Dwarf->requests[procno];
	bool		given = false;

	SpinLockAcquire(&req->mutex);
	if (req->state == REQ_TAKEN &&
		(any_generation ? req->taker == MyProcPid : req->generation == generation))
	{
		req->state = REQ_SUBMITTED;
		req->taker = 0;
		given = true;
	}
	SpinLockRelease(&req->mutex);
	if (given)
		SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}

/* A taken request whose create rolled back: it is to be taken again. */
void
RequestGiveBack(int procno, uint32 generation)
{
	GiveBack(procno, generation, false);
}

/*
 * A worker that exits gives back every request it took and has not
 * answered (answer the committed ones first): their creates roll back
 * with it, and their callers hand them to the worker that runs next.
 */
void
RequestGiveBackAll(void)
{
	int			i;

	if (Dwarf == NULL)
		return;
	for (i = 0; i < Dwarf->nprocs; i++)
		GiveBack(i, 0, true);
}

/*
 * Answers a caller whose request we took: its flow's id, or (with edata)
 * why it was not created; with its outcome, when the flow closed in the
 * create's commit and the outcome fits in the slot's body.  A caller that
 * left, or has a newer request, is not answered.  The body is written
 * under the slot's lock (a bounded copy), since the caller may leave at
 * any time.
 */
void
RequestAnswer(int procno, uint32 generation, int64 flow_id, ErrorData *edata,
			  const RunOutcome *outcome)
{
	DwarfRequest *req = &Dwarf->requests[procno];
	uint32		state_len = outcome && outcome->state ? VARSIZE(outcome->state) : 0;
	uint32		error_len = outcome && outcome->error ? strlen(outcome->error) : 0;
	bool		closed = outcome && outcome->closed && edata == NULL &&
		MAXALIGN(state_len) + error_len <= DWARF_INLINE_REQUEST;
	bool		answered;

	SpinLockAcquire(&req->mutex);
	answered = req->state == REQ_TAKEN && req->generation == generation;
	if (answered)
	{
		if (closed && state_len)
			memcpy(req->body, outcome->state, state_len);
		if (closed && error_len)
			memcpy(req->body + MAXALIGN(state_len), outcome->error, error_len);
		req->state = edata ? REQ_FAILED : REQ_DONE;
		req->taker = 0;
		req->flow_id = flow_id;
		req->sqlerrcode = edata ? edata->sqlerrcode : 0;
		strlcpy(req->errmsg, edata && edata->message ? edata->message : "",
				sizeof(req->errmsg));
		req->closed = closed;
		if (closed)
		{
			req->completed = outcome->completed;
			req->state_len = state_len;
			req->error_len = error_len;
		}
	}
	SpinLockRelease(&req->mutex);
	if (answered)
		SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}
