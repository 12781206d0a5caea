/* The control protocol (shared/protocol.h): lossless round trips of every
 * message type with random contents, copies that own their arrays (pl_msg_dup),
 * rejection of each kind of bad input with the field path in the error, and a
 * deterministic mutation fuzz loop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "protocol.h"
#include "rng.h"

/* ------------------------------------------------------ random messages */

static void rand_chars(char *buf, size_t maxlen, size_t minlen, const char *set)
{
    size_t n = (size_t)rng_range((int64_t)minlen, (int64_t)maxlen);
    if (rng_next() % 8 == 0) n = maxlen; /* the longest allowed, often */
    size_t k = strlen(set);
    for (size_t i = 0; i < n; i++) buf[i] = set[rng_next() % k];
    buf[n] = 0;
}

static const char NAME_SET[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_";
static const char HEX_SET[] = "0123456789abcdefABCDEF";

static void rand_name(char *buf) { rand_chars(buf, PL_PROTO_NAME_MAX, 1, NAME_SET); }

/* Printable ASCII (quotes and backslashes included), tabs, newlines and UTF-8. */
static void rand_text(char *buf)
{
    static const char *const pieces[] = {"a", "Z", " ", "\"", "\\", "/", "\t", "\n", "{", "}",
                                         "\xc3\xa9", "\xe2\x86\x92", "\xf0\x9f\x98\x80", "~", "9"};
    size_t cap = (size_t)rng_range(0, PL_PROTO_TEXT_MAX), n = 0;
    for (;;) {
        const char *p = pieces[rng_next() % (sizeof pieces / sizeof pieces[0])];
        size_t k = strlen(p);
        if (n + k > cap) break;
        memcpy(buf + n, p, k);
        n += k;
    }
    buf[n] = 0;
}

static int64_t rand_int(int64_t lo, int64_t hi)
{
    switch (rng_next() % 4) {
    case 0: return lo;
    case 1: return hi;
    default: return rng_range(lo, hi);
    }
}

/* A finite double ≥ 0 when nonneg (never -0.0, which JSON writes as 0). */
static double rand_double(int nonneg)
{
    double d;
    switch (rng_next() % 4) {
    case 0: d = (double)rng_range(-1000, 1000); break;
    case 1: d = (double)(int64_t)rng_next() / 1e9; break;
    default: {
        uint64_t bits = rng_next();
        memcpy(&d, &bits, sizeof d);
        if (!isfinite(d)) d = 1.5e300;
    }
    }
    if (nonneg) d = fabs(d);
    if (d == 0) d = 0.0;
    return d;
}

static double rand_maybe_nonfinite(int nonneg)
{
    switch (rng_next() % 8) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return nonneg ? 0.0 : -INFINITY;
    default: return rand_double(nonneg);
    }
}

static void rand_plan(pl_msg *m)
{
    pl_msg_plan *p = &m->u.plan;
    p->generation = m->gen;
    p->step = rand_int(0, PL_PROTO_INT_MAX);
    p->micro = (int)rand_int(1, 64);
    p->seq_len = (int)rand_int(1, PL_PROTO_MAX_SEQ_LEN);
    p->npipelines = (int)rng_range(1, 4);
    p->pipelines = calloc((size_t)p->npipelines, sizeof *p->pipelines);
    int64_t mb = 0;
    for (int i = 0; i < p->npipelines; i++) {
        pl_msg_pipeline *pp = &p->pipelines[i];
        pp->nnodes = pp->template_nodes = (int)rng_range(1, 4);
        pp->nodes = calloc((size_t)pp->nnodes, sizeof *pp->nodes);
        for (int j = 0; j < pp->nnodes; j++) {
            rand_name(pp->nodes[j]);
            /* unique: a distinct prefix */
            char pre[16];
            int k = snprintf(pre, sizeof pre, "p%dn%d.", i, j);
            memcpy(pp->nodes[j], pre, (size_t)k);
            if (strlen(pp->nodes[j]) < (size_t)k) pp->nodes[j][k] = 0;
        }
        pp->layers = calloc((size_t)pp->nnodes + 1, sizeof *pp->layers);
        for (int j = 1; j <= pp->nnodes; j++) /* the same last bound in every pipeline */
            pp->layers[j] = j == pp->nnodes ? 64 : pp->layers[j - 1] + (int)rng_range(1, 15);
        pp->microbatches = rand_int(1, 1000);
        pp->first_microbatch = mb;
        mb += pp->microbatches;
    }
    p->global_batch = mb * p->micro;
    if (rng_next() % 4 == 0) {
        p->you_pipeline = -1;
    } else {
        p->you_pipeline = (int)rng_range(0, p->npipelines - 1);
        p->you_stage = (int)rng_range(0, p->pipelines[p->you_pipeline].nnodes - 1);
        p->you_layer_begin = p->pipelines[p->you_pipeline].layers[p->you_stage];
        p->you_layer_end = p->pipelines[p->you_pipeline].layers[p->you_stage + 1];
    }
    p->npeers = (int)rng_range(0, 5);
    p->peers = p->npeers ? calloc((size_t)p->npeers, sizeof *p->peers) : NULL;
    for (int i = 0; i < p->npeers; i++) {
        rand_name(p->peers[i].name);
        rand_chars(p->peers[i].host, PL_PROTO_HOST_MAX, 1, "0123456789abcdef.:[]%-");
        p->peers[i].port = (int)rand_int(1, 65535);
    }
    p->ncopies = (int)rng_range(0, 5);
    p->copies = p->ncopies ? calloc((size_t)p->ncopies, sizeof *p->copies) : NULL;
    for (int i = 0; i < p->ncopies; i++) {
        p->copies[i].layer = (int)rand_int(0, PL_PROTO_MAX_LAYERS - 1);
        p->copies[i].parts = rng_range(0, 2) ? 1 : (int)rand_int(2, PL_PROTO_MAX_PARTS);
        p->copies[i].part = (int)rand_int(0, p->copies[i].parts - 1);
        rand_name(p->copies[i].source);
        p->copies[i].bytes = rand_int(0, PL_PROTO_INT_MAX);
    }
    p->nsends = (int)rng_range(0, 5);
    p->sends = p->nsends ? calloc((size_t)p->nsends, sizeof *p->sends) : NULL;
    for (int i = 0; i < p->nsends; i++) {
        p->sends[i].layer = (int)rand_int(0, PL_PROTO_MAX_LAYERS - 1);
        rand_name(p->sends[i].dest);
    }
    if ((p->has_checkpoint = (int)(rng_next() % 2))) {
        rand_chars(p->checkpoint_dir, PL_PROTO_PATH_MAX, 1,
                   "abcXYZ019/._- ~:@\"\\'");
        if (rng_next() % 2) memcpy(p->checkpoint_dir, "/\xc3\xa9", 3); /* UTF-8 */
        p->checkpoint_step = rand_int(0, PL_PROTO_INT_MAX);
    }
    p->transport = (int)(rng_next() % PL_TRANSPORT_COUNT);
    p->reserve_bytes = rng_next() % 2 ? rand_int(0, PL_PROTO_INT_MAX) : 0;
}

/* A small planner profile (shared/profile.h) of n layers as JSON text. */
static char *profile_text(int n, double fwd_ms)
{
    size_t cap = 256 + 160 * (size_t)n, k = 0;
    char *t = malloc(cap);
    if (!t) return NULL;
    k += (size_t)snprintf(t + k, cap - k, "{\"model\": \"gpt\", \"microbatch_size\": 2, "
                          "\"gpus_per_node\": 1, \"gpu_memory_bytes\": 1000000000, "
                          "\"intra_node_GBps\": 10, \"inter_node_GBps\": 1, \"layers\": [");
    for (int l = 0; l < n; l++)
        k += (size_t)snprintf(t + k, cap - k, "%s{\"name\": \"l%d\", \"forward_ms\": {\"1\": %.17g}, "
                              "\"backward_ms\": {\"1\": %.17g}, \"param_bytes\": %d, "
                              "\"activation_bytes\": 64, \"output_bytes\": 32}",
                              l ? ", " : "", l, fwd_ms, 2 * fwd_ms, 100 * (l + 1));
    snprintf(t + k, cap - k, "]}");
    return t;
}

