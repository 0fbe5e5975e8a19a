/*
 * limits.c
 *		Named limits, shared by the graphs and roles of a database:
 *		dwarf.set_limit(name, concurrency, rate, per) says that at most
 *		concurrency steps of the tasks naming the limit are in progress at
 *		once, and that at most rate of them start per per.
 *
 * The settings are rows of dwarf.limit (dumped with the database); the
 * live counts are in shared memory, in a hash of fixed size
 * (dwarf.max_limit_keys) under one LWLock, by database, limit name and
 * key: a task may name a key in its input state ({"name": "openai", "key":
 * "$.customer"}), and each value of it is counted on its own under the
 * same settings.  The rate is a token bucket that refills at rate per per
 * and holds at most a twentieth of rate (at least one), so that no
 * interval of length per sees more than rate starts and that twentieth:
 * within 5% from a rate of 20 on, and steady over longer spans.  Nothing in
 * progress survives a crash of the server, and nor do the counts: shared
 * memory starts empty.
 *
 * Whoever hands a step out takes its limit first (LimitTake) and gives it
 * back when the step ends (LimitGive): a worker before a step runs, for as
 * long as its batch runs, or from lending it until its runner ends
 * (worker.c, lend.c); dwarf.claim for as long as the lease.  A worker's
 * takes are held by this process (LimitStepTake), and given back if it
 * exits.  A limit name that no row sets is counted but never refuses.
 */
#include "postgres.h"

#include <math.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "lograte.h"
#include "flows.h"
#include "limits.h"

int			dwarf_max_limit_keys = 1024;

/* dwarf.limit's columns, as the install script makes them. */
#define Anum_limit_name			1
#define Anum_limit_owner		2
#define Anum_limit_concurrency	3
#define Anum_limit_rate			4
#define Anum_limit_per			5

/* Bytes of a key that dwarf.limits shows (the count is by all of it). */
#define LIMIT_KEY_SHOWN		64

/* What a live count is of: a limit of a database, and one key of it. */
typedef struct LimitTag
{
	Oid			dboid;
	char		name[NAMEDATALEN];
	uint64		keyhash;		/* of the key's text; 0: no key */
} LimitTag;

/* The live count of one limit and key (a hash entry in shared memory). */
typedef struct LimitCount
{
	LimitTag	tag;			/* hash key */
	int32		in_progress;
	int32		rate;			/* the rate and per the bucket last filled */
	int64		per_us;			/* at (0: no rate, no bucket) */
	double		tokens;			/* starts the bucket holds */
	TimestampTz filled_at;
	char		key[LIMIT_KEY_SHOWN];	/* the key's text, cut short */
} LimitCount;

typedef struct LimitShared
{
	LWLock	   *lock;			/* protects the hash */
	ConditionVariable given;	/* broadcast when a place is given back */
} LimitShared;

/* A step's take held by this process (LimitStepTake). */
typedef struct HoldKey
{
	int64		flow_id;
	int64		token_id;
} HoldKey;

typedef struct LimitHold
{
	HoldKey		key;			/* hash key */
	LimitTag	tag;
} LimitHold;

/*
 * A count that refused this process's step lately: its other steps are
 * refused here, without a look at the table or the lock, until it said to
 * try again (or DWARF_LIMIT_RECHECK_MS, for a place in progress).  A
 * thousand steps waiting for two places then cost one look a recheck.
 */
typedef struct Refusal
{
	LimitTag	tag;			/* hash key */
	TimestampTz until;
	TimestampTz retry_at;		/* as the count said */
} Refusal;

/* Refusals remembered at most; past it they are all forgotten. */
#define LIMIT_MAX_REFUSALS	1024

static LimitShared *Limits = NULL;
static HTAB *LimitCounts = NULL;
static HTAB *Holds = NULL;
static HTAB *Refusals = NULL;

/* ---------- shared memory ---------- */

static Size
LimitsShmemSize(void)
{
	return add_size(MAXALIGN(sizeof(LimitShared)),
					hash_estimate_size(dwarf_max_limit_keys, sizeof(LimitCount)));
}

/* From the shmem_request_hook: the counts' memory and their lock. */
void
LimitsShmemRequest(void)
{
	RequestAddinShmemSpace(LimitsShmemSize());
	RequestNamedLWLockTranche("dwarf limits", 1);
}

