/*
 * limits.c
 *		Named limits, a role's own like its graphs: dwarf.set_limit(name,
 *		concurrency, rate, per) says that at most concurrency steps of the
 *		role's tasks naming the limit are in progress at once, and that at
 *		most rate of them start per per.
 *
 * A limit belongs to the role that set it, and its name is that role's: a
 * task's "limit": "openai" is the flow owner's limit of that name, and
 * "team.openai" the limit of role team, which a graph may name only if its
 * definer has team's privileges (checked by dwarf.define).  So no role can
 * stop or slow another's steps by setting a limit of the same name.
 *
 * The settings are rows of dwarf.limit (dumped with the database); the
 * live counts are in shared memory, in a hash of fixed size
 * (dwarf.max_limit_keys) under one LWLock, by database, owner, limit name
 * and key: a task may name a key in its input state ({"name": "openai",
 * "key": "$.customer"}), and each value of it is counted on its own under
 * the same settings.  A count goes as soon as it no longer matters (nothing
 * in progress, its bucket full), and the counts are shared between the
 * roles that hold some: a role (in a database) makes a new one only while
 * it holds fewer than dwarf.max_limit_keys / (roles holding counts + 1), so
 * that a role that holds none always finds room for its first ones.  The rate is a token bucket that refills at rate per per
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
#include "names.h"

int			dwarf_max_limit_keys = 1024;

/* dwarf.limit's columns, as the install script makes them. */
#define Anum_limit_name			1
#define Anum_limit_owner		2
#define Anum_limit_concurrency	3
#define Anum_limit_rate			4
#define Anum_limit_per			5

/* Bytes of a key that dwarf.limits shows (the count is by all of it). */
#define LIMIT_KEY_SHOWN		64

