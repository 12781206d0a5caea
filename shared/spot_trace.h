/* Spot-instance traces for the simulator (`pliant simulate`): both formats read into
 * one list of events, and the scaling of a trace to a larger cluster.
 *
 * Formats (../shared/traces/README.md):
 * - events: `t_ms,add|remove,nodeN` per row (chaos.h, pl_trace_read);
 * - node counts (Bamboo's GCP traces): `YYYY-MM-DD, HH:MM:SS, COUNT` per row, sampled
 *   about once a minute. Times count from the first row (UTC calendar arithmetic, no
 *   time zone). The first row's count is the nodes there at t = 0; a rise of the count
 *   is that many new nodes, a drop that many preemptions of the most recently added
 *   live nodes (the trace does not say which went: newest first is this reader's
 *   choice).
 * Pure functions; the caller owns (free) every array returned. */
#ifndef PL_SPOT_TRACE_H
#define PL_SPOT_TRACE_H

#include <stddef.h>

#include "chaos.h"

/* Reads a trace of either format (chosen by its first row: a date makes it the count
 * format) into *out, sorted by time; times from the trace's first row. 0, or -1 with err
 * naming the file and line. */
int pl_spot_trace_load(const char *path, pl_trace_event **out, int *n, char *err, size_t errlen);

/* The count format from text; `name` names it in errors. */
int pl_spot_trace_parse_counts(const char *text, const char *name, pl_trace_event **out, int *n,
                               char *err, size_t errlen);

/* The trace on a k-times larger cluster: node N becomes nodes N·k .. N·k + k − 1, every
 * event k events at the same time. k ≥ 1. */
int pl_spot_trace_scale(const pl_trace_event *in, int n, int k, pl_trace_event **out, int *nout,
                        char *err, size_t errlen);

/* The trace for a job that asks for at most `nodes` of the trace's spot nodes: a node the
 * trace adds is taken while fewer are held (else it stays in the market), and when a held
 * node is removed the oldest node of the market not held is taken at the same time (it
 * starts up as an added one). Times unchanged, node numbers kept. nodes ≥ 1. */
int pl_spot_trace_cap(const pl_trace_event *in, int n, int nodes, pl_trace_event **out, int *nout,
                      char *err, size_t errlen);

/* Zone-correlated preemptions (Bamboo §3: a spot group's simultaneous preemptions come
 * from one zone). Node N is in zone pl_spot_trace_zone(N, zones) = N mod zones (a group's
 * instances spread over its zones as they are bought). */
int pl_spot_trace_zone(int node, int zones);

/* The trace with zone losses: each preemption instant (the removes at one time) becomes,
 * with probability `loss`, the loss of the whole zone of its first removed node: every
 * live node of that zone is removed at that time. Whether an instant does is drawn from a
 * fixed seed and the instant's number (the same inputs give the same trace). A later
 * remove of a node already gone with its zone is dropped; adds are kept (a zone comes
 * back as the trace buys nodes again). zones ≥ 1, loss in [0, 1]. */
int pl_spot_trace_zones(const pl_trace_event *in, int n, int zones, double loss,
                        pl_trace_event **out, int *nout, char *err, size_t errlen);

#endif
