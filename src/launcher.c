/*
 * launcher.c
 *		The launcher: one static background worker that starts dwarf's
 *		workers in every database that has the extension.
 *
 * The launcher is connected to no database, so it reads only pg_database.
 * It does not know which databases have dwarf: it starts their workers, and
 * a worker in a database without the extension says so and exits.  Such
 * databases are probed again only when some backend creates an extension or
 * a database (the object access hook below asks for a rescan on commit).
 *
 * DROP DATABASE stops the database's workers (the hook below, as dropdb
 * does for autovacuum), and a worker that stopped is restarted only after
 * pg_database shows its database is still there.  A worker that cannot
 * start for want of a background worker slot is tried again with a
 * backoff, and the server log says so once, and again when it starts.
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"
#include "flows.h"
#include "http.h"
#include "offers.h"

/* A database the launcher knows of, and the workers it started there. */
typedef struct LauncherDb
{
	Oid			dboid;
	NameData	name;
	bool		absent;			/* probed: no dwarf there; or dropped */
	bool		dropped;		/* gone from pg_database */
	bool		verify;			/* a worker stopped: is the database still there? */
	BackgroundWorkerHandle *handles[DWARF_MAX_WORKERS];
	int			slots[DWARF_MAX_WORKERS];
	TimestampTz restart_at[DWARF_MAX_WORKERS];
	uint64		started_gen[DWARF_MAX_WORKERS];	/* rescan generation at start */
	int			retry_ms[DWARF_MAX_WORKERS];	/* backoff while no slot is free, or 0 */
	TimestampTz waiting_since[DWARF_MAX_WORKERS];	/* ... since when */
	bool		warned[DWARF_MAX_WORKERS];	/* ... and the log says so */
	BackgroundWorkerHandle *http;	/* its HTTP process (http.c), or NULL */
	int			http_slot;
	TimestampTz http_restart_at;
} LauncherDb;

/* A row of pg_database that may have dwarf. */
typedef struct DbEntry
{
	Oid			dboid;
	NameData	name;
} DbEntry;

#define LAUNCHER_MAX_DBS 1024
#define RESTART_DELAY_MS 1000
#define RETRY_MIN_MS	250		/* first retry of a worker that found no slot */
#define RETRY_MAX_MS	10000	/* ... doubling up to this */
#define RETRY_WARN_MS	5000	/* waits longer than at startup's contention */

static LauncherDb dbs[LAUNCHER_MAX_DBS];
static int	ndbs = 0;
static uint64 rescan_gen = 0;	/* counts rescan requests */

static object_access_hook_type prev_object_access_hook = NULL;

/*
 * DROP DATABASE: its dwarf workers and runners are told to exit, as dropdb
 * does with autovacuum workers, so that the drop does not fail for their
 * sessions (it waits for them to go).  dropdb already holds the database's
 * lock, so a worker the launcher starts meanwhile waits at connect; if the
 * drop fails after all, that worker carries on, and if it commits, the
 * launcher sees the database gone and starts none again.  DROP EXTENSION
 * uses it too (dwarf.c).  The pids signalled go in pids, if given (room
 * for DWARF_MAX_WORKERS + DWARF_MAX_RUNNERS); returns how many.
 */
int
StopDatabaseWorkers(Oid dboid, pid_t *pids)
{
	int			i;
	int			n = 0;

	if (Dwarf == NULL)
		return 0;
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];
		pid_t		pid = 0;

		SpinLockAcquire(&slot->mutex);
		if (slot->dboid == dboid)
			pid = slot->pid;
		SpinLockRelease(&slot->mutex);
		if (pid > 0)
		{
			kill(pid, SIGTERM);
			if (pids)
				pids[n++] = pid;
		}
	}
	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
	{
		DwarfRunnerSlot *runner = &Dwarf->runners[i];
		bool		ours;
		pid_t		pid = 0;

		SpinLockAcquire(&Dwarf->mutex);
		ours = runner->in_use && runner->dboid == dboid;
		SpinLockRelease(&Dwarf->mutex);
		if (!ours)
			continue;
		SpinLockAcquire(&runner->mutex);
		if (!runner->done)
			pid = runner->pid;
		SpinLockRelease(&runner->mutex);
		if (pid > 0)
		{
			kill(pid, SIGTERM);
			if (pids)
				pids[n++] = pid;
		}
	}
	return n;
}

