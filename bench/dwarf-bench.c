/*-------------------------------------------------------------------------
 *
 * dwarf-bench.c
 *	  Load driver for dwarf.  Runs flows against one or more servers and
 *	  reports per measured window: flows/s, steps/s, latency percentiles,
 *	  WAL bytes and records per step, commits and WAL flushes per second,
 *	  server CPU per step and the backlog, optionally beside a reference
 *	  rate (one-row durable UPDATE per transaction) measured in the same run
 *	  at the same client count.
 *
 * Closed loop: each submitter thread owns a connection and calls dwarf.run()
 * back to back.  Open loop: creator threads call dwarf.create() on a shared
 * Poisson schedule and one poller per server finds closed flows in dwarf.flow
 * in batches.  Open-loop latency counts from each flow's intended start, so
 * a server that falls behind shows it as latency and backlog.
 *
 * Usage and examples: bench/README.md.
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
#define HIST_BITS		6		/* 64 sub-buckets per power of two: ~1.6% */
#define HIST_SUB		(1 << HIST_BITS)
#define HIST_BUCKETS	(64 * HIST_SUB)
#define POLL_BATCH		1000	/* flow ids per completion query */
#define POLL_PERIOD		0.01	/* seconds between polls, at least... */
#define POLL_IDS_S		20000	/* ...and polled ids per second, at most */
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

/* The one statement each kind of thread prepares, as "s". */
static const char *const mode_sql[] = {
	[RUN_CLOSED] = "SELECT status FROM dwarf.run($1, $2::jsonb, make_interval(secs => $3::float8))",
	[RUN_OPEN] = "SELECT dwarf.create($1, $2::jsonb) FROM generate_series(1, $3::int)",
	[RUN_REFERENCE] = "UPDATE dwarf_bench.ref SET v = v + 1 WHERE id = $1::int",
};

static const char poll_sql[] =
"SELECT id, status, (extract(epoch FROM finished_at - created_at) * 1000000)::bigint"
" FROM dwarf.flow WHERE id = ANY($1::bigint[]) AND status <> 'running'";

static const char stats_sql[] =
"SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_sync, w.wal_write, d.xact_commit, w.wal_bytes"
" FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()";

#define RUNNING_SQL "(SELECT count(*) FROM dwarf.flow WHERE status = 'running')"

/* Log-linear latency histogram in microseconds, HDR-like. */
typedef struct Hist
{
	uint64_t	n;
	uint64_t	count[HIST_BUCKETS];
} Hist;

/* Completed flows (or reference writes), their steps, errors, latencies. */
typedef struct Counters
{
	uint64_t	flows, steps, errors;
	Hist		lat;
} Counters;

/*
 * A server's counters at one instant, NAN where unknown.  steps is the
 * highest step id in dwarf.step_log at the window's start, and the number
 * of steps past it at the window's end.  wal_stat_bytes is what pg_stat_wal has been
 * told about, to compare with the LSN.
 */
typedef struct Snap
{
	double		lsn, wal_records, wal_syncs, wal_writes, commits, cpu_us, steps, backlog;
	double		wal_stat_bytes;
} Snap;

/* An open-loop flow created and not yet seen closed. */
typedef struct Pending
{
	long long	id;
	double		intended;		/* scheduled start */
	double		sent;			/* create sent */
	int			steps;
} Pending;

/* A closed flow as the poller found it; server_us < 0 if unknown. */
typedef struct Done
{
	long long	id, server_us;
	char		status[16];
} Done;

typedef struct Shard
{
	int			idx;
	int			server;			/* first shard on the same host:port */
	const char *dsn;
	PGconn	   *mon;			/* main thread: setup and monitoring */
	char		where[256];		/* host:port/db */
	char		fsync[8], sync_commit[16];
	int			pm_pid;			/* postmaster pid if local, else 0 */
	double		step_mark;		/* highest step_id seen at a window start */

	pthread_mutex_t lock;		/* protects the fields up to `done` */
	bool		recording;		/* inside the measured window */
	int			shown;			/* errors printed this interval */
	Counters	tick;			/* since the last progress line */
	Counters	window;			/* since the window began */
	Pending    *pending;
	size_t		npending, maxpending;

	Counters	done;			/* the window's counters at its end */
	Snap		begin, end;
} Shard;

/* A window's results for one shard or in total. */
typedef struct Metrics
{
	double		flows, steps, flows_s, steps_s, flow_steps_s, p50, p95, p99;
	double		wal_bytes, wal_records, commits_s, syncs_s, writes_s, cpu_us;
	double		backlog_end, backlog_slope, errors, wal_coverage;
} Metrics;

typedef struct Report
{
	double		secs;
	Metrics		total;
	Metrics		shard[MAX_SHARDS];
} Report;

/* One kind of flow; functions creates its task functions (or is NULL). */
typedef struct Kind
{
	char		graph[64];
	const char *definition, *functions, *input;
	int			steps;
} Kind;

typedef struct Worker
{
	pthread_t	thread;
	int			id;
	Shard	   *sh;
	RunMode		mode;
	double		rate;			/* open loop: flows/s in total, 0 unpaced */
} Worker;

/* Growable string. */
typedef struct Buf
{
	char	   *data;
	size_t		len, cap;
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
	int			per_txn;		/* open loop: flows created per transaction */
	double		warmup, window, interval;
	const char *label, *out, *csv;
	bool		reference, setup_only;
} opt = {
	.workload = W_LINEAR, .steps = 10, .width = 16, .payload = 1024, .sleep = "1 s",
	.timeout = 30, .conc = {8}, .nconc = 1, .max_outstanding = 1000, .per_txn = 1,
	.warmup = 5, .window = 30, .interval = 5, .label = "",
};

