/*
 * queue.c
 *		A worker's ready queue and timers: which runnable step runs next.
 *
 * Ready steps run lower priority first, across all the workers of a
 * database (each publishes its best ready priority in shared memory).
 * Within a priority, roles take turns, and within a role its fairness keys
 * do.  Each owner role has a ready queue of its own, since a batch runs one
 * role's steps (session.c), and a virtual clock: a batch takes the role
 * whose clock is least (each step it ran put it one further on), and then
 * that role's steps while no other role's come before them by priority.
 * On a role's queue, steps are served by virtual time per fairness key, so
 * the role's keys share its turns in proportion to their weights; then
 * first come, first served.  However many keys a role uses, they cost
 * another role nothing, and each costs O(log n) on its role's heap.
 * Steps due later (sleep, retry backoff) wait on a timer heap, earliest
 * first, and cost nothing until they come due.  (A flow that sleeps for
 * long is not in memory at all: sleepers.c.)  A step of an
 * external task is on neither: it is offered to claims in shared memory
 * (offers.c) as soon as it may run.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "lograte.h"
#include "shmem.h"
#include "flowrun.h"
#include "limits.h"
#include "offers.h"
#include "worker.h"

/* A fairness key's virtual clock: how far its flows have been served. */
typedef struct FairKey
{
	char		key[NAMEDATALEN];	/* hash key: "owner:fairness key" (see GetFairKey) */
	double		pass;
} FairKey;

/*
 * One owner role's ready steps.  A queue with steps is on Busy; a batch
 * picks among those (there are as many as roles with ready work).
 */
typedef struct OwnerQueue
{
	Oid			owner;			/* hash key */
	pairingheap *ready;
	dlist_node	busy;			/* in Busy while ready is not empty */
	double		pass;			/* the role's virtual clock: its turns so far */
	double		key_time;		/* vtime of its last step run: where its
								 * fairness keys' clocks start */
} OwnerQueue;

static HTAB *Owners = NULL;
static dlist_head Busy = DLIST_STATIC_INIT(Busy);
static pairingheap *Timers = NULL;	/* tokens due later, earliest first */
static int	NTimers = 0;		/* on Timers */
static HTAB *FairKeys = NULL;
static double OwnerTime = 0;	/* the role clock where the last step ran */
static uint64 ReadySeq = 0;

static int
ReadyCompare(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	const ReadyEntry *x = pairingheap_const_container(ReadyEntry, ph, a);
	const ReadyEntry *y = pairingheap_const_container(ReadyEntry, ph, b);

	if (x->priority != y->priority)
		return x->priority < y->priority ? 1 : -1;
	if (x->vtime != y->vtime)
		return x->vtime < y->vtime ? 1 : -1;
	return x->seq < y->seq ? 1 : (x->seq > y->seq ? -1 : 0);
}

/* Puts an entry on its role's ready queue, charging its fairness key. */
static void
MakeReady(ReadyEntry *entry)
{
	entry->fair->pass = Max(entry->fair->pass, entry->queue->key_time) + 1.0 / entry->weight;
	entry->vtime = entry->fair->pass;
	if (pairingheap_is_empty(entry->queue->ready))
		dlist_push_tail(&Busy, &entry->queue->busy);
	pairingheap_add(entry->queue->ready, &entry->ph);
	Worker.ready_count++;
}

/* The owner's ready queue, made when first needed. */
static OwnerQueue *
GetOwnerQueue(Oid owner)
{
	OwnerQueue *queue;
	bool		found;

	queue = hash_search(Owners, &owner, HASH_ENTER, &found);
	if (!found)
	{
		MemoryContext old = MemoryContextSwitchTo(Worker.context);

		queue->ready = pairingheap_allocate(ReadyCompare, NULL);
		queue->pass = OwnerTime;
		queue->key_time = 0;
		MemoryContextSwitchTo(old);
	}
	return queue;
}

/* The step that comes first on a queue with ready steps. */
static ReadyEntry *
Head(OwnerQueue *queue)
{
	return pairingheap_container(ReadyEntry, ph, pairingheap_first(queue->ready));
}

/*
 * Does queue a's turn come before queue b's?  The better priority of their
 * next steps first, then the role whose clock is least (a role that had no
 * step ready starts at the clock of the last step run: it gets no credit
 * for its idle time), then the step that came first.
 */
