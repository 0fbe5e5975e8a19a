/*
 * dwarf.h
 *		Declarations shared by dwarf's source files: settings, the shared
 *		memory layout, compiled graphs, and a flow's in-memory run state.
 */
#ifndef DWARF_H
#define DWARF_H

#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/pairingheap.h"
#include "nodes/pg_list.h"
#include "port/atomics.h"
#include "storage/dsm.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

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
extern char *dwarf_archive_after;
extern char *dwarf_retention;

/*
 * Flow ids are (shard << DWARF_SHARD_SHIFT) | (timeline & 0xFF) <<
 * DWARF_EPOCH_SHIFT | sequence value.
 */
#define DWARF_SHARD_SHIFT	48
#define DWARF_EPOCH_SHIFT	40

/* The longest interval dwarf takes (sleep, retry, timeouts): 100 years. */
#define DWARF_MAX_INTERVAL	(INT64CONST(36525) * USECS_PER_DAY)

/* How deep dwarf.subgraph may nest flows (the root is depth 0). */
#define DWARF_MAX_DEPTH		32

/* Longest idempotency key, thread or fairness key (they are indexed). */
#define DWARF_MAX_KEY		1024

/* Most tasks a graph may have. */
#define DWARF_MAX_TASKS		10000

/* Most subtransactions a batch may open (PGPROC_MAX_CACHED_SUBXIDS is 64). */
#define DWARF_MAX_ISOLATED_BATCH	60

/* ---------- shared memory (shmem.c) ---------- */

#define DWARF_MAX_WORKERS	64
#define DWARF_RING_SIZE		2048

typedef enum DwarfNoteKind
{
	NOTE_NEW_FLOW,				/* a committed create: load the flow */
	NOTE_RELOAD_FLOW,			/* status changed outside (cancel): reload */
	NOTE_RUN_REQUEST			/* flow_id is the pgprocno of a dwarf.run caller */
} DwarfNoteKind;

typedef struct DwarfNote
{
	int64		flow_id;
	int32		kind;
} DwarfNote;

/* One in-server worker.  The launcher assigns slots; the worker fills pid. */
typedef struct DwarfWorkerSlot
{
	Oid			dboid;			/* InvalidOid when the slot is free */
	int			index;			/* worker number within its database */
	pid_t		pid;			/* 0 until the worker runs */
	Latch	   *latch;			/* the worker's latch while it runs */
	bool		no_extension;	/* it exited: dwarf is not installed there */
	volatile int32 best_priority;	/* of its ready steps; PG_INT32_MAX: none */
	volatile int32 running_priority;	/* best of the batch it runs, or PG_INT32_MAX */

	slock_t		mutex;			/* protects the ring */
	uint32		head;			/* next note to read */
	uint32		tail;			/* next free place */
	bool		overflow;		/* notes were dropped: rescan the table */
	DwarfNote	ring[DWARF_RING_SIZE];

	/* counters, written by the worker only */
	pg_atomic_uint64 flows_loaded;
	pg_atomic_uint64 ready;
	pg_atomic_uint64 steps;
	pg_atomic_uint64 steps_failed;
	pg_atomic_uint64 flows_closed;
	pg_atomic_uint64 batches;
	pg_atomic_uint64 aborted_batches;
} DwarfWorkerSlot;

typedef enum DwarfRequestState
{
	REQ_FREE = 0,
	REQ_SUBMITTED,
	REQ_TAKEN,					/* a worker is reading it */
	REQ_DONE,
	REQ_FAILED,
	REQ_ABANDONED
} DwarfRequestState;

/* Requests up to this size travel in the slot; larger ones in DSM. */
#define DWARF_INLINE_REQUEST	2048

/* A dwarf.run caller's create request, one per backend (by pgprocno). */
typedef struct DwarfRequest
{
	slock_t		mutex;
	DwarfRequestState state;
	dsm_handle	handle;			/* a RunRequest in DSM, or DSM_HANDLE_INVALID */
	int64		flow_id;		/* the flow to await (set when done) */
	int			sqlerrcode;		/* why it failed (set when failed) */
	char		errmsg[256];
	char		body[DWARF_INLINE_REQUEST] pg_attribute_aligned(MAXIMUM_ALIGNOF);	/* or here */
} DwarfRequest;

