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
extern Jsonb *FoldChanges(Jsonb *state, int nchanges, Jsonb **changes,
						  Reducer *reducers, int nreducers,
						  int ndrop, const char **drop, int max_kb);

#endif							/* DWARF_GRAPH_H */
