/*
 * shmem.c
 *		dwarf's shared memory: worker slots with their note rings, await
 *		waiters, and dwarf.run's create requests.
 *
 * Nothing here is the truth: the tables are.  Shared memory only carries
 * wake-ups and hints, so a lost note costs a table scan, never a flow.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"

#include "dwarf.h"
#include "shmem.h"

DwarfShared *Dwarf = NULL;

static int
DwarfProcCount(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS;
}

static Size
DwarfShmemSize(void)
{
	Size		size = MAXALIGN(sizeof(DwarfShared));

	size = add_size(size, MAXALIGN(mul_size(DwarfProcCount(), sizeof(pg_atomic_uint64))));
	size = add_size(size, MAXALIGN(mul_size(DwarfProcCount(), sizeof(DwarfRequest))));
	return size;
}

/* shmem_request_hook: reserve our part of shared memory. */
void
DwarfShmemRequest(void)
{
	RequestAddinShmemSpace(DwarfShmemSize());
}

/* shmem_startup_hook: lay out the shared struct once, after any restart. */
void
DwarfShmemStartup(void)
{
	bool		found;
	char	   *p;
	int			i;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	Dwarf = ShmemInitStruct("dwarf", DwarfShmemSize(), &found);
	if (!found)
	{
		memset(Dwarf, 0, DwarfShmemSize());
		SpinLockInit(&Dwarf->mutex);
		for (i = 0; i < DWARF_MAX_WORKERS; i++)
		{
			DwarfWorkerSlot *slot = &Dwarf->workers[i];

			SpinLockInit(&slot->mutex);
			pg_atomic_init_u64(&slot->flows_loaded, 0);
			pg_atomic_init_u64(&slot->ready, 0);
			pg_atomic_init_u64(&slot->steps, 0);
			pg_atomic_init_u64(&slot->steps_failed, 0);
			pg_atomic_init_u64(&slot->flows_closed, 0);
			pg_atomic_init_u64(&slot->batches, 0);
			pg_atomic_init_u64(&slot->aborted_batches, 0);
		}
		for (i = 0; i < DWARF_MAX_RUNNERS; i++)
			SpinLockInit(&Dwarf->runners[i].mutex);
		SpinLockInit(&Dwarf->slow_mutex);
		pg_atomic_init_u32(&Dwarf->slow_epoch, 0);
		Dwarf->nprocs = DwarfProcCount();
		p = (char *) Dwarf + MAXALIGN(sizeof(DwarfShared));
		Dwarf->waiting = (pg_atomic_uint64 *) p;
		for (i = 0; i < Dwarf->nprocs; i++)
			pg_atomic_init_u64(&Dwarf->waiting[i], 0);
		p += MAXALIGN(mul_size(Dwarf->nprocs, sizeof(pg_atomic_uint64)));
		Dwarf->requests = (DwarfRequest *) p;
		for (i = 0; i < Dwarf->nprocs; i++)
			SpinLockInit(&Dwarf->requests[i].mutex);
	}
	LWLockRelease(AddinShmemInitLock);
}

/* The worker number (within its database) that owns a flow. */
int
DwarfWorkerOf(int64 flow_id)
{
	return (int) ((flow_id & ((INT64CONST(1) << DWARF_SHARD_SHIFT) - 1)) % dwarf_workers);
}

/*
 * The slot of the worker that owns flow_id in database dboid, or NULL when
 * that worker is not running (it will find the flow when it starts).
 */
DwarfWorkerSlot *
DwarfOwnerSlot(Oid dboid, int64 flow_id)
{
	return DwarfWorkerSlotOf(dboid, DwarfWorkerOf(flow_id));
}

/*
 * The slot of a database's worker number index, if that worker runs (a
 * worker keeps its number across restarts, not its slot); NULL if not.
 */
DwarfWorkerSlot *
DwarfWorkerSlotOf(Oid dboid, int index)
{
	int			i;

	if (Dwarf == NULL)
		return NULL;
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];

		if (slot->dboid == dboid && slot->index == index && slot->latch != NULL)
			return slot;
	}
	return NULL;
}

/*
 * Hands a note to a worker and wakes it.  A full ring sets the overflow flag
 * instead, and the worker rescans the flow table; false tells the caller the
 * note itself was not queued.
 */
bool
DwarfPushNote(DwarfWorkerSlot *slot, int64 flow_id, DwarfNoteKind kind)
{
	bool		queued = false;
	Latch	   *latch;

	SpinLockAcquire(&slot->mutex);
	if (slot->tail - slot->head < DWARF_RING_SIZE)
	{
		DwarfNote  *note = &slot->ring[slot->tail % DWARF_RING_SIZE];

		note->flow_id = flow_id;
		note->kind = kind;
		slot->tail++;
		queued = true;
	}
	else
		slot->overflow = true;
	latch = slot->latch;
	SpinLockRelease(&slot->mutex);

	if (latch)
		SetLatch(latch);
	return queued;
}

/* Asks the launcher to look again at which databases have dwarf. */
void
DwarfWakeLauncher(void)
{
	Latch	   *latch;

	if (Dwarf == NULL)
		return;
	SpinLockAcquire(&Dwarf->mutex);
	Dwarf->rescan = true;
	latch = Dwarf->launcher_latch;
	SpinLockRelease(&Dwarf->mutex);
	if (latch)
		SetLatch(latch);
}

static int
CompareInt64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/*
 * Wakes every backend in dwarf.await on one of these flows.  Called by a
 * worker after the commit that closed or parked them; sorts flow_ids.
 */
void
DwarfWakeWaiters(int64 *flow_ids, int n)
{
	int			i;

	if (n == 0)
		return;
	qsort(flow_ids, n, sizeof(int64), CompareInt64);
	for (i = 0; i < Dwarf->nprocs; i++)
	{
		int64		awaited = (int64) pg_atomic_read_u64(&Dwarf->waiting[i]);

		if (awaited != 0 &&
			bsearch(&awaited, flow_ids, n, sizeof(int64), CompareInt64) != NULL)
			SetLatch(&ProcGlobal->allProcs[i].procLatch);
	}
}