/* The messages of the workers' duties: checkpoint completion, profiling, evaluation. */
static void rand_duty(pl_msg *m)
{
    switch (m->type) {
    case PL_MSG_COMPLETE_CHECKPOINT:
        m->u.complete_checkpoint.step = rand_int(1, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_CHECKPOINT_DONE:
        m->u.checkpoint_done.step = rand_int(1, PL_PROTO_INT_MAX);
        if (rng_next() % 2) rand_text(m->u.checkpoint_done.error);
        break;
    case PL_MSG_PROFILE_REQUEST:
        m->u.profile_request.repeat = (int)rand_int(1, PL_PROTO_PROFILE_REPEAT_MAX);
        break;
    case PL_MSG_PROFILE_DONE:
        if (rng_next() % 3) {
            m->u.profile_done.profile = profile_text((int)rng_range(1, 20), 0.001 * (double)rng_range(1, 99999));
        } else {
            rand_text(m->u.profile_done.error);
            if (!m->u.profile_done.error[0]) strcpy(m->u.profile_done.error, "out of memory");
        }
        break;
    case PL_MSG_EVAL:
        m->u.eval.step = rand_int(0, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_SAVE:
        m->u.save.step = rand_int(1, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_FATAL:
        rand_text(m->u.fatal.reason);
        if (!m->u.fatal.reason[0]) strcpy(m->u.fatal.reason, "data: token 65535 out of range");
        break;
    case PL_MSG_EVAL_DONE:
        m->u.eval_done.step = rand_int(0, PL_PROTO_INT_MAX);
        m->u.eval_done.has_loss = (int)(rng_next() % 2);
        if (m->u.eval_done.has_loss) m->u.eval_done.loss = rand_maybe_nonfinite(0);
        m->u.eval_done.batches = rand_int(0, PL_PROTO_INT_MAX);
        break;
    }
}

static void rand_register(pl_msg_register *r)
{
    rand_name(r->job);
    rand_name(r->name);
    rand_name(r->node);
    rand_chars(r->zone, PL_PROTO_NAME_MAX, 0, NAME_SET);
    rand_chars(r->host, PL_PROTO_HOST_MAX, 1, "0123456789abcdef.:[]%-");
    r->port = (int)rand_int(1, 65535);
    r->gpus = (int)rand_int(0, 1024);
    rand_chars(r->device, PL_PROTO_NAME_MAX, 0, NAME_SET);
    r->nccl = (int)(rng_next() % 2);
    r->pid = rand_int(1, 2147483647);
    rand_chars(r->token_proof, PL_PROTO_PROOF_LEN, PL_PROTO_PROOF_LEN, HEX_SET);
    if ((r->has_checkpoint = (int)(rng_next() % 2))) { /* the optional checkpoint */
        if (rng_next() % 3 == 0) rand_text(r->checkpoint_error);
        if (!r->checkpoint_error[0]) r->checkpoint_step = rand_int(0, PL_PROTO_INT_MAX);
    }
}

static void rand_msg(pl_msg *m, int type)
{
    pl_msg_init(m, type, rand_int(0, PL_PROTO_INT_MAX));
    switch (type) {
    case PL_MSG_REGISTER:
        rand_register(&m->u.reg);
        break;
    case PL_MSG_HEARTBEAT:
    case PL_MSG_REDUCED:
    case PL_MSG_COMMITTED:
    case PL_MSG_START_STEP:
        m->u.heartbeat.step = rand_int(0, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_LEAVING:
        m->u.leaving.reason = (int)rng_range(0, PL_LEAVE_COUNT - 1);
        m->u.leaving.grace_ms = rand_int(0, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_REPORT:
        m->u.report.step = rand_int(0, PL_PROTO_INT_MAX);
        m->u.report.has_loss = (int)(rng_next() % 2);
        if (m->u.report.has_loss) m->u.report.loss = rand_maybe_nonfinite(0);
        m->u.report.tokens = rand_int(0, PL_PROTO_INT_MAX);
        m->u.report.ms = rand_double(1);
        m->u.report.grad_sumsq = rand_maybe_nonfinite(1);
        m->u.report.samples_digest = rng_next() % 3 ? rng_next() : (rng_next() % 2 ? 0 : UINT64_MAX);
        break;
    case PL_MSG_PEER_BROKEN:
        rand_name(m->u.peer_broken.peer);
        rand_text(m->u.peer_broken.reason);
        break;
    case PL_MSG_COPY_DONE:
        m->u.copy_done.bytes = rand_int(0, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_HELLO_RESUME:
        m->u.hello_resume.committed_step = rand_int(-1, PL_PROTO_INT_MAX - 1);
        m->u.hello_resume.grad_scale = rand_double(1);
        m->u.hello_resume.lr = rand_double(1);
        m->u.hello_resume.reduced_step =
            rng_next() % 2 ? -1 : m->u.hello_resume.committed_step + 1;
        break;
    case PL_MSG_SAVED:
        m->u.saved.step = rand_int(1, PL_PROTO_INT_MAX);
        m->u.saved.layer_begin = (int)rand_int(0, PL_PROTO_MAX_LAYERS - 1);
        m->u.saved.layer_end = (int)rand_int(m->u.saved.layer_begin + 1, PL_PROTO_MAX_LAYERS);
        if (rng_next() % 3 == 0) rand_text(m->u.saved.error); /* a failed write */
        m->u.saved.bytes = m->u.saved.error[0] ? 0 : rand_int(0, PL_PROTO_INT_MAX);
        break;
    case PL_MSG_CHALLENGE: {
        size_t n = 2 * (size_t)rng_range(PL_PROTO_NONCE_MIN / 2, PL_PROTO_NONCE_MAX / 2);
        rand_chars(m->u.challenge.nonce, n, n, HEX_SET);
        break;
    }
    case PL_MSG_WELCOME:
        m->u.welcome.rank = (int)rand_int(0, PL_PROTO_MAX_NODES - 1);
        rand_name(m->u.welcome.job);
        m->u.welcome.token_ok = (int)(rng_next() % 2);
        m->u.welcome.heartbeat_ms = (int)rand_int(PL_PROTO_HEARTBEAT_MIN_MS, PL_PROTO_HEARTBEAT_MAX_MS);
        break;
    case PL_MSG_PLAN:
        rand_plan(m);
        break;
    case PL_MSG_COMMIT:
        m->u.commit.step = rand_int(0, PL_PROTO_INT_MAX);
        m->u.commit.grad_scale = rand_double(1);
        if (m->u.commit.grad_scale == 0) m->u.commit.grad_scale = 1;
        m->u.commit.lr = rand_double(1);
        m->u.commit.save = (int)(rng_next() % 2);
        break;
    case PL_MSG_ABORT:
        m->u.abort_.step = rand_int(0, PL_PROTO_INT_MAX);
        rand_text(m->u.abort_.reason);
        break;
    case PL_MSG_STOP:
        rand_text(m->u.stop.reason);
        m->u.stop.exit_code = (int)rand_int(0, 255);
        break;
    case PL_MSG_REFUSE:
        rand_text(m->u.refuse.reason);
        break;
    case PL_MSG_NCCL_ROOT:
    case PL_MSG_NCCL_INIT:
        rand_chars(m->u.nccl_root.id, PL_PROTO_NCCL_ID_HEX, PL_PROTO_NCCL_ID_HEX, HEX_SET);
        break;
    case PL_MSG_STEP_FAILED:
        m->u.step_failed.step = rand_int(0, PL_PROTO_INT_MAX);
        rand_text(m->u.step_failed.reason);
        break;
    default:
        rand_duty(m);
    }
}

static int same_double(double a, double b)
{
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

/* Field-wise equality (memcmp for everything but plans and doubles holding NaN). */
static int msg_equal(const pl_msg *a, const pl_msg *b)
{
    if (a->type != b->type || a->gen != b->gen) return 0;
    if (a->type == PL_MSG_REPORT) {
        const pl_msg_report *x = &a->u.report, *y = &b->u.report;
        return x->step == y->step && x->has_loss == y->has_loss &&
               (!x->has_loss || same_double(x->loss, y->loss)) && x->tokens == y->tokens &&
               same_double(x->ms, y->ms) && same_double(x->grad_sumsq, y->grad_sumsq) &&
               x->samples_digest == y->samples_digest;
    }
    if (a->type == PL_MSG_EVAL_DONE) {
        const pl_msg_eval_done *x = &a->u.eval_done, *y = &b->u.eval_done;
        return x->step == y->step && x->has_loss == y->has_loss &&
               (!x->has_loss || same_double(x->loss, y->loss)) && x->batches == y->batches;
    }
    if (a->type == PL_MSG_PROFILE_DONE) {
        const pl_msg_profile_done *x = &a->u.profile_done, *y = &b->u.profile_done;
        return !x->profile == !y->profile && (!x->profile || !strcmp(x->profile, y->profile)) &&
               !strcmp(x->error, y->error);
    }
    if (a->type != PL_MSG_PLAN) return !memcmp(&a->u, &b->u, sizeof a->u);
    const pl_msg_plan *x = &a->u.plan, *y = &b->u.plan;
    if (x->generation != y->generation || x->step != y->step || x->global_batch != y->global_batch ||
        x->micro != y->micro || x->seq_len != y->seq_len || x->npipelines != y->npipelines ||
        x->you_pipeline != y->you_pipeline || x->you_stage != y->you_stage ||
        x->you_layer_begin != y->you_layer_begin || x->you_layer_end != y->you_layer_end ||
        x->npeers != y->npeers || x->ncopies != y->ncopies || x->nsends != y->nsends ||
        x->has_checkpoint != y->has_checkpoint || x->transport != y->transport ||
        x->reserve_bytes != y->reserve_bytes)
        return 0;
    for (int i = 0; i < x->npipelines; i++) {
        const pl_msg_pipeline *p = &x->pipelines[i], *q = &y->pipelines[i];
        if (p->nnodes != q->nnodes || p->template_nodes != q->template_nodes ||
            p->microbatches != q->microbatches || p->first_microbatch != q->first_microbatch)
            return 0;
        for (int j = 0; j < p->nnodes; j++)
            if (strcmp(p->nodes[j], q->nodes[j])) return 0;
        for (int j = 0; j <= p->nnodes; j++)
            if (p->layers[j] != q->layers[j]) return 0;
    }
    for (int i = 0; i < x->npeers; i++)
        if (strcmp(x->peers[i].name, y->peers[i].name) || strcmp(x->peers[i].host, y->peers[i].host) ||
            x->peers[i].port != y->peers[i].port)
            return 0;
    for (int i = 0; i < x->ncopies; i++)
        if (x->copies[i].layer != y->copies[i].layer || strcmp(x->copies[i].source, y->copies[i].source) ||
            x->copies[i].bytes != y->copies[i].bytes || x->copies[i].part != y->copies[i].part ||
            x->copies[i].parts != y->copies[i].parts)
            return 0;
    for (int i = 0; i < x->nsends; i++)
        if (x->sends[i].layer != y->sends[i].layer || strcmp(x->sends[i].dest, y->sends[i].dest))
            return 0;
    if (x->has_checkpoint &&
        (strcmp(x->checkpoint_dir, y->checkpoint_dir) || x->checkpoint_step != y->checkpoint_step))
        return 0;
    return 1;
}

/* ------------------------------------------------------------ round trips */

static void test_type_names(void)
{
    for (int t = PL_MSG_NONE + 1; t < PL_MSG_COUNT; t++) {
        CHECK(strcmp(pl_msg_type_name(t), "?"));
        CHECK_EQ_INT(pl_msg_type_from_name(pl_msg_type_name(t)), t);
        CHECK(pl_msg_from_worker(t) == (t <= PL_MSG_FATAL));
    }
    CHECK(!strcmp(pl_msg_type_name(PL_MSG_NONE), "?"));
    CHECK(!strcmp(pl_msg_type_name(PL_MSG_COUNT), "?"));
    CHECK(!strcmp(pl_msg_type_name(-3), "?"));
    CHECK_EQ_INT(pl_msg_type_from_name("nope"), PL_MSG_NONE);
    CHECK_EQ_INT(pl_msg_type_from_name(NULL), PL_MSG_NONE);
    CHECK_EQ_INT(pl_msg_from_worker(PL_MSG_COUNT), -1);
    CHECK(!strcmp(pl_leave_reason_name(PL_LEAVE_SIGTERM), "sigterm"));
    CHECK(!strcmp(pl_leave_reason_name(7), "?"));
}

static void test_round_trip_every_type(void)
{
    rng_state = 42;
    char err[256];
    for (int t = PL_MSG_NONE + 1; t < PL_MSG_COUNT; t++) {
        for (int rep = 0; rep < 200; rep++) {
            pl_msg m, d;
            rand_msg(&m, t);
            char *text = pl_msg_encode_err(&m, err, sizeof err);
            if (!text) printf("    %s: %s\n", pl_msg_type_name(t), err);
            CHECK(text);
            CHECK(strlen(text) <= PL_PROTO_MAX_BYTES);
            int rc = pl_msg_decode(text, strlen(text), &d, err, sizeof err);
            if (rc) printf("    %s: %s\n    %.300s\n", pl_msg_type_name(t), err, text);
            CHECK_EQ_INT(rc, 0);
            int eq = msg_equal(&m, &d);
            if (!eq) printf("    %s differs after a round trip: %.300s\n", pl_msg_type_name(t), text);
            /* the decoded message encodes to the same text */
            char *again = pl_msg_encode(&d);
            int same = again && !strcmp(again, text);
            free(again);
            free(text);
            pl_msg_free(&m);
            pl_msg_free(&d);
            CHECK(eq);
            CHECK(same);
        }
    }
}

/* A copy owns its arrays: it equals the message, encodes to the same text after the
 * original is freed, and shares no array with it. Every type, random plans included. */
static void test_dup_every_type(void)
{
    rng_state = 7;
    for (int t = PL_MSG_NONE + 1; t < PL_MSG_COUNT; t++) {
        for (int rep = 0; rep < 50; rep++) {
            pl_msg m, c;
            rand_msg(&m, t);
            char *text = pl_msg_encode(&m);
            CHECK(text);
            CHECK_EQ_INT(pl_msg_dup(&m, &c), 0);
            int eq = msg_equal(&m, &c), shared = 0;
            if (t == PL_MSG_PLAN) {
                const pl_msg_plan *a = &m.u.plan, *b = &c.u.plan;
                shared = (a->pipelines && a->pipelines == b->pipelines) ||
                         (a->peers && a->peers == b->peers) ||
                         (a->copies && a->copies == b->copies) ||
                         (a->sends && a->sends == b->sends) ||
                         (a->npipelines && a->pipelines[0].nodes == b->pipelines[0].nodes);
            }
            if (t == PL_MSG_PROFILE_DONE)
                shared = m.u.profile_done.profile &&
                         m.u.profile_done.profile == c.u.profile_done.profile;
            pl_msg_free(&m);
            char *again = pl_msg_encode(&c);
            int same = again && !strcmp(again, text);
            if (!eq || !same || shared)
                printf("    %s: equal %d, same text %d, shared arrays %d\n", pl_msg_type_name(t),
                       eq, same, shared);
            free(text);
            free(again);
            pl_msg_free(&c);
            CHECK(eq && same && !shared);
        }
    }
}

static void test_known_encoding(void)
{
    pl_msg m;
    pl_msg_init(&m, PL_MSG_COMMIT, 7);
    m.u.commit.step = 41;
    m.u.commit.grad_scale = 0.5;
    m.u.commit.lr = 0.0003;
    char *text = pl_msg_encode(&m);
    CHECK(text);
    int ok = !strcmp(text, "{\"v\":1,\"type\":\"commit\",\"gen\":7,\"step\":41,\"grad_scale\":0.5,\"lr\":0.0003,\"save\":false}");
    if (!ok) printf("    got %s\n", text);
    free(text);
    CHECK(ok);

    pl_msg_init(&m, PL_MSG_REPORT, 2);
    m.u.report.step = 5;
    m.u.report.has_loss = 1;
    m.u.report.loss = NAN;
    m.u.report.tokens = 1024;
    m.u.report.ms = 12.5;
    m.u.report.grad_sumsq = INFINITY;
    m.u.report.samples_digest = 0xabcULL;
    text = pl_msg_encode(&m);
    CHECK(text);
    ok = !strcmp(text, "{\"v\":1,\"type\":\"report\",\"gen\":2,\"step\":5,\"loss\":\"nan\",\"tokens\":1024,"
                       "\"ms\":12.5,\"grad_sumsq\":\"inf\",\"samples_digest\":\"0000000000000abc\"}");
    if (!ok) printf("    got %s\n", text);
    free(text);
    CHECK(ok);

    /* Whitespace, key order and a trailing NUL are fine on input. */
    const char in[] = " {\"step\": 3, \"gen\": 1,\n \"type\": \"heartbeat\", \"v\": 1.0 }\n";
    pl_msg d;
    char err[256];
    CHECK_EQ_INT(pl_msg_decode(in, sizeof in, &d, err, sizeof err), 0);
    CHECK_EQ_INT(d.type, PL_MSG_HEARTBEAT);
    CHECK_EQ_INT(d.u.heartbeat.step, 3);
    CHECK_EQ_INT(d.gen, 1);
    pl_msg_free(&d);
}

/* ------------------------------------------------------------- rejection */

static int expect_reject(const char *text, size_t len, const char *needle)
{
    pl_msg d;
    char err[512] = "";
    memset(&d, 0x5a, sizeof d);
    int rc = pl_msg_decode(text, len, &d, err, sizeof err);
    if (rc == 0) {
        printf("    accepted: %.200s\n", text);
        pl_msg_free(&d);
        return 0;
    }
    if (!strstr(err, needle)) {
        printf("    error \"%s\" lacks \"%s\" for %.200s\n", err, needle, text);
        return 0;
    }
    /* nothing left to free: out is zeroed */
    pl_msg z;
    memset(&z, 0, sizeof z);
    if (memcmp(&d, &z, sizeof d)) {
        printf("    out not zeroed after an error\n");
        return 0;
    }
    return 1;
}

#define REJECT(text, needle) CHECK(expect_reject(text, strlen(text), needle))

static void test_reject_envelope(void)
{
    REJECT("", "message: empty");
    REJECT("[1,2]", "message: must be a JSON object");
    REJECT("\"heartbeat\"", "message: must be a JSON object");
    REJECT("null", "message: must be a JSON object");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":", "message: not valid JSON");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":1", "message: not valid JSON");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":1} {}", "unexpected data after");
    REJECT("{\"type\":\"heartbeat\",\"gen\":0,\"step\":1}", "v: missing");
    REJECT("{\"v\":2,\"type\":\"heartbeat\",\"gen\":0,\"step\":1}", "v: unsupported protocol version 2");
    REJECT("{\"v\":0,\"type\":\"heartbeat\",\"gen\":0,\"step\":1}", "v: unsupported protocol version 0");
    REJECT("{\"v\":\"1\",\"type\":\"heartbeat\",\"gen\":0,\"step\":1}", "v: must be an integer");
    REJECT("{\"v\":1.5,\"type\":\"heartbeat\",\"gen\":0,\"step\":1}", "v: must be an integer");
    REJECT("{\"v\":1,\"gen\":0,\"step\":1}", "type: missing");
    REJECT("{\"v\":1,\"type\":3,\"gen\":0,\"step\":1}", "type: must be a string");
    REJECT("{\"v\":1,\"type\":\"bogus\",\"gen\":0}", "type: unknown message type \"bogus\"");
    REJECT("{\"v\":1,\"type\":\"Heartbeat\",\"gen\":0}", "type: unknown message type");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"step\":1}", "gen: missing");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":-1,\"step\":1}", "gen: must be an integer in [0,");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":null,\"step\":1}", "gen: must be an integer");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":9007199254740992,\"step\":1}", "gen: must be an integer");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":1,\"extra\":1}", "extra: unknown field");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":1,\"step\":2}", "step: duplicate field");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"v\":1,\"step\":2}", "v: duplicate field");
}

