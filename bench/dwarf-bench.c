/*-------------------------------------------------------------------------
 *
 * dwarf-bench.c
 *	  Load driver for dwarf.  Runs flows against one or more servers and
 *	  reports, per measured window: flows/s, steps/s, latency percentiles,
 *	  WAL bytes and records per step, commits and WAL flushes per second,
 *	  server CPU per step and the backlog, each optionally beside a reference
 *	  write rate (one-row durable UPDATE per transaction) measured in the
 *	  same run at the same client count.
 *
 * Closed loop: every submitter thread owns a connection and calls dwarf.run()
 * back to back.  Open loop: creator threads call dwarf.create() on a shared
 * Poisson schedule and one poller per server finds closed flows in dwarf.flow
 * in batches; latency counts from each flow's intended start, so a server
 * that falls behind shows it as latency and backlog, not as a lower offer.
 *
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
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

#define MAX_SHARDS		64
#define MAX_LIST		64
#define HIST_BITS		5		/* 32 sub-buckets per power of two: ~3% */
#define HIST_SUB		(1 << HIST_BITS)
#define HIST_BUCKETS	(64 * HIST_SUB)
#define POLL_BATCH		1000	/* flow ids per completion query */
#define ERRORS_SHOWN	10		/* error messages per shard per interval */

typedef enum Workload
{
	W_LINEAR, W_FANOUT, W_STATE, W_CARRY, W_WAIT, W_MIXED, W_REFERENCE
} Workload;

static const char *const workload_names[] = {
	"linear", "fanout", "state", "carry", "wait", "mixed", "reference"
};

typedef enum RunMode
{
	RUN_CLOSED, RUN_OPEN, RUN_REFERENCE
} RunMode;

static const char *const mode_names[] = {"closed", "open", "reference"};

/* The one statement each kind of thread prepares. */
static const char *const mode_sql[] = {
	[RUN_CLOSED] = "SELECT status FROM dwarf.run($1, $2::jsonb, make_interval(secs => $3::float8))",
	[RUN_OPEN] = "SELECT dwarf.create($1, $2::jsonb)",
	[RUN_REFERENCE] = "UPDATE dwarf_bench.ref SET v = v + 1 WHERE id = $1::int",
};

static const char poll_sql[] =
"SELECT id, status, (extract(epoch FROM finished_at - created_at) * 1000000)::bigint"
" FROM dwarf.flow WHERE id = ANY($1::bigint[]) AND status <> 'running'";

static const char stats_sql[] =
"SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_sync, w.wal_write, d.xact_commit"
" FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()";

/* Log-linear latency histogram in microseconds (HDR-like). */
typedef struct Hist
{
	uint64_t	n;
	uint64_t	count[HIST_BUCKETS];
} Hist;

/* Completed work and errors over some period. */
typedef struct Counters
{
	uint64_t	flows;			/* flows (or reference writes) completed */
	uint64_t	steps;			/* their steps, as the workload defines them */
	uint64_t	errors;
	Hist		lat;
} Counters;

/* A server's counters at one instant; see snap_take. */
typedef struct Snap
{
	bool		ok;				/* stats_sql succeeded */
	bool		dwarf_ok;		/* the dwarf query succeeded */
	uint64_t	lsn;
	double		wal_records, wal_syncs, wal_writes, commits;
	double		cpu_us;			/* NAN when the server is not local */
	long long	steps;			/* begin: max(step_id); end: steps past it */
	double		backlog;		/* running flows */
} Snap;

/* A flow created in open loop and not yet seen closed. */
typedef struct Pending
{
	long long	id;
	double		intended;		/* when the schedule wanted it started */
	double		sent;			/* when the create was sent */
	int			steps;
} Pending;

/* One closed flow as the poller found it. */
typedef struct Done
{
	long long	id;
	long long	server_us;		/* finished_at - created_at, -1 if unknown */
	char		status[16];
} Done;

typedef struct Shard
{
	int			idx;
	const char *dsn;
	PGconn	   *mon;			/* main thread's setup and monitor connection */
	char		where[256];		/* host:port/db for reports */
	char		fsync[8];
	char		sync_commit[16];
	int			pm_pid;			/* postmaster pid if local, else 0 */

	pthread_mutex_t lock;		/* protects everything below */
	bool		recording;		/* inside the measured window */
	int			shown;			/* errors printed this interval */
	Counters	tick;			/* since the last progress line */
	Counters	window;			/* since the window began */
	Pending    *pending;
	size_t		npending, maxpending;

	/* main thread only */
	Counters	done;			/* window counters at the window's end */
	Snap		begin, end;
} Shard;

/* What metrics a window produced, for one shard or in total. */
typedef struct Metrics
{
	double		flows, steps, flows_s, steps_s, flow_steps_s;
	double		p50, p95, p99;
	double		wal_bytes, wal_records, commits_s, syncs_s, writes_s;
	double		cpu_us, backlog_end, backlog_slope, errors;
} Metrics;

typedef struct Report
{
	double		secs;
	Metrics		total;
	Metrics		shard[MAX_SHARDS];
} Report;

/* One kind of flow: its graph, its input and how many steps it runs. */
typedef struct Kind
{
	char		graph[64];
	char	   *input;
	char	   *definition;
	char	   *functions;		/* SQL creating its task functions, or NULL */
	int			steps;
} Kind;

typedef struct Worker
{
	pthread_t	thread;
	int			id;
	Shard	   *sh;
	RunMode		mode;
	double		rate;			/* open loop flows/s in total, 0 = unpaced */
} Worker;

/* Growable string. */
typedef struct Buf
{
	char	   *data;
	size_t		len;
	size_t		cap;
} Buf;

static struct
{
	const char *dsn[MAX_SHARDS];
	int			nshards;
	Workload	workload;
	int			steps, width, payload;
	bool		payload_json;
	const char *sleep;
	double		timeout;
	int			conc[MAX_LIST], nconc;
	double		rate[MAX_LIST];
	int			nrate;			/* 0: closed loop */
	int			max_outstanding;
	double		warmup, window, interval;
	const char *label, *out, *csv;
	bool		reference, setup_only;
} opt = {
	.workload = W_LINEAR, .steps = 10, .width = 16, .payload = 1024,
	.sleep = "1 s", .timeout = 30, .max_outstanding = 1000,
	.warmup = 5, .window = 30, .interval = 5, .label = "",
};

static Shard shards[MAX_SHARDS];
static Kind kinds[4];
static int	nkinds;
static atomic_bool stop_submit;
static atomic_bool stop_poll;
static atomic_int outstanding;
static atomic_ullong total_errors;
static pthread_mutex_t sched_lock = PTHREAD_MUTEX_INITIALIZER;
static double sched_next;
static uint64_t sched_rng = 0x9E3779B97F4A7C15ULL;
static double start_time;
static FILE *out_file, *csv_file;

