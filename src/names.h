/*
 * names.h
 *		Graph names (names.c): what a name may be, and which graph a name
 *		means to the role that uses it.
 */
#ifndef DWARF_NAMES_H
#define DWARF_NAMES_H

#include "fmgr.h"

extern text *GraphNameChecked(text *name);
extern int32 ResolveGraph(text *name, Oid role, bool committed);
extern int32 LatestGraphOf(Oid owner, text *name, bool committed);

#endif							/* DWARF_NAMES_H */
