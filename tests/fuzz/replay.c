/* The fuzz targets without libFuzzer: main() runs every file named on the command
 * line, and every file of every directory named, once through the target's
 * LLVMFuzzerTestOneInput, each from a buffer of exactly its size. Built with the
 * default compiler under ASan + UBSan, it checks the committed corpus on machines
 * without clang. It names each input on stderr ("running: PATH") before running it, so
 * a crash's reproducer is the last one named; at the end it prints "replayed N inputs". */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* libFuzzer's optional hook, when the target has one. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    size_t got = buf ? fread(buf, 1, n, f) : 0;
    fclose(f);
    if (!buf || got != n) {
        fprintf(stderr, "%s: read error\n", path);
        free(buf);
        return -1;
    }
    fprintf(stderr, "running: %s\n", path);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

/* The files of dir, sorted by name so a run is reproducible; their number, or −1. */
static int run_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort), count = 0, rc = 0;
    if (n < 0) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) == 0) count++;
            else rc = -1;
        }
        free(names[i]);
    }
    free(names);
    return rc ? -1 : count;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int total = 0, failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int n = stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode) ? run_dir(argv[i])
                                                                : (run_file(argv[i]) ? -1 : 1);
        if (n < 0) failed = 1;
        else total += n;
    }
    printf("replayed %d inputs\n", total);
    return failed ? 2 : 0;
}
