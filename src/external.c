/*
 * external.c
 *		The SQL functions of workers outside the server: dwarf.claim,
 *		dwarf.complete, dwarf.fail and dwarf.extend.
 *
 * A step of an external task waits in shared memory (offers.c), holding no
 * process and no connection, until a claim leases it.  The answer is a row
 * of dwarf.answer written in the caller's own transaction, so that what the
 * outside worker wrote in that transaction commits with it, exactly once:
 * the lease is fenced (offers.c) while the answer's transaction is in
 * progress, and ended once it committed.  At commit the flow's worker is
 * told; it records the answer as the step's row, in step order with the
 * flow's other steps (the worker is the only writer of a flow's steps, so
 * replay sees them in the order it took them), and deletes the answer.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "flows.h"
#include "flowrun.h"
#include "graph.h"
#include "json.h"
#include "limits.h"
#include "offers.h"

/* The most steps one claim may take. */
#define DWARF_MAX_CLAIM		10000

/* The longest a claim may wait for a step. */
#define DWARF_MAX_CLAIM_WAIT_MS		(60 * 60 * 1000)

/* The roles whose flows this backend's user may claim, as last found. */
typedef struct ClaimRoles
{
	Oid			user;
	Oid		   *allowed;
	int			nallowed;
	Oid		   *denied;
	int			ndenied;
} ClaimRoles;

static ClaimRoles Roles = {InvalidOid, NULL, 0, NULL, 0};

static void
AddRole(Oid **roles, int *n, Oid role)
{
	*roles = *roles ? repalloc(*roles, sizeof(Oid) * (*n + 1)) :
		MemoryContextAlloc(TopMemoryContext, sizeof(Oid));
	(*roles)[(*n)++] = role;
}

/*
 * A role membership or a role changed (GRANT, REVOKE, ALTER ROLE, DROP
 * ROLE): what CheckOwners found is forgotten, so that the next claim, or
 * the next round of a claim's wait, asks again.  A syscache callback on
 * pg_auth_members and pg_authid, called as invalidations are read.
 */
static void
ForgetClaimRoles(Datum arg, int cacheid, uint32 hashvalue)
{
	Roles.nallowed = Roles.ndenied = 0;
}

/*
 * Sorts the owners a claim met into those whose privileges the user has
 * and those it has not.  Returns whether any was allowed.  What was found
 * is kept for the backend's next claims, until the user changes or a role
 * membership or role changes (ForgetClaimRoles): a REVOKE committed in
 * another session holds from the next claim on, and in a claim that
 * waits, from its next round.
 */
static bool
CheckOwners(Oid user, Oid *seen, int nseen)
{
	bool		any = false;
	int			i,
				j;

	for (i = 0; i < nseen; i++)
	{
		bool		known = false;

		for (j = 0; j < Roles.ndenied; j++)
			if (Roles.denied[j] == seen[i])
				known = true;
		if (known)
			continue;
		if (has_privs_of_role(user, seen[i]))
		{
			AddRole(&Roles.allowed, &Roles.nallowed, seen[i]);
			any = true;
		}
		else
			AddRole(&Roles.denied, &Roles.ndenied, seen[i]);
	}
	return any;
}

/*
 * What a claim knows of the limits of the steps it may take: their
 * settings, read before it claims (OffersClaim takes places under the
 * offers' lock, where no table may be read), and the counts that refused
 * it, which its further steps under the same count skip.
 */
typedef struct ClaimLimits
{
	List	   *names;			/* of the limits (OfferLimit), in step with settings */
	LimitSettings *settings;
	List	   *refused;		/* "owner\x01name\x01key" of the counts that refused */
	TimestampTz retry_at;		/* the soonest one may have room; 0: none */
} ClaimLimits;

static void
ReadClaimLimits(ClaimLimits *limits, const char *queue)
{
	ListCell   *lc;

	limits->names = OffersLimitNames(queue);
	limits->settings = palloc(sizeof(LimitSettings) * Max(list_length(limits->names), 1));
	foreach(lc, limits->names)
	{
		OfferLimit *limit = lfirst(lc);

		LimitReadSettings(limit->owner, limit->name, &limits->settings[foreach_current_index(lc)]);
	}
}

