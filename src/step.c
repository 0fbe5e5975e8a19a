/*
 * step.c
 *		One step of a flow: calling its task, isolated from every other task
 *		that shares the worker, and turning what happened into the step's
 *		outcome and row.
 *
 * A task runs as its flow's owner in a security-restricted operation,
 * under a GUC nest level rolled back when it returns and from the
 * database's own search_path (the worker's is pinned); what a restricted
 * operation allows but should not outlive the step (prepared statements,
 * session advisory locks) is ended with it.  Its time budget (the flow's
 * or its task's), its error document, whether its task's retry policy
 * retries an error, and the rule that a lock conflict met while sharing a
 * transaction is not the task's fault live here too.
 *
 * So does how long a task may hold its process.  While a batch runs, a
 * timer ticks every DWARF_STEP_TICK_MS; if a task is running, the tick
 * stops it with a query cancel (which interrupts a lock wait too) when:
 * in a worker, it has run for dwarf.long_step (it is preempted: its step
 * is rolled back, the task marked slow, and the step given back untouched
 * to be lent to a runner); in a runner, it has run for dwarf.max_step_time
 * (the step fails); anywhere, its flow was cancelled (the owner's ring has
 * the cancel's note: the step is rolled back and given back, and the flow's
 * reload finds it cancelled).  Arming the timer once a batch, not once a
 * step, keeps its cost off the hot path.
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/prepare.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "lograte.h"
#include "graph.h"
#include "flowrun.h"
#include "json.h"
#include "offers.h"
#include "worker.h"

/*
 * The search_path a task starts with: the database's own (postgresql.conf,
 * ALTER DATABASE).  The worker's own statements run under a pinned
 * "pg_catalog, pg_temp", so no name a task's owner controls can stand in
 * for the functions and operators the worker calls with its rights.
 */
static char *TaskSearchPath = NULL;

/* Pins the worker's search_path, remembering the one tasks start with. */
void
PinSearchPath(void)
{
	if (TaskSearchPath)
		pfree(TaskSearchPath);
	TaskSearchPath = MemoryContextStrdup(TopMemoryContext,
										 GetConfigOptionResetString("search_path"));
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_SESSION);
}

/*
 * Ends what a task can leave behind in the worker's session that a
 * security-restricted operation does not forbid: prepared statements and
 * session-level advisory locks.  The next task, of any role, finds none.
 */
static void
EndTaskSession(void)
{
	DropAllPreparedStatements();
	LockReleaseSession(USER_LOCKMETHOD);
}

/*
 * Stops a step's time budget.  A budget that ran out after the task's last
 * interrupt check left a cancel pending that is no one's: dropped, or the
 * worker's next check outside any step would end its batch.
 */
static void
EndTimeBudget(void)
{
	bool		fired = get_timeout_indicator(STATEMENT_TIMEOUT, false);

	disable_timeout(STATEMENT_TIMEOUT, false);
	if (fired)
		QueryCancelPending = false;
}

/* ---------- how long a task may hold its process ---------- */

/* How often the step timer looks at the running task, while a batch runs. */
#define DWARF_STEP_TICK_MS		100

/* Why the step timer stopped the running task. */
typedef enum TaskStop
{
	STOP_NONE,
	STOP_PREEMPTED,				/* ran past dwarf.long_step in a worker */
	STOP_CANCELLED,				/* its flow was cancelled */
	STOP_TOO_LONG				/* ran past dwarf.max_step_time in a runner */
} TaskStop;

static TimeoutId StepTimeout = MAX_TIMEOUTS;	/* registered by StepTimerInit */

/*
 * The running task, as the timer's handler sees it.  TaskSince is set last
 * when a task starts and cleared first when it ends: while it is 0, the
 * handler does nothing.
 */
