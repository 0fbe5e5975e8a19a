/*-------------------------------------------------------------------------
 *
 * external-bench.c
 *	  Load driver for dwarf's external tasks (dwarf.claim, dwarf.complete).
 *	  Plays the workers outside the server: a few connections, each holding
 *	  many leases at once, driven by one thread with libpq's asynchronous
 *	  API.  Each connection claims in batches (waiting in the server for the
 *	  first ready step), keeps the leases it holds in a timer heap, and
 *	  completes the due ones many to a transaction.
 *
 * Shapes (issue 20, "bench"):
 *	 a	flows of -steps external tasks created at -rate flows/s, every task
 *		held -hold ms: delivered vs offered flows/s, flow latency;
 *	 b	closed loop: -inflight flows of one task held -hold ms kept open:
 *		throughput vs in-flight / duration, server CPU, connections;
 *	 c	the same as a with several holds at once (-hold 5,200,8000), one
 *		class per flow: latency per class;
 *	 d	no work: -flows pre-created flows drained by -conns connections,
 *		batched (-claim-max 100, -complete-max 100) or not, beside a
 *		one-row durable UPDATE per transaction at -conns clients;
 *	 e	wake latency: a claim waiting in the server, a flow created by
 *		another connection; from the create's commit to the claim's return.
 *
 * One "RESULT key=value ..." line per measured thing, for scripts.
 * Usage: bench/external.sh and bench/README.md, "External tasks".
 *
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libpq-fe.h"

#define MAX_KINDS		8
#define MAX_CONNS		64
#define MAX_SHOWN		20		/* error messages printed, then only counted */

/* One graph of the run: a chain of `steps` external tasks, each held hold_ms. */
typedef struct Kind
{
	char		graph[64];
	int			steps;
	double		hold_ms;
	double		rate;			/* open loop: flows/s offered */
	long long	created;		/* by the creator thread */
	char		last_task[16];
} Kind;

/* A lease held by a worker connection, due to be completed at `due`. */
typedef struct Lease
{
	double		due;
	long long	id;
	bool		last;			/* the flow's last step */
} Lease;

typedef enum ConnState
{
	C_IDLE, C_CLAIM, C_COMPLETE, C_FUSED, C_REF
} ConnState;

/* A worker connection and the leases it holds. */
typedef struct Conn
{
	PGconn	   *pg;
	ConnState	state;
	Lease	   *heap;			/* min-heap on due */
	size_t		n,
				cap;
	Lease	   *batch;			/* the leases of the complete in flight */
	size_t		nbatch;
	bool		failed;			/* the query in flight reported an error */
	char		errmsg[512];
	int			ref_row;		/* reference: the row this connection updates */
	long long	fused;			/* steps the fused claim + complete did */
} Conn;

static struct
{
	const char *dsn;
	char		shape;
	int			steps;
	double		hold[MAX_KINDS];
	int			nhold;
	double		rate;
	int			inflight;
	int			conns;
	int			claim_max;
	int			complete_max;
	double		claim_wait;
	double		ramp,
				window,
				drain;
	int			flows;
	int			unbatched_flows;
	int			samples;
	double		ref_secs;
	double		handoff_ms;
	bool		reference;
	bool		fused;			/* claim and complete in one statement */
	const char *modes;			/* shape d: which passes */
	const char *label;
} opt = {
	.steps = -1, .rate = -1, .inflight = 10000, .conns = 4, .claim_max = 100,
	.complete_max = 100, .claim_wait = 1, .ramp = -1, .window = -1, .drain = -1,
		.flows = 20000, .unbatched_flows = 2000, .samples = 200, .ref_secs = 10, .handoff_ms = -1, .label = "",
};

static Kind kinds[MAX_KINDS];
static int	nkinds;
static char queue[32];
static PGconn *mon;				/* main thread: setup, counters, results */
static int	pm_pid;				/* the server's postmaster if local, else 0 */

/* Shared between the threads. */
static atomic_bool stop_claiming;	/* the loop claims no more, drains and ends */
static atomic_bool stop_creating;
static atomic_llong steps_done,
			flows_done,
			claims,
			claimed,
			redelivered,
			completes,
			errors,
			created_total,
			ref_xacts;
static atomic_llong held_now,
			held_max;
static atomic_int shown;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
sleep_s(double s)
{
	struct timespec ts;

	if (s <= 0)
		return;
	ts.tv_sec = (time_t) s;
	ts.tv_nsec = (long) ((s - ts.tv_sec) * 1e9);
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void __attribute__((noreturn, format(printf, 1, 2)))
die(const char *fmt,...)
{
	va_list		ap;

	fputs("external-bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

/* Count an error; print the first MAX_SHOWN of them, one line each. */
static void __attribute__((format(printf, 1, 2)))
error(const char *fmt,...)
{
	va_list		ap;

	atomic_fetch_add(&errors, 1);
	if (atomic_fetch_add(&shown, 1) >= MAX_SHOWN)
		return;
	fputs("external-bench: ERROR: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void *
xrealloc(void *p, size_t size)
{
	if ((p = realloc(p, size)) == NULL)
		die("out of memory");
	return p;
}

static void __attribute__((noreturn))
usage(void)
{
	fputs("usage: external-bench -dsn DSN -shape a|b|c|d|e [options]\n"
		  "  -steps N          tasks per flow (a, c: 10; b: 1; d: 1, or 10)\n"
		  "  -hold MS[,MS..]   how long a worker holds each task (a: 0; b: 60000; c: 5,200,8000)\n"
		  "  -rate R           a, c: flows/s offered, per class (100; c: 10)\n"
		  "  -inflight N       b: flows kept open (10000)\n"
		  "  -conns N          worker connections (4)\n"
		  "  -claim-max N      steps per claim (100)\n"
		  "  -complete-max N   completes per transaction (100)\n"
		  "  -claim-wait S     how long a claim waits in the server at most (1)\n"
		  "  -ramp S           a, b, c: time before the measured window (a, c: steps x longest hold + 5; b: hold + 2)\n"
		  "  -window S         measured window (a, c: 30; b: the hold)\n"
		  "  -drain S          the longest wait for the run's flows to close afterwards (steps x hold + 60)\n"
		  "  -flows N          d: pre-created 1-step flows, batched (20000; a quarter as many of -steps)\n"
		  "  -unbatched-flows N  d: pre-created 1-step flows, unbatched (2000)\n"
		  "  -modes LIST       d: the passes, in order (batched,batched10,fused,unbatched,fused1)\n"
		  "  -reference        d: also the one-row durable UPDATE rate at -conns clients, before and after\n"
		  "  -ref-secs S       d: seconds of each reference run (10)\n"
		  "  -samples N        e: wake-ups measured (200)\n"
		  "  -handoff-ms MS    c: per-step hand-off of the 0-ms run, for the predicted latency\n"
		  "  -label TEXT       put into the RESULT lines\n", stderr);
	exit(2);
}

static double
arg_num(const char *name, const char *v, double min)
{
	char	   *end;
	double		d = strtod(v, &end);

	if (*v == '\0' || *end != '\0' || !(d >= min))
		die("%s: \"%s\" is not a number >= %g", name, v, min);
	return d;
}

static void
parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "-reference"))
		{
			opt.reference = true;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "-help") || !strcmp(a, "--help"))
			usage();
		if (v == NULL)
			die("%s needs a value", a);
		i++;
		if (!strcmp(a, "-dsn"))
			opt.dsn = v;
		else if (!strcmp(a, "-shape"))
		{
			if (strlen(v) != 1 || strchr("abcde", v[0]) == NULL)
				die("-shape is one of a, b, c, d, e");
			opt.shape = v[0];
		}
		else if (!strcmp(a, "-steps"))
			opt.steps = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-hold"))
		{
			char	   *copy = strdup(v),
					   *tok,
					   *save = NULL;

			opt.nhold = 0;
			for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
			{
				if (opt.nhold == MAX_KINDS)
					die("-hold: at most %d values", MAX_KINDS);
				opt.hold[opt.nhold++] = arg_num(a, tok, 0);
			}
			free(copy);
		}
		else if (!strcmp(a, "-rate"))
			opt.rate = arg_num(a, v, 0.001);
		else if (!strcmp(a, "-inflight"))
			opt.inflight = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-conns"))
			opt.conns = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-claim-max"))
			opt.claim_max = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-complete-max"))
			opt.complete_max = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-claim-wait"))
			opt.claim_wait = arg_num(a, v, 0);
		else if (!strcmp(a, "-ramp"))
			opt.ramp = arg_num(a, v, 0);
		else if (!strcmp(a, "-window"))
			opt.window = arg_num(a, v, 1);
		else if (!strcmp(a, "-drain"))
			opt.drain = arg_num(a, v, 0);
		else if (!strcmp(a, "-flows"))
			opt.flows = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-unbatched-flows"))
			opt.unbatched_flows = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-ref-secs"))
			opt.ref_secs = arg_num(a, v, 1);
		else if (!strcmp(a, "-samples"))
			opt.samples = (int) arg_num(a, v, 1);
		else if (!strcmp(a, "-handoff-ms"))
			opt.handoff_ms = arg_num(a, v, 0);
		else if (!strcmp(a, "-modes"))
			opt.modes = v;
		else if (!strcmp(a, "-label"))
			opt.label = v;
		else
			die("unknown option %s (see -help)", a);
	}
	if (opt.dsn == NULL || opt.shape == 0)
		usage();
	if (opt.conns > MAX_CONNS)
		die("-conns: at most %d", MAX_CONNS);
}