/* The body of a run request, in a DSM segment made by the caller. */
typedef struct RunRequest
{
	int64		flow_id;
	int32		graph_id;
	Oid			owner;
	int32		priority;
	int32		keylen;			/* idempotency key bytes, 0 if none */
	Size		inputlen;		/* bytes of the flat jsonb input */
	char		data[FLEXIBLE_ARRAY_MEMBER];	/* key, input, options (jsonb) */
} RunRequest;

/*
 * A runner: a background worker started to run one slow step (runner.c).
 * The lending worker fills the slot; the runner sets pid, then done once
 * its step has committed (or it found nothing to run).
 */
#define DWARF_MAX_RUNNERS	64

typedef struct DwarfRunnerSlot
{
	bool		in_use;			/* under DwarfShared.mutex */
	Oid			dboid;
	int			worker;			/* the lender's slot in DwarfShared.workers */
	int64		flow_id;
	int32		token_id;
	TimestampTz lent_at;
	slock_t		mutex;			/* protects pid and done */
	pid_t		pid;
	bool		done;
} DwarfRunnerSlot;

/* Tasks found slow, for every worker of their database (runner.c). */
#define DWARF_SLOW_TASKS	256

typedef struct DwarfSlowTask
{
	Oid			dboid;			/* InvalidOid: free */
	Oid			fn;
	bool		slow;
} DwarfSlowTask;

typedef struct DwarfShared
{
	slock_t		mutex;			/* protects the launcher fields */
	Latch	   *launcher_latch;
	bool		rescan;			/* a database created or dropped dwarf */

	DwarfWorkerSlot workers[DWARF_MAX_WORKERS];
	DwarfRunnerSlot runners[DWARF_MAX_RUNNERS];

	slock_t		slow_mutex;
	pg_atomic_uint32 slow_epoch;	/* bumped at every change of slow[] */
	DwarfSlowTask slow[DWARF_SLOW_TASKS];

	/* indexed by pgprocno; sized by MaxBackends + aux processes */
	int			nprocs;
	pg_atomic_uint64 *waiting;	/* flow a backend awaits, 0 for none */
	DwarfRequest *requests;
} DwarfShared;

extern DwarfShared *Dwarf;

extern void DwarfShmemRequest(void);
extern void DwarfShmemStartup(void);
extern DwarfWorkerSlot *DwarfOwnerSlot(Oid dboid, int64 flow_id);
extern bool DwarfPushNote(DwarfWorkerSlot *slot, int64 flow_id, DwarfNoteKind kind);
extern void DwarfWakeLauncher(void);
extern void DwarfWakeWaiters(int64 *flow_ids, int n);
extern int	DwarfWorkerOf(int64 flow_id);

/* ---------- launcher.c, worker.c ---------- */

extern DWARF_EXPORT void DwarfLauncherMain(Datum arg);
extern DWARF_EXPORT void DwarfWorkerMain(Datum arg);
extern DWARF_EXPORT void DwarfRunnerMain(Datum arg);
extern void DwarfRegisterLauncher(void);

/* ---------- graph.c: definitions, parsed and compiled ---------- */

#define NODE_END	(-1)

typedef enum EdgeKind
{
	EDGE_PLAIN,					/* always fires */
	EDGE_WHEN,					/* fires when its path predicate matches */
	EDGE_SWITCH,				/* first matching switch edge fires */
	EDGE_FOR_EACH,				/* one branch per element of an array field */
	EDGE_GOTO,					/* fires only when the task calls dwarf.goto */
	EDGE_ERROR					/* fires when the task raised an error */
} EdgeKind;

