/*
 * http.c
 *		The HTTP process: the server's own outside worker for HTTP tasks
 *		({"http": "POST https://host/path"}), and dwarf.http_call.
 *
 * An HTTP task's step is offered like an external task's (offers.c), on
 * DWARF_HTTP_QUEUE, which dwarf.claim refuses.  One process per database
 * (a background worker the launcher starts while dwarf.http_allow is set)
 * claims those steps (OffersClaim, no SQL), and drives every call with
 * libcurl's multi interface: curl_multi_socket_action, with curl's sockets
 * and this process's latch in one WaitEventSet, so that thousands of calls
 * in flight cost nothing while they wait, and an offer (which sets the
 * latch: OffersWatch) is claimed at once.  curl's sockets are in an epoll
 * set of this process's own, changed socket by socket as curl asks
 * (SocketCallback), and that set is one socket of the WaitEventSet, which
 * is made once: a wait costs the same with ten calls in flight or 10,000.
 *
 * Between claims and answers no transaction is open: a call in flight holds
 * no lock, no snapshot and no backend.  The answers of finished calls are
 * written in batches, many in one transaction (WriteAnswer, external.c, as
 * dwarf.complete and dwarf.fail write theirs); the flows' workers record
 * them as the steps.  A step's lease is its task's timeout and a margin, so
 * a call this process lost (it exited, or the server crashed) becomes a
 * failed attempt, and after a restart every waiting step is offered and
 * called again, with the same Idempotency-Key (the step key): a call is
 * made at least once.
 *
 * Roles share the calls fairly.  Steps are claimed role by role, each
 * role up to its share of the calls at once (RoleShare: the calls over the
 * roles holding some, plus one, so that a role holding none always finds
 * room), so one role's backlog waits offered, in its own line; the calls
 * at once are bounded by dwarf.http_max_in_flight and by
 * dwarf.http_max_response_memory, each call holding dwarf.http_max_response
 * of it from its start (SlotLimit).  Each host's connections are shared
 * the same way (MayConnect), counted here: a call past its role's share of
 * its host waits here, claimed, its lease kept and its timeout not running
 * (StartWaitingCalls), never in curl's queue (CURLMOPT_MAX_HOST_CONNECTIONS
 * is only a backstop).
 *
 * A call ends before its lease does: curl's timeout ends it, or its
 * deadline, half the lease's margin before the lease ends, should curl
 * not (EndLateCalls).  A lease that ends under a call anyway
 * (its flow was cancelled or closed, or it ran out) wakes this process,
 * which closes the call at once (DropEndedCalls), and before it starts any
 * call it has just claimed: one step's attempts are never open at once.
 *
 * Before a call: its URL, in normal form (url.c), must be inside one of
 * dwarf.http_allow's prefixes, and the flow's owner must have EXECUTE on
 * dwarf.http_call; otherwise the step fails and no request is made.  The
 * normal form is the URL sent.  No proxy is used (the server's environment
 * is not asked), redirects are not followed; an answer past
 * dwarf.http_max_response aborts its transfer; TLS certificates and host
 * names are verified (curl's defaults, kept).
 */
#include "postgres.h"

#define CURL_DISABLE_TYPECHECK	/* its checks are macros of the names below */
#include <curl/curl.h>
#include <dlfcn.h>
#include <sys/epoll.h>
#include <sys/resource.h>

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "lib/ilist.h"
#include "lib/pairingheap.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/varlena.h"

#include "dwarf.h"
#include "graph.h"
#include "http.h"
#include "json.h"
#include "offers.h"
#include "url.h"

/*
 * libcurl, loaded by the HTTP process alone (LoadCurl).  Linked into
 * dwarf.so, it was mapped, with some fifteen libraries of its own, into
 * every server process, and each of them paid for it: the bulk bench ran
 * at 14.6 us of server CPU a step without it and 18.4 with it, and plain
 * pgbench slowed down too (bench/README.md, "Issue 20's hot path").
 */
static struct
{
	CURLcode	(*global_init) (long flags);
	CURL	   *(*easy_init) (void);
	CURLcode	(*easy_setopt) (CURL *curl, CURLoption option,...);
	CURLcode	(*easy_getinfo) (CURL *curl, CURLINFO info,...);
	void		(*easy_cleanup) (CURL *curl);
	const char *(*easy_strerror) (CURLcode code);
	CURLM	   *(*multi_init) (void);
	CURLMcode	(*multi_setopt) (CURLM *multi, CURLMoption option,...);
	CURLMcode	(*multi_add_handle) (CURLM *multi, CURL *curl);
	CURLMcode	(*multi_remove_handle) (CURLM *multi, CURL *curl);
	CURLMsg    *(*multi_info_read) (CURLM *multi, int *left);
	CURLMcode	(*multi_socket_action) (CURLM *multi, curl_socket_t s, int ev, int *running);
	struct curl_slist *(*slist_append) (struct curl_slist *list, const char *string);
	void		(*slist_free_all) (struct curl_slist *list);
} Curl;

#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_multi_setopt
#define curl_global_init(f)				Curl.global_init(f)
#define curl_easy_init()				Curl.easy_init()
#define curl_easy_setopt(...)			Curl.easy_setopt(__VA_ARGS__)
#define curl_easy_getinfo(...)			Curl.easy_getinfo(__VA_ARGS__)
#define curl_easy_cleanup(c)			Curl.easy_cleanup(c)
#define curl_easy_strerror(c)			Curl.easy_strerror(c)
#define curl_multi_init()				Curl.multi_init()
#define curl_multi_setopt(...)			Curl.multi_setopt(__VA_ARGS__)
#define curl_multi_add_handle(m, c)		Curl.multi_add_handle(m, c)
#define curl_multi_remove_handle(m, c)	Curl.multi_remove_handle(m, c)
#define curl_multi_info_read(m, l)		Curl.multi_info_read(m, l)
#define curl_multi_socket_action(m, s, e, r) Curl.multi_socket_action(m, s, e, r)
#define curl_slist_append(l, s)			Curl.slist_append(l, s)
#define curl_slist_free_all(l)			Curl.slist_free_all(l)

/* Loads libcurl (Debian's libcurl4) and finds its functions; FATAL without it. */
static void
LoadCurl(void)
{
	static const char *const names[] = {
		"curl_global_init", "curl_easy_init", "curl_easy_setopt", "curl_easy_getinfo",
		"curl_easy_cleanup", "curl_easy_strerror", "curl_multi_init", "curl_multi_setopt",
		"curl_multi_add_handle", "curl_multi_remove_handle", "curl_multi_info_read",
		"curl_multi_socket_action", "curl_slist_append", "curl_slist_free_all"
	};
	void	  **slots = (void **) &Curl;
	void	   *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	int			i;

	StaticAssertStmt(sizeof(Curl) == lengthof(names) * sizeof(void *),
					 "one name for each of libcurl's functions");
	if (lib == NULL)
		ereport(FATAL,
				(errmsg("dwarf: could not load libcurl, which HTTP tasks need: %s", dlerror()),
				 errhint("Install Debian's package libcurl4 (scripts/deps.sh does).")));
	for (i = 0; i < lengthof(names); i++)
		if ((slots[i] = dlsym(lib, names[i])) == NULL)
			ereport(FATAL,
					(errmsg("dwarf: libcurl has no function %s: %s", names[i], dlerror())));
}
#include "shmem.h"

/* How much of an answer's body an error quotes. */
#define BODY_QUOTE		200

/* Most answers one transaction writes. */
#define ANSWER_BATCH	1000

/* The longest host key (scheme://host:port) told apart; longer ones are cut. */
#define HOST_KEY		280