static volatile TimestampTz TaskSince = 0;
static volatile int64 TaskLimitUs = 0;	/* stop it after this long; 0: never */
static volatile sig_atomic_t TaskLimitStop = STOP_NONE; /* and why */
static volatile int64 TaskFlow = 0;
static volatile int64 TaskTree = 0; /* the top of TaskFlow's tree */
static volatile uint32 TaskSeen = 0;	/* the ring is read up to here */
static volatile sig_atomic_t TaskStopped = STOP_NONE;
static uint32 BatchSeen = 0;	/* the ring's end when the batch started */
static bool StoppedThrow = false;	/* a stop rethrown from a shared batch */

/*
 * Has a cancel of the running task's flow, or of its whole tree of
 * subgraphs, come on the ring we watch (our
 * own, or a runner's lender's) since the batch started?  Read without the
 * ring's lock, from a signal handler: a worker's own ring does not change
 * under it while the worker runs a batch but for new notes at its end; a
 * lender drains its ring meanwhile, so a runner may read a note being
 * written, which at worst misses the cancel until the next tick or sees
 * one that is not there (the step is then run again).
 */
static bool
CancelNoted(void)
{
	volatile DwarfWorkerSlot *slot = Worker.slot;
	uint32		tail = slot->tail;
	uint32		i = TaskSeen;

	pg_read_barrier();
	if (tail - i > DWARF_RING_SIZE)
		i = tail - DWARF_RING_SIZE;
	for (; i != tail; i++)
	{
		volatile DwarfNote *note = &slot->ring[i % DWARF_RING_SIZE];

		if ((note->kind == NOTE_CANCEL_FLOW && note->flow_id == TaskFlow) ||
			(note->kind == NOTE_CANCEL_TREE && note->flow_id == TaskTree))
			return true;
	}
	TaskSeen = tail;
	return false;
}

/*
 * The step timer's handler: stops the running task, if it has run too long
 * or its flow was cancelled, as the statement timeout does (a lock wait
 * ends too).  A task that caught the cancel and goes on is cancelled again
 * at the next tick.
 */
static void
StepTimerHandler(void)
{
	if (TaskSince == 0)
		return;
	if (TaskStopped == STOP_NONE)
	{
		if (CancelNoted())
			TaskStopped = STOP_CANCELLED;
		else if (TaskLimitUs > 0 && GetCurrentTimestamp() - TaskSince >= TaskLimitUs)
			TaskStopped = TaskLimitStop;
		else
			return;
	}
	InterruptPending = true;
	QueryCancelPending = true;
	SetLatch(MyLatch);
}

/* Registers the step timer; once, when a worker or a runner starts. */
void
StepTimerInit(void)
{
	StepTimeout = RegisterTimeout(USER_TIMEOUT, StepTimerHandler);
}

/*
 * Starts the step timer for a batch.  seen is the end of the watched ring
 * when the batch started: a cancel noted after it stops the running step.
 * One setitimer at most, and often none: PostgreSQL leaves an alarm that
 * is still due alone.
 */
void
StepTimerArm(uint32 seen)
{
	BatchSeen = seen;
	enable_timeout_every(StepTimeout,
						 TimestampTzPlusMilliseconds(GetCurrentTimestamp(), DWARF_STEP_TICK_MS),
						 DWARF_STEP_TICK_MS);
}

/* Stops the step timer at a batch's end, or after an error. */
void
StepTimerDisarm(void)
{
	TaskSince = 0;
	TaskStopped = STOP_NONE;
	if (StepTimeout != MAX_TIMEOUTS)
		disable_timeout(StepTimeout, false);
}

/*
 * Did the step of a shared batch that rethrew its error (RunStep) stop
 * because it was preempted or its flow cancelled, rather than fail?  Then
 * the batch is rolled back and run again, with nothing held against its
 * steps.  Asked once.
 */
bool
StepWasStopped(void)
{
	bool		stopped = StoppedThrow;

	StoppedThrow = false;
	return stopped;
}

/*
 * A task starts: what the handler watches.  In a worker whose slow steps
 * can go to runners (preemptible), it may run for dwarf.long_step; in a
 * runner, for dwarf.max_step_time.
 */
