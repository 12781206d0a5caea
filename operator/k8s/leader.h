/* Leader election with a coordination.k8s.io/v1 Lease, as client-go's
 * leaderelection package does it, so that of the operator's replicas one
 * reconciles at a time.
 *
 * A thread reads the Lease `name` in `namespace_` and takes it when it is
 * free: missing, released (no holderIdentity), or expired — its holder has not
 * changed the record for leaseDurationSeconds, judged by this process's
 * monotonic clock since it last saw the record change (never by comparing
 * clocks with the holder). Writes carry the resourceVersion read, so of two
 * candidates one wins and the other gets 409 and reads again.
 *
 * Timing, with client-go's names and defaults (0 picks the default):
 *   lease_ms  15000  LeaseDuration: how long others wait before taking over
 *                    a lease that is not renewed (written rounded up to s)
 *   renew_ms  10000  RenewDeadline: the leader gives up leadership when no
 *                    renewal succeeded for this long; < lease_ms, so that it
 *                    stops leading before anyone else may start
 *   retry_ms   2000  RetryPeriod: the leader renews, and candidates try to
 *                    acquire, every retry_ms (candidates with up to 20% jitter)
 * lease_ms > renew_ms > 1.2 · retry_ms is required.
 *
 * Once leadership is lost the elector does not compete again (client-go's
 * Run returns): on_stopped should end the process, whose restart makes it a
 * candidate again. pl_leader_stop releases a held lease (holderIdentity
 * cleared) so that another replica takes over at once.
 *
 * Callbacks run on the elector's thread and should return quickly (the next
 * renewal waits for them); they must not call pl_leader_stop. on_stopped runs
 * after is_leader turned 0 and, on stop, before the lease is released. */
#ifndef PLIANT_LEADER_H
#define PLIANT_LEADER_H

#include <stddef.h>

#include "kube_config.h"

typedef struct {
    pl_kube_config *kc;     /* borrowed; must outlive the elector */
    const char *namespace_; /* NULL: kc's namespace */
    const char *name;       /* the Lease, e.g. "pliant-operator" */
    const char *identity;   /* unique per replica, e.g. the Pod's name */
    int lease_ms, renew_ms, retry_ms;
    void (*on_started)(void *user); /* this replica now leads */
    void (*on_stopped)(void *user); /* it no longer does (lost, or stopped) */
    void *user;
} pl_leader_config;

typedef struct pl_leader pl_leader;

/* Starts the elector's thread; NULL and err for a bad configuration or when
 * the client or thread cannot be made. The strings are copied. */
pl_leader *pl_leader_start(const pl_leader_config *cfg, char *err, size_t errlen);
/* 1 while this replica holds the lease. */
int pl_leader_is_leader(const pl_leader *l);
/* Stops the thread (after the request in flight, which renew_ms bounds),
 * releases the lease if held (after on_stopped), frees l. */
void pl_leader_stop(pl_leader *l);

/* The RFC 3339 micro time Leases carry, "2026-11-21T08:00:00.000000Z", of
 * the realtime clock. */
void pl_leader_micro_time(char out[32]);

#endif
