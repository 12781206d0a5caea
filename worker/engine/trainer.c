/* `pliant train`: a TrainingJob's whole model trained in one process (trainer.h). */
#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "sampler.h"
#include "tokens.h"
#include "training_schedule.h"
#include "util.h"

int pl_job_gpt_config(const pl_job *job, pl_gpt_config *cfg, char *err, size_t errlen)
{
    const pl_model_spec *m = &job->model;
    return pl_gpt_config_init(cfg, m->layers, m->channels, m->heads, m->vocab_size,
                              m->max_seq_len, err, errlen);
}

int pl_engine_init_from_job(pl_engine *e, const pl_job *job, char *err, size_t errlen)
{
    const pl_model_spec *m = &job->model;
    switch (m->init) {
    case PL_INIT_RANDOM:
        pl_engine_init_random(e, m->seed);
        return 0;
    case PL_INIT_LLMC: {
        pl_llmc_model lm;
        if (pl_llmc_read(m->init_path, &lm, err, errlen)) return -1;
        int rc = pl_engine_load_llmc(e, &lm, err, errlen);
        pl_llmc_free(&lm);
        return rc;
    }
    case PL_INIT_CHECKPOINT: {
        char dir[4096];
        int found = pl_checkpoint_latest(m->init_path, dir, sizeof dir, err, errlen);
        if (found < 0) return -1;
        if (!found)
            return pl_errf(err, errlen, "spec.model.init: no complete checkpoint in %s",
                           m->init_path);
        return pl_checkpoint_load(e, dir, 0, err, errlen);
    }
    }
    return pl_errf(err, errlen, "spec.model.init: unknown kind");
}

typedef struct {
    const pl_job *job;
    pl_engine e;
    pl_tokens train, val;
    int have_val;
    pl_sampler smp;
    int32_t *inputs, *targets;
    int steps;
    FILE *metrics;
} run;

static void run_free(run *r)
{
    if (r->e.k) {
        kn_ctx *k = r->e.k;
        pl_engine_destroy(&r->e);
        kn_destroy(k);
    }
    pl_tokens_close(&r->train);
    if (r->have_val) pl_tokens_close(&r->val);
    free(r->inputs);
    free(r->targets);
    if (r->metrics) fclose(r->metrics);
}

static int open_data(run *r, char *err, size_t errlen)
{
    const pl_job *j = r->job;
    if (pl_tokens_open_vocab(j->data.train, j->model.vocab_size, &r->train, err, errlen) ||
        pl_sampler_init(&r->smp, j->data.order, j->data.seed, pl_tokens_count(&r->train),
                        j->batch.seq_len, j->batch.global, err, errlen))
        return -1;
    if (j->data.val[0] && j->eval_every > 0) {
        if (pl_tokens_open_vocab(j->data.val, j->model.vocab_size, &r->val, err, errlen))
            return -1;
        r->have_val = 1;
    }
    size_t bt = (size_t)j->batch.micro * (size_t)j->batch.seq_len;
    r->inputs = malloc(bt * sizeof *r->inputs);
    r->targets = malloc(bt * sizeof *r->targets);
    return r->inputs && r->targets ? 0 : pl_errf(err, errlen, "train: out of memory");
}

int pl_job_eval_sampler(const pl_job *job, const pl_tokens *val, pl_sampler *vs,
                        int64_t *nbatches, char *err, size_t errlen)
{
    if (pl_sampler_init_eval(vs, pl_tokens_count(val), job->batch.seq_len, job->batch.micro, err,
                             errlen))
        return -1;
    *nbatches = pl_sampler_eval_batches(vs, job->eval_batches);
    return 0;
}

/* Mean loss over the evaluation batches of the validation stream. */
static int evaluate(run *r, double *loss, char *err, size_t errlen)
{
    const pl_job *j = r->job;
    pl_sampler vs;
    int64_t n;
    if (pl_job_eval_sampler(j, &r->val, &vs, &n, err, errlen)) return -1;
    double sum = 0;
    for (int64_t b = 0; b < n; b++) {
        pl_sampler_fill(&vs, &r->val, b, 0, j->batch.micro, r->inputs, r->targets);
        sum += pl_engine_forward(&r->e, 0, r->inputs, NULL, r->targets);
    }
    *loss = sum / (double)n;
    return 0;
}

