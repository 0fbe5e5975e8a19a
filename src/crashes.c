/*
 * crashes.c
 *		Steps that end the process running them: a poison step fails after
 *		a few tries instead of making its worker restart for ever.
 *
 * Every worker and runner notes the step it is running in a small file in
 * the data directory, mapped into memory (a store per step, no system
 * call): the note outlives the process, and shared memory too, which a
 * crash restart wipes.  Only a step that ends its process on its own is
 * blamed:
 *
 * - a process stopped on purpose clears its note as it goes: a SIGTERM
 *   from another process (pg_ctl stop, the launcher, pg_terminate_backend),
 *   the postmaster's SIGQUIT (another process crashed, or an immediate
 *   shutdown), the postmaster's death;
 * - a process that exits in the middle of a step for any other reason (the
 *   task terminated its own process, or raised a FATAL error) blames the
 *   step on its way out;
 * - a process that dies without a word (kill -9, a segfault) makes the
 *   postmaster restart every process and wipe shared memory; the first
 *   dwarf process after that blames every step still noted in the file.
 *
 * A blamed step becomes a suspect, one per step (database, flow, token),
 * with a count.  A suspect runs in a runner, so that it can take no other
 * flow down with it (lend.c); once it has ended its process
 * dwarf.step_crashes times, the step fails with an error that says so
 * (step.c).  A suspect is forgotten when a transaction that ran it, or
 * failed it for its crashes, commits; a worker, as it starts, forgets those
 * whose flow no longer runs.
 *
 * The file is made whole or not at all (written under a temporary name and
 * renamed into place, as autoprewarm writes its own), and stamped with the
 * system identifier, the timeline and its own device and inode: a copy of
 * the data directory (pg_basebackup, a promoted standby) starts afresh
 * rather than blame its steps for what a process of another server did.
 */
#include "postgres.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/pmsignal.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/snapmgr.h"

#include "dwarf.h"
#include "shmem.h"
#include "worker.h"

#define CRASH_FILE		"dwarf.crashes"
#define CRASH_TEMP_FILE	"dwarf.crashes.tmp"
#define CRASH_MAGIC		0xD3A4F002
#define CRASH_SUSPECTS	128		/* suspects kept at once, for all databases */
#define CRASH_FINISHED	16		/* suspects one transaction may finish */

/* Which server and which file the file is: a copy's differs. */
typedef struct CrashStamp
{
	uint32		magic;
	TimeLineID	timeline;
	uint64		system_id;
	uint64		device;
	uint64		inode;
} CrashStamp;

/* A step: the one a process runs (flow_id 0: none), or a suspect. */
typedef struct CrashStep
{
	Oid			dboid;			/* suspects: InvalidOid when free */
	int32		token_id;
	int64		flow_id;
	int32		crashes;		/* suspects: how often it ended its process */
} CrashStep;

typedef struct CrashFile
{
	CrashStamp	stamp;
	uint32		generation;		/* bumped at every change of suspects[] */
	int32		nsuspects;		/* suspects[] in use */
	CrashStep	workers[DWARF_MAX_WORKERS];	/* notes, by worker slot */
	CrashStep	runners[DWARF_MAX_RUNNERS];	/* notes, by runner slot */
	CrashStep	suspects[CRASH_SUSPECTS];	/* under Dwarf->mutex */
} CrashFile;

static CrashFile *Crashes = NULL;
static volatile CrashStep *MyNote = NULL;	/* this process's note */
static volatile sig_atomic_t StoppedFromOutside = false;

/* This database's suspects as of generation MineAt, for CrashesOf. */
static CrashStep Mine[CRASH_SUSPECTS];
static int	NMine = 0;
static uint32 MineAt = 0;
static bool MineValid = false;

/* Suspects this transaction ran or failed: forgotten if it commits. */
typedef struct FinishedStep
{
	int64		flow_id;
	int32		token_id;
	SubTransactionId subxact;	/* where it ran, or was failed */
} FinishedStep;

static FinishedStep Finished[CRASH_FINISHED];
static int	NFinished = 0;

/* SIGTERM: die(), noting whether another process asked for it. */
static void
CrashesTerm(int signo, siginfo_t *info, void *context)
{
	if (info->si_pid != MyProcPid)
		StoppedFromOutside = true;
	die(signo);
}

/* SIGQUIT: stopped on purpose, so the step in flight is not to blame. */
static void
CrashesQuit(SIGNAL_ARGS)
{
	if (MyNote)
		MyNote->flow_id = 0;
	_exit(2);
}

/* ---------- suspects (under Dwarf->mutex) ---------- */

