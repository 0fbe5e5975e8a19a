/*
 * dwarf.c
 *		Module entry point: defines the settings (their values live in
 *		globals.c), hooks shared memory and registers the launcher.
 *
 * dwarf must be in shared_preload_libraries: it needs shared memory for its
 * wake-ups and a launcher that starts the workers of each database.
 */
#include "postgres.h"

#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"
#include "flows.h"
#include "offers.h"
#include "limits.h"
#include "partitions.h"
#include "stats.h"
#include "url.h"

extern DWARF_EXPORT const Pg_magic_struct *PG_MAGIC_FUNCTION_NAME(void);
PG_MODULE_MAGIC;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ProcessUtility_hook_type prev_process_utility_hook = NULL;

/* How long DROP EXTENSION dwarf waits for the database's workers to exit. */
#define DROP_WAIT_MS	10000

extern DWARF_EXPORT void _PG_init(void);

/*
 * Check hook of the retention settings: an interval with no negative part.
 * dwarf.maintain reads them with ::interval.
 */
static bool
check_archive_interval(char **newval, void **extra, GucSource source)
{
	struct pg_itm_in itm_in;
	int			dtype;
	char	   *field[MAXDATEFIELDS];
	int			ftype[MAXDATEFIELDS];
	char		workbuf[256];
	int			nf;
	Interval	result;

	if (ParseDateTime(*newval, workbuf, sizeof(workbuf), field, ftype, MAXDATEFIELDS, &nf) != 0 ||
		(DecodeInterval(field, ftype, nf, INTERVAL_FULL_RANGE, &dtype, &itm_in) != 0 &&
		 DecodeISO8601Interval(*newval, &dtype, &itm_in) != 0) ||
		dtype != DTK_DELTA || itmin2interval(&itm_in, &result) != 0)
	{
		GUC_check_errdetail("\"%s\" is not an interval.", *newval);
		return false;
	}
	if (result.month < 0 || result.day < 0 || result.time < 0)
	{
		GUC_check_errdetail("It must not be negative.");
		return false;
	}
	return true;
}

static void
dwarf_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	DwarfShmemRequest();
	OffersShmemRequest();
	LimitsShmemRequest();
	StatsShmemRequest();
}

static void
dwarf_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	DwarfShmemStartup();
	OffersShmemStartup();
	LimitsShmemStartup();
	StatsShmemStartup();
}

/* Does this statement drop the extension dwarf? */
static bool
DropsDwarf(Node *parsetree)
{
	DropStmt   *stmt;
	ListCell   *lc;

	if (!IsA(parsetree, DropStmt))
		return false;
	stmt = (DropStmt *) parsetree;
	if (stmt->removeType != OBJECT_EXTENSION)
		return false;
	foreach(lc, stmt->objects)
		if (strcmp(strVal(lfirst(lc)), "dwarf") == 0)
			return true;
	return false;
}

/*
 * DROP EXTENSION dwarf: the database's workers and runners stop before the
 * drop takes its locks.  A worker holds locks on dwarf's tables in its own
 * order while a batch runs, and the drop takes them in the order of the
 * dependencies, so the two could deadlock (and the drop was the one to
 * fail).  The extension's own lock is taken first, the one DROP EXTENSION
 * takes first anyway: a worker the launcher starts meanwhile waits for it
 * before it touches any table (ExitIfNotInstalled, worker.c), and then
 * finds dwarf gone, or carries on if the drop rolled back.  The wait for
 * the workers to exit is bounded; past it the drop goes ahead.
 */
static void
StopWorkersForDrop(void)
{
	Oid			extension = get_extension_oid("dwarf", true);
	pid_t		pids[DWARF_MAX_WORKERS + DWARF_MAX_RUNNERS];
	int			n;
	int			waited = 0;

	/*
	 * Only for a role that may drop it: anyone else's DROP fails on its
	 * privileges as usual, and must not stop the workers on the way.
	 */
	if (!OidIsValid(extension) || !object_ownercheck(ExtensionRelationId, extension, GetUserId()))
		return;
	LockDatabaseObject(ExtensionRelationId, extension, 0, AccessExclusiveLock);
	n = StopDatabaseWorkers(MyDatabaseId, pids);
	while (waited < DROP_WAIT_MS)
	{
		int			i;
		bool		alive = false;

		for (i = 0; i < n && !alive; i++)
			alive = BackendPidGetProc(pids[i]) != NULL;
		if (!alive)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		waited += 10;
	}
}