/*
 * Object access hook: a new extension or database may need workers.  The
 * rescan happens when the transaction commits.  A dropped database's
 * workers must go at once, for the drop to succeed.
 */
static void
DwarfObjectAccess(ObjectAccessType access, Oid classId, Oid objectId,
				  int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);

	if ((classId == ExtensionRelationId &&
		 (access == OAT_POST_CREATE || access == OAT_DROP)) ||
		(classId == DatabaseRelationId && access == OAT_POST_CREATE))
		DwarfRescanOnCommit();
	if (classId == DatabaseRelationId && access == OAT_DROP)
		(void) StopDatabaseWorkers(objectId, NULL);
}

/* Registers the launcher and the hook; from _PG_init when preloaded. */
void
DwarfRegisterLauncher(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "dwarf");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "DwarfLauncherMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "dwarf launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "dwarf launcher");
	RegisterBackgroundWorker(&worker);

	prev_object_access_hook = object_access_hook;
	object_access_hook = DwarfObjectAccess;
}

/*
 * Reads pg_database: every database, but templates, that accepts
 * connections, as a list of DbEntry.
 */
static List *
ListDatabases(void)
{
	List	   *result = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	MemoryContext outer = CurrentMemoryContext;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);
		DbEntry    *entry;
		MemoryContext old;

		/*
		 * Template databases get no workers: a connected worker would make
		 * every CREATE DATABASE that copies them fail.
		 */
		if (!db->datallowconn || db->datistemplate ||
			db->datconnlimit == DATCONNLIMIT_INVALID_DB)
			continue;
		old = MemoryContextSwitchTo(outer);
		entry = palloc(sizeof(DbEntry));
		entry->dboid = db->oid;
		entry->name = db->datname;
		result = lappend(result, entry);
		MemoryContextSwitchTo(old);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return result;
}

/* Takes a free worker slot for (dboid, index); -1 when all are taken. */
static int
ClaimSlot(Oid dboid, int index)
{
	int			i;

	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];

		if (slot->dboid == InvalidOid)
		{
			SpinLockAcquire(&slot->mutex);
			slot->dboid = dboid;
			slot->index = index;
			slot->pid = 0;
			slot->latch = NULL;
			slot->no_extension = false;
			slot->replaced = false;
			slot->best_priority = PG_INT32_MAX;
			slot->running_priority = PG_INT32_MAX;
			slot->head = slot->tail = 0;
			slot->overflow = false;
			SpinLockRelease(&slot->mutex);
			return i;
		}
	}
	return -1;
}

static void
ReleaseSlot(int i)
{
	DwarfWorkerSlot *slot = &Dwarf->workers[i];

	SpinLockAcquire(&slot->mutex);
	slot->dboid = InvalidOid;
	slot->latch = NULL;
	slot->pid = 0;
	SpinLockRelease(&slot->mutex);
}

/*
 * Worker index of db found no slot to start in: tries again after a
 * backoff.  Once it has waited longer than the contention of a server
 * start, the server log says so, with what to raise, as the flows that
 * worker owns wait until it runs.
 */
