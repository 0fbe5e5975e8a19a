/*
 * session.c
 *		Whose session a worker's is: the owner role of the steps it runs.
 *
 * A batch runs one role's steps (PopBatch takes them from that role's
 * queue), and for the batch the worker's session authorization is that
 * role: inside a task session_user, current_user and is_superuser are the
 * owner's, and the owner's role-level settings (ALTER ROLE ... SET, and
 * ALTER ROLE ... IN DATABASE ... SET, which wins) apply, under the task's
 * GUC nest level.  The worker's own code runs as the user it connected as
 * (a superuser), under the pinned search_path.
 *
 * Between batches of different roles the session is reset as DISCARD ALL
 * resets it: cursors, prepared statements, LISTEN, temporary objects and
 * sequences' session state (lastval).  Settings need no reset: every task's
 * are rolled back with its nest level.  Plans are kept: a cached plan holds
 * no rows, and one that depends on the role (row security) is not reused
 * by another.  Large objects and cursors end with the transaction anyway,
 * which holds one role's steps.
 *
 * A reset cannot reach what a library keeps in the process (dblink's named
 * connections, PL/Python's GD), nor a custom setting's name, which stays
 * defined (as '') once a task has set it, nor the temporary schema once
 * made (pg_my_temp_schema() says it is there).  So after every task the
 * worker looks whether a library from $libdir other than plpgsql's was
 * loaded, a placeholder setting appeared or the temporary schema was made
 * (a task's temporary objects are dropped at once: a security-restricted
 * operation refuses temporary tables, not functions, and no temporary
 * object outlives its step).  If so, the process is tainted by the
 * owner it was serving: it goes on with that role's steps, and exits before
 * it would serve another (the launcher starts its replacement at once,
 * which loads the flows from the tables).  The task is remembered in shared
 * memory (lend.c), and its steps go to runners from then on: a runner is a
 * process of its own for one step.  So a task that loads a library costs
 * one worker replacement per server start, and a runner's start per step;
 * with runners off (dwarf.max_runners = 0), a replacement at every change
 * of role after it ran.
 *
 * The worker's own nextval calls (step ids, flow ids) would show through
 * lastval() in the next task: after them, the sequences' session state is
 * reset before a task runs (step ids are taken in blocks, so that this is
 * rare).
 */
#include "postgres.h"

#include <link.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_db_role_setting.h"
#include "commands/async.h"
#include "commands/prepare.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#include "utils/memutils.h"
#include "utils/portal.h"
#include "utils/syscache.h"

#include "dwarf.h"
#include "worker.h"

/* A role-level setting, parsed from pg_db_role_setting. */
typedef struct RoleSetting
{
	char	   *name;
	char	   *value;
} RoleSetting;

static Oid	SessionOwner = InvalidOid;	/* whose session it is */
static Oid	TaintedBy = InvalidOid; /* the role served when it was tainted */
static MemoryContext SettingsContext = NULL;
static List *OwnerSettings = NIL;	/* RoleSettings, role-wide first */

/* What the process had loaded and defined when it was last found clean. */
static unsigned long long LoadsSeen = 0;
static int	SettingsSeen = 0;
static int	PlaceholdersSeen = 0;
static List *LibrariesSeen = NIL;	/* names of $libdir files, in TopMemoryContext */

/* ---------- what a reset cannot reach ---------- */

/* A role's name for the server log (outside a transaction, in one of its own). */
const char *
SessionRoleName(Oid role)
{
	bool		xact = !IsTransactionState();
	char	   *name;

	if (xact)
		StartTransactionCommand();
	name = GetUserNameFromId(role, true);
	name = name ? pstrdup(quote_identifier(name)) : psprintf("with OID %u", role);
	if (xact)
		CommitTransactionCommand();
	return name;
}

/* dl_iterate_phdr callback: the loader's count of objects loaded so far. */
static int
ReadLoads(struct dl_phdr_info *info, size_t size, void *arg)
{
	*(unsigned long long *) arg = info->dlpi_adds;
	return 1;					/* the first object says it */
}

static unsigned long long
Loads(void)
{
	unsigned long long adds = 0;

	(void) dl_iterate_phdr(ReadLoads, &adds);
	return adds;
}

/*
 * A library of $libdir that keeps nothing of a role's per session: plpgsql
 * (its state is per function), dwarf itself, and what PostgreSQL loads on
 * its own: the encoding conversions, the snowball dictionaries, and the JIT
 * provider (a query of the worker's own may pass jit_above_cost).
 */
static bool
KeepsNoSessionState(const char *name)
{
	return strcmp(name, "plpgsql.so") == 0 || strcmp(name, "dwarf.so") == 0 ||
		strstr(name, "_and_") != NULL || strcmp(name, "dict_snowball.so") == 0 ||
		strncmp(name, "llvmjit", 7) == 0;
}

