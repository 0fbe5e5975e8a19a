/*
 * restore.c
 *		dwarf_internal.restored(): the workers take in the flows a restore
 *		wrote.
 *
 * pg_dump dumps dwarf's tables and sequences (pg_extension_config_dump),
 * and a restore copies their rows in after its CREATE EXTENSION has
 * started the database's workers.  A worker knows only the flows it was
 * told of (a create's note) or found when it last scanned its tables, so
 * nobody would carry on the restored flows: a sleeping flow would never
 * wake.  dwarf_internal.restored, a statement-level trigger on
 * dwarf.step_log, asks every worker of the database to scan its tables
 * again, as if its note ring had overflowed.  Nothing but a restore writes
 * dwarf.step_log with a statement: the workers append its rows without the
 * executor's triggers, so the trigger costs the hot path nothing.
 *
 * The scan comes when the session that copied the steps ends, not when its
 * COPY commits.  pg_restore copies each table in a transaction of its own
 * and sets the sequences only after every table's rows: a worker that
 * carried on a restored flow at the COPY's commit would take its step ids
 * from dwarf.step_seq before it is set, below ids of the restored steps
 * (those of the archive's day partitions, copied after dwarf.step_log,
 * too), and the flow's next step would replay before its earlier ones.  At
 * the session's end every table and sequence of the restore is in,
 * whatever the order pg_restore took them in (with --jobs as well).
 */
#include "postgres.h"

#include "commands/trigger.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/spin.h"

#include "dwarf.h"
#include "shmem.h"

static bool ScanAtExit = false;	/* WakeWorkersToScan is registered */

/*
 * At the end of a session that wrote dwarf.step_log rows with a statement:
 * every worker of this database rescans its tables (the overflow flag of
 * its note ring) and is woken.  A worker that is not running yet scans
 * when it starts.
 */
static void
WakeWorkersToScan(int code, Datum arg)
{
	int			i;

	if (Dwarf == NULL)
		return;
	for (i = 0; i < DWARF_MAX_WORKERS; i++)
	{
		DwarfWorkerSlot *slot = &Dwarf->workers[i];
		Latch	   *latch = NULL;

		SpinLockAcquire(&slot->mutex);
		if (slot->dboid == MyDatabaseId)
		{
			slot->overflow = true;
			latch = slot->latch;
		}
		SpinLockRelease(&slot->mutex);
		if (latch)
			SetLatch(latch);
	}
}

DWARF_FUNCTION(dwarf_restored);

/*
 * dwarf_internal.restored(): AFTER INSERT ... FOR EACH STATEMENT on
 * dwarf.step_log.
 * Arranges for the workers to scan their tables when this session ends.
 * A scan that finds nothing new costs a worker one query, so a statement
 * that rolled back needs no care.
 */
Datum
dwarf_restored(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("dwarf_internal.restored() can only be called as a trigger")));
	if (!ScanAtExit)
	{
		before_shmem_exit(WakeWorkersToScan, (Datum) 0);
		ScanAtExit = true;
	}
	PG_RETURN_POINTER(NULL);
}
