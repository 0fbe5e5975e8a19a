/*
 * url.c
 *		HTTP tasks' URLs: one normal form, and the dwarf.http_allow check.
 *
 * A prefix compared with the URL as written is no gate: with
 * "http://host/v1/" allowed, "http://host/v1/../admin" is a request for
 * /admin (curl, and any server, resolves the dot-segments), and so is
 * "http://host/v1/%2e%2e/admin" for most servers.  So every URL is brought
 * to one normal form (RFC 3986, section 6.2.2) before it is compared, and
 * the normal form is what the HTTP process sends, byte for byte: scheme and
 * host in lower case, a default port (80, 443) dropped, percent-encoded
 * unreserved characters decoded and the other escapes' hex digits in
 * capitals, dot-segments removed (those written as %2e included), an empty
 * path made "/", and the fragment (never sent) dropped.  What cannot be put
 * in that form is refused with the reason: user information
 * ("user:password@host"), a character that must be percent-encoded, a bad
 * escape, a host that is not a plain name or an IP literal, a dot-segment
 * hidden behind an encoded slash ("..%2F").
 *
 * dwarf.http_allow's prefixes are brought to the same form, and a URL is
 * inside a prefix only at a boundary: the prefix ends with "/", or the URL
 * goes on with "/" or "?" or not at all ("http://host/v1" allows
 * "http://host/v1/x", not "http://host/v1x"; "http://host" is
 * "http://host/" and no longer allows "http://host.evil.net").
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#include "dwarf.h"
#include "url.h"

/* Is c unreserved (RFC 3986, 2.3): never needs an escape, means itself? */
static bool
Unreserved(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		c == '-' || c == '.' || c == '_' || c == '~';
}