/* Print a fatal error and exit 1. */
static void __attribute__((noreturn, format(printf, 1, 2)))
die(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	fputs("dwarf-bench: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* Print the options and exit with the given status. */
static void __attribute__((noreturn))
usage(int status)
{
	fputs("usage: dwarf-bench [options]\n"
		  "  -dsn DSN             server to load; repeat for shards (flows go round-robin)\n"
		  "  -workload NAME       linear|fanout|state|carry|mixed|wait|reference (default linear)\n"
		  "  -steps N             steps of linear, state and carry flows (default 10)\n"
		  "  -width W             for_each width of fanout flows (default 16)\n"
		  "  -payload BYTES       state each step writes (state) or input carried (carry) (default 1024)\n"
		  "  -payload-json        payload is a compressible JSON document, not random base64\n"
		  "  -sleep INTERVAL      dwarf.sleep of wait flows (default '1 s')\n"
		  "  -timeout SEC         dwarf.run timeout and open-loop drain limit (default 30)\n"
		  "  -concurrency LIST    clients (open loop: creator connections), one window each (default 8)\n"
		  "  -arrival-rate LIST   open loop: flows/s offered, one window each; 0 = unpaced\n"
		  "  -max-outstanding N   open loop: flows created but not seen closed (default 1000)\n"
		  "  -warmup SEC          unmeasured run before each window (default 5)\n"
		  "  -window SEC          measured window (default 30)\n"
		  "  -stats-interval SEC  progress line period (default 5)\n"
		  "  -reference           also run one-row UPDATEs at each client count; report the ratio\n"
		  "  -label TEXT          label for the results\n"
		  "  -out FILE            append one JSON object per window\n"
		  "  -csv FILE            append the progress lines as CSV\n"
		  "  -setup-only          create the task functions and graphs, then exit\n",
		  status ? stderr : stdout);
	exit(status);
}

/* Report a bad command line and exit 2. */
static void __attribute__((noreturn, format(printf, 1, 2)))
usage_error(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	fputs("dwarf-bench: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\n", stderr);
	va_end(ap);
	usage(2);
}

/* malloc/realloc that exit on failure. */
static void *
xrealloc(void *p, size_t size)
{
	p = realloc(p, size ? size : 1);
	if (p == NULL)
		die("out of memory");
	return p;
}

/* Append formatted text to a Buf. */
static void __attribute__((format(printf, 2, 3)))
buf_printf(Buf *b, const char *fmt,...)
{
	for (;;)
	{
		size_t		avail = b->cap - b->len;
		va_list		ap;
		int			n;

		va_start(ap, fmt);
		n = vsnprintf(b->data ? b->data + b->len : NULL, avail, fmt, ap);
		va_end(ap);
		if (n < 0)
			die("cannot format text");
		if ((size_t) n < avail)
		{
			b->len += n;
			return;
		}
		b->cap = (b->cap + n + 1) * 2;
		b->data = xrealloc(b->data, b->cap);
	}
}

/* Append a C string as a JSON string literal. */
static void
buf_json_string(Buf *b, const char *s)
{
	buf_printf(b, "\"");
	for (; *s; s++)
	{
		unsigned char c = *s;

		if (c == '"' || c == '\\')
			buf_printf(b, "\\%c", c);
		else if (c < 0x20)
			buf_printf(b, "\\u%04x", c);
		else
			buf_printf(b, "%c", c);
	}
	buf_printf(b, "\"");
}

/* Monotonic clock in seconds. */
static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Sleep for a (possibly fractional, possibly negative) number of seconds. */
static void
sleep_s(double s)
{
	struct timespec ts;

	if (s <= 0)
		return;
	ts.tv_sec = (time_t) s;
	ts.tv_nsec = (long) ((s - ts.tv_sec) * 1e9);
	nanosleep(&ts, NULL);
}

/* Sleep until monotonic time t, in short naps; false if told to stop. */
static bool
sleep_until(double t)
{
	double		left;

	while ((left = t - now_s()) > 0)
	{
		if (atomic_load(&stop_submit))
			return false;
		sleep_s(left < 0.05 ? left : 0.05);
	}
	return true;
}

/* Parse an integer option value of at least min, or exit 2. */
static int
arg_int(const char *name, const char *v, long min)
{
	char	   *end;
	long		n;

	errno = 0;
	n = strtol(v, &end, 10);
	if (errno || end == v || *end || n < min || n > 1000000000)
		usage_error("%s needs an integer >= %ld, not \"%s\"", name, min, v);
	return (int) n;
}

/* Parse a numeric option value of at least min (or above it if strict). */
static double
arg_num(const char *name, const char *v, double min, bool strict)
{
	char	   *end;
	double		d;

	errno = 0;
	d = strtod(v, &end);
	if (errno || end == v || *end || !isfinite(d) || d < min || (strict && d == min))
		usage_error("%s needs a number %s %g, not \"%s\"",
					name, strict ? ">" : ">=", min, v);
	return d;
}

/* Parse a comma-separated list of numbers; returns how many. */
static int
arg_list(const char *name, const char *v, double *out, double min, bool integral)
{
	char	   *copy = strdup(v);
	char	   *save = NULL;
	char	   *item;
	int			n = 0;

	for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save))
	{
		if (n == MAX_LIST)
			usage_error("%s takes at most %d values", name, MAX_LIST);
		out[n++] = integral ? arg_int(name, item, (long) min) : arg_num(name, item, min, false);
	}
	free(copy);
	if (n == 0)
		usage_error("%s needs at least one value", name);
	return n;
}

/* Parse the command line into opt. */
static void
parse_args(int argc, char **argv)
{
	double		list[MAX_LIST];
	int			i;

	opt.conc[0] = 8;
	opt.nconc = 1;
	for (i = 1; i < argc; i++)
	{
		const char *a = argv[i];
		const char *v;

		if (a[0] == '-' && a[1] == '-')
			a++;
		if (!strcmp(a, "-h") || !strcmp(a, "-help"))
			usage(0);
		if (!strcmp(a, "-payload-json"))
		{
			opt.payload_json = true;
			continue;
		}
		if (!strcmp(a, "-reference"))
		{
			opt.reference = true;
			continue;
		}
		if (!strcmp(a, "-setup-only"))
		{
			opt.setup_only = true;
			continue;
		}
		if (a[0] != '-')
			usage_error("unexpected argument \"%s\"", a);
		if (i + 1 >= argc)
			usage_error("%s needs a value", a);
		v = argv[++i];

		if (!strcmp(a, "-dsn"))
		{
			if (opt.nshards == MAX_SHARDS)
				usage_error("at most %d -dsn", MAX_SHARDS);
			opt.dsn[opt.nshards++] = v;
		}
		else if (!strcmp(a, "-workload"))
		{
			int			w;

			for (w = 0; w <= W_REFERENCE; w++)
				if (!strcmp(v, workload_names[w]))
					break;
			if (w > W_REFERENCE)
				usage_error("unknown workload \"%s\"", v);
			opt.workload = (Workload) w;
		}
		else if (!strcmp(a, "-steps"))
			opt.steps = arg_int(a, v, 1);
		else if (!strcmp(a, "-width"))
			opt.width = arg_int(a, v, 1);
		else if (!strcmp(a, "-payload"))
			opt.payload = arg_int(a, v, 0);
		else if (!strcmp(a, "-sleep"))
			opt.sleep = v;
		else if (!strcmp(a, "-timeout"))
			opt.timeout = arg_num(a, v, 0, true);
		else if (!strcmp(a, "-concurrency"))
		{
			opt.nconc = arg_list(a, v, list, 1, true);
			for (int k = 0; k < opt.nconc; k++)
				opt.conc[k] = (int) list[k];
		}
		else if (!strcmp(a, "-arrival-rate"))
			opt.nrate = arg_list(a, v, opt.rate, 0, false);
		else if (!strcmp(a, "-max-outstanding"))
			opt.max_outstanding = arg_int(a, v, 1);
		else if (!strcmp(a, "-warmup"))
			opt.warmup = arg_num(a, v, 0, false);
		else if (!strcmp(a, "-window"))
			opt.window = arg_num(a, v, 0, true);
		else if (!strcmp(a, "-stats-interval"))
			opt.interval = arg_num(a, v, 0, true);
		else if (!strcmp(a, "-label"))
			opt.label = v;
		else if (!strcmp(a, "-out"))
			opt.out = v;
		else if (!strcmp(a, "-csv"))
			opt.csv = v;
		else
			usage_error("unknown option \"%s\"", argv[i - 1]);
	}
	if (opt.nshards == 0)
		opt.dsn[opt.nshards++] = "";	/* libpq defaults: PGHOST, PGPORT... */
	if (opt.nrate > 0 && opt.workload == W_REFERENCE)
		usage_error("-arrival-rate: the reference workload is closed loop only");
}