static Shard shards[MAX_SHARDS];
static Kind kinds[4];
static int	nkinds;
static atomic_bool stop_submit, stop_poll;
static atomic_int outstanding;
static atomic_ullong total_errors;
static pthread_mutex_t sched_lock = PTHREAD_MUTEX_INITIALIZER;
static double sched_next;
static uint64_t sched_rng = 0x9E3779B97F4A7C15ULL;
static double wall_offset;		/* Unix time minus now_s() */
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
		  "  -dsn DSN             server to load, repeat for shards (default: libpq environment)\n"
		  "  -workload NAME       linear|fanout|state|carry|mixed|wait|reference (default linear)\n"
		  "  -steps N             steps of linear, state and carry flows (default 10)\n"
		  "  -width W             for_each width of fanout flows (default 16)\n"
		  "  -payload BYTES       state written per step (state), input carried (carry) (default 1024)\n"
		  "  -payload-json        payload is a compressible JSON document, not random base64\n"
		  "  -sleep INTERVAL      dwarf.sleep of wait flows (default '1 s')\n"
		  "  -timeout SEC         dwarf.run timeout and open-loop drain limit (default 30)\n"
		  "  -concurrency LIST    clients (open loop: creator connections), a window each (default 8)\n"
		  "  -arrival-rate LIST   open loop: flows/s offered, a window each; 0 = unpaced\n"
		  "  -max-outstanding N   open loop: flows created but not seen closed (default 1000)\n"
		  "  -per-txn N           open loop: flows each creator makes in one transaction (default 1)\n"
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
	fputs("\n\n", stderr);
	va_end(ap);
	usage(2);
}

/* realloc that exits on failure. */
static void *
xrealloc(void *p, size_t size)
{
	if ((p = realloc(p, size ? size : 1)) == NULL)
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

/* Sleep for a number of seconds; nothing if it is not positive. */
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

/* Parse a numeric option value of at least min (above it if strict). */
static double
arg_num(const char *name, const char *v, double min, bool strict)
{
	char	   *end;
	double		d;

	errno = 0;
	d = strtod(v, &end);
	if (errno || end == v || *end || !isfinite(d) || d < min || (strict && d == min))
		usage_error("%s needs a number %s %g, not \"%s\"", name, strict ? ">" : ">=", min, v);
	return d;
}

/* Parse a comma-separated list of numbers into out; returns how many. */
static int
arg_list(const char *name, const char *v, double *out, double min, bool integral)
{
	char	   *copy = strdup(v);
	char	   *save = NULL;
	int			n = 0;

	for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save))
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

/* Set the option a that takes value v, or exit 2. */
static void
set_option(const char *a, const char *v)
{
	double		list[MAX_LIST];

	if (!strcmp(a, "-dsn"))
	{
		if (opt.nshards == MAX_SHARDS)
			usage_error("at most %d -dsn", MAX_SHARDS);
		opt.dsn[opt.nshards++] = v;
	}
	else if (!strcmp(a, "-workload"))
	{
		int			w = 0;

		while (w <= W_REFERENCE && strcmp(v, workload_names[w]) != 0)
			w++;
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
	else if (!strcmp(a, "-per-txn"))
		opt.per_txn = arg_int(a, v, 1);
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
		usage_error("unknown option \"%s\"", a);
}

/* Parse the command line into opt; "--name" works like "-name". */
static void
parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
	{
		const char *a = argv[i][0] == '-' && argv[i][1] == '-' ? argv[i] + 1 : argv[i];

		if (!strcmp(a, "-h") || !strcmp(a, "-help"))
			usage(0);
		else if (!strcmp(a, "-payload-json"))
			opt.payload_json = true;
		else if (!strcmp(a, "-reference"))
			opt.reference = true;
		else if (!strcmp(a, "-setup-only"))
			opt.setup_only = true;
		else if (a[0] != '-')
			usage_error("unexpected argument \"%s\"", a);
		else if (i + 1 == argc)
			usage_error("%s needs a value", a);
		else
			set_option(a, argv[++i]);
	}
	if (opt.nshards == 0)
		opt.dsn[opt.nshards++] = "";	/* libpq defaults: PGHOST, PGPORT... */
	if (opt.nrate > 0 && opt.workload == W_REFERENCE)
		usage_error("-arrival-rate: the reference workload is closed loop only");
	if (opt.per_txn > opt.max_outstanding)
		usage_error("-per-txn %d is more than -max-outstanding %d", opt.per_txn, opt.max_outstanding);
}

