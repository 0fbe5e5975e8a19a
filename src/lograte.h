/*
 * lograte.h
 *		Log lines said once per cause and interval, with a count.
 *
 * A log line that could repeat without bound (one a step, a batch or a
 * pass of a loop: a role's 100,000 waiting steps would say it 100,000 times
 * a second) is said at most once per DWARF_LOG_EVERY_MS in a process, with
 * the count of its cause's events since it was last said.  A header of its
 * own, below every module that logs.
 */
#ifndef DWARF_LOGRATE_H
#define DWARF_LOGRATE_H

#include "utils/timestamp.h"

#define DWARF_LOG_EVERY_MS	10000

/* A cause's line: a static variable where the line is said. */
typedef struct LogRate
{
	TimestampTz said_at;		/* when the line was last said; 0: never */
	TimestampTz first_at;		/* the first event not said yet */
	int64		count;			/* events not said yet */
} LogRate;

/*
 * Counts one event of the cause r: returns 0 while its line is not due,
 * else how many events the line stands for, with *seconds the span they
 * took.  (Events after the last line are counted in the next one.)
 */
static inline int64
LogRateDue(LogRate *r, TimestampTz now, int *seconds)
{
	int64		n;

	if (r->count++ == 0)
		r->first_at = now;
	if (r->said_at != 0 && now - r->said_at < DWARF_LOG_EVERY_MS * INT64CONST(1000))
		return 0;
	n = r->count;
	*seconds = (int) ((now - r->first_at + USECS_PER_SEC - 1) / USECS_PER_SEC);
	r->said_at = now;
	r->count = 0;
	return n;
}

/*
 * What a line adds after the latest event it says: how many it stands for
 * (nothing when it stands for that one alone).
 */
static inline const char *
LogRateCount(int64 n, int seconds)
{
	if (n <= 1)
		return "";
	return psprintf("; " INT64_FORMAT " times in the last %d s (said at most once every %d s)",
					n, seconds, DWARF_LOG_EVERY_MS / 1000);
}

#endif							/* DWARF_LOGRATE_H */
