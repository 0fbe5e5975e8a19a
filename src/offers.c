/*
 * offers.c
 *		Steps of external tasks, offered in shared memory to the workers
 *		outside the server that dwarf.claim serves.
 *
 * A flow's worker publishes a step of an external task once the commit
 * that led to it is durable: the step's key (database, flow, branch), the
 * branch's visit and attempt, the flow's owner, and the step's input state
 * and baggage, kept in a dynamic shared area (DSA).  A claim leases ready
 * steps of a queue, first offered first, writing nothing: the lease lives
 * here only, so a claim needs no commit, and one lost in a crash only means
 * the step is offered again.  A complete or fail marks the lease answering
 * with its transaction id before it writes the answer's row, so that the
 * lease cannot run out under an answer being committed, and a second
 * answer is refused: the lease is fenced while the first one's transaction
 * is in progress, and ended once it committed.  The flow's worker sweeps
 * its offers: a lease run out becomes a failed attempt (the worker records
 * it), an answer rolled back gives the lease back.
 *
 * Leases are numbers drawn from a counter that starts, at every start of
 * the server, at a random point of 2^62: a lease of before a restart is
 * unknown after it (a collision would take billions of claims).  A lease
 * that ended is remembered for DWARF_LEASE_MEMORY_MS, so that a late
 * complete hears why it is refused.
 *
 * The tables are of fixed size, allocated at start from the settings
 * (dwarf.max_external_steps, four leases an offer, DWARF_MAX_QUEUES), so
 * that they never take the shared memory the lock table may need.  The
 * offers, and the bytes of dwarf.external_memory their data takes, are
 * shared by the roles that own some (RoleShare): one role's backlog, of
 * many steps or of large inputs, waits in its flows, and another role
 * below its share always finds room.  Nothing is offered and nothing
 * withdrawn inside a transaction: a batch that rolls back leaves them as
 * its flows' rows say.
 * A queue goes when nothing uses it, and a dropped database's offers,
 * leases and queues with it (OffersForgetDatabase).
 *
 * One LWLock guards it all; what it covers is short (hash lookups, list
 * moves, copying one step's input out).
 */
#include "postgres.h"

#include "access/xact.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "port/pg_bitutils.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/dsa.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

#include "dwarf.h"
#include "limits.h"
#include "offers.h"
#include "shmem.h"

/*
 * How long a lease that ended is remembered, for the errors of late
 * answers (or less, when the table of leases fills up).
 */
#define DWARF_LEASE_MEMORY_MS	(10 * 60 * 1000)

/* The first part of the shared area, in the main shared memory. */
#define DWARF_OFFER_AREA_SIZE	(1024 * 1024)

/*
 * Sweeps (a second apart) an offer's flow may be out of memory before its
 * worker looks it up in the table (OffersSweep's absent).
 */
#define DWARF_ABSENT_SWEEPS	10

/* Most queues a server keeps at once (claims wait on them). */
#define DWARF_MAX_QUEUES	1024

typedef struct OfferQueueKey
{
	Oid			dboid;
	char		name[NAMEDATALEN];
} OfferQueueKey;

/*
 * A queue: its ready steps, oldest first, and the claims waiting on it.  It
 * goes once no offer and no claim uses it (DropQueueIfUnused), so that
 * claims on made-up names leave nothing behind; the HTTP process's queue
 * (watched) stays.
 */
typedef struct OfferQueue
{
	OfferQueueKey key;
	dlist_head	ready;
	int			nlimited;		/* of the ready, those whose task names a limit */
	int			noffers;		/* offers of any state on it */
	int			nwaiting;		/* claims waiting on it (OffersWait) */
	bool		watched;		/* the HTTP process waits on it (OffersWatch) */
	ConditionVariable cv;
} OfferQueue;

/* An offered step. */
typedef struct Offer
{
	OfferKey	key;
	OfferState	state;
	int32		visits;
	int32		attempt;
	Oid			owner;
	int32		priority;
	OfferQueue *queue;
	char		graph[NAMEDATALEN];
	char		task[NAMEDATALEN];
	int64		lease_us;
	dsa_pointer data;			/* input, baggage, call (flat jsonb each), then
								 * the limits (LimitsFlatten) */
	Size		input_len;
	Size		baggage_len;	/* 0: none */
	Size		call_len;		/* 0: none (not an HTTP task) */
	Size		limits_len;		/* 0: none */
	int			nlimits;		/* the named limits a claim takes */
	bool		limit_taken;	/* its lease holds a place of each */
	dlist_node	in_queue;		/* while ready */
	int64		lease;			/* while leased, answering or expired */
	TimestampTz leased_at;
	TimestampTz lease_until;
	TransactionId xid;			/* while answering */
	int			absent;			/* sweeps that found its flow out of memory */
	dlist_node	in_answered;	/* while on OffersShared.answered */
	bool		on_answered;
} Offer;

/*
 * A role's offers: the pool of dwarf.max_external_steps, and the bytes of
 * dwarf.external_memory their inputs, baggage, calls and limits take, are
 * shared by the roles that own offered steps (RoleShare).
 */
typedef struct OfferRole
{
	Oid			role;
	int			offers;
	Size		bytes;			/* of its offers in the area */
} OfferRole;

/* A lease, held or ended. */
typedef struct Lease
{
	int64		lease;
	OfferKey	key;
	LeaseEnd	end;			/* LEASE_HELD while its offer holds it */
	TimestampTz ended_at;
} Lease;

typedef struct OffersShared
{
	LWLock	   *lock;
	int			area_tranche;
	uint64		next_lease;
	Size		bytes;			/* of inputs and baggage in the area */
	dlist_head	answered;		/* offers being answered, for their workers to
								 * take once the answer committed */
	volatile int nanswered;		/* how many: read unlocked, as a hint */
	pg_atomic_uint64 http_ended;	/* leases of HTTP calls ended under them
									 * (withdrawn, run out): the HTTP process
									 * aborts those calls (OffersHttpEnded) */
	int			nroles;			/* entries of RoleTable (roles with offers) */
	char		area[FLEXIBLE_ARRAY_MEMBER];	/* DWARF_OFFER_AREA_SIZE */
} OffersShared;