/* ClaimLimitCheck: takes a place of the limit, with the settings read before. */
static bool
TakeClaimLimit(Oid owner, const char *name, const char *key, void *arg)
{
	ClaimLimits *limits = arg;
	char	   *count = psprintf("%u%c%s%c%s", owner, 1, name, 1, key ? key : "");
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz retry_at;
	ListCell   *lc;

	foreach(lc, limits->refused)
		if (strcmp(lfirst(lc), count) == 0)
			return false;
	foreach(lc, limits->names)
		if (((OfferLimit *) lfirst(lc))->owner == owner &&
			strcmp(((OfferLimit *) lfirst(lc))->name, name) == 0)
		{
			if (LimitTakeWith(owner, name, key, &limits->settings[foreach_current_index(lc)], now,
							  &retry_at))
				return true;
			limits->refused = lappend(limits->refused, count);
			retry_at = retry_at > 0 ? retry_at : now + DWARF_LIMIT_RECHECK_MS * 1000;
			if (limits->retry_at == 0 || retry_at < limits->retry_at)
				limits->retry_at = retry_at;
			return false;
		}
	return false;				/* offered since the settings were read */
}

/*
 * OffersClaim, with the places of the steps' limits taken (the limits'
 * settings are read first: in a transaction).  *limit_retry_at is when a
 * step left for want of room under its limit may have it (0: none left).
 */
List *
ClaimOffered(const char *queue, int max, int64 lease_us, Oid *owners, int nowners,
			 bool any_owner, Oid **seen, int *nseen, TimestampTz *limit_retry_at)
{
	ClaimLimits limits = {0};
	List	   *claimed;

	ReadClaimLimits(&limits, queue);
	claimed = OffersClaim(queue, max, lease_us, owners, nowners, any_owner, seen, nseen,
						  TakeClaimLimit, &limits);
	*limit_retry_at = limits.retry_at;
	return claimed;
}

/*
 * The step key a claimed step's task sees, as dwarf.step_key() says it (in
 * a transaction: it reads the incarnation's tag).  The same for every
 * attempt of the step, before and after a restart: HTTP calls send it as
 * their Idempotency-Key.
 */
text *
ClaimedStepKey(ClaimedStep *step)
{
	char	   *tag = IncarnationTag();
	char	   *key = psprintf(INT64_FORMAT "-%d-%d-%s", step->key.flow_id,
							   step->key.token_id, step->visits, step->task);

	return cstring_to_text(tag ? psprintf("%s/%s", tag, key) : key);
}

DWARF_FUNCTION(dwarf_claim);

/*
 * dwarf.claim(queue, max, lease, wait): leases up to max ready steps of the
 * queue's external tasks, of flows whose owners' privileges the caller has,
 * oldest first; waits up to wait for the first one, woken when one is
 * offered.  Writes nothing: a claim needs no commit, and its leases hold
 * whatever becomes of its transaction.
 */