static void test_reject_fields(void)
{
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0}", "step: missing");
    REJECT("{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":\"3\"}", "step: must be an integer");
    REJECT("{\"v\":1,\"type\":\"reduced\",\"gen\":0,\"step\":1.5}", "step: must be an integer");
    REJECT("{\"v\":1,\"type\":\"committed\",\"gen\":0,\"step\":1e300}", "step: must be an integer");
    REJECT("{\"v\":1,\"type\":\"start_step\",\"gen\":0,\"step\":-1}", "step: must be an integer");
    REJECT("{\"v\":1,\"type\":\"copy_done\",\"gen\":0,\"bytes\":true}", "bytes: must be an integer");
    REJECT("{\"v\":1,\"type\":\"nccl_root\",\"gen\":2,\"id\":\"00ff\"}", "id: too short (at least 256");
    REJECT("{\"v\":1,\"type\":\"nccl_init\",\"gen\":2}", "id: missing");
    REJECT("{\"v\":1,\"type\":\"step_failed\",\"gen\":2,\"step\":4}", "reason: missing");

    const char *reg_ok = "{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"w-0\","
                         "\"node\":\"n1\",\"zone\":\"\",\"host\":\"10.0.0.7\",\"port\":29500,\"gpus\":8,\"device\":\"GPU-5b2f9c1e-0d7a\",\"nccl\":true,\"pid\":42,\"token_proof\":"
                         "\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}";
    pl_msg d;
    char err[512];
    CHECK_EQ_INT(pl_msg_decode(reg_ok, strlen(reg_ok), &d, err, sizeof err), 0);
    CHECK(!strcmp(d.u.reg.name, "w-0") && d.u.reg.gpus == 8 && d.u.reg.zone[0] == 0 &&
          !strcmp(d.u.reg.device, "GPU-5b2f9c1e-0d7a") && d.u.reg.nccl == 1 &&
          !strcmp(d.u.reg.host, "10.0.0.7") && d.u.reg.port == 29500);
    pl_msg_free(&d);

    char big[2048];
    char longname[PL_PROTO_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    snprintf(big, sizeof big,
             "{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"%s\",\"node\":\"n\","
             "\"zone\":\"z\",\"host\":\"h\",\"port\":1,\"gpus\":1,\"device\":\"\",\"nccl\":false,\"pid\":1,\"token_proof\":\"%064d\"}",
             longname, 0);
    REJECT(big, "name: too long (at most 253");
    REJECT("{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"\",\"node\":\"n\",\"zone\":\"z\","
           "\"host\":\"h\",\"port\":1,\"gpus\":1,\"device\":\"\",\"nccl\":false,\"pid\":1,\"token_proof\":\"0\"}",
           "name: must not be empty");
    REJECT("{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"a b\",\"node\":\"n\",\"zone\":\"z\","
           "\"host\":\"h\",\"port\":1,\"gpus\":1,\"device\":\"\",\"nccl\":false,\"pid\":1,\"token_proof\":\"0\"}",
           "name: invalid character at offset 1");
    REJECT("{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"a\",\"node\":\"n\",\"zone\":\"z\","
           "\"host\":\"h\",\"port\":1,\"gpus\":1025,\"pid\":1,\"token_proof\":\"0\"}",
           "gpus: must be an integer in [0, 1024]");
    REJECT("{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"a\",\"node\":\"n\",\"zone\":\"z\","
           "\"host\":\"h\",\"port\":1,\"gpus\":1,\"device\":\"\",\"nccl\":false,\"pid\":0,\"token_proof\":\"0\"}",
           "pid: must be an integer");
    REJECT("{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"a\",\"node\":\"n\",\"zone\":\"z\","
           "\"host\":\"h\",\"port\":1,\"gpus\":1,\"device\":\"\",\"nccl\":false,\"pid\":1,\"token_proof\":\"0123\"}",
           "token_proof: too short (at least 64");
    REJECT("{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"a\",\"node\":\"n\",\"zone\":\"z\","
           "\"host\":\"h\",\"port\":1,\"gpus\":1,\"device\":\"\",\"nccl\":false,\"pid\":1}",
           "token_proof: missing");
    REJECT("{\"v\":1,\"type\":\"leaving\",\"gen\":0,\"reason\":\"bored\",\"grace_ms\":0}",
           "reason: must be \"sigterm\"");
    REJECT("{\"v\":1,\"type\":\"leaving\",\"gen\":0,\"reason\":\"sigterm\"}", "grace_ms: missing");
    const char *rep = "{\"v\":1,\"type\":\"report\",\"gen\":0,\"step\":1,\"loss\":null,\"tokens\":5,"
                      "\"ms\":1,\"grad_sumsq\":0,\"samples_digest\":\"%s\"}";
    snprintf(big, sizeof big, rep, "0123456789abcdeg");
    REJECT(big, "samples_digest: invalid character at offset 15");
    snprintf(big, sizeof big, rep, "0123");
    REJECT(big, "samples_digest: too short");
    REJECT("{\"v\":1,\"type\":\"report\",\"gen\":0,\"step\":1,\"loss\":1,\"tokens\":5,\"ms\":-1,"
           "\"grad_sumsq\":0,\"samples_digest\":\"0000000000000000\"}",
           "ms: must be a finite number >= 0");
    REJECT("{\"v\":1,\"type\":\"report\",\"gen\":0,\"step\":1,\"loss\":1,\"tokens\":5,\"ms\":1,"
           "\"grad_sumsq\":\"-inf\",\"samples_digest\":\"0000000000000000\"}",
           "grad_sumsq: must be a number >= 0 or \"nan\"");
    REJECT("{\"v\":1,\"type\":\"report\",\"gen\":0,\"step\":1,\"loss\":\"big\",\"tokens\":5,\"ms\":1,"
           "\"grad_sumsq\":1,\"samples_digest\":\"0000000000000000\"}",
           "loss: must be a number");
    REJECT("{\"v\":1,\"type\":\"commit\",\"gen\":0,\"step\":1,\"grad_scale\":0,\"lr\":0.1}",
           "grad_scale: must be a finite number > 0");
    REJECT("{\"v\":1,\"type\":\"commit\",\"gen\":0,\"step\":1,\"grad_scale\":\"nan\",\"lr\":0.1}",
           "grad_scale: must be a finite number");
    REJECT("{\"v\":1,\"type\":\"commit\",\"gen\":0,\"step\":1,\"grad_scale\":1,\"lr\":-0.1}", "lr: must be");
    REJECT("{\"v\":1,\"type\":\"stop\",\"gen\":0,\"reason\":\"done\",\"exit_code\":256}",
           "exit_code: must be an integer in [0, 255]");
    REJECT("{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":\"bad\\u0001\"}",
           "reason: invalid character at offset 3");
    REJECT("{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":[]}", "reason: must be a string");
    REJECT("{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":\"ok \xc3\"}", "reason: invalid UTF-8 at offset 3");
    REJECT("{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":\"\xc0\xaf\"}", "reason: invalid UTF-8 at offset 0");
    REJECT("{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":\"\xed\xa0\x80\"}", "reason: invalid UTF-8");
    REJECT("{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":\"\\ud800\"}", "message: not valid JSON");
    REJECT("{\"v\":1,\"type\":\"abort\",\"gen\":0,\"step\":3}", "reason: missing");
    REJECT("{\"v\":1,\"type\":\"peer_broken\",\"gen\":0,\"peer\":\"a/b\",\"reason\":\"\"}",
           "peer: invalid character");
    REJECT("{\"v\":1,\"type\":\"hello_resume\",\"gen\":0,\"committed_step\":4,\"grad_scale\":1,\"lr\":0,"
           "\"reduced_step\":7}",
           "reduced_step: must be -1 or committed_step + 1 (5)");
    REJECT("{\"v\":1,\"type\":\"hello_resume\",\"gen\":0,\"committed_step\":-2,\"grad_scale\":1,\"lr\":0,"
           "\"reduced_step\":-1}",
           "committed_step: must be an integer in [-1,");
    REJECT("{\"v\":1,\"type\":\"challenge\",\"gen\":0,\"nonce\":\"00112233445566778899aabbccddeeff0\"}",
           "nonce: must have an even number");
    REJECT("{\"v\":1,\"type\":\"challenge\",\"gen\":0,\"nonce\":\"0011\"}", "nonce: too short");
    REJECT("{\"v\":1,\"type\":\"welcome\",\"gen\":0,\"rank\":0,\"job\":\"j\",\"token_ok\":1,\"heartbeat_ms\":1000}",
           "token_ok: must be true or false");
    REJECT("{\"v\":1,\"type\":\"welcome\",\"gen\":0,\"rank\":1073741824,\"job\":\"j\",\"token_ok\":true,\"heartbeat_ms\":1000}",
           "rank: must be an integer in [0, 1073741823]");
    REJECT("{\"v\":1,\"type\":\"welcome\",\"gen\":0,\"rank\":1,\"job\":\"j\",\"token_ok\":true,\"heartbeat_ms\":5}",
           "heartbeat_ms: must be an integer in [100, 600000]");

    /* A very long free text */
    char *txt = malloc(PL_PROTO_TEXT_MAX + 200);
    CHECK(txt);
    int k = sprintf(txt, "{\"v\":1,\"type\":\"refuse\",\"gen\":0,\"reason\":\"");
    memset(txt + k, 'x', PL_PROTO_TEXT_MAX + 1);
    strcpy(txt + k + PL_PROTO_TEXT_MAX + 1, "\"}");
    int ok = expect_reject(txt, strlen(txt), "reason: too long (at most 1023");
    free(txt);
    CHECK(ok);
}