/* Add one latency sample to a histogram. */
static void
hist_add(Hist *h, uint64_t us)
{
	int			idx = (int) us;

	if (us >= 2 * HIST_SUB)
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

	for (int i = 0; i < HIST_BUCKETS && h->n > 0; i++)
	{
		int			shift = i / HIST_SUB - 1;

		if ((seen += h->count[i]) < rank)
			continue;
		if (shift <= 0)
			return i / 1000.0;	/* below 2 * HIST_SUB buckets are exact */
		return (double) (((uint64_t) (i % HIST_SUB + HIST_SUB) << shift) +
						 ((uint64_t) 1 << (shift - 1))) / 1000.0;
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
	const char *msg = PQresultErrorMessage(res);

	add_errors(sh, 1, "%s: %s", what, *msg ? msg : PQerrorMessage(*conn));
	if (PQstatus(*conn) == CONNECTION_BAD)
	{
		PQfinish(*conn);
		*conn = NULL;
	}
	sleep_s(0.01);
}

/* Connect to a DSN (a URI or key=value string, "" for libpq defaults). */
static PGconn *
connect_dsn(const char *dsn)
{
	/* the DSN comes later so that it can override application_name */
	const char *const keys[] = {"application_name", "dbname", NULL};
	const char *const vals[] = {"dwarf-bench", dsn, NULL};

	return PQconnectdbParams(keys, vals, 1);
}

/*
 * Open a thread's connection to a shard and prepare its statement as "s".
 * On failure the error is counted and the thread backs off, then gets NULL
 * so that it tries again.
 */
static PGconn *
bench_connect(Shard *sh, const char *sql)
{
	PGconn	   *conn = connect_dsn(sh->dsn);
	PGresult   *res = NULL;

	if (PQstatus(conn) == CONNECTION_OK)
	{
		res = PQprepare(conn, "s", sql, 0, NULL);
		if (PQresultStatus(res) == PGRES_COMMAND_OK)
		{
			PQclear(res);
			return conn;
		}
	}
	add_errors(sh, 1, "connect: %s", res ? PQresultErrorMessage(res) : PQerrorMessage(conn));
	PQclear(res);
	PQfinish(conn);
	sleep_s(0.5);
	return NULL;
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
		bool		ref = w->mode == RUN_REFERENCE;
		PGresult   *res;
		double		start;

		if (!conn && !(conn = bench_connect(w->sh, mode_sql[w->mode])))
			continue;
		if (ref)
			params[0] = id;
		start = now_s();
		res = PQexecPrepared(conn, "s", ref ? 1 : 3, params, NULL, NULL, 0);
		if (PQresultStatus(res) != (ref ? PGRES_COMMAND_OK : PGRES_TUPLES_OK))
			query_failed(w->sh, &conn, res, ref ? "reference update" : k->graph);
		else if (ref && strcmp(PQcmdTuples(res), "1") != 0)
			add_errors(w->sh, 1, "reference row %s is missing", id);
		else if (!ref && (PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), "completed") != 0))
			add_errors(w->sh, 1, "a %s flow ended %s", k->graph,
					   PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "without a result");
		else
		{
			pthread_mutex_lock(&w->sh->lock);
			record_locked(w->sh, now_s() - start, ref ? 1 : k->steps);
			pthread_mutex_unlock(&w->sh->lock);
		}
		PQclear(res);
	}
	PQfinish(conn);
	return NULL;
}

/*
 * The next intended start on the shared Poisson schedule, so that the
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
	u = ((sched_rng >> 11) + 0.5) / 9007199254740992.0;	/* (0, 1) */
	t = sched_next += -log(u) / rate;
	pthread_mutex_unlock(&sched_lock);
	return t;
}

/*
 * Take n units of -max-outstanding (waiting for room), then wait for the
 * intended start.  False, holding nothing, when told to stop meanwhile.
 */
static bool
wait_to_create(double intended, int n)
{
	while (atomic_fetch_add(&outstanding, n) + n > opt.max_outstanding)
	{
		atomic_fetch_sub(&outstanding, n);
		if (atomic_load(&stop_submit))
			return false;
		sleep_s(0.0005);
	}
	for (double left; (left = intended - now_s()) > 0;)
	{
		if (atomic_load(&stop_submit))
		{
			atomic_fetch_sub(&outstanding, n);
			return false;
		}
		sleep_s(left < 0.05 ? left : 0.05);
	}
	return true;
}

/*
 * Open loop: create flows at their scheduled times (unpaced: as fast as
 * -max-outstanding allows), -per-txn of them to a statement, and queue
 * their ids for the shard's poller.  A flow's latency counts from its own
 * arrival, so waiting for the rest of its transaction's flows counts too.
 */
