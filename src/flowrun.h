/*
 * flowrun.h
 *		A running flow in memory (flowrun.c), how a step row replays into it
 *		(store.c), and the step a task runs in (control.c).
 */
#ifndef DWARF_FLOWRUN_H
#define DWARF_FLOWRUN_H

#include "access/htup.h"
#include "access/tupdesc.h"
#include "lib/ilist.h"
#include "lib/pairingheap.h"
#include "utils/timestamp.h"

#include "graph.h"

/* ---------- flowrun.c: a flow's tokens, transitions and replay ---------- */

typedef enum FlowStatus
{
	FLOW_RUNNING,
	FLOW_COMPLETED,
	FLOW_FAILED
} FlowStatus;

typedef struct Cohort Cohort;

/* What came of a step of an external task, for its worker to record. */
typedef enum AnswerKind
{
	ANSWER_COMPLETED,			/* dwarf.complete */
	ANSWER_FAILED,				/* dwarf.fail */
	ANSWER_EXPIRED				/* its lease ran out */
} AnswerKind;

typedef struct ExternalAnswer
{
	AnswerKind	kind;
	Jsonb	   *changes;		/* completed: or NULL for none */
	Jsonb	   *error;			/* failed, expired: the error document */
	bool		retryable;		/* failed: the policy may try again */
	bool		in_table;		/* a dwarf.answer row, deleted as it is recorded */
	TimestampTz started;		/* when it was claimed */
	TimestampTz finished;
} ExternalAnswer;

/* A token is one branch's position: the task it runs next and its state. */
typedef struct Token
{
	dlist_node	node_in_flow;	/* in FlowRun.tokens */
	int			id;				/* flow-local, assigned in step order */
	int			node;
	int			attempt;
	int			visits;			/* steps this token has taken */
	TimestampTz due;			/* runnable from then on (sleep, retry) */
	TimestampTz first_started;	/* start of this step's first attempt */
	Jsonb	   *state;			/* NULL: a for_each branch's, made when it runs */
	bool		own_state;		/* state is this token's alone, to free */
	struct Edge *each_edge;		/* for_each branch: its edge, element, index */
	JsonbValue	each_element;	/* ... (points into the cohort's fork_state) */
	int			each_index;
	int			each_count;
	List	   *deltas;			/* changes since the cohort forked (Jsonb *) */
	Cohort	   *cohort;			/* NULL at the top level */
	int			branch;			/* index within the cohort */
	bool		queued;			/* in the worker's ready queue */
	struct ReadyEntry *timer;	/* its entry while on the timer heap (queue.c) */
	bool		running;		/* in the batch being run */
	bool		parked;			/* waiting for dwarf.resume, or for child */
	int64		child;			/* the child flow it waits for, or 0 */
	Jsonb	   *payload;		/* the interrupt's payload while parked */
	List	   *resumes;		/* data given by dwarf.resume, for this step */
	bool		offered;		/* an external task's step, offered to claims
								 * (offers.c): it waits for an answer */
	ExternalAnswer *answer;		/* its answer, to record (step.c) */
} Token;

/* The branches a fan-out made, waiting to meet again at a fan-in. */
struct Cohort
{
	Cohort	   *parent;			/* the forking token's cohort */
	int			parent_branch;
	List	   *parent_deltas;
	Jsonb	   *fork_state;		/* the forking token's state */
	bool		own_fork;		/* fork_state is the cohort's alone, to free */
	int			nbranches;
	int			pending;		/* branches neither arrived nor ended */
	int			fan_in;			/* where the first arrival waits, or -1 */
	List	  **deltas;			/* per branch, set when it arrives or ends */
	List	   *drop_keys;		/* for_each keys, removed again at the fan-in */
};

typedef struct FlowRun
{
	int64		id;				/* hash key */
	Graph	   *graph;
	Oid			owner;
	int32		priority;
	Jsonb	   *baggage;		/* or NULL */
	char	   *fairness_key;	/* or NULL */
	int32		fairness_weight;
	int64		time_budget_ms; /* 0 for none */
	bool		delete_on_completion;
	int64		parent_id;		/* a dwarf.subgraph child's parent, or 0 */
	int64		root_id;		/* the top of its tree of subgraphs (itself
								 * when it is the top): a NOTE_CANCEL_TREE
								 * names it */
	int64		steps;			/* step rows so far (dwarf.max_flow_steps) */
	TimestampTz created_at;		/* its row's: flow durations count from it (stats.c) */
	FlowStatus	status;
	Jsonb	   *final_state;
	char	   *error;
	int			next_token;
	TimestampTz next_due;		/* for tokens placed by the current step */
	dlist_head	tokens;			/* live tokens, in the order they were made */
	int			ntokens;
	Token	  **by_id;			/* live tokens by id (NULL: gone), next_token
								 * of them */
	int			by_id_size;		/* allocated */
	List	   *placed;			/* ids of the tokens the last step placed,
								 * made or moved (its successors) */
	uint64		enqueued;		/* the worker's mark: queued after this batch */
	int			offered;		/* its tokens offered to claims */
	MemoryContext cxt;
} FlowRun;