/* Decodes text, which must be accepted; the message in d (free it). */
static int expect_accept(const char *text, pl_msg *d)
{
    char err[512];
    if (pl_msg_decode(text, strlen(text), d, err, sizeof err) == 0) return 1;
    printf("    rejected (%s): %.300s\n", err, text);
    return 0;
}

#define REG_HEAD "{\"v\":1,\"type\":\"register\",\"gen\":0,\"job\":\"j\",\"name\":\"w0\"," \
                 "\"node\":\"n\",\"zone\":\"\",\"host\":\"h\",\"port\":1,\"gpus\":0,\"device\":\"\"," \
                 "\"nccl\":false,\"pid\":1,\"token_proof\":\"" \
                 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\""

/* register's optional "checkpoint": absent, a step, or an error; each bad field named. */
static void test_register_checkpoint(void)
{
    pl_msg d;
    CHECK(expect_accept(REG_HEAD "}", &d));
    CHECK_EQ_INT(d.u.reg.has_checkpoint, 0);
    pl_msg_free(&d);
    CHECK(expect_accept(REG_HEAD ",\"checkpoint\":{\"step\":8,\"error\":\"\"}}", &d));
    CHECK(d.u.reg.has_checkpoint && d.u.reg.checkpoint_step == 8 && !d.u.reg.checkpoint_error[0]);
    pl_msg_free(&d);
    CHECK(expect_accept(REG_HEAD ",\"checkpoint\":{\"error\":\"permission denied\",\"step\":0}}", &d));
    CHECK(d.u.reg.has_checkpoint && !strcmp(d.u.reg.checkpoint_error, "permission denied"));
    pl_msg_free(&d);
    REJECT(REG_HEAD ",\"checkpoint\":null}", "checkpoint: must be an object");
    REJECT(REG_HEAD ",\"checkpoint\":3}", "checkpoint: must be an object");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":-1,\"error\":\"\"}}", "checkpoint.step: must be an integer");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":1.5,\"error\":\"\"}}", "checkpoint.step: must be an integer");
    REJECT(REG_HEAD ",\"checkpoint\":{\"error\":\"\"}}", "checkpoint.step: missing");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":2}}", "checkpoint.error: missing");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":2,\"error\":7}}", "checkpoint.error: must be a string");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":0,\"error\":\"a\\u0001\"}}",
           "checkpoint.error: invalid character");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":2,\"error\":\"unreadable\"}}",
           "checkpoint.step: must be 0 when checkpoint.error is given");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":2,\"error\":\"\",\"dir\":\"/x\"}}",
           "checkpoint.dir: unknown field");
    REJECT(REG_HEAD ",\"checkpoint\":{\"step\":2,\"error\":\"\"},\"checkpoint\":{}}",
           "checkpoint: duplicate field");
}

