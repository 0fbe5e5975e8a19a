/*
 * stats.c
 *		Cumulative statistics per database, graph and task: flows created,
 *		completed, failed and cancelled; steps run, failed and retried; and
 *		histograms of flow and step durations.  They live in shared memory,
 *		count on when flows are archived or purged, and are kept across an
 *		orderly restart in a file (dwarf.graph_stats, dwarf.task_stats,
 *		dwarf.stats_histogram(), dwarf.health).
 *
 * Shared memory holds a fixed-size hash of dwarf.stats_entries entries,
 * keyed by database, graph name and task name (an empty task: the graph's
 * flows), as pg_stat_statements keeps its counters.  When it is full, the
 * entries least recently written go (a twentieth of them at once); an
 * entry that comes back counts from zero, and its stats_reset says since
 * when.  Graph names are per owner, but two owners' graphs of one name
 * count together: the views show what an operator labels by graph.
 *
 * Nothing here costs the hot path a lock.  A process counts in its own
 * memory (LocalStats, one per graph and task, found through a hash by
 * graph version and node), in the transaction that writes the flow or
 * step row; when that transaction commits, the transaction callback adds
 * what it counted to shared memory, under the shared lock with atomics
 * (the exclusive lock only to add an entry).  A rolled-back transaction,
 * or subtransaction, counts nothing: what is counted inside a
 * subtransaction waits in a small list until the subtransaction ends.
 *
 * The postmaster saves the entries to a file as it shuts down, and loads
 * them when it makes shared memory, as pg_stat_statements does; the file
 * is stamped with the system identifier, and removed once read, so that
 * after a crash the counters start again from zero rather than from an
 * older save.
 */
#include "postgres.h"

#include <unistd.h>

#include "access/xlog.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"
#include "stats.h"

#define STATS_FILE		"pg_stat/dwarf_stats.stat"
#define STATS_TEMP_FILE	"pg_stat/dwarf_stats.tmp"
#define STATS_MAGIC		0xD3A45701

/* The counters of an entry, indexed by StatsEvent. */
#define STATS_COUNTERS	(STATS_STEP_RETRIED + 1)

/*
 * The histograms' buckets: upper bounds in microseconds, and a last one
 * without a bound (+Inf).
 */
#define STATS_BUCKETS	13
static const int64 BucketUs[STATS_BUCKETS - 1] = {
	1000, 5000, 10000, 50000, 100000, 500000,
	1000000, 5000000, 10000000, 60000000, 300000000, INT64CONST(3600000000)
};

/* An entry's key: database, graph name, task name ("" for the graph's flows). */
typedef struct StatsKey
{
	Oid			dboid;
	char		graph[NAMEDATALEN];
	char		task[NAMEDATALEN];
} StatsKey;

/* An entry in shared memory. */
typedef struct StatsEntry
{
	StatsKey	key;
	TimestampTz reset_at;		/* since when it counts (under the exclusive lock) */
	pg_atomic_uint64 used;		/* StatsShared.clock when last written */
	pg_atomic_uint64 counters[STATS_COUNTERS];
	pg_atomic_uint64 buckets[STATS_BUCKETS];	/* durations, not cumulative */
	pg_atomic_uint64 sum_us;	/* of the durations */
} StatsEntry;

typedef struct StatsShared
{
	LWLock	   *lock;			/* shared: write counters; exclusive: add,
								 * evict or reset entries */
	pg_atomic_uint64 clock;		/* bumped at every flush */
} StatsShared;

/* An entry as the file holds it. */
typedef struct StatsSaved
{
	StatsKey	key;
	TimestampTz reset_at;
	uint64		counters[STATS_COUNTERS];
	uint64		buckets[STATS_BUCKETS];
	uint64		sum_us;
} StatsSaved;

typedef struct StatsFileHeader
{
	uint32		magic;
	uint64		system_id;
	int32		count;
} StatsFileHeader;

static StatsShared *Stats = NULL;
static HTAB *StatsHash = NULL;

/* What this process counted and has not yet added to shared memory. */
typedef struct LocalStats
{
	StatsKey	key;			/* hash key */
	bool		dirty;			/* on the Dirty list */
	struct LocalStats *next;
	uint64		counters[STATS_COUNTERS];
	uint64		buckets[STATS_BUCKETS];
	uint64		sum_us;
} LocalStats;