/* One call: claimed, in flight, then done with its answer. */
typedef struct HttpCall
{
	dlist_node	node;			/* on InFlight, then on Done */
	MemoryContext cxt;			/* everything below */
	int64		lease;
	int64		flow_id;
	Oid			owner;			/* the flow's owner: whose share it takes */
	char		task[NAMEDATALEN];
	const char *method;
	const char *url;
	int64		timeout_ms;
	TimestampTz deadline;		/* when it is closed as timed out, whatever
								 * curl says: before its lease ends */
	pairingheap_node in_deadlines;	/* on Deadlines, while in flight */
	CURL	   *easy;			/* while its transfer is curl's */
	char		host[HOST_KEY]; /* scheme://host[:port] */
	bool		listed;			/* on InFlight and Deadlines */
	bool		connected;		/* holds a connection to host */
	bool		waiting;		/* on its HostRole's waiting */
	dlist_node	wait_node;
	struct curl_slist *headers;
	char	   *body;			/* the request's, or NULL */
	StringInfoData response;	/* the answer's body, so far */
	bool		too_large;		/* past dwarf.http_max_response */
	int			retry_after;	/* s, from a Retry-After header; -1: none */
	char		errbuf[CURL_ERROR_SIZE];

	/* the answer */
	bool		completed;
	Jsonb	   *changes;		/* completed: or NULL for none */
	char	   *message;		/* failed: why */
	bool		retryable;
	long		status;			/* the HTTP status, 0: none */
} HttpCall;

/* Most of curl's socket events one wait takes (more wait for the next). */
#define SOCKET_EVENTS	1024

static CURLM *Multi = NULL;
static HTAB *Sockets = NULL;	/* the sockets in Epoll (curl_socket_t keys) */
static int	Epoll = -1;			/* curl's sockets, for what curl wants of each */
static WaitEventSet *WaitSet = NULL;	/* the latch, the postmaster, Epoll */
static TimestampTz LimitDue = 0;	/* when a step left for want of room under
									 * its limit may have it; 0: none */
static TimestampTz CurlDue = 0; /* when curl wants its timeout action; 0: never */
static dlist_head InFlight = DLIST_STATIC_INIT(InFlight);
static dlist_head Done = DLIST_STATIC_INIT(Done);
static pairingheap *Deadlines = NULL;	/* the calls in flight, soonest
										 * deadline first */
static uint64 SeenHttpEnded = 0;	/* OffersHttpEnded() at the last look */
static int	NumInFlight = 0;
static int	NumDone = 0;
static MemoryContext CallsContext = NULL;
static DwarfWorkerSlot *Slot = NULL;

/*
 * Fair shares of the calls at once (ClaimAndStart).  RoleCalls counts the
 * calls each role (a flow's owner) holds, from claim to answer written;
 * ReadyRoles are the roles last seen with steps ready on DWARF_HTTP_QUEUE.
 */
typedef struct RoleCallsEntry
{
	Oid			owner;			/* the key */
	int			calls;
} RoleCallsEntry;

/* How often, at most, the whole queue is read for the roles with steps ready. */
#define LOOK_MS			100

/* How often, at most, that steps wait for their share is logged. */
#define LOG_EVERY_MS	(10 * 1000)

static HTAB *RoleCalls = NULL;
static Oid *ReadyRoles = NULL;
static int	NumReady = 0;
static int	ReadySize = 0;
static int	NextTurn = 0;		/* where the next round of claims starts */
static TimestampTz LookDue = 0; /* the next read of the whole queue; 0: now */
static TimestampTz LookWake = 0;	/* when to wake for it; 0: no need */

static void RoleAdd(Oid owner, int n);

/*
 * Fair shares of the connections to a host (Admit): dwarf's own count of
 * the transfers each role has at each host, so that curl's queue for a
 * connection (CURLMOPT_MAX_HOST_CONNECTIONS, kept as a backstop) is never
 * where a call waits.  A call whose role holds its share of a host waits
 * here, on its HostRole's list, its lease kept (EndLateCalls) and its
 * timeout not running.
 */
typedef struct HostEntry
{
	char		host[HOST_KEY]; /* the key */
	int			connections;
	int			holders;		/* roles with connections here */
} HostEntry;

typedef struct HostRoleKey
{
	char		host[HOST_KEY];
	Oid			owner;
} HostRoleKey;

typedef struct HostRole
{
	HostRoleKey key;
	int			connections;
	dlist_head	waiting;		/* its calls waiting for a connection */
	dlist_node	in_waiting;		/* on WaitingHosts while any wait */
} HostRole;

static HTAB *Hosts = NULL;
static HTAB *HostRoles = NULL;
static dlist_head WaitingHosts = DLIST_STATIC_INIT(WaitingHosts);

DWARF_FUNCTION(dwarf_http_call);

/*
 * dwarf.http_call(url): may the HTTP tasks of flows owned by roles with
 * EXECUTE on this function call url (is its normal form inside
 * dwarf.http_allow, url.c)?  The function's EXECUTE privilege is what the
 * HTTP process checks of a flow's owner before each call.
 */
Datum
dwarf_http_call(PG_FUNCTION_ARGS)
{
	const char *why;
	char	   *normal;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	normal = UrlNormalize(text_to_cstring(PG_GETARG_TEXT_PP(0)), &why);
	PG_RETURN_BOOL(normal != NULL && UrlAllowed(normal));
}

/*
 * curl's socket callback: what curl waits for on a socket changed, and
 * Epoll changes with it (one epoll_ctl).  A socket closed behind curl's
 * back has left the set by itself, and one reused since is added again.
 * A change that fails is logged; its transfer then ends at its timeout.
 */
