/*
 * graph.h
 *		Compiled graphs (graph.c) and the merging of changes into a state
 *		with the graph's reducers (merge.c).
 */
#ifndef DWARF_GRAPH_H
#define DWARF_GRAPH_H

#include "fmgr.h"
#include "nodes/pg_list.h"
#include "utils/jsonb.h"

#include "dwarf.h"
#include "limits.h"

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

/* What runs a task's steps. */
typedef enum TaskKind
{
	TASK_FUNCTION,				/* a SQL function, called by a worker */
	TASK_EXTERNAL,				/* a worker outside the server, through
								 * dwarf.claim and dwarf.complete */
	TASK_HTTP					/* an HTTP call that dwarf's own HTTP process
								 * makes (http.c): an external task whose
								 * outside worker is the server */
} TaskKind;

/*
 * The queue of HTTP tasks' steps.  Queue names that start with
 * DWARF_OWN_QUEUES are dwarf's own: no graph may name one, and dwarf.claim
 * refuses them, so that no user takes an HTTP step.
 */
#define DWARF_OWN_QUEUES	"dwarf."
#define DWARF_HTTP_QUEUE	"dwarf.http"

/* An HTTP task's timeout when its definition gives none: 30 s. */
#define DWARF_DEFAULT_HTTP_TIMEOUT_MS	(30 * 1000)

/* An HTTP step's lease is its timeout and this much more. */
#define DWARF_HTTP_LEASE_MARGIN_MS	(10 * 1000)

/*
 * A task's retry policy ("retry" in its definition): how many attempts a
 * step gets in all, the backoff between them, and for a function task which
 * errors are worth another attempt.  The default is one attempt.
 */
typedef struct RetryPolicy
{
	int			attempts;		/* in all, the first included */
	int64		initial_us;		/* backoff before the second attempt */
	double		factor;			/* ... multiplied by this for each next one */
	int64		max_us;			/* the longest backoff */
	int64		give_up_us;		/* no attempt starts later than this after
								 * the first began; 0: no limit */
	int			non;			/* SQLSTATEs and classes retried ("on") */
	int		   *on;				/* ... as MAKE_SQLSTATE codes */
	bool	   *on_class;		/* ... the code is a class (its first two
								 * characters) */
} RetryPolicy;

typedef struct GraphNode
{
	char	   *name;
	TaskKind	kind;
	char	   *queue;			/* TASK_EXTERNAL: dwarf.claim's queue;
								 * TASK_HTTP: DWARF_HTTP_QUEUE */
	int64		lease_us;		/* TASK_EXTERNAL: a claim's default lease;
								 * TASK_HTTP: the timeout and a margin */
	Jsonb	   *http;			/* TASK_HTTP: the call, for http.c: {"method",
								 * "url", "headers", "timeout_ms"} */
	int64		time_budget_us; /* how long one step may take; 0: the flow's */
	RetryPolicy retry;
	int			nlimits;		/* the dwarf.set_limit limits it counts under */
	TaskLimit	limits[DWARF_MAX_TASK_LIMITS];
	Jsonb	   *spec;			/* the task as written, when an object */
	char	   *fn_name;		/* as resolved: schema.name (functions only) */
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
	bool		has_external;	/* a task is external or HTTP: loads read
								 * answers */
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
extern bool RetryAgain(RetryPolicy *policy, int attempt, TimestampTz first_started,
					   TimestampTz now, int sqlerrcode, int64 *delay_us);

/* ---------- merge.c: states, changes and reducers ---------- */

extern Jsonb *MergeChanges(Jsonb *state, Jsonb *changes,
						   Reducer *reducers, int nreducers);
extern Jsonb *FoldChanges(Jsonb *state, int nchanges, Jsonb **changes,
						  Reducer *reducers, int nreducers,
						  int ndrop, const char **drop, int max_kb);

#endif							/* DWARF_GRAPH_H */
