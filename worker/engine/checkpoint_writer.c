/* Checkpoints written by a background thread from a copy of the engine's state
 * (checkpoint_writer.h). */
#include "checkpoint_writer.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "util.h"

struct pl_checkpoint_writer {
    pl_checkpoint_done_fn done;
    void *user;
    pthread_t th;
    int running;
    /* the snapshot: e's layout (own tensor table) and host copies of params, m, v */
    pl_engine layout;
    float *host[3];
    size_t cap;      /* floats allocated in each host array */
    char dir[4096];
    int64_t step;
};

pl_checkpoint_writer *pl_checkpoint_writer_new(pl_checkpoint_done_fn done, void *user)
{
    pl_checkpoint_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->done = done;
        w->user = user;
    }
    return w;
}

void pl_checkpoint_writer_wait(pl_checkpoint_writer *w)
{
    if (w && w->running) {
        pthread_join(w->th, NULL);
        w->running = 0;
    }
}

void pl_checkpoint_writer_free(pl_checkpoint_writer *w)
{
    if (!w) return;
    pl_checkpoint_writer_wait(w);
    free(w->layout.tensors);
    for (int i = 0; i < 3; i++) free(w->host[i]);
    free(w);
}

static void *write_main(void *arg)
{
    pl_checkpoint_writer *w = arg;
    char err[512] = "";
    int rc = pl_checkpoint_save_host(&w->layout, (const float *const *)w->host, w->dir, w->step,
                                     err, sizeof err);
    int64_t bytes = rc ? 0 : (int64_t)(3 * w->layout.nparams * sizeof(float));
    if (w->done) w->done(w->user, w->step, w->layout.begin, w->layout.end, rc, bytes, err);
    return NULL;
}

int pl_checkpoint_writer_start(pl_checkpoint_writer *w, const pl_engine *e, const char *dir, int64_t step,
                         char *err, size_t errlen)
{
    pl_checkpoint_writer_wait(w);
    if (w->cap < e->nparams) {
        for (int i = 0; i < 3; i++) {
            free(w->host[i]);
            w->host[i] = malloc(e->nparams * sizeof(float));
        }
        w->cap = w->host[0] && w->host[1] && w->host[2] ? e->nparams : 0;
        if (!w->cap) return pl_errf(err, errlen, "checkpoint: out of memory");
    }
    pl_engine_tensor *t = realloc(w->layout.tensors, (size_t)e->ntensors * sizeof *t);
    if (!t) return pl_errf(err, errlen, "checkpoint: out of memory");
    memcpy(t, e->tensors, (size_t)e->ntensors * sizeof *t);
    /* only the layout fields: the snapshot owns no engine memory but its tensor table */
    memset(&w->layout, 0, sizeof w->layout);
    w->layout.cfg = e->cfg;
    w->layout.begin = e->begin;
    w->layout.end = e->end;
    w->layout.nparams = e->nparams;
    w->layout.ntensors = e->ntensors;
    w->layout.tensors = t;
    w->layout.wte_tensor = e->wte_tensor;
    const float *src[3] = {e->params, e->m, e->v};
    int cpu = !strcmp(kn_backend(e->k), "cpu");
    for (int i = 0; i < 3; i++) {
        if (cpu)
            memcpy(w->host[i], src[i], e->nparams * sizeof(float));
        else
            kn_to_host(e->k, w->host[i], src[i], e->nparams * sizeof(float));
    }
    if (pl_pathf(w->dir, sizeof w->dir, err, errlen, "%s", dir)) return -1;
    w->step = step;
    if (pthread_create(&w->th, NULL, write_main, w))
        return pl_errf(err, errlen, "checkpoint: cannot start the writer thread");
    w->running = 1;
    return 0;
}
