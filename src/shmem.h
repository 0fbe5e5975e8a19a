/*
 * shmem.h
 *		dwarf's shared memory (shmem.c): worker slots and their note rings,
 *		await waiters, dwarf.run's requests, runner slots and the roles
 *		waiting for them, slow tasks.
 */
#ifndef DWARF_SHMEM_H
#define DWARF_SHMEM_H

#include "port/atomics.h"
#include "storage/dsm.h"
#include "storage/latch.h"
#include "storage/spin.h"

#include "dwarf.h"

/* ---------- shared memory (shmem.c) ---------- */

#define DWARF_MAX_WORKERS	64
/*
 * Notes a worker's ring holds (16 bytes each).  A burst of creates beyond it
 * sets the overflow flag, and the worker then rescans its flows and replays
 * each one it loads in the next ten seconds: wide enough that one
 * statement's 8,000 creates on two workers never come to that.
 */
#define DWARF_RING_SIZE		8192

typedef enum DwarfNoteKind
{
	NOTE_NEW_FLOW,				/* a committed create: load the flow */
	NOTE_RELOAD_FLOW,			/* status changed outside (cancel): reload */
	NOTE_RUN_REQUEST,			/* flow_id is the pgprocno of a dwarf.run caller */
	NOTE_CANCEL_FLOW,			/* cancelled: stop its running step, and reload */
	NOTE_CANCEL_TREE,			/* flows of the tree whose top is flow_id were
								 * cancelled: drop them (to every worker) */
	NOTE_TREE_CAP				/* the tree whose top is flow_id met
								 * dwarf.max_tree_flows: fail it */
} DwarfNoteKind;

typedef struct DwarfNote
{
	int64		flow_id;
	int32		kind;
} DwarfNote;

/* One in-server worker.  The launcher assigns slots; the worker fills pid. */
typedef struct DwarfWorkerSlot
{
	Oid			dboid;			/* InvalidOid when the slot is free */
	int			index;			/* worker number within its database */
	pid_t		pid;			/* 0 until the worker runs */
	Latch	   *latch;			/* the worker's latch while it runs */
	bool		no_extension;	/* it exited: dwarf is not installed there */
	bool		replaced;		/* it exited to be replaced at once (session.c) */
	volatile int32 best_priority;	/* of its ready steps; PG_INT32_MAX: none */
	volatile int32 running_priority;	/* best of the batch it runs, or PG_INT32_MAX */

	slock_t		mutex;			/* protects the ring */
	uint32		head;			/* next note to read */
	uint32		tail;			/* next free place */
	bool		overflow;		/* notes were dropped: rescan the table */
	DwarfNote	ring[DWARF_RING_SIZE];

	/* counters, written by the worker only */
	pg_atomic_uint64 flows_loaded;
	pg_atomic_uint64 ready;
	pg_atomic_uint64 steps;
	pg_atomic_uint64 steps_failed;
	pg_atomic_uint64 flows_closed;
	pg_atomic_uint64 batches;
	pg_atomic_uint64 aborted_batches;

	/* what dwarf.health shows, written by the worker's loop (worker.c) */
	volatile int32 timers;		/* steps waiting for a timer, sleepers too */
	volatile int32 poison_steps;	/* this database's steps blamed for
									 * crashes (crashes.c) */
} DwarfWorkerSlot;

typedef enum DwarfRequestState
{
	REQ_FREE = 0,				/* the caller's: no request, or one it left */
	REQ_SUBMITTED,				/* for a worker to take */
	REQ_TAKEN,					/* a worker (taker) is creating it */
	REQ_DONE,					/* answered: the flow exists */
	REQ_FAILED					/* answered: it was not created */
} DwarfRequestState;

/* Requests up to this size travel in the slot; larger ones in DSM. */
#define DWARF_INLINE_REQUEST	2048

/*
 * A dwarf.run caller's create request, one per backend (by pgprocno).
 * Every field is read and written under mutex.  generation names the
 * request: the caller bumps it for each new one, and a worker's answer or
 * give-back counts only for the generation it took, so a caller may leave
 * a request at any time and reuse its slot at once.
 */
typedef struct DwarfRequest
{
	slock_t		mutex;
	DwarfRequestState state;
	uint32		generation;		/* of the request in the slot */
	pid_t		taker;			/* the worker that took it, while taken */
	Oid			owner;			/* the caller's role: the new flow's owner */
	dsm_handle	handle;			/* a RunRequest in DSM, or DSM_HANDLE_INVALID */
	int64		flow_id;		/* the flow to await (set when done) */
	int			sqlerrcode;		/* why it failed (set when failed) */
	char		errmsg[256];
	/* when done: the flow's outcome, if it closed in the create's commit */
	bool		closed;			/* the rest is set, and body holds them */
	bool		completed;		/* else failed */
	uint32		state_len;		/* bytes of the final state (jsonb), 0: none */
	uint32		error_len;		/* bytes of the error, 0: none */
	char		body[DWARF_INLINE_REQUEST] pg_attribute_aligned(MAXIMUM_ALIGNOF);	/* or here */
} DwarfRequest;