static void
RetryLater(LauncherDb *db, int index, TimestampTz now, bool dwarf_slots)
{
	if (db->retry_ms[index] == 0)
	{
		db->retry_ms[index] = RETRY_MIN_MS;
		db->waiting_since[index] = now;
		db->warned[index] = false;
	}
	else
		db->retry_ms[index] = Min(db->retry_ms[index] * 2, RETRY_MAX_MS);
	db->restart_at[index] = TimestampTzPlusMilliseconds(now, db->retry_ms[index]);

	if (db->warned[index] ||
		!TimestampDifferenceExceeds(db->waiting_since[index], now, RETRY_WARN_MS))
		return;
	db->warned[index] = true;
	if (dwarf_slots)
		ereport(WARNING,
				(errmsg("dwarf: worker %d of database \"%s\" cannot start: all %d dwarf worker slots are taken",
						index, NameStr(db->name), DWARF_MAX_WORKERS),
				 errdetail("If dwarf is installed there, its flows whose id modulo dwarf.workers is %d wait until that worker starts; the launcher tries again every %d s.",
						   index, RETRY_MAX_MS / 1000),
				 errhint("Lower dwarf.workers (now %d), or drop the extension from databases that do not use it.",
						 dwarf_workers)));
	else
		ereport(WARNING,
				(errmsg("dwarf: worker %d of database \"%s\" cannot start: no background worker slot is free",
						index, NameStr(db->name)),
				 errdetail("If dwarf is installed there, its flows whose id modulo dwarf.workers is %d wait until that worker starts; the launcher tries again every %d s.",
						   index, RETRY_MAX_MS / 1000),
				 errhint("Raise max_worker_processes (now %d): each database with dwarf takes dwarf.workers (%d) slots, the launcher one, and runners up to dwarf.max_runners.",
						 max_worker_processes, dwarf_workers)));
}

/*
 * Starts worker number index of a database, or schedules a retry when no
 * slot is free.
 */
static void
StartWorker(LauncherDb *db, int index, TimestampTz now)
{
	BackgroundWorker worker;
	int			slot = ClaimSlot(db->dboid, index);

	if (slot < 0)
	{
		RetryLater(db, index, now, true);
		return;
	}

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "dwarf");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "DwarfWorkerMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "dwarf worker %d for database %u",
			 index, db->dboid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "dwarf worker");
	worker.bgw_main_arg = Int32GetDatum(slot);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &db->handles[index]))
	{
		ReleaseSlot(slot);
		db->handles[index] = NULL;
		RetryLater(db, index, now, false);
		return;
	}
	if (db->retry_ms[index] != 0 && db->warned[index])
		ereport(LOG,
				(errmsg("dwarf: worker %d of database \"%s\" is starting, after waiting %ld s for a free slot",
						index, NameStr(db->name),
						(long) ((now - db->waiting_since[index]) / USECS_PER_SEC))));
	db->retry_ms[index] = 0;
	db->slots[index] = slot;
	db->started_gen[index] = rescan_gen;
}

/*
 * Starts the HTTP process of a database (http.c), in a worker slot of its
 * own (index DWARF_HTTP_INDEX), so that DROP DATABASE and DROP EXTENSION
 * stop it with the database's workers.  Without a free slot it is tried
 * again later; the database's workers' waits already say why in the log.
 */
static void
StartHttp(LauncherDb *db, TimestampTz now)
{
	BackgroundWorker worker;
	int			slot = ClaimSlot(db->dboid, DWARF_HTTP_INDEX);

	db->http_restart_at = TimestampTzPlusMilliseconds(now, RETRY_MAX_MS);
	if (slot < 0)
		return;
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "dwarf");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "DwarfHttpMain");
	snprintf(worker.bgw_name, BGW_MAXLEN, "dwarf http for database %u", db->dboid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "dwarf http");
	worker.bgw_main_arg = Int32GetDatum(slot);
	worker.bgw_notify_pid = MyProcPid;
	if (!RegisterDynamicBackgroundWorker(&worker, &db->http))
	{
		ReleaseSlot(slot);
		db->http = NULL;
		return;
	}
	db->http_slot = slot;
}

/*
 * Keeps a database's HTTP process running while dwarf.http_allow is set
 * and its first worker runs (so dwarf is installed there); it exits by
 * itself once the setting is emptied.  Returns how long the launcher may
 * sleep for it (-1: no limit).
 */
