/*
 * globals.c
 *		What the modules read and no module owns: the settings' values
 *		(defined as settings in dwarf.c) and this process's worker state
 *		(worker.h).  Kept apart, as PostgreSQL keeps its own in globals.c,
 *		so that reading a setting or the worker's state makes no module
 *		depend on the one that sets it.
 */
#include "postgres.h"

#include "dwarf.h"
#include "worker.h"

/* settings (dwarf.c defines them, with these boot values) */
int			dwarf_workers = 2;
int			dwarf_batch_size = 512;
int			dwarf_shard_id = 0;
int			dwarf_batch_time = 100;
int			dwarf_long_step = 250;
int			dwarf_max_runners = -1;
int			dwarf_step_crashes = 3;
int			dwarf_max_step_time = 3600000;
char	   *dwarf_archive_after = NULL;
char	   *dwarf_retention = NULL;
char	   *dwarf_segment_interval = NULL;
int			dwarf_max_flow_steps = 250000;
int			dwarf_max_for_each = 100000;
int			dwarf_max_state_size = 65536;
int			dwarf_min_retry_delay = 100;
int			dwarf_max_tree_flows = 10000;
int			dwarf_max_step_children = 1000;
int			dwarf_max_external_steps = 20000;
int			dwarf_external_memory = 65536;	/* kB */
char	   *dwarf_http_allow = NULL;
int			dwarf_http_max_response = 1024;	/* kB */
int			dwarf_http_max_in_flight = 10000;
int			dwarf_http_max_host_connections = 1000;
int			dwarf_http_max_response_memory = 2 * 1024 * 1024;	/* kB */
int			dwarf_stats_entries = 4096;

/*
 * This process called nextval on dwarf's own sequences since the last task
 * began (session.c resets lastval() then, so that no task sees it).
 */
bool		DwarfNextvalUsed = false;

/* this process's state as a worker (or runner): see worker.h */
WorkerState Worker = {.full_scan = true};