/* dl_iterate_phdr callback: the first $libdir library not seen before, into *arg. */
static int
FindNewLibrary(struct dl_phdr_info *info, size_t size, void *arg)
{
	size_t		len = strlen(pkglib_path);
	const char *name = info->dlpi_name;
	ListCell   *lc;

	if (name == NULL || strncmp(name, pkglib_path, len) != 0 || name[len] != '/')
		return 0;
	name += len + 1;
	if (KeepsNoSessionState(name))
		return 0;
	foreach(lc, LibrariesSeen)
		if (strcmp(lfirst(lc), name) == 0)
			return 0;
	*(const char **) arg = name;
	return 1;
}

/* Has this process made its temporary schema (a task made a temporary object)? */
static bool
TempNamespaceInUse(void)
{
	Oid			temp;
	Oid			toast;

	GetTempNamespaceState(&temp, &toast);
	return OidIsValid(temp);
}

/* Custom settings defined by no library (set by name only). */
static int
CountPlaceholders(void)
{
	int			n;
	struct config_generic **settings = CompatSettings(&n);
	int			count = 0;
	int			i;

	for (i = 0; i < n; i++)
		if (settings[i]->flags & GUC_CUSTOM_PLACEHOLDER)
			count++;
	return count;
}

/* dl_iterate_phdr callback: notes every $libdir library loaded now. */
static int
NoteLibrary(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *name = NULL;

	if (FindNewLibrary(info, size, &name))
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		LibrariesSeen = lappend(LibrariesSeen, pstrdup(name));
		MemoryContextSwitchTo(old);
	}
	return 0;
}

/*
 * Takes what the process has now as its clean state: the libraries it
 * started with (shared_preload_libraries: an administrator's choice) and
 * the settings defined.  Once, when a worker or runner starts.
 */
void
SessionInit(void)
{
	(void) dl_iterate_phdr(NoteLibrary, NULL);
	LoadsSeen = Loads();
	SettingsSeen = CompatNumSettings();
	PlaceholdersSeen = CountPlaceholders();
	SettingsContext = AllocSetContextCreate(TopMemoryContext, "dwarf role settings",
											ALLOCSET_SMALL_SIZES);
}

/*
 * Did the last task leave what a reset cannot reach: a new library, or a
 * new placeholder setting?  Returns what, or NULL.  Two counters' reads
 * when nothing was loaded or defined.
 */
static const char *
NewProcessState(void)
{
	unsigned long long loads = Loads();
	const char *library = NULL;

	if (loads != LoadsSeen)
	{
		(void) dl_iterate_phdr(FindNewLibrary, &library);
		if (library)
			return psprintf("library \"%s\"", library);
		LoadsSeen = loads;
	}
	if (CompatNumSettings() != SettingsSeen)
	{
		int			placeholders = CountPlaceholders();

		if (placeholders > PlaceholdersSeen)
			return "a custom setting";
		SettingsSeen = CompatNumSettings();	/* plpgsql defined its own */
		PlaceholdersSeen = placeholders;
	}
	if (TempNamespaceInUse())
		return "a temporary schema";
	return NULL;
}

/*
 * Has a step of the session's owner left state a reset cannot reach?  Then
 * the process is the owner's until it exits; node, when known, is the task
 * that did it, whose steps go to processes of their own from now on.  (A
 * task that failed is not known: what it left is found before the next
 * task or batch.)
 */
static void
LookForProcessState(GraphNode *node)
{
	const char *what;

	if (OidIsValid(TaintedBy) || !OidIsValid(SessionOwner) ||
		(what = NewProcessState()) == NULL)
		return;
	TaintedBy = SessionOwner;
	if (Worker.is_runner)
		return;					/* it exits after its step */
	if (node)
		NoteTaskOwnProcess(node);
	ereport(LOG,
			(errmsg("dwarf worker %d will be replaced before it runs another role's steps: %s of role %s left %s in its process",
					Worker.slot->index, node ? psprintf("task \"%s\"", node->name) : "a step",
					SessionRoleName(SessionOwner), what),
			 node ? errdetail("Steps of task \"%s\" run in runners from now on.", node->name) : 0));
}

/*
 * A task of this node ran for the session's owner (see LookForProcessState).
 * Temporary objects it made (a security-restricted operation refuses
 * temporary tables, not functions) are dropped: none outlives its step.
 */
void
SessionAfterTask(GraphNode *node)
{
	LookForProcessState(node);
	if (TempNamespaceInUse())
		ResetTempTableNamespace();
}

/*
 * Must the worker be replaced before it runs this owner's steps?  Only when
 * a step of another role left state in the process that a reset cannot
 * reach.
 */