static int
SocketCallback(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
	struct epoll_event ev;
	bool		known;
	int			rc;

	if (what == CURL_POLL_REMOVE)
	{
		if (hash_search(Sockets, &fd, HASH_REMOVE, NULL) != NULL)
			(void) epoll_ctl(Epoll, EPOLL_CTL_DEL, fd, NULL);
		return 0;
	}
	memset(&ev, 0, sizeof(ev));
	ev.data.fd = fd;
	if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
		ev.events |= EPOLLIN;
	if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
		ev.events |= EPOLLOUT;
	(void) hash_search(Sockets, &fd, HASH_ENTER, &known);
	rc = epoll_ctl(Epoll, known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
	if (rc != 0 && (errno == ENOENT || errno == EEXIST))
		rc = epoll_ctl(Epoll, errno == ENOENT ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
	if (rc != 0)
		ereport(WARNING,
				(errcode_for_socket_access(),
				 errmsg("dwarf: could not watch an HTTP call's socket: %m")));
	return 0;
}

/* curl's timer callback: when to call it for its timeouts. */
static int
TimerCallback(CURLM *multi, long timeout_ms, void *userp)
{
	CurlDue = timeout_ms < 0 ? 0 : GetCurrentTimestamp() + (int64) timeout_ms * 1000;
	return 0;
}

/*
 * An answer's body, kept up to dwarf.http_max_response: its buffer never
 * takes more than that (and one byte), what the call holds of
 * dwarf.http_max_response_memory.
 */
static size_t
WriteCallback(char *data, size_t size, size_t n, void *userp)
{
	HttpCall   *call = userp;
	size_t		len = size * n;

	Size		limit = (Size) dwarf_http_max_response * 1024;

	if ((Size) call->response.len + len > limit)
	{
		call->too_large = true;
		return 0;				/* aborts the transfer */
	}
	if (call->response.len + len + 1 > call->response.maxlen)
	{
		/* grows by doubling, but never past the limit (and its NUL) */
		int			grown = (int) Min(Max((Size) call->response.maxlen * 2,
										  call->response.len + len + 1), limit + 1);

		call->response.data = repalloc(call->response.data, grown);
		call->response.maxlen = grown;
	}
	appendBinaryStringInfo(&call->response, data, len);
	return len;
}

/* An answer's headers: Retry-After is kept (in seconds). */
static size_t
HeaderCallback(char *data, size_t size, size_t n, void *userp)
{
	HttpCall   *call = userp;
	size_t		len = size * n;
	const char *name = "retry-after:";

	if (len > strlen(name) && pg_strncasecmp(data, name, strlen(name)) == 0)
	{
		char	   *value = pnstrdup(data + strlen(name), len - strlen(name));
		char	   *end;
		long		s = strtol(value, &end, 10);

		if (end != value && s >= 0 && s < 24 * 3600)
			call->retry_after = (int) s;
	}
	return len;
}

/* A printable start of an answer's body, for an error. */
static char *
BodyQuote(HttpCall *call)
{
	int			len = Min(call->response.len, BODY_QUOTE);
	char	   *quote = palloc(len + 4);
	int			i;

	for (i = 0; i < len; i++)
	{
		unsigned char c = call->response.data[i];

		quote[i] = (c < 0x20 || c >= 0x7f) ? ' ' : c;
	}
	strcpy(quote + len, call->response.len > len ? "..." : "");
	return quote;
}

/* The call failed before any request, or without an answer to record. */
static void Refuse(HttpCall *call, bool retryable, const char *fmt,...) pg_attribute_printf(3, 4);

static void
Refuse(HttpCall *call, bool retryable, const char *fmt,...)
{
	va_list		args;
	char		buf[1024];

	va_start(args, fmt);
	vsnprintf(buf, sizeof(buf), fmt, args);
	va_end(args);
	call->completed = false;
	call->retryable = retryable;
	call->message = MemoryContextStrdup(call->cxt, buf);
}

/*
 * A 2xx answer's body as the step's changes: none when empty, else a JSON
 * object.  A body that is not one fails the attempt (not to be retried).
 */
static void
TakeChanges(HttpCall *call)
{
	MemoryContext old = MemoryContextSwitchTo(call->cxt);
	Jsonb	   *changes = NULL;
	int			i;

	for (i = 0; i < call->response.len; i++)
		if (!isspace((unsigned char) call->response.data[i]))
			break;
	if (i == call->response.len)
	{
		call->completed = true;
		MemoryContextSwitchTo(old);
		return;
	}
	PG_TRY();
	{
		changes = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
													 CStringGetDatum(call->response.data)));
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(call->cxt);
		FlushErrorState();
		changes = NULL;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old);
	if (changes && JsonbIsObject(changes))
	{
		call->completed = true;
		call->changes = changes;
	}
	else
		Refuse(call, false, "HTTP %ld from %s %s: the answer is not a JSON object: %s",
			   call->status, call->method, call->url, BodyQuote(call));
}

/* What a finished transfer means for its step. */
static void
Conclude(HttpCall *call, CURLcode result)
{
	const char *detail = call->errbuf[0] ? call->errbuf : curl_easy_strerror(result);
	long		code = 0;

	if (result == CURLE_OK)
	{
		curl_easy_getinfo(call->easy, CURLINFO_RESPONSE_CODE, &code);
		call->status = code;
		if (code >= 200 && code < 300)
			TakeChanges(call);
		else if (code >= 300 && code < 400)
		{
			char	   *location = NULL;

			curl_easy_getinfo(call->easy, CURLINFO_REDIRECT_URL, &location);
			Refuse(call, false, "HTTP %ld from %s %s: redirects are not followed (to %s)",
				   code, call->method, call->url, location ? location : "nowhere given");
		}
		else
			Refuse(call, code == 408 || code == 429 || code >= 500,
				   "HTTP %ld from %s %s: %s", code, call->method, call->url, BodyQuote(call));
	}
	else if (result == CURLE_OPERATION_TIMEDOUT)
		Refuse(call, true, "%s %s timed out after " INT64_FORMAT " ms",
			   call->method, call->url, call->timeout_ms);
	else if (call->too_large || result == CURLE_FILESIZE_EXCEEDED)
		Refuse(call, false, "the answer of %s %s is larger than dwarf.http_max_response (%d kB)",
			   call->method, call->url, dwarf_http_max_response);
	else
		Refuse(call, !(result == CURLE_PEER_FAILED_VERIFICATION ||
					   result == CURLE_SSL_CERTPROBLEM ||
					   result == CURLE_SSL_CACERT_BADFILE ||
					   result == CURLE_UNSUPPORTED_PROTOCOL ||
					   result == CURLE_URL_MALFORMAT),
			   "%s %s failed: %s", call->method, call->url, detail);
}

/* The HostRole of a host and owner; made if make, else NULL if none. */
static HostRole *
HostRoleOf(const char *host, Oid owner, bool make)
{
	HostRoleKey key;
	HostRole   *hr;
	bool		found;

	memset(&key, 0, sizeof(key));
	strlcpy(key.host, host, HOST_KEY);
	key.owner = owner;
	hr = hash_search(HostRoles, &key, make ? HASH_ENTER : HASH_FIND, &found);
	if (make && !found)
	{
		hr->connections = 0;
		dlist_init(&hr->waiting);
	}
	return hr;
}

/* The HostEntry of a host; made if make, else NULL if none. */
static HostEntry *
HostOf(const char *host, bool make)
{
	char		key[HOST_KEY];
	HostEntry  *h;
	bool		found;

	memset(key, 0, sizeof(key));
	strlcpy(key, host, HOST_KEY);
	h = hash_search(Hosts, key, make ? HASH_ENTER : HASH_FIND, &found);
	if (make && !found)
		h->connections = h->holders = 0;
	return h;
}

/* Forgets a HostRole with no connection and no call waiting. */
static void
HostRoleTidy(HostRole *hr)
{
	if (hr->connections == 0 && dlist_is_empty(&hr->waiting))
		(void) hash_search(HostRoles, &hr->key, HASH_REMOVE, NULL);
}

/*
 * May hr's role open another connection to its host?  While the host has
 * fewer than dwarf.http_max_host_connections, and the role holds fewer
 * than its share of them: the connections over the roles holding some,
 * itself included, plus one (at least one), as RoleShare shares the calls.
 * One role's calls, hanging or not, never hold every connection to a host:
 * another role's call there finds one.
 */
static bool
MayConnect(HostRole *hr)
{
	HostEntry  *h = HostOf(hr->key.host, false);
	int			holders = h ? h->holders : 0;
	int			share;

	if (h && h->connections >= dwarf_http_max_host_connections)
		return false;
	if (hr->connections == 0)
		holders++;
	share = Max(1, dwarf_http_max_host_connections / (holders + 1));
	return hr->connections < share;
}

/* A call takes a connection to its host (counted; curl opens it). */
static void
Connect(HttpCall *call, HostRole *hr)
{
	HostEntry  *h = HostOf(call->host, true);

	if (hr->connections++ == 0)
		h->holders++;
	h->connections++;
	call->connected = true;
}

/* A call gives its connection back. */
static void
Disconnect(HttpCall *call)
{
	HostRole   *hr = HostRoleOf(call->host, call->owner, false);
	HostEntry  *h = HostOf(call->host, false);

	call->connected = false;
	if (hr && --hr->connections == 0)
	{
		if (h)
			h->holders--;
		HostRoleTidy(hr);
	}
	if (h && --h->connections <= 0)
		(void) hash_search(Hosts, h->host, HASH_REMOVE, NULL);
}