/* The body of a run request, in the slot or a DSM segment (request.c). */
typedef struct RunRequest
{
	int64		flow_id;
	int32		graph_id;
	Oid			owner;
	int32		priority;
	int32		keylen;			/* idempotency key bytes, 0 if none */
	Size		inputlen;		/* bytes of the flat jsonb input */
	Size		optionslen;		/* bytes of the flat jsonb options */
	char		data[FLEXIBLE_ARRAY_MEMBER];	/* input, options (jsonb, aligned), key */
} RunRequest;

/*
 * A runner: a background worker started to run one slow step (runner.c).
 * The lending worker fills the slot; the runner sets pid, then done once
 * its step has committed (or it found nothing to run).
 */
#define DWARF_MAX_RUNNERS	64

typedef struct DwarfRunnerSlot
{
	bool		in_use;			/* under DwarfShared.mutex */
	bool		preempted;		/* under DwarfShared.mutex: stopped to make
								 * room for another role's step (lend.c) */
	Oid			dboid;
	Oid			role;			/* the flow's owner, whose share it counts in */
	int			worker;			/* the lender's number in its database (its slot's
								 * index): a restarted lender may get another
								 * slot, and adopts its runners by this */
	int64		flow_id;
	int32		token_id;
	TimestampTz lent_at;
	slock_t		mutex;			/* protects pid and done */
	pid_t		pid;
	bool		done;
} DwarfRunnerSlot;

/* Tasks found slow lately, for every worker of their database (lend.c). */
#define DWARF_SLOW_TASKS	256

typedef struct DwarfSlowTask
{
	Oid			dboid;			/* InvalidOid: free */
	Oid			fn;				/* a task of that database found slow */
	bool		own_process;	/* or one that leaves state in its process
								 * (session.c): it stays, however quick */
	TimestampTz noted_at;		/* when; the oldest goes first when full */
} DwarfSlowTask;

/*
 * The roles whose slow steps wait for a runner at one worker, as it last
 * said (lend.c), by worker slot.  Stale once that worker is gone (pid) or
 * has not said it again for a while (at).
 */
#define DWARF_WAIT_ROLES	8

typedef struct DwarfLendWaits
{
	pid_t		pid;			/* the worker that wrote it */
	TimestampTz at;				/* when */
	int			nroles;
	Oid			roles[DWARF_WAIT_ROLES];
} DwarfLendWaits;

typedef struct DwarfShared
{
	slock_t		mutex;			/* protects the launcher fields */
	Latch	   *launcher_latch;
	bool		rescan;			/* a database created or dropped dwarf */
	bool		crashes_checked;	/* crashes.c checked its file since this
									 * memory was made (under
									 * AddinShmemInitLock) */

	DwarfWorkerSlot workers[DWARF_MAX_WORKERS];
	DwarfRunnerSlot runners[DWARF_MAX_RUNNERS];
	DwarfLendWaits lend_waits[DWARF_MAX_WORKERS];	/* under mutex */

	/*
	 * Runners that could really start, as last seen (lend.c): how many were
	 * in use when a runner's background worker could not be registered
	 * (max_worker_processes was short), seen at runner_room_at (0: no
	 * failure lately, dwarf.max_runners holds).  Under mutex.
	 */
	int			runner_room;
	TimestampTz runner_room_at;

	slock_t		slow_mutex;
	pg_atomic_uint32 slow_epoch;	/* bumped at every change of slow[] */
	DwarfSlowTask slow[DWARF_SLOW_TASKS];

	/* indexed by pgprocno; sized by MaxBackends + aux processes */
	int			nprocs;
	pg_atomic_uint64 *waiting;	/* flow a backend awaits, 0 for none */
	DwarfRequest *requests;
} DwarfShared;

extern DwarfShared *Dwarf;

extern void DwarfShmemRequest(void);
extern void DwarfShmemStartup(void);
extern DwarfWorkerSlot *DwarfOwnerSlot(Oid dboid, int64 flow_id);
extern DwarfWorkerSlot *DwarfWorkerSlotOf(Oid dboid, int index);
extern bool DwarfPushNote(DwarfWorkerSlot *slot, int64 flow_id, DwarfNoteKind kind);
extern void DwarfWakeLauncher(void);
extern void DwarfWakeWaiters(int64 *flow_ids, int n);
extern int	DwarfWorkerOf(int64 flow_id);

#endif							/* DWARF_SHMEM_H */
