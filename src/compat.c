/*
 * compat.c
 *		What compat.h cannot map with a name: the few differences between
 *		PostgreSQL majors that take a function of dwarf's own.
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "nodes/pg_list.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"

#include "dwarf.h"

/*
 * The settings there are, as an array of *num (16: the settings became a
 * hash, and get_guc_variables() makes the array; before, it was the list
 * itself, and GetNumConfigOptions() its length).
 */
struct config_generic **
CompatSettings(int *num)
{
#if PG_VERSION_NUM >= 160000
	return get_guc_variables(num);
#else
	*num = GetNumConfigOptions();
	return get_guc_variables();
#endif
}

/* How many settings there are (a setting defined since shows in it). */
int
CompatNumSettings(void)
{
#if PG_VERSION_NUM >= 160000
	int			num;

	pfree(get_guc_variables(&num));
	return num;
#else
	return GetNumConfigOptions();
#endif
}

/*
 * Pins "search_path = pg_catalog, pg_temp" for the statements of a call,
 * until CompatUnpinSearchPath(the level returned); an error unpins it with
 * the transaction.  Before 17, an override search path does it without a
 * setting (PushOverrideSearchPath); 17 removed those, and the setting is
 * made at a GUC nest level of its own, as a function's SET clause does.
 */
int
CompatPinSearchPath(void)
{
#if PG_VERSION_NUM >= 170000
	int			level = NewGUCNestLevel();

	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	return level;
#else
	OverrideSearchPath path = {0};
	Oid			temp;
	Oid			temp_toast;

	path.schemas = list_make1_oid(PG_CATALOG_NAMESPACE);
	GetTempNamespaceState(&temp, &temp_toast);
	if (OidIsValid(temp))
		path.schemas = lappend_oid(path.schemas, temp);
	PushOverrideSearchPath(&path);
	return 0;
#endif
}

/* Ends what CompatPinSearchPath(level) pinned. */
void
CompatUnpinSearchPath(int level)
{
#if PG_VERSION_NUM >= 170000
	AtEOXact_GUC(true, level);
#else
	PopOverrideSearchPath();
#endif
}
