/*
 * names.c
 *		Graph names: what a name may be (checked when it is defined), and
 *		which graph a name means to the role that uses it.
 *
 * A graph belongs to the role that defined it, and its name is that role's:
 * dwarf.graph is unique on (name, owner, version).  A role's dwarf.define
 * always makes or extends its own graph.  Its create, run and subgraph
 * (whose role is the flow's owner) find, for a bare name, its own graph;
 * else the graph of that name of a role it belongs to (granted, with its
 * privileges), unless two such roles have one; else, for "role.name", that
 * role's graph, which anyone may run, as itself.  So no role's name can
 * stand in for another's: only a grant the caller received, or the caller
 * naming the owner, reaches a graph it did not define.
 *
 * A name is one a reader can tell from others: no control, format
 * (zero-width, bidirectional) or invisible characters, no space that looks
 * like U+0020 but is not, no letters of two of the Latin, Greek and
 * Cyrillic scripts, whose letters look alike, and it is stored in NFC, the
 * form it is looked up in.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "common/unicode_norm.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "dwarf.h"
#include "names.h"

#define NAME_HINT \
	"A graph name has 1 to %d bytes of visible characters: no control, format (zero-width, " \
	"bidirectional) or invisible characters, no space at either end, and no space but U+0020 " \
	"and U+3000."

/* ---------- what a name may be ---------- */

/* Emoji and other pictographs, which a zero-width joiner may join. */
static bool
Pictograph(pg_wchar c)
{
	return (c >= 0x1F000 && c <= 0x1FAFF) || (c >= 0x2600 && c <= 0x27BF) ||
		(c >= 0x2300 && c <= 0x23FF) || (c >= 0x2B00 && c <= 0x2BFF);
}

/*
 * Why the character at s[i] (of n) may not be in a graph name, or NULL if
 * it may.  Control, format (Unicode Cf: zero-width, bidirectional controls,
 * the soft hyphen) and invisible characters make two names that print alike
 * differ; so do spaces that look like U+0020.  A zero-width joiner and a
 * variation selector are part of an emoji sequence, and fine there.
 */
static const char *
BadChar(const pg_wchar *s, int i, int n)
{
	pg_wchar	c = s[i];
	bool		at_end = (i == 0 || i == n - 1);

	if (c < 0x20 || (c >= 0x7F && c <= 0x9F))
		return "a control character";
	if (c == 0x2028 || c == 0x2029)
		return "a line or paragraph separator";
	if (c == 0x200D)
		return i > 0 && i < n - 1 && (Pictograph(s[i - 1]) || s[i - 1] == 0xFE0F) &&
			Pictograph(s[i + 1]) ? NULL : "a zero-width joiner outside an emoji sequence";
	if (c == 0xFE0E || c == 0xFE0F)
		return i > 0 && Pictograph(s[i - 1]) ? NULL : "a variation selector outside an emoji sequence";
	if (c == 0xAD || (c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F ||
		c == 0x890 || c == 0x891 || c == 0x8E2 || c == 0x180E ||
		(c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) ||
		(c >= 0x2060 && c <= 0x2064) || (c >= 0x2066 && c <= 0x206F) || c == 0xFEFF ||
		(c >= 0xFFF9 && c <= 0xFFFB) || c == 0x110BD || c == 0x110CD ||
		(c >= 0x13430 && c <= 0x1343F) || (c >= 0x1BCA0 && c <= 0x1BCA3) ||
		(c >= 0x1D173 && c <= 0x1D17A) || c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F))
		return "a format character (zero-width or bidirectional)";
	if (c == 0x34F || c == 0x115F || c == 0x1160 || c == 0x17B4 || c == 0x17B5 ||
		(c >= 0x180B && c <= 0x180D) || c == 0x180F || c == 0x2800 || c == 0x3164 ||
		(c >= 0xFE00 && c <= 0xFE0F) || c == 0xFFA0 || (c >= 0xE0100 && c <= 0xE01EF))
		return "an invisible character";
	if (c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x202F || c == 0x205F)
		return "a space that looks like U+0020";
	if ((c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000)
		return "a private-use character";
	if ((c == ' ' || c == 0x3000) && at_end)
		return "a space at one end";
	return NULL;
}

/* Scripts whose letters look alike, so that a name must not mix them. */
typedef enum LetterScript
{
	SCRIPT_OTHER = 0,
	SCRIPT_LATIN,
	SCRIPT_GREEK,
	SCRIPT_CYRILLIC
} LetterScript;

static const char *const ScriptNames[] = {"other", "Latin", "Greek", "Cyrillic"};

/* The script of a letter, when it is one of those that look alike. */
static LetterScript
ScriptOf(pg_wchar c)
{
	if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == 0xAA || c == 0xBA ||
		(c >= 0xC0 && c <= 0x2AF && c != 0xD7 && c != 0xF7) ||
		(c >= 0x1D00 && c <= 0x1D7F) || (c >= 0x1E00 && c <= 0x1EFF) ||
		(c >= 0x2C60 && c <= 0x2C7F) || (c >= 0xA720 && c <= 0xA7FF) ||
		(c >= 0xAB30 && c <= 0xAB6F) || (c >= 0xFF21 && c <= 0xFF3A) ||
		(c >= 0xFF41 && c <= 0xFF5A))
		return SCRIPT_LATIN;
	if ((c >= 0x370 && c <= 0x3FF && c != 0x37E && c != 0x387) || (c >= 0x1F00 && c <= 0x1FFF))
		return SCRIPT_GREEK;
	if ((c >= 0x400 && c <= 0x52F) || (c >= 0x1C80 && c <= 0x1C8F) ||
		(c >= 0x2DE0 && c <= 0x2DFF) || (c >= 0xA640 && c <= 0xA69F))
		return SCRIPT_CYRILLIC;
	return SCRIPT_OTHER;
}

