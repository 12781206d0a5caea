/* The planner for strategy redundant (shared/rc_plan.c): every template it returns fits
 * with the shadow's memory, needs at least the templates' node count, and its expected
 * step time is the pipeline's plus the exposed FRC (eager) and the part of the shadow's
 * gradient that the cool-down does not hide. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "rc_plan.h"
#include "templates.h"

/* 8 equal blocks on 1-GPU nodes; memory for 5 blocks' 4·P + in-flight activations. */
static int make_profile(pl_profile *p)
{
    char json[8192], *w = json;
    w += sprintf(w, "{\"model\": \"t\", \"microbatch_size\": 1, \"gpus_per_node\": 1, "
                    "\"gpu_memory_bytes\": 3000000, \"intra_node_GBps\": 10, "
                    "\"inter_node_GBps\": 1, \"layers\": [");
    for (int i = 0; i < 8; i++)
        w += sprintf(w, "%s{\"name\": \"b%d\", \"forward_ms\": {\"1\": 1.0}, \"backward_ms\": "
                        "{\"1\": 2.0}, \"param_bytes\": 100000, \"activation_bytes\": 50000, "
                        "\"output_bytes\": 1000}", i ? ", " : "", i);
    sprintf(w, "]}");
    char err[256];
    int rc = pl_profile_parse(json, p, err, sizeof err);
    if (rc) printf("    %s\n", err);
    return rc;
}

static void test_rc_templates_fit_with_shadows(void)
{
    pl_profile p;
    CHECK_EQ_INT(make_profile(&p), 0);
    char err[256];
    pl_template_set plain, eager, lazy;
    CHECK_EQ_INT(pl_templates_plan(&p, 8, 1, &plain, err, sizeof err), 0);
    CHECK_EQ_INT(pl_templates_plan_rc(&p, 8, 1, 1, &eager, err, sizeof err), 0);
    CHECK_EQ_INT(pl_templates_plan_rc(&p, 8, 1, 0, &lazy, err, sizeof err), 0);
    CHECK(eager.n0 >= plain.n0);
    CHECK(eager.n0 > 1); /* 8 blocks and a shadow do not fit one node */
    printf("    n0: templates %d, redundant %d\n", plain.n0, eager.n0);
    for (int i = 0; i < eager.count; i++) {
        const pl_template *t = &eager.templates[i];
        CHECK(t->feasible);
        CHECK_EQ_INT(t->nodes, eager.n_min + i);
        pl_rc_cost ce, cl;
        CHECK_EQ_INT(pl_rc_evaluate(&p, t, 1, 4 * t->nstages, &ce), 0);
        CHECK_EQ_INT(pl_rc_evaluate(&p, t, 0, 4 * t->nstages, &cl), 0);
        CHECK(ce.fits && ce.memory_bytes <= p.gpu_memory_bytes);
        CHECK(ce.iteration_ns >= cl.iteration_ns);
        CHECK(cl.iteration_ns == t->iteration_ns + cl.shadow_sync_ns);
        CHECK(ce.exposed_frc_ns <= ce.frc_ns);
        /* a block's gradient takes 0.1 ms at 1 GB/s, its backward 2 ms: every stage's
         * transfer but stage 0's (to the last stage, the ring's wrap) hides in the cool-down */
        const pl_stage *s0 = &t->stages[0];
        const int64_t wrap = t->nstages > 1 ? pl_transfer_ns((int64_t)100000 * (s0->layer_end -
                                                             s0->layer_begin), 1.0) : 0;
        CHECK(cl.shadow_sync_ns == wrap && ce.shadow_sync_ns == wrap);
        printf("    %d nodes, %d stages: templates %.3f ms, eager %.3f ms (FRC %.3f, exposed "
               "%.3f), lazy %.3f ms\n", t->nodes, t->nstages, t->iteration_ns / 1e6,
               ce.iteration_ns / 1e6, ce.frc_ns / 1e6, ce.exposed_frc_ns / 1e6,
               cl.iteration_ns / 1e6);
    }
    CHECK_EQ_INT(pl_rc_successor(0, 2), 1);
    CHECK_EQ_INT(pl_rc_successor(1, 2), 0);
    CHECK_EQ_INT(pl_rc_successor(2, 3), 0);
    CHECK_EQ_INT(pl_rc_successor(0, 1), -1);
    pl_template_set_free(&plain);
    pl_template_set_free(&eager);
    pl_template_set_free(&lazy);
    pl_profile_free(&p);
}