static void
TaskBegins(FlowRun *flow, TimestampTz started, bool preemptible)
{
	TaskStopped = STOP_NONE;
	TaskFlow = flow->id;
	TaskTree = flow->root_id;
	TaskSeen = BatchSeen;
	if (Worker.is_runner)
	{
		TaskLimitUs = (int64) dwarf_max_step_time * 1000;
		TaskLimitStop = STOP_TOO_LONG;
	}
	else
	{
		TaskLimitUs = preemptible ? (int64) dwarf_long_step * 1000 : 0;
		TaskLimitStop = STOP_PREEMPTED;
	}
	TaskSince = started;
}

/*
 * A task ended, by returning or by an error.  Returns why the timer stopped
 * it, if it did; a cancel it raised and no one took is dropped (a task that
 * returned after all is done, and an error is already the task's end).
 */
static TaskStop
TaskEnds(void)
{
	TaskStop	stopped;

	TaskSince = 0;
	stopped = (TaskStop) TaskStopped;
	TaskStopped = STOP_NONE;
	if (stopped != STOP_NONE)
		QueryCancelPending = false;
	return stopped;
}

/*
 * How long a step of node may run, in milliseconds (0: no limit): the
 * smaller of the flow's time_budget and the task's own in the graph.  With
 * task_s, says whether it is the task's.
 */
static int64
StepBudgetMs(FlowRun *flow, GraphNode *node, bool *task_s)
{
	int64		task_ms = (node->time_budget_us + 999) / 1000;
	bool		own = task_ms > 0 &&
		(flow->time_budget_ms <= 0 || task_ms <= flow->time_budget_ms);

	if (task_s)
		*task_s = own;
	return own ? task_ms : Max(flow->time_budget_ms, 0);
}

/*
 * The error of a step stopped by its time budget: how long it was, and
 * whose it was, the task's or the flow's.
 */
static void
SayBudget(ErrorData *edata, FlowRun *flow, GraphNode *node)
{
	bool		task_s;
	int64		budget_ms = StepBudgetMs(flow, node, &task_s);

	edata->message = psprintf("task \"%s\" ran past its time budget of " INT64_FORMAT " ms",
							  node->name, budget_ms);
	edata->detail = task_s ?
		psprintf("It is the time_budget the graph gives task \"%s\".", node->name) :
		pstrdup("It is the flow's time_budget.");
}

/*
 * Calls a task's function on state as the flow's owner, with the step's
 * context set for dwarf.goto and friends.  Returns the task's changes.
 */