/* Add one latency sample to a histogram. */
static void
hist_add(Hist *h, uint64_t us)
{
	int			idx;

	if (us < 2 * HIST_SUB)
		idx = (int) us;
	else
	{
		int			shift = 63 - __builtin_clzll(us) - HIST_BITS;

		idx = (shift + 1) * HIST_SUB + (int) (us >> shift) - HIST_SUB;
	}
	h->count[idx]++;
	h->n++;
}

/* The p-quantile of a histogram in milliseconds (bucket midpoint), or NAN. */
static double
hist_ms(const Hist *h, double p)
{
	uint64_t	rank = (uint64_t) ceil(p * h->n);
	uint64_t	seen = 0;

	if (h->n == 0)
		return NAN;
	if (rank < 1)
		rank = 1;
	for (int i = 0; i < HIST_BUCKETS; i++)
	{
		seen += h->count[i];
		if (seen >= rank)
		{
			int			shift;
			double		low,
						width;

			if (i < 2 * HIST_SUB)
				return i / 1000.0;
			shift = i / HIST_SUB - 1;
			low = (double) ((uint64_t) (i % HIST_SUB + HIST_SUB) << shift);
			width = (double) ((uint64_t) 1 << shift);
			return (low + width / 2) / 1000.0;
		}
	}
	return NAN;
}

/* Add counters b into a. */
static void
counters_add(Counters *a, const Counters *b)
{
	a->flows += b->flows;
	a->steps += b->steps;
	a->errors += b->errors;
	a->lat.n += b->lat.n;
	for (int i = 0; i < HIST_BUCKETS; i++)
		a->lat.count[i] += b->lat.count[i];
}

/* Record one completed flow; the caller holds sh->lock. */
static void
record_locked(Shard *sh, double lat_s, int steps)
{
	uint64_t	us = lat_s > 0 ? (uint64_t) (lat_s * 1e6) : 0;

	sh->tick.flows++;
	sh->tick.steps += steps;
	hist_add(&sh->tick.lat, us);
	if (sh->recording)
	{
		sh->window.flows++;
		sh->window.steps += steps;
		hist_add(&sh->window.lat, us);
	}
}

/* Record one completed flow. */
static void
record(Shard *sh, double lat_s, int steps)
{
	pthread_mutex_lock(&sh->lock);
	record_locked(sh, lat_s, steps);
	pthread_mutex_unlock(&sh->lock);
}

/*
 * Count n errors against a shard and print the message, at most
 * ERRORS_SHOWN times per progress interval so that a dead server cannot
 * flood the terminal; every progress line and result carries the count.
 */
static void __attribute__((format(printf, 3, 4)))
add_errors(Shard *sh, int n, const char *fmt,...)
{
	char		msg[1024];
	size_t		len;
	bool		show;
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	len = strlen(msg);
	while (len > 0 && msg[len - 1] == '\n')
		msg[--len] = '\0';

	pthread_mutex_lock(&sh->lock);
	sh->tick.errors += n;
	if (sh->recording)
		sh->window.errors += n;
	show = sh->shown++ < ERRORS_SHOWN;
	pthread_mutex_unlock(&sh->lock);
	atomic_fetch_add(&total_errors, n);
	if (show)
		fprintf(stderr, "dwarf-bench: shard %d: %s\n", sh->idx, msg);
}

/*
 * Count a failed query; if the connection is lost, drop it so that the
 * thread reconnects.  A short pause keeps a failing server from being
 * hammered in a tight loop.
 */
static void
query_failed(Shard *sh, PGconn **conn, PGresult *res, const char *what)
{
	const char *msg = res ? PQresultErrorMessage(res) : "";

	add_errors(sh, 1, "%s: %s", what, *msg ? msg : PQerrorMessage(*conn));
	if (PQstatus(*conn) == CONNECTION_BAD)
	{
		PQfinish(*conn);
		*conn = NULL;
	}
	sleep_s(0.01);
}

/* Connect to a DSN; application_name may be overridden by the DSN. */
static PGconn *
connect_dsn(const char *dsn)
{
	const char *const keys[] = {"application_name", "dbname", NULL};
	const char *const vals[] = {"dwarf-bench", dsn, NULL};

	return PQconnectdbParams(keys, vals, 1);
}

/*
 * Open a thread's connection to a shard and prepare its one statement as
 * "s".  On failure the error is counted, the thread backs off and gets NULL
 * so that it tries again.
 */
static PGconn *
bench_connect(Shard *sh, const char *sql)
{
	PGconn	   *conn = connect_dsn(sh->dsn);
	PGresult   *res;

	if (PQstatus(conn) != CONNECTION_OK)
	{
		add_errors(sh, 1, "connect: %s", PQerrorMessage(conn));
		PQfinish(conn);
		sleep_s(0.5);
		return NULL;
	}
	res = PQprepare(conn, "s", sql, 0, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		query_failed(sh, &conn, res, "prepare");
		PQclear(res);
		PQfinish(conn);
		sleep_s(0.5);
		return NULL;
	}
	PQclear(res);
	return conn;
}

/*
 * Closed loop: run one flow (or one reference write) after another on this
 * thread's connection, each timed from send to result.  Flows that do not
 * complete (failed, cancelled, still running at the timeout) are errors.
 */
static void *
submitter_main(void *arg)
{
	Worker	   *w = arg;
	PGconn	   *conn = NULL;
	unsigned	seq = w->id;
	char		id[16],
				timeout[32];

	snprintf(id, sizeof id, "%d", w->id + 1);
	snprintf(timeout, sizeof timeout, "%g", opt.timeout);
	while (!atomic_load(&stop_submit))
	{
		const Kind *k = &kinds[nkinds ? seq++ % nkinds : 0];
		const char *params[3] = {k->graph, k->input, timeout};
		PGresult   *res;
		double		start;

		if (!conn && !(conn = bench_connect(w->sh, mode_sql[w->mode])))
			continue;
		if (w->mode == RUN_REFERENCE)
			params[0] = id;
		start = now_s();
		res = PQexecPrepared(conn, "s", w->mode == RUN_REFERENCE ? 1 : 3,
							 params, NULL, NULL, 0);
		if (w->mode == RUN_REFERENCE)
		{
			if (PQresultStatus(res) != PGRES_COMMAND_OK)
				query_failed(w->sh, &conn, res, "reference update");
			else if (strcmp(PQcmdTuples(res), "1") != 0)
				add_errors(w->sh, 1, "reference row %s is missing", id);
			else
				record(w->sh, now_s() - start, 1);
		}
		else if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
			query_failed(w->sh, &conn, res, k->graph);
		else if (strcmp(PQgetvalue(res, 0, 0), "completed") != 0)
			add_errors(w->sh, 1, "a %s flow ended %s", k->graph, PQgetvalue(res, 0, 0));
		else
			record(w->sh, now_s() - start, k->steps);
		PQclear(res);
	}
	PQfinish(conn);
	return NULL;
}

/*
 * Hand out the next intended start on the shared Poisson schedule, so the
 * offered load is `rate` in total however many creators share it.
 */
static double
next_arrival(double rate)
{
	double		u,
				t;

	pthread_mutex_lock(&sched_lock);
	sched_rng ^= sched_rng << 13;
	sched_rng ^= sched_rng >> 7;
	sched_rng ^= sched_rng << 17;
	u = ((sched_rng >> 11) + 0.5) / 9007199254740992.0;
	sched_next += -log(u) / rate;
	t = sched_next;
	pthread_mutex_unlock(&sched_lock);
	return t;
}

/* Take one unit of -max-outstanding, waiting for room; false if stopped. */
static bool
wait_for_room(void)
{
	while (atomic_fetch_add(&outstanding, 1) >= opt.max_outstanding)
	{
		atomic_fetch_sub(&outstanding, 1);
		if (atomic_load(&stop_submit))
			return false;
		sleep_s(0.0005);
	}
	return true;
}