bool
SessionMustReplace(Oid owner)
{
	LookForProcessState(NULL);
	return OidIsValid(TaintedBy) && TaintedBy != owner;
}

/* ---------- the owner's session ---------- */

/*
 * Ends what one role's steps left in the session, as DISCARD ALL does
 * (see the file's comment for what is not needed).
 */
static void
SessionReset(void)
{
	PortalHashTableDeleteAll();
	DropAllPreparedStatements();
	Async_UnlistenAll();
	ResetTempTableNamespace();
	ResetSequenceCaches();
	DwarfNextvalUsed = false;
}

/* Appends the settings of one pg_db_role_setting row, if there is one. */
static void
ReadRoleSettings(Relation rel, Oid database, Oid role)
{
	ScanKeyData keys[2];
	SysScanDesc scan;
	HeapTuple	tuple;

	ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(database));
	ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(role));
	scan = systable_beginscan(rel, DbRoleSettingDatidRolidIndexId, true, NULL, 2, keys);
	if (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		config = heap_getattr(tuple, Anum_pg_db_role_setting_setconfig,
										  RelationGetDescr(rel), &isnull);
		Datum	   *items;
		int			n;
		int			i;

		if (!isnull)
		{
			deconstruct_array(DatumGetArrayTypeP(config), TEXTOID, -1, false, TYPALIGN_INT,
							  &items, NULL, &n);
			for (i = 0; i < n; i++)
			{
				MemoryContext old = MemoryContextSwitchTo(SettingsContext);
				RoleSetting *setting = palloc(sizeof(RoleSetting));

				ParseLongOption(TextDatumGetCString(items[i]), &setting->name, &setting->value);
				if (setting->value != NULL)
					OwnerSettings = lappend(OwnerSettings, setting);
				MemoryContextSwitchTo(old);
			}
		}
	}
	systable_endscan(scan);
}

/*
 * Makes the worker's session the owner's, before a batch of its steps: if
 * it was another role's, the session is reset and its authorization
 * changed, in a transaction of their own (committed before the batch, so
 * that the batch's rollback cannot bring back what the reset dropped).
 */
void
SessionServe(Oid owner)
{
	MemoryContext cxt = CurrentMemoryContext;
	Oid			user;
	int			sec;

	if (owner == SessionOwner)
		return;
	StartTransactionCommand();
	if (OidIsValid(SessionOwner))
		SessionReset();
	GetUserIdAndSecContext(&user, &sec);
	SetSessionAuthorization(owner, superuser_arg(owner));
	SetUserIdAndSecContext(user, sec);	/* the worker's own code stays its own */
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);
	SessionOwner = owner;
}

/*
 * Reads the session owner's role-level settings, in the batch's transaction
 * (every batch: an ALTER ROLE sends no invalidation).
 */
void
SessionReadSettings(void)
{
	Relation	rel;

	MemoryContextReset(SettingsContext);
	OwnerSettings = NIL;
	if (!OidIsValid(SessionOwner))
		return;
	rel = table_open(DbRoleSettingRelationId, AccessShareLock);
	ReadRoleSettings(rel, InvalidOid, SessionOwner);
	ReadRoleSettings(rel, MyDatabaseId, SessionOwner);
	table_close(rel, AccessShareLock);
}

/*
 * Applies the owner's role-level settings to the task about to run, under
 * its nest level (so they end with it), the database-specific ones last.
 * A setting that no longer applies is skipped, as a session's start skips
 * it with a warning.
 */
static void
ApplyOwnerSettings(void)
{
	ListCell   *lc;

	if (OwnerSettings == NIL)
		return;
	LookForProcessState(NULL);	/* what a failed task left, before it is taken in */
	foreach(lc, OwnerSettings)
	{
		RoleSetting *setting = lfirst(lc);

		(void) set_config_option(setting->name, setting->value, PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, DEBUG1, false);
	}

	/*
	 * A custom setting of the role's (ALTER ROLE r SET app.x) is left
	 * defined, as '', for every role after it.  It is no state of the role's
	 * to hide: pg_db_role_setting shows its name to everyone.
	 */
	if (CompatNumSettings() != SettingsSeen)
	{
		SettingsSeen = CompatNumSettings();
		PlaceholdersSeen = CountPlaceholders();
	}
}

/*
 * A task is about to run, under its nest level: the owner's settings
 * apply, and if the worker itself called nextval since the last task, the
 * sequences' session state is reset, so that lastval() does not show it.
 */
void
SessionTaskBegins(void)
{
	ApplyOwnerSettings();
	if (DwarfNextvalUsed)
	{
		ResetSequenceCaches();
		DwarfNextvalUsed = false;
	}
}