static Jsonb *
CallTask(FlowRun *flow, Token *token, StepContext *ctx, TimestampTz started, bool preemptible)
{
	Graph	   *graph = flow->graph;
	GraphNode	   *node = &graph->nodes[token->node];
	LOCAL_FCINFO(fcinfo, 1);
	Oid			save_user;
	int			save_sec;
	int			nest;
	Datum		result;
	Jsonb	   *changes;
	int64		budget_ms = StepBudgetMs(flow, node, NULL);

	if (!graph->prepared)
		GraphPrepareCalls(graph);
	if (!OidIsValid(node->fn))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function %s of task \"%s\" does not exist", node->fn_name, node->name)));
	if (CrashesOf(flow->id, token->id) >= dwarf_step_crashes)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("task \"%s\" ended the process running it %d times; it is not run again",
						node->name, CrashesOf(flow->id, token->id)),
				 errhint("See the server log for how it ended. dwarf.step_crashes sets how many times are allowed.")));
	CrashesNoteStep(flow->id, token->id);

	/*
	 * A task may call only what its owner could call from a session of its
	 * own: EXECUTE on the function and USAGE on its schema.  The checks are
	 * remembered per task for the last role that passed them: a GRANT,
	 * REVOKE or role change invalidates them (see StoreInit).
	 */
	if (node->may_execute != flow->owner)
	{
		Oid			nsp = get_func_namespace(node->fn);

		if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(flow->owner)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("the role that created flow " INT64_FORMAT " was dropped", flow->id),
					 errdetail("A flow's tasks run as the role that created it (OID %u).", flow->owner)));

		if (object_aclcheck(NamespaceRelationId, nsp, flow->owner, ACL_USAGE) != ACLCHECK_OK)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied for schema %s of task \"%s\"",
							get_namespace_name(nsp), node->name),
					 errdetail("The flow runs as role %s, which has no USAGE on that schema.",
							   GetUserNameFromId(flow->owner, true))));
		if (object_aclcheck(ProcedureRelationId, node->fn, flow->owner, ACL_EXECUTE) != ACLCHECK_OK)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied for function %s of task \"%s\"",
							node->fn_name, node->name),
					 errdetail("The flow runs as role %s.", GetUserNameFromId(flow->owner, true))));
		node->may_execute = flow->owner;
	}

	/*
	 * The task runs as the flow's owner, the way PostgreSQL runs user code
	 * on someone else's behalf (index_build, ANALYZE): a security-restricted
	 * operation (no SET ROLE, no temporary objects, no LISTEN), under a GUC
	 * nest level that is rolled back when it returns, so nothing it SETs
	 * outlives the step.  It starts from the database's own search_path,
	 * not the worker's pinned one.
	 */
	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(flow->owner,
						   save_sec | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
	nest = NewGUCNestLevel();
	(void) set_config_option("search_path", TaskSearchPath, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	SessionTaskBegins();		/* the owner's ALTER ROLE ... SET, and no lastval() */
	DwarfCurrentStep = ctx;
	if (budget_ms > 0)
		enable_timeout_after(STATEMENT_TIMEOUT, (int) Min(budget_ms, INT_MAX));

	InitFunctionCallInfoData(*fcinfo, node->flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = JsonbPGetDatum(FlowTokenState(flow, token));
	fcinfo->args[0].isnull = false;
	TaskBegins(flow, started, preemptible);
	result = FunctionCallInvoke(fcinfo);
	(void) TaskEnds();			/* it returned: whatever the timer said is moot */

	if (budget_ms > 0)
		EndTimeBudget();
	DwarfCurrentStep = NULL;
	AtEOXact_GUC(false, nest);
	SetUserIdAndSecContext(save_user, save_sec);
	EndTaskSession();
	SessionAfterTask(node);

	if (fcinfo->isnull)
		return JsonbEmptyObject();
	changes = DatumGetJsonbP(result);
	if (!JsonbIsObject(changes))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("task \"%s\" returned a JSON value that is not an object", node->name),
				 errhint("A task returns its changes as a JSON object, or NULL for none.")));
	return changes;
}

/* The error document a failed step records: what onErr holds for a handler. */
static Jsonb *
ErrorDocument(ErrorData *edata, const char *task)
{
	const char *keys[5] = {"message", "sqlstate", "detail", "hint", "task"};
	const char *vals[5];
	JsonbValue	values[5];
	int			i;

	vals[0] = edata->message ? edata->message : "unknown error";
	vals[1] = unpack_sql_state(edata->sqlerrcode);
	vals[2] = edata->detail;
	vals[3] = edata->hint;
	vals[4] = task;
	for (i = 0; i < 5; i++)
	{
		if (vals[i] == NULL)
			values[i].type = jbvNull;
		else
		{
			values[i].type = jbvString;
			values[i].val.string.val = (char *) vals[i];
			values[i].val.string.len = strlen(vals[i]);
		}
	}
	return JsonbWithKeys(JsonbEmptyObject(), 5, keys, values);
}


/*
 * Errors that come from sharing a transaction with other steps rather than
 * from the task: a step that meets one while other steps' locks are held in
 * its transaction runs again on its own before the error counts as its own.
 */
