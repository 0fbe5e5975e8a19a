/*
 * names.h
 *		Graph names (names.c): what a name may be, and which graph a name
 *		means to the role that uses it; "role.name" split for limits too.
 */
#ifndef DWARF_NAMES_H
#define DWARF_NAMES_H

#include "fmgr.h"

extern text *GraphNameChecked(text *name);
extern int32 ResolveGraph(text *name, Oid role, bool committed);
extern int32 LatestGraphOf(Oid owner, text *name, bool committed);
extern bool NameSplitQualified(const char *name, char **role, char **rest);

#endif							/* DWARF_NAMES_H */
