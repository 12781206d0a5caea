/* Checkpoints of an engine's layer range: safetensors files and checkpoint.json
 * written, found and loaded (checkpoint.h). */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "util.h"

static const char *const STATE_SUFFIX[3] = {"", ".exp_avg", ".exp_avg_sq"};

/* Host view of the engine's params, m, v: the memory itself on the CPU
 * backend, a copy otherwise (freed by release_host). */
static int host_views(const pl_engine *e, float *views[3])
{
    float *dev[3] = {e->params, e->m, e->v};
    int cpu = !strcmp(kn_backend(e->k), "cpu");
    for (int i = 0; i < 3; i++) {
        views[i] = cpu ? dev[i] : malloc(e->nparams * sizeof(float));
        if (!views[i]) return -1;
        if (!cpu) kn_to_host(e->k, views[i], dev[i], e->nparams * sizeof(float));
    }
    return 0;
}

static void release_host(const pl_engine *e, float *views[3])
{
    if (strcmp(kn_backend(e->k), "cpu"))
        for (int i = 0; i < 3; i++) free(views[i]);
}

/* mkdir of one directory that may exist already, as a directory. */
static int make_one_dir(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (mkdir(path, PL_CHECKPOINT_DIR_MODE) == 0) return 0;
    if (errno != EEXIST) return pl_errf(err, errlen, "%s: %s", path, strerror(errno));
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return pl_errf(err, errlen, "%s: exists and is not a directory", path);
    return 0;
}

static int make_dir(const char *path, char *err, size_t errlen)
{
    char buf[4096];
    if (pl_pathf(buf, sizeof buf, err, errlen, "%s", path)) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (make_one_dir(buf, err, errlen)) return -1;
        *p = '/';
    }
    return make_one_dir(buf, err, errlen);
}

int pl_checkpoint_save(const pl_engine *e, const char *dir, int64_t step, const char *info_json,
                       char *err, size_t errlen)
{
    float *host[3];
    if (host_views(e, host)) return pl_errf(err, errlen, "checkpoint: out of memory");
    int rc = pl_checkpoint_save_host(e, (const float *const *)host, dir, step, err, errlen);
    release_host(e, host);
    if (rc == 0 && info_json) rc = pl_checkpoint_complete(dir, step, info_json, err, errlen);
    return rc;
}

int pl_checkpoint_save_host(const pl_engine *e, const float *const host[3], const char *dir,
                            int64_t step, char *err, size_t errlen)
{
    char sdir[4096], path[4200];
    if (pl_pathf(sdir, sizeof sdir, err, errlen, "%s/step-%08lld", dir, (long long)step) ||
        make_dir(sdir, err, errlen))
        return -1;
    pl_st_writer *w = pl_st_writer_new();
    int rc = w ? 0 : pl_errf(err, errlen, "checkpoint: out of memory");
    for (int i = 0; rc == 0 && i < e->ntensors; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        int64_t shape[2] = {t->spec.dims[0], t->spec.dims[1]};
        for (int s = 0; rc == 0 && s < 3; s++) {
            char name[80];
            snprintf(name, sizeof name, "%s%s", t->name, STATE_SUFFIX[s]);
            rc = pl_st_writer_add(w, name, PL_ST_F32, t->spec.ndim, shape, host[s] + t->offset,
                                  err, errlen);
        }
    }
    if (rc == 0) rc = pl_st_writer_meta(w, "format", "pt", err, errlen);
    if (rc == 0)
        rc = pl_pathf(path, sizeof path, err, errlen, "%s/layers-%d-%d.safetensors", sdir,
                      e->begin, e->end);
    if (rc == 0) rc = pl_st_write_mode(w, path, PL_CHECKPOINT_FILE_MODE, err, errlen);
    pl_st_writer_free(w);
    return rc;
}

int pl_checkpoint_complete(const char *dir, int64_t step, const char *info_json, char *err,
                           size_t errlen)
{
    char path[4200];
    if (pl_pathf(path, sizeof path, err, errlen, "%s/step-%08lld/checkpoint.json", dir,
                 (long long)step))
        return -1;
    return pl_write_atomic_mode(path, &(pl_piece){info_json, strlen(info_json)}, 1,
                                PL_CHECKPOINT_FILE_MODE, err, errlen);
}