static OffersShared *Offers = NULL;
static HTAB *OfferTable = NULL;
static HTAB *LeaseTable = NULL;
static HTAB *QueueTable = NULL;
static HTAB *RoleTable = NULL;
static dsa_area *Area = NULL;

/* Has this process offers to sweep (it offered, or its last sweep found some)? */
static bool OwnOffers = false;

static int
MaxLeases(void)
{
	return dwarf_max_external_steps * 4;
}

/* Roles that may own offers at once: one an offer at most. */
static int
MaxOfferRoles(void)
{
	return Min(dwarf_max_external_steps, 4096);
}

static Size
OffersSize(void)
{
	Size		size = MAXALIGN(offsetof(OffersShared, area) + DWARF_OFFER_AREA_SIZE);

	size = add_size(size, hash_estimate_size(dwarf_max_external_steps, sizeof(Offer)));
	size = add_size(size, hash_estimate_size(MaxLeases(), sizeof(Lease)));
	size = add_size(size, hash_estimate_size(DWARF_MAX_QUEUES, sizeof(OfferQueue)));
	size = add_size(size, hash_estimate_size(MaxOfferRoles(), sizeof(OfferRole)));
	return size;
}

/* shmem_request_hook's part: the tables and the lock. */
void
OffersShmemRequest(void)
{
	RequestAddinShmemSpace(OffersSize());
	RequestNamedLWLockTranche("dwarf offers", 1);
}

