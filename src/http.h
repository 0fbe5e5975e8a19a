/*
 * http.h
 *		The HTTP process (http.c): one background worker per database with
 *		dwarf, started by the launcher while dwarf.http_allow is set, that
 *		makes the calls of HTTP tasks with libcurl's multi interface.
 */
#ifndef DWARF_HTTP_H
#define DWARF_HTTP_H

#include "dwarf.h"

/*
 * The index of the HTTP process's worker slot (DwarfWorkerSlot): no worker
 * has it, so no flow's notes go there, and DROP DATABASE and DROP
 * EXTENSION stop the process as they stop the database's workers.
 */
#define DWARF_HTTP_INDEX	(-1)

extern DWARF_EXPORT void DwarfHttpMain(Datum arg);

#endif							/* DWARF_HTTP_H */
