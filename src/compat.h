/*
 * compat.h
 *		Every difference between the PostgreSQL majors dwarf builds on (15,
 *		17 and 18) that its code meets, in one place.
 *
 * The code is written against the newest API (18's); each mapping below
 * brings one changed function, member or spelling down to the older majors,
 * with the release that changed it named beside it.  No other file tests
 * PG_VERSION_NUM.  Where the older form cannot be reached by a rename, a
 * small function here (or in compat.c) does what the newer one does.
 *
 * Include it after the PostgreSQL headers a file needs (dwarf.h does).
 */
#ifndef DWARF_COMPAT_H
#define DWARF_COMPAT_H

/*
 * The headers whose functions are mapped below come first, so that their
 * declarations are read before the mappings.
 */
#include "access/genam.h"
#include "access/tableam.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "executor/executor.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/rel.h"

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 190000
#error "dwarf builds on PostgreSQL 15 to 18"
#endif

/* 18: pg_noreturn, a specifier before the declaration, replaced pg_attribute_noreturn(). */
#if PG_VERSION_NUM < 180000
#define pg_noreturn _Noreturn
#endif

/* 18: a relation's primary key may be asked for with its deferrable ones. */
#if PG_VERSION_NUM < 180000
#define RelationGetPrimaryKeyIndex(rel, deferrable_ok) RelationGetPrimaryKeyIndex(rel)
#endif

/* 18: ResultRelInfo's ri_ConstraintExprs became ri_CheckConstraintExprs. */
#if PG_VERSION_NUM < 180000
#define ri_CheckConstraintExprs ri_ConstraintExprs
#endif

/* 18: index_beginscan takes the scan's instrumentation (NULL: none). */
#if PG_VERSION_NUM < 180000
#define index_beginscan(heap, index, snapshot, instrument, nkeys, norderbys) \
	index_beginscan(heap, index, snapshot, nkeys, norderbys)
#endif

/* 17: a PGPROC's number is GetNumberFromPGProc(), no longer a member. */
#if PG_VERSION_NUM < 170000
#define GetNumberFromPGProc(proc) ((proc)->pgprocno)
#endif

/* 17: a PGPROC's local transaction id moved into its vxid. */
static inline LocalTransactionId
ProcLocalXid(PGPROC *proc)
{
#if PG_VERSION_NUM >= 170000
	return proc->vxid.lxid;
#else
	return proc->lxid;
#endif
}

/* 17: a wait event set belongs to a resource owner (NULL: for good). */
#if PG_VERSION_NUM < 170000
#define CreateWaitEventSet(resowner, nevents) CreateWaitEventSet(TopMemoryContext, nevents)
#endif

/* 16: one object_aclcheck and object_ownercheck for every kind of object. */
#if PG_VERSION_NUM < 160000
static inline AclResult
object_aclcheck(Oid classid, Oid objectid, Oid roleid, AclMode mode)
{
	if (classid == ProcedureRelationId)
		return pg_proc_aclcheck(objectid, roleid, mode);
	Assert(classid == NamespaceRelationId);
	return pg_namespace_aclcheck(objectid, roleid, mode);
}

static inline bool
object_ownercheck(Oid classid, Oid objectid, Oid roleid)
{
	Assert(classid == ExtensionRelationId);
	return pg_extension_ownercheck(objectid, roleid);
}
#endif

/* 16: ExecInsertIndexTuples may insert into summarizing indexes only. */
#if PG_VERSION_NUM < 160000
#define ExecInsertIndexTuples(rri, slot, estate, update, noDupErr, specConflict, arbiters, onlySummarizing) \
	ExecInsertIndexTuples(rri, slot, estate, update, noDupErr, specConflict, arbiters)
#endif

/*
 * 16: table_tuple_update says which indexes need the new tuple
 * (TU_UpdateIndexes) instead of whether all of them do.
 */
#if PG_VERSION_NUM < 160000
typedef bool TU_UpdateIndexes;
#define TU_None false
#define TU_All true
#endif

/*
 * 16: which indexes an update needs (compat: whether any, and whether only
 * the summarizing ones, which HOT updates may need since 16).
 */
static inline bool
CompatUpdateIndexes(TU_UpdateIndexes update_indexes)
{
	return update_indexes != TU_None;
}

static inline bool
CompatOnlySummarizing(TU_UpdateIndexes update_indexes)
{
#if PG_VERSION_NUM >= 160000
	return update_indexes == TU_Summarizing;
#else
	return false;
#endif
}

/* 16: a routing map to a partition is built on demand. */
#if PG_VERSION_NUM < 160000
#define ExecGetRootToChildMap(rri, estate) ((rri)->ri_RootToPartitionMap)
#endif

/* 16: name lists are parsed with a soft-error context (NULL: raise). */
#if PG_VERSION_NUM < 160000
#define stringToQualifiedNameList(string, escontext) stringToQualifiedNameList(string)
#endif

/*
 * 16: the settings are a hash: get_guc_variables() makes an array of them
 * and says how long it is, and GetNumConfigOptions() is gone (compat.c).
 */
struct config_generic;
extern struct config_generic **CompatSettings(int *num);
extern int	CompatNumSettings(void);

/*
 * 17: PushOverrideSearchPath is gone; a function's pinned search_path is a
 * setting at a GUC nest level there (compat.c).
 */
extern int	CompatPinSearchPath(void);
extern void CompatUnpinSearchPath(int level);

#endif							/* DWARF_COMPAT_H */