/* The value of a hex digit, or -1. */
static int
HexValue(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * Appends src[0..len) to buf with its escapes normalized: an escaped
 * unreserved character decoded, any other escape's hex digits in capitals.
 * False on an escape that is not "%" and two hex digits.
 */
static bool
AppendNormalEscapes(StringInfo buf, const char *src, int len)
{
	int			i;

	for (i = 0; i < len; i++)
	{
		int			hi,
					lo;

		if (src[i] != '%')
		{
			appendStringInfoChar(buf, src[i]);
			continue;
		}
		if (i + 2 >= len)
			return false;
		hi = HexValue(src[i + 1]);
		lo = HexValue(src[i + 2]);
		if (hi < 0 || lo < 0)
			return false;
		if (Unreserved((unsigned char) (hi * 16 + lo)))
			appendStringInfoChar(buf, (char) (hi * 16 + lo));
		else
			appendStringInfo(buf, "%%%02X", hi * 16 + lo);
		i += 2;
	}
	return true;
}

/*
 * RFC 3986's remove_dot_segments (5.2.4) of an absolute path, into out:
 * "." and ".." segments are resolved, a ".." above the root is dropped.
 */
static void
RemoveDotSegments(StringInfo out, const char *path)
{
	const char *in = path;

	while (*in)
	{
		if (strncmp(in, "../", 3) == 0)
			in += 3;
		else if (strncmp(in, "./", 2) == 0)
			in += 2;
		else if (strncmp(in, "/./", 3) == 0)
			in += 2;
		else if (strcmp(in, "/.") == 0)
		{
			appendStringInfoChar(out, '/');
			in += 2;
		}
		else if (strncmp(in, "/../", 4) == 0 || strcmp(in, "/..") == 0)
		{
			char	   *last = out->len > 0 ? strrchr(out->data, '/') : NULL;

			if (last)
			{
				out->len = last - out->data;
				out->data[out->len] = '\0';
			}
			if (in[3] == '\0')
				appendStringInfoChar(out, '/');
			in += 3;
		}
		else if (strcmp(in, ".") == 0 || strcmp(in, "..") == 0)
			in += strlen(in);
		else
		{
			const char *next = strchr(in + 1, '/');
			int			n = next ? next - in : strlen(in);

			appendBinaryStringInfo(out, in, n);
			in += n;
		}
	}
}

/*
 * Does a normal path hide a dot-segment behind an encoded separator (as
 * "..%2Fadmin" or "%2E%2E%5C")?  A server that decodes %2F or %5C before
 * it resolves dot-segments would leave the allowed prefix.
 */
static bool
HiddenDotSegment(const char *path)
{
	const char *piece = path;
	const char *p = path;

	for (;;)
	{
		int			sep = (*p == '/' || *p == '\0') ? 1 :
			(strncmp(p, "%2F", 3) == 0 || strncmp(p, "%5C", 3) == 0) ? 3 : 0;

		if (sep == 0)
		{
			p++;
			continue;
		}
		if ((p - piece == 1 && piece[0] == '.') ||
			(p - piece == 2 && piece[0] == '.' && piece[1] == '.'))
			return true;
		if (*p == '\0')
			return false;
		p += sep;
		piece = p;
	}
}

/*
 * The normal form of an HTTP task's URL (see the file's comment), palloc'd;
 * or NULL, with *why saying why it has none (a phrase: "it has user
 * information ...").  Never raises an error, so that the setting's check
 * may call it.
 */
char *
UrlNormalize(const char *url, const char **why)
{
	StringInfoData out;
	StringInfoData path;
	StringInfoData resolved;
	const char *p;
	const char *authority;
	const char *host_end;
	const char *end;
	bool		https;
	long		port = -1;

	if (strlen(url) > DWARF_MAX_URL)
	{
		*why = psprintf("it is longer than %d characters", DWARF_MAX_URL);
		return NULL;
	}
	for (p = url; *p; p++)
		if ((unsigned char) *p <= ' ' || (unsigned char) *p >= 0x7f || strchr("\"<>\\^`{|}", *p))
		{
			*why = "it has a space, a control character or another character that must be percent-encoded";
			return NULL;
		}
	if (pg_strncasecmp(url, "http://", 7) == 0)
		https = false;
	else if (pg_strncasecmp(url, "https://", 8) == 0)
		https = true;
	else
	{
		*why = "it is not an http:// or https:// URL";
		return NULL;
	}
	authority = url + (https ? 8 : 7);
	end = authority + strcspn(authority, "/?#");
	if (memchr(authority, '@', end - authority) != NULL)
	{
		*why = "it has user information (\"user:password@\"), which HTTP tasks may not send (give credentials in a header)";
		return NULL;
	}

	initStringInfo(&out);
	appendStringInfoString(&out, https ? "https://" : "http://");

	/* the host: a name, or an IP literal in brackets; in lower case */
	if (authority[0] == '[')
	{
		host_end = memchr(authority, ']', end - authority);
		if (host_end == NULL || host_end == authority + 1 ||
			strspn(authority + 1, "0123456789abcdefABCDEF:.") != (size_t) (host_end - authority - 1))
		{
			*why = "its host is not an IP literal (\"[::1]\")";
			return NULL;
		}
		host_end++;
	}
	else
	{
		host_end = authority;
		while (host_end < end && *host_end != ':')
		{
			if (!Unreserved((unsigned char) *host_end))
			{
				*why = "its host is not a name of letters, digits, \".\", \"-\", \"_\" and \"~\"";
				return NULL;
			}
			host_end++;
		}
		if (host_end == authority)
		{
			*why = "it has no host";
			return NULL;
		}
	}
	for (p = authority; p < host_end; p++)
		appendStringInfoChar(&out, pg_tolower((unsigned char) *p));

	/* the port: digits, dropped when empty or the scheme's own */
	if (host_end < end)
	{
		if (*host_end != ':')
		{
			*why = "its host is followed by something other than a port";
			return NULL;
		}
		for (p = host_end + 1; p < end; p++)
		{
			if (*p < '0' || *p > '9')
			{
				*why = "its port is not a number";
				return NULL;
			}
			port = (port < 0 ? 0 : port) * 10 + (*p - '0');
			if (port > 65535)
			{
				*why = "its port is past 65535";
				return NULL;
			}
		}
		if (port == 0)
		{
			*why = "its port is 0";
			return NULL;
		}
	}
	if (port > 0 && port != (https ? 443 : 80))
		appendStringInfo(&out, ":%ld", port);

	/* the path: escapes normal, then dot-segments removed */
	p = end;
	end = p + strcspn(p, "?#");
	initStringInfo(&path);
	if (!AppendNormalEscapes(&path, p, end - p))
	{
		*why = "it has a \"%\" that is not followed by two hex digits";
		return NULL;
	}
	initStringInfo(&resolved);
	RemoveDotSegments(&resolved, path.data);
	if (resolved.len == 0)
		appendStringInfoChar(&resolved, '/');
	if (HiddenDotSegment(resolved.data))
	{
		*why = "its path has a dot-segment next to an encoded slash or backslash (%2F, %5C)";
		return NULL;
	}
	appendStringInfoString(&out, resolved.data);

	/* the query, escapes normal; the fragment is not sent */
	if (*end == '?')
	{
		p = end;
		end = p + strcspn(p, "#");
		if (!AppendNormalEscapes(&out, p, end - p))
		{
			*why = "it has a \"%\" that is not followed by two hex digits";
			return NULL;
		}
	}
	return out.data;
}

/* dwarf.http_allow's prefixes in normal form, and the setting they are of. */
static MemoryContext AllowContext = NULL;
static char *AllowSource = NULL;
static List *AllowPrefixes = NIL;

/* Makes AllowPrefixes those of dwarf.http_allow as it is now. */
static void
LoadAllowPrefixes(void)
{
	MemoryContext old;
	char	   *list;
	List	   *items;
	ListCell   *lc;

	if (AllowSource && strcmp(AllowSource, dwarf_http_allow) == 0)
		return;
	if (AllowContext == NULL)
		AllowContext = AllocSetContextCreate(TopMemoryContext, "dwarf http_allow",
											 ALLOCSET_SMALL_SIZES);
	MemoryContextReset(AllowContext);
	AllowPrefixes = NIL;
	old = MemoryContextSwitchTo(AllowContext);
	AllowSource = pstrdup(dwarf_http_allow);
	list = pstrdup(dwarf_http_allow);
	if (SplitGUCList(list, ',', &items))
		foreach(lc, items)
		{
			const char *why;
			char	   *normal = ((char *) lfirst(lc))[0] ? UrlNormalize(lfirst(lc), &why) : NULL;

			if (normal)			/* else the setting's check refused it */
				AllowPrefixes = lappend(AllowPrefixes, normal);
		}
	MemoryContextSwitchTo(old);
}

/*
 * Is a URL in normal form (UrlNormalize) inside one of dwarf.http_allow's
 * prefixes, at a boundary?  Empty allows nothing.
 */
bool
UrlAllowed(const char *normal)
{
	ListCell   *lc;

	if (dwarf_http_allow == NULL || dwarf_http_allow[0] == '\0')
		return false;
	LoadAllowPrefixes();
	foreach(lc, AllowPrefixes)
	{
		const char *prefix = lfirst(lc);
		size_t		len = strlen(prefix);

		if (strncmp(normal, prefix, len) == 0 &&
			(prefix[len - 1] == '/' || normal[len] == '\0' || normal[len] == '/' ||
			 normal[len] == '?'))
			return true;
	}
	return false;
}

/*
 * dwarf.http_allow's check: each prefix must have a normal form, so that
 * one the gate could not compare is refused when it is set, not ignored.
 */
bool
UrlCheckAllow(char **newval, void **extra, GucSource source)
{
	char	   *list = pstrdup(*newval);
	List	   *items;
	ListCell   *lc;

	if (!SplitGUCList(list, ',', &items))
	{
		GUC_check_errdetail("dwarf.http_allow is a list of URL prefixes separated by commas.");
		return false;
	}
	foreach(lc, items)
	{
		const char *why;

		if (((char *) lfirst(lc))[0] != '\0' && UrlNormalize(lfirst(lc), &why) == NULL)
		{
			GUC_check_errdetail("Prefix \"%s\" cannot be used: %s.", (char *) lfirst(lc), why);
			return false;
		}
	}
	list_free(items);
	pfree(list);
	return true;
}