static bool
QueueBefore(OwnerQueue *a, OwnerQueue *b)
{
	ReadyEntry *x = Head(a);
	ReadyEntry *y = Head(b);
	double		xpass = Max(a->pass, OwnerTime);
	double		ypass = Max(b->pass, OwnerTime);

	if (x->priority != y->priority)
		return x->priority < y->priority;
	if (xpass != ypass)
		return xpass < ypass;
	return x->seq < y->seq;
}

/*
 * The queue whose turn comes first of all, or NULL when no step is ready;
 * with other, the best priority among the other queues' next steps.  There
 * are as many queues to look at as roles with ready steps.
 */
static OwnerQueue *
BestQueue(int32 *other)
{
	OwnerQueue *best = NULL;
	dlist_iter	iter;

	if (other)
		*other = PG_INT32_MAX;
	dlist_foreach(iter, &Busy)
	{
		OwnerQueue *queue = dlist_container(OwnerQueue, busy, iter.cur);

		if (best == NULL || QueueBefore(queue, best))
		{
			if (best && other)
				*other = Min(*other, Head(best)->priority);
			best = queue;
		}
		else if (other)
			*other = Min(*other, Head(queue)->priority);
	}
	return best;
}

/*
 * The fairness class of a flow's steps within its owner's turns: its
 * fairness key's.  Keys share their role's turns by weight, so one role's
 * backlog (a fork bomb, a burst of a million creates, a key a flow) queues
 * behind its own steps, and takes no turn of another role's.
 */
static FairKey *
GetFairKey(OwnerQueue *queue, const char *key)
{
	char		name[NAMEDATALEN] = {0};
	FairKey    *fair;
	bool		found;

	snprintf(name, NAMEDATALEN, "%u:%s", queue->owner, key ? key : "");
	fair = hash_search(FairKeys, name, HASH_ENTER, &found);
	if (!found)
		fair->pass = queue->key_time;
	return fair;
}

static int
TimerCompare(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	const ReadyEntry *x = pairingheap_const_container(ReadyEntry, ph, a);
	const ReadyEntry *y = pairingheap_const_container(ReadyEntry, ph, b);

	return x->due < y->due ? 1 : (x->due > y->due ? -1 : 0);
}

/* An entry for a token, not on any queue yet. */
ReadyEntry *
NewReadyEntry(FlowRun *flow, Token *token)
{
	ReadyEntry *entry = MemoryContextAllocZero(Worker.context, sizeof(ReadyEntry));

	entry->flow_id = flow->id;
	entry->token_id = token->id;
	entry->priority = flow->priority;
	entry->seq = ReadySeq++;
	entry->due = token->due;
	entry->queue = GetOwnerQueue(flow->owner);
	entry->fair = GetFairKey(entry->queue, flow->fairness_key);
	entry->weight = Max(flow->fairness_weight, 1);
	return entry;
}

/*
 * Says why steps of external tasks wait for room to be offered: once per
 * DWARF_LOG_EVERY_MS for the worker (lograte.h), with how many were
 * refused since, naming the setting (a backlog of 100,000 steps retried
 * each second must not write a line each).
 */
static void
SayNoRoom(OfferRefusal why, const char *task, FlowRun *flow)
{
	static LogRate no_room;
	int64		n;
	int			seconds;
	const char *hint;

	if ((n = LogRateDue(&no_room, GetCurrentTimestamp(), &seconds)) == 0)
		return;
	switch (why)
	{
		case OFFER_PAST_SHARE:
			hint = "The role holds its share of dwarf.max_external_steps (the offers are shared by the roles that have some); its other steps are offered as its offered steps are answered.";
			break;
		case OFFER_PAST_MEMORY_SHARE:
			hint = "The role's offered steps hold its share of dwarf.external_memory (it is shared by the roles that have offered steps); its other steps are offered as its offered steps are answered.";
			break;
		case OFFER_NO_MEMORY:
			hint = "The states of the offered steps fill dwarf.external_memory.";
			break;
		case OFFER_NO_QUEUE:
			hint = "The server keeps at most 1024 queues of external tasks.";
			break;
		default:
			hint = "dwarf.max_external_steps steps are offered.";
			break;
	}
	ereport(LOG,
			(errmsg("dwarf: " INT64_FORMAT " steps of external tasks wait for room to be offered (in the last %d s), among them task \"%s\" of flow " INT64_FORMAT " (owner oid %u)",
					n, seconds, task, flow->id, flow->owner),
			 errhint("%s", hint)));
}

