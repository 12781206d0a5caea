/* Temporary files for tests: a private directory (set `dir` with mkdtemp),
 * paths inside it, raw writes, counting entries, recursive removal. */
#ifndef PLIANT_TEST_TMPFILES_H
#define PLIANT_TEST_TMPFILES_H

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static char dir[64];

/* dir/name; the last 8 results stay valid. */
static const char *path_in(const char *name)
{
    static char buf[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void rm_rf(const char *p) { nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Number of entries in directory d whose name contains needle. */
static int count_entries(const char *d, const char *needle)
{
    DIR *dp = opendir(d);
    if (!dp) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)))
        if (e->d_name[0] != '.' && strstr(e->d_name, needle)) n++;
    closedir(dp);
    return n;
}

static int write_raw(const char *p, const void *data, size_t len)
{
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    fclose(f);
    return w == len ? 0 : -1;
}

#endif
