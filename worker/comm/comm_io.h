/* Internal helpers shared by the files of worker/comm (not part of the public API):
 * errors, deadlines, little-endian fields, and the frame protection of a connection for
 * the transports that drive its socket themselves (stage_link.c, allreduce.c). */
#ifndef PLIANT_COMM_IO_H
#define PLIANT_COMM_IO_H

#include <stddef.h>
#include <stdint.h>

#include "aead.h"
#include "tcp.h"

/* Formats into err (when non-NULL) and returns code. */
int pl_comm_errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* now + timeout_ms, or −1 (forever) for a negative timeout. */
int64_t pl_comm_deadline(int timeout_ms);
/* Milliseconds left until deadline for poll(): −1 forever, 0 when passed. */
int pl_comm_poll_timeout(int64_t deadline);
/* Maps a socket errno to PL_COMM_ECLOSED or PL_COMM_ESYS. */
int pl_comm_io_errno(int e);

static inline void pl_put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}
static inline void pl_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void pl_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint16_t pl_get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t pl_get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t pl_get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* The protection state of c's sending and receiving direction: NULL when its frames are
 * not protected (PL_PROTECT_NONE). They belong to c and follow its threading rule. */
pl_aead *pl_conn_tx_aead(pl_conn *c);
pl_aead *pl_conn_rx_aead(pl_conn *c);
/* A received frame failed its tag: marks c broken (PL_COMM_EAUTH), shuts its socket down
 * and formats the error, naming the peer and where (e.g. "all-reduce"). Returns
 * PL_COMM_EAUTH. */
int pl_conn_auth_failed(pl_conn *c, const char *where, char *err, size_t errlen);

#endif