/*
 * Offers a step of an external task to claims (offers.c): it waits there,
 * holding no process, for an answer or for its lease to run out.  Offering
 * again a step that is offered already leaves it as it stands (a flow
 * loaded again offers its waiting steps again).  Only once the commit that
 * led to the step is durable, and never inside a transaction (OfferPublish
 * checks): from EnqueueRunnable after a commit or a load, or when its
 * timer comes due (MoveDueTimers).  Returns false when the offers are
 * full: the step is then due a second later.
 */
bool
OfferExternalStep(FlowRun *flow, Token *token)
{
	GraphNode  *node = &flow->graph->nodes[token->node];
	TimestampTz now = GetCurrentTimestamp();
	OfferSpec	spec;
	OfferRefusal why;

	memset(&spec, 0, sizeof(spec));
	spec.key.dboid = MyDatabaseId;
	spec.key.flow_id = flow->id;
	spec.key.token_id = token->id;
	spec.visits = token->visits;
	spec.attempt = token->attempt;
	spec.owner = flow->owner;
	spec.priority = flow->priority;
	spec.queue = node->queue;
	spec.graph = flow->graph->name;
	spec.task = node->name;
	spec.lease_us = node->lease_us;
	spec.input = FlowTokenState(flow, token);
	spec.baggage = flow->baggage;
	LimitsOfStep(flow->owner, node->nlimits, node->limits, spec.input, &spec.limits);
	spec.call = node->http;
	if (token->attempt == 1 && token->first_started == 0)
		token->first_started = now;
	why = OfferPublish(&spec);
	if (why != OFFERED)
	{
		token->due = now + USECS_PER_SEC;
		SayNoRoom(why, node->name, flow);
		return false;
	}
	token->offered = true;
	flow->offered++;
	return true;
}

/*
 * Queues the tokens of a running flow that can run and are not queued yet:
 * on the ready queue, or on the timer heap when they are due later.  A
 * flow has at most dwarf.batch_size tokens on the ready queue at a time, so
 * that a wide fan-out (a for_each of 100,000 items) takes turns with the
 * other flows of its fairness key instead of going before them all at
 * once: the rest are queued as those run (a batch's flows are queued again
 * after its commit).  Not for a flow with a step at a runner (FlowIsLent,
 * lend.c): the worker queues it again when the runner is done.
 */
void
EnqueueRunnable(FlowRun *flow)
{
	TimestampTz now = GetCurrentTimestamp();
	dlist_iter	iter;
	int			room = Max(dwarf_batch_size, 1);

	if (flow->status != FLOW_RUNNING)
		return;
	foreach_token(iter, flow)
		if (iter_token(iter)->queued && iter_token(iter)->timer == NULL)
			room--;
	foreach_token(iter, flow)
	{
		Token	   *token = iter_token(iter);
		ReadyEntry *entry;

		if (token->queued || token->running || token->parked || token->offered)
			continue;
		if (token->due <= now && token->answer == NULL &&
			flow->graph->nodes[token->node].kind != TASK_FUNCTION &&
			OfferExternalStep(flow, token))
			continue;			/* waits for a claim, on no queue */
		if (token->due <= now && room <= 0)
			continue;			/* queued after a later commit */
		entry = NewReadyEntry(flow, token);
		token->queued = true;
		if (token->due > now)
		{
			pairingheap_add(Timers, &entry->ph);
			NTimers++;
			token->timer = entry;
		}
		else
		{
			MakeReady(entry);
			room--;
		}
	}
}

/*
 * Takes a flow's tokens off the timer heap (their entries are freed), so
 * that the flow can leave memory: nothing of it is left on a queue.
 */