/* A call no longer waits for a connection. */
static void
Unwait(HttpCall *call)
{
	HostRole   *hr = HostRoleOf(call->host, call->owner, false);

	call->waiting = false;
	dlist_delete(&call->wait_node);
	if (hr && dlist_is_empty(&hr->waiting))
	{
		dlist_delete(&hr->in_waiting);
		HostRoleTidy(hr);
	}
}

/*
 * A call's transfer ends: its handle leaves curl (which closes the
 * connection of a transfer not finished), its connection is given back,
 * or it waits for one no longer, and the call leaves InFlight.
 */
static void
EndTransfer(HttpCall *call)
{
	if (call->listed)
	{
		pairingheap_remove(Deadlines, &call->in_deadlines);
		dlist_delete(&call->node);
		NumInFlight--;
		call->listed = false;
	}
	if (call->waiting)
		Unwait(call);
	if (call->easy)
	{
		curl_multi_remove_handle(Multi, call->easy);
		curl_easy_cleanup(call->easy);
		call->easy = NULL;
	}
	if (call->connected)
		Disconnect(call);
	if (call->headers)
		curl_slist_free_all(call->headers);
	call->headers = NULL;
}

/* A call is done: its answer waits to be written. */
static void
MoveToDone(HttpCall *call)
{
	EndTransfer(call);
	dlist_push_tail(&Done, &call->node);
	NumDone++;
}

/*
 * Forgets a call in flight whose lease ended under it (the flow was
 * cancelled or closed, or the lease ran out): its connection is closed at
 * once, and no answer is written (none would be taken).
 */
static void
DropCall(HttpCall *call)
{
	EndTransfer(call);
	RoleAdd(call->owner, -1);
	MemoryContextDelete(call->cxt);
}

/*
 * Closes the calls in flight whose leases ended under them, when any
 * HTTP lease ended since the last look (offers.c counts them, and wakes
 * this process): a cancelled flow's calls are closed within moments of
 * the cancel, and a call whose lease ran out is closed before its next
 * attempt is claimed, so the service never has two of one step's
 * attempts open from here at once.
 */
static void
DropEndedCalls(void)
{
	uint64		ended = OffersHttpEnded();
	int64	   *leases;
	bool	   *gone;
	HttpCall  **calls;
	dlist_iter	it;
	int			n = 0,
				i;

	if (ended == SeenHttpEnded)
		return;
	SeenHttpEnded = ended;		/* read first: a later end is seen next time */
	if (NumInFlight == 0)
		return;
	leases = palloc(sizeof(int64) * NumInFlight);
	gone = palloc(sizeof(bool) * NumInFlight);
	calls = palloc(sizeof(HttpCall *) * NumInFlight);
	dlist_foreach(it, &InFlight)
	{
		calls[n] = dlist_container(HttpCall, node, it.cur);
		leases[n] = calls[n]->lease;
		n++;
	}
	LeasesEnded(leases, n, gone);
	for (i = 0; i < n; i++)
		if (gone[i])
			DropCall(calls[i]);
	pfree(leases);
	pfree(gone);
	pfree(calls);
}

/*
 * Ends, as timed out, the calls in flight past their deadline: curl's
 * timeout ends a call first, unless the call waited in curl's queue for a
 * connection, or this process was held up.  Its connection is closed
 * before its lease ends, so that its next attempt cannot overlap it.
 */
static void
EndLateCalls(void)
{
	TimestampTz now = GetCurrentTimestamp();

	while (!pairingheap_is_empty(Deadlines))
	{
		HttpCall   *call = pairingheap_container(HttpCall, in_deadlines,
												 pairingheap_first(Deadlines));

		if (call->deadline > now)
			break;
		if (call->waiting)
		{
			LeaseInfo	info;

			/* its wait does not count: its lease is kept, unless it ended */
			if (LeaseExtend(call->lease, (call->timeout_ms + DWARF_HTTP_LEASE_MARGIN_MS) * 1000,
							&info) == LEASE_HELD)
			{
				pairingheap_remove(Deadlines, &call->in_deadlines);
				call->deadline = info.lease_until - DWARF_HTTP_LEASE_MARGIN_MS * INT64CONST(1000) / 2;
				pairingheap_add(Deadlines, &call->in_deadlines);
			}
			else
				DropCall(call);
			continue;
		}
		Refuse(call, true, "%s %s timed out after " INT64_FORMAT " ms",
			   call->method, call->url, call->timeout_ms);
		MoveToDone(call);
	}
}

/* Takes the transfers curl has finished. */
static void
ReadFinished(void)
{
	CURLMsg    *msg;
	int			left;

	while ((msg = curl_multi_info_read(Multi, &left)) != NULL)
	{
		HttpCall   *call;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &call);
		Conclude(call, msg->data.result);
		MoveToDone(call);
	}
}

/* A string field of a call's object. */
static const char *
CallField(Jsonb *call, const char *key)
{
	JsonbValue *v = JsonbField(call, key);

	return v && v->type == jbvString ? pnstrdup(v->val.string.val, v->val.string.len) : NULL;
}

/*
 * The request's headers: the task's, with values taken from the flow's
 * baggage where it says so, then dwarf's own.  False (and the call
 * refused) when a header's baggage key is missing.
 */
static bool
BuildHeaders(HttpCall *call, ClaimedStep *step, const char *key)
{
	JsonbValue *headers = JsonbField(step->call, "headers");
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	k,
				v;
	struct curl_slist *list = NULL;

	if (headers && headers->type == jbvBinary)
	{
		it = JsonbIteratorInit(headers->val.binary.data);
		while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
		{
			char	   *name;
			char	   *value = NULL;

			if (tok != WJB_KEY)
				continue;
			name = pnstrdup(k.val.string.val, k.val.string.len);
			(void) JsonbIteratorNext(&it, &v, true);
			if (v.type == jbvString)
				value = pnstrdup(v.val.string.val, v.val.string.len);
			else if (v.type == jbvBinary)
			{
				Jsonb	   *from = JsonbValueToJsonb(&v);
				JsonbValue *bkey = JsonbField(from, "baggage");
				char	   *bname = bkey ? pnstrdup(bkey->val.string.val, bkey->val.string.len) : "";
				JsonbValue *found = step->baggage ? JsonbField(step->baggage, bname) : NULL;

				if (found && found->type == jbvString)
					value = pnstrdup(found->val.string.val, found->val.string.len);
				else if (found && (found->type == jbvNumeric || found->type == jbvBool))
					value = JsonbToCString(NULL, &JsonbValueToJsonb(found)->root, 0);
				if (value == NULL || strpbrk(value, "\r\n") != NULL)
				{
					curl_slist_free_all(list);
					Refuse(call, false, "header \"%s\" of HTTP task \"%s\" takes the baggage's \"%s\", which flow " INT64_FORMAT " %s",
						   name, call->task, bname, call->flow_id,
						   value ? "has with a line break" : "has not (as a string)");
					return false;
				}
			}
			if (value)
				list = curl_slist_append(list, psprintf("%s: %s", name, value));
		}
	}
	list = curl_slist_append(list, psprintf("Idempotency-Key: %s", key));
	list = curl_slist_append(list, psprintf("Dwarf-Flow: " INT64_FORMAT, step->key.flow_id));
	list = curl_slist_append(list, psprintf("Dwarf-Task: %s", step->task));
	list = curl_slist_append(list, psprintf("Dwarf-Attempt: %d", step->attempt));
	list = curl_slist_append(list, "Content-Type: application/json");
	list = curl_slist_append(list, "Accept: application/json");
	list = curl_slist_append(list, "Expect:");	/* no 100-continue round trip */
	call->headers = list;
	return true;
}

/*
 * Sets an option of a transfer being set up, unless one already failed:
 * then *failed names that one.
 */