/* What a live count is of: a limit of a role in a database, and one key of it. */
typedef struct LimitTag
{
	Oid			dboid;
	Oid			owner;			/* the limit's owner */
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

/* The counts one role holds in one database: its share of the hash. */
typedef struct HolderKey
{
	Oid			dboid;
	Oid			owner;
} HolderKey;

typedef struct LimitHolder
{
	HolderKey	key;			/* hash key */
	int32		counts;
} LimitHolder;

typedef struct LimitShared
{
	LWLock	   *lock;			/* protects the hash */
	ConditionVariable given;	/* broadcast when a place is given back */
} LimitShared;

/* A step's takes held by this process (LimitStepTake). */
typedef struct HoldKey
{
	int64		flow_id;
	int64		token_id;
} HoldKey;

typedef struct LimitHold
{
	HoldKey		key;			/* hash key */
	int			ntags;
	LimitTag	tags[DWARF_MAX_TASK_LIMITS];
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
static HTAB *LimitHolders = NULL;
static HTAB *Holds = NULL;
static HTAB *Refusals = NULL;

/* ---------- shared memory ---------- */

static Size
LimitsShmemSize(void)
{
	return add_size(add_size(MAXALIGN(sizeof(LimitShared)),
							 hash_estimate_size(dwarf_max_limit_keys, sizeof(LimitCount))),
					hash_estimate_size(dwarf_max_limit_keys, sizeof(LimitHolder)));
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
	info.keysize = sizeof(HolderKey);
	info.entrysize = sizeof(LimitHolder);
	LimitHolders = ShmemInitHash("dwarf limit holders", dwarf_max_limit_keys,
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
 * Reads the settings of owner's limit name from dwarf.limit, as last
 * committed: by its primary key, without SPI, so that a worker may look
 * between steps and a client backend in any transaction.
 */
void
LimitReadSettings(Oid owner, const char *name, LimitSettings *s)
{
	Oid			nsp = get_namespace_oid("dwarf", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid("limit", nsp) : InvalidOid;
	Oid			indexid = OidIsValid(nsp) ? get_relname_relid("limit_pkey", nsp) : InvalidOid;
	Relation	rel;
	Snapshot	snapshot;
	ScanKeyData skey[2];
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
	ScanKeyInit(&skey[0], Anum_limit_owner, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(owner));
	ScanKeyInit(&skey[1], Anum_limit_name, BTEqualStrategyNumber, F_TEXTEQ,
				CStringGetTextDatum(name));
	scan = systable_beginscan(rel, indexid, true, snapshot, 2, skey);
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

/* The tag of owner's limit's count in this database, for a key (or NULL). */
static void
MakeTag(LimitTag *tag, Oid owner, const char *name, const char *key)
{
	memset(tag, 0, sizeof(LimitTag));
	tag->dboid = MyDatabaseId;
	tag->owner = owner;
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

/* The holder of a count's tag: its owner in its database. */
static LimitHolder *
HolderOf(const LimitTag *tag, HASHACTION action)
{
	HolderKey	key = {tag->dboid, tag->owner};

	return hash_search(LimitHolders, &key, action, NULL);
}

/* Removes a count, and it from its holder's share; under the lock, exclusive. */
static void
RemoveCount(LimitCount *c)
{
	LimitHolder *holder = HolderOf(&c->tag, HASH_FIND);

	if (holder != NULL && --holder->counts <= 0)
		(void) HolderOf(&c->tag, HASH_REMOVE);
	(void) hash_search(LimitCounts, &c->tag, HASH_REMOVE, NULL);
}

/*
 * Removes the idle counts of every database, or those of one limit (name
 * not NULL: its owner's in this database); under the lock, exclusive.
 */
static void
EvictIdleCounts(TimestampTz now, Oid owner, const char *name)
{
	HASH_SEQ_STATUS seq;
	LimitCount *c;

	hash_seq_init(&seq, LimitCounts);
	while ((c = hash_seq_search(&seq)) != NULL)
		if (CountIdle(c, now) &&
			(name == NULL || (c->tag.dboid == MyDatabaseId && c->tag.owner == owner &&
							  strcmp(c->tag.name, name) == 0)))
			RemoveCount(c);
}

/*
 * The most counts the holder of tag may hold while it makes a new one:
 * dwarf.max_limit_keys over the roles holding counts, itself included,
 * plus one (at least one count).  While every holder keeps within it, a
 * role that holds none finds room for its first ones.
 */
static int
HolderShare(const LimitTag *tag)
{
	long		holders = hash_get_num_entries(LimitHolders);

	if (HolderOf(tag, HASH_FIND) == NULL)
		holders++;
	return Max(1, dwarf_max_limit_keys / (int) (holders + 1));
}

/* Does the holder of tag hold its share already? */
static bool
HolderFull(const LimitTag *tag)
{
	LimitHolder *holder = HolderOf(tag, HASH_FIND);

	return holder != NULL && holder->counts >= HolderShare(tag);
}

/*
 * A limit's count for a key, made if there is none: when the hash is full
 * or the owner holds its share, idle counts make room; NULL when there is
 * still none.  Under the lock, exclusive.
 */
static LimitCount *
GetCount(const LimitTag *tag, const char *key, TimestampTz now)
{
	LimitCount *c;
	LimitHolder *holder;
	HolderKey	hkey;
	bool		found;

	c = hash_search(LimitCounts, tag, HASH_FIND, NULL);
	if (c != NULL)
		return c;
	if (hash_get_num_entries(LimitCounts) >= dwarf_max_limit_keys || HolderFull(tag))
		EvictIdleCounts(now, InvalidOid, NULL);
	if (hash_get_num_entries(LimitCounts) >= dwarf_max_limit_keys || HolderFull(tag))
		return NULL;
	hkey.dboid = tag->dboid;
	hkey.owner = tag->owner;
	holder = hash_search(LimitHolders, &hkey, HASH_ENTER_NULL, &found);
	if (holder == NULL)
		return NULL;
	if (!found)
		holder->counts = 0;
	c = hash_search(LimitCounts, tag, HASH_ENTER_NULL, &found);
	if (c == NULL)
	{
		if (holder->counts == 0)
			(void) hash_search(LimitHolders, &hkey, HASH_REMOVE, NULL);
		return NULL;
	}
	holder->counts++;
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

	LimitReadSettings(tag->owner, name, &s);
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
		bool		share_full = HolderFull(tag);
		int			share = HolderShare(tag);
		int64		n;
		int			seconds;

		LWLockRelease(Limits->lock);
		if (!s.set)
			return true;		/* not limited: nothing to count it in */
		*retry_at = now + USECS_PER_SEC;
		if ((n = LogRateDue(&full, now, &seconds)) > 0)
		{
			char	   *owner = GetUserNameFromId(tag->owner, true);

			if (share_full)
				ereport(LOG,
						(errmsg("dwarf: no room for a count of limit \"%s\" of role %s: the role holds its share of dwarf.max_limit_keys (%d of %d)%s",
								name, owner ? owner : "?", share, dwarf_max_limit_keys,
								LogRateCount(n, seconds)),
						 errdetail("Steps under the role's limits with keys not counted yet wait until one of its counts is free; other roles' counts are not affected."),
						 errhint("Use fewer keys at once, or raise dwarf.max_limit_keys (it takes a restart).")));
			else
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
			RemoveCount(c);
	}
	LWLockRelease(Limits->lock);
	ConditionVariableBroadcast(&Limits->given);
}

/*
 * Takes one place in progress and one start of owner's limit name for key
 * (NULL: the limit's own count) in this database, or returns false with
 * when to try again in *retry_at: when the next start is due, or 0 when
 * every place is taken (until one is given back: LimitGivenCV).  A name no
 * row of dwarf.limit sets is counted, never refused.  In a transaction.
 */
bool
LimitTake(Oid owner, const char *name, const char *key, TimestampTz now, TimestampTz *retry_at)
{
	LimitTag	tag;

	MakeTag(&tag, owner, name, key);
	return TakeTag(&tag, name, key, now, retry_at);
}

/*
 * LimitTake with the limit's settings read already (LimitReadSettings): no
 * table is read, so it may be called under another module's lock (taken
 * before this one's), as dwarf.claim does under the offers' lock.
 */
bool
LimitTakeWith(Oid owner, const char *name, const char *key, const LimitSettings *settings,
			  TimestampTz now, TimestampTz *retry_at)
{
	LimitTag	tag;

	MakeTag(&tag, owner, name, key);
	return TakeTagWith(&tag, name, key, settings, now, retry_at);
}

/* Gives back the place a LimitTake of the same owner, name and key took. */
void
LimitGive(Oid owner, const char *name, const char *key)
{
	LimitTag	tag;

	MakeTag(&tag, owner, name, key);
	GiveTag(&tag);
}

/* Broadcast whenever a place of any limit is given back. */
ConditionVariable *
LimitGivenCV(void)
{
	return &Limits->given;
}

/* ---------- a worker's steps ---------- */

/* The places a step's hold holds go back. */
static void
GiveHold(LimitHold *hold)
{
	int			i;

	for (i = 0; i < hold->ntags; i++)
		GiveTag(&hold->tags[i]);
}

/* At exit: the places this process holds go back (its steps end with it). */
static void
GiveAllHolds(int code, Datum arg)
{
	HASH_SEQ_STATUS seq;
	LimitHold  *hold;

	hash_seq_init(&seq, Holds);
	while ((hold = hash_seq_search(&seq)) != NULL)
		GiveHold(hold);
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
 * LimitTake of each of a worker's step's limits (flow and token), all or
 * none: the places are held by this process until LimitStepGive, or its
 * exit.  A step that holds them already takes nothing more; one whose
 * count refused another step here lately is refused at once (Refusal).
 */
bool
LimitStepTake(const StepLimits *limits, int64 flow_id, int token_id,
			  TimestampTz now, TimestampTz *retry_at)
{
	HoldKey		hkey = {flow_id, token_id};
	LimitHold  *hold;
	LimitTag	tags[DWARF_MAX_TASK_LIMITS];
	int			i;

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
	MakeRefusals();
	for (i = 0; i < limits->n; i++)
	{
		Refusal    *refusal;

		MakeTag(&tags[i], limits->owner[i], limits->name[i], limits->key[i]);
		refusal = hash_search(Refusals, &tags[i], HASH_FIND, NULL);
		if (refusal != NULL && now < refusal->until)
			*retry_at = refusal->retry_at;
		else if (!TakeTag(&tags[i], limits->name[i], limits->key[i], now, retry_at))
		{
			refusal = hash_search(Refusals, &tags[i], HASH_ENTER, NULL);
			refusal->retry_at = *retry_at;
			refusal->until = *retry_at > 0 ? *retry_at :
				now + DWARF_LIMIT_RECHECK_MS * INT64CONST(1000);
		}
		else
		{
			if (refusal != NULL)
				(void) hash_search(Refusals, &tags[i], HASH_REMOVE, NULL);
			continue;
		}
		while (--i >= 0)		/* refused: the ones taken go back */
			GiveTag(&tags[i]);
		return false;
	}
	hold = hash_search(Holds, &hkey, HASH_ENTER, NULL);
	hold->ntags = limits->n;
	memcpy(hold->tags, tags, sizeof(LimitTag) * limits->n);
	return true;
}

/*
 * The limits a step of a flow of user's takes: a task's limits resolved
 * (LimitResolve), each with the step's key under it from its input state.
 */
void
LimitsOfStep(Oid user, int n, const TaskLimit *limits, Jsonb *state, StepLimits *out)
{
	int			i;

	out->n = n;
	for (i = 0; i < n; i++)
	{
		LimitResolve(user, limits[i].name, &out->owner[i], &out->name[i]);
		out->key[i] = limits[i].key != (Datum) 0 ? LimitKey(limits[i].key, state) : NULL;
	}
}

/*
 * The bytes a step's limits take flat: for each, its owner, then its name
 * and its key, each with its NUL, the key after a byte that says whether
 * there is one.
 */
Size
LimitsFlatSize(const StepLimits *limits)
{
	Size		len = 0;
	int			i;

	for (i = 0; i < limits->n; i++)
		len += sizeof(Oid) + strlen(limits->name[i]) + 1 + 1 +
			(limits->key[i] ? strlen(limits->key[i]) + 1 : 0);
	return len;
}

/* Writes a step's limits flat into dst (LimitsFlatSize bytes). */
void
LimitsFlatten(const StepLimits *limits, char *dst)
{
	int			i;

	for (i = 0; i < limits->n; i++)
	{
		Size		len = strlen(limits->name[i]) + 1;

		memcpy(dst, &limits->owner[i], sizeof(Oid));
		dst += sizeof(Oid);
		memcpy(dst, limits->name[i], len);
		dst += len;
		*dst++ = limits->key[i] != NULL;
		if (limits->key[i] != NULL)
		{
			len = strlen(limits->key[i]) + 1;
			memcpy(dst, limits->key[i], len);
			dst += len;
		}
	}
}

/* The n limits written flat at src; the names and keys point into src. */
void
LimitsUnflatten(const char *src, int n, StepLimits *limits)
{
	int			i;

	limits->n = n;
	for (i = 0; i < n; i++)
	{
		memcpy(&limits->owner[i], src, sizeof(Oid));
		src += sizeof(Oid);
		limits->name[i] = src;
		src += strlen(src) + 1;
		limits->key[i] = NULL;
		if (*src++)
		{
			limits->key[i] = src;
			src += strlen(src) + 1;
		}
	}
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
	GiveHold(hold);
	if (Refusals != NULL)
	{
		int			i;

		for (i = 0; i < hold->ntags; i++)	/* room now */
			(void) hash_search(Refusals, &hold->tags[i], HASH_REMOVE, NULL);
	}
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
			GiveHold(hold);
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

/* ---------- names: whose limit a name means ---------- */

/*
 * Which limit name means to role user (a flow's owner, or the caller of
 * dwarf.set_limit): "role.name", where role is a role that exists, is that
 * role's limit name; any other name is user's own.  Only a name with a dot
 * looks at the catalog (a role by name, from the cache).
 */
void
LimitResolve(Oid user, const char *name, Oid *owner, const char **bare)
{
	char	   *role_name;
	char	   *rest;
	Oid			role;

	if (strchr(name, '.') != NULL && NameSplitQualified(name, &role_name, &rest) &&
		OidIsValid(role = get_role_oid(role_name, true)))
	{
		*owner = role;
		*bare = rest;
		return;
	}
	*owner = user;
	*bare = name;
}

/*
 * May role use the limit name means to it (name it in a graph it defines,
 * set or drop it)?  Its own, or one of a role whose privileges it has; an
 * error that names the role otherwise.  Returns the limit's owner and its
 * name without the role.
 */
Oid
LimitCheckUse(Oid role, const char *name, const char **bare)
{
	Oid			owner;
	char	   *owner_name;

	LimitResolve(role, name, &owner, bare);
	if (owner == role || has_privs_of_role(role, owner))
		return owner;
	owner_name = GetUserNameFromId(owner, false);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("role %s may not use limit \"%s\" of role %s",
					GetUserNameFromId(role, false), *bare, owner_name),
			 errdetail("A limit is its owner's; another role's is used by a role with its privileges."),
			 errhint("GRANT %s TO %s, or use a limit of your own: dwarf.set_limit('%s', ...).",
					 quote_identifier(owner_name), quote_identifier(GetUserNameFromId(role, false)),
					 *bare)));
	return InvalidOid;			/* not reached */
}

/* ---------- SQL: set, drop and list limits ---------- */

/*
 * The limit name argument, resolved for the caller: 1 to NAMEDATALEN - 1
 * bytes, the caller's own or, as role.name, one of a role whose privileges
 * the caller has.
 */
static Oid
LimitNameArg(FunctionCallInfo fcinfo, const char **bare)
{
	char	   *name;
	Oid			owner;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a limit's name must not be NULL")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	owner = LimitCheckUse(GetUserId(), name, bare);
	if ((*bare)[0] == '\0' || strlen(*bare) > NAMEDATALEN - 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("\"%s\" cannot name a limit", name),
				 errdetail("A limit's name has 1 to %d bytes.", NAMEDATALEN - 1)));
	return owner;
}

DWARF_FUNCTION(dwarf_set_limit);

/*
 * dwarf.set_limit(name, concurrency, rate, per): sets the caller's limit
 * name (or, as role.name, one of a role whose privileges it has), made if
 * it is new.  NULL turns a bound off.
 */
Datum
dwarf_set_limit(PG_FUNCTION_ARGS)
{
	const char *name;
	Oid			owner = LimitNameArg(fcinfo, &name);
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
	values[1] = ObjectIdGetDatum(owner);
	values[2] = PG_GETARG_DATUM(1);
	values[3] = PG_GETARG_DATUM(2);
	values[4] = PG_GETARG_DATUM(3);
	nulls[2] = PG_ARGISNULL(1) ? 'n' : ' ';
	nulls[3] = PG_ARGISNULL(2) ? 'n' : ' ';

	SPI_connect();
	saved = BecomeOwner();
	if (SPI_execute_with_args("INSERT INTO dwarf.limit (name, owner, concurrency, rate, per) "
							  "VALUES ($1, $2::regrole, $3, $4, $5) ON CONFLICT (owner, name) DO UPDATE "
							  "SET concurrency = excluded.concurrency, rate = excluded.rate, "
							  "per = excluded.per, set_at = now()",
							  5, argtypes, values, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "dwarf: could not write dwarf.limit");
	RestoreUser(saved);
	SPI_finish();
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_drop_limit);

/*
 * dwarf.drop_limit(name): the caller's limit name (or role.name) is no more:
 * its tasks are not limited any longer, and its counts go once nothing is
 * in progress under them.  False when there was none.
 */
Datum
dwarf_drop_limit(PG_FUNCTION_ARGS)
{
	const char *name;
	Oid			owner = LimitNameArg(fcinfo, &name);
	Oid			argtypes[2] = {TEXTOID, OIDOID};
	Datum		values[2] = {CStringGetTextDatum(name), ObjectIdGetDatum(owner)};
	SavedUser	saved;
	bool		dropped;

	SPI_connect();
	saved = BecomeOwner();
	if (SPI_execute_with_args("DELETE FROM dwarf.limit WHERE name = $1 AND owner = $2::regrole",
							  2, argtypes, values, NULL, false, 0) != SPI_OK_DELETE)
		elog(ERROR, "dwarf: could not delete from dwarf.limit");
	dropped = SPI_processed > 0;
	RestoreUser(saved);
	SPI_finish();
	LWLockAcquire(Limits->lock, LW_EXCLUSIVE);
	EvictIdleCounts(GetCurrentTimestamp(), owner, name);
	LWLockRelease(Limits->lock);
	PG_RETURN_BOOL(dropped);
}

DWARF_FUNCTION(dwarf_limit_counts);

/*
 * dwarf.limit_counts(): this database's live counts of the limits of roles
 * whose privileges the caller has (their keys are taken from flows' inputs:
 * no one else's to see): owner, limit name, key (NULL for the limit's own
 * count) and steps in progress.  Copied under the lock, returned outside it.
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
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		if (!has_privs_of_role(GetUserId(), copies[i].tag.owner))
			continue;
		values[0] = ObjectIdGetDatum(copies[i].tag.owner);
		values[1] = CStringGetTextDatum(copies[i].tag.name);
		if (copies[i].tag.keyhash == 0)
			nulls[2] = true;
		else
			values[2] = CStringGetTextDatum(copies[i].key);
		values[3] = Int32GetDatum(copies[i].in_progress);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
