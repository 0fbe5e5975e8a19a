/*
 * partitions.h
 *		The partition descriptors of dwarf's partitioned tables, kept from a
 *		build that raced a change of their partitions (partitions.c).
 */
#ifndef DWARF_PARTITIONS_H
#define DWARF_PARTITIONS_H

#include "utils/relcache.h"

extern void FreshPartitionDesc(Relation rel);
extern void PartitionsInit(void);

#endif							/* DWARF_PARTITIONS_H */