/* A graph version's node (-1: the graph's flows), and its LocalStats. */
typedef struct LocalId
{
	int32		graph_id;		/* hash key: graph_id, node */
	int32		node;
	LocalStats *stats;
} LocalId;

/* An event counted in a subtransaction, kept until that ends. */
typedef struct Deferred
{
	LocalStats *stats;
	StatsEvent	event;
	int64		us;				/* its duration, -1: none */
	int			level;			/* the transaction nest level it belongs to */
} Deferred;

static MemoryContext StatsContext = NULL;
static HTAB *LocalByName = NULL;
static HTAB *LocalById = NULL;
static LocalStats *Dirty = NULL;
static Deferred *Deferreds = NULL;
static int	NDeferred = 0;
static int	DeferredSize = 0;
static SPIPlanPtr GraphNamePlan = NULL;

static Size
StatsShmemSize(void)
{
	return add_size(MAXALIGN(sizeof(StatsShared)),
					hash_estimate_size(dwarf_stats_entries, sizeof(StatsEntry)));
}

/* shmem_request_hook: the entries, and the lock. */
void
StatsShmemRequest(void)
{
	RequestAddinShmemSpace(StatsShmemSize());
	RequestNamedLWLockTranche("dwarf_stats", 1);
}

/* Makes an entry's counters zero, as of now. */
static void
ZeroEntry(StatsEntry *e)
{
	int			i;

	for (i = 0; i < STATS_COUNTERS; i++)
		pg_atomic_write_u64(&e->counters[i], 0);
	for (i = 0; i < STATS_BUCKETS; i++)
		pg_atomic_write_u64(&e->buckets[i], 0);
	pg_atomic_write_u64(&e->sum_us, 0);
	e->reset_at = GetCurrentTimestamp();
}

/* A new entry's fields (its key is set). */
static void
InitEntry(StatsEntry *e, uint64 stamp)
{
	int			i;

	pg_atomic_init_u64(&e->used, stamp);
	for (i = 0; i < STATS_COUNTERS; i++)
		pg_atomic_init_u64(&e->counters[i], 0);
	for (i = 0; i < STATS_BUCKETS; i++)
		pg_atomic_init_u64(&e->buckets[i], 0);
	pg_atomic_init_u64(&e->sum_us, 0);
	e->reset_at = GetCurrentTimestamp();
}

/*
 * on_shmem_exit of the postmaster: saves the entries, unless the server
 * is going down after a crash (code is then not 0).  No other process runs.
 */
static void
SaveStats(int code, Datum arg)
{
	FILE	   *file;
	HASH_SEQ_STATUS seq;
	StatsEntry *e;
	StatsFileHeader header;

	if (code != 0 || Stats == NULL || StatsHash == NULL)
		return;
	file = AllocateFile(STATS_TEMP_FILE, PG_BINARY_W);
	if (file == NULL)
		goto error;
	memset(&header, 0, sizeof(header));
	header.magic = STATS_MAGIC;
	header.system_id = GetSystemIdentifier();
	header.count = hash_get_num_entries(StatsHash);
	if (fwrite(&header, sizeof(header), 1, file) != 1)
		goto error;
	hash_seq_init(&seq, StatsHash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		StatsSaved	saved;
		int			i;

		memset(&saved, 0, sizeof(saved));
		saved.key = e->key;
		saved.reset_at = e->reset_at;
		for (i = 0; i < STATS_COUNTERS; i++)
			saved.counters[i] = pg_atomic_read_u64(&e->counters[i]);
		for (i = 0; i < STATS_BUCKETS; i++)
			saved.buckets[i] = pg_atomic_read_u64(&e->buckets[i]);
		saved.sum_us = pg_atomic_read_u64(&e->sum_us);
		if (fwrite(&saved, sizeof(saved), 1, file) != 1)
		{
			hash_seq_term(&seq);
			goto error;
		}
	}
	if (FreeFile(file) != 0)
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(STATS_TEMP_FILE, STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("dwarf: could not write file \"%s\": %m", STATS_TEMP_FILE)));
	if (file)
		FreeFile(file);
	unlink(STATS_TEMP_FILE);
}

/*
 * Loads the entries an orderly shutdown saved, if the file is this
 * server's, then removes the file.  At most dwarf.stats_entries of them.
 */