#define SET_OPTION(easy, failed, option, value) \
	do { \
		if ((failed) == NULL && curl_easy_setopt(easy, option, value) != CURLE_OK) \
			(failed) = #option; \
	} while (0)

/*
 * Starts a call's transfer (a call in flight, holding a connection to its
 * host): exactly its URL (in normal form: CURLOPT_PATH_AS_IS
 * keeps curl from changing the path), no proxy whatever the server's
 * environment says (http_proxy and the like), no redirects, TLS verified.
 * A call whose options curl refuses fails without a request.
 */
static void
StartTransfer(HttpCall *call)
{
	CURL	   *easy = curl_easy_init();
	const char *failed = NULL;

	if (easy == NULL)
	{
		Refuse(call, true, "%s %s failed: curl could not start a transfer", call->method, call->url);
		MoveToDone(call);
		return;
	}
	SET_OPTION(easy, failed, CURLOPT_URL, call->url);
	SET_OPTION(easy, failed, CURLOPT_PATH_AS_IS, 1L);
	SET_OPTION(easy, failed, CURLOPT_PROXY, "");
	SET_OPTION(easy, failed, CURLOPT_PRIVATE, call);
	SET_OPTION(easy, failed, CURLOPT_PROTOCOLS_STR, "http,https");
	SET_OPTION(easy, failed, CURLOPT_FOLLOWLOCATION, 0L);
	SET_OPTION(easy, failed, CURLOPT_SSL_VERIFYPEER, 1L);
	SET_OPTION(easy, failed, CURLOPT_SSL_VERIFYHOST, 2L);
	SET_OPTION(easy, failed, CURLOPT_NOSIGNAL, 1L);
	SET_OPTION(easy, failed, CURLOPT_TIMEOUT_MS, (long) call->timeout_ms);
	SET_OPTION(easy, failed, CURLOPT_MAXFILESIZE_LARGE,
			   (curl_off_t) dwarf_http_max_response * 1024);
	SET_OPTION(easy, failed, CURLOPT_HTTPHEADER, call->headers);
	SET_OPTION(easy, failed, CURLOPT_USERAGENT, "dwarf");
	SET_OPTION(easy, failed, CURLOPT_ERRORBUFFER, call->errbuf);
	SET_OPTION(easy, failed, CURLOPT_WRITEFUNCTION, WriteCallback);
	SET_OPTION(easy, failed, CURLOPT_WRITEDATA, call);
	SET_OPTION(easy, failed, CURLOPT_HEADERFUNCTION, HeaderCallback);
	SET_OPTION(easy, failed, CURLOPT_HEADERDATA, call);
	if (strcmp(call->method, "GET") == 0)
		SET_OPTION(easy, failed, CURLOPT_HTTPGET, 1L);
	else
	{
		if (strcmp(call->method, "POST") != 0)
			SET_OPTION(easy, failed, CURLOPT_CUSTOMREQUEST, call->method);
		if (call->body)
		{
			SET_OPTION(easy, failed, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) strlen(call->body));
			SET_OPTION(easy, failed, CURLOPT_POSTFIELDS, call->body);
		}
	}
	if (failed)
	{
		curl_easy_cleanup(easy);
		Refuse(call, false, "%s %s was not called: curl refused its option %s",
			   call->method, call->url, failed);
		MoveToDone(call);
		return;
	}
	call->easy = easy;
	if (curl_multi_add_handle(Multi, easy) != CURLM_OK)
	{
		Refuse(call, true, "%s %s failed: curl could not start a transfer", call->method, call->url);
		MoveToDone(call);
	}
}

/*
 * A prepared call goes in flight: its transfer starts if its role may open
 * a connection to its host (MayConnect) and none of the role's calls there
 * waits before it; else it waits for one, in its role's own line.
 */
static void
Admit(HttpCall *call)
{
	HostRole   *hr = HostRoleOf(call->host, call->owner, true);

	dlist_push_tail(&InFlight, &call->node);
	NumInFlight++;
	pairingheap_add(Deadlines, &call->in_deadlines);
	call->listed = true;
	if (dlist_is_empty(&hr->waiting) && MayConnect(hr))
	{
		Connect(call, hr);
		StartTransfer(call);
		return;
	}
	if (dlist_is_empty(&hr->waiting))
		dlist_push_tail(&WaitingHosts, &hr->in_waiting);
	dlist_push_tail(&hr->waiting, &call->wait_node);
	call->waiting = true;
}

/*
 * Starts the waiting calls that may have a connection now, host by host,
 * each role's in the order they came.  Its lease and its timeout start
 * over as its transfer starts (LeaseExtend): the wait did not count.  A
 * call whose lease ended while it waited is forgotten.
 */
static void
StartWaitingCalls(void)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, &WaitingHosts)
	{
		HostRoleKey key = dlist_container(HostRole, in_waiting, iter.cur)->key;
		HostRole   *hr;

		while ((hr = hash_search(HostRoles, &key, HASH_FIND, NULL)) != NULL &&
			   !dlist_is_empty(&hr->waiting) && MayConnect(hr))
		{
			HttpCall   *call = dlist_container(HttpCall, wait_node,
											   dlist_head_node(&hr->waiting));
			LeaseInfo	info;

			if (LeaseExtend(call->lease, (call->timeout_ms + DWARF_HTTP_LEASE_MARGIN_MS) * 1000,
							&info) != LEASE_HELD)
			{
				DropCall(call);
				continue;
			}
			Unwait(call);
			pairingheap_remove(Deadlines, &call->in_deadlines);
			call->deadline = info.lease_until - DWARF_HTTP_LEASE_MARGIN_MS * INT64CONST(1000) / 2;
			pairingheap_add(Deadlines, &call->in_deadlines);
			Connect(call, HostRoleOf(call->host, call->owner, true));
			StartTransfer(call);
		}
	}
}

/* The oid of dwarf.http_call(text), in a transaction; InvalidOid if none. */
static Oid
HttpCallFunction(void)
{
	Oid			argtypes[1] = {TEXTOID};

	return LookupFuncName(list_make2(makeString("dwarf"), makeString("http_call")),
						  1, argtypes, true);
}

/* A call for a claimed step: what the step says, nothing prepared yet. */
static HttpCall *
NewCall(ClaimedStep *step)
{
	MemoryContext cxt = AllocSetContextCreate(CallsContext, "dwarf http call",
											  ALLOCSET_SMALL_SIZES);
	HttpCall   *call = MemoryContextAllocZero(cxt, sizeof(HttpCall));

	call->cxt = cxt;
	call->lease = step->lease;
	call->flow_id = step->key.flow_id;
	call->owner = step->owner;
	strlcpy(call->task, step->task, NAMEDATALEN);
	call->retry_after = -1;
	call->deadline = step->lease_until - DWARF_HTTP_LEASE_MARGIN_MS * INT64CONST(1000) / 2;
	return call;
}

/*
 * Fills call->host from its URL in normal form: its scheme and authority
 * (scheme://host[:port], the default port dropped), what connections to a
 * host are counted by.  False if the URL has none.
 */
static bool
HostKey(HttpCall *call)
{
	const char *start = strstr(call->url, "://");
	const char *end;

	if (start == NULL || start[3] == '\0' || start[3] == '/')
		return false;
	end = strchr(start + 3, '/');
	strlcpy(call->host, call->url,
			Min(HOST_KEY, (end ? end - call->url : (ptrdiff_t) strlen(call->url)) + 1));
	return true;
}

/*
 * Prepares the call of a claimed step, in the claim's transaction (fn is
 * dwarf.http_call's oid): its URL in normal form, checked against
 * dwarf.http_allow, the owner's EXECUTE on fn, the headers and the body.
 * A call that may not be made is refused (call->message set).
 */