/* shmem_startup_hook's part: lays the tables out, and the shared area. */
void
OffersShmemStartup(void)
{
	bool		found;
	HASHCTL		ctl;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	Offers = ShmemInitStruct("dwarf offers",
							 MAXALIGN(offsetof(OffersShared, area) + DWARF_OFFER_AREA_SIZE),
							 &found);
	if (!found)
	{
		dsa_area   *area;
		uint64		start;

		Offers->lock = &(GetNamedLWLockTranche("dwarf offers"))->lock;
		Offers->area_tranche = LWLockNewTrancheId();
		if (!pg_strong_random(&start, sizeof(start)))
			start = (uint64) GetCurrentTimestamp();
		Offers->next_lease = (start & ((UINT64CONST(1) << 62) - 1)) + 1;
		Offers->bytes = 0;
		dlist_init(&Offers->answered);
		Offers->nanswered = 0;
		pg_atomic_init_u64(&Offers->http_ended, 0);
		Offers->nroles = 0;
		area = dsa_create_in_place(Offers->area, DWARF_OFFER_AREA_SIZE,
								   Offers->area_tranche, NULL);
		dsa_pin(area);
		dsa_detach(area);
	}
	/*
	 * Fixed-size tables, all allocated now: full, an insert fails (and the
	 * setting is named in what follows), rather than take the shared
	 * memory that the lock table may need.
	 */
	ctl.keysize = sizeof(OfferKey);
	ctl.entrysize = sizeof(Offer);
	OfferTable = ShmemInitHash("dwarf offered steps", dwarf_max_external_steps,
							   dwarf_max_external_steps, &ctl,
							   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(Lease);
	LeaseTable = ShmemInitHash("dwarf leases", MaxLeases(), MaxLeases(), &ctl,
							   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ctl.keysize = sizeof(OfferQueueKey);
	ctl.entrysize = sizeof(OfferQueue);
	QueueTable = ShmemInitHash("dwarf offer queues", DWARF_MAX_QUEUES, DWARF_MAX_QUEUES,
							   &ctl, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(OfferRole);
	RoleTable = ShmemInitHash("dwarf offer roles", MaxOfferRoles(), MaxOfferRoles(),
							  &ctl, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* The shared area, attached once per process. */
static dsa_area *
OfferArea(void)
{
	if (Area == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		LWLockRegisterTranche(Offers->area_tranche, "dwarf offer inputs");
		Area = dsa_attach_in_place(Offers->area, NULL);
		dsa_pin_mapping(Area);
		MemoryContextSwitchTo(old);
	}
	return Area;
}

/* A queue of this database, made on first use (NULL: too many queues). */
static OfferQueue *
FindQueue(const char *name, bool create)
{
	OfferQueueKey key;
	OfferQueue *queue;
	bool		found;

	memset(&key, 0, sizeof(key));
	key.dboid = MyDatabaseId;
	strlcpy(key.name, name, NAMEDATALEN);
	queue = hash_search(QueueTable, &key, create ? HASH_ENTER_NULL : HASH_FIND, &found);
	if (queue && !found)
	{
		dlist_init(&queue->ready);
		queue->nlimited = 0;
		queue->noffers = 0;
		queue->nwaiting = 0;
		queue->watched = false;
		ConditionVariableInit(&queue->cv);
	}
	return queue;
}

/*
 * Removes a queue that no offer and no claim uses any more (under the
 * lock, exclusive).  A broadcast on it that comes late finds its entry on
 * the table's free list, unchanged, or another queue's: a spurious wake-up
 * at most.
 */
static void
DropQueueIfUnused(OfferQueue *queue)
{
	if (queue->noffers == 0 && queue->nwaiting == 0 && !queue->watched)
		hash_search(QueueTable, &queue->key, HASH_REMOVE, NULL);
}

/*
 * May a step of role, whose data takes len bytes, be offered, by its share
 * of dwarf.max_external_steps and of dwarf.external_memory?  A role holds
 * at most max / (other roles with offers + 2) of each: with n roles at
 * their share, max / (n + 1) stays free, more than a newcomer's share
 * (max / (n + 2)), so that a role below its share always finds room for
 * its next offer whatever the others hold (of memory: for an offer that
 * fits in what its share leaves it).  Every role with offers has bytes
 * (an input is never empty), so the same roles divide both.  A role's
 * backlog past its share waits in its flows (durable in the tables) and
 * is offered as its offers end.  Under the lock; O(1).
 */
static OfferRefusal
RoleShare(Oid role, Size len)
{
	OfferRole  *entry = hash_search(RoleTable, &role, HASH_FIND, NULL);
	int			mine = entry ? entry->offers : 0;
	Size		my_bytes = entry ? entry->bytes : 0;
	int			others = Offers->nroles - (entry ? 1 : 0);

	if (mine >= Max(dwarf_max_external_steps / (others + 2), 1))
		return OFFER_PAST_SHARE;
	if (my_bytes + len > (Size) dwarf_external_memory * 1024 / (others + 2))
		return OFFER_PAST_MEMORY_SHARE;
	return OFFERED;
}

/*
 * Counts an offer of role (+1) or one that ended (-1), whose data takes
 * bytes in the area; under the lock.
 */
static bool
CountRole(Oid role, int delta, Size bytes)
{
	bool		found;
	OfferRole  *entry = hash_search(RoleTable, &role,
									delta > 0 ? HASH_ENTER_NULL : HASH_FIND, &found);

	if (entry == NULL)
		return false;
	if (delta > 0 && !found)
	{
		entry->offers = 0;
		entry->bytes = 0;
		Offers->nroles++;
	}
	entry->offers += delta;
	if (delta > 0)
		entry->bytes += bytes;
	else
		entry->bytes -= Min(bytes, entry->bytes);
	if (entry->offers <= 0)
	{
		hash_search(RoleTable, &role, HASH_REMOVE, NULL);
		Offers->nroles--;
	}
	return true;
}

/* The limits of an offer's step (pointing into the shared area). */
static void
LimitsOf(Offer *offer, StepLimits *limits)
{
	LimitsUnflatten((char *) dsa_get_address(OfferArea(), offer->data) +
					offer->input_len + offer->baggage_len + offer->call_len,
					offer->nlimits, limits);
}

/* Gives back the places of its limits a lease took (under the lock). */
static void
GiveLimitsOf(Offer *offer)
{
	StepLimits	limits;
	int			i;

	if (!offer->limit_taken)
		return;
	LimitsOf(offer, &limits);
	for (i = 0; i < limits.n; i++)
		LimitGive(limits.owner[i], limits.name[i], limits.key[i]);
	offer->limit_taken = false;
}

/*
 * Ends an offer's lease, if it has one: remembered as why; the place it
 * held of the task's limit is given back.  An HTTP call's lease that ends
 * under it (withdrawn: the flow was cancelled or closed; run out) wakes the
 * HTTP process, which closes the call at once (OffersHttpEnded).
 */
static void
EndLease(Offer *offer, LeaseEnd why)
{
	Lease	   *lease;

	GiveLimitsOf(offer);
	if (offer->lease == 0)
		return;
	if (offer->call_len > 0 && (why == LEASE_WITHDRAWN || why == LEASE_EXPIRED) &&
		(offer->state == OFFER_LEASED || offer->state == OFFER_EXPIRED))
	{
		pg_atomic_fetch_add_u64(&Offers->http_ended, 1);
		ConditionVariableBroadcast(&offer->queue->cv);
	}
	lease = hash_search(LeaseTable, &offer->lease, HASH_FIND, NULL);
	if (lease)
	{
		lease->end = why;
		lease->ended_at = GetCurrentTimestamp();
	}
	offer->lease = 0;
}

/* The bytes an offer's data takes in the shared area (0: freed). */
static Size
OfferBytes(Offer *offer)
{
	if (!DsaPointerIsValid(offer->data))
		return 0;
	return offer->input_len + offer->baggage_len + offer->call_len + offer->limits_len;
}

/* Frees what an offer keeps in the shared area. */
static void
FreeData(Offer *offer)
{
	if (DsaPointerIsValid(offer->data))
	{
		dsa_free(OfferArea(), offer->data);
		Offers->bytes -= OfferBytes(offer);
		offer->data = InvalidDsaPointer;
	}
}

/* Takes a ready offer off its queue (under the lock, exclusive). */
static void
TakeFromQueue(Offer *offer)
{
	dlist_delete(&offer->in_queue);
	if (offer->nlimits > 0)
		offer->queue->nlimited--;
}

/* Removes an offer (under the lock, exclusive). */
static void
RemoveOffer(Offer *offer, LeaseEnd why)
{
	if (offer->state == OFFER_READY)
		TakeFromQueue(offer);
	if (offer->on_answered)
	{
		dlist_delete(&offer->in_answered);
		offer->on_answered = false;
		Offers->nanswered--;
	}
	EndLease(offer, why);
	CountRole(offer->owner, -1, OfferBytes(offer));
	FreeData(offer);
	offer->queue->noffers--;
	DropQueueIfUnused(offer->queue);
	hash_search(OfferTable, &offer->key, HASH_REMOVE, NULL);
}

/*
 * Offers a step, or leaves the offer of the same step (visit and attempt)
 * as it stands: a worker that loads a flow again offers its steps again,
 * and a lease taken meanwhile must hold.  An offer of an earlier visit or
 * attempt of the branch is replaced.  Returns OFFERED, or why the step
 * cannot be offered now: its owner holds its share of
 * dwarf.max_external_steps or of dwarf.external_memory (RoleShare), the
 * table is full, the inputs fill dwarf.external_memory, or there are too
 * many queues.
 */
OfferRefusal
OfferPublish(const OfferSpec *spec)
{
	dsa_area   *area = OfferArea();
	Size		input_len = VARSIZE(spec->input);
	Size		baggage_len = spec->baggage ? VARSIZE(spec->baggage) : 0;
	Size		call_len = spec->call ? VARSIZE(spec->call) : 0;
	Size		limits_len = LimitsFlatSize(&spec->limits);
	Size		len = input_len + baggage_len + call_len + limits_len;
	Offer	   *offer;
	OfferQueue *queue;
	bool		found;
	dsa_pointer data;
	OfferRefusal why;

	/*
	 * The rule this file keeps: a step is offered only once the commit that
	 * led to it is done, so never from inside a transaction (a batch that
	 * rolls back would leave a step offered that its flow's rows do not
	 * have).
	 */
	if (IsTransactionState())
		elog(ERROR, "dwarf: step of task \"%s\" of flow " INT64_FORMAT " offered inside a transaction",
			 spec->task, spec->key.flow_id);
	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	offer = hash_search(OfferTable, &spec->key, HASH_FIND, NULL);
	if (offer && offer->visits == spec->visits && offer->attempt == spec->attempt &&
		offer->state != OFFER_EXPIRED)
	{
		LWLockRelease(Offers->lock);
		return OFFERED;
	}
	if (offer)
		RemoveOffer(offer, offer->state == OFFER_ANSWERING ? LEASE_ANSWERED : LEASE_EXPIRED);
	why = RoleShare(spec->owner, len);
	if (why != OFFERED)
	{
		LWLockRelease(Offers->lock);
		return why;
	}
	queue = FindQueue(spec->queue, true);
	if (queue == NULL)
	{
		LWLockRelease(Offers->lock);
		return OFFER_NO_QUEUE;
	}
	if (Offers->bytes + len > (Size) dwarf_external_memory * 1024)
	{
		DropQueueIfUnused(queue);
		LWLockRelease(Offers->lock);
		return OFFER_NO_MEMORY;
	}
	data = dsa_allocate_extended(area, len, DSA_ALLOC_NO_OOM | DSA_ALLOC_HUGE);
	if (!DsaPointerIsValid(data))
	{
		DropQueueIfUnused(queue);
		LWLockRelease(Offers->lock);
		return OFFER_NO_MEMORY;
	}
	offer = hash_search(OfferTable, &spec->key, HASH_ENTER_NULL, &found);
	if (offer == NULL || !CountRole(spec->owner, 1, len))
	{
		if (offer)
			hash_search(OfferTable, &spec->key, HASH_REMOVE, NULL);
		dsa_free(area, data);
		DropQueueIfUnused(queue);
		LWLockRelease(Offers->lock);
		return OFFER_FULL;
	}
	queue->noffers++;
	offer->state = OFFER_READY;
	offer->visits = spec->visits;
	offer->attempt = spec->attempt;
	offer->owner = spec->owner;
	offer->priority = spec->priority;
	offer->queue = queue;
	strlcpy(offer->graph, spec->graph, NAMEDATALEN);
	strlcpy(offer->task, spec->task, NAMEDATALEN);
	offer->lease_us = spec->lease_us;
	offer->data = data;
	offer->input_len = input_len;
	offer->baggage_len = baggage_len;
	offer->call_len = call_len;
	memcpy(dsa_get_address(area, data), spec->input, input_len);
	if (baggage_len)
		memcpy((char *) dsa_get_address(area, data) + input_len, spec->baggage, baggage_len);
	if (call_len)
		memcpy((char *) dsa_get_address(area, data) + input_len + baggage_len, spec->call,
			   call_len);
	offer->limits_len = limits_len;
	offer->nlimits = spec->limits.n;
	LimitsFlatten(&spec->limits,
				  (char *) dsa_get_address(area, data) + input_len + baggage_len + call_len);
	offer->limit_taken = false;
	Offers->bytes += len;
	offer->lease = 0;
	offer->xid = InvalidTransactionId;
	offer->absent = 0;
	offer->on_answered = false;
	dlist_push_tail(&queue->ready, &offer->in_queue);
	if (offer->nlimits > 0)
		queue->nlimited++;
	ConditionVariableBroadcast(&queue->cv);	/* under the lock: the queue stays */
	LWLockRelease(Offers->lock);
	OwnOffers = true;			/* for the worker's sweeps, until one finds none */
	return OFFERED;
}

/*
 * A withdrawal asked for while a transaction is open (a batch recording an
 * answer, or closing a flow): done when that transaction commits, dropped
 * when it aborts (OffersXactCallback), so that a batch that rolls back
 * leaves every offer and lease as its flows' rows still say.
 */
typedef struct PendingWithdrawal
{
	OfferKey	key;			/* token_id -1: every offer of the flow */
	int32		visits;			/* of the step answered; -1: any */
	int32		attempt;
	LeaseEnd	why;
	int			level;			/* the transaction nest level that asked */
} PendingWithdrawal;

static List *PendingWithdrawals = NIL;

/* Withdraws now (under the lock, exclusive) what w names. */
static void
ApplyWithdrawal(const PendingWithdrawal *w)
{
	Offer	   *offer;

	if (w->key.token_id >= 0)
	{
		offer = hash_search(OfferTable, &w->key, HASH_FIND, NULL);
		if (offer && (w->visits < 0 ||
					  (offer->visits == w->visits && offer->attempt == w->attempt)))
			RemoveOffer(offer, w->why);
	}
	else
	{
		HASH_SEQ_STATUS seq;

		hash_seq_init(&seq, OfferTable);
		while ((offer = hash_seq_search(&seq)) != NULL)
			if (offer->key.dboid == w->key.dboid && offer->key.flow_id == w->key.flow_id)
				RemoveOffer(offer, w->why);
	}
}

/*
 * At the end of the transaction that asked for withdrawals: done at its
 * commit (the transaction is committed and visible by then), forgotten at
 * its abort.  Nothing here can fail but a broken lock.
 */
static void
OffersXactCallback(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (PendingWithdrawals == NIL)
		return;
	if (event == XACT_EVENT_COMMIT)
	{
		LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
		foreach(lc, PendingWithdrawals)
			ApplyWithdrawal(lfirst(lc));
		LWLockRelease(Offers->lock);
	}
	else if (event != XACT_EVENT_ABORT)
		return;
	list_free_deep(PendingWithdrawals);
	PendingWithdrawals = NIL;
}

/* A subtransaction's withdrawals go with it: to its parent, or away. */
static void
OffersSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	ListCell   *lc;

	if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB)
		return;
	foreach(lc, PendingWithdrawals)
	{
		PendingWithdrawal *w = lfirst(lc);

		if (w->level < level)
			continue;
		if (event == SUBXACT_EVENT_COMMIT_SUB)
			w->level = level - 1;
		else
		{
			PendingWithdrawals = foreach_delete_current(PendingWithdrawals, lc);
			pfree(w);
		}
	}
}

/*
 * Withdraws now, outside a transaction, or at the commit of the one open:
 * an offer is withdrawn only once what ends it is committed.
 */
static void
Withdraw(const OfferKey *key, int32 visits, int32 attempt, LeaseEnd why)
{
	PendingWithdrawal w;

	w.key = *key;
	w.visits = visits;
	w.attempt = attempt;
	w.why = why;
	w.level = GetCurrentTransactionNestLevel();
	if (IsTransactionState())
	{
		static bool registered = false;
		MemoryContext old;
		PendingWithdrawal *copy;

		if (!registered)
		{
			RegisterXactCallback(OffersXactCallback, NULL);
			RegisterSubXactCallback(OffersSubXactCallback, NULL);
			registered = true;
		}
		old = MemoryContextSwitchTo(TopMemoryContext);
		copy = palloc(sizeof(PendingWithdrawal));
		*copy = w;
		PendingWithdrawals = lappend(PendingWithdrawals, copy);
		MemoryContextSwitchTo(old);
		return;
	}
	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	ApplyWithdrawal(&w);
	LWLockRelease(Offers->lock);
}

/*
 * Withdraws the offer of a step that was answered (visits and attempt), at
 * the commit that records the answer.
 */
void
OfferWithdraw(const OfferKey *key, int32 visits, int32 attempt, LeaseEnd why)
{
	Withdraw(key, visits, attempt, why);
}

/*
 * Withdraws every offer of a flow that closed or was cancelled, at the
 * commit that closes it (now, when the close committed already).  A scan of
 * all offers: for the rare flow that closes with steps still offered.
 */
void
OfferWithdrawFlow(Oid dboid, int64 flow_id)
{
	OfferKey	key;

	memset(&key, 0, sizeof(key));
	key.dboid = dboid;
	key.flow_id = flow_id;
	key.token_id = -1;
	Withdraw(&key, -1, -1, LEASE_WITHDRAWN);
}

/*
 * Is this step's offer answered, by a transaction that committed?  Its
 * worker then waits for the answer's note rather than offering it again.
 */
bool
OfferAnswered(const OfferKey *key, int32 visits, int32 attempt)
{
	Offer	   *offer;
	bool		answered = false;

	LWLockAcquire(Offers->lock, LW_SHARED);
	offer = hash_search(OfferTable, key, HASH_FIND, NULL);
	if (offer && offer->visits == visits && offer->attempt == attempt &&
		offer->state == OFFER_ANSWERING)
		answered = TransactionIdDidCommit(offer->xid);
	LWLockRelease(Offers->lock);
	return answered;
}

/*
 * A worker's sweep of its offers (those of its database whose flows it
 * owns): leases run out become OFFER_EXPIRED and are returned
 * (ExpiredLeases, for the worker to record the failed attempts); answers
 * whose transaction rolled back give the lease back; leases ended long ago
 * are forgotten.  An offer whose flow the worker has not held (held) for
 * DWARF_ABSENT_SWEEPS sweeps in a row has its flow's id added to *absent
 * (again every DWARF_ABSENT_SWEEPS sweeps): a flow with offered steps is
 * not evicted, so it closed or was cancelled while out of memory, or it
 * waits to be loaded (after a restart, behind many others).  The worker
 * looks each up and withdraws the offers of those that closed
 * (OfferWithdrawFlow); nothing is withdrawn here, so that a lease is kept
 * until it runs out or its flow really closes.  *next_due is the soonest
 * lease end to come (0: none).
 */
List *
OffersSweep(int worker_index, TimestampTz now, bool (*held) (int64 flow_id),
			TimestampTz *next_due, List **absent)
{
	HASH_SEQ_STATUS seq;
	Offer	   *offer;
	Lease	   *lease;
	List	   *expired = NIL;

	*next_due = 0;
	*absent = NIL;
	OwnOffers = false;
	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, OfferTable);
	while ((offer = hash_seq_search(&seq)) != NULL)
	{
		if (offer->key.dboid != MyDatabaseId || DwarfWorkerOf(offer->key.flow_id) != worker_index)
			continue;
		OwnOffers = true;
		if (offer->state == OFFER_ANSWERING &&
			!TransactionIdIsInProgress(offer->xid) && !TransactionIdDidCommit(offer->xid))
		{
			offer->state = OFFER_LEASED;	/* the answer rolled back */
			offer->xid = InvalidTransactionId;
		}
		if (held(offer->key.flow_id))
			offer->absent = 0;
		else if (++offer->absent >= DWARF_ABSENT_SWEEPS)
		{
			int64	   *id = palloc(sizeof(int64));

			*id = offer->key.flow_id;
			*absent = lappend(*absent, id);
			offer->absent = 0;
		}
		if (offer->state != OFFER_LEASED)
			continue;
		if (offer->lease_until <= now)
		{
			ExpiredLease *e = palloc(sizeof(ExpiredLease));

			e->key = offer->key;
			e->visits = offer->visits;
			e->attempt = offer->attempt;
			e->leased_at = offer->leased_at;
			e->lease_until = offer->lease_until;
			expired = lappend(expired, e);
			offer->state = OFFER_EXPIRED;
			EndLease(offer, LEASE_EXPIRED);
		}
		else if (*next_due == 0 || offer->lease_until < *next_due)
			*next_due = offer->lease_until;
	}
	hash_seq_init(&seq, LeaseTable);
	while ((lease = hash_seq_search(&seq)) != NULL)
		if (lease->end != LEASE_HELD && lease->key.dboid == MyDatabaseId &&
			DwarfWorkerOf(lease->key.flow_id) == worker_index &&
			lease->ended_at + (TimestampTz) DWARF_LEASE_MEMORY_MS * 1000 < now)
			hash_search(LeaseTable, &lease->lease, HASH_REMOVE, NULL);
	LWLockRelease(Offers->lock);
	return expired;
}

/* Has this worker offers to sweep (as its last sweep found)? */
bool
OffersPending(void)
{
	return OwnOffers;
}

/*
 * Forgets every lease that ended (under the lock, exclusive), when the
 * table of leases is full: at a high rate of claims, DWARF_LEASE_MEMORY_MS
 * of ended leases may not fit, and a late answer then hears only that its
 * lease is not known.  Returns how many it forgot.
 */
static int
ForgetEndedLeases(void)
{
	HASH_SEQ_STATUS seq;
	Lease	   *lease;
	int			n = 0;

	hash_seq_init(&seq, LeaseTable);
	while ((lease = hash_seq_search(&seq)) != NULL)
		if (lease->end != LEASE_HELD)
		{
			hash_search(LeaseTable, &lease->lease, HASH_REMOVE, NULL);
			n++;
		}
	return n;
}

/* Is role one of owners? */
static bool
OwnerIn(Oid role, Oid *owners, int nowners)
{
	int			i;

	for (i = 0; i < nowners; i++)
		if (owners[i] == role)
			return true;
	return false;
}

/* Has queue steps ready to claim? */
bool
OffersHasReady(const char *queue_name)
{
	OfferQueue *queue;
	bool		ready;

	LWLockAcquire(Offers->lock, LW_SHARED);
	queue = FindQueue(queue_name, false);
	ready = queue != NULL && !dlist_is_empty(&queue->ready);
	LWLockRelease(Offers->lock);
	return ready;
}

/*
 * The limits the ready steps of queue take (OfferLimit: owner and name), for
 * a claim to read their settings before it claims (OffersClaim takes them
 * under the offers' lock, where no table may be read).
 */
List *
OffersLimitNames(const char *queue_name)
{
	OfferQueue *queue;
	dlist_iter	iter;
	List	   *names = NIL;

	LWLockAcquire(Offers->lock, LW_SHARED);
	queue = FindQueue(queue_name, false);
	if (queue && queue->nlimited > 0)	/* else no claim need scan it */
		dlist_foreach(iter, &queue->ready)
		{
			Offer	   *offer = dlist_container(Offer, in_queue, iter.cur);
			StepLimits	limits;
			int			i;

			LimitsOf(offer, &limits);
			for (i = 0; i < limits.n; i++)
			{
				ListCell   *lc;
				bool		known = false;

				foreach(lc, names)
				{
					OfferLimit *limit = lfirst(lc);

					if (limit->owner == limits.owner[i] && strcmp(limit->name, limits.name[i]) == 0)
						known = true;
				}
				if (!known)
				{
					OfferLimit *limit = palloc(sizeof(OfferLimit));

					limit->owner = limits.owner[i];
					strlcpy(limit->name, limits.name[i], NAMEDATALEN);
					names = lappend(names, limit);
				}
			}
		}
	LWLockRelease(Offers->lock);
	return names;
}

/*
 * Leases up to max ready steps of queue, first offered first, of flows
 * owned by one of owners (any_owner: anyone's), for lease_us (0: each
 * task's own lease).  Steps of other owners are skipped; the owners not in
 * owners that were met are returned in *seen (palloc'd), for the caller to
 * check and claim again with.  A step whose task names a limit is claimed
 * only if take_limit takes a place of it (under this lock: it must read no
 * table); its lease holds the place until it ends.  Returns ClaimedSteps,
 * their inputs copied.
 */
List *
OffersClaim(const char *queue_name, int max, int64 lease_us, Oid *owners, int nowners,
			bool any_owner, Oid **seen, int *nseen, ClaimLimitCheck take_limit, void *arg)
{
	dsa_area   *area = OfferArea();
	OfferQueue *queue;
	dlist_mutable_iter iter;
	List	   *claimed = NIL;
	TimestampTz now = GetCurrentTimestamp();
	int			seen_size = 8;

	*seen = palloc(sizeof(Oid) * seen_size);
	*nseen = 0;
	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	queue = FindQueue(queue_name, false);
	if (queue == NULL)
	{
		LWLockRelease(Offers->lock);
		return NIL;
	}
	dlist_foreach_modify(iter, &queue->ready)
	{
		Offer	   *offer = dlist_container(Offer, in_queue, iter.cur);
		ClaimedStep *step;
		Lease	   *lease;
		bool		found;
		char	   *data;

		if (list_length(claimed) >= max)
			break;
		if (!any_owner && !OwnerIn(offer->owner, owners, nowners))
		{
			if (!OwnerIn(offer->owner, *seen, *nseen))
			{
				if (*nseen == seen_size)
				{
					seen_size *= 2;
					*seen = repalloc(*seen, sizeof(Oid) * seen_size);
				}
				(*seen)[(*nseen)++] = offer->owner;
			}
			continue;
		}
		if (offer->nlimits > 0)
		{
			StepLimits	limits;
			int			i;

			LimitsOf(offer, &limits);
			for (i = 0; i < limits.n; i++)
				if (!take_limit(limits.owner[i], limits.name[i], limits.key[i], arg))
					break;
			if (i < limits.n)
			{
				while (--i >= 0)	/* the ones taken go back */
					LimitGive(limits.owner[i], limits.name[i], limits.key[i]);
				continue;		/* no room under one of its limits now */
			}
			offer->limit_taken = true;
		}
		lease = NULL;
		while (lease == NULL)
		{
			int64		id = (int64) (Offers->next_lease++ & ((UINT64CONST(1) << 62) - 1));

			if (id == 0)
				continue;
			lease = hash_search(LeaseTable, &id, HASH_ENTER_NULL, &found);
			if (lease == NULL && ForgetEndedLeases() > 0)
				lease = hash_search(LeaseTable, &id, HASH_ENTER_NULL, &found);
			if (lease == NULL)
				break;			/* every lease is held */
			if (found)
				lease = NULL;
		}
		if (lease == NULL)
		{
			GiveLimitsOf(offer);
			break;
		}
		lease->key = offer->key;
		lease->end = LEASE_HELD;
		lease->ended_at = 0;

		TakeFromQueue(offer);
		offer->state = OFFER_LEASED;
		offer->lease = lease->lease;
		offer->leased_at = now;
		offer->lease_until = now + (lease_us > 0 ? lease_us : offer->lease_us);

		step = palloc(sizeof(ClaimedStep));
		step->lease = offer->lease;
		step->key = offer->key;
		step->visits = offer->visits;
		step->attempt = offer->attempt;
		memcpy(step->graph, offer->graph, NAMEDATALEN);
		memcpy(step->task, offer->task, NAMEDATALEN);
		step->owner = offer->owner;
		step->lease_until = offer->lease_until;
		data = dsa_get_address(area, offer->data);
		step->input = palloc(offer->input_len);
		memcpy(step->input, data, offer->input_len);
		step->baggage = NULL;
		if (offer->baggage_len)
		{
			step->baggage = palloc(offer->baggage_len);
			memcpy(step->baggage, data + offer->input_len, offer->baggage_len);
		}
		step->call = NULL;
		if (offer->call_len)
		{
			step->call = palloc(offer->call_len);
			memcpy(step->call, data + offer->input_len + offer->baggage_len, offer->call_len);
		}
		claimed = lappend(claimed, step);
	}
	LWLockRelease(Offers->lock);
	return claimed;
}

/* The queue a claim sleeps on, while it does, and its condition variable. */
static OfferQueue *SleepingQueue = NULL;
static ConditionVariable *Sleeping = NULL;

/* At exit: a claim that an error ended leaves no waiter on its queue. */
static void
OffersWaitAtExit(int code, Datum arg)
{
	OffersCancelWait();
}

/*
 * Waits until a step is offered on queue, or until until: true when woken
 * by an offer (the caller claims again), false at until.  A wake-up, not a
 * poll: the worker that offers broadcasts on the queue's condition variable.
 * The first call prepares the sleep and returns true at once, so that the
 * caller claims again with no offer lost between its claim and its sleep.
 */
bool
OffersWait(const char *queue_name, TimestampTz until)
{
	OfferQueue *queue;
	long		ms;

	if (Sleeping == NULL)
	{
		static bool registered = false;

		if (!registered)
		{
			/* a claim ended by an error is forgotten by the next, or at exit */
			before_shmem_exit(OffersWaitAtExit, (Datum) 0);
			registered = true;
		}
		LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
		queue = FindQueue(queue_name, true);
		if (queue)
			queue->nwaiting++;
		LWLockRelease(Offers->lock);
		if (queue == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many queues of external tasks to wait on queue \"%s\"", queue_name),
					 errdetail("A server keeps at most %d queues.", DWARF_MAX_QUEUES)));
		SleepingQueue = queue;
		Sleeping = &queue->cv;
		ConditionVariablePrepareToSleep(Sleeping);
		return true;
	}
	ms = (long) ((until - GetCurrentTimestamp() + 999) / 1000);
	if (ms <= 0)
		return false;
	return !ConditionVariableTimedSleep(Sleeping, ms, PG_WAIT_EXTENSION);
}