/* The name as it can be shown: refused characters as <U+XXXX>. */
static char *
VisibleName(const pg_wchar *s, int n)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < n; i++)
	{
		unsigned char utf8[8] = {0};

		if (BadChar(s, i, n) != NULL && s[i] != ' ' && s[i] != 0x3000)
			appendStringInfo(&buf, "<U+%04X>", (unsigned int) s[i]);
		else
			appendStringInfoString(&buf, (char *) unicode_to_utf8(s[i], utf8));
	}
	return buf.data;
}

/* The name's characters (code points in a UTF8 database), 0-terminated; *n: how many. */
static pg_wchar *
NameChars(const char *name, int len, int *n)
{
	pg_wchar   *s = palloc((len + 1) * sizeof(pg_wchar));

	*n = pg_mb2wchar_with_len(name, s, len);
	s[*n] = 0;
	return s;
}

/* True if the text is all ASCII, which is in NFC and in one script. */
static bool
AllAscii(const char *p, int len)
{
	int			i;

	for (i = 0; i < len; i++)
		if (IS_HIGHBIT_SET(p[i]))
			return false;
	return true;
}

/*
 * The name in NFC, the form graph names are stored and looked up in, so
 * that the two spellings of "é" are one name.  Only a UTF8 database's names
 * are Unicode; ASCII is NFC already.
 */
static text *
NormalizedName(text *name)
{
	const char *p = VARDATA_ANY(name);
	int			len = VARSIZE_ANY_EXHDR(name);
	pg_wchar   *s;
	pg_wchar   *nfc;
	StringInfoData buf;
	int			n;
	int			i;

	if (AllAscii(p, len) || GetDatabaseEncoding() != PG_UTF8)
		return name;
	s = NameChars(p, len, &n);
	if (unicode_is_normalized_quickcheck(UNICODE_NFC, s) == UNICODE_NORM_QC_YES)
		return name;
	nfc = unicode_normalize(UNICODE_NFC, s);
	if (nfc == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	initStringInfo(&buf);
	for (i = 0; nfc[i]; i++)
	{
		unsigned char utf8[8] = {0};

		appendStringInfoString(&buf, (char *) unicode_to_utf8(nfc[i], utf8));
	}
	return cstring_to_text_with_len(buf.data, buf.len);
}

/*
 * A name to define a graph under, in NFC, or an error (invalid_name) that
 * names the refused character by its code point: 1 to 63 bytes, none of
 * the characters BadChar refuses, letters of at most one of the scripts
 * that look alike.
 */
text *
GraphNameChecked(text *name)
{
	text	   *nfc = NormalizedName(name);
	const char *p = VARDATA_ANY(nfc);
	int			len = VARSIZE_ANY_EXHDR(nfc);
	pg_wchar   *s;
	int			n;
	int			i;
	int			first = 0;		/* the first letter of a script below */
	LetterScript seen = SCRIPT_OTHER;

	if (len == 0 || len >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("invalid graph name \"%s\": it has %d bytes", text_to_cstring(nfc), len),
				 errhint(NAME_HINT, NAMEDATALEN - 1)));
	if (GetDatabaseEncoding() != PG_UTF8)
	{
		/* Not Unicode: only control characters and spaces at the ends are known. */
		for (i = 0; i < len; i++)
			if ((unsigned char) p[i] < 0x20 || p[i] == 0x7F ||
				(p[i] == ' ' && (i == 0 || i == len - 1)))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_NAME),
						 errmsg("invalid graph name \"%s\": it has a control character or a space at one end",
								text_to_cstring(nfc)),
						 errhint(NAME_HINT, NAMEDATALEN - 1)));
		return nfc;
	}

	s = NameChars(p, len, &n);
	for (i = 0; i < n; i++)
	{
		const char *why = BadChar(s, i, n);
		LetterScript script = ScriptOf(s[i]);

		if (why != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_NAME),
					 errmsg("invalid graph name \"%s\": character U+%04X is %s",
							VisibleName(s, n), (unsigned int) s[i], why),
					 errhint(NAME_HINT, NAMEDATALEN - 1)));
		if (script == SCRIPT_OTHER)
			continue;
		if (seen != SCRIPT_OTHER && script != seen)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_NAME),
					 errmsg("invalid graph name \"%s\": it mixes %s and %s letters",
							VisibleName(s, n), ScriptNames[seen], ScriptNames[script]),
					 errdetail("Character U+%04X is a %s letter, character U+%04X a %s one.",
							   (unsigned int) s[first], ScriptNames[seen],
							   (unsigned int) s[i], ScriptNames[script]),
					 errhint("Write a graph name's letters in one of the Latin, Greek and Cyrillic scripts: "
							 "their letters look alike, so names that mix them look like other names.")));
		if (seen == SCRIPT_OTHER)
			first = i;
		seen = script;
	}
	return nfc;
}