char *pl_checkpoint_info_json(const pl_job *j, const pl_gpt_config *c, int64_t step)
{
    char *s = NULL;
    if (asprintf(&s,
                 "{\"format\": \"pliant-checkpoint-v1\", \"job\": \"%s\", \"step\": %lld,\n"
                 " \"model\": {\"layers\": %d, \"channels\": %d, \"heads\": %d, "
                 "\"vocab_size\": %d, \"max_seq_len\": %d},\n"
                 " \"data\": {\"order\": \"%s\", \"seed\": %llu, \"global\": %d, \"seq_len\": %d, "
                 "\"samples_seen\": %lld},\n"
                 " \"optimizer\": {\"lr\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, "
                 "\"weight_decay\": %.9g, \"adam_t\": %lld}}\n",
                 j->name, (long long)step, c->L, c->C, c->NH, c->V, c->maxT,
                 j->data.order == PL_ORDER_SHUFFLED ? "shuffled" : "sequential",
                 (unsigned long long)j->data.seed, j->batch.global, j->batch.seq_len,
                 (long long)step * j->batch.global, j->optimizer.lr, j->optimizer.beta1,
                 j->optimizer.beta2, j->optimizer.eps, j->optimizer.weight_decay,
                 (long long)step) < 0)
        return NULL;
    return s;
}

int pl_job_complete_checkpoint(const pl_job *job, int64_t step, char *err, size_t errlen)
{
    pl_gpt_config cfg;
    if (pl_job_gpt_config(job, &cfg, err, errlen)) return -1;
    if (!job->checkpoint.dir[0]) return pl_errf(err, errlen, "spec.checkpoint.dir: not set");
    char *info = pl_checkpoint_info_json(job, &cfg, step);
    if (!info) return pl_errf(err, errlen, "out of memory");
    int rc = pl_checkpoint_complete(job->checkpoint.dir, step, info, err, errlen);
    free(info);
    return rc;
}

int pl_job_prune_checkpoints(const pl_job *job, char *err, size_t errlen)
{
    if (!job->checkpoint.dir[0]) return 0;
    int64_t newest;
    if (pl_job_checkpoint_step(job, &newest, err, errlen) < 0 ||
        pl_checkpoint_sweep(job->checkpoint.dir, newest, err, errlen) < 0)
        return -1;
    if (job->checkpoint.keep <= 0) return 0;
    return pl_checkpoint_prune(job->checkpoint.dir, job->checkpoint.keep, err, errlen);
}

int pl_job_checkpoint_step(const pl_job *job, int64_t *step, char *err, size_t errlen)
{
    *step = 0;
    char dir[PL_PATH_MAX + 32];
    int found = pl_checkpoint_latest(job->checkpoint.dir, dir, sizeof dir, err, errlen);
    if (found <= 0) return found;
    pl_gpt_config cfg;
    return pl_checkpoint_config(dir, &cfg, step, err, errlen);
}

static int save_checkpoint(run *r, int64_t step, char *err, size_t errlen)
{
    char *info = pl_checkpoint_info_json(r->job, &r->e.cfg, step);
    if (!info) return pl_errf(err, errlen, "checkpoint: out of memory");
    int rc = pl_checkpoint_save(&r->e, r->job->checkpoint.dir, step, info, err, errlen);
    free(info);
    return rc;
}