/* The suspect that is this step, or NULL. */
static CrashStep *
FindSuspect(Oid dboid, int64 flow_id, int token_id)
{
	int			i;

	for (i = 0; i < CRASH_SUSPECTS; i++)
	{
		CrashStep  *s = &Crashes->suspects[i];

		if (s->flow_id == flow_id && s->token_id == token_id && s->dboid == dboid)
			return s;
	}
	return NULL;
}

/*
 * Counts one more crash of a step, making it a suspect if it was not.  When
 * every place is taken, the suspect with the fewest crashes makes room:
 * *dropped says whose flow that was.  Returns the step's count.
 */
static int
AddCrash(const CrashStep *step, int64 *dropped)
{
	CrashStep  *s = FindSuspect(step->dboid, step->flow_id, step->token_id);
	int			i;

	if (s == NULL)
	{
		for (i = 0; i < CRASH_SUSPECTS; i++)
		{
			CrashStep  *c = &Crashes->suspects[i];

			if (c->dboid == InvalidOid)
			{
				s = c;
				Crashes->nsuspects++;
				break;
			}
			if (s == NULL || c->crashes < s->crashes)
				s = c;
		}
		if (s->dboid != InvalidOid)
			*dropped = s->flow_id;
		*s = *step;
		s->crashes = 0;
	}
	s->crashes++;
	Crashes->generation++;
	return s->crashes;
}

/*
 * Blames the step a note names, if any, and clears the note: the step is
 * a suspect with one more crash.  Says so in the server log.
 */
static void
Blame(volatile CrashStep *note)
{
	CrashStep	step = {0};
	int64		dropped = 0;
	int			crashes = 0;

	SpinLockAcquire(&Dwarf->mutex);
	step.dboid = note->dboid;
	step.token_id = note->token_id;
	step.flow_id = note->flow_id;
	note->flow_id = 0;
	if (step.flow_id != 0 && OidIsValid(step.dboid))
		crashes = AddCrash(&step, &dropped);
	SpinLockRelease(&Dwarf->mutex);

	if (dropped != 0)
		ereport(LOG,
				(errmsg("dwarf: too many steps ended their process; the crashes of a step of flow " INT64_FORMAT " are no longer counted",
						dropped)));
	if (crashes > 0)
		ereport(LOG,
				(errmsg("dwarf: a step of flow " INT64_FORMAT " ended the process running it (%d time%s)",
						step.flow_id, crashes, crashes == 1 ? "" : "s")));
}

/* ---------- this process's suspects ---------- */

/* Copies this database's suspects, for CrashesOf to read without a lock. */
static void
CopyMine(void)
{
	int			i;

	SpinLockAcquire(&Dwarf->mutex);
	NMine = 0;
	for (i = 0; i < CRASH_SUSPECTS; i++)
		if (Crashes->suspects[i].dboid == MyDatabaseId)
			Mine[NMine++] = Crashes->suspects[i];
	MineAt = Crashes->generation;
	SpinLockRelease(&Dwarf->mutex);
	MineValid = true;
}

/*
 * How many steps of this database are suspects, blamed for ending their
 * process (dwarf.health shows them as poison steps).
 */
int
CrashesSuspects(void)
{
	if (Crashes == NULL || Crashes->nsuspects == 0)
		return 0;
	if (!MineValid || MineAt != Crashes->generation)
		CopyMine();
	return NMine;
}

/* This step, if this transaction ran or failed it as a suspect; or NULL. */
static FinishedStep *
FindFinished(int64 flow_id, int token_id)
{
	int			i;

	for (i = 0; i < NFinished; i++)
		if (Finished[i].flow_id == flow_id && Finished[i].token_id == token_id)
			return &Finished[i];
	return NULL;
}

/* A suspect this transaction ran or failed: it is done with if it commits. */
static void
NoteFinished(int64 flow_id, int token_id)
{
	if (NFinished == CRASH_FINISHED || FindFinished(flow_id, token_id))
		return;					/* a full list: forgotten later, or counted again */
	Finished[NFinished].flow_id = flow_id;
	Finished[NFinished].token_id = token_id;
	Finished[NFinished].subxact = GetCurrentSubTransactionId();
	NFinished++;
}

/*
 * At commit, forgets the suspects the transaction ran or failed: their
 * step finished without ending the process.
 */
static void
CrashesXactCallback(XactEvent event, void *arg)
{
	int			i;

	if (event == XACT_EVENT_COMMIT && NFinished > 0)
	{
		SpinLockAcquire(&Dwarf->mutex);
		for (i = 0; i < NFinished; i++)
		{
			CrashStep  *s = FindSuspect(MyDatabaseId, Finished[i].flow_id,
										Finished[i].token_id);

			if (s)
			{
				s->dboid = InvalidOid;
				Crashes->nsuspects--;
				Crashes->generation++;
			}
		}
		SpinLockRelease(&Dwarf->mutex);
	}
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT)
		NFinished = 0;
}