void
UnqueueTimers(FlowRun *flow)
{
	dlist_iter	iter;

	foreach_token(iter, flow)
	{
		Token	   *token = iter_token(iter);

		if (token->timer == NULL)
			continue;
		pairingheap_remove(Timers, &token->timer->ph);
		NTimers--;
		pfree(token->timer);
		token->timer = NULL;
		token->queued = false;
	}
}

/*
 * Moves the timers that came due to the ready queue; an external task's
 * step that came due is offered instead (outside any transaction: the
 * worker's loop calls this between batches).  Returns how many
 * milliseconds until the next one, or -1 when none is waiting.
 */
long
MoveDueTimers(void)
{
	TimestampTz now = GetCurrentTimestamp();
	long		next = -1;

	while (!pairingheap_is_empty(Timers))
	{
		ReadyEntry *entry = pairingheap_container(ReadyEntry, ph,
												  pairingheap_first(Timers));
		FlowRun    *flow;
		Token	   *token;

		if (entry->due > now)
		{
			next = TimestampDifferenceMilliseconds(now, entry->due) + 1;
			break;
		}
		(void) pairingheap_remove_first(Timers);
		NTimers--;
		/* its token (if its flow was not reloaded since) is off the heap now */
		flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);
		token = flow ? FlowFindToken(flow, entry->token_id) : NULL;
		if (token && token->timer == entry)
			token->timer = NULL;
		else
			token = NULL;		/* a stale entry: PopBatch drops it */
		if (token && token->answer == NULL && flow->status == FLOW_RUNNING &&
			flow->graph->nodes[token->node].kind != TASK_FUNCTION)
		{
			/* an external step is offered here, outside any transaction */
			if (OfferExternalStep(flow, token))
			{
				token->queued = false;
				pfree(entry);
			}
			else
			{
				entry->due = token->due;	/* a second later */
				pairingheap_add(Timers, &entry->ph);
				NTimers++;
				token->timer = entry;
			}
			continue;
		}
		MakeReady(entry);
	}
	return next;
}

/* The priority of the best ready step, or PG_INT32_MAX when none is ready. */
int32
BestReadyPriority(void)
{
	OwnerQueue *best = BestQueue(NULL);

	return best ? Head(best)->priority : PG_INT32_MAX;
}

/* The database's other running workers, one after another (NULL: no more). */
static DwarfWorkerSlot *
NextOtherWorker(int *i)
{
	for (; *i < DWARF_MAX_WORKERS; (*i)++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[*i];

		if (slot != Worker.slot && slot->dboid == Worker.slot->dboid && slot->latch)
		{
			(*i)++;
			return slot;
		}
	}
	return NULL;
}

/*
 * Publishes the priority of our best ready step for the other workers of
 * this database.  When it got worse, they may have been holding back
 * their own work for ours: wake them.
 */
void
PublishPriority(void)
{
	int32		best = BestReadyPriority();
	int32		old = Worker.slot->best_priority;
	DwarfWorkerSlot *slot;
	int			i = 0;

	Worker.slot->best_priority = best;
	if (best <= old)
		return;
	while ((slot = NextOtherWorker(&i)) != NULL)
		SetLatch(slot->latch);
}

/*
 * The best priority of ready work anywhere in this database.  Priorities
 * are strict across workers: none starts a step while another worker has
 * ready work of a better (lower) priority.
 */
int32
DatabaseBestPriority(void)
{
	int32		best = BestReadyPriority();
	DwarfWorkerSlot *slot;
	int			i = 0;

	while ((slot = NextOtherWorker(&i)) != NULL)
		best = Min(best, slot->best_priority);
	return best;
}

/*
 * The best priority of the batches the database's other workers are
 * running.  No worker starts a step, nor chains one, while better work is
 * ready or running elsewhere: priority stays strict when a batch runs a
 * flow's steps one after another.
 */
int32
OthersRunningPriority(void)
{
	int32		best = PG_INT32_MAX;
	DwarfWorkerSlot *slot;
	int			i = 0;

	while ((slot = NextOtherWorker(&i)) != NULL)
		best = Min(best, slot->running_priority);
	return best;
}

/* Publishes the best priority of the batch this worker starts. */
void
SetRunningPriority(List *batch)
{
	int32		best = PG_INT32_MAX;
	ListCell   *lc;

	foreach(lc, batch)
		best = Min(best, ((ReadyEntry *) lfirst(lc))->priority);
	Worker.slot->running_priority = best;
}