/* Continues from the newest checkpoint of spec.checkpoint.dir, if any. */
static int resume(run *r, int64_t *start, char *err, size_t errlen)
{
    const pl_job *j = r->job;
    *start = 0;
    if (!j->checkpoint.dir[0]) return 0;
    /* the one writer of its directory: what a crash left half-written goes */
    if (pl_checkpoint_sweep(j->checkpoint.dir, INT64_MAX, err, errlen) < 0) return -1;
    if (j->checkpoint.resume != PL_RESUME_AUTO) return 0;
    char dir[4096];
    int found = pl_checkpoint_latest(j->checkpoint.dir, dir, sizeof dir, err, errlen);
    if (found <= 0) return found;
    pl_checkpoint_meta meta;
    if (pl_checkpoint_meta_load(dir, &meta, err, errlen)) return -1;
    if (pl_checkpoint_load(&r->e, dir, 1, err, errlen)) return -1;
    *start = meta.step;
    return 1;
}

static int train_step(run *r, int64_t s, double *loss, double *norm, float *lr)
{
    const pl_job *j = r->job;
    const int B = j->batch.micro, G = j->batch.global, T = j->batch.seq_len;
    pl_engine_zero_grads(&r->e);
    double sum = 0;
    for (int i = 0; i < G / B; i++) {
        if (pl_sampler_fill(&r->smp, &r->train, s, i * B, B, r->inputs, r->targets)) return -1;
        sum += pl_engine_forward(&r->e, 0, r->inputs, NULL, r->targets);
        const float scale = 1.0f / (float)((size_t)G * (size_t)T);
        if (i + 1 < G / B) pl_engine_backward(&r->e, 0, NULL, scale);
        else pl_engine_backward_last(&r->e, 0, NULL, scale, NULL, NULL);
    }
    *loss = sum / (G / B);
    *norm = sqrt(pl_engine_grad_sumsq(&r->e));
    const pl_optimizer_spec *o = &j->optimizer;
    float scale = o->grad_clip > 0 && *norm > o->grad_clip ? (float)(o->grad_clip / *norm) : 1.0f;
    *lr = pl_lr_at((float)o->lr, o->schedule == PL_SCHEDULE_COSINE, o->warmup_steps,
                   (float)o->min_lr_ratio, (int)s, r->steps);
    pl_adamw a = {*lr, (float)o->beta1, (float)o->beta2, (float)o->eps, (float)o->weight_decay};
    pl_engine_adamw(&r->e, &a, scale, (int)s + 1);
    return 0;
}

/* The model's engine on kernels of o's backend, its metrics file, and its parameters:
 * from the newest checkpoint (*start its step; 1) or as spec.model.init says (0). -1
 * and err. */
static int start_run(run *r, const pl_train_options *o, int64_t *start, char *err,
                     size_t errlen)
{
    const pl_job *job = r->job;
    pl_gpt_config cfg;
    if (pl_job_gpt_config(job, &cfg, err, errlen) || open_data(r, err, errlen)) return -1;
    kn_ctx *k = kn_create(o->backend ? o->backend : "cpu", o->threads, err, errlen);
    if (!k) return -1;
    if (pl_engine_create(&r->e, k, &cfg, 0, cfg.L + 2, job->batch.micro, job->batch.seq_len, 1,
                         err, errlen)) {
        kn_destroy(k);
        return -1;
    }
    if (o->metrics_path && !(r->metrics = fopen(o->metrics_path, "w")))
        return pl_errf(err, errlen, "--metrics %s: cannot open for writing", o->metrics_path);
    int resumed = resume(r, start, err, errlen);
    if (resumed < 0 || (!resumed && pl_engine_init_from_job(&r->e, job, err, errlen))) return -1;
    return resumed;
}

static void print_header(const run *r, FILE *out, int resumed, int64_t start)
{
    const pl_job *job = r->job;
    const pl_gpt_config *cfg = &r->e.cfg;
    fprintf(out, "model: %d layers, %d channels, %d heads, vocabulary %d (padded %d), %zu parameters\n",
            cfg->L, cfg->C, cfg->NH, cfg->V, cfg->Vp, pl_gpt_total_params(cfg));
    fprintf(out, "data: %lld training tokens, batch %d×%d tokens in microbatches of %d, %d threads\n",
            (long long)pl_tokens_count(&r->train), job->batch.global, job->batch.seq_len,
            job->batch.micro, kn_threads(r->e.k));
    if (resumed) fprintf(out, "resumed at step %lld\n", (long long)start);
}