/*
 * On the way out, unless the process crashed: one stopped from outside
 * clears its note; one that leaves in the middle of a step of its own
 * accord (the task terminated its own process, or raised a FATAL error)
 * blames the step.
 */
static void
CrashesAtExit(int code, Datum arg)
{
	if (MyNote == NULL || MyNote->flow_id == 0)
		return;
	if (StoppedFromOutside || !PostmasterIsAlive())
		MyNote->flow_id = 0;
	else
		Blame(MyNote);
}

/* ---------- the file ---------- */

/* The stamp of the file open at fd: this server, and this very file. */
static bool
Stamp(int fd, CrashStamp *stamp)
{
	struct stat st;

	if (fstat(fd, &st) != 0)
		return false;
	memset(stamp, 0, sizeof(CrashStamp));
	stamp->magic = CRASH_MAGIC;
	stamp->timeline = GetWALInsertionTimeLine();	/* workers start after recovery */
	stamp->system_id = GetSystemIdentifier();
	stamp->device = st.st_dev;
	stamp->inode = st.st_ino;
	return true;
}

/* Is the file open at fd one this server made, here, whole? */
static bool
StampMatches(int fd)
{
	CrashStamp	want;
	CrashStamp	have;
	struct stat st;

	return Stamp(fd, &want) && fstat(fd, &st) == 0 && st.st_size == sizeof(CrashFile) &&
		pg_pread(fd, &have, sizeof(have), 0) == sizeof(have) &&
		have.magic == want.magic && have.timeline == want.timeline &&
		have.system_id == want.system_id && have.device == want.device &&
		have.inode == want.inode;
}

/*
 * Makes the file afresh, with no note and no suspect: written under a
 * temporary name, stamped, then renamed into place.  Returns false (after
 * a LOG) if it cannot.
 */
static bool
MakeCrashFile(void)
{
	CrashFile  *file = palloc0(sizeof(CrashFile));
	int			fd;
	bool		written;

	fd = OpenTransientFile(CRASH_TEMP_FILE, O_RDWR | O_CREAT | O_TRUNC | PG_BINARY);
	errno = 0;
	written = fd >= 0 && Stamp(fd, &file->stamp) &&
		write(fd, file, sizeof(CrashFile)) == sizeof(CrashFile);
	pfree(file);
	if (!written)
	{
		if (errno == 0)
			errno = ENOSPC;		/* a short write */
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("dwarf: could not write \"%s\": %m", CRASH_TEMP_FILE)));
	}
	if (fd >= 0 && CloseTransientFile(fd) != 0 && written)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("dwarf: could not close \"%s\": %m", CRASH_TEMP_FILE)));
		written = false;
	}
	return written && durable_rename(CRASH_TEMP_FILE, CRASH_FILE, LOG) == 0;
}

/*
 * Maps the file.  The first dwarf process since shared memory was made
 * checks the stamp (a file from another server, or none, is made afresh)
 * and blames the steps noted there: the processes that noted them are all
 * gone, and none stopped on purpose.  NULL (after a LOG) if the file cannot
 * be had; then no step is blamed.
 */
