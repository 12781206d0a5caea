/* What the fuzz targets share: the libFuzzer entry point, the input as a
 * NUL-terminated string or as a file, and a check that aborts (a crash the fuzzer
 * reports with its reproducer). Each target is built twice (tests/fuzz/README.md):
 * with libFuzzer, and with replay.c as a corpus replayer. */
#ifndef PLIANT_FUZZ_H
#define PLIANT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property of the parser that must hold for every input. */
#define FUZZ_CHECK(cond)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            abort();                                                                  \
        }                                                                             \
    } while (0)

/* The input as a heap string (the caller frees): parsers of text stop at a NUL. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    FUZZ_CHECK(s);
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* The input as a file, for parsers that take a path: one in-memory file per process
 * (memfd), rewritten for each input; its path is /proc/self/fd/N. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-input", 0);
        FUZZ_CHECK(fd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0);
    for (size_t done = 0; done < size;) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        FUZZ_CHECK(w > 0);
        done += (size_t)w;
    }
    return path;
}

#endif
