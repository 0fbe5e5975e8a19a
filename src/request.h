/*
 * request.h
 *		dwarf.run's create requests (request.c): a caller hands its create to
 *		the worker that will own the flow, through its request slot in
 *		shared memory, and waits for the flow id.
 */
#ifndef DWARF_REQUEST_H
#define DWARF_REQUEST_H

#include "storage/dsm.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "dwarf.h"
#include "shmem.h"

/*
 * A flow's outcome, when it closed in the transaction that created it: the
 * worker hands it over with the flow id (when it fits in the slot), and
 * the caller need not read it back.
 */
typedef struct RunOutcome
{
	bool		closed;			/* false: nothing else is set */
	bool		completed;		/* else failed */
	Jsonb	   *state;			/* NULL: none */
	char	   *error;			/* NULL: none */
} RunOutcome;

/* ---------- the caller's end (a backend in dwarf.run) ---------- */

extern int64 RequestCreate(int64 flow_id, int32 graph_id, int32 priority, text *key,
						   Jsonb *input, Jsonb *options, TimestampTz deadline,
						   RunOutcome *outcome);

/* ---------- the worker's end ---------- */

/*
 * A request a worker has taken: its parts are copies, valid until
 * RequestRelease; procno and generation name it until it is answered.
 */
typedef struct TakenRequest
{
	int			procno;			/* the caller's */
	uint32		generation;		/* of the request taken */
	dsm_segment *seg;			/* where a large body is, or NULL */
	RunRequest *body;
	text	   *key;			/* NULL: no idempotency key */
	Jsonb	   *input;
	Jsonb	   *options;
} TakenRequest;

extern Oid	RequestOwner(int procno);
extern bool RequestTake(int procno, TakenRequest *taken);
extern void RequestRelease(TakenRequest *taken);
extern void RequestGiveBack(int procno, uint32 generation);
extern void RequestGiveBackAll(void);
extern void RequestAnswer(int procno, uint32 generation, int64 flow_id, ErrorData *edata,
						  const RunOutcome *outcome);

#endif							/* DWARF_REQUEST_H */