static bool
IsContention(int sqlerrcode)
{
	return sqlerrcode == ERRCODE_T_R_DEADLOCK_DETECTED ||
		sqlerrcode == ERRCODE_T_R_SERIALIZATION_FAILURE ||
		sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE;
}


/*
 * Errors of the server rather than of the task: a full disk, memory or
 * another resource run short (class 53), an I/O error (58000, 58030).  A
 * step that meets one is not failed: it runs again later (see DeferStep).
 */
static bool
IsServerTrouble(int sqlerrcode)
{
	return ERRCODE_TO_CATEGORY(sqlerrcode) == ERRCODE_INSUFFICIENT_RESOURCES ||
		sqlerrcode == ERRCODE_SYSTEM_ERROR ||
		sqlerrcode == ERRCODE_IO_ERROR;
}

/* A step put off by server trouble, and how often in a row. */
typedef struct Deferral
{
	int64		flow_id;		/* key: the step's flow, token and visit */
	int			token_id;
	int			visits;
	int			times;
} Deferral;

static HTAB *Deferrals = NULL;

/*
 * Puts off a step that met server trouble: it runs again after a backoff
 * that doubles from DWARF_DEFER_FIRST_MS up to DWARF_DEFER_MAX_MS for as
 * long as the trouble lasts (a disk that fills up must not fail every flow
 * for good).  Nothing is recorded: the step's writes rolled back.
 */