static HttpCall *
PrepareCall(ClaimedStep *step, Oid fn)
{
	HttpCall   *call = NewCall(step);
	MemoryContext old = MemoryContextSwitchTo(call->cxt);
	char	   *key;
	char	   *normal;
	const char *why;

	call->method = CallField(step->call, "method");
	call->url = CallField(step->call, "url");
	call->timeout_ms = DatumGetInt64(DirectFunctionCall1(numeric_int8,
														 NumericGetDatum(JsonbField(step->call, "timeout_ms")->val.numeric)));
	initStringInfo(&call->response);
	key = text_to_cstring(ClaimedStepKey(step));
	if ((normal = UrlNormalize(call->url, &why)) == NULL)
		Refuse(call, false, "%s cannot be called: %s", call->url, why);
	else if (!UrlAllowed(call->url = normal))
		Refuse(call, false, "%s is not inside dwarf.http_allow: HTTP task \"%s\" may not call it",
			   call->url, call->task);
	else if (!HostKey(call))
		Refuse(call, false, "%s cannot be called: it names no host", call->url);
	else if (!OidIsValid(fn) || object_aclcheck(ProcedureRelationId, fn, step->owner, ACL_EXECUTE) != ACLCHECK_OK)
		Refuse(call, false, "the owner of flow " INT64_FORMAT " (%s) may not make HTTP calls: it needs EXECUTE on dwarf.http_call(text)",
			   call->flow_id, GetUserNameFromId(step->owner, true) ?
			   GetUserNameFromId(step->owner, true) : "a dropped role");
	else if (BuildHeaders(call, step, key) &&
			 strcmp(call->method, "GET") != 0 && strcmp(call->method, "DELETE") != 0)
		call->body = JsonbToCString(NULL, &step->input->root, VARSIZE(step->input));
	MemoryContextSwitchTo(old);
	return call;
}

/*
 * How many calls may be held at once: dwarf.http_max_in_flight, and no
 * more than dwarf.http_max_response_memory has room for, each call holding
 * dwarf.http_max_response for its answer from its start (at least one).
 * So the answers' memory is bounded up front, in all and (RoleShare) per
 * role.
 */
static int
SlotLimit(void)
{
	return Min(dwarf_http_max_in_flight,
			   Max(1, dwarf_http_max_response_memory / dwarf_http_max_response));
}

/* The calls owner holds now. */
static int
CallsOf(Oid owner)
{
	RoleCallsEntry *e = hash_search(RoleCalls, &owner, HASH_FIND, NULL);

	return e ? e->calls : 0;
}

/*
 * The most calls owner may hold while it starts another: the calls at once
 * over the roles holding calls, itself included, plus one (at least one
 * call), as limits.c shares dwarf.max_limit_keys.  While every role keeps
 * within its share, a role that holds none finds room for its first ones:
 * one role's backlog never takes every slot.
 */
static int
RoleShare(Oid owner)
{
	long		holders = hash_get_num_entries(RoleCalls);

	if (CallsOf(owner) == 0)
		holders++;
	return Max(1, SlotLimit() / (int) (holders + 1));
}

/*
 * Logs, at most once per LOG_EVERY_MS and with a count of the times since,
 * that steps ready wait because role holds its share of the calls at once
 * (InvalidOid: because every call is held).  Names the settings.
 */
static void
LogWait(Oid role)
{
	static TimestampTz logged = 0;
	static int	times = 0;
	TimestampTz now = GetCurrentTimestamp();
	const char *why;

	times++;
	if (logged != 0 && now < logged + LOG_EVERY_MS * INT64CONST(1000))
		return;
	why = SlotLimit() < dwarf_http_max_in_flight ?
		psprintf("dwarf.http_max_response_memory (%d kB) has room for %d answers of dwarf.http_max_response (%d kB)",
				 dwarf_http_max_response_memory, SlotLimit(), dwarf_http_max_response) :
		psprintf("dwarf.http_max_in_flight is %d", dwarf_http_max_in_flight);
	if (OidIsValid(role))
		ereport(LOG,
				(errmsg("dwarf: HTTP steps of role %u wait: it holds its share of %d calls at once (%d times in %d s)",
						role, RoleShare(role), times, LOG_EVERY_MS / 1000),
				 errdetail("%s; the roles holding calls share them.", why)));
	else
		ereport(LOG,
				(errmsg("dwarf: HTTP steps wait: %d calls are in flight (%d times in %d s)",
						SlotLimit(), times, LOG_EVERY_MS / 1000),
				 errdetail("%s.", why)));
	logged = now;
	times = 0;
}

/* owner holds n more calls (n < 0: fewer); a role holding none is forgotten. */
static void
RoleAdd(Oid owner, int n)
{
	bool		found;
	RoleCallsEntry *e = hash_search(RoleCalls, &owner, HASH_ENTER, &found);

	if (!found)
		e->calls = 0;
	e->calls += n;
	if (e->calls <= 0)
		(void) hash_search(RoleCalls, &owner, HASH_REMOVE, NULL);
}

/* Notes that owner has steps ready (once). */
static void
ReadyAdd(Oid owner)
{
	int			i;

	for (i = 0; i < NumReady; i++)
		if (ReadyRoles[i] == owner)
			return;
	if (NumReady == ReadySize)
	{
		ReadySize = Max(16, ReadySize * 2);
		ReadyRoles = ReadyRoles ?
			repalloc(ReadyRoles, sizeof(Oid) * ReadySize) :
			MemoryContextAlloc(TopMemoryContext, sizeof(Oid) * ReadySize);
	}
	ReadyRoles[NumReady++] = owner;
}

/* Forgets that owner has steps ready (until a look finds some again). */
static void
ReadyRemove(Oid owner)
{
	int			i;

	for (i = 0; i < NumReady; i++)
		if (ReadyRoles[i] == owner)
		{
			ReadyRoles[i] = ReadyRoles[--NumReady];
			return;
		}
}

/*
 * Reads the whole queue for the roles with steps ready (an OffersClaim for
 * no owner claims nothing, and returns every owner it met).  One pass over
 * the ready steps: done when no role is known to have any, else at most
 * every LOOK_MS, so that a role whose steps wait behind another's backlog
 * is found within LOOK_MS.
 */
static void
LookForRoles(void)
{
	Oid		   *seen;
	int			nseen;
	int			i;

	(void) OffersClaim(DWARF_HTTP_QUEUE, 1, 0, NULL, 0, false, &seen, &nseen, NULL, NULL);
	NumReady = 0;
	for (i = 0; i < nseen; i++)
		ReadyAdd(seen[i]);
	pfree(seen);
	LookDue = GetCurrentTimestamp() + LOOK_MS * INT64CONST(1000);
}

/*
 * Claims offered HTTP steps, role by role, and starts their calls.  Calls
 * are not taken first come, first served across roles: each role with
 * steps ready takes, in turn, up to its share (RoleShare) of the calls at
 * once, so one role's backlog waits in its own line while another role's
 * step is claimed at once.  A short transaction reads what the calls need
 * of the catalogs (the owners' EXECUTE on dwarf.http_call, the step keys,
 * the limits' settings); it ends before any call starts.  A step that may
 * not be called is answered as failed.  An error while the calls are
 * prepared loses no claimed step: each is answered as a failed attempt (to
 * be retried, the policy permitting) that says why, rather than left to
 * its lease.
 */
