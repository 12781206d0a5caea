/* 1F1B schedule (shared/schedule.h): the per-stage op lists and the
 * whole-pipeline simulator. */
#include <stdlib.h>

#include "check.h"
#include "rng.h"
#include "schedule.h"

static int imin(int a, int b)
{
    return a < b ? a : b;
}

static void format_ops(const pl_schedule *s, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = 0;
    for (int t = 0; t < s->nops && used + 8 < len; t++)
        used += (size_t)snprintf(buf + used, len - used, "%s%c%d", t ? " " : "",
                                 s->ops[t].kind == PL_SCHED_FORWARD ? 'F' : 'B', s->ops[t].mb);
}

static void test_schedule_examples(void)
{
    char err[256], buf[512];
    pl_schedule s;
    CHECK(pl_schedule_1f1b(4, 0, 8, &s, err, sizeof err) == 0);
    format_ops(&s, buf, sizeof buf);
    CHECK_EQ_INT(s.nwarmup, 3);
    CHECK_EQ_INT(s.nslots, 4);
    CHECK(strcmp(buf, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7") == 0);
    CHECK_EQ_INT(s.ops[0].recv_from, -1);
    CHECK_EQ_INT(s.ops[0].send_to, 1);
    CHECK_EQ_INT(s.ops[4].recv_from, 1); /* B0 receives the gradient from stage 1 */
    CHECK_EQ_INT(s.ops[4].send_to, -1);
    CHECK_EQ_INT(s.ops[5].slot, 0);      /* F4 reuses B0's slot */
    pl_schedule_free(&s);

    CHECK(pl_schedule_1f1b(4, 3, 3, &s, err, sizeof err) == 0);
    format_ops(&s, buf, sizeof buf);
    CHECK(strcmp(buf, "F0 B0 F1 B1 F2 B2") == 0);
    CHECK_EQ_INT(s.nwarmup, 0);
    CHECK_EQ_INT(s.nslots, 1);
    CHECK_EQ_INT(s.ops[0].recv_from, 2);
    CHECK_EQ_INT(s.ops[0].send_to, -1);
    CHECK_EQ_INT(s.ops[1].recv_from, -1);
    CHECK_EQ_INT(s.ops[1].send_to, 2);
    pl_schedule_free(&s);

    /* Fewer microbatches than the warm-up wants: all forwards, then all backwards. */
    CHECK(pl_schedule_1f1b(8, 1, 3, &s, err, sizeof err) == 0);
    format_ops(&s, buf, sizeof buf);
    CHECK(strcmp(buf, "F0 F1 F2 B0 B1 B2") == 0);
    CHECK_EQ_INT(s.nwarmup, 3);
    CHECK_EQ_INT(s.nslots, 3);
    pl_schedule_free(&s);

    CHECK(pl_schedule_1f1b(1, 0, 2, &s, err, sizeof err) == 0);
    format_ops(&s, buf, sizeof buf);
    CHECK(strcmp(buf, "F0 B0 F1 B1") == 0);
    for (int t = 0; t < s.nops; t++) {
        CHECK_EQ_INT(s.ops[t].recv_from, -1);
        CHECK_EQ_INT(s.ops[t].send_to, -1);
    }
    pl_schedule_free(&s);
}

/* Every property of the op list, for all S ≤ 8, k < S, Nb ≤ 32. */
static void test_schedule_properties(void)
{
    char err[256];
    for (int S = 1; S <= 8; S++)
        for (int k = 0; k < S; k++)
            for (int Nb = 1; Nb <= 32; Nb++) {
                pl_schedule s;
                CHECK(pl_schedule_1f1b(S, k, Nb, &s, err, sizeof err) == 0);
                int warm = imin(S - k - 1, Nb), slots = imin(S - k, Nb);
                CHECK_EQ_INT(s.nstages, S);
                CHECK_EQ_INT(s.stage, k);
                CHECK_EQ_INT(s.nmicro, Nb);
                CHECK_EQ_INT(s.nwarmup, warm);
                CHECK_EQ_INT(s.nslots, slots);
                CHECK_EQ_INT(s.nops, 2 * Nb);
                int nf = 0, nb = 0, inflight = 0, maxin = 0, ok = 1;
                int slot_mb[8];
                for (int i = 0; i < 8; i++) slot_mb[i] = -1;
                for (int t = 0; t < s.nops && ok; t++) {
                    const pl_sched_op *op = &s.ops[t];
                    if (t < warm) ok &= op->kind == PL_SCHED_FORWARD;
                    /* steady phase: F then B alternating */
                    if (t >= warm && t < warm + 2 * (Nb - warm))
                        ok &= op->kind == ((t - warm) % 2 ? PL_SCHED_BACKWARD : PL_SCHED_FORWARD);
                    if (t >= warm + 2 * (Nb - warm)) ok &= op->kind == PL_SCHED_BACKWARD;
                    ok &= op->slot == op->mb % slots;
                    if (op->kind == PL_SCHED_FORWARD) {
                        ok &= op->mb == nf++; /* forwards in order */
                        ok &= op->recv_from == (k > 0 ? k - 1 : -1);
                        ok &= op->send_to == (k < S - 1 ? k + 1 : -1);
                        ok &= slot_mb[op->slot] == -1;
                        slot_mb[op->slot] = op->mb;
                        if (++inflight > maxin) maxin = inflight;
                    } else {
                        ok &= op->mb == nb++; /* backwards in order */
                        ok &= op->mb < nf;    /* after its forward */
                        ok &= op->recv_from == (k < S - 1 ? k + 1 : -1);
                        ok &= op->send_to == (k > 0 ? k - 1 : -1);
                        ok &= slot_mb[op->slot] == op->mb;
                        slot_mb[op->slot] = -1;
                        inflight--;
                    }
                }
                pl_schedule_free(&s);
                if (!ok) printf("    S=%d k=%d Nb=%d\n", S, k, Nb);
                CHECK(ok);
                CHECK_EQ_INT(nf, Nb);
                CHECK_EQ_INT(nb, Nb);
                CHECK_EQ_INT(inflight, 0);
                CHECK_EQ_INT(maxin, slots);
            }
}

static void test_schedule_bad_args(void)
{
    char err[256];
    pl_schedule s;
    CHECK(pl_schedule_1f1b(0, 0, 4, &s, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "stages");
    CHECK(pl_schedule_1f1b(3, 3, 4, &s, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "stage: 3");
    CHECK(pl_schedule_1f1b(3, -1, 4, &s, err, sizeof err) == -1);
    CHECK(pl_schedule_1f1b(3, 0, 0, &s, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "microbatches");
    pl_sim_result r;
    CHECK(pl_pipeline_simulate(0, 4, NULL, NULL, PL_SIM_PAIRED, &r, err, sizeof err) == -1);
    CHECK(pl_pipeline_simulate(2, 0, NULL, NULL, PL_SIM_PAIRED, &r, err, sizeof err) == -1);
    CHECK(pl_pipeline_simulate(2, 2, NULL, NULL, (pl_sim_mode)7, &r, err, sizeof err) == -1);
    int64_t neg[2] = {1, -1};
    CHECK(pl_pipeline_simulate(2, 2, neg, NULL, PL_SIM_PAIRED, &r, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "fwd_time[1]");
}

/* Checks a finished simulation against the dependencies, independently of the
 * simulator: each stage computes one thing at a time, a forward follows the
 * previous stage's forward of the same microbatch, a backward follows the next
 * stage's backward and this stage's forward. Returns 1 when all hold. */
static int sim_consistent(const pl_sim_result *r, const int64_t *f, const int64_t *b)
{
    int S = r->nstages, Nb = r->nmicro;
    for (int k = 0; k < S; k++) {
        int64_t fk = f ? f[k] : 1, bk = b ? b[k] : 2;
        pl_schedule s;
        if (pl_schedule_1f1b(S, k, Nb, &s, NULL, 0)) return 0;
        int64_t end = 0;
        for (int t = 0; t < s.nops; t++) { /* in schedule order, no overlap */
            const pl_sched_op *op = &s.ops[t];
            int64_t st = op->kind == PL_SCHED_FORWARD ? r->fwd_start[k * Nb + op->mb]
                                                      : r->bwd_start[k * Nb + op->mb];
            if (st < end) {
                pl_schedule_free(&s);
                return 0;
            }
            end = st + (op->kind == PL_SCHED_FORWARD ? fk : bk);
        }
        pl_schedule_free(&s);
        if (end > r->makespan) return 0;
        for (int i = 0; i < Nb; i++) {
            int64_t fs = r->fwd_start[k * Nb + i], bs = r->bwd_start[k * Nb + i];
            if (fs < 0 || bs < 0) return 0;
            if (bs < fs + fk) return 0;  /* forward precedes backward */
            if (k > 0 && fs < r->fwd_start[(k - 1) * Nb + i] + (f ? f[k - 1] : 1)) return 0;
            if (k < S - 1 && bs < r->bwd_start[(k + 1) * Nb + i] + (b ? b[k + 1] : 2)) return 0;
        }
    }
    return 1;
}

/* Buffered and paired execution: no deadlock for all S ≤ 8, Nb ≤ 32, every
 * dependency respected, slots as planned, makespan (Nb − 1)·3 + 3·S. */
static void test_simulate_uniform(void)
{
    char err[256];
    pl_sim_mode modes[2] = {PL_SIM_BUFFERED, PL_SIM_PAIRED};
    for (int m = 0; m < 2; m++)
        for (int S = 1; S <= 8; S++)
            for (int Nb = 1; Nb <= 32; Nb++) {
                pl_sim_result r;
                int rc = pl_pipeline_simulate(S, Nb, NULL, NULL, modes[m], &r, err, sizeof err);
                if (rc) printf("    %s\n", err);
                CHECK(rc == 0);
                if (r.deadlock) printf("    mode %d S=%d Nb=%d: %s\n", m, S, Nb, r.stuck);
                CHECK(!r.deadlock);
                CHECK_EQ_INT(r.makespan, (int64_t)(Nb - 1) * 3 + 3 * S);
                CHECK(sim_consistent(&r, NULL, NULL));
                for (int k = 0; k < S; k++) CHECK_EQ_INT(r.max_inflight[k], imin(S - k, Nb));
                pl_sim_result_free(&r);
            }
}

/* Blocking sends one at a time deadlock exactly when S ≥ 2 and Nb ≥ 2. */
static void test_simulate_sequential_deadlocks(void)
{
    char err[256];
    for (int S = 1; S <= 8; S++)
        for (int Nb = 1; Nb <= 32; Nb++) {
            pl_sim_result r;
            CHECK(pl_pipeline_simulate(S, Nb, NULL, NULL, PL_SIM_SEQUENTIAL, &r, err,
                                       sizeof err) == 0);
            CHECK_EQ_INT(r.deadlock, S >= 2 && Nb >= 2);
            if (r.deadlock) {
                CHECK_STR_CONTAINS(r.stuck, "sending");
            } else {
                CHECK_EQ_INT(r.makespan, (int64_t)(Nb - 1) * 3 + 3 * S);
                CHECK(sim_consistent(&r, NULL, NULL));
            }
            pl_sim_result_free(&r);
        }
    pl_sim_result r;
    CHECK(pl_pipeline_simulate(2, 2, NULL, NULL, PL_SIM_SEQUENTIAL, &r, err, sizeof err) == 0);
    CHECK_STR_CONTAINS(r.stuck, "stage 0 sending activation 1 to 1");
    CHECK_STR_CONTAINS(r.stuck, "stage 1 sending gradient 0 to 0");
    pl_sim_result_free(&r);
}

/* Heterogeneous stage times: still no deadlock, dependencies hold, buffered and
 * paired give the same makespan, and it is at least every stage's busy time
 * plus the forward fill and backward drain of the stages before it. */
static void test_simulate_heterogeneous(void)
{
    char err[256];
    rng_state = 20240605;
    for (int it = 0; it < 400; it++) {
        int S = (int)rng_range(1, 8), Nb = (int)rng_range(1, 32);
        int64_t f[8], b[8];
        for (int k = 0; k < S; k++) {
            f[k] = rng_range(0, 9);
            b[k] = rng_range(0, 19);
        }
        pl_sim_result r1, r2;
        CHECK(pl_pipeline_simulate(S, Nb, f, b, PL_SIM_BUFFERED, &r1, err, sizeof err) == 0);
        CHECK(pl_pipeline_simulate(S, Nb, f, b, PL_SIM_PAIRED, &r2, err, sizeof err) == 0);
        CHECK(!r1.deadlock && !r2.deadlock);
        CHECK_EQ_INT(r1.makespan, r2.makespan);
        CHECK(sim_consistent(&r1, f, b));
        CHECK(sim_consistent(&r2, f, b));
        for (int k = 0; k < S; k++) {
            int64_t lb = (int64_t)Nb * (f[k] + b[k]);
            for (int j = 0; j < k; j++) lb += f[j] + b[j];
            CHECK(r1.makespan >= lb);
        }
        pl_sim_result_free(&r1);
        pl_sim_result_free(&r2);
    }
}

/* Uniform stages with other compute times: (Nb − 1 + S)·(f + b). */
static void test_simulate_uniform_times(void)
{
    char err[256];
    rng_state = 77;
    for (int it = 0; it < 300; it++) {
        int S = (int)rng_range(1, 8), Nb = (int)rng_range(1, 32);
        int64_t fu = rng_range(0, 7), bu = rng_range(0, 15), f[8], b[8];
        for (int k = 0; k < S; k++) {
            f[k] = fu;
            b[k] = bu;
        }
        for (int m = 0; m < 2; m++) {
            pl_sim_result r;
            CHECK(pl_pipeline_simulate(S, Nb, f, b, m ? PL_SIM_PAIRED : PL_SIM_BUFFERED, &r, err,
                                       sizeof err) == 0);
            CHECK(!r.deadlock);
            CHECK_EQ_INT(r.makespan, (int64_t)(Nb - 1 + S) * (fu + bu));
            CHECK(sim_consistent(&r, f, b));
            pl_sim_result_free(&r);
        }
    }
}

/* Unequal stages: the makespan is not the templates' Σ W + (Nb − 1)·max W
 * (traced by hand in the comments). */
static void test_simulate_vs_template_model(void)
{
    char err[256];
    pl_sim_result r;
    /* S=3, Nb=2, (f, b) = (4,1) (1,4) (1,1): stage 0 F0 0-4 F1 4-8; stage 1
     * F0 4-5 F1 8-9 B0 9-13 B1 13-17; stage 2 F0 5-6 B0 6-7 F1 9-10 B1
     * 10-11; stage 0 B0 13-14 B1 17-18. The model says 12 + 5 = 17. */
    int64_t f1[3] = {4, 1, 1}, b1[3] = {1, 4, 1};
    CHECK(pl_pipeline_simulate(3, 2, f1, b1, PL_SIM_PAIRED, &r, err, sizeof err) == 0);
    CHECK_EQ_INT(r.makespan, 18);
    CHECK_EQ_INT(r.bwd_start[1 * 2 + 1], 13);
    pl_sim_result_free(&r);
    /* S=2, Nb=2, (4,5) (3,1): stage 0 F0 0-4 F1 4-8 B0 8-13 B1 13-18; stage 1
     * F0 4-7 B0 7-8 F1 8-11 B1 11-12. The model says 13 + 9 = 22. */
    int64_t f2[2] = {4, 3}, b2[2] = {5, 1};
    CHECK(pl_pipeline_simulate(2, 2, f2, b2, PL_SIM_BUFFERED, &r, err, sizeof err) == 0);
    CHECK_EQ_INT(r.makespan, 18);
    CHECK_EQ_INT(r.fwd_start[1 * 2 + 1], 8);
    pl_sim_result_free(&r);
}

TEST_MAIN_BEGIN
RUN(test_schedule_examples);
RUN(test_schedule_properties);
RUN(test_schedule_bad_args);
RUN(test_simulate_uniform);
RUN(test_simulate_sequential_deadlocks);
RUN(test_simulate_uniform_times);
RUN(test_simulate_heterogeneous);
RUN(test_simulate_vs_template_model);
TEST_MAIN_END
