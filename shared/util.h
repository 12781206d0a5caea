/* Small helpers shared by every module: error messages, files, allocation, the clock. */
#ifndef PLIANT_UTIL_H
#define PLIANT_UTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Formats into err (when non-NULL) and returns -1, so callers can write
 * `return pl_errf(err, errlen, "field: reason");`. */
int pl_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reads a whole file into a NUL-terminated heap buffer; NULL and err on failure. */
char *pl_read_file(const char *path, char *err, size_t errlen);

/* Formats a path into out; −1 (with a message in err) when it does not fit. */
int pl_pathf(char *out, size_t outlen, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* One contiguous part of a file being written. */
typedef struct {
    const void *data;
    size_t len;
} pl_piece;

/* What temporary files are named: the final name, PL_TMP_INFIX, six letters or digits. */
#define PL_TMP_INFIX ".tmp."

/* Writes the pieces as path atomically: a new temporary file PATH.tmp.XXXXXX created
 * with `mode` less the process's umask (as open(2) does), written, fsync'd, renamed
 * over path, then path's directory fsync'd. A failure before the rename removes the
 * temporary file and leaves path as it was; a failed directory fsync is an error too
 * (the new file is in place but may not survive a crash). −1 and err naming path. */
int pl_write_atomic_mode(const char *path, const pl_piece *pieces, int npieces, mode_t mode,
                         char *err, size_t errlen);

/* pl_write_atomic_mode with mode 0666 (as fopen: the umask decides). */
int pl_write_atomic(const char *path, const pl_piece *pieces, int npieces, char *err,
                    size_t errlen);

/* 1 when a directory entry's name is one of pl_write_atomic's temporary files
 * ("NAME.tmp.XXXXXX"), left behind only by a process that died while writing. */
int pl_is_tmp_name(const char *name);

/* calloc that treats overflow as failure. */
void *pl_calloc(size_t n, size_t size);

/* Milliseconds on the monotonic clock, with sub-millisecond resolution: the one
 * clock of every deadline, timeout and duration (never the wall clock, which jumps). */
double pl_now_ms(void);

#endif