/* ---------------------------------------------------------------- server */

static PGconn *
connect_dsn(void)
{
	PGconn	   *c = PQconnectdb(opt.dsn);

	if (PQstatus(c) != CONNECTION_OK)
		die("cannot connect to \"%s\": %s", opt.dsn, PQerrorMessage(c));
	PQclear(PQexec(c, "SET client_min_messages = warning"));
	return c;
}

/* Run a statement on a connection, or exit saying which failed. */
static PGresult *
must(PGconn *c, const char *sql, int nparams, const char *const *params)
{
	PGresult   *res = PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
		die("%s\n  in: %s", PQresultErrorMessage(res), sql);
	return res;
}

/* One value of a one-row query on the monitor connection, as a number. */
static double
mon_num(const char *sql)
{
	PGresult   *res = must(mon, sql, 0, NULL);
	double		v = PQntuples(res) ? atof(PQgetvalue(res, 0, 0)) : NAN;

	PQclear(res);
	return v;
}

static void
prepare(PGconn *c, const char *name, const char *sql)
{
	PGresult   *res = PQprepare(c, name, sql, 0, NULL);

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die("cannot prepare %s: %s", name, PQresultErrorMessage(res));
	PQclear(res);
}

/*
 * The parent pid and the CPU ticks (user + system, and of reaped children)
 * of a process, from /proc/<pid>/stat; false if it is gone.
 */
static bool
proc_ticks(int pid, int *ppid, double *own, double *reaped)
{
	char		path[64],
				buf[1024];
	unsigned long long ut,
				st;
	long long	cut,
				cst;
	const char *p;
	FILE	   *f;
	size_t		n;

	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	if ((f = fopen(path, "r")) == NULL)
		return false;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	if ((p = strrchr(buf, ')')) == NULL ||
		sscanf(p + 1, " %*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld",
			   ppid, &ut, &st, &cut, &cst) != 5)
		return false;
	*own = (double) ut + st;
	*reaped = (double) cut + cst;
	return true;
}

/*
 * The server's CPU seconds so far: in all (the postmaster and every process
 * it started, those that exited through the postmaster's reaped-children
 * time), and of the live dwarf processes and client backends alone (by
 * pg_stat_activity's backend_type).
 */
typedef struct Cpu
{
	double		total,
				dwarf,
				client;
	int			nprocs,
				ndwarf,
				nclient;
} Cpu;

static Cpu
server_cpu(void)
{
	Cpu			c = {NAN, NAN, NAN, 0, 0, 0};
	PGresult   *res;
	DIR		   *dir;
	struct dirent *de;
	double		hz = sysconf(_SC_CLK_TCK);

	if (pm_pid == 0)
		return c;
	res = must(mon, "SELECT pid, backend_type FROM pg_stat_activity", 0, NULL);
	c.total = c.dwarf = c.client = 0;
	if ((dir = opendir("/proc")) == NULL)
		die("cannot read /proc");
	while ((de = readdir(dir)) != NULL)
	{
		int			pid = atoi(de->d_name),
					ppid;
		double		own,
					reaped;

		if (!isdigit((unsigned char) de->d_name[0]) || !proc_ticks(pid, &ppid, &own, &reaped))
			continue;
		if (pid == pm_pid)
			c.total += own + reaped;
		else if (ppid == pm_pid)
		{
			c.total += own;
			c.nprocs++;
			for (int i = 0; i < PQntuples(res); i++)
				if (atoi(PQgetvalue(res, i, 0)) == pid)
				{
					const char *bt = PQgetvalue(res, i, 1);

					if (!strncmp(bt, "dwarf", 5))
					{
						c.dwarf += own;
						c.ndwarf++;
					}
					else if (!strcmp(bt, "client backend"))
					{
						c.client += own;
						c.nclient++;
					}
				}
		}
	}
	closedir(dir);
	PQclear(res);
	c.total /= hz;
	c.dwarf /= hz;
	c.client /= hz;
	return c;
}

/* The server's commit, WAL flush and WAL byte counters at one instant. */
typedef struct Counters
{
	double		commits,
				wal_syncs,
				lsn;
} Counters;