/* Unlinks the temporary files directly in d (which may not exist): their number, or −1. */
static int sweep_dir(const char *d, char *err, size_t errlen)
{
    DIR *dd = opendir(d);
    if (!dd) return errno == ENOENT ? 0 : pl_errf(err, errlen, "%s: %s", d, strerror(errno));
    int n = 0;
    struct dirent *de;
    while (n >= 0 && (de = readdir(dd))) {
        char path[4400];
        if (!pl_is_tmp_name(de->d_name)) continue;
        if (pl_pathf(path, sizeof path, err, errlen, "%s/%s", d, de->d_name)) n = -1;
        else if (unlink(path) && errno != ENOENT)
            n = pl_errf(err, errlen, "%s: cannot remove: %s", path, strerror(errno));
        else n++;
    }
    closedir(dd);
    return n;
}

int pl_checkpoint_sweep(const char *dir, int64_t upto, char *err, size_t errlen)
{
    int total = sweep_dir(dir, err, errlen);
    DIR *d = total < 0 ? NULL : opendir(dir);
    if (!d) return total;
    struct dirent *de;
    while (total >= 0 && (de = readdir(d))) {
        long long st;
        char tail, sub[4400];
        if (sscanf(de->d_name, "step-%lld%c", &st, &tail) != 1 || st > upto) continue;
        int n = pl_pathf(sub, sizeof sub, err, errlen, "%s/%s", dir, de->d_name)
                    ? -1 : sweep_dir(sub, err, errlen);
        total = n < 0 ? -1 : total + n;
    }
    closedir(d);
    return total;
}

static int has_info(const char *dir)
{
    char p[4200];
    struct stat st;
    return pl_pathf(p, sizeof p, NULL, 0, "%s/checkpoint.json", dir) == 0 && stat(p, &st) == 0;
}

/* A complete checkpoint found under a directory: its step and its directory's name. */
typedef struct {
    long long step;
    char name[256];
} found_ckpt;

/* The complete checkpoints (step-N holding checkpoint.json) under dir, newest first, in
 * *list (malloc'd; NULL when none). The count, 0 when dir does not exist, or -1 and err. */
static int complete_checkpoints(const char *dir, found_ckpt **list, char *err, size_t errlen)
{
    *list = NULL;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : pl_errf(err, errlen, "%s: %s", dir, strerror(errno));
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long st;
        char tail, sub[4200];
        if (sscanf(de->d_name, "step-%lld%c", &st, &tail) != 1 || strlen(de->d_name) >= 256 ||
            pl_pathf(sub, sizeof sub, NULL, 0, "%s/%s", dir, de->d_name) || !has_info(sub))
            continue;
        if (n == cap) {
            found_ckpt *x = realloc(*list, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *x);
            if (!x) {
                closedir(d);
                free(*list);
                *list = NULL;
                return pl_errf(err, errlen, "%s: out of memory", dir);
            }
            *list = x;
        }
        int k = n++; /* insertion, newest first */
        for (; k > 0 && (*list)[k - 1].step < st; k--) (*list)[k] = (*list)[k - 1];
        (*list)[k].step = st;
        snprintf((*list)[k].name, sizeof (*list)[k].name, "%s", de->d_name);
    }
    closedir(d);
    return n;
}

int pl_checkpoint_latest(const char *dir, char *out, size_t outlen, char *err, size_t errlen)
{
    if (has_info(dir)) return pl_pathf(out, outlen, err, errlen, "%s", dir) ? -1 : 1;
    found_ckpt *list;
    int n = complete_checkpoints(dir, &list, err, errlen);
    int rc = n > 0 ? (pl_pathf(out, outlen, err, errlen, "%s/%s", dir, list[0].name) ? -1 : 1)
                   : n;
    free(list);
    return rc;
}

/* Deletes one checkpoint directory: checkpoint.json first (it is incomplete from then on,
 * whatever happens next), then its files, then itself. */
static int remove_checkpoint(const char *sdir, char *err, size_t errlen)
{
    char path[4400];
    if (pl_pathf(path, sizeof path, err, errlen, "%s/checkpoint.json", sdir)) return -1;
    if (unlink(path) && errno != ENOENT)
        return pl_errf(err, errlen, "%s: %s", path, strerror(errno));
    DIR *d = opendir(sdir);
    if (!d) return pl_errf(err, errlen, "%s: %s", sdir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (pl_pathf(path, sizeof path, err, errlen, "%s/%s", sdir, de->d_name)) rc = -1;
        else if (unlink(path)) rc = pl_errf(err, errlen, "%s: %s", path, strerror(errno));
    }
    closedir(d);
    if (rc == 0 && rmdir(sdir)) rc = pl_errf(err, errlen, "%s: %s", sdir, strerror(errno));
    return rc;
}