/* complete_checkpoint / checkpoint_done, profile_request / profile_done, eval / eval_done:
 * accepted, and each bad field rejected naming it. */
static void test_duty_messages(void)
{
    pl_msg d;
    CHECK(expect_accept("{\"v\":1,\"type\":\"complete_checkpoint\",\"gen\":3,\"step\":4}", &d));
    CHECK(d.type == PL_MSG_COMPLETE_CHECKPOINT && d.u.complete_checkpoint.step == 4);
    REJECT("{\"v\":1,\"type\":\"complete_checkpoint\",\"gen\":3,\"step\":0}",
           "step: must be an integer in [1,");
    REJECT("{\"v\":1,\"type\":\"complete_checkpoint\",\"gen\":3}", "step: missing");
    REJECT("{\"v\":1,\"type\":\"complete_checkpoint\",\"gen\":3,\"step\":4,\"dir\":\"/c\"}",
           "dir: unknown field");
    CHECK(expect_accept("{\"v\":1,\"type\":\"checkpoint_done\",\"gen\":3,\"step\":4,\"error\":\"\"}", &d));
    CHECK(d.type == PL_MSG_CHECKPOINT_DONE && d.u.checkpoint_done.step == 4);
    CHECK(expect_accept("{\"v\":1,\"type\":\"checkpoint_done\",\"gen\":3,\"step\":4,"
                        "\"error\":\"/c/step-00000004: read-only file system\"}", &d));
    CHECK_STR_CONTAINS(d.u.checkpoint_done.error, "read-only");
    REJECT("{\"v\":1,\"type\":\"checkpoint_done\",\"gen\":3,\"step\":4}", "error: missing");
    REJECT("{\"v\":1,\"type\":\"checkpoint_done\",\"gen\":3,\"step\":-4,\"error\":\"\"}",
           "step: must be an integer in [1,");
    REJECT("{\"v\":1,\"type\":\"checkpoint_done\",\"gen\":3,\"step\":4,\"error\":null}",
           "error: must be a string");

    CHECK(expect_accept("{\"v\":1,\"type\":\"profile_request\",\"gen\":0,\"repeat\":3}", &d));
    CHECK(d.type == PL_MSG_PROFILE_REQUEST && d.u.profile_request.repeat == 3);
    REJECT("{\"v\":1,\"type\":\"profile_request\",\"gen\":0,\"repeat\":0}",
           "repeat: must be an integer in [1, 1000]");
    REJECT("{\"v\":1,\"type\":\"profile_request\",\"gen\":0}", "repeat: missing");

    CHECK(expect_accept("{\"v\":1,\"type\":\"eval\",\"gen\":2,\"step\":0}", &d));
    CHECK(d.type == PL_MSG_EVAL && d.u.eval.step == 0);
    REJECT("{\"v\":1,\"type\":\"eval\",\"gen\":2,\"step\":-1}", "step: must be an integer");
    CHECK(expect_accept("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"loss\":7.5,"
                        "\"batches\":3}", &d));
    CHECK(d.u.eval_done.has_loss && d.u.eval_done.loss == 7.5 && d.u.eval_done.batches == 3);
    CHECK(expect_accept("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"loss\":null,"
                        "\"batches\":3}", &d));
    CHECK(!d.u.eval_done.has_loss);
    CHECK(expect_accept("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"loss\":\"nan\","
                        "\"batches\":0}", &d));
    CHECK(isnan(d.u.eval_done.loss));
    REJECT("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"loss\":\"low\",\"batches\":3}",
           "loss: must be a number");
    REJECT("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"loss\":1,\"batches\":-1}",
           "batches: must be an integer in [0,");
    REJECT("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"batches\":1}", "loss: missing");
    REJECT("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"step\":9,\"loss\":1}", "batches: missing");
    REJECT("{\"v\":1,\"type\":\"eval_done\",\"gen\":2,\"loss\":1,\"batches\":1}", "step: missing");
}