/*
 * The batch is over: workers that held worse ready work back for it may go
 * on (they would otherwise look again only after their 100 ms timeout).
 */
void
ClearRunningPriority(void)
{
	int32		was = Worker.slot->running_priority;
	DwarfWorkerSlot *slot;
	int			i = 0;

	Worker.slot->running_priority = PG_INT32_MAX;
	while ((slot = NextOtherWorker(&i)) != NULL)
		if (slot->best_priority > was && slot->best_priority != PG_INT32_MAX)
			SetLatch(slot->latch);
}

/*
 * Pops up to max runnable tokens of one owner role, skipping entries whose
 * flow moved on: the role whose next step comes first, while no other
 * role's next step has a better priority.  With a valid owner, only that
 * role's (none when another role's come first): a batch that has room
 * takes more of its own role's steps (worker.c, RefillBatch).
 */
List *
PopBatch(int max, Oid owner)
{
	List	   *batch = NIL;
	int32		other;
	OwnerQueue *queue = BestQueue(&other);
	int32		limit = Min(Min(DatabaseBestPriority(), OthersRunningPriority()), other);

	if (queue && OidIsValid(owner) && queue->owner != owner)
		return NIL;
	while (queue && list_length(batch) < max && !pairingheap_is_empty(queue->ready) &&
		   Head(queue)->priority <= limit)
	{
		ReadyEntry *entry = pairingheap_container(ReadyEntry, ph,
												  pairingheap_remove_first(queue->ready));
		FlowRun    *flow = hash_search(Worker.flows, &entry->flow_id, HASH_FIND, NULL);
		Token	   *token = flow ? FlowFindToken(flow, entry->token_id) : NULL;

		if (pairingheap_is_empty(queue->ready))
			dlist_delete(&queue->busy);

		Worker.ready_count--;
		queue->key_time = entry->vtime;
		OwnerTime = Max(queue->pass, OwnerTime);	/* where this turn started */
		queue->pass = OwnerTime + 1.0;
		if (token && token->queued && flow->status == FLOW_RUNNING)
		{
			token->queued = false;
			token->running = true;
			batch = lappend(batch, entry);
		}
		else
			pfree(entry);
	}
	return batch;
}

static void
MakeFairKeys(void)
{
	HASHCTL		ctl;

	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(FairKey);
	ctl.hcxt = Worker.context;
	FairKeys = hash_create("dwarf fairness keys", 64, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/* How many steps wait on the timer heap (dwarf.health shows them). */
int
QueueTimerCount(void)
{
	return NTimers;
}

/* Sets up the queue, in Worker.context; once, when the worker starts. */
void
QueueInit(void)
{
	HASHCTL		ctl;

	MakeFairKeys();
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(OwnerQueue);
	ctl.hcxt = Worker.context;
	Owners = hash_create("dwarf owners' queues", 16, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	Timers = pairingheap_allocate(TimerCompare, NULL);
}

/*
 * Forgets the fairness keys and the owners' queues once nothing is queued
 * (entries point at them): a key met again starts at the current virtual
 * time, as a new one does, so nothing changes but the memory.
 */
void
QueuePruneFairKeys(void)
{
	HASH_SEQ_STATUS seq;
	OwnerQueue *queue;

	if (hash_get_num_entries(FairKeys) + hash_get_num_entries(Owners) < 1024 ||
		!dlist_is_empty(&Busy) || !pairingheap_is_empty(Timers))
		return;
	hash_destroy(FairKeys);
	MakeFairKeys();
	hash_seq_init(&seq, Owners);
	while ((queue = hash_seq_search(&seq)) != NULL)
	{
		pfree(queue->ready);
		(void) hash_search(Owners, &queue->owner, HASH_REMOVE, NULL);
	}
}

/* Is a step ready that this worker may start now (priority allowing)? */
bool
QueueHasRunnable(void)
{
	return !dlist_is_empty(&Busy) &&
		BestReadyPriority() <= Min(DatabaseBestPriority(), OthersRunningPriority());
}

/* Is any step ready, even one held back for another worker's better priority? */
bool
QueueHasReady(void)
{
	return !dlist_is_empty(&Busy);
}