static void *
creator_main(void *arg)
{
	Worker	   *w = arg;
	Shard	   *sh = w->sh;
	PGconn	   *conn = NULL;
	unsigned	seq = w->id;
	int			n = opt.per_txn;
	double	   *intended = xrealloc(NULL, n * sizeof(double));
	char		count[16];

	snprintf(count, sizeof(count), "%d", n);
	while (!atomic_load(&stop_submit))
	{
		const Kind *k = &kinds[seq++ % nkinds];
		const char *params[3] = {k->graph, k->input, count};
		double		sent;
		PGresult   *res;

		if (!conn && !(conn = bench_connect(sh, mode_sql[RUN_OPEN])))
			continue;
		for (int i = 0; i < n; i++)
			intended[i] = w->rate > 0 ? next_arrival(w->rate) : 0;
		if (!wait_to_create(intended[n - 1], n))
			break;
		sent = now_s();
		res = PQexecPrepared(conn, "s", 3, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != n)
		{
			atomic_fetch_sub(&outstanding, n);
			query_failed(sh, &conn, res, k->graph);
		}
		else
		{
			pthread_mutex_lock(&sh->lock);
			while (sh->npending + n > sh->maxpending)
			{
				sh->maxpending = sh->maxpending ? 2 * sh->maxpending : 1024;
				sh->pending = xrealloc(sh->pending, sh->maxpending * sizeof(Pending));
			}
			for (int i = 0; i < n; i++)
				sh->pending[sh->npending++] = (Pending) {
					atoll(PQgetvalue(res, i, 0)), w->rate > 0 ? intended[i] : sent, sent, k->steps
				};
			pthread_mutex_unlock(&sh->lock);
		}
		PQclear(res);
	}
	free(intended);
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
 * Take the closed flows out of a shard's pending list and record them; the
 * caller holds sh->lock.  Latency is the flow's wait in the client before
 * its create was sent plus finished_at - created_at on the server, so the
 * polling period does not inflate it and no two clocks are mixed.  Returns
 * how many did not complete; *example is one of them.
 */
static int
collect_locked(Shard *sh, const Done *done, size_t ndone, Done *example)
{
	double		now = now_s();
	size_t		kept = 0;
	int			failed = 0;

	for (size_t i = 0; i < sh->npending; i++)
	{
		Pending    *p = &sh->pending[i];
		Done		key = {.id = p->id};
		const Done *d = bsearch(&key, done, ndone, sizeof(Done), done_cmp);

		if (d == NULL)
			sh->pending[kept++] = *p;
		else if (strcmp(d->status, "completed") != 0)
		{
			*example = *d;
			failed++;
		}
		else
			record_locked(sh, d->server_us < 0 ? now - p->intended :
						  p->sent - p->intended + d->server_us / 1e6, p->steps);
	}
	atomic_fetch_sub(&outstanding, (int) (sh->npending - kept));
	sh->npending = kept;
	return failed;
}

/*
 * Open loop: poll dwarf.flow for which of a shard's pending flows have
 * closed, POLL_BATCH ids per query, and collect them.  Polls are paced
 * (latency does not depend on them) so that their cost on the server stays
 * small beside the flows'.
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
		double		round = now_s();
		size_t		n,
					ndone = 0;
		Done		example;
		int			failed = 0;

		if (!conn && !(conn = bench_connect(sh, poll_sql)))
			continue;
		pthread_mutex_lock(&sh->lock);
		if ((n = sh->npending) > maxids)
			ids = xrealloc(ids, (maxids = sh->maxpending) * sizeof(long long));
		for (size_t i = 0; i < n; i++)
			ids[i] = sh->pending[i].id;
		pthread_mutex_unlock(&sh->lock);

		for (size_t off = 0; off < n && conn; off += POLL_BATCH)
		{
			const char *param;
			PGresult   *res;

			array.len = 0;
			for (size_t i = off; i < n && i < off + POLL_BATCH; i++)
				buf_printf(&array, "%s%lld", i > off ? "," : "{", ids[i]);
			buf_printf(&array, "}");
			param = array.data;
			res = PQexecPrepared(conn, "s", 1, &param, NULL, NULL, 0);
			if (PQresultStatus(res) != PGRES_TUPLES_OK)
				query_failed(sh, &conn, res, "poll dwarf.flow");
			for (int r = 0; r < PQntuples(res); r++, ndone++)
			{
				if (ndone == maxdone)
					done = xrealloc(done, (maxdone = maxdone ? 2 * maxdone : 1024) * sizeof(Done));
				done[ndone].id = atoll(PQgetvalue(res, r, 0));
				snprintf(done[ndone].status, sizeof done->status, "%s", PQgetvalue(res, r, 1));
				done[ndone].server_us = PQgetisnull(res, r, 2) ? -1 : atoll(PQgetvalue(res, r, 2));
			}
			PQclear(res);
		}
		if (ndone > 0)
		{
			qsort(done, ndone, sizeof(Done), done_cmp);
			pthread_mutex_lock(&sh->lock);
			failed = collect_locked(sh, done, ndone, &example);
			pthread_mutex_unlock(&sh->lock);
		}
		if (failed)
			add_errors(sh, failed, "%d flow(s) did not complete, e.g. flow %lld ended %s",
					   failed, example.id, example.status);
		sleep_s(round + fmax(POLL_PERIOD, (double) n / POLL_IDS_S) - now_s());
	}
	PQfinish(conn);
	free(ids);
	free(done);
	free(array.data);
	return NULL;
}

/*
 * Read /proc/<pid>/stat: the parent pid, and the CPU ticks of the process
 * and of its reaped children.  False if the process is gone.
 */
static bool
read_proc_stat(const char *pid, int *ppid, double *ticks)
{
	char		path[300],
				buf[1024];
	unsigned long long ut,
				st;
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
	/* the command name may contain anything, so start after its last ')' */
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

		if (isdigit((unsigned char) de->d_name[0]) &&
			read_proc_stat(de->d_name, &ppid, &t) &&
			(ppid == pm_pid || atoi(de->d_name) == pm_pid))
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
		return 0;				/* not allowed to read data_directory */
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
 * Run a one-row monitoring query on the shard's own connection (main
 * thread).  Returns the result, or NULL after counting the error; a lost
 * connection is reset for the next call.
 */
static PGresult *
mon_query(Shard *sh, const char *sql, const char *param)
{
	PGresult   *res = PQexecParams(sh->mon, sql, param ? 1 : 0, NULL, &param, NULL, NULL, 0);

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		return res;
	add_errors(sh, 1, "monitor query: %s", PQresultErrorMessage(res));
	PQclear(res);
	if (PQstatus(sh->mon) == CONNECTION_BAD)
		PQreset(sh->mon);
	return NULL;
}

/*
 * Read a shard's counters: WAL position, records and bytes reported, WAL
 * writes and syncs, commits in this database, the server's CPU, and for
 * dwarf the running flows and the step watermark (without begin) or the
 * steps past begin's.  The CPU is read after our queries at a window's
 * start and before them at its end, so that they are not counted.
 */
static void
snap_take(Shard *sh, Snap *s, const Snap *begin, bool dwarf)
{
	PGresult   *res;
	unsigned	hi,
				lo;
	char		mark[32];

	*s = (Snap) {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
	if (sh->pm_pid && begin)
		s->cpu_us = server_cpu_us(sh->pm_pid);
	if ((res = mon_query(sh, stats_sql, NULL)) != NULL)
	{
		if (sscanf(PQgetvalue(res, 0, 0), "%X/%X", &hi, &lo) == 2)
			s->lsn = (double) ((uint64_t) hi << 32 | lo);
		s->wal_records = atof(PQgetvalue(res, 0, 1));
		s->wal_syncs = atof(PQgetvalue(res, 0, 2));
		s->wal_writes = atof(PQgetvalue(res, 0, 3));
		s->commits = atof(PQgetvalue(res, 0, 4));
		s->wal_stat_bytes = atof(PQgetvalue(res, 0, 5));
		PQclear(res);
	}
	/*
	 * dwarf.step_log's rows (a flow's steps packed) have a BRIN index on
	 * their least and greatest step id: look past the last mark only
	 */
	snprintf(mark, sizeof mark, "%.0f", begin ? begin->steps : sh->step_mark);
	if (!dwarf || (begin && isnan(begin->steps)))
		res = NULL;
	else if (begin == NULL)
		res = mon_query(sh, "SELECT coalesce(max(last_step), $1::bigint), " RUNNING_SQL
						" FROM dwarf.step_log WHERE last_step > $1::bigint", mark);
	else
		res = mon_query(sh, "SELECT count(*), " RUNNING_SQL " FROM dwarf.step_log l,"
						" unnest(l.step_id) s WHERE l.last_step > $1::bigint AND s > $1::bigint", mark);
	if (res != NULL)
	{
		s->steps = atof(PQgetvalue(res, 0, 0));
		s->backlog = atof(PQgetvalue(res, 0, 1));
		PQclear(res);
		if (begin == NULL)
			sh->step_mark = s->steps;
	}
	if (sh->pm_pid && !begin)
		s->cpu_us = server_cpu_us(sh->pm_pid);
}

/*
 * Turn the shards' window counters and snapshots into metrics.  Steps come
 * from dwarf.step_log where it could be counted, else from completed flows.
 * WAL, WAL flushes and CPU are server-wide: for shards that share a server
 * they are taken once, and per step of all its shards.
 */
static void
compute(Report *rep)
{
	static Counters all;
	double		steps[MAX_SHARDS],
				server_steps[MAX_SHARDS] = {0},
				cpu_steps = 0,
				secs = rep->secs;
	Metrics    *t = &rep->total;

	memset(&all, 0, sizeof all);
	memset(t, 0, sizeof *t);
	for (int i = 0; i < opt.nshards; i++)
	{
		steps[i] = isnan(shards[i].end.steps) ? shards[i].done.steps : shards[i].end.steps;
		server_steps[shards[i].server] += steps[i];
	}
	for (int i = 0; i < opt.nshards; i++)
	{
		Shard	   *sh = &shards[i];
		const Snap *b = &sh->begin,
				   *e = &sh->end;
		Metrics    *m = &rep->shard[i];
		double		wal = e->lsn - b->lsn,
					stat_wal = e->wal_stat_bytes - b->wal_stat_bytes,
					records = e->wal_records - b->wal_records,
					cpu = e->cpu_us - b->cpu_us;

		counters_add(&all, &sh->done);
		m->flows = sh->done.flows;
		m->steps = steps[i];
		m->flows_s = m->flows / secs;
		m->steps_s = m->steps / secs;
		m->flow_steps_s = sh->done.steps / secs;
		m->p50 = hist_ms(&sh->done.lat, 0.50);
		m->p95 = hist_ms(&sh->done.lat, 0.95);
		m->p99 = hist_ms(&sh->done.lat, 0.99);
		m->errors = sh->done.errors;
		m->commits_s = (e->commits - b->commits) / secs;
		m->backlog_end = e->backlog;
		m->backlog_slope = (e->backlog - b->backlog) / secs;
		m->wal_bytes = wal / server_steps[sh->server];
		m->wal_records = records / server_steps[sh->server];
		m->syncs_s = (e->wal_syncs - b->wal_syncs) / secs;
		m->writes_s = (e->wal_writes - b->wal_writes) / secs;
		m->cpu_us = cpu / server_steps[sh->server];
		m->wal_coverage = stat_wal / wal;

		t->flows += m->flows;
		t->steps += m->steps;
		t->flow_steps_s += m->flow_steps_s;
		t->errors += m->errors;
		t->commits_s += m->commits_s;
		t->backlog_end += m->backlog_end;
		t->backlog_slope += m->backlog_slope;
		if (sh->server != i)
			continue;
		t->wal_bytes += wal;
		t->wal_coverage += stat_wal;
		t->wal_records += records;
		t->syncs_s += m->syncs_s;
		t->writes_s += m->writes_s;
		if (!isnan(cpu))
		{
			t->cpu_us += cpu;
			cpu_steps += server_steps[i];
		}
	}
	t->flows_s = t->flows / secs;
	t->steps_s = t->steps / secs;
	t->p50 = hist_ms(&all.lat, 0.50);
	t->p95 = hist_ms(&all.lat, 0.95);
	t->p99 = hist_ms(&all.lat, 0.99);
	t->wal_coverage /= t->wal_bytes;
	t->wal_bytes /= t->steps;
	t->wal_records /= t->steps;
	t->cpu_us = cpu_steps > 0 ? t->cpu_us / cpu_steps : NAN;
}

/* Format a number for people; "-" when unknown. */
static const char *
num(double v, int prec)
{
	static char ring[16][32];
	static int	next;
	char	   *s = ring[next++ % 16];

	if (!isfinite(v))
		return "-";
	snprintf(s, 32, "%.*f", prec, v);
	return s;
}

/* What a window runs, for people: "linear closed" or "reference". */
static const char *
run_name(RunMode mode)
{
	static char name[32];

	if (mode == RUN_REFERENCE)
		return "reference";
	snprintf(name, sizeof name, "%s %s", workload_names[opt.workload], mode_names[mode]);
	return name;
}

/*
 * Print a progress line (and a CSV row) for the interval just ended, from
 * the shards' interval counters, which start over.
 */
static void
progress(RunMode mode, int conc, double rate, const char *phase, double elapsed, double secs)
{
	static Counters sum;
	double		backlog = mode == RUN_REFERENCE ? NAN : 0;
	double		p50,
				p99;

	memset(&sum, 0, sizeof sum);
	for (int i = 0; i < opt.nshards; i++)
	{
		Shard	   *sh = &shards[i];
		PGresult   *res;

		pthread_mutex_lock(&sh->lock);
		counters_add(&sum, &sh->tick);
		memset(&sh->tick, 0, sizeof sh->tick);
		sh->shown = 0;
		pthread_mutex_unlock(&sh->lock);
		if (mode == RUN_REFERENCE)
			continue;
		res = mon_query(sh, "SELECT " RUNNING_SQL, NULL);
		backlog += res ? atof(PQgetvalue(res, 0, 0)) : NAN;
		PQclear(res);
	}
	p50 = hist_ms(&sum.lat, 0.50);
	p99 = hist_ms(&sum.lat, 0.99);
	printf("%s c=%d %s %6.1f s %9.1f flows/s %10.1f steps/s  p50 %s ms  p99 %s ms  backlog %s  errors %llu\n",
		   run_name(mode), conc, phase, elapsed, sum.flows / secs, sum.steps / secs,
		   num(p50, 2), num(p99, 2), num(backlog, 0), (unsigned long long) sum.errors);
	fflush(stdout);
	if (csv_file == NULL)
		return;
	fprintf(csv_file, "%.3f,%s,%s,%d,%g,%s,%.3f,%.3f,%.3f,%s,%s,%s,%llu,\"",
			now_s() + wall_offset, mode == RUN_REFERENCE ? "reference" : workload_names[opt.workload],
			mode_names[mode], conc, rate, phase, elapsed, sum.flows / secs, sum.steps / secs,
			isnan(p50) ? "" : num(p50, 3), isnan(p99) ? "" : num(p99, 3),
			isnan(backlog) ? "" : num(backlog, 0), (unsigned long long) sum.errors);
	for (const char *c = opt.label; *c; c++)
	{
		if (*c == '"')
			fputc('"', csv_file);	/* CSV doubles quotes */
		fputc(*c, csv_file);
	}
	fputs("\"\n", csv_file);	/* the label comes last: it may hold commas */
	fflush(csv_file);
}

/*
 * Start a window's threads, warm up, measure one window with a progress
 * line per interval, compute the metrics into rep, then stop and (open
 * loop) wait up to -timeout for the flows still open.
 */
static void
run_window(RunMode mode, int conc, double rate, Report *rep)
{
	Worker	   *workers = xrealloc(NULL, conc * sizeof(Worker));
	pthread_t	pollers[MAX_SHARDS];
	double		start = now_s(),
				last_tick = start,
				next_tick = start + opt.interval,
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
	sched_next = start;
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

	for (;;)
	{
		double		phase_end = began ? began + opt.window : start + opt.warmup;

		sleep_s((next_tick < phase_end ? next_tick : phase_end) - now_s());
		if (now_s() >= next_tick)
		{
			double		now = now_s();

			progress(mode, conc, rate, began ? "window" : "warmup", now - start, now - last_tick);
			last_tick = now;
			next_tick += opt.interval;
		}
		if (now_s() < phase_end)
			continue;
		if (began)
			break;
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
	for (int i = 0; i < opt.nshards; i++)
	{
		pthread_mutex_lock(&shards[i].lock);
		shards[i].recording = false;
		shards[i].done = shards[i].window;
		pthread_mutex_unlock(&shards[i].lock);
	}
	rep->secs = now_s() - began;
	for (int i = 0; i < opt.nshards; i++)
		snap_take(&shards[i], &shards[i].end, &shards[i].begin, mode != RUN_REFERENCE);
	compute(rep);

	atomic_store(&stop_submit, true);
	for (int i = 0; i < conc; i++)
		pthread_join(workers[i].thread, NULL);
	free(workers);
	if (mode != RUN_OPEN)
		return;
	for (double deadline = now_s() + opt.timeout; atomic_load(&outstanding) > 0 && now_s() < deadline;)
		sleep_s(0.01);
	if (atomic_load(&outstanding) > 0)
		fprintf(stderr, "dwarf-bench: %d flows still open %g s after the window; going on\n",
				atomic_load(&outstanding), opt.timeout);
	atomic_store(&stop_poll, true);
	for (int i = 0; i < opt.nshards; i++)
	{
		pthread_join(pollers[i], NULL);
		shards[i].npending = 0;
	}
}

/* Print a window's metrics (one shard or the total) for people. */
static void
print_metrics(const char *indent, const Metrics *m, const Metrics *ref)
{
	printf("%s%s flows/s  %s steps/s  latency p50 %s p95 %s p99 %s ms  errors %.0f\n",
		   indent, num(m->flows_s, 1), num(m->steps_s, 1),
		   num(m->p50, 2), num(m->p95, 2), num(m->p99, 2), m->errors);
	printf("%sWAL %s B/step %s records/step  %s commits/s  %s WAL flushes/s  "
		   "CPU %s us/step  backlog %s (%s/s)\n",
		   indent, num(m->wal_bytes, 0), num(m->wal_records, 2), num(m->commits_s, 1),
		   num(m->syncs_s, 1), num(m->cpu_us, 1), num(m->backlog_end, 0),
		   num(m->backlog_slope, 2));
	if (ref)
		printf("%sreference %s tps: ratio %s steps per reference write\n",
			   indent, num(ref->steps_s, 1), num(m->steps_s / ref->steps_s, 3));
	if (m->wal_coverage < 0.8)
		printf("%sWARNING: pg_stat_wal saw only %.0f%% of the WAL written: processes that do not "
			   "report statistics (pgstat_report_stat) leave records, flushes and commits short\n",
			   indent, 100 * m->wal_coverage);
}

/* Append a JSON number field (integral values without decimals) or null. */
static void
json_num(Buf *b, const char *key, double v)
{
	if (!isfinite(v))
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
	json_num(b, "wal_stats_coverage", m->wal_coverage);
	json_num(b, "backlog_end", m->backlog_end);
	json_num(b, "backlog_slope", m->backlog_slope);
	json_num(b, "errors", m->errors);
	json_num(b, "reference_tps", ref ? ref->steps_s : NAN);
	json_num(b, "ratio", ref ? m->steps_s / ref->steps_s : NAN);
}

/*
 * Report one window: lines for people on stdout and, with -out, one JSON
 * object per line with the totals and a "shards" array.
 */
static void
report(RunMode mode, int conc, double rate, const Report *r, const Report *ref)
{
	double		steps_per_flow = mode == RUN_REFERENCE ? 1 : 0;
	bool		durable = true;
	Buf			b = {0};

	for (int i = 0; i < nkinds && mode != RUN_REFERENCE; i++)
		steps_per_flow += (double) kinds[i].steps / nkinds;
	for (int i = 0; i < opt.nshards; i++)
		durable &= !strcmp(shards[i].fsync, "on") && !strcmp(shards[i].sync_commit, "on");

	printf("== %s%s%s c=%d", opt.label, *opt.label ? ": " : "", run_name(mode), conc);
	if (mode == RUN_OPEN)
		printf(" offered %s flows/s", rate > 0 ? num(rate, 1) : "unpaced");
	printf(", %.1f s window%s\n", r->secs, durable ? "" : " (NOT durable: fsync or synchronous_commit off)");
	print_metrics("   ", &r->total, ref ? &ref->total : NULL);
	for (int i = 0; opt.nshards > 1 && i < opt.nshards; i++)
	{
		printf("   shard %d (%s)", i, shards[i].where);
		if (shards[i].server != i)
			printf(", same server as shard %d: WAL, flushes, CPU are the server's", shards[i].server);
		printf(":\n");
		print_metrics("     ", &r->shard[i], ref ? &ref->shard[i] : NULL);
	}
	fflush(stdout);
	if (out_file == NULL)
		return;

	buf_printf(&b, "{\"label\": ");
	buf_json_string(&b, opt.label);
	buf_printf(&b, ", \"workload\": \"%s\", \"mode\": \"%s\"",
			   mode == RUN_REFERENCE ? "reference" : workload_names[opt.workload], mode_names[mode]);
	json_num(&b, "concurrency", conc);
	json_num(&b, "arrival_rate", mode == RUN_OPEN ? rate : NAN);
	json_num(&b, "steps_per_flow", steps_per_flow);
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
 * The payload as a JSON value of about -payload bytes: a string of
 * random-looking base64 (pglz cannot shrink it, like encrypted or binary
 * data) or, with -payload-json, a document of similar records (compressible,
 * like real application state).  Neither contains a single quote.
 */
static const char *
make_payload(void)
{
	static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint64_t	x = 88172645463325252ULL;
	Buf			b = {0};

	if (!opt.payload_json)
	{
		buf_printf(&b, "\"");
		for (int i = 0; i < opt.payload; i++)
		{
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf_printf(&b, "%c", b64[x & 63]);
		}
		buf_printf(&b, "\"");
		return b.data;
	}
	buf_printf(&b, "{\"items\": [");
	for (int i = 1;; i++)
	{
		char		rec[200];
		size_t		len = snprintf(rec, sizeof rec,
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

/* A graph definition chaining n tasks S1..Sn that all call fn. */
static const char *
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

/* Describe one kind of flow: graph, definition, task functions, input. */
static void
add_kind(Workload w)
{
	static const char *payload;
	Kind	   *k = &kinds[nkinds++];
	const char *enc = opt.payload_json ? "json" : "b64";
	Buf			b = {0};
	char		fn[64];

	if ((w == W_STATE || w == W_CARRY) && payload == NULL)
		payload = make_payload();
	k->steps = opt.steps;
	k->input = "{}";
	switch (w)
	{
		case W_LINEAR:
			snprintf(k->graph, sizeof k->graph, "bench_linear_%d", opt.steps);
			k->definition = chain_definition(opt.steps, "dwarf_bench.noop");
			break;
		case W_CARRY:
			snprintf(k->graph, sizeof k->graph, "bench_carry_%d", opt.steps);
			k->definition = chain_definition(opt.steps, "dwarf_bench.noop");
			buf_printf(&b, "{\"payload\": %s}", payload);
			k->input = b.data;
			break;
		case W_STATE:
			snprintf(fn, sizeof fn, "dwarf_bench.state_%d_%s", opt.payload, enc);
			snprintf(k->graph, sizeof k->graph, "bench_state_%d_%d_%s", opt.steps, opt.payload, enc);
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
		default:
			die("workload %s has no flow of its own", workload_names[w]);
	}
}

/* Run a setup statement on a shard, or exit. */
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
 * Connect a shard's monitor connection, learn its durability settings,
 * whether it is local and which shards share its server, and create what
 * the workload needs: schema, task functions, graphs, reference table.
 */
static void
setup_shard(Shard *sh)
{
	PGresult   *res;
	char		rows[16];
	const char *params[2] = {rows};
	int			n = 1000;

	sh->mon = connect_dsn(sh->dsn);
	if (PQstatus(sh->mon) != CONNECTION_OK)
		die("cannot connect to shard %d (\"%s\"): %s", sh->idx, sh->dsn, PQerrorMessage(sh->mon));
	snprintf(sh->where, sizeof sh->where, "%s:%s/%s", PQhost(sh->mon), PQport(sh->mon), PQdb(sh->mon));
	for (sh->server = 0; sh->server < sh->idx; sh->server++)
		if (!strcmp(PQhost(shards[sh->server].mon), PQhost(sh->mon)) &&
			!strcmp(PQport(shards[sh->server].mon), PQport(sh->mon)))
			break;
	res = setup_exec(sh, "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
					 "pg_backend_pid(), coalesce((SELECT setting FROM pg_settings "
					 "WHERE name = 'data_directory'), ''), "
					 "EXISTS (SELECT FROM pg_extension WHERE extname = 'dwarf'), "
					 "EXISTS (SELECT FROM pg_proc WHERE proname = 'sleep' "
					 "AND pronamespace = to_regnamespace('dwarf'))", 0, NULL);
	snprintf(sh->fsync, sizeof sh->fsync, "%s", PQgetvalue(res, 0, 0));
	snprintf(sh->sync_commit, sizeof sh->sync_commit, "%s", PQgetvalue(res, 0, 1));
	sh->pm_pid = local_postmaster(PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3));
	if (opt.workload != W_REFERENCE && strcmp(PQgetvalue(res, 0, 4), "t") != 0)
		die("shard %d (%s): extension dwarf is not installed in this database; run CREATE EXTENSION dwarf "
			"(the server needs shared_preload_libraries = 'dwarf')", sh->idx, sh->where);
	if (opt.workload == W_WAIT && strcmp(PQgetvalue(res, 0, 5), "t") != 0)
		die("shard %d (%s): the wait workload needs dwarf.sleep(), which this dwarf lacks",
			sh->idx, sh->where);
	PQclear(res);
	if (strcmp(sh->fsync, "on") != 0 || strcmp(sh->sync_commit, "on") != 0)
		fprintf(stderr, "dwarf-bench: shard %d (%s) is NOT durable: fsync = %s, synchronous_commit = %s\n",
				sh->idx, sh->where, sh->fsync, sh->sync_commit);
	if (sh->pm_pid == 0)
		fprintf(stderr, "dwarf-bench: shard %d (%s) is not a local server readable here: no CPU figures\n",
				sh->idx, sh->where);

	PQclear(setup_exec(sh, "SET client_min_messages = warning", 0, NULL));
	PQclear(setup_exec(sh, "CREATE SCHEMA IF NOT EXISTS dwarf_bench", 0, NULL));
	if (opt.workload != W_REFERENCE)
		PQclear(setup_exec(sh, "CREATE OR REPLACE FUNCTION dwarf_bench.noop(s jsonb) RETURNS jsonb "
						   "LANGUAGE sql AS $f$ SELECT '{}'::jsonb $f$", 0, NULL));
	for (int i = 0; i < nkinds; i++)
	{
		if (kinds[i].functions)
			PQclear(setup_exec(sh, kinds[i].functions, 0, NULL));
		params[0] = kinds[i].graph;
		params[1] = kinds[i].definition;
		res = setup_exec(sh, "SELECT dwarf.define($1, $2::jsonb)", 2, params);
		printf("shard %d: defined %s version %s\n", sh->idx, kinds[i].graph, PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	if (!opt.reference && opt.workload != W_REFERENCE)
		return;
	for (int i = 0; i < opt.nconc; i++)
		n = opt.conc[i] > n ? opt.conc[i] : n;
	snprintf(rows, sizeof rows, "%d", n);
	params[0] = rows;
	PQclear(setup_exec(sh, "CREATE TABLE IF NOT EXISTS dwarf_bench.ref "
					   "(id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)", 0, NULL));
	PQclear(setup_exec(sh, "INSERT INTO dwarf_bench.ref (id) SELECT generate_series(1, $1::int) "
					   "ON CONFLICT DO NOTHING", 1, params));
}

/* Open a file for appending, or exit; *empty tells whether it needs a header. */
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
	RunMode		mode;
	bool		empty;
	struct timespec wall;

	parse_args(argc, argv);
	clock_gettime(CLOCK_REALTIME, &wall);
	wall_offset = wall.tv_sec + wall.tv_nsec / 1e9 - now_s();
	if (opt.workload == W_MIXED)
		for (Workload w = W_LINEAR; w <= W_CARRY; w++)
			add_kind(w);
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
		fputs("unix_s,workload,mode,concurrency,arrival_rate,phase,elapsed_s,"
			  "flows_s,steps_s,p50_ms,p99_ms,backlog,errors,label\n", csv_file);

	mode = opt.workload == W_REFERENCE ? RUN_REFERENCE : opt.nrate ? RUN_OPEN : RUN_CLOSED;
	for (int c = 0; c < opt.nconc; c++)
		for (int r = 0; r < (opt.nrate ? opt.nrate : 1); r++)
		{
			bool		with_ref = opt.reference && mode != RUN_REFERENCE;

			run_window(mode, opt.conc[c], opt.rate[r], &result);
			if (with_ref)
				run_window(RUN_REFERENCE, opt.conc[c], 0, &ref);
			report(mode, opt.conc[c], opt.rate[r], &result, with_ref ? &ref : NULL);
		}
	if (atomic_load(&total_errors) > 0)
	{
		fprintf(stderr, "dwarf-bench: %llu errors (see above)\n",
				(unsigned long long) atomic_load(&total_errors));
		return 1;
	}
	return 0;
}