/* A checkpoint write that failed (saved with its error), a checkpoint written again
 * (save) and a worker's fatal error: accepted, each bad field rejected naming it. */
static void test_checkpoint_failure_and_fatal(void)
{
    pl_msg d;
    CHECK(expect_accept("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":4,\"layer_begin\":0,"
                        "\"layer_end\":3,\"bytes\":900,\"error\":\"\"}", &d));
    CHECK(d.type == PL_MSG_SAVED && d.u.saved.bytes == 900 && !d.u.saved.error[0]);
    CHECK(expect_accept("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":4,\"layer_begin\":0,"
                        "\"layer_end\":3,\"bytes\":0,\"error\":\"/c/step-00000004: Not a directory\"}",
                        &d));
    CHECK_STR_CONTAINS(d.u.saved.error, "Not a directory");
    REJECT("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":4,\"layer_begin\":0,\"layer_end\":3,"
           "\"bytes\":9,\"error\":\"disk full\"}",
           "bytes: must be 0 when error is given");
    REJECT("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":4,\"layer_begin\":0,\"layer_end\":3,"
           "\"bytes\":9}",
           "error: missing");
    REJECT("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":4,\"layer_begin\":0,\"layer_end\":3,"
           "\"bytes\":0,\"error\":false}",
           "error: must be a string");
    REJECT("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":4,\"layer_begin\":0,\"layer_end\":3,"
           "\"bytes\":0,\"error\":\"a\\u0002\"}",
           "error: invalid character");
    REJECT("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":0,\"layer_begin\":0,\"layer_end\":3,"
           "\"bytes\":0,\"error\":\"\"}",
           "step: must be an integer in [1,");
    REJECT("{\"v\":1,\"type\":\"saved\",\"gen\":2,\"step\":1,\"layer_begin\":3,\"layer_end\":3,"
           "\"bytes\":0,\"error\":\"\"}",
           "layer_end: must be an integer in [4,");

    CHECK(expect_accept("{\"v\":1,\"type\":\"save\",\"gen\":5,\"step\":8}", &d));
    CHECK(d.type == PL_MSG_SAVE && d.u.save.step == 8 && pl_msg_from_worker(d.type) == 0);
    REJECT("{\"v\":1,\"type\":\"save\",\"gen\":5,\"step\":0}", "step: must be an integer in [1,");
    REJECT("{\"v\":1,\"type\":\"save\",\"gen\":5}", "step: missing");
    REJECT("{\"v\":1,\"type\":\"save\",\"gen\":5,\"step\":2,\"dir\":\"/c\"}", "dir: unknown field");

    CHECK(expect_accept("{\"v\":1,\"type\":\"fatal\",\"gen\":0,\"reason\":\"data: /d/x.bin: token "
                        "65535 at index 0 (byte offset 1024) is out of range for vocabulary size "
                        "256\"}", &d));
    CHECK(d.type == PL_MSG_FATAL && pl_msg_from_worker(d.type) == 1);
    CHECK_STR_CONTAINS(d.u.fatal.reason, "byte offset 1024");
    REJECT("{\"v\":1,\"type\":\"fatal\",\"gen\":0,\"reason\":\"\"}", "reason: must not be empty");
    REJECT("{\"v\":1,\"type\":\"fatal\",\"gen\":0}", "reason: missing");
    REJECT("{\"v\":1,\"type\":\"fatal\",\"gen\":0,\"reason\":3}", "reason: must be a string");
    REJECT("{\"v\":1,\"type\":\"fatal\",\"gen\":0,\"reason\":\"x\",\"step\":1}",
           "step: unknown field");
}

/* profile_done carries the planner's profile JSON, which must parse as one, or why not. */
static void test_profile_done(void)
{
    char *prof = profile_text(3, 0.25);
    CHECK(prof);
    pl_msg m, d;
    pl_msg_init(&m, PL_MSG_PROFILE_DONE, 0);
    m.u.profile_done.profile = prof;
    char err[512];
    char *text = pl_msg_encode_err(&m, err, sizeof err);
    if (!text) printf("    %s\n", err);
    CHECK(text);
    CHECK(expect_accept(text, &d));
    CHECK(d.u.profile_done.profile && !strcmp(d.u.profile_done.profile, prof));
    pl_msg_free(&d);
    free(text);
    CHECK(expect_accept("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"profile\":null,"
                        "\"error\":\"out of memory\"}", &d));
    CHECK(!d.u.profile_done.profile && !strcmp(d.u.profile_done.error, "out of memory"));
    pl_msg_free(&d);
    REJECT("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"profile\":null,\"error\":\"\"}",
           "error: must say why when profile is null");
    REJECT("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"profile\":\"\",\"error\":\"\"}",
           "profile: must not be empty");
    REJECT("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"profile\":5,\"error\":\"\"}",
           "profile: must be a string");
    REJECT("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"profile\":\"{}\",\"error\":\"\"}",
           "profile: not a planner profile");
    REJECT("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"error\":\"x\"}", "profile: missing");
    REJECT("{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"profile\":null}", "error: missing");
    /* a profile with an error, and one over the size limit */
    m.u.profile_done.profile = prof;
    strcpy(m.u.profile_done.error, "but");
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "error: must be \"\" with a profile");
    m.u.profile_done.error[0] = 0;
    m.u.profile_done.profile = malloc(PL_PROTO_PROFILE_MAX + 2);
    CHECK(m.u.profile_done.profile);
    memset(m.u.profile_done.profile, ' ', PL_PROTO_PROFILE_MAX + 1);
    m.u.profile_done.profile[PL_PROTO_PROFILE_MAX + 1] = 0;
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "profile: string not terminated");
    size_t n = PL_PROTO_PROFILE_MAX + 200;
    char *big = malloc(n);
    CHECK(big);
    int k = snprintf(big, n, "{\"v\":1,\"type\":\"profile_done\",\"gen\":0,\"error\":\"\",\"profile\":\"");
    memset(big + k, 'x', PL_PROTO_PROFILE_MAX + 1);
    strcpy(big + k + PL_PROTO_PROFILE_MAX + 1, "\"}");
    CHECK(expect_reject(big, strlen(big), "profile: too long"));
    free(big);
    pl_msg_free(&m); /* frees the big text */
    free(prof);
}

static const char PLAN_OK[] =
    "{\"v\":1,\"type\":\"plan\",\"gen\":3,\"generation\":3,\"step\":10,\"global_batch\":20,\"micro\":2,"
    "\"seq_len\":64,\"pipelines\":[{\"nodes\":[\"a\",\"b\"],\"layers\":[0,7,14],\"template_nodes\":2,"
    "\"microbatches\":6,\"first_microbatch\":0},{\"nodes\":[\"c\",\"d\",\"e\"],\"layers\":[0,3,8,14],"
    "\"template_nodes\":3,\"microbatches\":4,"
    "\"first_microbatch\":6}],\"you\":{\"pipeline\":1,\"stage\":2,\"layer_begin\":8,\"layer_end\":14},"
    "\"peers\":[{\"name\":\"d\",\"host\":\"10.0.0.4\",\"port\":7001}],\"copies\":[{\"layer\":8,"
    "\"source\":\"b\",\"bytes\":1000},{\"layer\":9,\"source\":\"b\",\"bytes\":1000}],\"sends\":"
    "[{\"layer\":3,\"dest\":\"c\"}],\"checkpoint\":null,\"transport\":\"nccl\"}";

/* PLAN_OK with the first occurrence of `from` replaced by `to`. */
static int plan_reject(const char *from, const char *to, const char *needle)
{
    const char *at = strstr(PLAN_OK, from);
    if (!at) {
        printf("    \"%s\" not in the plan\n", from);
        return 0;
    }
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - PLAN_OK), PLAN_OK, to, at + strlen(from));
    return expect_reject(buf, strlen(buf), needle);
}