/* What one step measured: its line of the output and of the metrics file. */
typedef struct {
    int64_t step;
    double loss, norm, ms, tokens_per_second;
    double val; /* NAN: not evaluated at this step */
    float lr;
} step_stats;

/* Trains step s and times it, then evaluates when due (every eval_every steps and
 * after the last). 0, or -1 and err. */
static int timed_step(run *r, int64_t s, step_stats *st, char *err, size_t errlen)
{
    const pl_job *job = r->job;
    const double tokens_per_step = (double)job->batch.global * job->batch.seq_len;
    double t0 = (pl_now_ms() / 1e3);
    *st = (step_stats){.step = s, .val = NAN};
    if (train_step(r, s, &st->loss, &st->norm, &st->lr))
        return pl_errf(err, errlen, "train: sampling step %lld failed", (long long)s);
    st->ms = ((pl_now_ms() / 1e3) - t0) * 1e3;
    st->tokens_per_second = tokens_per_step / (st->ms / 1e3);
    int last = s + 1 == r->steps;
    if (r->have_val && ((s + 1) % job->eval_every == 0 || last) &&
        evaluate(r, &st->val, err, errlen))
        return -1;
    return 0;
}

/* The step's line on out and, with --metrics, its JSON line; both flushed. */
static void report_step(const run *r, FILE *out, const step_stats *st)
{
    fprintf(out, "step %6lld/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %8.0f tok/s",
            (long long)st->step, r->steps, st->loss, st->lr, st->norm, st->ms,
            st->tokens_per_second);
    if (!isnan(st->val)) fprintf(out, " | val %.6f", st->val);
    fputc('\n', out);
    fflush(out);
    if (!r->metrics) return;
    fprintf(r->metrics,
            "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"ms\": %.3f, \"tokens_per_second\": %.1f, \"samples_digest\": \"%016llx\"",
            (long long)st->step, st->loss, st->lr, st->norm, st->ms, st->tokens_per_second,
            (unsigned long long)pl_sampler_digest(&r->smp, st->step, 0, r->job->batch.global));
    if (!isnan(st->val)) fprintf(r->metrics, ", \"val_loss\": %.9g", st->val);
    fputs("}\n", r->metrics);
    fflush(r->metrics);
}

/* After `done` steps: a checkpoint when spec.checkpoint says one is due, then the
 * old ones pruned (a failed clean-up is only reported). 0, or -1 and err. */
static int checkpoint_if_due(run *r, int64_t done, FILE *out, char *err, size_t errlen)
{
    const pl_job *job = r->job;
    if (!pl_checkpoint_due(job->checkpoint.dir, job->checkpoint.every, r->steps, done)) return 0;
    if (save_checkpoint(r, done, err, errlen)) return -1;
    fprintf(out, "checkpoint: step %lld saved to %s\n", (long long)done, job->checkpoint.dir);
    char why[512];
    if (pl_job_prune_checkpoints(job, why, sizeof why) < 0)
        fprintf(stderr, "pliant train: checkpoint cleanup: %s\n", why);
    return 0;
}

int pl_train(const pl_job *job, const pl_train_options *o, char *err, size_t errlen)
{
    run r = {.job = job, .steps = o->steps > 0 ? o->steps : job->steps};
    FILE *out = o->out ? o->out : stdout;
    int rc = -1;
    int64_t start = 0;
    int resumed = start_run(&r, o, &start, err, errlen);
    if (resumed < 0) goto done;
    print_header(&r, out, resumed, start);
    for (int64_t s = start; s < r.steps; s++) {
        step_stats st;
        if (timed_step(&r, s, &st, err, errlen)) goto done;
        report_step(&r, out, &st);
        if (checkpoint_if_due(&r, s + 1, out, err, errlen)) goto done;
    }
    rc = 0;
done:
    run_free(&r);
    return rc;
}