static void
ClaimAndStart(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int room = SlotLimit() - NumInFlight - NumDone;
	Oid		   *turns;
	int			nturns;
	List	   *volatile claimed = NIL;
	List	   *volatile calls = NIL;
	ListCell   *lc;
	int			i;
	uint64		ended = OffersHttpEnded();

	LookWake = 0;
	if (!OffersHasReady(DWARF_HTTP_QUEUE))
	{
		NumReady = 0;
		return;
	}
	if (room <= 0)
	{
		LogWait(InvalidOid);
		return;
	}
	if (NumReady == 0 || GetCurrentTimestamp() >= LookDue)
		LookForRoles();

	/* the roles below their shares, in turn from NextTurn */
	turns = palloc(sizeof(Oid) * Max(NumReady, 1));
	nturns = 0;
	for (i = 0; i < NumReady; i++)
	{
		Oid			owner = ReadyRoles[(i + NextTurn) % NumReady];

		if (CallsOf(owner) < RoleShare(owner))
			turns[nturns++] = owner;
		else
			LogWait(owner);
	}
	NextTurn++;
	if (NumReady > 0)
		LookWake = LookDue;		/* a role not seen yet may wait behind them */
	if (nturns == 0)
		return;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	PG_TRY();
	{
		Oid			fn;

		LimitDue = 0;
		for (i = 0; i < nturns && room > 0; i++)
		{
			Oid			owner = turns[i];
			int			want = Min(room, RoleShare(owner) - CallsOf(owner));
			Oid		   *seen;
			int			nseen;
			int			j;
			TimestampTz due;
			List	   *more;

			if (want <= 0)
				continue;
			more = ClaimOffered(DWARF_HTTP_QUEUE, want, 0, &owner, 1, false, &seen, &nseen, &due);
			if (due > 0 && (LimitDue == 0 || due < LimitDue))
				LimitDue = due;
			for (j = 0; j < nseen; j++)
				ReadyAdd(seen[j]);
			if (list_length(more) < want)
				ReadyRemove(owner); /* none left that it may claim now */
			RoleAdd(owner, list_length(more));
			room -= list_length(more);
			claimed = list_concat(claimed, more);
		}
		fn = claimed ? HttpCallFunction() : InvalidOid;
		foreach(lc, claimed)
		{
			HttpCall   *call = PrepareCall(lfirst(lc), fn);
			MemoryContext old = MemoryContextSwitchTo(cxt);

			calls = lappend(calls, call);
			MemoryContextSwitchTo(old);
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		i = 0;
		foreach(lc, claimed)
		{
			HttpCall   *call = i < list_length(calls) ? list_nth(calls, i) : NewCall(lfirst(lc));

			if (call->message == NULL)
				Refuse(call, true, "the HTTP process could not prepare the call of task \"%s\": %s",
					   call->task, edata->message);
			if (i++ >= list_length(calls))
				calls = lappend(calls, call);
		}
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("dwarf: could not prepare %d HTTP calls: %s", list_length(claimed),
						edata->message),
				 errdetail("Each is answered as a failed attempt.")));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	DropEndedCalls();			/* an earlier attempt of one of these: closed first */
	foreach(lc, calls)
	{
		HttpCall   *call = lfirst(lc);

		if (call->message == NULL)
			Admit(call);
		else
		{
			if (call->headers)	/* prepared, then refused by an error */
				curl_slist_free_all(call->headers);
			call->headers = NULL;
			dlist_push_tail(&Done, &call->node);
			NumDone++;
		}
	}

	/*
	 * A lease of these that ended since its claim (its flow cancelled
	 * meanwhile) was not seen above, before they were in flight: look
	 * again, before curl sends a byte.
	 */
	if (OffersHttpEnded() != ended)
	{
		SeenHttpEnded = ended;
		DropEndedCalls();
	}
}

/* A failed call's error, as dwarf.fail writes one (its worker names the task). */
static Jsonb *
CallError(HttpCall *call)
{
	const char *keys[5] = {"message", "retryable", "task", "status", "retry_after"};
	JsonbValue	values[5];
	int			n = 3;

	values[0].type = jbvString;
	values[0].val.string.val = call->message;
	values[0].val.string.len = strlen(call->message);
	values[1].type = jbvBool;
	values[1].val.boolean = call->retryable;
	values[2].type = jbvNull;
	if (call->status)
	{
		values[n].type = jbvNumeric;
		values[n++].val.numeric = int64_to_numeric(call->status);
	}
	if (call->retry_after >= 0)
	{
		keys[n] = "retry_after";
		values[n].type = jbvNumeric;
		values[n++].val.numeric = int64_to_numeric(call->retry_after);
	}
	return JsonbWithKeys(JsonbEmptyObject(), n, keys, values);
}

/* Writes one call's answer, in the current transaction, if its lease holds. */
static void
WriteCallAnswer(HttpCall *call)
{
	LeaseInfo	info;

	if (LeaseLookup(call->lease, &info) != LEASE_HELD)
		return;					/* the flow closed, was cancelled, or the lease ran out */
	if (call->completed)
		WriteAnswer(call->lease, "completed", call->changes, NULL, true, "an HTTP call");
	else
		WriteAnswer(call->lease, "failed", NULL, CallError(call), call->retryable, "an HTTP call");
}

/* Forgets a call whose answer is written (or given up). */
static void
FreeCall(HttpCall *call)
{
	dlist_delete(&call->node);
	NumDone--;
	RoleAdd(call->owner, -1);
	MemoryContextDelete(call->cxt);
}

/* Writes one call's answer in a transaction of its own; logs an error. */
static void
WriteAnswerAlone(HttpCall *call)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		WriteCallAnswer(call);
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
}

/*
 * Writes the answers of finished calls, up to ANSWER_BATCH in one
 * transaction.  If that transaction fails, each is written in one of its
 * own, and one that fails alone is given up: its lease runs out, and the
 * task's retry policy decides.
 */