#define PLAN_REJECT(from, to, needle) CHECK(plan_reject(from, to, needle))

/* "reserve" is optional (PLAN_OK has none: 0) and survives a round trip. */
static int plan_reserve_round_trip(void)
{
    pl_msg d, back = {0};
    char err[512], buf[4096];
    const char *end = strrchr(PLAN_OK, '}');
    snprintf(buf, sizeof buf, "%.*s,\"reserve\":123456789}", (int)(end - PLAN_OK), PLAN_OK);
    if (pl_msg_decode(PLAN_OK, strlen(PLAN_OK), &d, err, sizeof err)) return 0;
    int ok = d.u.plan.reserve_bytes == 0;
    pl_msg_free(&d);
    if (pl_msg_decode(buf, strlen(buf), &d, err, sizeof err)) return 0;
    char *text = pl_msg_encode(&d);
    ok = ok && d.u.plan.reserve_bytes == 123456789 && text &&
         !pl_msg_decode(text, strlen(text), &back, err, sizeof err);
    ok = ok && back.u.plan.reserve_bytes == 123456789;
    pl_msg_free(&back);
    free(text);
    pl_msg_free(&d);
    return ok;
}

static void test_plan(void)
{
    pl_msg d;
    char err[512];
    int rc = pl_msg_decode(PLAN_OK, strlen(PLAN_OK), &d, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    const pl_msg_plan *p = &d.u.plan;
    int ok = p->npipelines == 2 && p->pipelines[1].nnodes == 3 && !strcmp(p->pipelines[1].nodes[2], "e") &&
             p->pipelines[1].first_microbatch == 6 && p->you_pipeline == 1 && p->you_stage == 2 &&
             p->you_layer_begin == 8 && p->you_layer_end == 14 && p->npeers == 1 && p->peers[0].port == 7001 &&
             p->ncopies == 2 && p->copies[1].layer == 9 && p->nsends == 1 && !strcmp(p->sends[0].dest, "c") &&
             !p->has_checkpoint && p->transport == PL_TRANSPORT_NCCL && d.gen == 3;
    pl_msg_free(&d);
    CHECK(ok);
    CHECK(plan_reserve_round_trip());

    PLAN_REJECT("\"generation\":3", "\"generation\":2", "generation: must equal gen (3)");
    REJECT("{\"v\":1,\"type\":\"plan\",\"gen\":0,\"generation\":0,\"step\":0,\"global_batch\":1,"
           "\"micro\":1,\"seq_len\":1,\"pipelines\":[],\"you\":null,\"peers\":[],\"copies\":[],"
           "\"sends\":[],\"checkpoint\":null,\"transport\":\"tcp\"}",
           "pipelines: must have 1 to 4096 entries");
    PLAN_REJECT("\"pipelines\":", "\"pipelinez\":", "pipelinez: unknown field");
    PLAN_REJECT("[\"c\",", "[7,", "pipelines[1].nodes[0]: must be a string");
    PLAN_REJECT("[\"c\",", "[\"a\",", "pipelines[1].nodes[0]: \"a\" already runs pipelines[0].nodes[0]");
    PLAN_REJECT("\"d\",\"e\"", "\"d\",\"d\"", "pipelines[1].nodes[2]: \"d\" already runs pipelines[1].nodes[1]");
    PLAN_REJECT("\"template_nodes\":2", "\"template_nodes\":3", "pipelines[0].template_nodes: must equal");
    PLAN_REJECT("\"first_microbatch\":6", "\"first_microbatch\":7", "pipelines[1].first_microbatch: must be 6");
    PLAN_REJECT("\"microbatches\":6", "\"microbatches\":0", "pipelines[0].microbatches: must be an integer");
    PLAN_REJECT("\"global_batch\":20", "\"global_batch\":22", "global_batch: must equal micro");
    PLAN_REJECT("\"micro\":2", "\"micro\":0", "micro: must be an integer in [1,");
    PLAN_REJECT("{\"nodes\":[\"a\"", "{\"extra\":0,\"nodes\":[\"a\"", "pipelines[0].extra: unknown field");
    PLAN_REJECT("{\"nodes\":[\"a\",\"b\"],", "{", "pipelines[0].nodes: missing");
    PLAN_REJECT("\"stage\":2", "\"stage\":3", "you.stage: must be an integer in [0, 2]");
    PLAN_REJECT("\"stage\":2", "\"stage\":1", "you: layers [8, 14) differ from pipelines[1].layers (3, 8)");
    PLAN_REJECT("[0,3,8,14]", "[0,3,8,15]", "pipelines[1].layers[3]: must be 14, the model's layer count");
    PLAN_REJECT("[0,3,8,14]", "[0,3,3,14]", "pipelines[1].layers[2]: must be an integer in 4..4096");
    PLAN_REJECT("[0,3,8,14]", "[0,3,14]", "pipelines[1].layers: must have");
    PLAN_REJECT("\"pipeline\":1", "\"pipeline\":2", "you.pipeline: must be an integer in [0, 1]");
    PLAN_REJECT("\"layer_end\":14", "\"layer_end\":8", "you.layer_end: must be an integer in [9,");
    PLAN_REJECT("\"you\":{\"pipeline\":1,\"stage\":2,\"layer_begin\":8,\"layer_end\":14}", "\"you\":3", "you: must be an object or null");
    PLAN_REJECT("\"port\":7001", "\"port\":0", "peers[0].port: must be an integer in [1, 65535]");
    PLAN_REJECT("\"host\":\"10.0.0.4\"", "\"host\":\"10.0.0.4/x\"", "peers[0].host: invalid character");
    PLAN_REJECT("\"peers\":[{", "\"peers\":[1,{", "peers[0]: must be an object");
    PLAN_REJECT("{\"layer\":9", "{\"layer\":-1", "copies[1].layer: must be an integer in [0, 4095]");
    PLAN_REJECT("\"source\":\"b\"", "\"source\":\"\"", "copies[0].source: must not be empty");
    /* a layer copied in parts: "part" and "parts" together, 2 ≤ parts ≤ 8, part < parts */
    PLAN_REJECT("{\"layer\":9,", "{\"layer\":9,\"part\":1,", "copies[1].parts: missing");
    PLAN_REJECT("{\"layer\":9,", "{\"layer\":9,\"parts\":2,", "copies[1].part: missing");
    PLAN_REJECT("{\"layer\":9,", "{\"layer\":9,\"part\":0,\"parts\":1,",
                "copies[1].parts: must be an integer in [2, 8]");
    PLAN_REJECT("{\"layer\":9,", "{\"layer\":9,\"part\":2,\"parts\":2,",
                "copies[1].part: must be an integer in [0, 1]");
    PLAN_REJECT("\"dest\":\"c\"", "\"dst\":\"c\"", "sends[0].dst: unknown field");
    PLAN_REJECT("{\"layer\":3,\"dest\":\"c\"}", "{\"layer\":3}", "sends[0].dest: missing");
    PLAN_REJECT("\"sends\":[{\"layer\":3,\"dest\":\"c\"}]", "\"sends\":{\"layer\":3}", "sends: must be an array");
    PLAN_REJECT("\"checkpoint\":null", "\"checkpoint\":{\"dir\":\"\",\"step\":3}", "checkpoint.dir: must not be empty");
    PLAN_REJECT("\"checkpoint\":null", "\"checkpoint\":{\"dir\":\"/ck\"}", "checkpoint.step: missing");
    PLAN_REJECT("\"checkpoint\":null", "\"checkpoint\":[]", "checkpoint: must be an object or null");
    PLAN_REJECT(",\"checkpoint\":null", "", "checkpoint: missing");
    PLAN_REJECT("\"transport\":\"nccl\"", "\"transport\":\"rdma\"", "transport: must be \"tcp\" or \"nccl\"");
    PLAN_REJECT(",\"transport\":\"nccl\"", "", "transport: missing");
    PLAN_REJECT("\"transport\":\"nccl\"", "\"transport\":\"nccl\",\"reserve\":-1",
                "reserve: must be an integer in [0,");
    PLAN_REJECT("\"transport\":\"nccl\"", "\"transport\":\"nccl\",\"reserve\":\"1\"",
                "reserve: must be an integer");

    /* An idle worker and a checkpoint */
    char buf[4096];
    const char *you = strstr(PLAN_OK, "\"you\":{");
    const char *you_end = strstr(you, "}");
    const char *ck = strstr(PLAN_OK, "\"checkpoint\":null");
    snprintf(buf, sizeof buf,
             "%.*s\"you\":null%.*s\"checkpoint\":{\"dir\":\"/ckpt/job 1\",\"step\":9},"
             "\"transport\":\"tcp\"}",
             (int)(you - PLAN_OK), PLAN_OK, (int)(ck - you_end - 1), you_end + 1);
    rc = pl_msg_decode(buf, strlen(buf), &d, err, sizeof err);
    if (rc) printf("    %s\n    %s\n", err, buf);
    CHECK_EQ_INT(rc, 0);
    ok = d.u.plan.you_pipeline == -1 && d.u.plan.has_checkpoint && d.u.plan.checkpoint_step == 9 &&
         !strcmp(d.u.plan.checkpoint_dir, "/ckpt/job 1");
    pl_msg_free(&d);
    CHECK(ok);

    /* an idle worker's plan needs "checkpoint" too ("you": null must not excuse it) */
    snprintf(buf, sizeof buf, "%.*s\"you\":null%.*s\"transport\":\"tcp\"}",
             (int)(you - PLAN_OK), PLAN_OK, (int)(ck - you_end - 1), you_end + 1);
    CHECK(expect_reject(buf, strlen(buf), "checkpoint: missing"));
}

static void test_reject_size_and_nesting(void)
{
    /* Over the limit: rejected before parsing, whatever the content. */
    size_t n = PL_PROTO_MAX_BYTES + 1;
    char *big = malloc(n + 1);
    CHECK(big);
    memset(big, ' ', n);
    memcpy(big, "{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":1}", 43);
    big[n] = 0;
    int ok = expect_reject(big, n, "exceeds the limit of 1048576");
    /* Exactly at the limit: parsed (trailing white space is fine). */
    pl_msg d;
    char err[256];
    int rc = pl_msg_decode(big, PL_PROTO_MAX_BYTES, &d, err, sizeof err);
    pl_msg_free(&d);
    /* Deep nesting must not blow the stack. */
    size_t depth = 200000, k = 0;
    k += (size_t)sprintf(big, "{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":");
    for (size_t i = 0; i < depth; i++) big[k++] = '[';
    for (size_t i = 0; i < depth; i++) big[k++] = ']';
    big[k++] = '}';
    int ok2 = expect_reject(big, k, "message: not valid JSON");
    /* A huge array of small values within the limit. */
    k = (size_t)sprintf(big, "{\"v\":1,\"type\":\"plan\",\"gen\":0,\"generation\":0,\"step\":0,"
                             "\"global_batch\":1,\"micro\":1,\"seq_len\":1,\"pipelines\":[");
    while (k < PL_PROTO_MAX_BYTES - 16) {
        memcpy(big + k, "1,", 2);
        k += 2;
    }
    memcpy(big + k, "1]}", 3);
    k += 3;
    int ok3 = expect_reject(big, k, "pipelines: must have 1 to 4096 entries");
    /* Embedded NUL inside the text */
    const char nul[] = "{\"v\":1,\"type\":\"heartbeat\",\"gen\":0,\"step\":1}\0{}";
    int ok4 = expect_reject(nul, sizeof nul - 1, "unexpected data after");
    free(big);
    CHECK(ok);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK(ok2);
    CHECK(ok3);
    CHECK(ok4);
    CHECK_EQ_INT(pl_msg_decode(NULL, 3, &d, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "message: missing");
}

static void test_encode_rejects_invalid(void)
{
    pl_msg m;
    char err[256];
    pl_msg_init(&m, PL_MSG_COUNT, 0);
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "type: unknown");

    pl_msg_init(&m, PL_MSG_PEER_BROKEN, 0);
    memset(m.u.peer_broken.peer, 'a', sizeof m.u.peer_broken.peer); /* no NUL */
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "peer: string not terminated");

    pl_msg_init(&m, PL_MSG_REPORT, 0);
    m.u.report.ms = NAN;
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "ms: must be a finite number");

    pl_msg_init(&m, PL_MSG_LEAVING, 0);
    m.u.leaving.reason = PL_LEAVE_COUNT;
    CHECK(!pl_msg_encode(&m));

    pl_msg_init(&m, PL_MSG_REGISTER, 0); /* empty names */
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "job: must not be empty");

    rng_state = 7;
    rand_msg(&m, PL_MSG_PLAN);
    m.u.plan.global_batch += 1;
    CHECK(!pl_msg_encode_err(&m, err, sizeof err));
    CHECK_STR_CONTAINS(err, "global_batch: must equal");
    m.u.plan.global_batch -= 1;
    m.gen += 1;
    char *t = pl_msg_encode_err(&m, err, sizeof err);
    free(t);
    CHECK(!t);
    CHECK_STR_CONTAINS(err, "generation: must equal gen");
    m.u.plan.generation = m.gen;
    t = pl_msg_encode(&m);
    free(t);
    pl_msg_free(&m);
    CHECK(t);
    CHECK(!pl_msg_encode(NULL));
    pl_msg_free(NULL);
}