static void
LoadStats(void)
{
	FILE	   *file = AllocateFile(STATS_FILE, PG_BINARY_R);
	StatsFileHeader header;
	int			i;

	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("dwarf: could not read file \"%s\": %m", STATS_FILE)));
		return;
	}
	if (fread(&header, sizeof(header), 1, file) != 1 || header.magic != STATS_MAGIC ||
		header.system_id != GetSystemIdentifier() || header.count < 0)
	{
		ereport(LOG,
				(errmsg("dwarf: ignoring statistics file \"%s\": it is not this server's", STATS_FILE)));
		header.count = 0;
	}
	for (i = 0; i < header.count && i < dwarf_stats_entries; i++)
	{
		StatsSaved	saved;
		StatsEntry *e;
		bool		found;
		int			j;

		if (fread(&saved, sizeof(saved), 1, file) != 1)
		{
			ereport(LOG,
					(errmsg("dwarf: statistics file \"%s\" is truncated", STATS_FILE)));
			break;
		}
		saved.key.graph[NAMEDATALEN - 1] = '\0';
		saved.key.task[NAMEDATALEN - 1] = '\0';
		e = hash_search(StatsHash, &saved.key, HASH_ENTER_NULL, &found);
		if (e == NULL || found)
			continue;
		InitEntry(e, 0);
		e->reset_at = saved.reset_at;
		for (j = 0; j < STATS_COUNTERS; j++)
			pg_atomic_write_u64(&e->counters[j], saved.counters[j]);
		for (j = 0; j < STATS_BUCKETS; j++)
			pg_atomic_write_u64(&e->buckets[j], saved.buckets[j]);
		pg_atomic_write_u64(&e->sum_us, saved.sum_us);
	}
	FreeFile(file);
	unlink(STATS_FILE);
}

/*
 * shmem_startup_hook: makes (or finds) the entries; the postmaster loads
 * the saved ones and saves them again when it shuts down.
 */
