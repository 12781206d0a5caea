/* The time split of a simulated job (sim_account.h). */
#include "sim_account.h"

#include <stdlib.h>
#include <string.h>

static const char *const kind_names[PL_SIM_T_COUNT] = {
    "computing", "reconfiguring", "copying", "redoing", "waiting", "checkpointing", "ended"};

const char *pl_sim_time_kind_name(int k)
{
    return k >= 0 && k < PL_SIM_T_COUNT ? kind_names[k] : "?";
}

int pl_sim_account_init(pl_sim_account *a, int64_t duration_ns, int nbins, int64_t global_batch)
{
    memset(a, 0, sizeof *a);
    a->nbins = nbins > 0 ? nbins : 1;
    a->bin_ns = duration_ns / a->nbins + 1;
    a->global_batch = global_batch;
    a->phase = PL_COORD_WAITING_FOR_WORKERS;
    a->bin_samples = calloc((size_t)a->nbins, sizeof *a->bin_samples);
    a->bin_node_ns = calloc((size_t)a->nbins, sizeof *a->bin_node_ns);
    a->bin_worker_ns = calloc((size_t)a->nbins, sizeof *a->bin_worker_ns);
    if (!a->bin_samples || !a->bin_node_ns || !a->bin_worker_ns) {
        pl_sim_account_free(a);
        return -1;
    }
    return 0;
}

void pl_sim_account_free(pl_sim_account *a)
{
    free(a->bin_samples);
    free(a->bin_node_ns);
    free(a->bin_worker_ns);
    memset(a, 0, sizeof *a);
}

/* Spreads `amount` evenly over [t0, t1) into bins (at t0 when the interval is empty). */
static void spread(const pl_sim_account *a, double *bins, int64_t t0, int64_t t1, double amount)
{
    if (t1 <= t0) {
        int b = (int)(t0 / a->bin_ns);
        bins[b < a->nbins ? b : a->nbins - 1] += amount;
        return;
    }
    for (int64_t t = t0; t < t1;) {
        int b = (int)(t / a->bin_ns);
        if (b >= a->nbins) break;
        int64_t end = (int64_t)(b + 1) * a->bin_ns < t1 ? (int64_t)(b + 1) * a->bin_ns : t1;
        bins[b] += amount * (double)(end - t) / (double)(t1 - t0);
        t = end;
    }
}

static int kind_of(pl_coord_phase_t p)
{
    switch (p) {
    case PL_COORD_SETTLING: case PL_COORD_RESUMING: case PL_COORD_PROFILING:
        return PL_SIM_T_RECONFIG;
    case PL_COORD_WAITING_FOR_WORKERS: case PL_COORD_WAITING_FOR_NODES:
        return PL_SIM_T_WAIT;
    case PL_COORD_DONE: case PL_COORD_FAILED: case PL_COORD_SAVING:
        return PL_SIM_T_ENDED;
    default:
        return -1; /* running, committing, evaluating, copying: classified later */
    }
}

void pl_sim_account_advance(pl_sim_account *a, int64_t now)
{
    int64_t dt = now - a->last_ns;
    if (dt <= 0) return;
    a->node_ns += dt * a->nodes;
    spread(a, a->bin_node_ns, a->last_ns, now, (double)(dt * a->nodes));
    if (a->phase == PL_COORD_RUNNING || a->phase == PL_COORD_COMMITTING ||
        a->phase == PL_COORD_EVALUATING)
        spread(a, a->bin_worker_ns, a->last_ns, now, (double)(dt * a->workers));
    int k = kind_of(a->phase);
    if (a->phase == PL_COORD_WAITING_FOR_NODES) a->below_wait_ns += dt;
    else if (a->degraded && k != PL_SIM_T_WAIT && k != PL_SIM_T_ENDED) a->degraded_ns += dt;
    if (k >= 0) a->split_ns[k] += dt;
    else if (a->phase == PL_COORD_COPYING) a->copy_phase_ns += dt;
    else a->step_ns += dt;
    a->last_ns = now;
}

/* The steps committed since the last look: new ones computing, repeated ones redoing;
 * their time spread over the interval they took. */
static void commits(pl_sim_account *a, int64_t step)
{
    int64_t done = step - a->last_step;
    int64_t fresh = step > a->high_water ? step - (a->last_step > a->high_water ? a->last_step
                                                                               : a->high_water)
                                         : 0;
    if (fresh > done) fresh = done;
    int64_t fresh_ns = (int64_t)((double)a->step_ns * (double)fresh / (double)done);
    a->split_ns[PL_SIM_T_COMPUTE] += fresh_ns;
    a->split_ns[PL_SIM_T_REDO] += a->step_ns - fresh_ns;
    spread(a, a->bin_samples, a->last_ns - a->step_ns, a->last_ns,
           (double)fresh * (double)a->global_batch);
    a->new_steps += fresh;
    if (step > a->high_water) a->high_water = step;
    a->step_ns = 0;
}

/* The end of a copy phase: its checkpoint load, its copies, the rest reconfiguring. */
static void copy_phase_done(pl_sim_account *a, int64_t load_ns, int64_t copy_ns)
{
    int64_t d = a->copy_phase_ns, ck = load_ns < d ? load_ns : d;
    int64_t cp = copy_ns < d - ck ? copy_ns : d - ck;
    a->split_ns[PL_SIM_T_CKPT] += ck;
    a->split_ns[PL_SIM_T_COPY] += cp;
    a->split_ns[PL_SIM_T_RECONFIG] += d - ck - cp;
    a->copy_phase_ns = 0;
}

void pl_sim_account_after(pl_sim_account *a, pl_coord_phase_t phase, int64_t step, int nodes,
                          int workers, int64_t load_ns, int64_t copy_ns)
{
    if (step > a->last_step) commits(a, step);
    const int was_stepping = a->phase == PL_COORD_RUNNING || a->phase == PL_COORD_COMMITTING;
    const int stepping = phase == PL_COORD_RUNNING || phase == PL_COORD_COMMITTING ||
                         phase == PL_COORD_EVALUATING;
    if (a->step_ns > 0 && was_stepping && !stepping) { /* aborted: the work is lost */
        a->split_ns[PL_SIM_T_REDO] += a->step_ns;
        a->step_ns = 0;
    }
    if (a->phase == PL_COORD_COPYING && phase != PL_COORD_COPYING)
        copy_phase_done(a, load_ns, copy_ns);
    a->last_step = step;
    a->phase = phase;
    a->nodes = nodes;
    a->workers = workers;
}

void pl_sim_account_degraded(pl_sim_account *a, int degraded) { a->degraded = degraded; }

void pl_sim_account_close(pl_sim_account *a, int64_t load_ns, int64_t copy_ns)
{
    a->split_ns[PL_SIM_T_COMPUTE] += a->step_ns;
    a->step_ns = 0;
    if (a->phase == PL_COORD_COPYING) copy_phase_done(a, load_ns, copy_ns);
}