/* Failover (Bamboo §5.2): each lost stage's range joins its holder's, the predecessor's,
 * or the other stage's in the 2-stage ring; with stage 0 of ≥ 3 lost, the last stage
 * moves to the front with [0, b1) and stage n − 2 takes the last stage's range; two
 * losses consecutive on the ring, or stage 0 with stage n − 2, cannot fail over. */
static void test_rc_failover_merges_ranges(void)
{
    const int l4[] = {0, 2, 4, 7, 10};
    int keep[4], out[5], n;
    const int lost_b[] = {0, 1, 0, 0};
    CHECK(pl_rc_failover(4, l4, lost_b, keep, &n, out) == 1 && n == 3);
    CHECK(keep[0] == 0 && keep[1] == 2 && keep[2] == 3);
    CHECK(out[0] == 0 && out[1] == 4 && out[2] == 7 && out[3] == 10);
    const int lost_last[] = {0, 0, 0, 1};
    CHECK(pl_rc_failover(4, l4, lost_last, keep, &n, out) == 1 && n == 3 && out[3] == 10 &&
          out[2] == 4);
    const int lost_two[] = {0, 1, 1, 0};
    CHECK(pl_rc_failover(4, l4, lost_two, keep, &n, out) == 0);
    const int lost_first[] = {1, 0, 0, 0};
    CHECK(pl_rc_failover(4, l4, lost_first, keep, &n, out) == 1 && n == 3);
    CHECK(keep[0] == 3 && keep[1] == 1 && keep[2] == 2);
    CHECK(out[0] == 0 && out[1] == 2 && out[2] == 4 && out[3] == 10);
    const int lost_first_next_to_last[] = {1, 0, 1, 0}, lost_wrap[] = {1, 0, 0, 1};
    CHECK(pl_rc_failover(4, l4, lost_first_next_to_last, keep, &n, out) == 0);
    CHECK(pl_rc_failover(4, l4, lost_wrap, keep, &n, out) == 0);
    const int l3[] = {0, 3, 6, 10}, lost0of3[] = {1, 0, 0};
    CHECK(pl_rc_failover(3, l3, lost0of3, keep, &n, out) == 1 && n == 2);
    CHECK(keep[0] == 2 && keep[1] == 1 && out[0] == 0 && out[1] == 3 && out[2] == 10);
    const int lost_alt[] = {0, 1, 0, 1};
    CHECK(pl_rc_failover(4, l4, lost_alt, keep, &n, out) == 1 && n == 2 && out[1] == 4 &&
          out[2] == 10);
    const int l2[] = {0, 3, 10}, ring0[] = {1, 0}, ring1[] = {0, 1}, both[] = {1, 1};
    CHECK(pl_rc_failover(2, l2, ring0, keep, &n, out) == 1 && n == 1 && keep[0] == 1 &&
          out[0] == 0 && out[1] == 10);
    CHECK(pl_rc_failover(2, l2, ring1, keep, &n, out) == 1 && n == 1 && keep[0] == 0 &&
          out[1] == 10);
    CHECK(pl_rc_failover(2, l2, both, keep, &n, out) == 0);
    const int none[] = {0, 0};
    CHECK(pl_rc_failover(2, l2, none, keep, &n, out) == 1 && n == 2 && out[1] == 3);
    CHECK(pl_rc_holder(0, 3) == 2 && pl_rc_holder(0, 2) == 1 && pl_rc_holder(2, 3) == 1);
}

TEST_MAIN_BEGIN
RUN(test_rc_failover_merges_ranges);
RUN(test_rc_templates_fit_with_shadows);
TEST_MAIN_END