static long
TendHttp(LauncherDb *db, TimestampTz now)
{
	pid_t		pid;

	if (db->http != NULL && GetBackgroundWorkerPid(db->http, &pid) == BGWH_STOPPED)
	{
		db->http_restart_at = TimestampTzPlusMilliseconds(now, Dwarf->workers[db->http_slot].no_extension ?
														  RETRY_MAX_MS : RESTART_DELAY_MS);
		pfree(db->http);
		db->http = NULL;
		ReleaseSlot(db->http_slot);
	}
	if (db->http != NULL || db->absent || dwarf_http_allow[0] == '\0' || db->handles[0] == NULL)
		return -1;
	if (Dwarf->workers[db->slots[0]].pid == 0)
		return RESTART_DELAY_MS;	/* look again once it runs */
	if (db->http_restart_at <= now)
		StartHttp(db, now);
	return db->http ? -1 : TimestampDifferenceMilliseconds(now, db->http_restart_at) + 1;
}

/* The entry of dboid in a list of DbEntry, or NULL. */
static DbEntry *
FindDatabase(List *entries, Oid dboid)
{
	ListCell   *lc;

	foreach(lc, entries)
	{
		DbEntry    *entry = lfirst(lc);

		if (entry->dboid == dboid)
			return entry;
	}
	return NULL;
}

/* Forgets dropped databases whose workers have all stopped. */
static void
ForgetDropped(void)
{
	int			i;

	for (i = 0; i < ndbs; i++)
	{
		int			w;
		bool		idle = true;

		for (w = 0; w < DWARF_MAX_WORKERS; w++)
			if (dbs[i].handles[w] != NULL)
				idle = false;
		if (dbs[i].http != NULL)
			idle = false;
		if (idle && dbs[i].dropped)
		{
			OffersForgetDatabase(dbs[i].dboid);	/* its steps' offers, leases, queues */
			dbs[i] = dbs[--ndbs];
			i--;
		}
	}
}

/*
 * Adds databases not yet known; stops tending dropped ones, and forgets
 * them once their workers have stopped; after a rescan request, probes
 * again.
 */
static void
RefreshDatabases(bool reprobe)
{
	List	   *entries = ListDatabases();
	ListCell   *lc;
	int			i;

	foreach(lc, entries)
	{
		DbEntry    *entry = lfirst(lc);
		bool		known = false;

		for (i = 0; i < ndbs; i++)
			if (dbs[i].dboid == entry->dboid)
				known = true;
		if (!known && ndbs < LAUNCHER_MAX_DBS)
		{
			memset(&dbs[ndbs], 0, sizeof(LauncherDb));
			dbs[ndbs].dboid = entry->dboid;
			ndbs++;
		}
		else if (!known)
			ereport(WARNING,
					(errmsg("dwarf: database \"%s\" gets no workers: the launcher tends at most %d databases",
							NameStr(entry->name), LAUNCHER_MAX_DBS),
					 errhint("Drop the extension from databases that do not use it.")));
	}
	for (i = 0; i < ndbs; i++)
	{
		LauncherDb *db = &dbs[i];
		DbEntry    *entry = FindDatabase(entries, db->dboid);

		db->verify = false;
		if (entry == NULL)
		{
			if (!db->dropped && !db->absent)
				ereport(LOG,
						(errmsg("dwarf: database \"%s\" was dropped; its workers are not started again",
								NameStr(db->name))));
			db->dropped = true;
			db->absent = true;
		}
		else
		{
			db->name = entry->name;
			db->dropped = false;	/* its oid may have been taken again */
			if (reprobe)
				db->absent = false;
		}
	}
	ForgetDropped();
	list_free_deep(entries);
}

/*
 * Keeps every database's workers running: reaps the ones that stopped and
 * starts the missing ones.  Returns how long the launcher may sleep.
 */