Datum
dwarf_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *queue;
	int			max;
	int64		lease_us = 0;
	int64		wait_us = 0;
	TimestampTz until;
	Oid			user = GetUserId();
	bool		any_owner = superuser();
	List	   *claimed = NIL;
	ListCell   *lc;

	CheckNotStandby("dwarf.claim");
	CheckNotNull(fcinfo, 0, "queue");
	CheckNotNull(fcinfo, 1, "max");
	queue = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (strncmp(queue, DWARF_OWN_QUEUES, strlen(DWARF_OWN_QUEUES)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dwarf.claim: queue \"%s\" is dwarf's own", queue),
				 errdetail("Queues whose names start with \"%s\" are not claimed: the steps of HTTP tasks wait on \"%s\" for the server's own HTTP process.",
						   DWARF_OWN_QUEUES, DWARF_HTTP_QUEUE)));
	max = PG_GETARG_INT32(1);
	if (max < 1 || max > DWARF_MAX_CLAIM)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dwarf.claim takes from 1 to %d steps at a time, not %d",
						DWARF_MAX_CLAIM, max)));
	if (!PG_ARGISNULL(2))
	{
		lease_us = IntervalMicros(PG_GETARG_INTERVAL_P(2), "lease");
		if (lease_us <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a lease must be longer than zero")));
	}
	if (!PG_ARGISNULL(3))
		wait_us = IntervalMicros(PG_GETARG_INTERVAL_P(3), "wait");
	if (wait_us > (int64) DWARF_MAX_CLAIM_WAIT_MS * 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dwarf.claim waits at most an hour")));
	until = GetCurrentTimestamp() + wait_us;
	if (Roles.user != user)
	{
		static bool registered = false;

		if (!registered)
		{
			CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, ForgetClaimRoles, (Datum) 0);
			CacheRegisterSyscacheCallback(AUTHOID, ForgetClaimRoles, (Datum) 0);
			registered = true;
		}
		Roles.user = user;
		Roles.nallowed = Roles.ndenied = 0;
	}

	/*
	 * A wait ended by an error is cancelled by the abort (as every
	 * condition variable's is); the last claim's is forgotten here.
	 */
	OffersCancelWait();
	for (;;)
	{
		Oid		   *seen;
		int			nseen;
		List	   *more;
		TimestampTz limit_retry_at;

		more = ClaimOffered(queue, max - list_length(claimed), lease_us,
							Roles.allowed, Roles.nallowed, any_owner, &seen, &nseen,
							&limit_retry_at);
		claimed = list_concat(claimed, more);
		if (list_length(claimed) < max && nseen > 0 && CheckOwners(user, seen, nseen))
			continue;			/* steps of roles found allowed just now */
		if (claimed != NIL || wait_us == 0)
			break;

		/*
		 * Nothing to claim: wait for a step to be offered, or, when steps
		 * wait for room under their limits, until one may have room (a
		 * limit's places given back wake no claim).
		 */
		if (!OffersWait(queue, limit_retry_at > 0 ? Min(until, limit_retry_at) : until) &&
			GetCurrentTimestamp() >= until)
			break;
		AcceptInvalidationMessages();	/* a REVOKE meanwhile: ForgetClaimRoles */
	}
	OffersCancelWait();

	InitMaterializedSRF(fcinfo, 0);
	foreach(lc, claimed)
	{
		ClaimedStep *step = lfirst(lc);
		Datum		values[9];
		bool		nulls[9] = {0};

		values[0] = Int64GetDatum(step->lease);
		values[1] = Int64GetDatum(step->key.flow_id);
		values[2] = CStringGetTextDatum(step->graph);
		values[3] = CStringGetTextDatum(step->task);
		values[4] = Int32GetDatum(step->attempt);
		values[5] = JsonbPGetDatum(step->input);
		if (step->baggage)
			values[6] = JsonbPGetDatum(step->baggage);
		else
			nulls[6] = true;
		values[7] = PointerGetDatum(ClaimedStepKey(step));
		values[8] = TimestampTzGetDatum(step->lease_until);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* Says why a lease given to complete, fail or extend is not held. */
static void
LeaseNotHeld(int64 lease, LeaseEnd why, LeaseInfo *info, const char *function)
{
	const char *flow = info->key.flow_id ?
		psprintf(" of flow " INT64_FORMAT, info->key.flow_id) : "";

	switch (why)
	{
		case LEASE_HELD:
			break;
		case LEASE_UNKNOWN:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("%s: lease " INT64_FORMAT " is not known", function, lease),
					 errdetail("It was taken before the server restarted, or it ended long ago: leases are kept in memory."),
					 errhint("Claim the step again; after a restart every waiting step is offered again.")));
			break;
		case LEASE_EXPIRED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("%s: lease " INT64_FORMAT "%s has expired", function, lease, flow),
					 errdetail("The lease ran out at %s; the attempt counts as failed and the step is offered again, to be claimed anew.",
							   timestamptz_to_str(info->lease_until)),
					 errhint("Extend a lease with dwarf.extend() while the work goes on, or claim with a longer lease.")));
			break;
		case LEASE_ANSWERED:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("%s: the step of lease " INT64_FORMAT "%s was already completed or failed",
							function, lease, flow)));
			break;
		case LEASE_BUSY:
			ereport(ERROR,
					(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("%s: another transaction is completing or failing the step of lease " INT64_FORMAT "%s",
							function, lease, flow),
					 errdetail("If that transaction rolls back, the lease is held again.")));
			break;
		case LEASE_WITHDRAWN:
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("%s: lease " INT64_FORMAT "%s is no longer held: the flow was cancelled or has closed",
							function, lease, flow)));
			break;
	}
}

/*
 * Only a role with the privileges of a step's flow's owner may answer the
 * step or extend its lease (as only such a role may claim it), and no one
 * answers or extends the lease of an HTTP task's call but the HTTP process
 * that makes it (it answers with WriteAnswer directly).
 */