void
StatsShmemStartup(void)
{
	bool		found;
	HASHCTL		info;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	Stats = ShmemInitStruct("dwarf stats", sizeof(StatsShared), &found);
	if (!found)
	{
		Stats->lock = &(GetNamedLWLockTranche("dwarf_stats"))->lock;
		pg_atomic_init_u64(&Stats->clock, 1);
	}
	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(StatsEntry);
	StatsHash = ShmemInitHash("dwarf stats hash", dwarf_stats_entries, dwarf_stats_entries,
							  &info, HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
		on_shmem_exit(SaveStats, (Datum) 0);
	if (!found)
		LoadStats();
}

/* ---------- counting, in a process's own memory ---------- */

/* The bucket a duration falls in. */
static inline int
BucketOf(int64 us)
{
	int			b = 0;

	while (b < STATS_BUCKETS - 1 && us > BucketUs[b])
		b++;
	return b;
}

/* Counts an event on a process's own entry. */
static void
Apply(LocalStats *ls, StatsEvent event, int64 us)
{
	ls->counters[event]++;
	if (event == STATS_STEP_FAILED || event == STATS_STEP_RETRIED)
		ls->counters[STATS_STEP]++;
	if (us >= 0)
	{
		ls->buckets[BucketOf(us)]++;
		ls->sum_us += us;
	}
	if (!ls->dirty)
	{
		ls->dirty = true;
		ls->next = Dirty;
		Dirty = ls;
	}
}

/*
 * Counts an event of the current transaction: on the entry at once in a
 * top-level transaction, else kept with its nest level until the
 * subtransaction commits into its parent or rolls back.
 */
static void
Record(LocalStats *ls, StatsEvent event, int64 us)
{
	int			level = GetCurrentTransactionNestLevel();
	Deferred   *d;

	if (level <= 1)
	{
		Apply(ls, event, us);
		return;
	}
	if (NDeferred == DeferredSize)
	{
		DeferredSize = Max(DeferredSize * 2, 16);
		Deferreds = Deferreds == NULL ?
			MemoryContextAlloc(StatsContext, sizeof(Deferred) * DeferredSize) :
			repalloc(Deferreds, sizeof(Deferred) * DeferredSize);
	}
	d = &Deferreds[NDeferred++];
	d->stats = ls;
	d->event = event;
	d->us = us;
	d->level = level;
}

/* Sets up this process's tables, once. */
static void
LocalInit(void)
{
	HASHCTL		ctl;

	StatsContext = AllocSetContextCreate(TopMemoryContext, "dwarf stats", ALLOCSET_SMALL_SIZES);
	ctl.keysize = sizeof(StatsKey);
	ctl.entrysize = sizeof(LocalStats);
	ctl.hcxt = StatsContext;
	LocalByName = hash_create("dwarf local stats", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	ctl.keysize = offsetof(LocalId, stats);
	ctl.entrysize = sizeof(LocalId);
	LocalById = hash_create("dwarf local stats ids", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * The name of a graph version, read from dwarf.graph (the caller is
 * connected to SPI, with the right to read it); NULL if it is not there.
 */
static char *
GraphName(int32 graph_id)
{
	Datum		arg = Int32GetDatum(graph_id);

	if (GraphNamePlan == NULL)
	{
		Oid			type = INT4OID;
		SPIPlanPtr	plan = SPI_prepare("SELECT name FROM dwarf.graph WHERE id OPERATOR(pg_catalog.=) $1",
									   1, &type);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "dwarf: could not prepare the graph name's lookup: %s",
				 SPI_result_code_string(SPI_result));
		GraphNamePlan = plan;
	}
	if (SPI_execute_plan(GraphNamePlan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read graph version %d", graph_id);
	return SPI_processed == 1 ? SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1) : NULL;
}

/*
 * This process's entry for a graph version's node (-1: the graph's
 * flows), found by graph id and node: one hash probe.  The first time, by
 * name (graph NULL: read from dwarf.graph); NULL when the graph is gone.
 */
static LocalStats *
LocalFor(int32 graph_id, const char *graph, int node, const char *task)
{
	LocalId		idkey;
	LocalId    *id;
	StatsKey	key;
	LocalStats *ls;
	bool		found;

	if (LocalById == NULL)
		LocalInit();
	idkey.graph_id = graph_id;
	idkey.node = node;
	id = hash_search(LocalById, &idkey, HASH_FIND, NULL);
	if (id != NULL)
		return id->stats;
	if (graph == NULL && (graph = GraphName(graph_id)) == NULL)
		return NULL;
	memset(&key, 0, sizeof(key));
	key.dboid = MyDatabaseId;
	strlcpy(key.graph, graph, NAMEDATALEN);
	strlcpy(key.task, task ? task : "", NAMEDATALEN);
	ls = hash_search(LocalByName, &key, HASH_ENTER, &found);
	if (!found)
	{
		memset((char *) ls + sizeof(StatsKey), 0, sizeof(LocalStats) - sizeof(StatsKey));
		ls->dirty = false;
		ls->next = NULL;
	}
	id = hash_search(LocalById, &idkey, HASH_ENTER, NULL);
	id->stats = ls;
	return ls;
}

/*
 * A flow of a graph version was created (graph: its name, or NULL to read
 * it).  Counted by whoever writes the flow's row: InsertFlowRow (flows.c),
 * or, for the flows a worker writes itself for dwarf.run and takes in
 * from what it wrote, TakeInFlow (store.c).  Loading a flow counts nothing.
 */
void
StatsFlowCreated(int32 graph_id, const char *graph)
{
	LocalStats *ls = LocalFor(graph_id, graph, -1, NULL);

	if (ls)
		Record(ls, STATS_CREATED, -1);
}

/*
 * A flow closed (end: STATS_COMPLETED, STATS_FAILED or STATS_CANCELLED),
 * created at created_at: its row was just written so.
 */
void
StatsFlowClosed(int32 graph_id, const char *graph, StatsEvent end, TimestampTz created_at)
{
	LocalStats *ls = LocalFor(graph_id, graph, -1, NULL);

	if (ls)
		Record(ls, end, created_at > 0 ? Max(GetCurrentTimestamp() - created_at, 0) : 0);
}

/*
 * Counts the closes (end) of the flows the last SPI statement returned,
 * with CLOSED_FLOW_COLUMNS from column first on.  A flow whose graph is
 * gone is not counted.
 */
void
StatsClosedRows(int first, StatsEvent end)
{
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *graph = SPI_getvalue(tup, desc, first + 1);

		if (graph != NULL)
			StatsFlowClosed(DatumGetInt32(SPI_getbinval(tup, desc, first, &isnull)), graph, end,
							DatumGetTimestampTz(SPI_getbinval(tup, desc, first + 2, &isnull)));
	}
}

/*
 * A step of a task (node of a graph version) was recorded, its row
 * written: what it came to (STATS_STEP, STATS_STEP_FAILED or
 * STATS_STEP_RETRIED) and when it ran.  A few increments, on the hot path.
 */
void
StatsStep(int32 graph_id, const char *graph, int node, const char *task,
		  StatsEvent event, TimestampTz started, TimestampTz finished)
{
	LocalStats *ls = LocalFor(graph_id, graph, node, task);

	if (ls)
		Record(ls, event, Max(finished - started, 0));
}

/* ---------- at the end of a transaction ---------- */

/*
 * Makes room for new entries: drops the least recently written twentieth
 * of them (at least one).  Allocates nothing, as it runs after a commit.
 * The caller holds the exclusive lock.
 */
static void
Evict(void)
{
	HASH_SEQ_STATUS seq;
	StatsEntry *e;
	uint64		oldest = PG_UINT64_MAX;
	uint64		newest = 0;
	uint64		below;

	hash_seq_init(&seq, StatsHash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		uint64		used = pg_atomic_read_u64(&e->used);

		oldest = Min(oldest, used);
		newest = Max(newest, used);
	}
	below = oldest + (newest - oldest) / 20;
	hash_seq_init(&seq, StatsHash);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (pg_atomic_read_u64(&e->used) <= below)
			(void) hash_search(StatsHash, &e->key, HASH_REMOVE, NULL);
}

/* Adds what a process counted to an entry, and clears it. */
static void
AddTo(StatsEntry *e, LocalStats *ls, uint64 stamp)
{
	int			i;

	for (i = 0; i < STATS_COUNTERS; i++)
		if (ls->counters[i] != 0)
			pg_atomic_fetch_add_u64(&e->counters[i], ls->counters[i]);
	for (i = 0; i < STATS_BUCKETS; i++)
		if (ls->buckets[i] != 0)
			pg_atomic_fetch_add_u64(&e->buckets[i], ls->buckets[i]);
	if (ls->sum_us != 0)
		pg_atomic_fetch_add_u64(&e->sum_us, ls->sum_us);
	pg_atomic_write_u64(&e->used, stamp);
}

/* Forgets what a process counted on its entries and has not added. */
static void
ClearDirty(void)
{
	LocalStats *ls;

	for (ls = Dirty; ls != NULL; ls = ls->next)
	{
		memset(ls->counters, 0, sizeof(ls->counters));
		memset(ls->buckets, 0, sizeof(ls->buckets));
		ls->sum_us = 0;
		ls->dirty = false;
	}
	Dirty = NULL;
}

/*
 * Adds what this process counted to shared memory, after its transaction
 * committed: the entries there under the shared lock, the new ones under
 * the exclusive lock.  Nothing here may raise an error.
 */
static void
Flush(void)
{
	LocalStats *ls;
	uint64		stamp;
	bool		missing = false;

	if (Dirty == NULL)
		return;
	if (Stats == NULL || StatsHash == NULL)
	{
		ClearDirty();
		return;
	}
	stamp = pg_atomic_add_fetch_u64(&Stats->clock, 1);
	LWLockAcquire(Stats->lock, LW_SHARED);
	for (ls = Dirty; ls != NULL; ls = ls->next)
	{
		StatsEntry *e = hash_search(StatsHash, &ls->key, HASH_FIND, NULL);

		if (e)
		{
			AddTo(e, ls, stamp);
			ls->dirty = false;
		}
		else
			missing = true;
	}
	LWLockRelease(Stats->lock);
	if (missing)
	{
		LWLockAcquire(Stats->lock, LW_EXCLUSIVE);
		for (ls = Dirty; ls != NULL; ls = ls->next)
		{
			StatsEntry *e;
			bool		found;

			if (!ls->dirty)
				continue;
			if (hash_search(StatsHash, &ls->key, HASH_FIND, NULL) == NULL &&
				hash_get_num_entries(StatsHash) >= dwarf_stats_entries)
				Evict();
			e = hash_search(StatsHash, &ls->key, HASH_ENTER_NULL, &found);
			if (e == NULL)
				continue;
			if (!found)
				InitEntry(e, stamp);
			AddTo(e, ls, stamp);
		}
		LWLockRelease(Stats->lock);
	}
	ClearDirty();
}

/*
 * Transaction callback: a commit adds what the transaction counted to
 * shared memory; an abort forgets it.
 */
void
StatsXactCallback(XactEvent event, void *arg)
{
	int			i;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PREPARE:
			for (i = 0; i < NDeferred; i++)
				Apply(Deferreds[i].stats, Deferreds[i].event, Deferreds[i].us);
			NDeferred = 0;
			Flush();
			break;
		case XACT_EVENT_ABORT:
			NDeferred = 0;
			ClearDirty();
			break;
		default:
			break;
	}
}

/*
 * Subtransaction callback: what a subtransaction counted goes to its
 * parent when it commits (to the entries, when that is the top level),
 * and is forgotten when it rolls back.  The ending subtransaction is still
 * the current one.
 */
void
StatsSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	int			level;
	int			i;
	int			kept = 0;

	if (NDeferred == 0 ||
		(event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB))
		return;
	level = GetCurrentTransactionNestLevel();
	for (i = 0; i < NDeferred; i++)
	{
		Deferred   *d = &Deferreds[i];

		if (d->level >= level)
		{
			if (event == SUBXACT_EVENT_ABORT_SUB)
				continue;
			if (level - 1 <= 1)
			{
				Apply(d->stats, d->event, d->us);
				continue;
			}
			d->level = level - 1;
		}
		Deferreds[kept++] = *d;
	}
	NDeferred = kept;
}

/* ---------- reading them ---------- */

/* An entry's counters, copied out of shared memory. */
typedef struct StatsCopy
{
	StatsKey	key;
	TimestampTz reset_at;
	uint64		counters[STATS_COUNTERS];
	uint64		buckets[STATS_BUCKETS];
	uint64		sum_us;
} StatsCopy;

/* Orders copies by graph, then task; a graph's flows ("" task) first. */
static int
CompareCopies(const void *a, const void *b)
{
	const StatsCopy *x = a;
	const StatsCopy *y = b;
	int			c = strcmp(x->key.graph, y->key.graph);

	return c != 0 ? c : strcmp(x->key.task, y->key.task);
}

/* This database's entries, copied and sorted; *n of them. */
static StatsCopy *
CopyEntries(int *n)
{
	HASH_SEQ_STATUS seq;
	StatsEntry *e;
	StatsCopy  *copies;
	int			count = 0;

	*n = 0;
	if (Stats == NULL || StatsHash == NULL)
		return NULL;
	LWLockAcquire(Stats->lock, LW_SHARED);
	copies = palloc(sizeof(StatsCopy) * Max(hash_get_num_entries(StatsHash), 1));
	hash_seq_init(&seq, StatsHash);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		StatsCopy  *c;
		int			i;

		if (e->key.dboid != MyDatabaseId)
			continue;
		c = &copies[count++];
		c->key = e->key;
		c->reset_at = e->reset_at;
		for (i = 0; i < STATS_COUNTERS; i++)
			c->counters[i] = pg_atomic_read_u64(&e->counters[i]);
		for (i = 0; i < STATS_BUCKETS; i++)
			c->buckets[i] = pg_atomic_read_u64(&e->buckets[i]);
		c->sum_us = pg_atomic_read_u64(&e->sum_us);
	}
	LWLockRelease(Stats->lock);
	qsort(copies, count, sizeof(StatsCopy), CompareCopies);
	*n = count;
	return copies;
}