/*
 * From now on, an offer on queue sets this process's latch: the HTTP
 * process (http.c) waits on its latch and its sockets at once, not in
 * OffersWait.  A broadcast wakes a waiter once, so it is called again
 * before each claim; the claim after it misses no offer.
 */
void
OffersWatch(const char *queue_name)
{
	OfferQueue *queue;

	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	queue = FindQueue(queue_name, true);
	if (queue)
		queue->watched = true;	/* never dropped: this process keeps its address */
	LWLockRelease(Offers->lock);
	if (queue)
		ConditionVariablePrepareToSleep(&queue->cv);
}

/*
 * Ends a claim's wait (done, or an error); its queue goes if nothing else
 * uses it (a claim on a name no task has).
 */
void
OffersCancelWait(void)
{
	if (Sleeping)
		ConditionVariableCancelSleep();
	Sleeping = NULL;
	if (SleepingQueue)
	{
		LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
		SleepingQueue->nwaiting--;
		DropQueueIfUnused(SleepingQueue);
		LWLockRelease(Offers->lock);
		SleepingQueue = NULL;
	}
}

/*
 * Frees what a dropped database held: its offers (their leases end as
 * withdrawn) and its queues.  The launcher calls it once the database's
 * workers have stopped.
 */
void
OffersForgetDatabase(Oid dboid)
{
	HASH_SEQ_STATUS seq;
	Offer	   *offer;
	OfferQueue *queue;
	Lease	   *lease;

	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, OfferTable);
	while ((offer = hash_seq_search(&seq)) != NULL)
		if (offer->key.dboid == dboid)
			RemoveOffer(offer, LEASE_WITHDRAWN);
	hash_seq_init(&seq, QueueTable);
	while ((queue = hash_seq_search(&seq)) != NULL)
		if (queue->key.dboid == dboid && queue->noffers == 0)
			hash_search(QueueTable, &queue->key, HASH_REMOVE, NULL);
	hash_seq_init(&seq, LeaseTable);	/* no worker of it sweeps them now */
	while ((lease = hash_seq_search(&seq)) != NULL)
		if (lease->key.dboid == dboid)
			hash_search(LeaseTable, &lease->lease, HASH_REMOVE, NULL);
	LWLockRelease(Offers->lock);
}

