/*
 * partitions.c
 *		The partition descriptors of dwarf's partitioned tables: none built
 *		while the table's partitions changed serves past the statement that
 *		built it.
 *
 * dwarf.step_log is partitioned by flow id into segments (dwarf.segment),
 * which dwarf.maintain attaches to it and hands over to
 * dwarf.step_log_archive; dwarf.flow_archive has a partition a day.
 * Routing a row and pruning a read both go by the table's partition
 * descriptor, which the relcache builds when first asked after a change
 * of the table's partitions (RelationBuildPartitionDesc) and keeps until
 * the next one.  PostgreSQL 15 builds it in two steps: the children from
 * pg_inherits, then each child's bound from the catalog cache.  A lookup
 * in the second step that misses the cache and takes the transaction's
 * first lock on pg_class reads the pending invalidations; when one of them
 * is the table's (a partition attached after the children were read), the
 * entry's descriptor is cleared in the middle of the build, and the build
 * then stores the one made from the old children.  Nothing clears that one
 * until the table's partitions change again: for the step log, a segment
 * later.  Meanwhile the process routes the steps of flows in the new
 * segment to the default partition (whose constraint the relcache derives
 * from the same descriptor, so nothing refuses them) and prunes reads of
 * that segment's flows to the default partition, where their rows are not.
 * It takes a commit inside a build of microseconds: t/120 met it about
 * once in a dozen runs, and t/191 makes it happen with gdb.
 *
 * So every process counts the invalidations of those tables that it reads
 * (a relcache callback; until the process knows their oids in its
 * database, it counts every relation's), and:
 *  - A statement that starts after the count moved (the ExecutorStart
 *	  hook) has the tables' invalidations read again, as if sent anew:
 *	  their descriptors, their default partitions' constraints and the
 *	  plans that read them are forgotten, and made again when next needed.
 *	  A descriptor built while an invalidation was read serves at most the
 *	  statement that built it, which ran concurrently with the change, as
 *	  any statement concurrent with an ATTACH PARTITION may.
 *  - A batch about to route steps (FreshPartitionDesc, from rows.c; and
 *	  archive.c's routing of flow rows into their days) builds the table's
 *	  descriptor first, and builds it again until no invalidation was read
 *	  while it did: it routes by the partitions as they were after the last
 *	  change it heard of.  A segment attached later is
 *	  the executor's own case: the attach waits for a batch that holds the
 *	  default partition, and the default partition's constraint refuses a
 *	  step that the segment would hold.
 * When nothing changed this costs a comparison per statement and per batch.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/partition.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "partitioning/partdesc.h"
#include "storage/sinval.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "partitions.h"

static const char *const TableNames[] = {"step_log", "step_log_archive", "flow_archive"};

#define NTABLES lengthof(TableNames)

static Oid	Tables[NTABLES];	/* their oids here, when Known */
static bool Known = false;
static uint64 InvalsRead = 0;	/* their invalidations this process read */
static uint64 InvalsSettled = 0;	/* InvalsRead when last read again */
static ExecutorStart_hook_type PrevExecutorStart = NULL;

/* Relcache callback: counts the tables' invalidations, and resets. */
static void
CountInvalidation(Datum arg, Oid relid)
{
	int			i;

	if (relid == InvalidOid || !Known)
	{
		InvalsRead++;
		return;
	}
	for (i = 0; i < NTABLES; i++)
		if (relid == Tables[i])
			InvalsRead++;
}

/* Has an invalidation of relid read again here, as if it had been sent anew. */
static void
ReadAgain(Oid relid)
{
	SharedInvalidationMessage msg;

	msg.rc.id = SHAREDINVALRELCACHE_ID;
	msg.rc.dbId = MyDatabaseId;
	msg.rc.relId = relid;
	LocalExecuteInvalidationMessage(&msg);
}

/*
 * Reads the invalidations of the tables and of their default partitions
 * again, once the count moved: whatever was built from the catalog as it
 * was before is forgotten.  Finds the tables first (they may have been
 * made or dropped since): nothing to do in a database without dwarf.
 */
static void
Settle(void)
{
	Oid			schema = get_namespace_oid("dwarf", true);
	int			i;

	Known = OidIsValid(schema);
	for (i = 0; i < NTABLES; i++)
	{
		Tables[i] = Known ? get_relname_relid(TableNames[i], schema) : InvalidOid;
		Known &= OidIsValid(Tables[i]);
	}
	for (i = 0; i < NTABLES; i++)
		if (OidIsValid(Tables[i]))
		{
			Oid			default_part = get_default_partition_oid(Tables[i]);

			ReadAgain(Tables[i]);
			if (OidIsValid(default_part))
				ReadAgain(default_part);
		}
	InvalsSettled = InvalsRead;
}

static void
PartitionsExecutorStart(QueryDesc *queryDesc, int eflags)
{
	if (InvalsRead != InvalsSettled)
		Settle();
	if (PrevExecutorStart)
		PrevExecutorStart(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * Before rows are routed into the partitions of rel (partitioned, open and
 * locked): builds its descriptor, again until no invalidation was read
 * meanwhile, as the executor's routing asks for it.
 */
void
FreshPartitionDesc(Relation rel)
{
	for (;;)
	{
		uint64		read;

		if (InvalsRead != InvalsSettled)
			Settle();
		read = InvalsRead;
		(void) RelationGetPartitionDesc(rel, !IsolationUsesXactSnapshot());
		if (InvalsRead == read)
			return;
	}
}

/* From _PG_init: the callback and the hook, in every process. */
void
PartitionsInit(void)
{
	CacheRegisterRelcacheCallback(CountInvalidation, (Datum) 0);
	PrevExecutorStart = ExecutorStart_hook;
	ExecutorStart_hook = PartitionsExecutorStart;
}