/* How many durations a histogram holds. */
static uint64
HistogramCount(const uint64 *buckets)
{
	uint64		count = 0;
	int			i;

	for (i = 0; i < STATS_BUCKETS; i++)
		count += buckets[i];
	return count;
}

/*
 * The q-quantile of a histogram, in seconds, as Prometheus's
 * histogram_quantile estimates it: linear within the bucket that holds
 * it; in the last bucket, the largest bound.  isnull when it is empty.
 */
static Datum
Quantile(const uint64 *buckets, double q, bool *isnull)
{
	uint64		count = HistogramCount(buckets);
	double		rank = q * count;
	uint64		below = 0;
	int			b;

	*isnull = count == 0;
	if (count == 0)
		return (Datum) 0;
	for (b = 0; b < STATS_BUCKETS - 1; b++)
	{
		if (buckets[b] > 0 && below + buckets[b] >= rank)
		{
			double		lower = b == 0 ? 0 : BucketUs[b - 1];

			return Float8GetDatum((lower + (BucketUs[b] - lower) * (rank - below) / buckets[b]) / 1e6);
		}
		below += buckets[b];
	}
	return Float8GetDatum(BucketUs[STATS_BUCKETS - 2] / 1e6);
}

/* Columns of dwarf_internal.stats_counters() (see the SQL script). */
enum
{
	Col_graph,
	Col_task,
	Col_flows_created,
	Col_flows_completed,
	Col_flows_failed,
	Col_flows_cancelled,
	Col_steps_run,
	Col_steps_failed,
	Col_steps_retried,
	Col_flow_sum,
	Col_flow_count,
	Col_flow_p50,
	Col_flow_p95,
	Col_flow_p99,
	Col_step_sum,
	Col_step_count,
	Col_step_p50,
	Col_step_p95,
	Col_step_p99,
	Col_stats_reset,
	Col_count
};