static void
DeferStep(FlowRun *flow, Token *token, ErrorData *edata)
{
	Deferral	key = {flow->id, token->id, token->visits, 0};
	Deferral   *d;
	bool		found;
	int64		delay_ms;
	static LogRate deferred;
	TimestampTz now;
	int64		n;
	int			seconds;

	if (Deferrals == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = offsetof(Deferral, times);
		ctl.entrysize = sizeof(Deferral);
		ctl.hcxt = TopMemoryContext;
		Deferrals = hash_create("dwarf deferred steps", 64, &ctl,
								HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	if (hash_get_num_entries(Deferrals) >= DWARF_MAX_DEFERRALS)
	{
		hash_destroy(Deferrals);	/* forgetting only shortens some backoffs */
		Deferrals = NULL;
		DeferStep(flow, token, edata);
		return;
	}
	d = hash_search(Deferrals, &key, HASH_ENTER, &found);
	d->times = found ? d->times + 1 : 1;
	delay_ms = Min((int64) DWARF_DEFER_FIRST_MS << Min(d->times - 1, 16), DWARF_DEFER_MAX_MS);
	now = GetCurrentTimestamp();
	token->due = now + delay_ms * 1000;
	if ((n = LogRateDue(&deferred, now, &seconds)) > 0)
		ereport(LOG,
				(errmsg("dwarf: task \"%s\" of flow " INT64_FORMAT " met a server error, running it again in " INT64_FORMAT " ms: %s%s",
						flow->graph->nodes[token->node].name, flow->id, delay_ms, edata->message,
						LogRateCount(n, seconds)),
				 errdetail("SQLSTATE %s is the server's trouble, not the task's: the step is not failed.",
						   unpack_sql_state(edata->sqlerrcode))));
}

/* A step that ran (or failed on its own) is no longer put off. */
static void
EndDeferral(FlowRun *flow, int token_id, int visits)
{
	Deferral	key = {flow->id, token_id, visits, 0};

	if (Deferrals != NULL && hash_get_num_entries(Deferrals) > 0)
		(void) hash_search(Deferrals, &key, HASH_REMOVE, NULL);
}

/*
 * Says in the log why the step timer stopped a task (see TaskBegins), and
 * marks a preempted task slow, so that its steps go to runners.
 */
static void
ReportStop(FlowRun *flow, int node, TaskStop stopped, TimestampTz started)
{
	const char *task = flow->graph->nodes[node].name;
	static LogRate long_steps;
	static LogRate cancels;
	TimestampTz now = GetCurrentTimestamp();
	int64		n;
	int			seconds;

	if (stopped == STOP_PREEMPTED)
	{
		NoteTaskTime(&flow->graph->nodes[node], now - started);
		if ((n = LogRateDue(&long_steps, now, &seconds)) > 0)
			ereport(LOG,
					(errmsg("dwarf: task \"%s\" of flow " INT64_FORMAT " ran past dwarf.long_step (%d ms) in a worker; its step runs again in a runner%s",
							task, flow->id, dwarf_long_step, LogRateCount(n, seconds)),
					 errdetail("The step was rolled back; nothing of it is kept.")));
	}
	else if (stopped == STOP_CANCELLED &&
			 (n = LogRateDue(&cancels, now, &seconds)) > 0)
		ereport(LOG,
				(errmsg("dwarf: the running step of task \"%s\" of flow " INT64_FORMAT " was stopped: its flow was cancelled%s",
						task, flow->id, LogRateCount(n, seconds))));
}

/* ---------- steps of external tasks ---------- */

/*
 * A step of an external task with no answer yet is not offered inside a
 * batch's transaction (offers.c refuses it): it is put back, and its flow,
 * queued again after the commit or reloaded after a rollback, offers it
 * then (EnqueueRunnable).  MoveDueTimers offers such steps whose backoff
 * ran out before they reach a batch; this is for any other way in.
 */
static StepResult
OfferStep(FlowRun *flow, Token *token)
{
	return STEP_DEFERRED;
}

/* The error document of an external step's failed attempt. */
static Jsonb *
AnswerError(ExternalAnswer *answer, const char *task, int attempt)
{
	const char *keys[2] = {"message", "task"};
	JsonbValue	values[2];
	Jsonb	   *error = answer->error;

	if (answer->kind == ANSWER_EXPIRED || error == NULL)
	{
		char	   *message = answer->kind == ANSWER_EXPIRED ?
			psprintf("the lease of attempt %d of external task \"%s\" ran out at %s",
					 attempt, task, timestamptz_to_str(answer->finished)) :
			pstrdup("failed");

		values[0].type = jbvString;
		values[0].val.string.val = message;
		values[0].val.string.len = strlen(message);
		values[1].type = jbvString;
		values[1].val.string.val = (char *) task;
		values[1].val.string.len = strlen(task);
		return JsonbWithKeys(JsonbEmptyObject(), 2, keys, values);
	}
	values[0].type = jbvString;
	values[0].val.string.val = (char *) task;
	values[0].val.string.len = strlen(task);
	return JsonbWithKeys(error, 1, &keys[1], values);
}

/*
 * Records the answer of an external task's step: completed, the step's
 * changes; failed (dwarf.fail, or its lease ran out), another attempt when
 * the failure may be retried and the task's retry policy allows one, else
 * the step fails (its on_error edges, or the flow fails).  The answer's
 * row is deleted in the same transaction, and its offer withdrawn.  Like a
 * task's step: isolated, an error while the flow moves on is the step's
 * (STEP_BROKEN); shared, it aborts the batch.
 */
static StepResult
RecordAnswer(FlowRun *flow, Token *token, bool isolated)
{
	GraphNode  *node = &flow->graph->nodes[token->node];
	ExternalAnswer *answer = token->answer;
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	StepOutcome outcome = {0};
	OfferKey	key;
	int			token_id = token->id;
	int			visits = token->visits;
	int			attempt = token->attempt;
	int			node_no = token->node;
	TimestampTz first = token->first_started ? token->first_started : answer->started;
	volatile StepResult result = STEP_DONE;
	int64		delay_us;

	token->answer = NULL;
	outcome.goto_node = -1;
	if (answer->kind == ANSWER_COMPLETED)
	{
		outcome.kind = OUTCOME_OK;
		outcome.changes = answer->changes ? answer->changes : JsonbEmptyObject();
	}
	else
	{
		outcome.error = AnswerError(answer, node->name, attempt);
		if ((answer->kind == ANSWER_EXPIRED || answer->retryable) &&
			RetryAgain(&node->retry, attempt, first, answer->finished, 0, &delay_us))
		{
			JsonbValue *retry_after = answer->error ? JsonbField(answer->error, "retry_after") : NULL;

			/* a service that said when to come back (429, 503) is not asked sooner */
			if (retry_after && retry_after->type == jbvNumeric)
				delay_us = Max(delay_us,
							   (int64) (DatumGetFloat8(DirectFunctionCall1(numeric_float8,
																		   NumericGetDatum(retry_after->val.numeric))) *
										USECS_PER_SEC));
			outcome.kind = OUTCOME_RETRY;
			outcome.changes = JsonbEmptyObject();
			outcome.wake_at = answer->finished + delay_us;
		}
		else
			outcome.kind = OUTCOME_ERROR;
		pg_atomic_fetch_add_u64(&Worker.slot->steps_failed, 1);
	}
	if (isolated)
		BeginInternalSubTransaction(NULL);
	PG_TRY();
	{
		FlowAdvance(flow, token, &outcome);
		if (isolated)
		{
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		if (!isolated)
			PG_RE_THROW();
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		outcome.kind = OUTCOME_ERROR;
		outcome.changes = NULL;
		outcome.wake_at = 0;
		outcome.error = ErrorDocument(edata, node->name);
		result = STEP_BROKEN;
	}
	PG_END_TRY();
	RecordStep(flow, token_id, node_no, attempt, &outcome, answer->started, answer->finished);
	if (answer->in_table)
		DeleteAnswer(flow->id, token_id, visits, attempt);
	memset(&key, 0, sizeof(key));
	key.dboid = MyDatabaseId;
	key.flow_id = flow->id;
	key.token_id = token_id;
	OfferWithdraw(&key, visits, attempt, LEASE_ANSWERED);
	return result;
}

/*
 * Runs one step.  Isolated, the task and the transition run in a
 * subtransaction, and an error there becomes the step's outcome; otherwise
 * an error aborts the whole batch.  With shared (other steps ran before it
 * in this transaction, or it ran alone fewer than DWARF_CONTENTION_TRIES
 * times), a lock conflict is not the task's fault: the step is given back
 * untouched (STEP_CONTENDED) to run alone.  An error of the server rather
 * than of the task puts the step off (STEP_DEFERRED), untouched too.  A
 * task the step timer stopped (preempted when preemptible, or its flow
 * cancelled) is not failed either: its step is given back (STEP_STOPPED),
 * or, shared, the batch rolled back (StepWasStopped).  The task's own
 * error is a retry when its task's policy in the graph says so (see
 * RetryAgain): the step's row is a 'retry' with the error and no changes,
 * and the same step runs again after the backoff.  Otherwise it fails.
 */
StepResult
RunStep(FlowRun *flow, Token *token, bool isolated, bool shared, bool preemptible)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	StepContext ctx = {flow, token, -1, false, 0, 0, false, NULL, 0, 0, CurrentMemoryContext};
	StepOutcome outcome = {0};
	TimestampTz started = GetCurrentTimestamp();
	int			token_id = token->id;
	int			node = token->node;
	int			attempt = token->attempt;
	int			visits = token->visits;
	volatile bool advancing = false;	/* set in PG_TRY, read in PG_CATCH */
	StepResult	result = STEP_DONE;
	volatile TimestampTz returned = 0; /* when the task returned or failed */
	TimestampTz finished;
	int64		delay_us;

	if (flow->graph->nodes[node].kind != TASK_FUNCTION)
		return token->answer ? RecordAnswer(flow, token, isolated) : OfferStep(flow, token);
	if (attempt == 1)
		token->first_started = started;
	if (isolated)
		BeginInternalSubTransaction(NULL);
	PG_TRY();
	{
		outcome.changes = CallTask(flow, token, &ctx, started, preemptible);
		returned = GetCurrentTimestamp();
		outcome.kind = ctx.interrupted ? OUTCOME_INTERRUPT :
			ctx.waiting_child ? OUTCOME_WAITING :
			ctx.retry ? OUTCOME_RETRY : OUTCOME_OK;
		outcome.goto_node = outcome.kind == OUTCOME_OK ? ctx.goto_node : -1;
		outcome.signal = ctx.payload;
		if (outcome.kind == OUTCOME_WAITING)
		{
			const char *key = "child";
			JsonbValue	child;

			child.type = jbvNumeric;
			child.val.numeric = int64_to_numeric(ctx.waiting_child);
			outcome.signal = JsonbWithKeys(JsonbEmptyObject(), 1, &key, &child);
		}
		if (outcome.kind == OUTCOME_OK || outcome.kind == OUTCOME_RETRY)
			if (ctx.retry || ctx.delay_us > 0)
				outcome.wake_at = returned + ctx.delay_us;	/* from the step's end */
		advancing = true;
		FlowAdvance(flow, token, &outcome);
		if (isolated)
		{
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		TaskStop	stopped = TaskEnds();
		GraphNode  *gnode = &flow->graph->nodes[node];
		int64		budget_ms = StepBudgetMs(flow, gnode, NULL);

		DwarfCurrentStep = NULL;
		if (budget_ms > 0)
			EndTimeBudget();
		EndTaskSession();
		ReportStop(flow, node, stopped, started);
		if (!isolated)
		{
			StoppedThrow = stopped == STOP_PREEMPTED || stopped == STOP_CANCELLED;
			PG_RE_THROW();
		}
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && stopped == STOP_TOO_LONG)
		{
			edata->message = psprintf("task \"%s\" ran past dwarf.max_step_time (%d ms)",
									  gnode->name, dwarf_max_step_time);
			edata->hint = pstrdup("dwarf.max_step_time limits a step in a runner; a time_budget (the flow's or the task's) may limit it further.");
		}
		else if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && budget_ms > 0)
			SayBudget(edata, flow, gnode);
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		if (stopped == STOP_PREEMPTED || stopped == STOP_CANCELLED)
			result = STEP_STOPPED;	/* given back untouched, below */
		else if (shared && !advancing && IsContention(edata->sqlerrcode))
			result = STEP_CONTENDED;	/* given back untouched, below */
		else if (!advancing && IsServerTrouble(edata->sqlerrcode))
		{
			DeferStep(flow, token, edata);
			result = STEP_DEFERRED;
		}
		else
		{
			/* the attempt ended now: a retry's backoff counts from here */
			returned = GetCurrentTimestamp();
			outcome.kind = OUTCOME_ERROR;
			outcome.changes = NULL;
			outcome.goto_node = -1;
			outcome.wake_at = 0;
			outcome.signal = NULL;
			outcome.error = ErrorDocument(edata, gnode->name);
			if (!advancing &&
				RetryAgain(&gnode->retry, attempt, token->first_started, returned,
						   edata->sqlerrcode, &delay_us))
			{
				/* the same step again later, on the state it started from */
				outcome.kind = OUTCOME_RETRY;
				outcome.changes = JsonbEmptyObject();
				outcome.wake_at = returned + delay_us;
			}
			if (advancing)
				result = STEP_BROKEN;
			else
				FlowAdvance(flow, token, &outcome);
			pg_atomic_fetch_add_u64(&Worker.slot->steps_failed, 1);
		}
	}
	PG_END_TRY();
	if (result == STEP_CONTENDED || result == STEP_DEFERRED || result == STEP_STOPPED)
		return result;
	EndDeferral(flow, token_id, visits);

	finished = returned ? returned : GetCurrentTimestamp();
	NoteTaskTime(&flow->graph->nodes[node], finished - started);
	RecordStep(flow, token_id, node, attempt, &outcome, started, finished);
	return result;
}
