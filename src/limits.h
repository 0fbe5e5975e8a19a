/*
 * limits.h
 *		Named limits (limits.c), a role's own: at most so many steps of the
 *		tasks that name a limit in progress at once, and at most so many
 *		starts per interval, counted in shared memory by database, owner,
 *		limit name and key.
 *		Usable from any backend in a transaction of a database with dwarf.
 */
#ifndef DWARF_LIMITS_H
#define DWARF_LIMITS_H

#include "storage/condition_variable.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "dwarf.h"

/*
 * How soon a worker tries again a step whose limit had no room in
 * progress (LimitTake said "when one is given back").
 */
#define DWARF_LIMIT_RECHECK_MS	50

/* dwarf.max_limit_keys: live counts (limit and key) shared memory holds. */
extern int	dwarf_max_limit_keys;

/* A limit a task names (graph.c): its name as written, and its key. */
typedef struct TaskLimit
{
	char	   *name;			/* "name" or "role.name" (LimitResolve) */
	Datum		key;			/* compiled jsonpath: one count per value of
								 * it in the step's input; 0: one count */
} TaskLimit;

/*
 * The limits one step takes, resolved (LimitResolve): whose each is, its
 * name, and the step's key under it (NULL: the limit's own count).  A step
 * takes all of them or none.
 */
typedef struct StepLimits
{
	int			n;
	Oid			owner[DWARF_MAX_TASK_LIMITS];
	const char *name[DWARF_MAX_TASK_LIMITS];
	const char *key[DWARF_MAX_TASK_LIMITS];
} StepLimits;

/*
 * StepLimits as one flat run of bytes, for an offer in shared memory:
 * LimitsFlatSize bytes, written by LimitsFlatten; LimitsUnflatten points
 * into them.
 */
extern void LimitsOfStep(Oid user, int n, const TaskLimit *limits, Jsonb *state,
						 StepLimits *out);
extern Size LimitsFlatSize(const StepLimits *limits);
extern void LimitsFlatten(const StepLimits *limits, char *dst);
extern void LimitsUnflatten(const char *src, int n, StepLimits *limits);

/* A limit's settings, from its row of dwarf.limit. */
typedef struct LimitSettings
{
	bool		set;			/* there is a row */
	int32		concurrency;	/* -1: no bound */
	int32		rate;			/* 0: no bound */
	int64		per_us;
} LimitSettings;

extern void LimitsShmemRequest(void);
extern void LimitsShmemStartup(void);

/*
 * Whose limit a task's "limit" name is: "role.name" is role's, any other
 * name the flow owner's (LimitResolve); LimitCheckUse also says whether
 * role may use it (its own, or with the owner's privileges), with an error.
 */
extern void LimitResolve(Oid user, const char *name, Oid *owner, const char **bare);
extern Oid	LimitCheckUse(Oid role, const char *name, const char **bare);

/*
 * One step's start under owner's limit, and its end.  LimitTake takes a place in
 * progress and a start of the rate, or returns false with *retry_at: when
 * the next start is due, or 0 when the limit waits for a place to be given
 * back (LimitGivenCV is broadcast then).  A key of NULL is the limit's own
 * count; a name not set (dwarf.set_limit) is counted but never refused.
 */
extern bool LimitTake(Oid owner, const char *name, const char *key, TimestampTz now,
					  TimestampTz *retry_at);
extern void LimitReadSettings(Oid owner, const char *name, LimitSettings *s);
extern bool LimitTakeWith(Oid owner, const char *name, const char *key,
						  const LimitSettings *settings, TimestampTz now, TimestampTz *retry_at);
extern void LimitGive(Oid owner, const char *name, const char *key);
extern ConditionVariable *LimitGivenCV(void);

/* A step's key: the first match of path in its input state, as text. */
extern char *LimitKey(Datum path, Jsonb *state);

/*
 * The same for a worker's steps, by flow and token: the process holds
 * what it took (a second take of the same step is a no-op) and gives all
 * of it back if it exits.
 */
extern bool LimitStepTake(const StepLimits *limits, int64 flow_id, int token_id,
						  TimestampTz now, TimestampTz *retry_at);
extern void LimitStepGive(int64 flow_id, int token_id);
extern void LimitStepGiveUnless(bool (*keep) (int64 flow_id));

#endif							/* DWARF_LIMITS_H */