/* Sets a row's duration columns, from sum at column sum on, from a histogram. */
static void
PutDurations(Datum *values, bool *nulls, int sum, const uint64 *buckets, uint64 sum_us)
{
	values[sum] = Float8GetDatum(sum_us / 1e6);
	values[sum + 1] = Int64GetDatum((int64) HistogramCount(buckets));
	values[sum + 2] = Quantile(buckets, 0.50, &nulls[sum + 2]);
	values[sum + 3] = Quantile(buckets, 0.95, &nulls[sum + 3]);
	values[sum + 4] = Quantile(buckets, 0.99, &nulls[sum + 4]);
}

DWARF_FUNCTION(dwarf_stats_counters);

/*
 * dwarf_internal.stats_counters(): this database's counters, a row per
 * graph (task NULL: its flows, and its steps of every task) and a row per
 * task of it.
 * The views dwarf.graph_stats and dwarf.task_stats show them.
 */
Datum
dwarf_stats_counters(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			n;
	StatsCopy  *copies;
	int			first;

	InitMaterializedSRF(fcinfo, 0);
	copies = CopyEntries(&n);
	for (first = 0; first < n;)
	{
		Datum		values[Col_count];
		bool		nulls[Col_count];
		uint64		steps[STATS_COUNTERS] = {0};
		uint64		step_buckets[STATS_BUCKETS] = {0};
		uint64		step_sum = 0;
		StatsCopy  *flows = NULL;
		TimestampTz reset_at = 0;
		int			last;
		int			i;
		int			j;

		for (last = first; last < n && strcmp(copies[last].key.graph, copies[first].key.graph) == 0; last++)
		{
			StatsCopy  *c = &copies[last];

			reset_at = Max(reset_at, c->reset_at);
			if (c->key.task[0] == '\0')
			{
				flows = c;
				continue;
			}
			for (j = STATS_STEP; j < STATS_COUNTERS; j++)
				steps[j] += c->counters[j];
			for (j = 0; j < STATS_BUCKETS; j++)
				step_buckets[j] += c->buckets[j];
			step_sum += c->sum_us;

			/* the task's row */
			memset(nulls, 0, sizeof(nulls));
			values[Col_graph] = CStringGetTextDatum(c->key.graph);
			values[Col_task] = CStringGetTextDatum(c->key.task);
			for (j = STATS_CREATED; j <= STATS_CANCELLED; j++)
				values[Col_flows_created + j] = Int64GetDatum(0);
			for (j = STATS_STEP; j < STATS_COUNTERS; j++)
				values[Col_flows_created + j] = Int64GetDatum((int64) c->counters[j]);
			for (j = Col_flow_sum; j <= Col_flow_p99; j++)
				nulls[j] = true;
			PutDurations(values, nulls, Col_step_sum, c->buckets, c->sum_us);
			values[Col_stats_reset] = TimestampTzGetDatum(c->reset_at);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}

		/* the graph's row */
		memset(nulls, 0, sizeof(nulls));
		values[Col_graph] = CStringGetTextDatum(copies[first].key.graph);
		nulls[Col_task] = true;
		for (i = STATS_CREATED; i <= STATS_CANCELLED; i++)
			values[Col_flows_created + i] = Int64GetDatum(flows ? (int64) flows->counters[i] : 0);
		for (i = STATS_STEP; i < STATS_COUNTERS; i++)
			values[Col_flows_created + i] = Int64GetDatum((int64) steps[i]);
		if (flows)
			PutDurations(values, nulls, Col_flow_sum, flows->buckets, flows->sum_us);
		else
		{
			uint64		none[STATS_BUCKETS] = {0};

			PutDurations(values, nulls, Col_flow_sum, none, 0);
		}
		PutDurations(values, nulls, Col_step_sum, step_buckets, step_sum);
		values[Col_stats_reset] = TimestampTzGetDatum(reset_at);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		first = last;
	}
	return (Datum) 0;
}