static long
TendWorkers(void)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep_ms = -1;
	bool		verify = false;
	int			d,
				i;

	for (d = 0; d < ndbs; d++)
	{
		LauncherDb *db = &dbs[d];

		for (i = 0; i < dwarf_workers; i++)
		{
			pid_t		pid;

			if (db->handles[i] != NULL &&
				GetBackgroundWorkerPid(db->handles[i], &pid) == BGWH_STOPPED)
			{
				DwarfWorkerSlot *slot = &Dwarf->workers[db->slots[i]];

				/*
				 * A worker that found no extension proves the database has
				 * none, unless a rescan came after it started: then dwarf
				 * may have been created since, and it starts again.  Any
				 * other stop may be DROP DATABASE's.
				 */
				if (slot->no_extension && db->started_gen[i] == rescan_gen)
					db->absent = true;
				else if (slot->no_extension || slot->replaced)
					db->restart_at[i] = now;	/* a replaced one was in a database that is there */
				else
				{
					db->restart_at[i] = TimestampTzPlusMilliseconds(now, RESTART_DELAY_MS);
					db->verify = true;
				}
				pfree(db->handles[i]);
				db->handles[i] = NULL;
				ReleaseSlot(db->slots[i]);
			}
			if (db->verify && !db->absent && db->handles[i] == NULL &&
				db->restart_at[i] <= now)
				verify = true;
		}
	}

	/*
	 * Before a worker that stopped starts again, pg_database must still
	 * have its database: else it would fail to connect, again and again.
	 */
	if (verify)
		RefreshDatabases(false);
	else
		ForgetDropped();

	for (d = 0; d < ndbs; d++)
	{
		LauncherDb *db = &dbs[d];

		if (db->absent)
			continue;
		for (i = 0; i < dwarf_workers; i++)
		{
			if (db->handles[i] == NULL && db->restart_at[i] <= now)
				StartWorker(db, i, now);
			if (db->handles[i] == NULL)
			{
				long		ms = TimestampDifferenceMilliseconds(now, db->restart_at[i]) + 1;

				if (sleep_ms < 0 || ms < sleep_ms)
					sleep_ms = ms;
			}
		}
	}
	for (d = 0; d < ndbs; d++)
	{
		long		ms = TendHttp(&dbs[d], now);

		if (ms >= 0 && (sleep_ms < 0 || ms < sleep_ms))
			sleep_ms = ms;
	}
	return sleep_ms;
}

/*
 * Waits until the workers an earlier launcher left are gone (they were
 * told to stop), so that no flow ever has two workers; at most a minute.
 */
static void
WaitForOrphans(pid_t *pids, int n)
{
	int			waited;

	for (waited = 0; waited < 600; waited++)
	{
		int			alive = 0;
		int			i;

		for (i = 0; i < n; i++)
			if (pids[i] > 0 && kill(pids[i], 0) == 0)
				alive++;
		if (alive == 0)
			return;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(100 * 1000L);
	}
	ereport(LOG,
			(errmsg("dwarf: workers of an earlier launcher are still running after a minute; starting new ones anyway")));
}

/*
 * The launcher's main loop.  It sleeps until a worker starts or stops
 * (bgw_notify_pid), a rescan is asked for, or a delayed restart is due.
 */
void
DwarfLauncherMain(Datum arg)
{
	bool		first = true;
	pid_t		orphans[DWARF_MAX_WORKERS];
	int			norphans = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("dwarf launcher");

	SpinLockAcquire(&Dwarf->mutex);
	Dwarf->launcher_latch = MyLatch;
	SpinLockRelease(&Dwarf->mutex);

	/*
	 * A launcher that restarted on its own (not with the whole server) has no
	 * handles for the workers it left: stop them, and start new ones after
	 * a delay long enough for the old ones to be gone.
	 */
	for (int i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		if (Dwarf->workers[i].dboid == InvalidOid)
			continue;
		if (Dwarf->workers[i].pid > 0)
		{
			orphans[norphans++] = Dwarf->workers[i].pid;
			kill(Dwarf->workers[i].pid, SIGTERM);
		}
		ReleaseSlot(i);
	}
	WaitForOrphans(orphans, norphans);

	for (;;)
	{
		bool		rescan;
		long		sleep_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		SpinLockAcquire(&Dwarf->mutex);
		rescan = Dwarf->rescan;
		Dwarf->rescan = false;
		SpinLockRelease(&Dwarf->mutex);

		if (rescan)
			rescan_gen++;
		if (first || rescan)
			RefreshDatabases(true);
		first = false;

		sleep_ms = TendWorkers();

		/* A rescan asked for while we read pg_database must not wait. */
		if (Dwarf->rescan)
			continue;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
						 (sleep_ms >= 0 ? WL_TIMEOUT : 0),
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