static void
WriteAnswers(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	dlist_mutable_iter iter;
	dlist_iter	it;
	volatile bool failed = false;
	int			n = 0;

	if (dlist_is_empty(&Done))
		return;
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		dlist_foreach(it, &Done)
		{
			if (n++ >= ANSWER_BATCH)
				break;
			WriteCallAnswer(dlist_container(HttpCall, node, it.cur));
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		EmitErrorReport();
		FlushErrorState();
		AbortCurrentTransaction();
		failed = true;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	n = 0;
	dlist_foreach_modify(iter, &Done)
	{
		HttpCall   *call = dlist_container(HttpCall, node, iter.cur);

		if (n++ >= ANSWER_BATCH)
			break;
		if (failed)
			WriteAnswerAlone(call);
		FreeCall(call);
	}
}

/*
 * Lets curl act on its sockets that are ready: up to SOCKET_EVENTS of
 * them, without waiting (the rest stay ready for the next call).
 */
static void
ActOnSockets(void)
{
	struct epoll_event events[SOCKET_EVENTS];
	int			running;
	int			n,
				i;

	n = epoll_wait(Epoll, events, SOCKET_EVENTS, 0);
	if (n < 0 && errno != EINTR)
		ereport(ERROR,
				(errcode_for_socket_access(),
				 errmsg("dwarf: could not wait on HTTP calls' sockets: %m")));
	for (i = 0; i < n; i++)
	{
		int			flags = 0;

		if (events[i].events & (EPOLLIN | EPOLLHUP))
			flags |= CURL_CSELECT_IN;
		if (events[i].events & EPOLLOUT)
			flags |= CURL_CSELECT_OUT;
		if (events[i].events & EPOLLERR)
			flags |= CURL_CSELECT_ERR;
		curl_multi_socket_action(Multi, events[i].data.fd, flags, &running);
	}
}

/* The sooner of two times, where 0 is never. */
static TimestampTz
Sooner(TimestampTz a, TimestampTz b)
{
	return a == 0 ? b : b == 0 ? a : Min(a, b);
}

/*
 * Waits for the latch (an offer, a signal), curl's sockets, curl's next
 * timeout, a call's deadline, or the next look at the queue; then lets
 * curl act on what happened.
 */
static void
WaitAndAct(void)
{
	WaitEvent	events[3];
	long		timeout = -1;
	int			running;
	int			n,
				i;
	TimestampTz due = Sooner(Sooner(CurlDue, LimitDue), LookWake);

	if (!pairingheap_is_empty(Deadlines))
		due = Sooner(due, pairingheap_container(HttpCall, in_deadlines,
												pairingheap_first(Deadlines))->deadline);
	if (due > 0)
	{
		TimestampTz now = GetCurrentTimestamp();

		timeout = due <= now ? 0 : TimestampDifferenceMilliseconds(now, due) + 1;
		if (LimitDue > 0 && LimitDue <= now)
			LimitDue = 0;		/* the claim that follows looks again */
	}
	n = WaitEventSetWait(WaitSet, timeout, events, lengthof(events), PG_WAIT_EXTENSION);
	for (i = 0; i < n; i++)
	{
		if (events[i].events & WL_LATCH_SET)
			ResetLatch(MyLatch);
		else if (events[i].events & WL_SOCKET_READABLE)
			ActOnSockets();
	}
	if (CurlDue > 0 && CurlDue <= GetCurrentTimestamp())
	{
		CurlDue = 0;
		curl_multi_socket_action(Multi, CURL_SOCKET_TIMEOUT, 0, &running);
	}
	ReadFinished();
	EndLateCalls();
}

/* Exits when dwarf is not installed in this database (or was dropped). */
static void
ExitIfNoExtension(void)
{
	Oid			extension;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	extension = get_extension_oid("dwarf", true);
	if (OidIsValid(extension))
	{
		LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
		extension = get_extension_oid("dwarf", true);
	}
	CommitTransactionCommand();
	if (!OidIsValid(extension))
	{
		Slot->no_extension = true;
		proc_exit(0);
	}
}

/* Deadlines' order: the soonest first (pairingheap puts the greatest first). */
static int
DeadlineFirst(const pairingheap_node *a, const pairingheap_node *b, void *arg)
{
	TimestampTz da = pairingheap_const_container(HttpCall, in_deadlines, a)->deadline;
	TimestampTz db = pairingheap_const_container(HttpCall, in_deadlines, b)->deadline;

	return da < db ? 1 : da > db ? -1 : 0;
}

/* Sets up libcurl's multi handle, and room for thousands of sockets. */
static void
HttpInit(void)
{
	struct rlimit limit;
	HASHCTL		ctl;

	/* as many sockets as the process may have */
	if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max)
	{
		limit.rlim_cur = limit.rlim_max;
		(void) setrlimit(RLIMIT_NOFILE, &limit);
	}
	LoadCurl();
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		ereport(FATAL,
				(errmsg("dwarf: could not initialize libcurl")));
	Multi = curl_multi_init();
	if (Multi == NULL)
		ereport(FATAL,
				(errmsg("dwarf: could not initialize libcurl")));
	if (curl_multi_setopt(Multi, CURLMOPT_SOCKETFUNCTION, SocketCallback) != CURLM_OK ||
		curl_multi_setopt(Multi, CURLMOPT_TIMERFUNCTION, TimerCallback) != CURLM_OK ||
		curl_multi_setopt(Multi, CURLMOPT_MAX_HOST_CONNECTIONS,
						  (long) dwarf_http_max_host_connections) != CURLM_OK ||
		curl_multi_setopt(Multi, CURLMOPT_MAXCONNECTS,
						  (long) Min(dwarf_http_max_in_flight, 10000)) != CURLM_OK)
		ereport(FATAL,
				(errmsg("dwarf: libcurl refused the settings of HTTP calls")));

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(curl_socket_t);
	ctl.entrysize = sizeof(curl_socket_t);
	Sockets = hash_create("dwarf http sockets", 1024, &ctl, HASH_ELEM | HASH_BLOBS);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(RoleCallsEntry);
	RoleCalls = hash_create("dwarf http roles", 64, &ctl, HASH_ELEM | HASH_BLOBS);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = HOST_KEY;
	ctl.entrysize = sizeof(HostEntry);
	Hosts = hash_create("dwarf http hosts", 64, &ctl, HASH_ELEM | HASH_BLOBS);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(HostRoleKey);
	ctl.entrysize = sizeof(HostRole);
	HostRoles = hash_create("dwarf http host roles", 64, &ctl, HASH_ELEM | HASH_BLOBS);
	Epoll = epoll_create1(EPOLL_CLOEXEC);
	if (Epoll < 0)
		ereport(FATAL,
				(errcode_for_socket_access(),
				 errmsg("dwarf: could not create an epoll set for HTTP calls: %m")));
	WaitSet = CreateWaitEventSet(NULL, 3);
	AddWaitEventToSet(WaitSet, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(WaitSet, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	AddWaitEventToSet(WaitSet, WL_SOCKET_READABLE, Epoll, NULL, NULL);
	CallsContext = AllocSetContextCreate(TopMemoryContext, "dwarf http calls",
										 ALLOCSET_DEFAULT_SIZES);
	Deadlines = MemoryContextAllocZero(TopMemoryContext, sizeof(pairingheap));
	Deadlines->ph_compare = DeadlineFirst;
	Deadlines->ph_arg = NULL;
	Deadlines->ph_root = NULL;
}

/*
 * Entry point of the HTTP process of a database.  bgw_main_arg is its
 * worker slot (index DWARF_HTTP_INDEX), which the launcher filled.  It
 * exits once dwarf.http_allow is empty and no call is in flight.
 */
void
DwarfHttpMain(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;
	MemoryContext loop_cxt;

	Slot = &Dwarf->workers[DatumGetInt32(arg)];
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(Slot->dboid, InvalidOid, 0);
	pgstat_report_appname("dwarf http");
	ExitIfNoExtension();
	SpinLockAcquire(&Slot->mutex);
	Slot->pid = MyProcPid;
	SpinLockRelease(&Slot->mutex);
	HttpInit();
	loop_cxt = AllocSetContextCreate(TopMemoryContext, "dwarf http loop", ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("dwarf http process started")));

	/* An error outside a batch of answers: what it was doing is lost. */
	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
	{
		HOLD_INTERRUPTS();
		EmitErrorReport();
		AbortCurrentTransaction();
		FlushErrorState();
		MemoryContextSwitchTo(TopMemoryContext);
		RESUME_INTERRUPTS();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1000,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (curl_multi_setopt(Multi, CURLMOPT_MAX_HOST_CONNECTIONS,
								  (long) dwarf_http_max_host_connections) != CURLM_OK)
				ereport(WARNING,
						(errmsg("dwarf: libcurl refused dwarf.http_max_host_connections = %d",
								dwarf_http_max_host_connections)));
		}
		MemoryContextSwitchTo(loop_cxt);
		WriteAnswers();
		MemoryContextSwitchTo(loop_cxt);
		if (dwarf_http_allow[0] == '\0' && NumInFlight == 0 && NumDone == 0)
		{
			ereport(LOG, (errmsg("dwarf http process exits: dwarf.http_allow is empty")));
			proc_exit(0);
		}

		/* claims after the watch starts: no offer goes unseen */
		OffersWatch(DWARF_HTTP_QUEUE);
		DropEndedCalls();
		if (!dlist_is_empty(&WaitingHosts))
			StartWaitingCalls();
		ClaimAndStart();
		MemoryContextSwitchTo(loop_cxt);
		if (NumDone == 0)
			WaitAndAct();
		MemoryContextSwitchTo(TopMemoryContext);
		MemoryContextReset(loop_cxt);
	}
}
