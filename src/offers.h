/*
 * offers.h
 *		Steps of external tasks offered to workers outside the server
 *		(offers.c): published by the flow's worker, leased by dwarf.claim,
 *		answered by dwarf.complete and dwarf.fail.  Shared memory only:
 *		nothing here is the truth, and a server restart offers every such
 *		step again.
 */
#ifndef DWARF_OFFERS_H
#define DWARF_OFFERS_H

#include "access/transam.h"
#include "nodes/pg_list.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "limits.h"

/* A step waiting at an external task: its flow's branch (token), by database. */
typedef struct OfferKey
{
	Oid			dboid;
	int32		token_id;
	int64		flow_id;
} OfferKey;

/* Where an offered step stands. */
typedef enum OfferState
{
	OFFER_READY = 1,			/* claimable */
	OFFER_LEASED,				/* claimed, until lease_until */
	OFFER_ANSWERING,			/* a transaction (xid) completes or fails it */
	OFFER_EXPIRED				/* its lease ran out; its worker records the
								 * failed attempt, then offers the next */
} OfferState;

/* What a worker offers: one step of an external task. */
typedef struct OfferSpec
{
	OfferKey	key;
	int32		visits;			/* the branch's steps before this one */
	int32		attempt;
	Oid			owner;			/* the flow's owner: who may claim it */
	int32		priority;
	const char *queue;
	const char *graph;
	const char *task;
	int64		lease_us;		/* the task's lease, when a claim names none */
	Jsonb	   *input;			/* the step's state */
	Jsonb	   *baggage;		/* or NULL */
	StepLimits	limits;			/* the named limits a claim takes */
	Jsonb	   *call;			/* an HTTP task's call (GraphNode.http), or NULL */
} OfferSpec;

/* A step dwarf.claim took. */
typedef struct ClaimedStep
{
	int64		lease;
	OfferKey	key;
	int32		visits;
	int32		attempt;
	char		graph[NAMEDATALEN];
	char		task[NAMEDATALEN];
	Oid			owner;			/* the flow's owner */
	Jsonb	   *input;
	Jsonb	   *baggage;		/* or NULL */
	Jsonb	   *call;			/* an HTTP task's call, or NULL */
	TimestampTz lease_until;
} ClaimedStep;

/* Why a lease is no longer held, for complete/fail/extend's errors. */
typedef enum LeaseEnd
{
	LEASE_HELD = 0,
	LEASE_UNKNOWN,				/* never seen: from before a restart, or made up */
	LEASE_EXPIRED,				/* it ran out (the step was or will be offered again) */
	LEASE_ANSWERED,				/* completed or failed (committed) */
	LEASE_BUSY,					/* another transaction is completing or failing it */
	LEASE_WITHDRAWN				/* the flow closed or was cancelled */
} LeaseEnd;

/* A held lease, as complete and fail see it. */
typedef struct LeaseInfo
{
	OfferKey	key;
	int32		visits;
	int32		attempt;
	Oid			owner;
	char		task[NAMEDATALEN];
	TimestampTz leased_at;
	TimestampTz lease_until;	/* or when it ended */
	bool		http;			/* an HTTP task's call (queue dwarf.http) */
} LeaseInfo;

/* A step whose answer committed, for its worker to record. */
typedef struct AnsweredStep
{
	OfferKey	key;
	int32		visits;
	int32		attempt;
} AnsweredStep;

/* An offered step, as dwarf.external_steps shows it. */
typedef struct OfferedStep
{
	char		queue[NAMEDATALEN];
	char		task[NAMEDATALEN];
	int64		flow_id;
	Oid			owner;
	int32		attempt;
	const char *state;
	TimestampTz leased_at;		/* 0: not leased */
	TimestampTz lease_until;
} OfferedStep;

/* A lease a worker's sweep found run out: its step's attempt failed. */
typedef struct ExpiredLease
{
	OfferKey	key;
	int32		visits;
	int32		attempt;
	TimestampTz leased_at;
	TimestampTz lease_until;
} ExpiredLease;

extern void OffersShmemRequest(void);
extern void OffersShmemStartup(void);

/* the flow's worker */
/* What became of an offer (OfferPublish). */
typedef enum OfferRefusal
{
	OFFERED = 0,
	OFFER_PAST_SHARE,			/* its owner holds its share of the pool */
	OFFER_PAST_MEMORY_SHARE,	/* ... its share of dwarf.external_memory */
	OFFER_FULL,					/* dwarf.max_external_steps steps are offered */
	OFFER_NO_MEMORY,			/* the inputs fill dwarf.external_memory */
	OFFER_NO_QUEUE				/* too many queues */
} OfferRefusal;

extern OfferRefusal OfferPublish(const OfferSpec *spec);
extern void OfferWithdraw(const OfferKey *key, int32 visits, int32 attempt, LeaseEnd why);
extern void OfferWithdrawFlow(Oid dboid, int64 flow_id);
extern List *OffersSweep(int worker_index, TimestampTz now, bool (*held) (int64 flow_id),
						 TimestampTz *next_due, List **absent);
extern bool OffersPending(void);
extern bool OffersAnsweredPending(void);
extern List *OffersTakeAnswered(int worker_index);
extern bool OfferAnswered(const OfferKey *key, int32 visits, int32 attempt);

/* dwarf.claim, complete, fail, extend */
/* A limit the ready steps of a queue take: its owner and name. */
typedef struct OfferLimit
{
	Oid			owner;
	char		name[NAMEDATALEN];
} OfferLimit;

/* May a claim start a step under this limit (owner, name, key)?  See OffersClaim. */
typedef bool (*ClaimLimitCheck) (Oid owner, const char *name, const char *key, void *arg);

extern List *OffersLimitNames(const char *queue);
extern List *OffersClaim(const char *queue, int max, int64 lease_us, Oid *owners,
						 int nowners, bool any_owner, Oid **seen, int *nseen,
						 ClaimLimitCheck take_limit, void *arg);
extern bool OffersWait(const char *queue, TimestampTz until);
extern void OffersWatch(const char *queue);
extern void OffersCancelWait(void);
extern void OffersForgetDatabase(Oid dboid);
extern LeaseEnd LeaseBeginAnswer(int64 lease, TransactionId xid, LeaseInfo *info);
extern LeaseEnd LeaseLookup(int64 lease, LeaseInfo *info);
extern List *OffersList(const char *queue);
extern LeaseEnd LeaseExtend(int64 lease, int64 us, LeaseInfo *info);

/* the HTTP process */
extern uint64 OffersHttpEnded(void);
extern void LeasesEnded(const int64 *leases, int n, bool *ended);

/* external.c: what dwarf.complete and fail write, for the HTTP process too */
extern void WriteAnswer(int64 lease, const char *status, Jsonb *changes, Jsonb *error,
						bool retryable, const char *function);
extern text *ClaimedStepKey(ClaimedStep *step);
extern List *ClaimOffered(const char *queue, int max, int64 lease_us, Oid *owners,
						  int nowners, bool any_owner, Oid **seen, int *nseen,
						  TimestampTz *limit_retry_at);
extern bool OffersHasReady(const char *queue);

#endif							/* DWARF_OFFERS_H */
