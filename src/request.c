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
 * A slot's states: FREE -> SUBMITTED (the caller) -> TAKEN (a worker reads
 * it) -> DONE or FAILED (the worker's answer).  A worker whose transaction
 * rolled back gives a taken request back (TAKEN -> SUBMITTED).  A caller
 * past its deadline abandons a request no worker has taken; one that is
 * taken it waits for, so that no flow is created behind an error.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
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

/* Waits (briefly) for the worker that will own flow_id to be running. */
DwarfWorkerSlot *
RequestOwner(int64 flow_id)
{
	int			tries;

	if (Dwarf == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dwarf is not loaded through shared_preload_libraries"),
				 errhint("Add dwarf to shared_preload_libraries and restart the server.")));
	for (tries = 0; tries < 500; tries++)
	{
		DwarfWorkerSlot *slot = DwarfOwnerSlot(MyDatabaseId, flow_id);

		if (slot)
			return slot;
		Nap(10);
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("no dwarf worker is running in this database"),
			 errhint("Check max_worker_processes and the server log.")));
	return NULL;
}

/*
 * Makes our slot free for a new request.  One we gave up on may still be
 * being read by a worker: wait for its answer first.
 */
static DwarfRequest *
FreeSlot(void)
{
	DwarfRequest *req = &Dwarf->requests[MyProc->pgprocno];

	for (;;)
	{
		DwarfRequestState prev;

		SpinLockAcquire(&req->mutex);
		prev = req->state;
		if (prev != REQ_TAKEN)
			req->state = REQ_FREE;
		SpinLockRelease(&req->mutex);
		if (prev != REQ_TAKEN)
			return req;
		Nap(10);
	}
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
	size = offsetof(RunRequest, data) + KEY_OFFSET(&head) + head.keylen;
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
 * ours again (its state is DONE): the worker has finished writing it.
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

/*
 * Hands the create of flow_id to its owning worker, which commits it
 * (with other callers' creates, and usually the flow's first steps) and
 * answers.  Returns the flow's id: flow_id, or with an idempotency key the
 * owner already used, that flow's; and in *outcome, how the flow ended if
 * it closed in the create's commit and the worker could say so.
 */
int64
RequestCreate(DwarfWorkerSlot *owner, int64 flow_id, int32 graph_id, int32 priority,
			  text *key, Jsonb *input, Jsonb *options, TimestampTz deadline,
			  RunOutcome *outcome)
{
	DwarfRequest *req = FreeSlot();
	dsm_segment *seg;
	volatile int64 result = 0;
	char		errmsg_buf[sizeof(req->errmsg)];
	volatile int sqlerrcode = 0;
	volatile DwarfRequestState state = REQ_SUBMITTED;

	WriteBody(req, &seg, flow_id, graph_id, priority, key, input, options);
	SpinLockAcquire(&req->mutex);
	req->state = REQ_SUBMITTED;
	req->handle = seg ? dsm_segment_handle(seg) : DSM_HANDLE_INVALID;
	req->flow_id = 0;
	req->closed = false;
	SpinLockRelease(&req->mutex);

	PG_TRY();
	{
		while (!DwarfPushNote(owner, MyProc->pgprocno, NOTE_RUN_REQUEST))
			Nap(1);
		for (;;)
		{
			SpinLockAcquire(&req->mutex);
			state = req->state;
			result = req->flow_id;
			strlcpy(errmsg_buf, req->errmsg, sizeof(errmsg_buf));
			sqlerrcode = req->sqlerrcode;
			SpinLockRelease(&req->mutex);
			if (state != REQ_SUBMITTED && state != REQ_TAKEN)
				break;
			if (owner->pid == 0)
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("the dwarf worker exited before creating the flow")));

			/* Past the deadline, give up only on a request no worker has taken. */
			if (GetCurrentTimestamp() >= deadline)
			{
				bool		abandoned;

				SpinLockAcquire(&req->mutex);
				abandoned = req->state == REQ_SUBMITTED;
				if (abandoned)
					req->state = REQ_ABANDONED;
				SpinLockRelease(&req->mutex);
				if (abandoned)
					ereport(ERROR,
							(errcode(ERRCODE_QUERY_CANCELED),
							 errmsg("dwarf.run timed out before the engine created the flow"),
							 errdetail("No flow was created."),
							 errhint("The workers of this database may be overloaded or stuck; see dwarf.stats.")));
			}
			Nap(Min(1000, Max(10, TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
																	deadline))));
		}
	}
	PG_FINALLY();
	{
		SpinLockAcquire(&req->mutex);
		if (req->state != REQ_TAKEN)
		{
			req->state = REQ_FREE;
			req->handle = DSM_HANDLE_INVALID;
		}
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

/*
 * Takes the request of the caller with this pgprocno, if it is still
 * submitted (the caller may have given up).  The caller leaves the body
 * alone while it is taken; RequestRelease lets it go.
 */
bool
RequestTake(int procno, TakenRequest *taken)
{
	DwarfRequest *req = &Dwarf->requests[procno];
	dsm_handle	handle;
	bool		submitted;
	RunRequest *r;

	SpinLockAcquire(&req->mutex);
	submitted = req->state == REQ_SUBMITTED;
	if (submitted)
		req->state = REQ_TAKEN;
	handle = req->handle;
	SpinLockRelease(&req->mutex);
	if (!submitted)
		return false;
	taken->procno = procno;
	taken->seg = NULL;
	if (handle != DSM_HANDLE_INVALID && (taken->seg = dsm_attach(handle)) == NULL)
		return false;			/* the caller gave up: it answers itself */
	r = taken->seg ? dsm_segment_address(taken->seg) : (RunRequest *) req->body;
	taken->body = r;
	/* copies: the body is the caller's again once answered */
	taken->input = palloc(r->inputlen);
	memcpy(taken->input, r->data + INPUT_OFFSET, r->inputlen);
	taken->options = palloc(r->optionslen);
	memcpy(taken->options, r->data + OPTIONS_OFFSET(r), r->optionslen);
	taken->key = r->keylen > 0 ? cstring_to_text_with_len(r->data + KEY_OFFSET(r), r->keylen) : NULL;
	return true;
}

/* Done with a taken request's body (it is still taken until answered). */
void
RequestRelease(TakenRequest *taken)
{
	if (taken->seg)
		dsm_detach(taken->seg);
	taken->seg = NULL;
	taken->body = NULL;
}

/* A taken request whose create rolled back: it is to be taken again. */
void
RequestGiveBack(int procno)
{
	DwarfRequest *req = &Dwarf->requests[procno];

	SpinLockAcquire(&req->mutex);
	if (req->state == REQ_TAKEN)
		req->state = REQ_SUBMITTED;
	SpinLockRelease(&req->mutex);
}

/*
 * Answers a caller whose request we took: its flow's id, or (with edata)
 * why it was not created; with its outcome, when the flow closed in the
 * create's commit and the outcome fits in the slot's body (which the
 * request no longer needs, and which is ours while the request is taken).
 */
void
RequestAnswer(int procno, int64 flow_id, ErrorData *edata, const RunOutcome *outcome)
{
	DwarfRequest *req = &Dwarf->requests[procno];
	uint32		state_len = outcome && outcome->state ? VARSIZE(outcome->state) : 0;
	uint32		error_len = outcome && outcome->error ? strlen(outcome->error) : 0;
	bool		closed = outcome && outcome->closed && edata == NULL &&
		MAXALIGN(state_len) + error_len <= DWARF_INLINE_REQUEST;

	Assert(req->state == REQ_TAKEN);
	if (closed)
	{
		if (state_len)
			memcpy(req->body, outcome->state, state_len);
		if (error_len)
			memcpy(req->body + MAXALIGN(state_len), outcome->error, error_len);
	}
	SpinLockAcquire(&req->mutex);
	req->state = edata ? REQ_FAILED : REQ_DONE;
	req->flow_id = flow_id;
	req->sqlerrcode = edata ? edata->sqlerrcode : 0;
	strlcpy(req->errmsg, edata && edata->message ? edata->message : "", sizeof(req->errmsg));
	req->closed = closed;
	if (closed)
	{
		req->completed = outcome->completed;
		req->state_len = state_len;
		req->error_len = error_len;
	}
	SpinLockRelease(&req->mutex);
	SetLatch(&ProcGlobal->allProcs[procno].procLatch);
}
