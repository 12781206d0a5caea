/* Internal helpers shared by tcp.c and allreduce.c (not part of the public API). */
#ifndef PLIANT_COMM_IO_H
#define PLIANT_COMM_IO_H

#include <stddef.h>
#include <stdint.h>

/* Formats into err (when non-NULL) and returns code. */
int pl_comm_errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Monotonic milliseconds. */
/* now + timeout_ms, or −1 (forever) for a negative timeout. */
int64_t pl_comm_deadline(int timeout_ms);
/* Milliseconds left until deadline for poll(): −1 forever, 0 when passed. */
int pl_comm_poll_timeout(int64_t deadline);
/* Maps a socket errno to PL_COMM_ECLOSED or PL_COMM_ESYS. */
int pl_comm_io_errno(int e);

#endif