DWARF_FUNCTION(dwarf_stats_histogram);

/*
 * dwarf.stats_histogram(): this database's duration histograms, one row
 * per bucket, with the count of durations up to its bound (cumulative, as
 * a Prometheus _bucket): flows' per graph (task NULL), steps' per task.
 */
Datum
dwarf_stats_histogram(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			n;
	StatsCopy  *copies;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	copies = CopyEntries(&n);
	for (i = 0; i < n; i++)
	{
		StatsCopy  *c = &copies[i];
		uint64		cumulative = 0;
		int			b;

		for (b = 0; b < STATS_BUCKETS; b++)
		{
			Datum		values[5];
			bool		nulls[5] = {0};

			cumulative += c->buckets[b];
			values[0] = CStringGetTextDatum(c->key.graph);
			if (c->key.task[0] == '\0')
				nulls[1] = true;
			else
				values[1] = CStringGetTextDatum(c->key.task);
			values[2] = CStringGetTextDatum(c->key.task[0] == '\0' ? "flow" : "step");
			values[3] = Float8GetDatum(b < STATS_BUCKETS - 1 ? BucketUs[b] / 1e6 :
									   get_float8_infinity());
			values[4] = Int64GetDatum((int64) cumulative);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}

DWARF_FUNCTION(dwarf_stats_reset);

/*
 * dwarf.stats_reset(): zeroes this database's counters, which then count
 * from now (stats_reset).  Only the extension's owner or a superuser may.
 */
Datum
dwarf_stats_reset(PG_FUNCTION_ARGS)
{
	Oid			extension = get_extension_oid("dwarf", false);
	HASH_SEQ_STATUS seq;
	StatsEntry *e;

	if (!superuser() && !object_ownercheck(ExtensionRelationId, extension, GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for dwarf.stats_reset"),
				 errdetail("Only the owner of extension dwarf or a superuser may reset its statistics.")));
	if (Stats == NULL || StatsHash == NULL)
		PG_RETURN_VOID();
	LWLockAcquire(Stats->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, StatsHash);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->key.dboid == MyDatabaseId)
			ZeroEntry(e);
	LWLockRelease(Stats->lock);
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_stats_shared);

/*
 * dwarf_internal.stats_shared(): what dwarf.health reads of shared memory:
 * steps ready in this database's workers' queues, steps waiting for a timer
 * (in memory, or evicted sleepers), runners busy (every database's, as
 * dwarf.max_runners is for all) and their most, and the steps blamed for
 * ending their process (crashes.c) in this database.
 */
Datum
dwarf_stats_shared(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[5];
	bool		nulls[5] = {0};
	int64		ready = 0;
	int64		timers = 0;
	int32		busy = 0;
	int32		poison = 0;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "dwarf: stats_shared must return a row");
	if (Dwarf != NULL)
	{
		for (i = 0; i < DWARF_MAX_WORKERS; i++)
		{
			DwarfWorkerSlot *slot = &Dwarf->workers[i];

			if (slot->dboid != MyDatabaseId || slot->pid == 0 || slot->index < 0)
				continue;
			ready += (int64) pg_atomic_read_u64(&slot->ready);
			timers += slot->timers;
			poison = Max(poison, slot->poison_steps);
		}
		for (i = 0; i < DWARF_MAX_RUNNERS; i++)
			if (Dwarf->runners[i].in_use)
				busy++;
	}
	values[0] = Int64GetDatum(ready);
	values[1] = Int64GetDatum(timers);
	values[2] = Int32GetDatum(busy);
	values[3] = Int32GetDatum(Min(dwarf_max_runners >= 0 ? dwarf_max_runners : max_worker_processes / 2,
								  DWARF_MAX_RUNNERS));
	values[4] = Int64GetDatum(poison);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