typedef enum OutcomeKind
{
	OUTCOME_OK,
	OUTCOME_ERROR,
	OUTCOME_RETRY,				/* the task called dwarf.retry and returned */
	OUTCOME_INTERRUPT,			/* the task called dwarf.interrupt and returned */
	OUTCOME_RESUMED,			/* dwarf.resume gave the parked step data */
	OUTCOME_WAITING				/* the task started a child flow (dwarf.subgraph) */
} OutcomeKind;

/* What one execution of a task came to. */
typedef struct StepOutcome
{
	OutcomeKind kind;
	Jsonb	   *changes;		/* ok, retry: what the task returned */
	int			goto_node;		/* ok: dwarf.goto target, or -1 */
	TimestampTz wake_at;		/* what follows runs from then; 0 for now */
	Jsonb	   *signal;			/* interrupt payload, or resume data */
	Jsonb	   *error;			/* error: {message, sqlstate, detail, hint, task} */
} StepOutcome;

extern FlowRun *FlowRunCreate(FlowRun *flow, Graph *graph, int start, Jsonb *input,
							 MemoryContext parent);
extern Token *FlowFindToken(FlowRun *flow, int token_id);
extern Jsonb *FlowTokenState(FlowRun *flow, Token *token);
extern void FlowAdvance(FlowRun *flow, Token *token, StepOutcome *outcome);
extern void FlowRunFree(FlowRun *flow);
extern Jsonb *FlowStateSoFar(FlowRun *flow);
extern bool FlowHoldsOffers(FlowRun *flow);

/* Each live token of a flow, in the order they were made. */
#define foreach_token(iter, flow) dlist_foreach(iter, &(flow)->tokens)
#define iter_token(iter) dlist_container(Token, node_in_flow, (iter).cur)

/* store.c: the step rows replay reads, and one row's replay. */
/* The columns of STEP_ROWS_SQL and STEP_ROWS_ALL_SQL, from 1 as SPI counts. */
enum
{
	Anum_steprow_token = 1,
	Anum_steprow_task,
	Anum_steprow_status,
	Anum_steprow_changes,
	Anum_steprow_goto_task,
	Anum_steprow_error,
	Anum_steprow_wake_at,
	Anum_steprow_attempt,
	Anum_steprow_started_at,
	Anum_steprow_signal
};
#define STEP_ROWS_SQL \
	"SELECT token, task, status, changes, goto_task, error, wake_at, attempt," \
	" started_at, signal FROM dwarf.step WHERE flow_id = $1"
/* The same, for a flow that may be archived (as the extension's owner). */
#define STEP_ROWS_ALL_SQL \
	"SELECT token, task, status, changes, goto_task, error, wake_at, attempt," \
	" started_at, signal FROM dwarf_internal.flow_steps($1) WHERE true"
extern bool ReplayStepRow(FlowRun *flow, HeapTuple tup, TupleDesc desc);

/* ---------- control.c: the step a task runs in ---------- */

typedef struct StepContext
{
	FlowRun    *flow;
	Token	   *token;
	int			goto_node;		/* dwarf.goto target, or -1 */
	bool		retry;			/* dwarf.retry said yes */
	int64		delay_us;		/* retry backoff plus dwarf.sleep time */
	int			interrupt_calls;	/* dwarf.interrupt calls so far */
	bool		interrupted;	/* one of them parked the step */
	Jsonb	   *payload;		/* ... with this payload */
	int			subgraph_calls; /* dwarf.subgraph calls so far */
	int64		waiting_child;	/* a child flow the step now waits for */
	MemoryContext cxt;			/* outlives the task's call */
} StepContext;

extern StepContext *DwarfCurrentStep;
extern char *IncarnationTag(void);

#endif							/* DWARF_FLOWRUN_H */
