/*
 * dwarf.h
 *		What every dwarf source file shares: the settings, the limits, and
 *		how the module exports what the server looks up by name.  Each module
 *		declares what it offers in a header of its own: shmem.h, graph.h
 *		(with merge.c), flowrun.h (with the step a task runs in), json.h,
 *		flows.h and worker.h (the worker's files).
 */
#ifndef DWARF_H
#define DWARF_H

#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/timestamp.h"

#include "compat.h"

/*
 * dwarf.so is built with -fvisibility=hidden, so that none of its own
 * functions can clash with another library's.  What the server looks up in
 * it by name is exported: the module magic, _PG_init, the background
 * workers' entry points and the SQL functions.  (PostgreSQL 15's
 * PGDLLEXPORT is empty outside Windows, so it cannot do this.)
 */
#define DWARF_EXPORT __attribute__((visibility("default")))

/* PG_FUNCTION_INFO_V1, with the function and its info record exported. */
#define DWARF_FUNCTION(name) \
	extern DWARF_EXPORT Datum name(PG_FUNCTION_ARGS); \
	extern DWARF_EXPORT const Pg_finfo_record *CppConcat(pg_finfo_,name)(void); \
	PG_FUNCTION_INFO_V1(name)

/* ---------- settings (dwarf.c) ---------- */

extern int	dwarf_workers;
extern int	dwarf_batch_size;
extern int	dwarf_shard_id;
extern int	dwarf_batch_time;
extern int	dwarf_long_step;
extern int	dwarf_max_runners;
extern int	dwarf_step_crashes;
extern int	dwarf_max_step_time;	/* ms a step may run in a runner; 0: no limit */
extern char *dwarf_archive_after;
extern char *dwarf_retention;
extern char *dwarf_segment_interval;
extern int	dwarf_max_flow_steps;
extern int	dwarf_max_for_each;
extern int	dwarf_max_state_size;	/* kB a folded state may take */
extern int	dwarf_min_retry_delay;
extern int	dwarf_max_tree_flows;
extern int	dwarf_max_step_children;
extern int	dwarf_max_external_steps;	/* steps offered to claims at once */
extern int	dwarf_external_memory;	/* kB their states may take */
extern char *dwarf_http_allow;	/* URL prefixes HTTP tasks may call */
extern int	dwarf_http_max_response;	/* kB of an HTTP answer's body */
extern int	dwarf_http_max_in_flight;	/* HTTP calls at once, per database */
extern int	dwarf_http_max_host_connections;	/* ... connections per host */
extern int	dwarf_http_max_response_memory;	/* kB all answers in flight may take */
extern int	dwarf_stats_entries;	/* graphs' and tasks' statistics kept (stats.c) */

/*
 * Flow ids are (shard << DWARF_SHARD_SHIFT) | ((timeline - 1) & 0xFF) <<
 * DWARF_EPOCH_SHIFT | sequence value: a server never promoted (timeline 1)
 * has epoch 0, so its first flow id is 1.
 */
#define DWARF_SHARD_SHIFT	48
#define DWARF_EPOCH_SHIFT	40

/* Step ids a process takes at a time: dwarf.step_seq's INCREMENT BY. */
#define DWARF_STEP_ID_BLOCK	64

/* The longest interval dwarf takes (sleep, retry, timeouts): 100 years. */
#define DWARF_MAX_INTERVAL	(INT64CONST(36525) * USECS_PER_DAY)

/*
 * Bounds of what a user would not mean past them (README, "Limits").  In
 * interval arithmetic a month is 30 days, so '1 year' is 360 days: the
 * bounds are whole days, compared with the interval's microseconds, and
 * sleep's lets '1 year' and '365 days' both in.
 */
#define DWARF_MAX_HTTP_TIMEOUT	(INT64CONST(1) * USECS_PER_DAY)	/* an HTTP task's timeout */
#define DWARF_MAX_TIME_BUDGET	(INT64CONST(7) * USECS_PER_DAY)	/* a step's time_budget */
#define DWARF_MAX_SLEEP			(INT64CONST(366) * USECS_PER_DAY)	/* one dwarf.sleep */

/* How deep dwarf.subgraph may nest flows (the root is depth 0). */
#define DWARF_MAX_DEPTH		32

/* Longest idempotency key, thread or fairness key (they are indexed). */
#define DWARF_MAX_KEY		1024

/* An external task's lease when its definition gives none: 5 minutes. */
#define DWARF_DEFAULT_LEASE_MS	(5 * 60 * 1000)

/* Most tasks a graph may have. */
#define DWARF_MAX_TASKS		10000

/* Most named limits one task may take ("limit": [...]). */
#define DWARF_MAX_TASK_LIMITS	4

/* Most subtransactions a batch may open (PGPROC_MAX_CACHED_SUBXIDS is 64). */
#define DWARF_MAX_ISOLATED_BATCH	60

/* The role whose members may create flows with a priority below 0. */
#define DWARF_PRIORITY_ROLE	"dwarf_priority"

/* ---------- launcher.c, worker.c ---------- */

extern DWARF_EXPORT void DwarfLauncherMain(Datum arg);
extern DWARF_EXPORT void DwarfWorkerMain(Datum arg);
extern DWARF_EXPORT void DwarfRunnerMain(Datum arg);
extern void DwarfRegisterLauncher(void);
extern int	StopDatabaseWorkers(Oid dboid, pid_t *pids);

/*
 * dwarf's own heavyweight locks, which no role can take or hold: advisory
 * lock tags (in the current database) whose fourth field is one of these
 * classes.  pg_advisory_lock and its kin only ever make 1 (one bigint key)
 * and 2 (two int4 keys), so an idle session of any role holding whatever
 * advisory keys it likes cannot block dwarf.define or dwarf.maintain.
 */
#define DWARF_LOCK_MAINTAIN		0x6401	/* one maintain pass at a time */
#define DWARF_LOCK_GRAPH_NAME	0x6402	/* a graph name's next version: (hash, owner) */

/*
 * DwarfLockXact: takes dwarf's own lock (class, key1, key2) in exclusive
 * mode until the transaction ends, waiting for it as for any lock (so
 * statement_timeout, lock_timeout and cancels apply).
 */
static inline void
DwarfLockXact(uint16 class, uint32 key1, uint32 key2)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, key1, key2, class);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/* dwarf's own nextval was called: lastval() must not show it to a task (session.c) */
extern bool DwarfNextvalUsed;

#endif							/* DWARF_H */