/* Fills info from an offer. */
static void
FillInfo(Offer *offer, LeaseInfo *info)
{
	info->key = offer->key;
	info->visits = offer->visits;
	info->attempt = offer->attempt;
	info->owner = offer->owner;
	memcpy(info->task, offer->task, NAMEDATALEN);
	info->leased_at = offer->leased_at;
	info->lease_until = offer->lease_until;
	info->http = offer->call_len > 0;
}

/*
 * Finds a lease's offer while the lease is held (under the lock); else
 * NULL with why it is not: ended (how), answering in another transaction,
 * or past its end (not swept yet).
 */
static Offer *
HeldOffer(int64 id, TransactionId xid, LeaseEnd *why, LeaseInfo *info)
{
	Lease	   *lease = hash_search(LeaseTable, &id, HASH_FIND, NULL);
	Offer	   *offer;

	memset(info, 0, sizeof(LeaseInfo));
	if (lease == NULL)
	{
		*why = LEASE_UNKNOWN;
		return NULL;
	}
	info->key = lease->key;
	info->lease_until = lease->ended_at;
	if (lease->end != LEASE_HELD)
	{
		*why = lease->end;
		return NULL;
	}
	offer = hash_search(OfferTable, &lease->key, HASH_FIND, NULL);
	if (offer == NULL || offer->lease != id)
	{
		*why = LEASE_WITHDRAWN;
		return NULL;
	}
	FillInfo(offer, info);
	if (offer->state == OFFER_ANSWERING)
	{
		if (TransactionIdIsInProgress(offer->xid))
		{
			*why = offer->xid == xid ? LEASE_ANSWERED : LEASE_BUSY;
			return NULL;
		}
		if (TransactionIdDidCommit(offer->xid))
		{
			*why = LEASE_ANSWERED;
			return NULL;
		}
		offer->state = OFFER_LEASED;	/* that answer rolled back */
		offer->xid = InvalidTransactionId;
	}
	if (offer->lease_until <= GetCurrentTimestamp())
	{
		*why = LEASE_EXPIRED;
		return NULL;
	}
	*why = LEASE_HELD;
	return offer;
}