/* ---------- which graph a name means ---------- */

/* dwarf.graph's columns that are read here, and its unique index. */
#define Anum_graph_id		1
#define Anum_graph_owner	6
#define GRAPH_NAME_INDEX	"graph_name_owner_version_key"

/* One version of a graph, as the lookups find it. */
typedef struct GraphVersion
{
	int32		id;
	Oid			owner;
	TransactionId xmin;
} GraphVersion;

/* dwarf.graph and its (name, owner, version) index, open for a lookup. */
typedef struct GraphScan
{
	Relation	rel;
	Relation	index;
	TupleTableSlot *slot;
} GraphScan;

static GraphScan
OpenGraphs(void)
{
	Oid			nsp = get_namespace_oid("dwarf", false);
	GraphScan	gs;

	gs.rel = table_open(get_relname_relid("graph", nsp), AccessShareLock);
	gs.index = index_open(get_relname_relid(GRAPH_NAME_INDEX, nsp), AccessShareLock);
	gs.slot = table_slot_create(gs.rel, NULL);
	return gs;
}

static void
CloseGraphs(GraphScan *gs)
{
	ExecDropSingleTupleTableSlot(gs->slot);
	index_close(gs->index, AccessShareLock);
	table_close(gs->rel, AccessShareLock);
}

/* The version in the scan's slot. */
static GraphVersion
SlotVersion(TupleTableSlot *slot)
{
	GraphVersion v;
	bool		isnull;

	v.id = DatumGetInt32(slot_getattr(slot, Anum_graph_id, &isnull));
	v.owner = DatumGetObjectId(slot_getattr(slot, Anum_graph_owner, &isnull));
	v.xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
												   &isnull));
	return v;
}

/* Starts an index scan of the graphs named name (and owned by owner, if valid). */
static IndexScanDesc
BeginGraphScan(GraphScan *gs, text *name, Oid owner)
{
	ScanKeyData keys[2];
	int			nkeys = OidIsValid(owner) ? 2 : 1;
	IndexScanDesc scan;

	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   gs->index->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(name));
	if (OidIsValid(owner))
		ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
							   InvalidOid, F_OIDEQ, ObjectIdGetDatum(owner));
	scan = index_beginscan(gs->rel, gs->index, GetActiveSnapshot(), NULL, nkeys, 0);
	index_rescan(scan, keys, nkeys, NULL, 0);
	return scan;
}

/* The latest version of owner's graph name: one index probe.  False if none. */
static bool
FindLatest(GraphScan *gs, text *name, Oid owner, GraphVersion *found)
{
	IndexScanDesc scan = BeginGraphScan(gs, name, owner);
	bool		ok = index_getnext_slot(scan, BackwardScanDirection, gs->slot);

	if (ok)
		*found = SlotVersion(gs->slot);
	index_endscan(scan);
	return ok;
}

/*
 * Does role use the graphs of owner as its own?  When it was granted owner
 * (directly or through other roles) and has owner's privileges.  A
 * superuser has every role's privileges, but a role it was not granted does
 * not get to decide what its calls run.
 */
static bool
BelongsTo(Oid role, Oid owner)
{
	return is_member_of_role_nosuper(role, owner) && has_privs_of_role(role, owner);
}

/*
 * The graphs named name of the roles that role belongs to (not role
 * itself): their owners, and the latest version of the first one.  The
 * index gives the versions by owner, oldest first.
 */