/* ------------------------------------------------------------------- fuzz */

static void test_fuzz_mutations(void)
{
    enum { NSEED = 3 * (PL_MSG_COUNT - 1), ITER = 20000 };
    static const char interesting[] = "{}[]\":,0123456789-+.eE\\nu tfa\x00\xff\x80";
    char *seeds[NSEED];
    rng_state = 2024;
    for (int i = 0; i < NSEED; i++) {
        pl_msg m;
        rand_msg(&m, 1 + i % (PL_MSG_COUNT - 1));
        if (m.type == PL_MSG_PLAN) { /* keep plans small so the loop stays fast */
            for (int j = 0; j < m.u.plan.npipelines; j++)
                for (int k = 0; k < m.u.plan.pipelines[j].nnodes; k++) m.u.plan.pipelines[j].nodes[k][8] = 0;
            m.u.plan.has_checkpoint = 0;
        }
        char err[256];
        seeds[i] = pl_msg_encode_err(&m, err, sizeof err);
        pl_msg_free(&m);
        if (!seeds[i]) printf("    seed %d: %s\n", i, err);
        CHECK(seeds[i]);
    }
    char *buf = malloc(1 << 16);
    CHECK(buf);
    int accepted = 0, reencoded = 0;
    for (int it = 0; it < ITER; it++) {
        const char *s = seeds[rng_next() % NSEED];
        size_t n = strlen(s);
        if (n > 30000) n = 30000;
        memcpy(buf, s, n);
        int muts = (int)rng_range(1, 6);
        for (int k = 0; k < muts && n > 0; k++) {
            size_t at = (size_t)(rng_next() % n);
            switch (rng_next() % 6) {
            case 0: buf[at] = (char)(rng_next() & 0xff); break;
            case 1: buf[at] = interesting[rng_next() % (sizeof interesting - 1)]; break;
            case 2: memmove(buf + at, buf + at + 1, n - at - 1); n--; break; /* delete */
            case 3: /* insert */
                if (n + 1 < (1 << 16)) {
                    memmove(buf + at + 1, buf + at, n - at);
                    buf[at] = interesting[rng_next() % (sizeof interesting - 1)];
                    n++;
                }
                break;
            case 4: n = at; break; /* truncate */
            default: { /* duplicate a short range */
                size_t len = (size_t)rng_range(1, 16);
                if (at + len <= n && n + len < (1 << 16)) {
                    memmove(buf + at + len, buf + at, n - at);
                    n += len;
                }
            }
            }
        }
        /* Decode from an exactly-sized copy so reads past the end are caught. */
        char *exact = malloc(n ? n : 1);
        CHECK(exact);
        memcpy(exact, buf, n);
        pl_msg d;
        char err[256];
        int rc = pl_msg_decode(exact, n, &d, err, sizeof err);
        free(exact);
        if (rc == 0) {
            accepted++;
            /* Whatever is accepted re-encodes and decodes to the same message. */
            char *t = pl_msg_encode(&d);
            pl_msg d2;
            int ok = t && pl_msg_decode(t, strlen(t), &d2, err, sizeof err) == 0;
            if (ok) {
                reencoded += msg_equal(&d, &d2);
                pl_msg_free(&d2);
            }
            free(t);
            pl_msg_free(&d);
            CHECK(ok);
        } else {
            CHECK(err[0]);
        }
    }
    free(buf);
    for (int i = 0; i < NSEED; i++) free(seeds[i]);
    CHECK(accepted > 0);
    CHECK_EQ_INT(reencoded, accepted);
}

TEST_MAIN_BEGIN
RUN(test_type_names);
RUN(test_round_trip_every_type);
RUN(test_dup_every_type);
RUN(test_known_encoding);
RUN(test_reject_envelope);
RUN(test_reject_fields);
RUN(test_register_checkpoint);
RUN(test_duty_messages);
RUN(test_checkpoint_failure_and_fatal);
RUN(test_profile_done);
RUN(test_plan);
RUN(test_reject_size_and_nesting);
RUN(test_encode_rejects_invalid);
RUN(test_fuzz_mutations);
TEST_MAIN_END
