/*
 * crashes.c
 *		Steps that end the process running them: a poison step fails after
 *		a few tries instead of making its worker restart for ever.
 *
 * Every worker and runner notes the step it is running in a small file in
 * the data directory, mapped into memory (a store per step, no system
 * call): it outlives the process, and shared memory too, which a crash
 * restart wipes.  A process that the postmaster stops on purpose (SIGQUIT,
 * when another process crashed, or an immediate shutdown) clears its note
 * first, so only the step of the process that died of its own is blamed.
 *
 * When a worker starts, or sees that one of its runners ended before it
 * was done, it blames the step noted there: the step becomes a suspect of
 * that worker, with a count.  A suspect runs in a runner, so that it can
 * take no other flow down with it; once it has ended its process
 * dwarf.step_crashes times, the step fails with an error that says so.
 */
#include "postgres.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/spin.h"

#include "dwarf.h"
#include "shmem.h"
#include "worker.h"

#define CRASH_FILE	"dwarf.crashes"
#define CRASH_MAGIC	0xD3A4F001

/* A step in flight: whose, and which. */
typedef struct Inflight
{
	Oid			dboid;			/* InvalidOid: free */
	int32		worker;			/* the owning worker's number in its database */
	int64		flow_id;		/* 0: none running */
	int32		token_id;
	int32		crashes;		/* for suspects: how often it ended its process */
} Inflight;

typedef struct CrashFile
{
	uint32		magic;
	Inflight	workers[DWARF_MAX_WORKERS];	/* by worker slot */
	Inflight	runners[DWARF_MAX_RUNNERS];	/* by runner slot */
	Inflight	suspects[DWARF_MAX_WORKERS];	/* one per worker, by key */
} CrashFile;

static CrashFile *Crashes = NULL;
static volatile Inflight *MyInflight = NULL;	/* this process's note */
static Inflight *MySuspect = NULL;

/* SIGQUIT: stopped on purpose, so the step in flight is not to blame. */
static void
CrashesQuit(SIGNAL_ARGS)
{
	if (MyInflight)
		MyInflight->flow_id = 0;
	_exit(2);
}

/* Maps the file, making it on first use; NULL (and a LOG line) if it cannot. */
static CrashFile *
MapCrashFile(void)
{
	int			fd;
	void	   *p;

	fd = OpenTransientFile(CRASH_FILE, O_RDWR | O_CREAT | PG_BINARY);
	if (fd < 0 || ftruncate(fd, sizeof(CrashFile)) != 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("dwarf: could not open \"%s\": %m; steps that crash their worker are not counted",
						CRASH_FILE)));
		if (fd >= 0)
			CloseTransientFile(fd);
		return NULL;
	}
	p = mmap(NULL, sizeof(CrashFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CloseTransientFile(fd);
	if (p == MAP_FAILED)
	{
		ereport(LOG, (errmsg("dwarf: could not map \"%s\": %m", CRASH_FILE)));
		return NULL;
	}
	return (CrashFile *) p;
}

static void
Blame(Inflight *step)
{
	if (MySuspect == NULL || step->flow_id == 0)
		return;
	if (MySuspect->flow_id == step->flow_id && MySuspect->token_id == step->token_id)
		MySuspect->crashes++;
	else
	{
		MySuspect->flow_id = step->flow_id;
		MySuspect->token_id = step->token_id;
		MySuspect->crashes = 1;
	}
	ereport(LOG,
			(errmsg("dwarf: a step of flow " INT64_FORMAT " ended the process running it (%d time%s)",
					step->flow_id, MySuspect->crashes, MySuspect->crashes == 1 ? "" : "s")));
	step->flow_id = 0;
}

/*
 * At a worker's start: finds its notes from before (by database and worker
 * number: its slot may differ) and blames the steps they name.
 */
void
CrashesInitWorker(void)
{
	Oid			db = MyDatabaseId;
	int			index = Worker.slot->index;
	int			i;

	pqsignal(SIGQUIT, CrashesQuit);
	if ((Crashes = MapCrashFile()) == NULL)
		return;
	SpinLockAcquire(&Dwarf->mutex);
	if (Crashes->magic != CRASH_MAGIC)
	{
		memset(Crashes, 0, sizeof(CrashFile));
		Crashes->magic = CRASH_MAGIC;
	}
	for (i = 0; i < DWARF_MAX_WORKERS && MySuspect == NULL; i++)
		if (Crashes->suspects[i].dboid == db && Crashes->suspects[i].worker == index)
			MySuspect = &Crashes->suspects[i];
	for (i = 0; i < DWARF_MAX_WORKERS && MySuspect == NULL; i++)
		if (Crashes->suspects[i].dboid == InvalidOid)
		{
			MySuspect = &Crashes->suspects[i];
			MySuspect->dboid = db;
			MySuspect->worker = index;
			MySuspect->flow_id = 0;
		}
	SpinLockRelease(&Dwarf->mutex);

	for (i = 0; i < DWARF_MAX_WORKERS; i++)
		if (Crashes->workers[i].dboid == db && Crashes->workers[i].worker == index)
		{
			Blame(&Crashes->workers[i]);
			Crashes->workers[i].dboid = InvalidOid;
		}
	for (i = 0; i < DWARF_MAX_RUNNERS; i++)
		if (Crashes->runners[i].dboid == db && Crashes->runners[i].worker == index)
		{
			Blame(&Crashes->runners[i]);
			Crashes->runners[i].dboid = InvalidOid;
		}
	MyInflight = &Crashes->workers[Worker.slot - Dwarf->workers];
	MyInflight->flow_id = 0;
	MyInflight->dboid = db;
	MyInflight->worker = index;
}

/* At a runner's start: its note is the runner slot's. */
void
CrashesInitRunner(int runner)
{
	pqsignal(SIGQUIT, CrashesQuit);
	if ((Crashes = MapCrashFile()) == NULL || Crashes->magic != CRASH_MAGIC)
		return;
	MyInflight = &Crashes->runners[runner];
	MyInflight->flow_id = 0;
	MyInflight->dboid = MyDatabaseId;
	MyInflight->worker = Worker.slot->index;
}

/* This process starts running a step (flow_id 0: it ran them all). */
void
CrashesNoteStep(int64 flow_id, int token_id)
{
	if (MyInflight == NULL)
		return;
	MyInflight->token_id = token_id;
	MyInflight->flow_id = flow_id;
}

/* A runner of ours ended before it was done: blame its step. */
void
CrashesRunnerDied(int runner)
{
	if (Crashes == NULL || Crashes->runners[runner].dboid != MyDatabaseId)
		return;
	Blame(&Crashes->runners[runner]);
	Crashes->runners[runner].dboid = InvalidOid;
}

/*
 * How often this step ended the process running it (0 for most steps: one
 * comparison).
 */
int
CrashesOf(int64 flow_id, int token_id)
{
	if (MySuspect == NULL || MySuspect->flow_id != flow_id ||
		MySuspect->token_id != token_id)
		return 0;
	return MySuspect->crashes;
}