static List *
FindOfRolesOf(GraphScan *gs, text *name, Oid role, GraphVersion *found)
{
	IndexScanDesc scan = BeginGraphScan(gs, name, InvalidOid);
	List	   *owners = NIL;
	Oid			last = InvalidOid;
	bool		belongs = false;

	while (index_getnext_slot(scan, ForwardScanDirection, gs->slot))
	{
		GraphVersion v = SlotVersion(gs->slot);

		if (v.owner != last)
		{
			last = v.owner;
			belongs = v.owner != role && BelongsTo(role, v.owner);
			if (belongs)
				owners = lappend_oid(owners, v.owner);
		}
		if (belongs && list_length(owners) == 1)
			*found = v;
	}
	index_endscan(scan);
	return owners;
}

/*
 * Splits "role.name" into the role's name and the graph's (or limit's, see
 * limits.c): the role is what
 * comes before the first dot, or a double-quoted identifier ("a.b".name,
 * "" for a quote in it).  False if the name is not of that form.
 */
bool
NameSplitQualified(const char *name, char **role, char **graph)
{
	const char *p = name;
	StringInfoData buf;

	initStringInfo(&buf);
	if (*p == '"')
	{
		for (p++;; p++)
		{
			if (*p == '\0')
				return false;
			if (*p == '"' && p[1] != '"')
				break;
			if (*p == '"')
				p++;
			appendStringInfoChar(&buf, *p);
		}
		p++;
	}
	else
	{
		const char *dot = strchr(p, '.');

		if (dot == NULL)
			return false;
		appendBinaryStringInfo(&buf, p, dot - p);
		p = dot;
	}
	if (*p != '.' || p[1] == '\0' || buf.len == 0)
		return false;
	*role = buf.data;
	*graph = pstrdup(p + 1);
	return true;
}

/*
 * A version defined in this very transaction cannot be run by dwarf.run:
 * a worker, which cannot see it, is to run the flow.
 */
static void
CheckCommitted(GraphVersion *v, const char *name, bool committed)
{
	if (committed && TransactionIdIsCurrentTransactionId(v->xmin))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("graph \"%s\" was defined in this transaction", name),
				 errdetail("dwarf.run commits its flow on its own, where this version is not visible yet."),
				 errhint("Commit the definition first, or use dwarf.create() and commit.")));
}

/*
 * The id of the latest version of the graph that name means to role: its
 * own; else the one of a role it belongs to (an error when two have one);
 * else, for "role.name", that role's.  Read by index directly, not by a
 * statement: dwarf.run looks a graph up on every call, and for a role's own
 * graph this is one index probe.  Graph rows, readable by everyone, never
 * change.  With committed, a version defined in this transaction is an
 * error (see CheckCommitted).
 */
int32
ResolveGraph(text *name, Oid role, bool committed)
{
	GraphScan	gs = OpenGraphs();
	GraphVersion found;
	List	   *owners = NIL;
	char	   *cname;
	char	   *owner_name;
	char	   *graph_name;
	int			n = 1;

	name = NormalizedName(name);
	if (!FindLatest(&gs, name, role, &found))
	{
		owners = FindOfRolesOf(&gs, name, role, &found);
		n = list_length(owners);
	}
	cname = text_to_cstring(name);
	if (n == 0 && NameSplitQualified(cname, &owner_name, &graph_name))
	{
		Oid			owner = get_role_oid(owner_name, true);

		if (OidIsValid(owner) && FindLatest(&gs, cstring_to_text(graph_name), owner, &found))
			n = 1;
	}
	CloseGraphs(&gs);

	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("graph \"%s\" does not exist", cname),
				 errhint("Define it with dwarf.define(). Another role's graph is named as role.name.")));
	if (n > 1)
	{
		StringInfoData list;
		ListCell   *lc;

		initStringInfo(&list);
		foreach(lc, owners)
			appendStringInfo(&list, "%s%s", list.len ? ", " : "",
							 quote_identifier(GetUserNameFromId(lfirst_oid(lc), false)));
		ereport(ERROR,
				(errcode(ERRCODE_AMBIGUOUS_FUNCTION),
				 errmsg("graph name \"%s\" is ambiguous", cname),
				 errdetail("Roles %s, whose privileges role %s has, each have a graph of that name.",
						   list.data, GetUserNameFromId(role, false)),
				 errhint("Name the one meant as role.name, e.g. %s.%s, or define a graph of your own of that name.",
						 quote_identifier(GetUserNameFromId(linitial_oid(owners), false)), cname)));
	}
	CheckCommitted(&found, cname, committed);
	return found.id;
}

/*
 * The id of the latest version of owner's graph name (dwarf.continue: the
 * graph of the flow it follows, at its latest version).
 */
int32
LatestGraphOf(Oid owner, text *name, bool committed)
{
	GraphScan	gs = OpenGraphs();
	GraphVersion v;
	bool		ok = FindLatest(&gs, name, owner, &v);

	CloseGraphs(&gs);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("graph \"%s\" of role %s does not exist", text_to_cstring(name),
						GetUserNameFromId(owner, true))));
	CheckCommitted(&v, text_to_cstring(name), committed);
	return v.id;
}