/*
 * Open loop: create flows at their scheduled times (or as fast as room
 * under -max-outstanding allows) and hand their ids to the shard's poller.
 */
static void *
creator_main(void *arg)
{
	Worker	   *w = arg;
	PGconn	   *conn = NULL;
	unsigned	seq = w->id;

	while (!atomic_load(&stop_submit))
	{
		const Kind *k = &kinds[seq++ % nkinds];
		const char *params[2] = {k->graph, k->input};
		double		intended = 0,
					sent;
		PGresult   *res;

		if (!conn && !(conn = bench_connect(w->sh, mode_sql[RUN_OPEN])))
			continue;
		if (w->rate > 0)
			intended = next_arrival(w->rate);
		if (!wait_for_room())
			break;
		if (w->rate <= 0)
			intended = now_s();
		else if (!sleep_until(intended))
		{
			atomic_fetch_sub(&outstanding, 1);
			break;
		}
		sent = now_s();
		res = PQexecPrepared(conn, "s", 2, params, NULL, NULL, 0);
		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		{
			Shard	   *sh = w->sh;

			pthread_mutex_lock(&sh->lock);
			if (sh->npending == sh->maxpending)
			{
				sh->maxpending = sh->maxpending ? 2 * sh->maxpending : 1024;
				sh->pending = xrealloc(sh->pending, sh->maxpending * sizeof(Pending));
			}
			sh->pending[sh->npending++] = (Pending) {
				atoll(PQgetvalue(res, 0, 0)), intended, sent, k->steps
			};
			pthread_mutex_unlock(&sh->lock);
		}
		else
		{
			atomic_fetch_sub(&outstanding, 1);
			query_failed(w->sh, &conn, res, k->graph);
		}
		PQclear(res);
	}
	PQfinish(conn);
	return NULL;
}

/* qsort/bsearch comparator of Done by id. */
static int
done_cmp(const void *a, const void *b)
{
	long long	x = ((const Done *) a)->id;
	long long	y = ((const Done *) b)->id;

	return (x > y) - (x < y);
}

/*
 * Open loop: find which of a shard's created flows have closed, POLL_BATCH
 * ids per query, and record them.  Latency is the flow's wait in the client
 * before its create was sent plus finished_at - created_at on the server,
 * so the polling period does not inflate it and no two clocks are mixed.
 */
static void *
poller_main(void *arg)
{
	Shard	   *sh = arg;
	PGconn	   *conn = NULL;
	long long  *ids = NULL;
	Done	   *done = NULL;
	size_t		maxids = 0,
				maxdone = 0;
	Buf			array = {0};

	while (!atomic_load(&stop_poll))
	{
		size_t		n,
					ndone = 0,
					kept = 0;
		int			failed = 0;
		Done		example = {0};
		double		now;

		if (!conn && !(conn = bench_connect(sh, poll_sql)))
			continue;
		pthread_mutex_lock(&sh->lock);
		n = sh->npending;
		if (n > maxids)
			ids = xrealloc(ids, (maxids = sh->maxpending) * sizeof(long long));
		for (size_t i = 0; i < n; i++)
			ids[i] = sh->pending[i].id;
		pthread_mutex_unlock(&sh->lock);

		for (size_t off = 0; off < n && conn; off += POLL_BATCH)
		{
			const char *param;
			PGresult   *res;

			array.len = 0;
			buf_printf(&array, "{");
			for (size_t i = off; i < n && i < off + POLL_BATCH; i++)
				buf_printf(&array, "%s%lld", i > off ? "," : "", ids[i]);
			buf_printf(&array, "}");
			param = array.data;
			res = PQexecPrepared(conn, "s", 1, &param, NULL, NULL, 0);
			if (PQresultStatus(res) != PGRES_TUPLES_OK)
				query_failed(sh, &conn, res, "poll dwarf.flow");
			for (int r = 0; conn && r < PQntuples(res); r++)
			{
				Done	   *d;

				if (ndone == maxdone)
					done = xrealloc(done, (maxdone = maxdone ? 2 * maxdone : 1024) * sizeof(Done));
				d = &done[ndone++];
				d->id = atoll(PQgetvalue(res, r, 0));
				snprintf(d->status, sizeof d->status, "%s", PQgetvalue(res, r, 1));
				d->server_us = PQgetisnull(res, r, 2) ? -1 : atoll(PQgetvalue(res, r, 2));
			}
			PQclear(res);
		}
		if (ndone == 0)
		{
			sleep_s(0.002);
			continue;
		}

		qsort(done, ndone, sizeof(Done), done_cmp);
		now = now_s();
		pthread_mutex_lock(&sh->lock);
		for (size_t i = 0; i < sh->npending; i++)
		{
			Pending    *p = &sh->pending[i];
			Done		key = {.id = p->id};
			Done	   *d = bsearch(&key, done, ndone, sizeof(Done), done_cmp);

			if (d == NULL)
				sh->pending[kept++] = *p;
			else if (strcmp(d->status, "completed") != 0)
			{
				example = *d;
				failed++;
			}
			else
				record_locked(sh, d->server_us < 0 ? now - p->intended :
							  p->sent - p->intended + d->server_us / 1e6, p->steps);
		}
		atomic_fetch_sub(&outstanding, (int) (sh->npending - kept));
		sh->npending = kept;
		pthread_mutex_unlock(&sh->lock);
		if (failed)
			add_errors(sh, failed, "%d flows did not complete, e.g. flow %lld ended %s",
					   failed, example.id, example.status);
	}
	PQfinish(conn);
	free(ids);
	free(done);
	free(array.data);
	return NULL;
}

/*
 * Read /proc/<pid>/stat: the parent pid and the CPU ticks of the process
 * and of its reaped children.  False if the process is gone.
 */
static bool
read_proc_stat(const char *pid, int *ppid, double *ticks)
{
	char		path[300],
				buf[1024];
	unsigned long long ut, st;
	long long	cut,
				cst;
	const char *p;
	FILE	   *f;
	size_t		n;

	snprintf(path, sizeof path, "/proc/%s/stat", pid);
	if ((f = fopen(path, "r")) == NULL)
		return false;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* the command name may contain anything, so skip past its last ')' */
	if ((p = strrchr(buf, ')')) == NULL ||
		sscanf(p + 1, " %*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld",
			   ppid, &ut, &st, &cut, &cst) != 5)
		return false;
	*ticks = (double) ut + st + cut + cst;
	return true;
}

/*
 * CPU time in microseconds used so far by a local server: the postmaster
 * and every process it started.  Backends that exited meanwhile count
 * through the postmaster's reaped-children time, so the sum only grows.
 */
static double
server_cpu_us(int pm_pid)
{
	DIR		   *dir = opendir("/proc");
	struct dirent *de;
	double		ticks = 0;

	if (dir == NULL)
		return NAN;
	while ((de = readdir(dir)) != NULL)
	{
		int			ppid;
		double		t;

		if (!isdigit((unsigned char) de->d_name[0]) ||
			!read_proc_stat(de->d_name, &ppid, &t))
			continue;
		if (ppid == pm_pid || atoi(de->d_name) == pm_pid)
			ticks += t;
	}
	closedir(dir);
	return ticks * 1e6 / sysconf(_SC_CLK_TCK);
}

/*
 * The postmaster pid if the server runs on this machine, else 0.  The first
 * line of postmaster.pid in the data directory names it, and it must be the
 * parent of our own backend: a remote server whose data directory path
 * happens to exist here too does not pass.
 */