static Counters
counters(void)
{
	PGresult   *res = must(mon, "SELECT d.xact_commit, w.wal_sync, "
						   "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') "
						   "FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()",
						   0, NULL);
	Counters	c = {atof(PQgetvalue(res, 0, 0)), atof(PQgetvalue(res, 0, 1)), atof(PQgetvalue(res, 0, 2))};

	PQclear(res);
	return c;
}

/*
 * Connect the monitor, find the postmaster if the server is local (the
 * parent of our backend), and define the graphs: a chain T1..Tn of external
 * tasks on this run's queue, one graph per kind.
 */
static void
setup(void)
{
	PGresult   *res;
	int			ppid;
	double		own,
				reaped;

	mon = connect_dsn();
	res = must(mon, "SELECT pg_backend_pid(), current_setting('fsync'), current_setting('synchronous_commit'), "
			   "EXISTS (SELECT FROM pg_proc WHERE proname = 'claim' AND pronamespace = to_regnamespace('dwarf'))",
			   0, NULL);
	if (strcmp(PQgetvalue(res, 0, 3), "t") != 0)
		die("this dwarf has no dwarf.claim: external tasks are not there yet");
	if (strcmp(PQgetvalue(res, 0, 1), "on") || strcmp(PQgetvalue(res, 0, 2), "on"))
		fprintf(stderr, "external-bench: the server is NOT durable: fsync = %s, synchronous_commit = %s\n",
				PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2));
	if (proc_ticks(atoi(PQgetvalue(res, 0, 0)), &ppid, &own, &reaped))
		pm_pid = ppid;
	else
		fprintf(stderr, "external-bench: the server is not on this machine: no CPU figures\n");
	PQclear(res);
	snprintf(queue, sizeof queue, "xb_%c", opt.shape);

	for (int k = 0; k < nkinds; k++)
	{
		Kind	   *kd = &kinds[k];
		size_t		cap = 256 + kd->steps * 160;
		char	   *def = xrealloc(NULL, cap);
		size_t		len = 0;
		const char *params[2] = {kd->graph, def};

		len += snprintf(def + len, cap - len, "{\"tasks\": {");
		for (int s = 1; s <= kd->steps; s++)
			len += snprintf(def + len, cap - len,
							"%s\"T%d\": {\"external\": \"%s\", \"lease\": \"%d s\", \"retry\": {\"attempts\": 3}}",
							s > 1 ? ", " : "", s, queue, (int) (kd->hold_ms / 1000) + 120);
		len += snprintf(def + len, cap - len, "}, \"transitions\": [");
		for (int s = 1; s < kd->steps; s++)
			len += snprintf(def + len, cap - len, "%s{\"from\": \"T%d\", \"to\": \"T%d\"}",
							s > 1 ? ", " : "", s, s + 1);
		snprintf(def + len, cap - len, "]}");
		PQclear(must(mon, "SELECT dwarf.define($1, $2::jsonb)", 2, params));
		free(def);
	}
}

/* Cancel this run's flows that are still open (after a run that did not drain). */
static void
cancel_leftovers(long long id0)
{
	char		sql[512];
	double		n;

	snprintf(sql, sizeof sql,
			 "SELECT count(dwarf.cancel(f.id)) FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id "
			 "WHERE f.id > %lld AND f.status = 'running' AND g.name LIKE 'xb\\_%c\\_%%'", id0, opt.shape);
	n = mon_num(sql);
	if (n > 0)
		printf("cancelled %.0f flows of this run still open\n", n);
}

/* ------------------------------------------------------------ the workers */

static Conn conns[MAX_CONNS];
static int	nconns;

