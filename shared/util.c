/* Helpers every module shares: error formatting, whole-file reads, atomic writes,
 * checked allocation, the monotonic clock (util.h). */
#include "util.h"

#include <fcntl.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int pl_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

char *pl_read_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        pl_errf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len + 1 < cap) break;
        char *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        pl_errf(err, errlen, "%s: %s", path, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

void *pl_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

int pl_pathf(char *out, size_t outlen, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, outlen, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= outlen)
        return pl_errf(err, errlen, "path too long (over %zu bytes): %.60s...", outlen - 1, out);
    return 0;
}

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static void fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

/* PATH.tmp.XXXXXX, fsync, rename over path, fsync the directory: a crash
 * leaves the old file or the new one, never a partial one. */
int pl_write_atomic(const char *path, const pl_piece *pieces, int npieces, char *err, size_t errlen)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 12);
    if (!tmp) return pl_errf(err, errlen, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return pl_errf(err, errlen, "%s: cannot create temporary file: %s", path, strerror(e));
    }
    fchmod(fd, 0644);
    const char *what = NULL;
    int e = 0;
    for (int i = 0; i < npieces && !what; i++)
        if (write_all(fd, pieces[i].data, pieces[i].len) != 0) what = "write", e = errno;
    if (!what && fsync(fd) != 0) what = "fsync", e = errno;
    if (close(fd) != 0 && !what) what = "close", e = errno;
    if (!what && rename(tmp, path) != 0) what = "rename", e = errno;
    if (what) {
        unlink(tmp);
        free(tmp);
        return pl_errf(err, errlen, "%s: %s failed: %s", path, what, strerror(e));
    }
    free(tmp);
    fsync_parent(path);
    return 0;
}

double pl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
