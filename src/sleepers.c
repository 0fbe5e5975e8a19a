/*
 * sleepers.c
 *		The flows a worker let go of until they are due: a flow that sleeps
 *		for long (dwarf.sleep, a retry's backoff) is not kept in memory at
 *		all (worker.c evicts it, QueueOrEvict).  Only its id and the time to
 *		load it again wait, on a binary heap of their own, earliest first:
 *		sixteen bytes a flow, so that a million sleeping flows cost a worker
 *		sixteen megabytes, not gigabytes.
 *
 * Below the store (store.c adds the sleepers a scan of the tables finds)
 * and the worker (which adds those it evicts and loads those due).
 */
#include "postgres.h"

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "worker.h"

/* An evicted flow, to load again at due. */
typedef struct Sleeper
{
	int64		flow_id;
	TimestampTz due;
} Sleeper;

/* The heap starts at, and never shrinks below, this many entries. */
#define SLEEPERS_MIN	1024

static Sleeper *Sleepers = NULL;	/* a binary heap, earliest due first */
static int	NSleepers = 0;
static int	SleepersSize = 0;

/* Swaps two sleepers of the heap. */
static inline void
SwapSleepers(int a, int b)
{
	Sleeper		tmp = Sleepers[a];

	Sleepers[a] = Sleepers[b];
	Sleepers[b] = tmp;
}

/*
 * Remembers an evicted flow, to be loaded again at due.  The same flow may
 * be remembered twice (evicted, loaded by a note, evicted again): loading
 * a flow that is in memory, or that has closed, does nothing.
 */
void
SleeperAdd(int64 flow_id, TimestampTz due)
{
	int			i;

	if (NSleepers == SleepersSize)
	{
		SleepersSize = Max(SleepersSize * 2, SLEEPERS_MIN);
		Sleepers = Sleepers == NULL ?
			MemoryContextAlloc(Worker.context, sizeof(Sleeper) * SleepersSize) :
			repalloc(Sleepers, sizeof(Sleeper) * SleepersSize);
	}
	i = NSleepers++;
	Sleepers[i].flow_id = flow_id;
	Sleepers[i].due = due;
	while (i > 0 && Sleepers[(i - 1) / 2].due > Sleepers[i].due)
	{
		SwapSleepers(i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

/*
 * Takes the next sleeper that is due, into *flow_id.  Returns false when
 * none is.  The heap's memory shrinks as it empties.
 */
bool
TakeDueSleeper(int64 *flow_id)
{
	int			i = 0;

	if (NSleepers == 0 || Sleepers[0].due > GetCurrentTimestamp())
		return false;
	*flow_id = Sleepers[0].flow_id;
	Sleepers[0] = Sleepers[--NSleepers];
	for (;;)
	{
		int			least = i;
		int			l = 2 * i + 1;

		if (l < NSleepers && Sleepers[l].due < Sleepers[least].due)
			least = l;
		if (l + 1 < NSleepers && Sleepers[l + 1].due < Sleepers[least].due)
			least = l + 1;
		if (least == i)
			break;
		SwapSleepers(i, least);
		i = least;
	}
	if (SleepersSize > SLEEPERS_MIN && NSleepers < SleepersSize / 4)
	{
		SleepersSize /= 2;
		Sleepers = repalloc(Sleepers, sizeof(Sleeper) * SleepersSize);
	}
	return true;
}

/*
 * Forgets every sleeper, and the heap's memory: the worker drops all it
 * holds and scans the tables again (LoadFlows).
 */
void
SleepersForget(void)
{
	if (Sleepers != NULL)
		pfree(Sleepers);
	Sleepers = NULL;
	NSleepers = 0;
	SleepersSize = 0;
}

/* The ids of the evicted flows that wait, in a new array (*n of them). */
int64 *
SleeperIds(int *n)
{
	int64	   *ids = palloc(sizeof(int64) * Max(NSleepers, 1));
	int			i;

	for (i = 0; i < NSleepers; i++)
		ids[i] = Sleepers[i].flow_id;
	*n = NSleepers;
	return ids;
}

/* How many evicted flows wait (dwarf.health shows them). */
int
SleeperCount(void)
{
	return NSleepers;
}

/* Milliseconds until the next sleeper is due (0: one is), or -1 if none waits. */
long
SleepersNextMs(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (NSleepers == 0)
		return -1;
	return Sleepers[0].due > now ?
		TimestampDifferenceMilliseconds(now, Sleepers[0].due) + 1 : 0;
}