/* The utility hook: DROP EXTENSION dwarf stops the workers first. */
static void
dwarf_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					  ProcessUtilityContext context, ParamListInfo params,
					  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	if (DropsDwarf(pstmt->utilityStmt))
		StopWorkersForDrop();
	if (prev_process_utility_hook)
		prev_process_utility_hook(pstmt, queryString, readOnlyTree, context, params,
								  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}

/*
 * Defines the settings, hooks shared memory and registers the launcher.
 * dwarf works only when preloaded.
 */
void
_PG_init(void)
{
	/*
	 * Its settings include one that only the postmaster may set, which
	 * PostgreSQL refuses to define later (with a FATAL error): say why
	 * instead.
	 */
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dwarf must be loaded by shared_preload_libraries"),
				 errhint("Add dwarf to shared_preload_libraries in postgresql.conf and restart the server.")));

	DefineCustomIntVariable("dwarf.workers",
							"Background workers that run flows, per database.",
							NULL,
							&dwarf_workers,
							2, 1, 32,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_limit_keys",
							"Live counts of named limits (dwarf.set_limit) shared memory holds, a limit's key each, for all databases.",
							"A count goes when nothing of it is in progress and its rate has nothing to remember; a step whose limit finds none free waits.",
							&dwarf_max_limit_keys,
							1024, 16, 1000000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.batch_size",
							"Steps a worker runs and commits together.",
							"Each batch is one transaction and one WAL flush.",
							&dwarf_batch_size,
							512, 1, 4096,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.shard_id",
							"This server's shard number, carried in the high bits of every flow id.",
							NULL,
							&dwarf_shard_id,
							0, 0, 32767,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.batch_time",
							"Time after which a batch starts no further step.",
							"The steps it did not start go back to the queue for the next batch.",
							&dwarf_batch_time,
							100, 1, 60000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.long_step",
							"Run time from which a task counts as slow; its steps then run in runner workers.",
							"A slow task's steps run one per runner and transaction, so that they hold up no other flow. 0 runs every step in the workers.",
							&dwarf_long_step,
							250, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_runners",
							"Runner workers that may run slow steps at once, for all databases.",
							"-1 uses half of max_worker_processes.",
							&dwarf_max_runners,
							-1, -1, DWARF_MAX_RUNNERS,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.step_crashes",
							"Times a step may end the process running it before it fails.",
							"After the first, the step runs in a runner, where it can take no other flow down.",
							&dwarf_step_crashes,
							3, 1, 100,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_step_time",
							"Longest a step may run in a runner worker; it then fails.",
							"A flow's time_budget may limit its steps further. 0 means no limit. (In a worker, a step that runs past dwarf.long_step is moved to a runner.)",
							&dwarf_max_step_time,
							3600000, 0, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomStringVariable("dwarf.archive_after",
							   "How long a closed flow stays in the live tables before dwarf.maintain archives it.",
							   "An interval, such as '1 min'. Running and interrupted flows are never archived.",
							   &dwarf_archive_after,
							   "1 min",
							   PGC_USERSET,
							   0,
							   check_archive_interval, NULL, NULL);

	DefineCustomStringVariable("dwarf.segment_interval",
							   "How long the flows whose steps share one partition of the step log take to be created.",
							   "dwarf.maintain makes each segment of dwarf.step_log as wide as the flows created in this "
							   "interval at the current rate, archives it whole once its flows have closed and drops it "
							   "after dwarf.retention: the step log has about retention / interval archived partitions.",
							   &dwarf_segment_interval,
							   "1 hour",
							   PGC_USERSET,
							   0,
							   check_archive_interval, NULL, NULL);

	DefineCustomStringVariable("dwarf.retention",
							   "How long archived flows are kept; dwarf.maintain drops the days older than this.",
							   "An interval, such as '30 days'. Days are dropped whole, never deleted row by row.",
							   &dwarf_retention,
							   "30 days",
							   PGC_USERSET,
							   0,
							   check_archive_interval, NULL, NULL);

	/*
	 * Caps that keep one flow from taking the engine from the others.  The
	 * workers apply them: set them in postgresql.conf or with ALTER SYSTEM
	 * (and reload), or per database with ALTER DATABASE (read when its
	 * workers start).  Only a superuser may change them.
	 */
	DefineCustomIntVariable("dwarf.max_flow_steps",
							"Steps a flow may take; its next one fails it.",
							"Every step counts, each attempt of a retry too, so that a task that goes to itself or retries without end cannot write rows for ever.",
							&dwarf_max_flow_steps,
							250000, 1, INT_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_for_each",
							"Branches one step's for_each edges may start.",
							"A step whose for_each arrays hold more elements fails, as if its task had raised: its on_error edges are taken.",
							&dwarf_max_for_each,
							100000, 1, INT_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_state_size",
							"Largest state dwarf.state_at and dwarf.snapshot build.",
							"A fold that would build a larger state fails with an error that names this setting, before it takes the memory.",
							&dwarf_max_state_size,
							65536, 1, MaxAllocSize / 1024,
							PGC_SUSET,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.min_retry_delay",
							"Shortest backoff dwarf.retry asks for; a shorter one is raised to it.",
							"A task that retries without end then writes a step row at most this often.",
							&dwarf_min_retry_delay,
							100, 0, 3600000,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_tree_flows",
							"Flows one tree of subgraphs may hold, its top flow included.",
							"A dwarf.subgraph call past it fails, and the top flow of the tree fails with every flow below it stopped, so that a task that starts subgraphs of its own graph cannot multiply flows without end.",
							&dwarf_max_tree_flows,
							10000, 1, INT_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_step_children",
							"Child flows one step may start with dwarf.subgraph.",
							"A call past it raises an error in the task.",
							&dwarf_max_step_children,
							1000, 1, INT_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.max_external_steps",
							"Steps of external tasks the server can offer to claims at once.",
							"Each takes about 400 bytes of shared memory, plus its state in dwarf.external_memory; "
							"a step past it waits, and is offered once there is room.",
							&dwarf_max_external_steps,
							20000, 16, 10000000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.external_memory",
							"Shared memory the states of offered external steps may take.",
							"It is shared by the roles that own offered steps, each at most memory / (other such roles + 2); "
							"a step whose state does not fit waits, and is offered once there is room.",
							&dwarf_external_memory,
							65536, 64, INT_MAX / 2,
							PGC_SIGHUP,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	/*
	 * HTTP tasks (http.c): server-wide, set in postgresql.conf or with
	 * ALTER SYSTEM (and reload); the launcher starts a database's HTTP
	 * process only while dwarf.http_allow is set.
	 */
	DefineCustomStringVariable("dwarf.http_allow",
							   "URL prefixes HTTP tasks may call, separated by commas.",
							   "Empty (the default) allows no call: no HTTP process runs, and HTTP steps wait. "
							   "A step whose URL starts with none of them fails without a request. "
							   "Prefixes and URLs are compared in normal form (dot-segments resolved, escapes, case of scheme and host, "
							   "default ports), and a prefix ends at a path segment: \"https://api.example.com/v1\" allows \"/v1/x\", not \"/v1x\".",
							   &dwarf_http_allow,
							   "",
							   PGC_SIGHUP,
							   0,
							   UrlCheckAllow, NULL, NULL);

	DefineCustomIntVariable("dwarf.http_max_response",
							"Largest answer body an HTTP task takes.",
							"A call whose answer is larger is aborted, and its step fails (not retried).",
							&dwarf_http_max_response,
							1024, 1, 1024 * 1024,
							PGC_SIGHUP,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.http_max_in_flight",
							"HTTP calls one database's HTTP process makes at once.",
							"Each role may hold its share of them; its steps past that wait, offered, until one of its calls ends.",
							&dwarf_http_max_in_flight,
							10000, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.http_max_host_connections",
							"Connections one database's HTTP process opens to one host at once.",
							"Each role may hold its share of them; its calls past that wait for a connection, their lease kept and their timeout not running.",
							&dwarf_http_max_host_connections,
							1000, 1, 1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.http_max_response_memory",
							"Memory the answers of one database's HTTP calls may take, all together.",
							"Each call in flight holds dwarf.http_max_response of it, from its start: the calls at once are at most this over that (and at least one), shared between roles.",
							&dwarf_http_max_response_memory,
							2 * 1024 * 1024, 1024, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("dwarf.stats_entries",
							"Graphs and tasks whose statistics shared memory keeps, for all databases.",
							"Each takes about 400 bytes. When they are full, the least recently counted ones go, and count from zero if they come back.",
							&dwarf_stats_entries,
							4096, 64, 1000000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("dwarf");

	RegisterXactCallback(DwarfXactCallback, NULL);
	RegisterXactCallback(StatsXactCallback, NULL);
	RegisterSubXactCallback(StatsSubXactCallback, NULL);

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = dwarf_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = dwarf_shmem_startup;
	prev_process_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = dwarf_process_utility;
	PartitionsInit();

	DwarfRegisterLauncher();
}