static void
heap_push(Conn *c, Lease l)
{
	size_t		i;

	if (c->n == c->cap)
	{
		c->cap = c->cap ? 2 * c->cap : 256;
		c->heap = xrealloc(c->heap, c->cap * sizeof(Lease));
	}
	i = c->n++;
	while (i > 0 && c->heap[(i - 1) / 2].due > l.due)
	{
		c->heap[i] = c->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	c->heap[i] = l;
}

static Lease
heap_pop(Conn *c)
{
	Lease		top = c->heap[0],
				last = c->heap[--c->n];
	size_t		i = 0;

	for (;;)
	{
		size_t		k = 2 * i + 1;

		if (k >= c->n)
			break;
		if (k + 1 < c->n && c->heap[k + 1].due < c->heap[k].due)
			k++;
		if (c->heap[k].due >= last.due)
			break;
		c->heap[i] = c->heap[k];
		i = k;
	}
	if (c->n > 0)
		c->heap[i] = last;
	return top;
}

/* The kind of a claimed step, by its graph's name, or NULL. */
static Kind *
kind_of(const char *graph)
{
	for (int k = 0; k < nkinds; k++)
		if (!strcmp(kinds[k].graph, graph))
			return &kinds[k];
	return NULL;
}

static void
send_or_fail(Conn *c, int ok, const char *what)
{
	if (!ok)
		die("cannot send %s: %s", what, PQerrorMessage(c->pg));
	c->failed = false;
}

/*
 * Start the next query of an idle worker connection: complete its due
 * leases (up to -complete-max, in one statement and so one transaction),
 * else claim (unless told to stop), waiting in the server no longer than
 * until its next lease is due.  Returns the seconds until it has something
 * to do if it stays idle.
 */
static double
conn_next(Conn *c, double now)
{
	char		p1[32],
				p2[32];
	double		until = c->n ? c->heap[0].due - now : 1e9;

	if (c->n && until <= 0)
	{
		size_t		len = 0,
					cap = 16 + 24 * (size_t) opt.complete_max;
		char	   *arr = xrealloc(NULL, cap);
		const char *params[1] = {arr};

		c->nbatch = 0;
		c->batch = xrealloc(c->batch, opt.complete_max * sizeof(Lease));
		arr[len++] = '{';
		while (c->n && c->heap[0].due <= now && c->nbatch < (size_t) opt.complete_max)
		{
			c->batch[c->nbatch] = heap_pop(c);
			len += snprintf(arr + len, cap - len, "%s%lld", c->nbatch ? "," : "", c->batch[c->nbatch].id);
			c->nbatch++;
		}
		snprintf(arr + len, cap - len, "}");
		if (c->nbatch == 1)
		{
			snprintf(arr, cap, "%lld", c->batch[0].id);
			send_or_fail(c, PQsendQueryPrepared(c->pg, "complete1", 1, params, NULL, NULL, 0), "complete");
		}
		else
			send_or_fail(c, PQsendQueryPrepared(c->pg, "complete", 1, params, NULL, NULL, 0), "complete");
		free(arr);
		c->state = C_COMPLETE;
		return 0;
	}
	if (atomic_load(&stop_claiming) || until < 0.002)
		return until;
	{
		double		wait = until < opt.claim_wait ? until : opt.claim_wait;
		const char *params[3] = {queue, p1, p2};

		snprintf(p1, sizeof p1, "%d", opt.claim_max);
		snprintf(p2, sizeof p2, "%.3f", wait);
		send_or_fail(c, PQsendQueryPrepared(c->pg, opt.fused ? "fused" : "claim", 3, params, NULL, NULL, 0),
					 "claim");
		atomic_fetch_add(&claims, 1);
		c->state = opt.fused ? C_FUSED : C_CLAIM;
	}
	return 0;
}

/* A result of a worker's claim: its rows become held leases. */
static void
claim_rows(Conn *c, PGresult *res)
{
	double		now = now_s();

	for (int i = 0; i < PQntuples(res); i++)
	{
		Kind	   *kd = kind_of(PQgetvalue(res, i, 1));
		Lease		l;

		if (kd == NULL)
		{
			error("claimed a step of graph \"%s\", not of this run", PQgetvalue(res, i, 1));
			continue;
		}
		l.id = atoll(PQgetvalue(res, i, 0));
		l.due = now + kd->hold_ms / 1000;
		l.last = strcmp(PQgetvalue(res, i, 2), kd->last_task) == 0;
		if (atoi(PQgetvalue(res, i, 3)) > 1)
			atomic_fetch_add(&redelivered, 1);
		heap_push(c, l);
	}
	{
		long long	held = atomic_fetch_add(&held_now, PQntuples(res)) + PQntuples(res);
		long long	max = atomic_load(&held_max);

		atomic_fetch_add(&claimed, PQntuples(res));
		while (held > max && !atomic_compare_exchange_weak(&held_max, &max, held))
			;
	}
}

/* A worker's query ended (its last result read): account for it. */
static void
conn_done(Conn *c)
{
	if (c->state == C_COMPLETE)
	{
		atomic_fetch_sub(&held_now, c->nbatch);
		if (c->failed)
			error("complete of %zu leases (first %lld): %s", c->nbatch, c->batch[0].id, c->errmsg);
		else
		{
			int			last = 0;

			for (size_t i = 0; i < c->nbatch; i++)
				last += c->batch[i].last;
			atomic_fetch_add(&steps_done, c->nbatch);
			atomic_fetch_add(&flows_done, last);
			atomic_fetch_add(&completes, 1);
		}
	}
	else if (c->state == C_CLAIM && c->failed)
		error("claim: %s", c->errmsg);
	else if (c->state == C_FUSED)
	{
		if (c->failed)
			error("claim + complete: %s", c->errmsg);
		else if (c->fused > 0)
		{
			/* shape d's one-step flows only: a step is a flow */
			atomic_fetch_add(&steps_done, c->fused);
			atomic_fetch_add(&flows_done, c->fused);
			atomic_fetch_add(&claimed, c->fused);
			atomic_fetch_add(&completes, 1);
		}
	}
	else if (c->state == C_REF)
	{
		if (c->failed)
			error("reference update: %s", c->errmsg);
		else
			atomic_fetch_add(&ref_xacts, 1);
	}
	c->state = C_IDLE;
}

/* Read what a busy connection has received; false if it was lost. */
static bool
conn_read(Conn *c)
{
	if (!PQconsumeInput(c->pg))
		return false;
	while (!PQisBusy(c->pg))
	{
		PGresult   *res = PQgetResult(c->pg);
		ExecStatusType st;

		if (res == NULL)
		{
			conn_done(c);
			break;
		}
		st = PQresultStatus(res);
		if (st == PGRES_TUPLES_OK && c->state == C_CLAIM)
			claim_rows(c, res);
		else if (st == PGRES_TUPLES_OK && c->state == C_FUSED)
			c->fused = atoll(PQgetvalue(res, 0, 0));
		else if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
		{
			c->failed = true;
			snprintf(c->errmsg, sizeof c->errmsg, "%s", PQresultErrorMessage(res));
			c->errmsg[strcspn(c->errmsg, "\n")] = '\0';
		}
		PQclear(res);
	}
	return true;
}

static void
conns_open(bool workers)
{
	nconns = opt.conns;
	for (int i = 0; i < nconns; i++)
	{
		Conn	   *c = &conns[i];

		memset(c, 0, sizeof *c);
		c->pg = connect_dsn();
		c->ref_row = i + 1;
		if (workers)
		{
			prepare(c->pg, "claim", "SELECT lease, graph, task, attempt FROM dwarf.claim($1, $2::int, NULL, "
					"make_interval(secs => $3::float8))");
			prepare(c->pg, "complete", "SELECT count(dwarf.complete(l)) FROM unnest($1::bigint[]) l");
			prepare(c->pg, "complete1", "SELECT dwarf.complete($1::bigint)");
			prepare(c->pg, "fused", "SELECT count(dwarf.complete(c.lease)) FROM dwarf.claim($1, $2::int, NULL, "
					"make_interval(secs => $3::float8)) c");
		}
		else
			prepare(c->pg, "ref", "UPDATE dwarf_bench.ext_ref SET v = v + 1 WHERE id = $1::int");
		if (PQsetnonblocking(c->pg, 1) != 0)
			die("cannot make a connection non-blocking");
	}
}

static void
conns_close(void)
{
	for (int i = 0; i < nconns; i++)
	{
		PQfinish(conns[i].pg);
		free(conns[i].heap);
		free(conns[i].batch);
	}
	nconns = 0;
}

/*
 * The workers' event loop (a thread): keep every connection busy with a
 * claim or a complete, sleep in poll() until an answer comes or a lease is
 * due.  Ends once told to stop claiming and every lease is completed.
 */
static void *
loop_main(void *arg)
{
	struct pollfd pfd[MAX_CONNS];

	(void) arg;
	for (;;)
	{
		double		now = now_s(),
					next = 0.1;
		bool		busy = false;

		for (int i = 0; i < nconns; i++)
		{
			Conn	   *c = &conns[i];

			if (c->state == C_IDLE)
			{
				double		t = conn_next(c, now);

				if (c->state == C_IDLE && t < next)
					next = t;
			}
			if (c->state != C_IDLE || c->n)
				busy = true;
			pfd[i].fd = PQsocket(c->pg);
			pfd[i].events = c->state != C_IDLE ? POLLIN : 0;
			pfd[i].revents = 0;
			if (c->state != C_IDLE)
				PQflush(c->pg);
		}
		if (!busy && atomic_load(&stop_claiming))
			break;
		if (poll(pfd, nconns, next <= 0 ? 0 : (int) ceil(next * 1000)) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		for (int i = 0; i < nconns; i++)
			if ((pfd[i].revents & (POLLIN | POLLERR | POLLHUP)) && !conn_read(&conns[i]))
				die("worker connection %d lost: %s", i, PQerrorMessage(conns[i].pg));
	}
	return NULL;
}

/* ------------------------------------------------------------ the creator */

/*
 * The creator thread: open loop (rate > 0 per kind), create each kind's
 * flows on schedule, in one statement per kind and tick; closed loop
 * (inflight), keep that many flows open, counting those the workers finish,
 * after opening them evenly over one flow's duration (all at once, they
 * would all end at once, and a window would see bursts).
 * Records how far behind schedule it ever fell.
 */
static double creator_lag_max;

static void *
creator_main(void *arg)
{
	PGconn	   *c = connect_dsn();
	bool		closed = arg != NULL;
	double		t0 = now_s();

	prepare(c, "create", "SELECT count(dwarf.create($1, '{}'::jsonb)) FROM generate_series(1, $2::int)");
	while (!atomic_load(&stop_creating))
	{
		double		now = now_s();
		bool		made = false;

		for (int k = 0; k < nkinds; k++)
		{
			Kind	   *kd = &kinds[k];
			long long	due;
			char		n[32];
			const char *params[2] = {kd->graph, n};
			PGresult   *res;

			if (closed)
			{
				/* open the in-flight flows evenly over one flow's duration */
				double		fill = kd->hold_ms * kd->steps / 1000;
				double		target = now - t0 < fill ? ceil(opt.inflight * (now - t0) / fill) : opt.inflight;

				due = (long long) target - (atomic_load(&created_total) - atomic_load(&flows_done));
			}
			else
			{
				due = (long long) (kd->rate * (now - t0)) - kd->created;
				if (due / kd->rate > creator_lag_max)
					creator_lag_max = due / kd->rate;
			}
			if (due <= 0)
				continue;
			if (due > 1000)
				due = 1000;
			snprintf(n, sizeof n, "%lld", due);
			res = PQexecPrepared(c, "create", 2, params, NULL, NULL, 0);
			if (PQresultStatus(res) != PGRES_TUPLES_OK)
				error("create: %s", PQresultErrorMessage(res));
			else
			{
				kd->created += due;
				atomic_fetch_add(&created_total, due);
				made = true;
			}
			PQclear(res);
		}
		if (!made)
			sleep_s(0.005);
	}
	PQfinish(c);
	return NULL;
}

/* ------------------------------------------------------------------ runs */

static void
reset_counters(void)
{
	atomic_store(&steps_done, 0);
	atomic_store(&flows_done, 0);
	atomic_store(&claims, 0);
	atomic_store(&claimed, 0);
	atomic_store(&redelivered, 0);
	atomic_store(&completes, 0);
	atomic_store(&created_total, 0);
	atomic_store(&held_now, 0);
	atomic_store(&held_max, 0);
	atomic_store(&stop_claiming, false);
	atomic_store(&stop_creating, false);
}

static void
progress(double t0, const char *phase)
{
	printf("  %6.1f s %-7s created %lld, claimed %lld (%lld claims), held %lld, steps done %lld, flows done %lld, errors %lld\n",
		   now_s() - t0, phase, atomic_load(&created_total), atomic_load(&claimed), atomic_load(&claims),
		   atomic_load(&held_now), atomic_load(&steps_done), atomic_load(&flows_done), atomic_load(&errors));
	fflush(stdout);
}

/* Sleep `secs`, printing progress every 5 s. */
static void
wait_progress(double t0, double secs, const char *phase)
{
	double		end = now_s() + secs;

	while (now_s() < end)
	{
		double		left = end - now_s();

		sleep_s(left < 5 ? left : 5);
		progress(t0, phase);
	}
}

/* The server's clock, as text, for window bounds in SQL. */
static void
server_now(char *buf, size_t len)
{
	PGresult   *res = must(mon, "SELECT clock_timestamp()::text", 0, NULL);

	snprintf(buf, len, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
}

/*
 * Shapes a, b and c: flows created by the creator thread (open loop at each
 * kind's rate, or closed loop with -inflight open), worked by the loop;
 * after -ramp, a measured window of -window; then creation stops and the
 * run's flows drain (at most -drain).  Reports per kind from dwarf.flow:
 * flows finished in the window per second, latency (finished_at -
 * created_at) p50/p99 over all the run's flows, and for the whole run the
 * server's CPU in the window, connections and server processes.
 */
static void
run_flows(bool closed)
{
	pthread_t	loop,
				creator;
	char		ws[64],
				we[64],
				sql[2048];
	double		t0,
				tw0,
				tw1,
				longest = 0;
	long long	id0,
				steps0,
				flows0;
	Cpu			c0,
				c1,
				r0,
				r1;
	Counters	k0,
				k1;
	int			procs_max = 0;
	PGresult   *res;

	for (int k = 0; k < nkinds; k++)
		longest = kinds[k].hold_ms * kinds[k].steps > longest ? kinds[k].hold_ms * kinds[k].steps : longest;
	longest /= 1000;
	if (opt.ramp < 0)
		opt.ramp = closed ? longest + 2 : longest + 5;
	if (opt.window < 0)
		opt.window = closed ? (longest > 10 ? longest : 10) : 30;
	if (opt.drain < 0)
		opt.drain = longest + 60;

	id0 = (long long) mon_num("SELECT coalesce(max(id), 0) FROM dwarf.flow");
	reset_counters();
	conns_open(true);
	r0 = server_cpu();
	t0 = now_s();
	if (pthread_create(&loop, NULL, loop_main, NULL) ||
		pthread_create(&creator, NULL, creator_main, closed ? (void *) 1 : NULL))
		die("cannot start threads");
	wait_progress(t0, opt.ramp, "ramp");

	server_now(ws, sizeof ws);
	k0 = counters();
	c0 = server_cpu();
	tw0 = now_s();
	steps0 = atomic_load(&steps_done);
	flows0 = atomic_load(&flows_done);
	while (now_s() - tw0 < opt.window)
	{
		double		left = opt.window - (now_s() - tw0);
		Cpu			c = server_cpu();

		procs_max = c.nprocs > procs_max ? c.nprocs : procs_max;
		sleep_s(left < 5 ? left : 5);
		progress(t0, "window");
	}
	c1 = server_cpu();
	tw1 = now_s();
	k1 = counters();
	server_now(we, sizeof we);
	steps0 = atomic_load(&steps_done) - steps0;
	flows0 = atomic_load(&flows_done) - flows0;

	atomic_store(&stop_creating, true);
	pthread_join(creator, NULL);
	{
		double		d0 = now_s();

		snprintf(sql, sizeof sql, "SELECT count(*) FROM dwarf.flow WHERE id > %lld AND status = 'running'", id0);
		while (mon_num(sql) > 0 && now_s() - d0 < opt.drain)
		{
			sleep_s(1);
			if ((long) (now_s() - d0) % 5 == 0)
				progress(t0, "drain");
		}
	}
	atomic_store(&stop_claiming, true);
	pthread_join(loop, NULL);
	r1 = server_cpu();
	progress(t0, "end");
	conns_close();

	printf("window %.1f s: server CPU %.2f s (%.2f cores): dwarf processes %.2f s (%.2f cores, %d of them), "
		   "client backends %.2f s (%.2f cores, %d); server processes at most %d; "
		   "commits %.0f/s, WAL flushes %.0f/s; steps completed by the workers %.0f/s; driver connections %d (workers %d, creator 1, monitor 1)\n",
		   tw1 - tw0, c1.total - c0.total, (c1.total - c0.total) / (tw1 - tw0),
		   c1.dwarf - c0.dwarf, (c1.dwarf - c0.dwarf) / (tw1 - tw0), c1.ndwarf,
		   c1.client - c0.client, (c1.client - c0.client) / (tw1 - tw0), c1.nclient, procs_max,
		   (k1.commits - k0.commits) / (tw1 - tw0), (k1.wal_syncs - k0.wal_syncs) / (tw1 - tw0),
		   steps0 / (tw1 - tw0), opt.conns + 2, opt.conns);
	printf("whole run %.1f s: server CPU %.2f s (%.2f cores), dwarf processes %.2f s (%.2f cores); leases held at once: at most %lld\n",
		   now_s() - t0, r1.total - r0.total, (r1.total - r0.total) / (now_s() - t0),
		   r1.dwarf - r0.dwarf, (r1.dwarf - r0.dwarf) / (now_s() - t0), atomic_load(&held_max));
	printf("creator: at most %.2f s behind schedule; claims %lld (%.1f steps each), complete transactions %lld (%.1f steps each), re-delivered steps %lld\n",
		   creator_lag_max, atomic_load(&claims),
		   atomic_load(&claims) ? (double) atomic_load(&claimed) / atomic_load(&claims) : 0,
		   atomic_load(&completes),
		   atomic_load(&completes) ? (double) atomic_load(&steps_done) / atomic_load(&completes) : 0,
		   atomic_load(&redelivered));

	snprintf(sql, sizeof sql,
			 "SELECT g.name, count(*), count(*) FILTER (WHERE f.status = 'completed'), "
			 "count(*) FILTER (WHERE f.status = 'running'), "
			 "count(*) FILTER (WHERE f.status NOT IN ('running', 'completed')), "
			 "count(*) FILTER (WHERE f.finished_at BETWEEN '%s' AND '%s') "
			 "  / extract(epoch FROM '%s'::timestamptz - '%s'::timestamptz), "
			 "1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM f.finished_at - f.created_at)), "
			 "1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM f.finished_at - f.created_at)), "
			 "1000 * max(extract(epoch FROM f.finished_at - f.created_at)) "
			 "FROM dwarf.flow f JOIN dwarf.graph g ON g.id = f.graph_id "
			 "WHERE f.id > %lld AND g.name LIKE 'xb\\_%c\\_%%' GROUP BY g.name",
			 ws, we, we, ws, id0, opt.shape);
	res = must(mon, sql, 0, NULL);
	for (int i = 0; i < PQntuples(res); i++)
	{
		Kind	   *kd = kind_of(PQgetvalue(res, i, 0));
		double		offered = closed ? opt.inflight / (kd->hold_ms * kd->steps / 1000) : kd->rate;
		double		delivered = atof(PQgetvalue(res, i, 5));
		char		pred[128] = "";

		if (opt.handoff_ms >= 0)
		{
			double		p = kd->steps * (kd->hold_ms + opt.handoff_ms);

			snprintf(pred, sizeof pred, " predicted_ms=%.1f p50_vs_predicted=%.3f", p,
					 atof(PQgetvalue(res, i, 6)) / p);
		}
		printf("RESULT shape=%c label=%s graph=%s steps=%d hold_ms=%g %s=%g offered_fs=%.1f delivered_fs=%.1f "
			   "delivered_ratio=%.3f driver_fs=%.1f flows=%s completed=%s running=%s failed=%s p50_ms=%.1f p99_ms=%.1f max_ms=%.1f "
			   "handoff_ms=%.2f%s cpu_cores=%.2f dwarf_cores=%.2f client_cores=%.2f dwarf_procs=%d "
			   "driver_conns=%d worker_conns=%d server_procs_max=%d held_max=%lld redelivered=%lld errors=%lld creator_lag_s=%.2f\n",
			   opt.shape, *opt.label ? opt.label : "-", kd->graph, kd->steps, kd->hold_ms,
			   closed ? "inflight" : "rate", closed ? opt.inflight : kd->rate, offered, delivered,
			   delivered / offered, nkinds == 1 ? flows0 / (tw1 - tw0) : NAN, PQgetvalue(res, i, 1), PQgetvalue(res, i, 2), PQgetvalue(res, i, 3),
			   PQgetvalue(res, i, 4), atof(PQgetvalue(res, i, 6)), atof(PQgetvalue(res, i, 7)),
			   atof(PQgetvalue(res, i, 8)),
			   (atof(PQgetvalue(res, i, 6)) - kd->steps * kd->hold_ms) / kd->steps, pred,
			   (c1.total - c0.total) / (tw1 - tw0), (c1.dwarf - c0.dwarf) / (tw1 - tw0),
			   (c1.client - c0.client) / (tw1 - tw0), c1.ndwarf, opt.conns + 2, opt.conns, procs_max,
			   atomic_load(&held_max), atomic_load(&redelivered), atomic_load(&errors), creator_lag_max);
	}
	PQclear(res);
	cancel_leftovers(id0);
}

/*
 * The reference: -conns connections each doing a one-row durable UPDATE per
 * transaction (its own row) for -ref-secs, through the same event loop
 * machinery.  Returns transactions per second.
 */
static double
run_reference(void)
{
	struct pollfd pfd[MAX_CONNS];
	double		t0,
				t1;
	long long	n0;
	char		rows[16];
	const char *params[1] = {rows};

	snprintf(rows, sizeof rows, "%d", opt.conns);
	PQclear(must(mon, "CREATE SCHEMA IF NOT EXISTS dwarf_bench", 0, NULL));
	PQclear(must(mon, "CREATE TABLE IF NOT EXISTS dwarf_bench.ext_ref (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)",
				 0, NULL));
	PQclear(must(mon, "INSERT INTO dwarf_bench.ext_ref (id) SELECT generate_series(1, $1::int) ON CONFLICT DO NOTHING",
				 1, params));
	conns_open(false);
	n0 = atomic_load(&ref_xacts);
	t0 = now_s();
	while ((t1 = now_s()) - t0 < opt.ref_secs)
	{
		for (int i = 0; i < nconns; i++)
		{
			Conn	   *c = &conns[i];

			if (c->state == C_IDLE)
			{
				char		row[16];
				const char *p[1] = {row};

				snprintf(row, sizeof row, "%d", c->ref_row);
				send_or_fail(c, PQsendQueryPrepared(c->pg, "ref", 1, p, NULL, NULL, 0), "update");
				PQflush(c->pg);
				c->state = C_REF;
			}
			pfd[i].fd = PQsocket(c->pg);
			pfd[i].events = POLLIN;
			pfd[i].revents = 0;
		}
		if (poll(pfd, nconns, 100) < 0 && errno != EINTR)
			die("poll: %s", strerror(errno));
		for (int i = 0; i < nconns; i++)
			if ((pfd[i].revents & (POLLIN | POLLERR | POLLHUP)) && !conn_read(&conns[i]))
				die("reference connection %d lost", i);
	}
	/* let the transactions in flight finish, uncounted */
	for (int i = 0; i < nconns; i++)
	{
		PGresult   *res;

		PQsetnonblocking(conns[i].pg, 0);
		while ((res = PQgetResult(conns[i].pg)) != NULL)
			PQclear(res);
	}
	conns_close();
	return (atomic_load(&ref_xacts) - n0) / (t1 - t0);
}

/* What one pass of shape d measured, printed once the reference is known. */
typedef struct Drain
{
	const char *mode;
	Kind	   *kind;
	int			flows,
				claim_max,
				complete_max;
	double		completed,
				secs,
				commits,
				wal_syncs,
				wal_bytes,
				cpu_s;
	long long	steps,
				xacts,
				claims,
				completes,
				redelivered,
				errors;
} Drain;

/*
 * Shape d, one pass: `flows` flows of `kind` created first (one transaction
 * per 5,000), then drained by the loop with no work, claiming claim_max and
 * completing complete_max at a time.  Measures steps/s from the loop's start
 * to its last complete, and the commits, WAL flushes and bytes and server
 * CPU meanwhile.
 */
static Drain
run_drain(const char *mode, Kind *kd, int flows, int claim_max, int complete_max, bool fused)
{
	pthread_t	loop;
	char		n[16],
				sql[512];
	const char *params[2] = {kd->graph, n};
	long long	total = (long long) flows * kd->steps,
				id0,
				last_steps = -1,
				errors0 = atomic_load(&errors);
	double		t0,
				t1,
				last_change;
	Counters	k0,
				k1;
	Cpu			c0,
				c1;
	Drain		d = {.mode = mode, .kind = kd, .flows = flows, .claim_max = claim_max, .complete_max = complete_max};

	opt.claim_max = claim_max;
	opt.complete_max = complete_max;
	opt.fused = fused;
	id0 = (long long) mon_num("SELECT coalesce(max(id), 0) FROM dwarf.flow");
	for (int left = flows; left > 0; left -= 5000)
	{
		snprintf(n, sizeof n, "%d", left < 5000 ? left : 5000);
		PQclear(must(mon, "SELECT count(dwarf.create($1, '{}'::jsonb)) FROM generate_series(1, $2::int)", 2, params));
	}
	sleep_s(2);					/* let the counters of the creates be published */
	reset_counters();
	conns_open(true);
	k0 = counters();
	c0 = server_cpu();
	t0 = last_change = now_s();
	if (pthread_create(&loop, NULL, loop_main, NULL))
		die("cannot start the loop");
	/* until every step is done, or nothing moved for 30 s */
	while (atomic_load(&steps_done) < total && now_s() - last_change < 30)
	{
		sleep_s(0.02);
		if (atomic_load(&steps_done) != last_steps)
		{
			last_steps = atomic_load(&steps_done);
			last_change = now_s();
		}
	}
	t1 = now_s();
	atomic_store(&stop_claiming, true);
	pthread_join(loop, NULL);
	c1 = server_cpu();
	conns_close();
	sleep_s(1.5);				/* every process publishes its counters */
	k1 = counters();
	snprintf(sql, sizeof sql, "SELECT count(*) FROM dwarf.flow WHERE id > %lld AND status = 'completed'", id0);
	d.completed = mon_num(sql);
	d.secs = t1 - t0;
	d.steps = atomic_load(&steps_done);
	d.claims = atomic_load(&claims);
	d.completes = atomic_load(&completes);
	/* the driver's own transactions: its claims, and its completes unless fused with them */
	d.xacts = d.claims + (fused ? 0 : d.completes);
	d.redelivered = atomic_load(&redelivered);
	d.errors = atomic_load(&errors) - errors0;
	d.commits = k1.commits - k0.commits;
	d.wal_syncs = k1.wal_syncs - k0.wal_syncs;
	d.wal_bytes = k1.lsn - k0.lsn;
	d.cpu_s = c1.total - c0.total;
	printf("%s %s: %lld steps in %.2f s, %.0f steps/s; %.0f of %d flows completed\n",
		   mode, kd->graph, d.steps, d.secs, d.steps / d.secs, d.completed, flows);
	cancel_leftovers(id0);
	return d;
}

/* The RESULT line of a pass of shape d, beside the reference's mean. */
static void
drain_report(const Drain *d, double ref_tps)
{
	double		sps = d->steps / d->secs,
				st = d->steps ? (double) d->steps : NAN;

	printf("RESULT shape=d label=%s mode=%s graph=%s steps=%d flows=%d completed=%.0f conns=%d claim_max=%d "
		   "complete_max=%d steps_done=%lld secs=%.2f steps_s=%.0f ref_tps=%.0f ratio=%.2f claims=%lld "
		   "complete_xacts=%lld commits_per_step=%.3f driver_xacts_per_step=%.3f others_commits_per_step=%.3f "
		   "wal_flushes_per_step=%.3f wal_bytes_per_step=%.0f cpu_us_per_step=%.1f redelivered=%lld errors=%lld\n",
		   *opt.label ? opt.label : "-", d->mode, d->kind->graph, d->kind->steps, d->flows, d->completed,
		   opt.conns, d->claim_max, d->complete_max, d->steps, d->secs, sps, ref_tps,
		   ref_tps > 0 ? sps / ref_tps : NAN, d->claims, d->completes, d->commits / st, d->xacts / st,
		   (d->commits - d->xacts) / st, d->wal_syncs / st, d->wal_bytes / st, d->cpu_s * 1e6 / st,
		   d->redelivered, d->errors);
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a,
				y = *(const double *) b;

	return x < y ? -1 : x > y;
}

static double
quantile(const double *v, int n, double p)
{
	int			i = (int) ceil(p * n) - 1;

	return n ? v[i < 0 ? 0 : i] : NAN;
}

/*
 * Shape e: a claim waits in the server (wait 10 s) on one connection; when
 * its backend is seen waiting, another connection creates a flow whose
 * first task is external (autocommit, simple protocol, so its answer comes
 * after the commit).  Latency = the claim's answer minus the create's,
 * both taken as they arrive in one poll() loop.  Then the lease is
 * completed.
 */
static void
run_wake(void)
{
	PGconn	   *cl = connect_dsn(),
			   *cr = connect_dsn();
	double	   *lat = xrealloc(NULL, opt.samples * sizeof(double));
	int			n = 0,
				missed = 0;
	char		pid[16],
				create_sql[256];
	const char *params[1] = {pid};

	snprintf(pid, sizeof pid, "%d", PQbackendPID(cl));
	snprintf(create_sql, sizeof create_sql, "SELECT dwarf.create('%s', '{}')", kinds[0].graph);
	prepare(cl, "claim", "SELECT lease FROM dwarf.claim($1, 1, NULL, '10 s')");
	for (int s = 0; s < opt.samples; s++)
	{
		const char *qp[1] = {queue};
		double		t_create = NAN,
					t_claim = NAN;
		long long	lease = 0;
		PGresult   *res;
		int			tries = 0;

		if (!PQsendQueryPrepared(cl, "claim", 1, qp, NULL, NULL, 0))
			die("cannot send the claim: %s", PQerrorMessage(cl));
		/* until the claim's backend waits (not for a lock, not on the client) */
		for (bool waiting = false; !waiting && tries < 200; tries++)
		{
			sleep_s(0.005);
			res = must(mon, "SELECT state = 'active' AND wait_event IS NOT NULL AND wait_event_type <> 'Lock' "
					   "FROM pg_stat_activity WHERE pid = $1::int", 1, params);
			waiting = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
			PQclear(res);
		}
		sleep_s(0.01 + (s % 7) * 0.003);
		if (!PQsendQuery(cr, create_sql))
			die("cannot send the create: %s", PQerrorMessage(cr));
		while (isnan(t_create) || isnan(t_claim))
		{
			struct pollfd pfd[2] = {{PQsocket(cl), POLLIN, 0}, {PQsocket(cr), POLLIN, 0}};

			if (poll(pfd, 2, 15000) <= 0)
				die("no answer to the claim or the create in 15 s");
			if (isnan(t_claim) && pfd[0].revents)
			{
				double		t = now_s();

				PQconsumeInput(cl);
				while (!PQisBusy(cl) && (res = PQgetResult(cl)) != NULL)
				{
					if (PQresultStatus(res) != PGRES_TUPLES_OK)
						die("claim: %s", PQresultErrorMessage(res));
					if (PQntuples(res) == 1)
						lease = atoll(PQgetvalue(res, 0, 0));
					PQclear(res);
				}
				if (!PQisBusy(cl))
					t_claim = t;
			}
			if (isnan(t_create) && pfd[1].revents)
			{
				double		t = now_s();

				PQconsumeInput(cr);
				while (!PQisBusy(cr) && (res = PQgetResult(cr)) != NULL)
				{
					if (PQresultStatus(res) != PGRES_TUPLES_OK)
						die("create: %s", PQresultErrorMessage(res));
					PQclear(res);
				}
				if (!PQisBusy(cr))
					t_create = t;
			}
		}
		if (lease == 0)
		{
			missed++;
			continue;
		}
		lat[n++] = (t_claim - t_create) * 1000;
		{
			char		l[32];
			const char *lp[1] = {l};

			snprintf(l, sizeof l, "%lld", lease);
			PQclear(must(cl, "SELECT dwarf.complete($1::bigint)", 1, lp));
		}
	}
	qsort(lat, n, sizeof(double), cmp_double);
	printf("RESULT shape=e label=%s samples=%d missed=%d p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f max_ms=%.2f min_ms=%.2f\n",
		   *opt.label ? opt.label : "-", n, missed, quantile(lat, n, 0.5), quantile(lat, n, 0.9),
		   quantile(lat, n, 0.99), n ? lat[n - 1] : NAN, n ? lat[0] : NAN);
	free(lat);
	PQfinish(cl);
	PQfinish(cr);
}

/* Add a kind: graph xb_<shape>_<steps>_<hold ms>. */
static Kind *
add_kind(int steps, double hold_ms, double rate)
{
	Kind	   *kd = &kinds[nkinds++];

	kd->steps = steps;
	kd->hold_ms = hold_ms;
	kd->rate = rate;
	snprintf(kd->graph, sizeof kd->graph, "xb_%c_%d_%g", opt.shape, steps, hold_ms);
	snprintf(kd->last_task, sizeof kd->last_task, "T%d", steps);
	return kd;
}

int
main(int argc, char **argv)
{
	double		ref1 = 0,
				ref2 = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse_args(argc, argv);
	switch (opt.shape)
	{
		case 'a':
			add_kind(opt.steps > 0 ? opt.steps : 10, opt.nhold ? opt.hold[0] : 0, opt.rate > 0 ? opt.rate : 100);
			break;
		case 'b':
			add_kind(opt.steps > 0 ? opt.steps : 1, opt.nhold ? opt.hold[0] : 60000, 0);
			break;
		case 'c':
			if (opt.nhold == 0)
			{
				opt.hold[0] = 5, opt.hold[1] = 200, opt.hold[2] = 8000;
				opt.nhold = 3;
			}
			for (int i = 0; i < opt.nhold; i++)
				add_kind(opt.steps > 0 ? opt.steps : 10, opt.hold[i], opt.rate > 0 ? opt.rate : 10);
			break;
		case 'd':
			add_kind(1, 0, 0);
			add_kind(opt.steps > 0 ? opt.steps : 10, 0, 0);
			break;
		case 'e':
			add_kind(1, 0, 0);
			break;
	}
	setup();
	printf("shape %c: %s; %d worker connections, claim max %d, wait %g s, completes per transaction %d\n",
		   opt.shape, opt.dsn, opt.conns, opt.claim_max, opt.claim_wait, opt.complete_max);
	switch (opt.shape)
	{
		case 'a':
		case 'c':
			run_flows(false);
			break;
		case 'b':
			run_flows(true);
			break;
		case 'd':
			{
				Drain		d[16];
				int			nd = 0,
							bmax = opt.claim_max,
							cmax = opt.complete_max;
				char	   *modes = strdup(opt.modes ? opt.modes : "batched,batched10,fused,unbatched,fused1"),
						   *m,
						   *save = NULL;

				if (opt.reference)
					printf("reference before: %.0f tps\n", ref1 = run_reference());
				for (m = strtok_r(modes, ",", &save); m && nd < 16; m = strtok_r(NULL, ",", &save))
				{
					if (!strcmp(m, "batched"))
						d[nd++] = run_drain("batched", &kinds[0], opt.flows, bmax, cmax, false);
					else if (!strcmp(m, "batched10"))
						d[nd++] = run_drain("batched", &kinds[1], opt.flows / 4, bmax, cmax, false);
					else if (!strcmp(m, "fused"))
						d[nd++] = run_drain("fused", &kinds[0], opt.flows, bmax, bmax, true);
					else if (!strcmp(m, "unbatched"))
						d[nd++] = run_drain("unbatched", &kinds[0], opt.unbatched_flows, 1, 1, false);
					else if (!strcmp(m, "fused1"))
						d[nd++] = run_drain("fused-1", &kinds[0], opt.unbatched_flows, 1, 1, true);
					else
						die("-modes: no pass \"%s\"", m);
				}
				free(modes);
				if (opt.reference)
					printf("reference after: %.0f tps\n", ref2 = run_reference());
				for (int i = 0; i < nd; i++)
					drain_report(&d[i], opt.reference ? (ref1 + ref2) / 2 : 0);
			}
			break;
		case 'e':
			run_wake();
			break;
	}
	PQfinish(mon);
	return atomic_load(&errors) > 0;
}