typedef enum ReducerKind
{
	RED_REPLACE,
	RED_APPEND,
	RED_ADD,
	RED_MIN,
	RED_MAX,
	RED_UNION,
	RED_MERGE,
	RED_AND,
	RED_OR,
	RED_CONCAT
} ReducerKind;

typedef struct Reducer
{
	char	   *field;
	ReducerKind kind;
} Reducer;

typedef struct Edge
{
	EdgeKind	kind;
	int			from;
	int			nto;
	int		   *to;				/* node numbers, NODE_END for END */
	char	   *path_text;		/* when/switch predicate as written */
	Datum		path;			/* compiled jsonpath, or 0 */
	char	   *for_each;		/* array field, for EDGE_FOR_EACH */
	char	   *as;				/* element name, for EDGE_FOR_EACH */
	int			converge;		/* first fan-in reachable from the targets */
} Edge;

typedef struct GraphNode
{
	char	   *name;
	char	   *fn_name;		/* as resolved: schema.name */
	Oid			fn;
	FmgrInfo   *flinfo;			/* set up by GraphPrepareCalls, shared by
								 * the graph's tasks of the same function */
	Oid			may_execute;	/* a role last found to have EXECUTE on fn */
	uint32		fn_hash;		/* fn's PROCOID syscache hash, for invalidations */
	uint32		slow_epoch;		/* of DwarfShared.slow_epoch when slow was read */
	bool		slow;			/* its steps go to runners */
	bool		fan_in;
	List	   *edges;			/* outgoing, in definition order */
} GraphNode;

typedef struct Graph
{
	int			id;
	char	   *name;
	int			version;
	int			nnodes;
	GraphNode	   *nodes;
	int			entry;
	int			nreducers;
	Reducer    *reducers;
	MemoryContext cxt;
	bool		prepared;		/* FmgrInfos set up, EXECUTE checks valid */
	MemoryContext calls_cxt;	/* what the FmgrInfos keep */
} Graph;

extern Graph *GraphParse(Jsonb *definition, MemoryContext cxt, bool strict);
extern Jsonb *GraphNormalized(Graph *graph, Jsonb *definition);
extern Reducer *ReducersParse(JsonbValue *reducers, int *nreducers);
extern Reducer *ReducersFromJsonb(Jsonb *reducers, int *nreducers);
extern const char *const ReducerNames[];
extern void GraphPrepareCalls(Graph *graph);
extern bool GraphCallsFunction(Graph *graph, uint32 hashvalue);
extern int	GraphNodeByName(Graph *graph, const char *name);
extern int	GraphStartNode(Graph *graph, const char *start_task);
extern Edge *GraphGotoEdge(Graph *graph, int from, int to);

/* ---------- merge.c: states, changes and reducers ---------- */

extern Jsonb *MergeChanges(Jsonb *state, Jsonb *changes,
						   Reducer *reducers, int nreducers);

/* ---------- flowrun.c: a flow's tokens, transitions and replay ---------- */

typedef enum FlowStatus
{
	FLOW_RUNNING,
	FLOW_COMPLETED,
	FLOW_FAILED
} FlowStatus;

typedef struct Cohort Cohort;

/* A token is one branch's position: the task it runs next and its state. */
typedef struct Token
{
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
	bool		running;		/* in the batch being run */
	bool		parked;			/* waiting for dwarf.resume, or for child */
	int64		child;			/* the child flow it waits for, or 0 */
	Jsonb	   *payload;		/* the interrupt's payload while parked */
	List	   *resumes;		/* data given by dwarf.resume, for this step */
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
	FlowStatus	status;
	Jsonb	   *final_state;
	char	   *error;
	int			next_token;
	TimestampTz next_due;		/* for tokens placed by the current step */
	List	   *tokens;			/* live tokens */
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
/* The same, for a flow that may be archived. */
#define STEP_ROWS_ALL_SQL \
	"SELECT token, task, status, changes, goto_task, error, wake_at, attempt," \
	" started_at, signal FROM dwarf.flow_steps($1) WHERE true"
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

#endif							/* DWARF_H */