/*
 * complete and fail: marks a held lease answering by transaction xid (the
 * caller's current one, a subtransaction's included, so that a rolled-back
 * savepoint gives the lease back).  LEASE_HELD and info on success; else
 * why the lease is not held, with what is known of it in info.
 */
LeaseEnd
LeaseBeginAnswer(int64 lease, TransactionId xid, LeaseInfo *info)
{
	LeaseEnd	why;
	Offer	   *offer;

	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	offer = HeldOffer(lease, xid, &why, info);
	if (offer)
	{
		offer->state = OFFER_ANSWERING;
		offer->xid = xid;
		if (!offer->on_answered)
		{
			dlist_push_tail(&Offers->answered, &offer->in_answered);
			offer->on_answered = true;
			Offers->nanswered++;
		}
	}
	LWLockRelease(Offers->lock);
	return why;
}

/* May an answer wait for a worker to take it (OffersTakeAnswered)? */
bool
OffersAnsweredPending(void)
{
	return Offers->nanswered > 0;
}

/*
 * Takes the answered steps of a worker's flows (worker_index of this
 * database) whose answer has committed, as AnsweredSteps; its worker
 * hands each to its branch.  An answer rolled back gives its lease back;
 * one in progress stays for a later call.  Committed means visible: the
 * answering transaction has left the proc array too, so a snapshot taken
 * from now on sees the answer's row.
 */
