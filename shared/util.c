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

/* fsync of path's directory, so that a rename in it is durable: 0, or −1 and err.
 * EINVAL (a file system that cannot sync directories) counts as done. */
static int fsync_parent(const char *path, char *err, size_t errlen)
{
    char *copy = strdup(path);
    if (!copy) return pl_errf(err, errlen, "%s: out of memory", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC), e = 0;
    if (fd < 0) e = errno;
    else if (fsync(fd) != 0 && errno != EINVAL) e = errno;
    if (fd >= 0) close(fd);
    int rc = e ? pl_errf(err, errlen, "%s: directory fsync failed (%s): %s", path, copy,
                         strerror(e))
               : 0;
    free(copy);
    return rc;
}

/* Creates PATH.tmp.XXXXXX (six random letters) with open(O_CREAT | O_EXCL, mode),
 * so that the umask applies; its descriptor with the name in tmp, or −1 and errno. */
static int create_tmp(const char *path, mode_t mode, char *tmp, size_t tmplen)
{
    static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)tmp;
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[7];
        for (int i = 0; i < 6; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            suffix[i] = letters[(x >> 33) % (sizeof letters - 1)];
        }
        suffix[6] = '\0';
        if ((size_t)snprintf(tmp, tmplen, "%s%s%s", path, PL_TMP_INFIX, suffix) >= tmplen) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

int pl_is_tmp_name(const char *name)
{
    const char *p = strstr(name, PL_TMP_INFIX);
    if (!p || p == name) return 0;
    for (const char *q; (q = strstr(p + 1, PL_TMP_INFIX));) p = q;
    p += strlen(PL_TMP_INFIX);
    if (strlen(p) != 6) return 0;
    for (int i = 0; i < 6; i++)
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') ||
              (p[i] >= '0' && p[i] <= '9')))
            return 0;
    return 1;
}

/* The pieces into fd: 0, or the failed call's name with *e = errno. */
static const char *write_pieces(int fd, const pl_piece *pieces, int npieces, int *e)
{
    for (int i = 0; i < npieces; i++)
        if (write_all(fd, pieces[i].data, pieces[i].len) != 0) return *e = errno, "write";
    if (fsync(fd) != 0) return *e = errno, "fsync";
    return NULL;
}

int pl_write_atomic_mode(const char *path, const pl_piece *pieces, int npieces, mode_t mode,
                         char *err, size_t errlen)
{
    size_t tlen = strlen(path) + sizeof PL_TMP_INFIX + 8;
    char *tmp = malloc(tlen);
    if (!tmp) return pl_errf(err, errlen, "%s: out of memory", path);
    int fd = create_tmp(path, mode, tmp, tlen);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return pl_errf(err, errlen, "%s: cannot create temporary file: %s", path, strerror(e));
    }
    int e = 0;
    const char *what = write_pieces(fd, pieces, npieces, &e);
    if (close(fd) != 0 && !what) what = "close", e = errno;
    if (!what && rename(tmp, path) != 0) what = "rename", e = errno;
    if (what) unlink(tmp);
    free(tmp);
    if (what) return pl_errf(err, errlen, "%s: %s failed: %s", path, what, strerror(e));
    return fsync_parent(path, err, errlen);
}

int pl_write_atomic(const char *path, const pl_piece *pieces, int npieces, char *err, size_t errlen)
{
    return pl_write_atomic_mode(path, pieces, npieces, 0666, err, errlen);
}

double pl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