static int
local_postmaster(const char *backend_pid, const char *datadir)
{
	char		path[4200],
				line[64] = "";
	int			ppid;
	double		ticks;
	FILE	   *f;

	if (*datadir == '\0')
		return 0;			/* not allowed to read data_directory */
	snprintf(path, sizeof path, "%s/postmaster.pid", datadir);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fgets(line, sizeof line, f) == NULL)
		line[0] = '\0';
	fclose(f);
	if (!read_proc_stat(backend_pid, &ppid, &ticks) || ppid != atoi(line))
		return 0;
	return ppid;
}

/*
 * Run a monitoring query (main thread, one row expected).  Returns the
 * result, or NULL after counting the error; a lost connection is reset.
 */
static PGresult *
mon_query(Shard *sh, const char *sql, int nparams, const char *const *params)
{
	PGresult   *res = PQexecParams(sh->mon, sql, nparams, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		return res;
	add_errors(sh, 1, "monitor query: %s", PQresultStatus(res) == PGRES_TUPLES_OK ?
			   "no row" : PQresultErrorMessage(res));
	PQclear(res);
	if (PQstatus(sh->mon) == CONNECTION_BAD)
		PQreset(sh->mon);
	return NULL;
}

/* Running flows on a shard, NAN if unknown. */
static double
shard_backlog(Shard *sh)
{
	PGresult   *res = mon_query(sh, "SELECT count(*) FROM dwarf.flow WHERE status = 'running'",
								0, NULL);
	double		n;

	if (res == NULL)
		return NAN;
	n = atof(PQgetvalue(res, 0, 0));
	PQclear(res);
	return n;
}

/*
 * Read a shard's server-wide counters: WAL position and records, WAL
 * writes and syncs, commits in this database, the server's CPU, and for
 * dwarf the running flows and the step watermark (given no begin) or the
 * number of steps past the begin's watermark.
 */
static void
snap_take(Shard *sh, Snap *s, const Snap *begin, bool dwarf)
{
	PGresult   *res;
	unsigned	hi,
				lo;

	memset(s, 0, sizeof *s);
	s->cpu_us = sh->pm_pid ? server_cpu_us(sh->pm_pid) : NAN;
	s->backlog = NAN;
	if ((res = mon_query(sh, stats_sql, 0, NULL)) != NULL)
	{
		s->ok = sscanf(PQgetvalue(res, 0, 0), "%X/%X", &hi, &lo) == 2;
		s->lsn = (uint64_t) hi << 32 | lo;
		s->wal_records = atof(PQgetvalue(res, 0, 1));
		s->wal_syncs = atof(PQgetvalue(res, 0, 2));
		s->wal_writes = atof(PQgetvalue(res, 0, 3));
		s->commits = atof(PQgetvalue(res, 0, 4));
		PQclear(res);
	}
	if (!dwarf || (begin && !begin->dwarf_ok))
		return;
	if (begin == NULL)
		res = mon_query(sh, "SELECT coalesce(max(step_id), 0), "
						"(SELECT count(*) FROM dwarf.flow WHERE status = 'running') "
						"FROM dwarf.step", 0, NULL);
	else
	{
		char		mark[32];
		const char *param = mark;

		snprintf(mark, sizeof mark, "%lld", begin->steps);
		res = mon_query(sh, "SELECT count(*), "
						"(SELECT count(*) FROM dwarf.flow WHERE status = 'running') "
						"FROM dwarf.step WHERE step_id > $1::bigint", 1, &param);
	}
	if (res != NULL)
	{
		s->dwarf_ok = true;
		s->steps = atoll(PQgetvalue(res, 0, 0));
		s->backlog = atof(PQgetvalue(res, 0, 1));
		PQclear(res);
	}
}

/*
 * Turn a window's counters and its two snapshots into metrics.  Steps come
 * from dwarf.step when it could be counted, else from the completed flows.
 */
static void
metrics(const Counters *c, const Snap *b, const Snap *e, double secs, Metrics *m)
{
	double		nan = NAN;

	m->flows = c->flows;
	m->steps = b->dwarf_ok && e->dwarf_ok ? (double) e->steps : (double) c->steps;
	m->flows_s = c->flows / secs;
	m->steps_s = m->steps / secs;
	m->flow_steps_s = c->steps / secs;
	m->p50 = hist_ms(&c->lat, 0.50);
	m->p95 = hist_ms(&c->lat, 0.95);
	m->p99 = hist_ms(&c->lat, 0.99);
	m->errors = c->errors;
	m->wal_bytes = b->ok && e->ok ? (double) (e->lsn - b->lsn) : nan;
	m->wal_records = b->ok && e->ok ? e->wal_records - b->wal_records : nan;
	m->commits_s = b->ok && e->ok ? (e->commits - b->commits) / secs : nan;
	m->syncs_s = b->ok && e->ok ? (e->wal_syncs - b->wal_syncs) / secs : nan;
	m->writes_s = b->ok && e->ok ? (e->wal_writes - b->wal_writes) / secs : nan;
	m->cpu_us = e->cpu_us - b->cpu_us;
	m->backlog_end = e->backlog;
	m->backlog_slope = (e->backlog - b->backlog) / secs;
}

/*
 * Sum shard metrics into a total and turn the per-window sums (WAL, CPU)
 * into per-step figures.  CPU per step counts only shards whose CPU could
 * be read; latency percentiles come from the merged histograms.
 */
static void
finish_report(Report *rep)
{
	Metrics    *t = &rep->total;
	Counters	all;
	double		cpu_steps = 0;

	memset(&all, 0, sizeof all);
	memset(t, 0, sizeof *t);
	t->cpu_us = 0;
	for (int i = 0; i < opt.nshards; i++)
	{
		Metrics    *m = &rep->shard[i];

		counters_add(&all, &shards[i].done);
		t->flows += m->flows;
		t->steps += m->steps;
		t->flows_s += m->flows_s;
		t->steps_s += m->steps_s;
		t->flow_steps_s += m->flow_steps_s;
		t->errors += m->errors;
		t->wal_bytes += m->wal_bytes;
		t->wal_records += m->wal_records;
		t->commits_s += m->commits_s;
		t->syncs_s += m->syncs_s;
		t->writes_s += m->writes_s;
		t->backlog_end += m->backlog_end;
		t->backlog_slope += m->backlog_slope;
		if (!isnan(m->cpu_us))
		{
			t->cpu_us += m->cpu_us;
			cpu_steps += m->steps;
		}
		m->cpu_us /= m->steps;
		m->wal_bytes /= m->steps;
		m->wal_records /= m->steps;
	}
	t->p50 = hist_ms(&all.lat, 0.50);
	t->p95 = hist_ms(&all.lat, 0.95);
	t->p99 = hist_ms(&all.lat, 0.99);
	t->cpu_us = cpu_steps > 0 ? t->cpu_us / cpu_steps : NAN;
	t->wal_bytes /= t->steps;
	t->wal_records /= t->steps;
}

/*
 * Print a progress line for the interval just ended (and a CSV row) from
 * the shards' interval counters, which start over.
 */
static void
progress(RunMode mode, int conc, double rate, const char *phase,
		 double elapsed, double secs)
{
	static Counters sum;
	double		backlog = mode == RUN_REFERENCE ? NAN : 0;
	double		p50,
				p99;

	memset(&sum, 0, sizeof sum);
	for (int i = 0; i < opt.nshards; i++)
	{
		Shard	   *sh = &shards[i];

		pthread_mutex_lock(&sh->lock);
		counters_add(&sum, &sh->tick);
		memset(&sh->tick, 0, sizeof sh->tick);
		sh->shown = 0;
		pthread_mutex_unlock(&sh->lock);
		if (mode != RUN_REFERENCE)
			backlog += shard_backlog(sh);
	}
	p50 = hist_ms(&sum.lat, 0.50);
	p99 = hist_ms(&sum.lat, 0.99);
	printf("%s %s c=%d %-9s %6.1f s %9.1f flows/s %10.1f steps/s  p50 %8.2f ms  p99 %8.2f ms"
		   "  backlog %.0f  errors %llu\n",
		   mode == RUN_REFERENCE ? "reference" : workload_names[opt.workload],
		   mode_names[mode], conc, phase, elapsed, sum.flows / secs, sum.steps / secs,
		   p50, p99, backlog, (unsigned long long) sum.errors);
	fflush(stdout);
	if (csv_file)
	{
		Buf			label = {0};

		buf_printf(&label, "\"");
		for (const char *c = opt.label; *c; c++)
			buf_printf(&label, *c == '"' ? "\"\"" : "%c", *c);
		buf_printf(&label, "\"");
		fprintf(csv_file, "%.3f,%s,%s,%s,%d,%g,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.0f,%llu\n",
				now_s() - start_time, label.data,
				mode == RUN_REFERENCE ? "reference" : workload_names[opt.workload],
				mode_names[mode], conc, rate, phase, elapsed, sum.flows / secs,
				sum.steps / secs, p50, p99, backlog, (unsigned long long) sum.errors);
		fflush(csv_file);
		free(label.data);
	}
}

/*
 * Start a window's threads, warm up, measure one window with a progress
 * line per interval, stop and drain, and compute the metrics into rep.
 */
static void
run_window(RunMode mode, int conc, double rate, Report *rep)
{
	Worker	   *workers = calloc(conc, sizeof(Worker));
	pthread_t	pollers[MAX_SHARDS];
	double		start,
				begin_at,
				end_at,
				next_tick,
				last_tick,
				began = 0;

	for (int i = 0; i < opt.nshards; i++)
	{
		pthread_mutex_lock(&shards[i].lock);
		shards[i].recording = false;
		memset(&shards[i].tick, 0, sizeof(Counters));
		pthread_mutex_unlock(&shards[i].lock);
	}
	atomic_store(&stop_submit, false);
	atomic_store(&stop_poll, false);
	atomic_store(&outstanding, 0);
	start = last_tick = sched_next = now_s();
	for (int i = 0; i < conc; i++)
	{
		workers[i] = (Worker) {.id = i, .sh = &shards[i % opt.nshards], .mode = mode, .rate = rate};
		if (pthread_create(&workers[i].thread, NULL,
						   mode == RUN_OPEN ? creator_main : submitter_main, &workers[i]))
			die("cannot start thread %d", i);
	}
	for (int i = 0; mode == RUN_OPEN && i < opt.nshards; i++)
		if (pthread_create(&pollers[i], NULL, poller_main, &shards[i]))
			die("cannot start poller");

	begin_at = start + opt.warmup;
	end_at = begin_at + opt.window;
	next_tick = start + opt.interval;
	for (;;)
	{
		double		wake = began ? end_at : begin_at;

		sleep_s((next_tick < wake ? next_tick : wake) - now_s());
		if (!began && now_s() >= begin_at)
		{
			for (int i = 0; i < opt.nshards; i++)
			{
				Shard	   *sh = &shards[i];

				snap_take(sh, &sh->begin, NULL, mode != RUN_REFERENCE);
				pthread_mutex_lock(&sh->lock);
				memset(&sh->window, 0, sizeof(Counters));
				sh->recording = true;
				pthread_mutex_unlock(&sh->lock);
			}
			began = now_s();
		}
		if (now_s() >= next_tick)
		{
			double		now = now_s();

			progress(mode, conc, rate, began ? "window" : "warmup", now - start, now - last_tick);
			last_tick = now;
			next_tick += opt.interval;
		}
		if (began && now_s() >= end_at)
			break;
	}
	for (int i = 0; i < opt.nshards; i++)
	{
		Shard	   *sh = &shards[i];

		pthread_mutex_lock(&sh->lock);
		sh->recording = false;
		sh->done = sh->window;
		pthread_mutex_unlock(&sh->lock);
	}
	rep->secs = now_s() - began;
	for (int i = 0; i < opt.nshards; i++)
	{
		Shard	   *sh = &shards[i];

		snap_take(sh, &sh->end, &sh->begin, mode != RUN_REFERENCE);
		metrics(&sh->done, &sh->begin, &sh->end, rep->secs, &rep->shard[i]);
	}
	finish_report(rep);

	atomic_store(&stop_submit, true);
	for (int i = 0; i < conc; i++)
		pthread_join(workers[i].thread, NULL);
	if (mode == RUN_OPEN)
	{
		double		deadline = now_s() + opt.timeout;

		while (atomic_load(&outstanding) > 0 && now_s() < deadline)
			sleep_s(0.01);
		if (atomic_load(&outstanding) > 0)
			fprintf(stderr, "dwarf-bench: %d flows still open %g s after the window\n",
					atomic_load(&outstanding), opt.timeout);
		atomic_store(&stop_poll, true);
		for (int i = 0; i < opt.nshards; i++)
		{
			pthread_join(pollers[i], NULL);
			shards[i].npending = 0;
		}
	}
	free(workers);
}

/* Format a number for the human report; "-" when unknown. */
static const char *
num(double v, int prec)
{
	static char ring[16][32];
	static int	next;
	char	   *s = ring[next++ % 16];

	if (isnan(v) || isinf(v))
		return "-";
	snprintf(s, 32, "%.*f", prec, v);
	return s;
}

/* Print a window's metrics (one shard or the total) for a human. */
static void
print_metrics(const char *indent, const Metrics *m, const Metrics *ref)
{
	printf("%s%s flows/s  %s steps/s  latency p50 %s p95 %s p99 %s ms  errors %.0f\n",
		   indent, num(m->flows_s, 1), num(m->steps_s, 1),
		   num(m->p50, 2), num(m->p95, 2), num(m->p99, 2), m->errors);
	printf("%s  WAL %s B/step %s records/step  %s commits/s  %s WAL flushes/s  "
		   "CPU %s us/step  backlog %s (%s/s)\n",
		   indent, num(m->wal_bytes, 0), num(m->wal_records, 2), num(m->commits_s, 1),
		   num(m->syncs_s, 1), num(m->cpu_us, 1), num(m->backlog_end, 0),
		   num(m->backlog_slope, 2));
	if (ref)
		printf("%s  reference %s tps: ratio %s steps per reference write\n",
			   indent, num(ref->steps_s, 1), num(m->steps_s / ref->steps_s, 3));
}

/* Append a JSON number (integral values without decimals) or null. */
static void
json_num(Buf *b, const char *key, double v)
{
	if (isnan(v) || isinf(v))
		buf_printf(b, ", \"%s\": null", key);
	else if (v == floor(v) && fabs(v) < 1e15)
		buf_printf(b, ", \"%s\": %.0f", key, v);
	else
		buf_printf(b, ", \"%s\": %.3f", key, v);
}

/* Append the metric fields of one shard or the total. */
static void
json_metrics(Buf *b, const Metrics *m, const Metrics *ref)
{
	json_num(b, "flows", m->flows);
	json_num(b, "steps", m->steps);
	json_num(b, "flows_s", m->flows_s);
	json_num(b, "steps_s", m->steps_s);
	json_num(b, "flow_steps_s", m->flow_steps_s);
	json_num(b, "p50_ms", m->p50);
	json_num(b, "p95_ms", m->p95);
	json_num(b, "p99_ms", m->p99);
	json_num(b, "wal_bytes_per_step", m->wal_bytes);
	json_num(b, "wal_records_per_step", m->wal_records);
	json_num(b, "commits_s", m->commits_s);
	json_num(b, "wal_flushes_s", m->syncs_s);
	json_num(b, "wal_writes_s", m->writes_s);
	json_num(b, "cpu_us_per_step", m->cpu_us);
	json_num(b, "backlog_end", m->backlog_end);
	json_num(b, "backlog_slope", m->backlog_slope);
	json_num(b, "errors", m->errors);
	json_num(b, "reference_tps", ref ? ref->steps_s : NAN);
	json_num(b, "ratio", ref ? m->steps_s / ref->steps_s : NAN);
}

/*
 * Report one window: human lines on stdout and, with -out, one JSON object
 * per line with the totals and a "shards" array.
 */
static void
report(RunMode mode, int conc, double rate, const Report *r, const Report *ref)
{
	const char *name = mode == RUN_REFERENCE ? "reference" : workload_names[opt.workload];
	double		steps_per_flow = 0;
	bool		durable = true;
	Buf			b = {0};

	for (int i = 0; i < nkinds; i++)
		steps_per_flow += (double) kinds[i].steps / nkinds;
	for (int i = 0; i < opt.nshards; i++)
		durable &= !strcmp(shards[i].fsync, "on") && !strcmp(shards[i].sync_commit, "on");

	printf("== %s%s%s %s c=%d", opt.label, *opt.label ? ": " : "", name, mode_names[mode], conc);
	if (mode == RUN_OPEN)
		printf(" offered %s flows/s", rate > 0 ? num(rate, 1) : "unpaced");
	printf(", %.1f s window%s\n", r->secs, durable ? "" : " (NOT durable: fsync or synchronous_commit off)");
	print_metrics("   ", &r->total, ref ? &ref->total : NULL);
	for (int i = 0; opt.nshards > 1 && i < opt.nshards; i++)
	{
		printf("   shard %d (%s):\n", i, shards[i].where);
		print_metrics("     ", &r->shard[i], ref ? &ref->shard[i] : NULL);
	}
	fflush(stdout);
	if (out_file == NULL)
		return;

	buf_printf(&b, "{\"label\": ");
	buf_json_string(&b, opt.label);
	buf_printf(&b, ", \"workload\": \"%s\", \"mode\": \"%s\"", name, mode_names[mode]);
	json_num(&b, "concurrency", conc);
	json_num(&b, "arrival_rate", mode == RUN_OPEN ? rate : NAN);
	json_num(&b, "steps_per_flow", mode == RUN_REFERENCE ? 1 : steps_per_flow);
	json_num(&b, "payload", opt.payload);
	buf_printf(&b, ", \"payload_json\": %s, \"durable\": %s",
			   opt.payload_json ? "true" : "false", durable ? "true" : "false");
	json_num(&b, "window_s", r->secs);
	json_metrics(&b, &r->total, ref ? &ref->total : NULL);
	buf_printf(&b, ", \"shards\": [");
	for (int i = 0; i < opt.nshards; i++)
	{
		buf_printf(&b, "%s{\"server\": ", i ? ", " : "");
		buf_json_string(&b, shards[i].where);
		buf_printf(&b, ", \"fsync\": \"%s\", \"synchronous_commit\": \"%s\"",
				   shards[i].fsync, shards[i].sync_commit);
		json_metrics(&b, &r->shard[i], ref ? &ref->shard[i] : NULL);
		buf_printf(&b, "}");
	}
	buf_printf(&b, "]}\n");
	fputs(b.data, out_file);
	fflush(out_file);
	free(b.data);
}

/*
 * The payload as a JSON value of about `bytes` bytes: a string of
 * random-looking base64 (pglz cannot shrink it, like encrypted or binary
 * data) or, with -payload-json, a document of similar records (compressible,
 * like real application state).  Neither contains a quote character.
 */
static char *
make_payload(void)
{
	static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint64_t	x = 88172645463325252ULL;
	Buf			b = {0};

	if (!opt.payload_json)
	{
		char	   *s = xrealloc(NULL, opt.payload + 3);

		s[0] = '"';
		for (int i = 1; i <= opt.payload; i++)
		{
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			s[i] = b64[x & 63];
		}
		s[opt.payload + 1] = '"';
		s[opt.payload + 2] = '\0';
		return s;
	}
	buf_printf(&b, "{\"items\": [");
	for (int i = 1;; i++)
	{
		char		rec[200];
		int			len = snprintf(rec, sizeof rec,
								   "%s{\"id\": %d, \"sku\": \"SKU-%06d\", \"name\": \"standard widget\", "
								   "\"qty\": %d, \"price\": %d.%02d, \"tags\": [\"blue\", \"large\"]}",
								   i > 1 ? ", " : "", i, i * 7, i % 5 + 1, i % 90 + 10, i % 100);

		if (b.len + len + 2 > (size_t) opt.payload)
			break;
		buf_printf(&b, "%s", rec);
	}
	buf_printf(&b, "]}");
	return b.data;
}

/* A graph definition document chaining n tasks that all call fn. */
static char *
chain_definition(int n, const char *fn)
{
	Buf			b = {0};

	buf_printf(&b, "{\"tasks\": {");
	for (int i = 1; i <= n; i++)
		buf_printf(&b, "%s\"S%d\": \"%s\"", i > 1 ? ", " : "", i, fn);
	buf_printf(&b, "}, \"transitions\": [{\"chain\": [");
	for (int i = 1; i <= n; i++)
		buf_printf(&b, "\"S%d\", ", i);
	buf_printf(&b, "\"END\"]}]}");
	return b.data;
}

/* Describe one kind of flow: its graph, definition, functions and input. */
static void
add_kind(Workload w)
{
	static char *payload;
	Kind	   *k = &kinds[nkinds++];
	Buf			b = {0};
	char		fn[64];

	if ((w == W_STATE || w == W_CARRY) && payload == NULL)
		payload = make_payload();
	k->steps = opt.steps;
	k->input = "{}";
	switch (w)
	{
		case W_LINEAR:
		case W_CARRY:
			snprintf(k->graph, sizeof k->graph, "bench_%s_%d", workload_names[w], opt.steps);
			k->definition = chain_definition(opt.steps, "dwarf_bench.noop");
			if (w == W_CARRY)
			{
				buf_printf(&b, "{\"payload\": %s}", payload);
				k->input = b.data;
			}
			break;
		case W_STATE:
			snprintf(fn, sizeof fn, "dwarf_bench.state_%d_%s", opt.payload,
					 opt.payload_json ? "json" : "b64");
			snprintf(k->graph, sizeof k->graph, "bench_state_%d_%d_%s", opt.steps, opt.payload,
					 opt.payload_json ? "json" : "b64");
			k->definition = chain_definition(opt.steps, fn);
			buf_printf(&b, "CREATE OR REPLACE FUNCTION %s(s jsonb) RETURNS jsonb LANGUAGE sql "
					   "AS $f$ SELECT '{\"payload\": %s}'::jsonb $f$", fn, payload);
			k->functions = b.data;
			break;
		case W_FANOUT:
			snprintf(k->graph, sizeof k->graph, "bench_fanout");
			k->definition =
				"{\"tasks\": {\"Split\": \"dwarf_bench.split\", \"Work\": \"dwarf_bench.noop\", "
				"\"Join\": \"dwarf_bench.noop\"}, \"transitions\": ["
				"{\"from\": \"Split\", \"to\": \"Work\", \"for_each\": \"items\", \"as\": \"item\"}, "
				"{\"from\": \"Work\", \"to\": \"Join\"}, {\"from\": \"Join\", \"to\": \"END\"}], "
				"\"fan_in\": [\"Join\"]}";
			k->functions =
				"CREATE OR REPLACE FUNCTION dwarf_bench.split(s jsonb) RETURNS jsonb LANGUAGE sql "
				"AS $f$ SELECT jsonb_build_object('items', coalesce(jsonb_agg(i), '[]')) "
				"FROM generate_series(1, (s->>'width')::int) i $f$";
			buf_printf(&b, "{\"width\": %d}", opt.width);
			k->input = b.data;
			k->steps = opt.width + 2;
			break;
		case W_WAIT:
			snprintf(k->graph, sizeof k->graph, "bench_wait");
			k->definition = "{\"tasks\": {\"Wait\": \"dwarf_bench.wait\", \"Done\": \"dwarf_bench.noop\"}, "
				"\"transitions\": [{\"chain\": [\"Wait\", \"Done\", \"END\"]}]}";
			k->functions =
				"CREATE OR REPLACE FUNCTION dwarf_bench.wait(s jsonb) RETURNS jsonb LANGUAGE plpgsql "
				"AS $f$ BEGIN PERFORM dwarf.sleep((s->>'sleep')::interval); RETURN '{}'; END $f$";
			buf_printf(&b, "{\"sleep\": ");
			buf_json_string(&b, opt.sleep);
			buf_printf(&b, "}");
			k->input = b.data;
			k->steps = 2;
			break;
		case W_MIXED:
		case W_REFERENCE:
			die("no flow kind for workload %s", workload_names[w]);
	}
}

/* Run a setup statement (one row or none expected); exit on failure. */
static PGresult *
setup_exec(Shard *sh, const char *sql, int nparams, const char *const *params)
{
	PGresult   *res = PQexecParams(sh->mon, sql, nparams, NULL, params, NULL, NULL, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
		die("shard %d (%s): %s  while running: %.200s",
			sh->idx, sh->where, PQresultErrorMessage(res), sql);
	return res;
}

/*
 * Connect the monitor connection of a shard, learn its durability settings
 * and whether it is local, and create what the workload needs: the schema,
 * the task functions, the graphs and the reference table.
 */
static void
setup_shard(Shard *sh)
{
	const char *q = "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
		"pg_backend_pid(), coalesce((SELECT setting FROM pg_settings WHERE name = 'data_directory'), ''), "
		"EXISTS (SELECT FROM pg_extension WHERE extname = 'dwarf'), "
		"to_regprocedure('dwarf.sleep(interval)') IS NOT NULL";
	PGresult   *res;
	int			rows = 1000;

	sh->mon = connect_dsn(sh->dsn);
	if (PQstatus(sh->mon) != CONNECTION_OK)
		die("cannot connect to shard %d (\"%s\"): %s", sh->idx, sh->dsn, PQerrorMessage(sh->mon));
	snprintf(sh->where, sizeof sh->where, "%s:%s/%s",
			 PQhost(sh->mon), PQport(sh->mon), PQdb(sh->mon));
	res = setup_exec(sh, q, 0, NULL);
	snprintf(sh->fsync, sizeof sh->fsync, "%s", PQgetvalue(res, 0, 0));
	snprintf(sh->sync_commit, sizeof sh->sync_commit, "%s", PQgetvalue(res, 0, 1));
	sh->pm_pid = local_postmaster(PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3));
	if (opt.workload != W_REFERENCE && strcmp(PQgetvalue(res, 0, 4), "t") != 0)
		die("shard %d (%s): extension dwarf is not installed in this database; run CREATE EXTENSION dwarf "
			"(the server needs shared_preload_libraries = 'dwarf')", sh->idx, sh->where);
	if (opt.workload == W_WAIT && strcmp(PQgetvalue(res, 0, 5), "t") != 0)
		die("shard %d (%s): the wait workload needs dwarf.sleep(interval), which this dwarf lacks",
			sh->idx, sh->where);
	PQclear(res);
	if (strcmp(sh->fsync, "on") != 0 || strcmp(sh->sync_commit, "on") != 0)
		fprintf(stderr, "dwarf-bench: shard %d (%s) is not durable: fsync = %s, synchronous_commit = %s\n",
				sh->idx, sh->where, sh->fsync, sh->sync_commit);
	if (sh->pm_pid == 0)
		fprintf(stderr, "dwarf-bench: shard %d (%s) is not a local server readable here; no CPU figures\n",
				sh->idx, sh->where);

	PQclear(setup_exec(sh, "SET client_min_messages = warning", 0, NULL));
	PQclear(setup_exec(sh, "CREATE SCHEMA IF NOT EXISTS dwarf_bench", 0, NULL));
	if (opt.workload != W_REFERENCE)
		PQclear(setup_exec(sh, "CREATE OR REPLACE FUNCTION dwarf_bench.noop(s jsonb) RETURNS jsonb "
						   "LANGUAGE sql AS $f$ SELECT '{}'::jsonb $f$", 0, NULL));
	for (int i = 0; i < nkinds; i++)
	{
		const char *params[2] = {kinds[i].graph, kinds[i].definition};

		if (kinds[i].functions)
			PQclear(setup_exec(sh, kinds[i].functions, 0, NULL));
		res = setup_exec(sh, "SELECT dwarf.define($1, $2::jsonb)", 2, params);
		printf("shard %d: defined %s version %s\n", sh->idx, kinds[i].graph, PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	if (opt.reference || opt.workload == W_REFERENCE)
	{
		char		n[16];
		const char *param = n;

		for (int i = 0; i < opt.nconc; i++)
			rows = opt.conc[i] > rows ? opt.conc[i] : rows;
		snprintf(n, sizeof n, "%d", rows);
		PQclear(setup_exec(sh, "CREATE TABLE IF NOT EXISTS dwarf_bench.ref "
						   "(id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)", 0, NULL));
		PQclear(setup_exec(sh, "INSERT INTO dwarf_bench.ref (id) SELECT generate_series(1, $1::int) "
						   "ON CONFLICT DO NOTHING", 1, &param));
	}
}

/* Open an output file for appending; true if it is empty (needs a header). */
static FILE *
open_append(const char *path, bool *empty)
{
	FILE	   *f = fopen(path, "a");

	if (f == NULL)
		die("cannot open \"%s\": %s", path, strerror(errno));
	*empty = ftell(f) == 0;
	return f;
}

int
main(int argc, char **argv)
{
	static Report result,
				ref;
	bool		empty;

	parse_args(argc, argv);
	start_time = now_s();
	if (opt.workload == W_MIXED)
	{
		add_kind(W_LINEAR);
		add_kind(W_FANOUT);
		add_kind(W_STATE);
		add_kind(W_CARRY);
	}
	else if (opt.workload != W_REFERENCE)
		add_kind(opt.workload);

	for (int i = 0; i < opt.nshards; i++)
	{
		shards[i].idx = i;
		shards[i].dsn = opt.dsn[i];
		pthread_mutex_init(&shards[i].lock, NULL);
		setup_shard(&shards[i]);
	}
	if (opt.setup_only)
		return 0;
	if (opt.out)
		out_file = open_append(opt.out, &empty);
	if (opt.csv && (csv_file = open_append(opt.csv, &empty)) && empty)
		fputs("t_s,label,workload,mode,concurrency,arrival_rate,phase,elapsed_s,"
			  "flows_s,steps_s,p50_ms,p99_ms,backlog,errors\n", csv_file);

	for (int c = 0; c < opt.nconc; c++)
	{
		for (int r = 0; r < (opt.nrate ? opt.nrate : 1); r++)
		{
			RunMode		mode = opt.workload == W_REFERENCE ? RUN_REFERENCE :
				opt.nrate ? RUN_OPEN : RUN_CLOSED;
			bool		with_ref = opt.reference && mode != RUN_REFERENCE;
			double		rate = opt.nrate ? opt.rate[r] : 0;

			run_window(mode, opt.conc[c], rate, &result);
			if (with_ref)
				run_window(RUN_REFERENCE, opt.conc[c], 0, &ref);
			report(mode, opt.conc[c], rate, &result, with_ref ? &ref : NULL);
		}
	}
	if (atomic_load(&total_errors) > 0)
	{
		fprintf(stderr, "dwarf-bench: %llu errors (see above)\n",
				(unsigned long long) atomic_load(&total_errors));
		return 1;
	}
	return 0;
}
