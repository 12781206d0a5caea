/* The queue from the worker's control thread to its compute thread: decoded control
 * messages (pl_msg copies, protocol.h), first in first out, and a last item that tells
 * the compute thread to end.
 *
 * Threads: any thread pushes, one thread pops (it blocks while the queue is empty).
 * Ownership: push copies the message (pl_msg_dup), so the caller keeps its own; pop hands
 * the copy to the caller, who frees it with pl_msg_free; pl_msg_queue_free frees what is
 * left. */
#ifndef PLIANT_MSG_QUEUE_H
#define PLIANT_MSG_QUEUE_H

#include "protocol.h"

typedef struct pl_msg_queue pl_msg_queue;

/* NULL when memory runs out. */
pl_msg_queue *pl_msg_queue_new(void);
/* Frees the queue and the messages still in it. NULL is a no-op. */
void pl_msg_queue_free(pl_msg_queue *q);

/* Queues a copy of m. 0, or −1 when memory runs out (nothing queued). */
int pl_msg_queue_push(pl_msg_queue *q, const pl_msg *m);
/* Queues the end (once; later calls do nothing): pop returns 1 once the messages before
 * it are popped. Called by one thread. */
void pl_msg_queue_push_end(pl_msg_queue *q);

/* Waits for the next item: 0 with the message in out, or 1 at the end. */
int pl_msg_queue_pop(pl_msg_queue *q, pl_msg *out);

#endif