int pl_checkpoint_prune(const char *dir, int keep, char *err, size_t errlen)
{
    if (keep <= 0) return 0;
    found_ckpt *list;
    int n = complete_checkpoints(dir, &list, err, errlen), removed = 0;
    for (int k = keep; k < n; k++) {
        char sdir[4400];
        if (pl_pathf(sdir, sizeof sdir, err, errlen, "%s/%s", dir, list[k].name) ||
            remove_checkpoint(sdir, err, errlen)) {
            removed = -1;
            break;
        }
        removed++;
    }
    free(list);
    return n < 0 ? -1 : removed;
}

/* The safetensors files of a step directory, opened. */
static int open_files(const char *step_dir, pl_st_file **files, int *n, char *err, size_t errlen)
{
    *files = NULL;
    *n = 0;
    DIR *d = opendir(step_dir);
    if (!d) return pl_errf(err, errlen, "%s: %s", step_dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
        pl_st_file *grown = realloc(*files, (size_t)(*n + 1) * sizeof **files);
        if (!grown) {
            rc = pl_errf(err, errlen, "checkpoint: out of memory");
            break;
        }
        *files = grown;
        char path[4200];
        if (pl_pathf(path, sizeof path, err, errlen, "%s/%s", step_dir, de->d_name) == 0 &&
            pl_st_open(path, &(*files)[*n], err, errlen) == 0)
            (*n)++;
        else
            rc = -1;
    }
    closedir(d);
    if (rc == 0 && *n == 0) rc = pl_errf(err, errlen, "%s: no .safetensors files", step_dir);
    return rc;
}

int pl_checkpoint_load(pl_engine *e, const char *step_dir, int optimizer, char *err,
                       size_t errlen)
{
    pl_st_file *files;
    int nfiles;
    int rc = open_files(step_dir, &files, &nfiles, err, errlen);
    float *dst[3] = {e->params, e->m, e->v};
    for (int i = 0; rc == 0 && i < e->ntensors; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        int64_t shape[2] = {t->spec.dims[0], t->spec.dims[1]};
        for (int s = 0; rc == 0 && s < (optimizer ? 3 : 1); s++) {
            char name[80];
            snprintf(name, sizeof name, "%s%s", t->name, STATE_SUFFIX[s]);
            const pl_st_tensor *found = NULL;
            int f = 0;
            for (; f < nfiles && !found; f++) found = pl_st_find(&files[f], name);
            if (!found) {
                rc = pl_errf(err, errlen, "%s: no tensor \"%s\" in any checkpoint file",
                             step_dir, name);
                break;
            }
            if (!pl_st_expect(&files[f - 1], name, PL_ST_F32, t->spec.ndim, shape, err, errlen)) {
                rc = -1;
                break;
            }
            kn_to_device(e->k, dst[s] + t->offset, found->data, found->nbytes);
        }
    }
    for (int f = 0; f < nfiles; f++) pl_st_close(&files[f]);
    free(files);
    return rc;
}

int pl_engine_from_checkpoint(pl_engine *e, kn_ctx *k, const char *dir, int B, int T, char *err,
                              size_t errlen)
{
    char step_dir[4096];
    int found = pl_checkpoint_latest(dir, step_dir, sizeof step_dir, err, errlen);
    if (found <= 0)
        return found < 0 ? -1 : pl_errf(err, errlen, "%s: no complete checkpoint", dir);
    pl_checkpoint_meta meta;
    if (pl_checkpoint_meta_load(step_dir, &meta, err, errlen)) return -1;
    const pl_gpt_config cfg = meta.cfg;
    /* T = 0: the sequence length it was trained with, when it says and it fits */
    if (T <= 0) T = meta.seq_len >= 1 && meta.seq_len <= cfg.maxT ? meta.seq_len : cfg.maxT;
    if (pl_engine_create(e, k, &cfg, 0, cfg.L + 2, B, T, 1, err, errlen)) return -1;
    if (pl_checkpoint_load(e, step_dir, 0, err, errlen)) {
        pl_engine_destroy(e);
        return -1;
    }
    return 0;
}