List *
OffersTakeAnswered(int worker_index)
{
	dlist_mutable_iter iter;
	List	   *taken = NIL;

	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	dlist_foreach_modify(iter, &Offers->answered)
	{
		Offer	   *offer = dlist_container(Offer, in_answered, iter.cur);
		AnsweredStep *step;

		if (offer->key.dboid != MyDatabaseId || DwarfWorkerOf(offer->key.flow_id) != worker_index)
			continue;
		if (offer->state == OFFER_ANSWERING && TransactionIdIsInProgress(offer->xid))
			continue;
		dlist_delete(&offer->in_answered);
		offer->on_answered = false;
		Offers->nanswered--;
		if (offer->state != OFFER_ANSWERING)
			continue;
		if (!TransactionIdDidCommit(offer->xid))
		{
			offer->state = OFFER_LEASED;	/* the answer rolled back */
			offer->xid = InvalidTransactionId;
			continue;
		}
		step = palloc(sizeof(AnsweredStep));
		step->key = offer->key;
		step->visits = offer->visits;
		step->attempt = offer->attempt;
		taken = lappend(taken, step);
	}
	LWLockRelease(Offers->lock);
	return taken;
}

/*
 * The offered steps of this database (of queue, or every queue), as
 * OfferedSteps: what dwarf.external_steps shows.
 */
