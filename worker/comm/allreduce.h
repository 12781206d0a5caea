/* Collectives over established pl_conn connections: ring all-reduce (sum) of fp32
 * buffers among an arbitrary ordered group of ranks.
 *
 * The group is the ordered list of ranks that hold one parameter tensor (ARCHITECTURE.md:
 * "Gradient sync is per layer"). Every member calls with the same group (same order),
 * the same element count and the same tag; each needs open connections to its ring
 * neighbours (the members before and after it in the group, cyclically). A group of 1
 * returns at once; a group of 2 uses its one connection in both directions.
 *
 * Algorithm: reduce-scatter then all-gather over p = group_size segments, each moved in
 * frames of at most PL_ALLREDUCE_CHUNK_FLOATS floats; in every step the send to the
 * next member and the receive from the previous one progress together on non-blocking
 * sockets under poll(), so neighbours never wait on each other. Segment s is summed in
 * ring order starting at member s — ((x_s + x_{s+1}) + x_{s+2}) + … — and the all-gather
 * copies the finished sums, so the result is bitwise identical on every member and
 * deterministic for a given group order. Frames carry the tag and the step, so members
 * that disagree on the collective get PL_COMM_EPROTO, not silently wrong sums.
 *
 * timeout_ms is an idle timeout (no byte moved on either neighbour connection). Any error
 * leaves both neighbour connections marked broken (see tcp.h) and buf undefined: the one
 * that failed (the one waited for on a timeout) with the error's code, the other with
 * PL_COMM_ECANCELED, so that the caller can tell which peer to report. */
#ifndef PLIANT_COMM_ALLREDUCE_H
#define PLIANT_COMM_ALLREDUCE_H

#include "tcp.h"

#include <stddef.h>
#include <stdint.h>

#define PL_ALLREDUCE_CHUNK_FLOATS (128u * 1024u) /* 512 KiB frames */

/* This process's connections: conn[r] is the connection to rank r (NULL for self or
 * where none is open), r in 0..nranks-1. */
typedef struct {
    int32_t self;
    int nranks;
    pl_conn *const *conn;
} pl_peer_table;

typedef struct {
    float *data;
    size_t count;
} pl_tensor_ref;

/* Sums buf (n floats) across the group in place. */
int pl_ring_allreduce(const pl_peer_table *peers, const int32_t *group, int group_size,
                      float *buf, size_t n, uint32_t tag, int timeout_ms, char *err,
                      size_t errlen);

/* A pack buffer kept from one all-reduce to the next (its owner's; one call at a time):
 * fresh memory for every group of every step costs the kernel a fault on every page (a
 * sync group is tens of MB at GPT-2 350M). Zero-initialised; pl_ar_pack_free releases. */
typedef struct {
    float *buf;
    size_t cap; /* floats */
} pl_ar_pack;
void pl_ar_pack_free(pl_ar_pack *p);

/* Sums several tensors in one ring all-reduce: packs them (in list order) into one
 * buffer (pack's, grown as needed; NULL: one for this call), reduces it, and unpacks.
 * Every member passes the same counts in the same order. A single tensor is reduced in
 * place without packing. */
int pl_ring_allreduce_many(const pl_peer_table *peers, const int32_t *group, int group_size,
                           const pl_tensor_ref *tensors, int ntensors, uint32_t tag,
                           pl_ar_pack *pack, int timeout_ms, char *err, size_t errlen);

#endif