static void
CheckMayAnswer(int64 lease, const char *function)
{
	LeaseInfo	info;
	LeaseEnd	why = LeaseLookup(lease, &info);

	LeaseNotHeld(lease, why, &info, function);
	if (!has_privs_of_role(GetUserId(), info.owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s: permission denied for the step of flow " INT64_FORMAT,
						function, info.key.flow_id),
				 errdetail("Only a role with the privileges of the flow's owner may answer its steps or extend their leases.")));
	if (info.http)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s: lease " INT64_FORMAT " is of an HTTP call (queue \"%s\"), which only dwarf's HTTP process answers",
						function, lease, DWARF_HTTP_QUEUE),
				 errdetail("The step is task \"%s\" of flow " INT64_FORMAT ".", info.task, info.key.flow_id)));
}

/* Kept statements. */
static SPIPlanPtr FlowStatusPlan = NULL;
static SPIPlanPtr InsertAnswerPlan = NULL;

/*
 * Writes the answer of a held lease in the current transaction: fences the
 * lease with the transaction's id, inserts the answer's row, and wakes the
 * flow's worker at commit.  status is 'completed' (with changes) or
 * 'failed' (with error and retryable).  An error when the lease is not held
 * or the flow is not running.  The caller has checked who may answer:
 * dwarf.complete and dwarf.fail (Answer), or the HTTP process (http.c),
 * which answers for the calls it made.
 */