List *
OffersList(const char *queue)
{
	HASH_SEQ_STATUS seq;
	Offer	   *offer;
	List	   *steps = NIL;
	static const char *const states[] = {"", "ready", "leased", "answering", "expired"};

	LWLockAcquire(Offers->lock, LW_SHARED);
	hash_seq_init(&seq, OfferTable);
	while ((offer = hash_seq_search(&seq)) != NULL)
	{
		OfferedStep *step;

		if (offer->key.dboid != MyDatabaseId ||
			(queue && strcmp(queue, offer->queue->key.name) != 0))
			continue;
		step = palloc(sizeof(OfferedStep));
		memcpy(step->queue, offer->queue->key.name, NAMEDATALEN);
		memcpy(step->task, offer->task, NAMEDATALEN);
		step->flow_id = offer->key.flow_id;
		step->owner = offer->owner;
		step->attempt = offer->attempt;
		step->state = states[offer->state];
		step->leased_at = offer->state == OFFER_READY ? 0 : offer->leased_at;
		step->lease_until = offer->state == OFFER_READY ? 0 : offer->lease_until;
		steps = lappend(steps, step);
	}
	LWLockRelease(Offers->lock);
	return steps;
}

/* Looks a lease up: LEASE_HELD and info, or why it is not held. */
LeaseEnd
LeaseLookup(int64 lease, LeaseInfo *info)
{
	LeaseEnd	why;

	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	(void) HeldOffer(lease, GetCurrentTransactionIdIfAny(), &why, info);
	LWLockRelease(Offers->lock);
	return why;
}

/* extend: a held lease now ends us from now.  As LeaseBeginAnswer. */
LeaseEnd
LeaseExtend(int64 lease, int64 us, LeaseInfo *info)
{
	LeaseEnd	why;
	Offer	   *offer;

	LWLockAcquire(Offers->lock, LW_EXCLUSIVE);
	offer = HeldOffer(lease, InvalidTransactionId, &why, info);
	if (offer)
	{
		offer->lease_until = GetCurrentTimestamp() + us;
		info->lease_until = offer->lease_until;
	}
	LWLockRelease(Offers->lock);
	return why;
}

/*
 * How many HTTP calls' leases have ended under them so far: when it
 * changes, the HTTP process looks for its calls to close (LeasesEnded).
 */
uint64
OffersHttpEnded(void)
{
	return pg_atomic_read_u64(&Offers->http_ended);
}

/*
 * Which of leases are no longer held (ended[i] for leases[i]), in one pass
 * under the lock: the HTTP process's check of its calls in flight.
 */
void
LeasesEnded(const int64 *leases, int n, bool *ended)
{
	int			i;

	LWLockAcquire(Offers->lock, LW_SHARED);
	for (i = 0; i < n; i++)
	{
		Lease	   *lease = hash_search(LeaseTable, &leases[i], HASH_FIND, NULL);

		ended[i] = lease == NULL || lease->end != LEASE_HELD;
	}
	LWLockRelease(Offers->lock);
}