static CrashFile *
MapCrashFile(void)
{
	CrashFile  *file = NULL;
	bool		first;
	int			fd;
	int			i;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	first = !Dwarf->crashes_checked;
	fd = OpenTransientFile(CRASH_FILE, O_RDWR | PG_BINARY);
	if (first && fd >= 0 && !StampMatches(fd))
	{
		ereport(LOG,
				(errmsg("dwarf: \"%s\" is not this data directory's own; it starts afresh",
						CRASH_FILE),
				 errdetail("It was copied from another data directory, or made by another version of dwarf: the steps it names did not end a process here.")));
		CloseTransientFile(fd);
		fd = -1;
	}
	else if (fd < 0 && (!first || errno != ENOENT))
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("dwarf: could not open \"%s\": %m", CRASH_FILE)));
	if (first && fd < 0 && MakeCrashFile())
		fd = OpenTransientFile(CRASH_FILE, O_RDWR | PG_BINARY);
	if (fd >= 0)
	{
		void	   *p = mmap(NULL, sizeof(CrashFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

		if (p == MAP_FAILED)
			ereport(LOG, (errmsg("dwarf: could not map \"%s\": %m", CRASH_FILE)));
		else
			file = (CrashFile *) p;
		CloseTransientFile(fd);
	}
	if (file == NULL)
		ereport(LOG,
				(errmsg("dwarf: steps that end their process are not counted")));
	else if (first)
	{
		Crashes = file;
		for (i = 0; i < DWARF_MAX_WORKERS; i++)
			Blame(&file->workers[i]);
		for (i = 0; i < DWARF_MAX_RUNNERS; i++)
			Blame(&file->runners[i]);
		Dwarf->crashes_checked = true;
	}
	LWLockRelease(AddinShmemInitLock);
	return file;
}

/*
 * Forgets the suspects of this database whose flow no longer runs
 * (cancelled, deleted, failed in another branch): their step will not run
 * again to be forgotten as it finishes.
 */
static void
ForgetGoneFlows(void)
{
	Oid			type = INT8OID;
	int			i;

	if (Crashes->nsuspects == 0)
		return;
	CopyMine();
	if (NMine == 0)
		return;
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "dwarf: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	for (i = 0; i < NMine; i++)
	{
		Datum		id = Int64GetDatum(Mine[i].flow_id);

		if (SPI_execute_with_args("SELECT 1 FROM dwarf.flow WHERE id = $1 AND status IN ('running', 'interrupted')",
								  1, &type, &id, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "dwarf: could not read dwarf.flow");
		if (SPI_processed == 0)
			NoteFinished(Mine[i].flow_id, Mine[i].token_id);
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();	/* forgets them */
}

/*
 * Takes this process's note, a worker's or a runner's, and the signals
 * that tell an orderly stop from a crash.  Returns false if there is no
 * file to note in.
 */
static bool
Attach(bool runner, int index)
{
	struct sigaction act = {0};

	act.sa_sigaction = CrashesTerm;
	sigemptyset(&act.sa_mask);
	act.sa_flags = SA_SIGINFO | SA_RESTART;
	if (sigaction(SIGTERM, &act, NULL) != 0)
		elog(ERROR, "dwarf: could not set the SIGTERM handler: %m");
	pqsignal(SIGQUIT, CrashesQuit);

	if ((Crashes = MapCrashFile()) == NULL)
		return false;
	MyNote = runner ? &Crashes->runners[index] : &Crashes->workers[index];
	MyNote->flow_id = 0;
	MyNote->dboid = MyDatabaseId;
	before_shmem_exit(CrashesAtExit, (Datum) 0);
	RegisterXactCallback(CrashesXactCallback, NULL);
	return true;
}

/* ---------- what the workers and runners call ---------- */

/* At a worker's start: its note is its slot's. */
void
CrashesInitWorker(void)
{
	if (Attach(false, Worker.slot - Dwarf->workers))
		ForgetGoneFlows();
}

/* At a runner's start: its note is the runner slot's. */
void
CrashesInitRunner(int runner)
{
	(void) Attach(true, runner);
}

/*
 * This process starts running a step (flow_id 0: it ran them all).  A
 * suspect that runs here is done with once its transaction commits.
 */
void
CrashesNoteStep(int64 flow_id, int token_id)
{
	if (MyNote == NULL)
		return;
	MyNote->token_id = token_id;
	MyNote->flow_id = flow_id;
	if (flow_id != 0 && CrashesOf(flow_id, token_id) > 0)
		NoteFinished(flow_id, token_id);
}

/*
 * A runner of ours ended before it was done.  It cleared or blamed its note
 * on its way out, unless it died without a word: then the note is blamed
 * here, or after the crash restart that follows, whichever comes first.
 */
void
CrashesRunnerDied(int runner)
{
	if (Crashes != NULL)
		Blame(&Crashes->runners[runner]);
}

/*
 * How often this step ended the process running it: 0 for most steps, at
 * one read when no step is a suspect.
 *
 * A suspect that ran or failed earlier in this transaction, in another
 * (sub)transaction, is done with: what its token runs now is its next step
 * (an on_error handler, a chained successor).  Asked from inside a
 * subtransaction, the caller is CallTask running the step isolated
 * (step.c): at dwarf.step_crashes it fails the step there, so the suspect
 * is done with once that commits.
 */
int
CrashesOf(int64 flow_id, int token_id)
{
	FinishedStep *finished;
	int			i;

	if (Crashes == NULL || Crashes->nsuspects == 0)
		return 0;
	if (!MineValid || MineAt != Crashes->generation)
		CopyMine();
	for (i = 0; i < NMine; i++)
		if (Mine[i].flow_id == flow_id && Mine[i].token_id == token_id)
			break;
	if (i == NMine)
		return 0;
	finished = FindFinished(flow_id, token_id);
	if (finished && finished->subxact != GetCurrentSubTransactionId())
		return 0;
	if (Mine[i].crashes >= dwarf_step_crashes && IsSubTransaction())
		NoteFinished(flow_id, token_id);
	return Mine[i].crashes;
}