void
WriteAnswer(int64 lease, const char *status, Jsonb *changes, Jsonb *error, bool retryable,
			const char *function)
{
	Oid			types[10] = {INT8OID, INT4OID, INT4OID, INT4OID, TEXTOID, JSONBOID, JSONBOID,
		BOOLOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[10];
	char		nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	Oid			idtype[1] = {INT8OID};
	LeaseInfo	info;
	LeaseEnd	why;
	SavedUser	saved;
	char	   *flow_status;

	/*
	 * The lease is fenced by this (sub)transaction's id: a savepoint rolled
	 * back gives it back, as the whole transaction's rollback does.
	 */
	why = LeaseBeginAnswer(lease, GetCurrentTransactionId(), &info);
	LeaseNotHeld(lease, why, &info, function);

	Connect();
	saved = BecomeOwner();
	args[0] = Int64GetDatum(info.key.flow_id);
	if (FlowStatusPlan == NULL)
		FlowStatusPlan = PrepareKept("SELECT status FROM dwarf.flow WHERE id = $1", 1, idtype);
	if (SPI_execute_plan(FlowStatusPlan, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "dwarf: could not read flow " INT64_FORMAT, info.key.flow_id);
	flow_status = SPI_processed ?
		SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1) : "gone";
	if (strcmp(flow_status, "running") != 0 && strcmp(flow_status, "interrupted") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: flow " INT64_FORMAT " is %s", function, info.key.flow_id, flow_status),
				 errdetail("A step of a flow that closed or was cancelled takes no answer.")));

	args[1] = Int32GetDatum(info.key.token_id);
	args[2] = Int32GetDatum(info.visits);
	args[3] = Int32GetDatum(info.attempt);
	args[4] = CStringGetTextDatum(status);
	if (changes)
		args[5] = JsonbPGetDatum(changes);
	else
		nulls[5] = 'n';
	if (error)
		args[6] = JsonbPGetDatum(error);
	else
		nulls[6] = 'n';
	args[7] = BoolGetDatum(retryable);
	args[8] = TimestampTzGetDatum(info.leased_at);
	args[9] = TimestampTzGetDatum(GetCurrentTimestamp());
	if (InsertAnswerPlan == NULL)
		InsertAnswerPlan = PrepareKept("INSERT INTO dwarf.answer (flow_id, token, visits, attempt,"
									   " status, changes, error, retryable, started_at, finished_at)"
									   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
									   10, types);
	if (SPI_execute_plan(InsertAnswerPlan, args, nulls, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "dwarf: could not record the answer of flow " INT64_FORMAT, info.key.flow_id);
	RestoreUser(saved);
	SPI_finish();
	WakeOwnerOnCommit(info.key.flow_id);	/* it takes the answer (offers.c) */
}

/*
 * Records an answer for a held lease in the caller's transaction, when the
 * caller has the privileges of the step's flow's owner.
 */
static void
Answer(int64 lease, const char *status, Jsonb *changes, Jsonb *error, bool retryable,
	   const char *function)
{
	CheckNotStandby(function);
	CheckMayAnswer(lease, function);
	WriteAnswer(lease, status, changes, error, retryable, function);
}

DWARF_FUNCTION(dwarf_complete);

/*
 * dwarf.complete(lease, changes): the step of a held lease is done, with
 * changes (a JSON object, or NULL for none), once the caller's transaction
 * commits; what else that transaction wrote commits with it, exactly once.
 */
Datum
dwarf_complete(PG_FUNCTION_ARGS)
{
	Jsonb	   *changes = NULL;

	CheckNotNull(fcinfo, 0, "lease");
	if (!PG_ARGISNULL(1))
	{
		changes = PG_GETARG_JSONB_P(1);
		if (!JsonbIsObject(changes))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dwarf.complete: changes must be a JSON object or NULL")));
	}
	Answer(PG_GETARG_INT64(0), "completed", changes, NULL, true, "dwarf.complete");
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_fail);

/*
 * dwarf.fail(lease, error, retryable): the attempt of a held lease failed
 * with error.  The task's retry policy decides what follows (a retryable
 * failure only): another attempt after its backoff, or the step fails (its
 * on_error edges, or the flow fails).
 */
Datum
dwarf_fail(PG_FUNCTION_ARGS)
{
	const char *keys[3] = {"message", "retryable", "task"};
	JsonbValue	values[3];
	char	   *message;
	bool		retryable = PG_ARGISNULL(2) ? true : PG_GETARG_BOOL(2);

	CheckNotNull(fcinfo, 0, "lease");
	message = PG_ARGISNULL(1) ? "failed" : text_to_cstring(PG_GETARG_TEXT_PP(1));
	values[0].type = jbvString;
	values[0].val.string.val = message;
	values[0].val.string.len = strlen(message);
	values[1].type = jbvBool;
	values[1].val.boolean = retryable;
	values[2].type = jbvNull;	/* the worker names the task */
	Answer(PG_GETARG_INT64(0), "failed", NULL,
		   JsonbWithKeys(JsonbEmptyObject(), 2, keys, values), retryable, "dwarf.fail");
	PG_RETURN_VOID();
}

DWARF_FUNCTION(dwarf_extend);

/*
 * dwarf.extend(lease, lease_for): the heartbeat of a long step; the lease
 * now ends lease_for from now.  Returns that end.
 */
Datum
dwarf_extend(PG_FUNCTION_ARGS)
{
	int64		lease;
	int64		us;
	LeaseInfo	info;
	LeaseEnd	why;

	CheckNotNull(fcinfo, 0, "lease");
	CheckNotNull(fcinfo, 1, "lease_for");
	lease = PG_GETARG_INT64(0);
	us = IntervalMicros(PG_GETARG_INTERVAL_P(1), "lease_for");
	if (us <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dwarf.extend: lease_for must be longer than zero")));
	CheckMayAnswer(lease, "dwarf.extend");
	why = LeaseExtend(lease, us, &info);
	LeaseNotHeld(lease, why, &info, "dwarf.extend");
	PG_RETURN_TIMESTAMPTZ(info.lease_until);
}

DWARF_FUNCTION(dwarf_external_steps);

/*
 * dwarf.external_steps(queue): the steps of external tasks waiting now (of
 * one queue, or all), of flows whose owners' privileges the caller has:
 * ready to claim, leased (since when, until when), being answered, or
 * expired (their attempt is being recorded as failed).
 */
Datum
dwarf_external_steps(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *steps = OffersList(PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0)));
	Oid			user = GetUserId();
	ListCell   *lc;

	InitMaterializedSRF(fcinfo, 0);
	foreach(lc, steps)
	{
		OfferedStep *step = lfirst(lc);
		Datum		values[7];
		bool		nulls[7] = {0};

		if (!has_privs_of_role(user, step->owner))
			continue;
		values[0] = CStringGetTextDatum(step->queue);
		values[1] = Int64GetDatum(step->flow_id);
		values[2] = CStringGetTextDatum(step->task);
		values[3] = Int32GetDatum(step->attempt);
		values[4] = CStringGetTextDatum(step->state);
		values[5] = TimestampTzGetDatum(step->leased_at);
		nulls[5] = step->leased_at == 0;
		values[6] = TimestampTzGetDatum(step->lease_until);
		nulls[6] = step->lease_until == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