/* From the shmem_startup_hook: the counts, empty after any restart. */
void
LimitsShmemStartup(void)
{
	HASHCTL		info;
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	Limits = ShmemInitStruct("dwarf limits", sizeof(LimitShared), &found);
	if (!found)
	{
		Limits->lock = &(GetNamedLWLockTranche("dwarf limits"))->lock;
		ConditionVariableInit(&Limits->given);
	}
	info.keysize = sizeof(LimitTag);
	info.entrysize = sizeof(LimitCount);
	LimitCounts = ShmemInitHash("dwarf limit counts", dwarf_max_limit_keys,
								dwarf_max_limit_keys, &info,
								HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* ---------- settings ---------- */

/* An interval in microseconds, a month counted as 30 days. */
static int64
IntervalUs(Interval *span)
{
	return span->time + (span->day + (int64) span->month * DAYS_PER_MONTH) * USECS_PER_DAY;
}

/*
 * Reads a limit's settings from dwarf.limit, as last committed: by its
 * primary key, without SPI, so that a worker may look between steps and a
 * client backend in any transaction.
 */
void
LimitReadSettings(const char *name, LimitSettings *s)
{
	Oid			nsp = get_namespace_oid("dwarf", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid("limit", nsp) : InvalidOid;
	Oid			indexid = OidIsValid(nsp) ? get_relname_relid("limit_pkey", nsp) : InvalidOid;
	Relation	rel;
	Snapshot	snapshot;
	ScanKeyData skey;
	SysScanDesc scan;
	HeapTuple	tup;

	s->set = false;
	s->concurrency = -1;
	s->rate = 0;
	s->per_us = USECS_PER_SEC;
	if (!OidIsValid(relid) || !OidIsValid(indexid))
		return;
	rel = table_open(relid, AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&skey, Anum_limit_name, BTEqualStrategyNumber, F_TEXTEQ,
				CStringGetTextDatum(name));
	scan = systable_beginscan(rel, indexid, true, snapshot, 1, &skey);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		isnull;
		Datum		d;

		s->set = true;
		d = heap_getattr(tup, Anum_limit_concurrency, desc, &isnull);
		if (!isnull)
			s->concurrency = DatumGetInt32(d);
		d = heap_getattr(tup, Anum_limit_rate, desc, &isnull);
		if (!isnull)
			s->rate = DatumGetInt32(d);
		d = heap_getattr(tup, Anum_limit_per, desc, &isnull);
		if (!isnull)
			s->per_us = Max(IntervalUs(DatumGetIntervalP(d)), 1);
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/* ---------- live counts ---------- */

/* The tag of a limit's count in this database, for a key (or NULL). */
static void
MakeTag(LimitTag *tag, const char *name, const char *key)
{
	memset(tag, 0, sizeof(LimitTag));
	tag->dboid = MyDatabaseId;
	strlcpy(tag->name, name, NAMEDATALEN);
	if (key != NULL)
	{
		tag->keyhash = hash_bytes_extended((const unsigned char *) key, strlen(key), 0);
		if (tag->keyhash == 0)
			tag->keyhash = 1;
	}
}

/* The most starts a bucket holds: a twentieth of the rate, at least one. */
static double
BucketSize(int32 rate)
{
	return Max(1, rate / 20);
}

/* The starts a count's bucket would hold at now, as it was last filled. */
static double
TokensAt(LimitCount *c, TimestampTz now)
{
	double		tokens = c->tokens;

	if (now > c->filled_at)
		tokens += (double) (now - c->filled_at) * c->rate / c->per_us;
	return Min(tokens, BucketSize(c->rate));
}

/*
 * Is a count idle: nothing in progress and its bucket full?  Then it may
 * go: a new one would be the same.
 */
static bool
CountIdle(LimitCount *c, TimestampTz now)
{
	return c->in_progress <= 0 && (c->rate == 0 || TokensAt(c, now) >= BucketSize(c->rate));
}

/* Removes the idle counts of every database; under the lock, exclusive. */
static void
EvictIdleCounts(TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	LimitCount *c;

	hash_seq_init(&seq, LimitCounts);
	while ((c = hash_seq_search(&seq)) != NULL)
		if (CountIdle(c, now))
			(void) hash_search(LimitCounts, &c->tag, HASH_REMOVE, NULL);
}

/*
 * A limit's count for a key, made if there is none: when the hash is full,
 * idle counts make room; NULL when there is still none.  Under the lock,
 * exclusive.
 */
static LimitCount *
GetCount(const LimitTag *tag, const char *key, TimestampTz now)
{
	LimitCount *c;
	bool		found;

	c = hash_search(LimitCounts, tag, HASH_FIND, NULL);
	if (c != NULL)
		return c;
	if (hash_get_num_entries(LimitCounts) >= dwarf_max_limit_keys)
		EvictIdleCounts(now);
	if (hash_get_num_entries(LimitCounts) >= dwarf_max_limit_keys ||
		(c = hash_search(LimitCounts, tag, HASH_ENTER_NULL, &found)) == NULL)
		return NULL;
	c->in_progress = 0;
	c->rate = 0;
	c->per_us = USECS_PER_SEC;
	c->tokens = 0;
	c->filled_at = now;
	memset(c->key, 0, LIMIT_KEY_SHOWN);
	if (key != NULL)
		memcpy(c->key, key, pg_mbcliplen(key, strlen(key), LIMIT_KEY_SHOWN - 1));
	return c;
}

/*
 * Fills a count's bucket up to now under the settings (a rate set anew
 * starts full; a lower one cuts the bucket down to its new size).
 */
static void
FillBucket(LimitCount *c, const LimitSettings *s, TimestampTz now)
{
	if (s->rate <= 0)
		c->rate = 0;
	else if (c->rate == 0)
	{
		c->rate = s->rate;
		c->per_us = s->per_us;
		c->tokens = BucketSize(s->rate);
	}
	else
	{
		c->tokens = TokensAt(c, now);
		c->rate = s->rate;
		c->per_us = s->per_us;
		c->tokens = Min(c->tokens, BucketSize(s->rate));
	}
	c->filled_at = Max(c->filled_at, now);
}

static bool TakeTagWith(const LimitTag *tag, const char *name, const char *key,
						const LimitSettings *settings, TimestampTz now,
						TimestampTz *retry_at);

/* Takes a place and a start of a count; see LimitTake. */
static bool
TakeTag(const LimitTag *tag, const char *name, const char *key, TimestampTz now,
		TimestampTz *retry_at)
{
	LimitSettings s;

	LimitReadSettings(name, &s);
	return TakeTagWith(tag, name, key, &s, now, retry_at);
}

/* TakeTag, with the limit's settings read already. */
static bool
TakeTagWith(const LimitTag *tag, const char *name, const char *key,
			const LimitSettings *settings, TimestampTz now, TimestampTz *retry_at)
{
	static LogRate full;
	LimitSettings s = *settings;
	LimitCount *c;
	bool		taken = false;

	*retry_at = 0;
	LWLockAcquire(Limits->lock, LW_EXCLUSIVE);
	c = GetCount(tag, key, now);
	if (c == NULL)
	{
		LWLockRelease(Limits->lock);
		if (!s.set)
			return true;		/* not limited: nothing to count it in */
		*retry_at = now + USECS_PER_SEC;
		{
			int64		n;
			int			seconds;

			if ((n = LogRateDue(&full, now, &seconds)) > 0)
				ereport(LOG,
						(errmsg("dwarf: no room for the count of limit \"%s\": dwarf.max_limit_keys (%d) counts are in use%s",
								name, dwarf_max_limit_keys, LogRateCount(n, seconds)),
						 errdetail("Steps under the limit wait until a count is free."),
						 errhint("Raise dwarf.max_limit_keys (it takes a restart), or use fewer keys.")));
		}
		return false;
	}
	FillBucket(c, &s, now);
	if (s.set && s.concurrency >= 0 && c->in_progress >= s.concurrency)
		*retry_at = 0;			/* when a place is given back */
	else if (s.set && s.rate > 0 && c->tokens < 1.0)
		*retry_at = now + (TimestampTz) ceil((1.0 - c->tokens) * s.per_us / s.rate);
	else
	{
		c->in_progress++;
		if (c->rate > 0)
			c->tokens -= 1.0;
		taken = true;
	}
	LWLockRelease(Limits->lock);
	return taken;
}

/* Gives back a place of a count; see LimitGive. */
static void
GiveTag(const LimitTag *tag)
{
	LimitCount *c;

	LWLockAcquire(Limits->lock, LW_EXCLUSIVE);
	c = hash_search(LimitCounts, tag, HASH_FIND, NULL);
	if (c != NULL)
	{
		if (c->in_progress > 0)
			c->in_progress--;
		if (CountIdle(c, GetCurrentTimestamp()))
			(void) hash_search(LimitCounts, tag, HASH_REMOVE, NULL);
	}
	LWLockRelease(Limits->lock);
	ConditionVariableBroadcast(&Limits->given);
}

/*
 * Takes one place in progress and one start of limit name for key (NULL:
 * the limit's own count) in this database, or returns false with when to
 * try again in *retry_at: when the next start is due, or 0 when every
 * place is taken (until one is given back: LimitGivenCV).  A name no row
 * of dwarf.limit sets is counted, never refused.  In a transaction.
 */
bool
LimitTake(const char *name, const char *key, TimestampTz now, TimestampTz *retry_at)
{
	LimitTag	tag;

	MakeTag(&tag, name, key);
	return TakeTag(&tag, name, key, now, retry_at);
}

/*
 * LimitTake with the limit's settings read already (LimitReadSettings): no
 * table is read, so it may be called under another module's lock (taken
 * before this one's), as dwarf.claim does under the offers' lock.
 */
bool
LimitTakeWith(const char *name, const char *key, const LimitSettings *settings,
			  TimestampTz now, TimestampTz *retry_at)
{
	LimitTag	tag;

	MakeTag(&tag, name, key);
	return TakeTagWith(&tag, name, key, settings, now, retry_at);
}

/* Gives back the place a LimitTake of the same name and key took. */
void
LimitGive(const char *name, const char *key)
{
	LimitTag	tag;

	MakeTag(&tag, name, key);
	GiveTag(&tag);
}

/* Broadcast whenever a place of any limit is given back. */
ConditionVariable *
LimitGivenCV(void)
{
	return &Limits->given;
}

/* ---------- a worker's steps ---------- */

/* At exit: the places this process holds go back (its steps end with it). */
static void
GiveAllHolds(int code, Datum arg)
{
	HASH_SEQ_STATUS seq;
	LimitHold  *hold;

	hash_seq_init(&seq, Holds);
	while ((hold = hash_seq_search(&seq)) != NULL)
		GiveTag(&hold->tag);
}

/* The table of refusals, made anew (empty) when missing or too full. */
static void
MakeRefusals(void)
{
	HASHCTL		ctl;

	if (Refusals != NULL && hash_get_num_entries(Refusals) < LIMIT_MAX_REFUSALS)
		return;
	if (Refusals != NULL)
		hash_destroy(Refusals);
	ctl.keysize = sizeof(LimitTag);
	ctl.entrysize = sizeof(Refusal);
	ctl.hcxt = TopMemoryContext;
	Refusals = hash_create("dwarf limit refusals", 64, &ctl,
						   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * LimitTake for a worker's step (flow and token): the place is held by
 * this process until LimitStepGive, or its exit.  A step that holds one
 * already takes nothing more; one whose count refused another step here
 * lately is refused at once (Refusal).
 */
bool
LimitStepTake(const char *name, const char *key, int64 flow_id, int token_id,
			  TimestampTz now, TimestampTz *retry_at)
{
	HoldKey		hkey = {flow_id, token_id};
	LimitHold  *hold;
	LimitTag	tag;
	Refusal    *refusal;

	if (Holds == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(HoldKey);
		ctl.entrysize = sizeof(LimitHold);
		ctl.hcxt = TopMemoryContext;
		Holds = hash_create("dwarf limit holds", 64, &ctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		before_shmem_exit(GiveAllHolds, (Datum) 0);
	}
	if (hash_search(Holds, &hkey, HASH_FIND, NULL) != NULL)
		return true;
	MakeTag(&tag, name, key);
	MakeRefusals();
	refusal = hash_search(Refusals, &tag, HASH_FIND, NULL);
	if (refusal != NULL && now < refusal->until)
	{
		*retry_at = refusal->retry_at;
		return false;
	}
	if (!TakeTag(&tag, name, key, now, retry_at))
	{
		refusal = hash_search(Refusals, &tag, HASH_ENTER, NULL);
		refusal->retry_at = *retry_at;
		refusal->until = *retry_at > 0 ? *retry_at :
			now + DWARF_LIMIT_RECHECK_MS * INT64CONST(1000);
		return false;
	}
	if (refusal != NULL)
		(void) hash_search(Refusals, &tag, HASH_REMOVE, NULL);
	hold = hash_search(Holds, &hkey, HASH_ENTER, NULL);
	hold->tag = tag;
	return true;
}

/* The step ended: the place it holds, if any, goes back. */
void
LimitStepGive(int64 flow_id, int token_id)
{
	HoldKey		hkey = {flow_id, token_id};
	LimitHold  *hold;

	if (Holds == NULL || hash_get_num_entries(Holds) == 0)
		return;
	hold = hash_search(Holds, &hkey, HASH_FIND, NULL);
	if (hold == NULL)
		return;
	GiveTag(&hold->tag);
	if (Refusals != NULL)
		(void) hash_search(Refusals, &hold->tag, HASH_REMOVE, NULL);	/* room now */
	(void) hash_search(Holds, &hkey, HASH_REMOVE, NULL);
}

/*
 * Gives back what every step holds but those of the flows keep says to
 * keep (a worker that dropped its batches keeps its lent steps').
 */
void
LimitStepGiveUnless(bool (*keep) (int64 flow_id))
{
	HASH_SEQ_STATUS seq;
	LimitHold  *hold;

	if (Holds == NULL)
		return;
	hash_seq_init(&seq, Holds);
	while ((hold = hash_seq_search(&seq)) != NULL)
		if (!keep(hold->key.flow_id))
		{
			GiveTag(&hold->tag);
			(void) hash_search(Holds, &hold->key, HASH_REMOVE, NULL);
		}
}

/*
 * A step's key under a limit: the first match of path in its input state,
 * a string as itself and anything else as JSON.  No match (or a JSON null)
 * is NULL, which counts with the limit's own count.
 */
char *
LimitKey(Datum path, Jsonb *state)
{
	static Datum no_vars = (Datum) 0;
	LOCAL_FCINFO(fcinfo, 4);
	Datum		result;
	Jsonb	   *found;
	JsonbValue	v;

	if (no_vars == (Datum) 0)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		no_vars = DirectFunctionCall1(jsonb_in, CStringGetDatum("{}"));
		MemoryContextSwitchTo(old);
	}
	InitFunctionCallInfoData(*fcinfo, NULL, 4, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = JsonbPGetDatum(state);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = path;
	fcinfo->args[1].isnull = false;
	fcinfo->args[2].value = no_vars;
	fcinfo->args[2].isnull = false;
	fcinfo->args[3].value = BoolGetDatum(true); /* silent: no match, not an error */
	fcinfo->args[3].isnull = false;
	result = jsonb_path_query_first(fcinfo);
	if (fcinfo->isnull)
		return NULL;
	found = DatumGetJsonbP(result);
	if (JsonbExtractScalar(&found->root, &v))
	{
		if (v.type == jbvNull)
			return NULL;
		if (v.type == jbvString)
			return pnstrdup(v.val.string.val, v.val.string.len);
	}
	return JsonbToCString(NULL, &found->root, VARSIZE(found));
}

/* ---------- SQL: set, drop and list limits ---------- */

/*
 * Only a limit's owner (the role that set it first, or one with its
 * privileges) or a superuser may change or drop it.
 */
static void
CheckLimitOwner(const char *name, Oid owner, Oid caller)
{
	char	   *owner_name;

	if (superuser_arg(caller) || has_privs_of_role(caller, owner))
		return;
	owner_name = GetUserNameFromId(owner, true);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("limit \"%s\" belongs to role %s", name,
					owner_name ? quote_identifier(owner_name) : psprintf("%u", owner)),
			 errdetail("Only its owner, the role that set it first, or a superuser may change or drop a limit.")));
}

/*
 * The owner of a limit's row, locked for the change (as the extension's
 * owner), or InvalidOid when there is none.
 */
static Oid
LockLimitRow(const char *name)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(name)};
	bool		isnull;

	if (SPI_execute_with_args("SELECT owner::oid FROM dwarf.limit WHERE name = $1 FOR UPDATE",
							  1, argtypes, values, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read dwarf.limit");
	if (SPI_processed == 0)
		return InvalidOid;
	return DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* The limit name argument: 1 to NAMEDATALEN - 1 bytes. */
static char *
LimitNameArg(FunctionCallInfo fcinfo)
{
	char	   *name;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a limit's name must not be NULL")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (name[0] == '\0' || strlen(name) > NAMEDATALEN - 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("\"%s\" cannot name a limit", name),
				 errdetail("A limit's name has 1 to %d bytes.", NAMEDATALEN - 1)));
	return name;
}

DWARF_FUNCTION(dwarf_set_limit);

/*
 * dwarf.set_limit(name, concurrency, rate, per): sets a limit, made and
 * owned by the caller if it is new.  NULL turns a bound off.
 */
Datum
dwarf_set_limit(PG_FUNCTION_ARGS)
{
	char	   *name = LimitNameArg(fcinfo);
	Oid			caller = GetUserId();
	Oid			argtypes[5] = {TEXTOID, OIDOID, INT4OID, INT4OID, INTERVALOID};
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	SavedUser	saved;

	if (!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a limit's concurrency must not be negative"),
				 errhint("0 lets no step of its tasks start; NULL sets no bound.")));
	if (!PG_ARGISNULL(2) && PG_GETARG_INT32(2) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a limit's rate must be at least 1"),
				 errhint("NULL sets no bound on the rate; a concurrency of 0 stops its tasks.")));
	if (PG_ARGISNULL(3) || IntervalUs(PG_GETARG_INTERVAL_P(3)) <= 0 ||
		IntervalUs(PG_GETARG_INTERVAL_P(3)) > DWARF_MAX_INTERVAL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a limit's per must be an interval longer than zero and at most 100 years")));

	values[0] = CStringGetTextDatum(name);
	values[1] = ObjectIdGetDatum(caller);
	values[2] = PG_GETARG_DATUM(1);
	values[3] = PG_GETARG_DATUM(2);
	values[4] = PG_GETARG_DATUM(3);
	nulls[2] = PG_ARGISNULL(1) ? 'n' : ' ';
	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';

	SPI_connect();
	saved = BecomeOwner();
	for (;;)
	{
		Oid			owner;

		if (SPI_execute_with_args("INSERT INTO dwarf.limit (name, owner, concurrency, rate, per) "
								  "VALUES ($1, $2::regrole, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
								  5, argtypes, values, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "dwarf: could not insert into dwarf.limit");
		if (SPI_processed == 1)
			break;				/* a new limit, the caller's */
		owner = LockLimitRow(name);
		if (!OidIsValid(owner))
			continue;			/* dropped meanwhile */
		CheckLimitOwner(name, owner, caller);
		if (SPI_execute_with_args("UPDATE dwarf.limit SET concurrency = $3, rate = $4, per = $5, "
								  "set_at = now() WHERE name = $1",
								  5, argtypes, values, nulls, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "dwarf: could not update dwarf.limit");
		break;
	}
	RestoreUser(saved);
	SPI_finish();
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_drop_limit);

/*
 * dwarf.drop_limit(name): the limit is no more (its tasks are not limited
 * any longer).  False when there was none.
 */
Datum
dwarf_drop_limit(PG_FUNCTION_ARGS)
{
	char	   *name = LimitNameArg(fcinfo);
	Oid			caller = GetUserId();
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(name)};
	SavedUser	saved;
	Oid			owner;

	SPI_connect();
	saved = BecomeOwner();
	owner = LockLimitRow(name);
	if (OidIsValid(owner))
	{
		CheckLimitOwner(name, owner, caller);
		if (SPI_execute_with_args("DELETE FROM dwarf.limit WHERE name = $1",
								  1, argtypes, values, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "dwarf: could not delete from dwarf.limit");
	}
	RestoreUser(saved);
	SPI_finish();
	PG_RETURN_BOOL(OidIsValid(owner));
}

DWARF_FUNCTION(dwarf_limit_counts);

/*
 * dwarf.limit_counts(): this database's live counts: limit name, key (NULL
 * for the limit's own count) and steps in progress.  Copied under the lock,
 * returned outside it.
 */
Datum
dwarf_limit_counts(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS seq;
	LimitCount *c;
	LimitCount *copies;
	int			n = 0;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	LWLockAcquire(Limits->lock, LW_SHARED);
	copies = palloc(sizeof(LimitCount) * Max(hash_get_num_entries(LimitCounts), 1));
	hash_seq_init(&seq, LimitCounts);
	while ((c = hash_seq_search(&seq)) != NULL)
		if (c->tag.dboid == MyDatabaseId)
			copies[n++] = *c;
	LWLockRelease(Limits->lock);

	for (i = 0; i < n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = CStringGetTextDatum(copies[i].tag.name);
		if (copies[i].tag.keyhash == 0)
			nulls[1] = true;
		else
			values[1] = CStringGetTextDatum(copies[i].key);
		values[2] = Int32GetDatum(copies[i].in_progress);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
