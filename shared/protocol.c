/* The control protocol's messages: strict JSON decoding (every field checked, errors
 * named by path) and encoding that only emits what the decoder accepts. */
#include "protocol.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "json_num.h"
#include "profile.h"
#include "util.h"

/* ---------------------------------------------------------------- names */

static const char *const type_names[PL_MSG_COUNT] = {
    [PL_MSG_NONE] = "?",
    [PL_MSG_REGISTER] = "register",
    [PL_MSG_HEARTBEAT] = "heartbeat",
    [PL_MSG_LEAVING] = "leaving",
    [PL_MSG_REPORT] = "report",
    [PL_MSG_REDUCED] = "reduced",
    [PL_MSG_COMMITTED] = "committed",
    [PL_MSG_PEER_BROKEN] = "peer_broken",
    [PL_MSG_COPY_DONE] = "copy_done",
    [PL_MSG_HELLO_RESUME] = "hello_resume",
    [PL_MSG_SAVED] = "saved",
    [PL_MSG_NCCL_ROOT] = "nccl_root",
    [PL_MSG_STEP_FAILED] = "step_failed",
    [PL_MSG_CHALLENGE] = "challenge",
    [PL_MSG_WELCOME] = "welcome",
    [PL_MSG_PLAN] = "plan",
    [PL_MSG_START_STEP] = "start_step",
    [PL_MSG_COMMIT] = "commit",
    [PL_MSG_ABORT] = "abort",
    [PL_MSG_STOP] = "stop",
    [PL_MSG_REFUSE] = "refuse",
    [PL_MSG_NCCL_INIT] = "nccl_init",
    [PL_MSG_CHECKPOINT_DONE] = "checkpoint_done",
    [PL_MSG_PROFILE_DONE] = "profile_done",
    [PL_MSG_EVAL_DONE] = "eval_done",
    [PL_MSG_COMPLETE_CHECKPOINT] = "complete_checkpoint",
    [PL_MSG_PROFILE_REQUEST] = "profile_request",
    [PL_MSG_EVAL] = "eval",
    [PL_MSG_FATAL] = "fatal",
    [PL_MSG_SAVE] = "save",
};

static const char *const leave_names[PL_LEAVE_COUNT] = {"sigterm", "shutdown", "error"};
static const char *const transport_names[PL_TRANSPORT_COUNT] = {"tcp", "nccl"};

const char *pl_transport_name(int transport)
{
    return transport >= 0 && transport < PL_TRANSPORT_COUNT ? transport_names[transport] : "?";
}

const char *pl_msg_type_name(int type)
{
    if (type <= PL_MSG_NONE || type >= PL_MSG_COUNT) return "?";
    return type_names[type];
}

int pl_msg_type_from_name(const char *name)
{
    if (!name) return PL_MSG_NONE;
    for (int t = PL_MSG_NONE + 1; t < PL_MSG_COUNT; t++)
        if (!strcmp(name, type_names[t])) return t;
    return PL_MSG_NONE;
}

int pl_msg_from_worker(int type)
{
    if (type > PL_MSG_NONE && type <= PL_MSG_FATAL) return 1;
    if (type >= PL_MSG_CHALLENGE && type < PL_MSG_COUNT) return 0;
    return -1;
}

const char *pl_leave_reason_name(int reason)
{
    if (reason < 0 || reason >= PL_LEAVE_COUNT) return "?";
    return leave_names[reason];
}

void pl_msg_init(pl_msg *m, int type, int64_t gen)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    m->gen = gen;
}

void pl_msg_free(pl_msg *m)
{
    if (!m) return;
    if (m->type == PL_MSG_PROFILE_DONE) free(m->u.profile_done.profile);
    if (m->type == PL_MSG_PLAN) {
        pl_msg_plan *p = &m->u.plan;
        if (p->pipelines)
            for (int i = 0; i < p->npipelines; i++) {
                free(p->pipelines[i].nodes);
                free(p->pipelines[i].layers);
            }
        free(p->pipelines);
        free(p->peers);
        free(p->copies);
        free(p->sends);
    }
    memset(m, 0, sizeof *m);
}

/* A malloc'd copy of n elements of size bytes at src; NULL for none, or when memory runs
 * out (then *failed = 1). */
static void *dup_array(const void *src, size_t n, size_t size, int *failed)
{
    if (!src || n == 0) return NULL;
    void *p = malloc(n * size);
    if (!p) {
        *failed = 1;
        return NULL;
    }
    return memcpy(p, src, n * size);
}

/* p starts as a shallow copy of from: each array is replaced by a copy of its own. */
static int dup_plan(pl_msg_plan *p, const pl_msg_plan *from)
{
    int failed = 0;
    const size_t np = from->pipelines ? (size_t)from->npipelines : 0;
    p->pipelines = np ? calloc(np, sizeof *p->pipelines) : NULL;
    failed = np && !p->pipelines;
    for (size_t i = 0; i < np && !failed; i++) {
        const pl_msg_pipeline *f = &from->pipelines[i];
        pl_msg_pipeline *q = &p->pipelines[i];
        *q = *f;
        q->nodes = dup_array(f->nodes, (size_t)f->nnodes, sizeof *f->nodes, &failed);
        q->layers = dup_array(f->layers, f->layers ? (size_t)f->nnodes + 1 : 0,
                              sizeof *f->layers, &failed);
    }
    p->peers = dup_array(from->peers, (size_t)from->npeers, sizeof *from->peers, &failed);
    p->copies = dup_array(from->copies, (size_t)from->ncopies, sizeof *from->copies, &failed);
    p->sends = dup_array(from->sends, (size_t)from->nsends, sizeof *from->sends, &failed);
    return failed ? -1 : 0;
}

int pl_msg_dup(const pl_msg *m, pl_msg *out)
{
    *out = *m;
    if (m->type == PL_MSG_PROFILE_DONE && m->u.profile_done.profile) {
        if ((out->u.profile_done.profile = strdup(m->u.profile_done.profile))) return 0;
        memset(out, 0, sizeof *out);
        return -1;
    }
    if (m->type != PL_MSG_PLAN) return 0;
    if (dup_plan(&out->u.plan, &m->u.plan) == 0) return 0;
    pl_msg_free(out);
    return -1;
}

const pl_msg_peer *pl_msg_plan_peer(const pl_msg_plan *p, const char *name)
{
    for (int i = 0; i < p->npeers; i++)
        if (!strcmp(p->peers[i].name, name)) return &p->peers[i];
    return NULL;
}

/* ------------------------------------------------------- decode helpers */

/* A short printable rendering of untrusted text for error messages. */
static void shown(char *dst, size_t n, const char *src)
{
    size_t k = 0;
    for (; src && *src && k + 4 < n; src++)
        dst[k++] = (*src >= 0x20 && *src < 0x7f) ? *src : '?';
    if (src && *src && n >= 4) {
        memcpy(dst + k, "...", 3);
        k += 3;
    }
    dst[k] = 0;
}

typedef char path_buf[192];

static const char *fpath(path_buf buf, const char *path, const char *key)
{
    if (path && path[0])
        snprintf(buf, sizeof(path_buf), "%s.%s", path, key);
    else
        snprintf(buf, sizeof(path_buf), "%s", key);
    return buf;
}

static const cJSON *field(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* Rejects members not in `allowed` (NULL-terminated, at most 32) and repeats. */
static int check_keys(const cJSON *obj, const char *path, const char *const *allowed, char *err,
                      size_t errlen)
{
    uint32_t seen = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        int k = 0;
        while (allowed[k] && (!c->string || strcmp(allowed[k], c->string))) k++;
        char what[48];
        shown(what, sizeof what, c->string ? c->string : "");
        path_buf p;
        if (!allowed[k]) return pl_errf(err, errlen, "%s: unknown field", fpath(p, path, what));
        if (seen & (1u << k))
            return pl_errf(err, errlen, "%s: duplicate field", fpath(p, path, what));
        seen |= 1u << k;
    }
    return 0;
}

static int get_int(const cJSON *obj, const char *path, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, char *err, size_t errlen)
{
    path_buf p;
    return pl_json_int(field(obj, key), fpath(p, path, key), lo, hi, out, err, errlen);
}

static int get_i32(const cJSON *obj, const char *path, const char *key, int lo, int hi, int *out,
                   char *err, size_t errlen)
{
    int64_t v;
    if (get_int(obj, path, key, lo, hi, &v, err, errlen)) return -1;
    *out = (int)v;
    return 0;
}

enum { NUM_FINITE, NUM_NONFINITE };

/* A number ≥ lo (> lo when lo_open). NUM_NONFINITE also takes "nan", "inf"
 * and, when lo is -inf, "-inf". */
static int get_num(const cJSON *obj, const char *path, const char *key, double lo, int lo_open,
                   int mode, double *out, char *err, size_t errlen)
{
    path_buf p;
    const cJSON *it = field(obj, key);
    if (!it) return pl_errf(err, errlen, "%s: missing", fpath(p, path, key));
    if (mode == NUM_NONFINITE && cJSON_IsString(it) && it->valuestring) {
        const char *s = it->valuestring;
        if (!strcmp(s, "nan")) { *out = NAN; return 0; }
        if (!strcmp(s, "inf")) { *out = INFINITY; return 0; }
        if (!strcmp(s, "-inf") && isinf(lo)) { *out = -INFINITY; return 0; }
    }
    double d = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(d) || d < lo || (lo_open && d == lo)) {
        if (mode == NUM_NONFINITE)
            return pl_errf(err, errlen, "%s: must be a number%s or \"nan\", \"inf\"%s",
                           fpath(p, path, key), isinf(lo) ? "" : lo_open ? " > 0" : " >= 0",
                           isinf(lo) ? ", \"-inf\"" : "");
        if (isinf(lo)) return pl_errf(err, errlen, "%s: must be a finite number", fpath(p, path, key));
        return pl_errf(err, errlen, "%s: must be a finite number %s %g", fpath(p, path, key),
                       lo_open ? ">" : ">=", lo);
    }
    *out = d;
    return 0;
}

static int get_bool(const cJSON *obj, const char *path, const char *key, int *out, char *err,
                    size_t errlen)
{
    path_buf p;
    const cJSON *it = field(obj, key);
    if (!it) return pl_errf(err, errlen, "%s: missing", fpath(p, path, key));
    if (!cJSON_IsBool(it)) return pl_errf(err, errlen, "%s: must be true or false", fpath(p, path, key));
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return 0;
}

enum { S_NAME, S_HOST, S_TEXT, S_PATH, S_HEX };

static int char_ok(int kind, unsigned char c)
{
    switch (kind) {
    case S_NAME:
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '-' || c == '_';
    case S_HOST:
        return char_ok(S_NAME, c) || c == ':' || c == '[' || c == ']' || c == '%';
    case S_TEXT:
        return c >= 0x20 ? c != 0x7f : (c == '\t' || c == '\n');
    case S_PATH:
        return c >= 0x20 && c != 0x7f;
    default:
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    }
}

/* Length of the well-formed UTF-8 sequence at s[0..n) (no overlong forms, no
 * surrogates, at most U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xbf;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) k = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        k = 3;
        if (s[0] == 0xe0) lo = 0xa0;
        if (s[0] == 0xed) hi = 0x9f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        k = 4;
        if (s[0] == 0xf0) lo = 0x90;
        if (s[0] == 0xf4) hi = 0x8f;
    } else
        return 0;
    if (k > n || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return k;
}

/* A string of kind with minlen..maxlen bytes, copied into buf (maxlen+1).
 * Text and paths must be well-formed UTF-8. */
static int get_str_item(const cJSON *it, const char *p, int kind, size_t minlen, size_t maxlen,
                        char *buf, char *err, size_t errlen)
{
    if (!cJSON_IsString(it) || !it->valuestring) return pl_errf(err, errlen, "%s: must be a string", p);
    const char *s = it->valuestring;
    size_t n = strnlen(s, maxlen + 1);
    if (n > maxlen) return pl_errf(err, errlen, "%s: too long (at most %zu characters)", p, maxlen);
    if (n < minlen) {
        if (minlen == 1) return pl_errf(err, errlen, "%s: must not be empty", p);
        return pl_errf(err, errlen, "%s: too short (at least %zu characters)", p, minlen);
    }
    for (size_t i = 0; i < n; i++) {
        const unsigned char *u = (const unsigned char *)s + i;
        if ((kind == S_TEXT || kind == S_PATH) && *u >= 0x80) {
            size_t k = utf8_seq(u, n - i);
            if (!k) return pl_errf(err, errlen, "%s: invalid UTF-8 at offset %zu", p, i);
            i += k - 1;
            continue;
        }
        if (!char_ok(kind, *u))
            return pl_errf(err, errlen, "%s: invalid character at offset %zu%s", p, i,
                           kind == S_HEX    ? " (hex digits only)"
                           : kind == S_NAME ? " (letters, digits, '.', '-', '_' only)"
                                            : "");
    }
    memcpy(buf, s, n);
    buf[n] = 0;
    return 0;
}

static int get_str(const cJSON *obj, const char *path, const char *key, int kind, size_t minlen,
                   size_t maxlen, char *buf, char *err, size_t errlen)
{
    path_buf p;
    fpath(p, path, key);
    const cJSON *it = field(obj, key);
    if (!it) return pl_errf(err, errlen, "%s: missing", p);
    return get_str_item(it, p, kind, minlen, maxlen, buf, err, errlen);
}

#define NAME(obj, path, key, buf) get_str(obj, path, key, S_NAME, 1, PL_PROTO_NAME_MAX, buf, err, errlen)
#define TEXT(obj, path, key, buf) get_str(obj, path, key, S_TEXT, 0, PL_PROTO_TEXT_MAX, buf, err, errlen)
#define STEP(obj, key, out) get_int(obj, "", key, 0, PL_PROTO_INT_MAX, out, err, errlen)

/* An object member that must be an object (or null when nullable: *isnull). */
static const cJSON *get_obj(const cJSON *obj, const char *path, const char *key, int nullable,
                            int *isnull, char *err, size_t errlen)
{
    path_buf p;
    const cJSON *it = field(obj, key);
    if (isnull) *isnull = 0;
    if (!it) {
        pl_errf(err, errlen, "%s: missing", fpath(p, path, key));
        return NULL;
    }
    if (nullable && cJSON_IsNull(it)) {
        *isnull = 1;
        return NULL;
    }
    if (!cJSON_IsObject(it)) {
        pl_errf(err, errlen, "%s: must be an object%s", fpath(p, path, key), nullable ? " or null" : "");
        return NULL;
    }
    return it;
}

static const cJSON *get_arr(const cJSON *obj, const char *key, int lo, int hi, int *n, char *err,
                            size_t errlen)
{
    const cJSON *it = field(obj, key);
    if (!it) {
        pl_errf(err, errlen, "%s: missing", key);
        return NULL;
    }
    if (!cJSON_IsArray(it)) {
        pl_errf(err, errlen, "%s: must be an array", key);
        return NULL;
    }
    int k = cJSON_GetArraySize(it);
    if (k < lo || k > hi) {
        pl_errf(err, errlen, "%s: must have %d to %d entries (has %d)", key, lo, hi, k);
        return NULL;
    }
    *n = k;
    return it;
}

/* --------------------------------------------------- per-type decoders */

static const char *const reg_ckpt_keys[] = {"step", "error", NULL};

/* register's optional "checkpoint": {"step", "error"}, step 0 with an error. */
static int dec_register_checkpoint(const cJSON *o, pl_msg_register *r, char *err, size_t errlen)
{
    if (!field(o, "checkpoint")) return 0;
    const cJSON *ck = get_obj(o, "", "checkpoint", 0, NULL, err, errlen);
    if (!ck) return -1;
    r->has_checkpoint = 1;
    if (check_keys(ck, "checkpoint", reg_ckpt_keys, err, errlen) ||
        get_int(ck, "checkpoint", "step", 0, PL_PROTO_INT_MAX, &r->checkpoint_step, err, errlen) ||
        TEXT(ck, "checkpoint", "error", r->checkpoint_error))
        return -1;
    if (r->checkpoint_error[0] && r->checkpoint_step)
        return pl_errf(err, errlen, "checkpoint.step: must be 0 when checkpoint.error is given");
    return 0;
}

static int dec_register(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_register *r = &m->u.reg;
    if (NAME(o, "", "job", r->job) || NAME(o, "", "name", r->name) ||
        NAME(o, "", "node", r->node) ||
        get_str(o, "", "zone", S_NAME, 0, PL_PROTO_NAME_MAX, r->zone, err, errlen) ||
        get_str(o, "", "host", S_HOST, 1, PL_PROTO_HOST_MAX, r->host, err, errlen) ||
        get_i32(o, "", "port", 1, 65535, &r->port, err, errlen) ||
        get_i32(o, "", "gpus", 0, 1024, &r->gpus, err, errlen) ||
        get_str(o, "", "device", S_NAME, 0, PL_PROTO_NAME_MAX, r->device, err, errlen) ||
        get_bool(o, "", "nccl", &r->nccl, err, errlen) ||
        get_int(o, "", "pid", 1, 2147483647, &r->pid, err, errlen) ||
        get_str(o, "", "token_proof", S_HEX, PL_PROTO_PROOF_LEN, PL_PROTO_PROOF_LEN,
                r->token_proof, err, errlen))
        return -1;
    return dec_register_checkpoint(o, r, err, errlen);
}

static int dec_step(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return STEP(o, "step", &m->u.heartbeat.step);
}

static int dec_leaving(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    const cJSON *r = field(o, "reason");
    if (!r) return pl_errf(err, errlen, "reason: missing");
    int k = PL_LEAVE_COUNT;
    if (cJSON_IsString(r) && r->valuestring)
        for (k = 0; k < PL_LEAVE_COUNT && strcmp(r->valuestring, leave_names[k]); k++) {}
    if (k == PL_LEAVE_COUNT)
        return pl_errf(err, errlen, "reason: must be \"sigterm\", \"shutdown\" or \"error\"");
    m->u.leaving.reason = k;
    return get_int(o, "", "grace_ms", 0, PL_PROTO_INT_MAX, &m->u.leaving.grace_ms, err, errlen);
}

/* "loss": a number, "nan", "inf", "-inf", or null (*has 0: a rank without the head). */
static int get_loss(const cJSON *o, int *has, double *loss, char *err, size_t errlen)
{
    const cJSON *l = field(o, "loss");
    *has = !(l && cJSON_IsNull(l));
    return *has ? get_num(o, "", "loss", -INFINITY, 0, NUM_NONFINITE, loss, err, errlen) : 0;
}

static int dec_report(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_report *r = &m->u.report;
    if (STEP(o, "step", &r->step) || get_loss(o, &r->has_loss, &r->loss, err, errlen)) return -1;
    if (get_int(o, "", "tokens", 0, PL_PROTO_INT_MAX, &r->tokens, err, errlen) ||
        get_num(o, "", "ms", 0, 0, NUM_FINITE, &r->ms, err, errlen) ||
        get_num(o, "", "grad_sumsq", 0, 0, NUM_NONFINITE, &r->grad_sumsq, err, errlen))
        return -1;
    char hex[17];
    if (get_str(o, "", "samples_digest", S_HEX, 16, 16, hex, err, errlen)) return -1;
    r->samples_digest = strtoull(hex, NULL, 16);
    return 0;
}

static int dec_peer_broken(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return NAME(o, "", "peer", m->u.peer_broken.peer) || TEXT(o, "", "reason", m->u.peer_broken.reason)
               ? -1
               : 0;
}

static int dec_copy_done(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return get_int(o, "", "bytes", 0, PL_PROTO_INT_MAX, &m->u.copy_done.bytes, err, errlen);
}

static int dec_nccl_id(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return get_str(o, "", "id", S_HEX, PL_PROTO_NCCL_ID_HEX, PL_PROTO_NCCL_ID_HEX,
                   m->u.nccl_root.id, err, errlen);
}

static int dec_step_failed(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return STEP(o, "step", &m->u.step_failed.step) ||
           TEXT(o, "", "reason", m->u.step_failed.reason);
}

static int dec_saved(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_saved *s = &m->u.saved;
    int64_t b, e;
    if (get_int(o, "", "step", 1, PL_PROTO_INT_MAX, &s->step, err, errlen) ||
        get_int(o, "", "layer_begin", 0, PL_PROTO_MAX_LAYERS - 1, &b, err, errlen) ||
        get_int(o, "", "layer_end", b + 1, PL_PROTO_MAX_LAYERS, &e, err, errlen) ||
        get_int(o, "", "bytes", 0, PL_PROTO_INT_MAX, &s->bytes, err, errlen) ||
        TEXT(o, "", "error", s->error))
        return -1;
    if (s->error[0] && s->bytes)
        return pl_errf(err, errlen, "bytes: must be 0 when error is given");
    s->layer_begin = (int)b;
    s->layer_end = (int)e;
    return 0;
}

static int dec_fatal(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return get_str(o, "", "reason", S_TEXT, 1, PL_PROTO_TEXT_MAX, m->u.fatal.reason, err, errlen);
}

static int dec_hello_resume(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_hello_resume *h = &m->u.hello_resume;
    if (get_int(o, "", "committed_step", -1, PL_PROTO_INT_MAX, &h->committed_step, err, errlen) ||
        get_num(o, "", "grad_scale", 0, 0, NUM_FINITE, &h->grad_scale, err, errlen) ||
        get_num(o, "", "lr", 0, 0, NUM_FINITE, &h->lr, err, errlen) ||
        get_int(o, "", "reduced_step", -1, PL_PROTO_INT_MAX, &h->reduced_step, err, errlen))
        return -1;
    if (h->reduced_step != -1 && h->reduced_step != h->committed_step + 1)
        return pl_errf(err, errlen, "reduced_step: must be -1 or committed_step + 1 (%lld)",
                       (long long)(h->committed_step + 1));
    return 0;
}

static int dec_checkpoint_step(const cJSON *o, int64_t *step, char *err, size_t errlen)
{
    return get_int(o, "", "step", 1, PL_PROTO_INT_MAX, step, err, errlen);
}

static int dec_complete_checkpoint(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return dec_checkpoint_step(o, &m->u.complete_checkpoint.step, err, errlen);
}

static int dec_save(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return dec_checkpoint_step(o, &m->u.save.step, err, errlen);
}

static int dec_checkpoint_done(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return dec_checkpoint_step(o, &m->u.checkpoint_done.step, err, errlen) ||
           TEXT(o, "", "error", m->u.checkpoint_done.error);
}

static int dec_profile_request(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return get_i32(o, "", "repeat", 1, PL_PROTO_PROFILE_REPEAT_MAX, &m->u.profile_request.repeat,
                   err, errlen);
}

/* "profile": the planner's profile JSON text (it must parse as one) or null. */
static int get_profile_text(const cJSON *o, char **out, char *err, size_t errlen)
{
    const cJSON *it = field(o, "profile");
    *out = NULL;
    if (!it) return pl_errf(err, errlen, "profile: missing");
    if (cJSON_IsNull(it)) return 0;
    size_t n = cJSON_IsString(it) && it->valuestring ? strlen(it->valuestring) : 0;
    char *text = malloc((n < PL_PROTO_PROFILE_MAX ? n : PL_PROTO_PROFILE_MAX) + 1);
    if (!text) return pl_errf(err, errlen, "profile: out of memory");
    if (get_str_item(it, "profile", S_TEXT, 1, PL_PROTO_PROFILE_MAX, text, err, errlen)) {
        free(text);
        return -1;
    }
    pl_profile p;
    char why[384];
    if (pl_profile_parse(text, &p, why, sizeof why)) {
        free(text);
        return pl_errf(err, errlen, "profile: not a planner profile: %s", why);
    }
    pl_profile_free(&p);
    *out = text;
    return 0;
}

static int dec_profile_done(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_profile_done *p = &m->u.profile_done;
    if (get_profile_text(o, &p->profile, err, errlen) || TEXT(o, "", "error", p->error))
        return -1;
    if (!p->profile && !p->error[0])
        return pl_errf(err, errlen, "error: must say why when profile is null");
    if (p->profile && p->error[0]) return pl_errf(err, errlen, "error: must be \"\" with a profile");
    return 0;
}

static int dec_eval(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return STEP(o, "step", &m->u.eval.step);
}

static int dec_eval_done(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_eval_done *e = &m->u.eval_done;
    return STEP(o, "step", &e->step) || get_loss(o, &e->has_loss, &e->loss, err, errlen) ||
           get_int(o, "", "batches", 0, PL_PROTO_INT_MAX, &e->batches, err, errlen);
}

static int dec_challenge(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    if (get_str(o, "", "nonce", S_HEX, PL_PROTO_NONCE_MIN, PL_PROTO_NONCE_MAX, m->u.challenge.nonce,
                err, errlen))
        return -1;
    if (strlen(m->u.challenge.nonce) % 2)
        return pl_errf(err, errlen, "nonce: must have an even number of hex digits");
    return 0;
}

static int dec_welcome(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_welcome *w = &m->u.welcome;
    return get_i32(o, "", "rank", 0, PL_PROTO_MAX_RANK, &w->rank, err, errlen) ||
                   NAME(o, "", "job", w->job) || get_bool(o, "", "token_ok", &w->token_ok, err, errlen) ||
                   get_i32(o, "", "heartbeat_ms", PL_PROTO_HEARTBEAT_MIN_MS, PL_PROTO_HEARTBEAT_MAX_MS,
                           &w->heartbeat_ms, err, errlen)
               ? -1
               : 0;
}

static int dec_commit(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_commit *c = &m->u.commit;
    return STEP(o, "step", &c->step) ||
                   get_num(o, "", "grad_scale", 0, 1, NUM_FINITE, &c->grad_scale, err, errlen) ||
                   get_num(o, "", "lr", 0, 0, NUM_FINITE, &c->lr, err, errlen) ||
                   get_bool(o, "", "save", &c->save, err, errlen)
               ? -1
               : 0;
}

static int dec_abort(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return STEP(o, "step", &m->u.abort_.step) || TEXT(o, "", "reason", m->u.abort_.reason) ? -1 : 0;
}

static int dec_stop(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return TEXT(o, "", "reason", m->u.stop.reason) ||
                   get_i32(o, "", "exit_code", 0, 255, &m->u.stop.exit_code, err, errlen)
               ? -1
               : 0;
}

static int dec_refuse(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    return TEXT(o, "", "reason", m->u.refuse.reason);
}

typedef struct {
    const char *name;
    int pipeline, node;
} node_ref;

static int node_ref_cmp(const void *a, const void *b)
{
    return strcmp(((const node_ref *)a)->name, ((const node_ref *)b)->name);
}

static const char *const pipeline_keys[] = {"nodes", "layers", "template_nodes", "microbatches",
                                            "first_microbatch", NULL};
static const char *const you_keys[] = {"pipeline", "stage", "layer_begin", "layer_end", NULL};
static const char *const peer_keys[] = {"name", "host", "port", NULL};
static const char *const copy_keys[] = {"layer", "part", "parts", "source", "bytes", NULL};
static const char *const send_keys[] = {"layer", "dest", NULL};
static const char *const ckpt_keys[] = {"dir", "step", NULL};

/* "layers": nnodes + 1 stage bounds, 0 first, increasing, ending at `last` (-1: any). */
static int dec_layer_bounds(const cJSON *pi, const char *path, pl_msg_pipeline *pp, int last,
                            char *err, size_t errlen)
{
    int n;
    const cJSON *arr = get_arr(pi, "layers", pp->nnodes + 1, pp->nnodes + 1, &n, err, errlen);
    if (!arr) {
        char why[128];
        snprintf(why, sizeof why, "%s", err);
        return pl_errf(err, errlen, "%s.%s", path, why);
    }
    if (!(pp->layers = pl_calloc((size_t)n, sizeof *pp->layers)))
        return pl_errf(err, errlen, "%s.layers: out of memory", path);
    int j = 0;
    for (const cJSON *x = arr->child; x; x = x->next, j++) {
        int lo = j ? pp->layers[j - 1] + 1 : 0, hi = j ? PL_PROTO_MAX_LAYERS : 0;
        if (pl_json_i32(x, "layers[]", lo, hi, &pp->layers[j], NULL, 0))
            return pl_errf(err, errlen, "%s.layers[%d]: must be an integer in %d..%d (0 first, "
                           "increasing)", path, j, lo, hi);
    }
    if (last >= 0 && pp->layers[n - 1] != last)
        return pl_errf(err, errlen, "%s.layers[%d]: must be %d, the model's layer count as in "
                       "pipelines[0]", path, n - 1, last);
    return 0;
}

/* pipelines[i].nodes (path: "pipelines[i]"): 1 or more worker names, with *total before
 * them in the plan, which they join. */
static int dec_pipeline_nodes(const cJSON *pi, const char *path, int i, pl_msg_pipeline *pp,
                              int *total, char *err, size_t errlen)
{
    const cJSON *nodes = field(pi, "nodes");
    if (!nodes) return pl_errf(err, errlen, "%s.nodes: missing", path);
    if (!cJSON_IsArray(nodes)) return pl_errf(err, errlen, "%s.nodes: must be an array", path);
    int k = cJSON_GetArraySize(nodes);
    if (k < 1 || k > PL_PROTO_MAX_NODES - *total)
        return pl_errf(err, errlen, "%s.nodes: must have 1 to %d entries (%d workers in all)", path,
                       PL_PROTO_MAX_NODES, PL_PROTO_MAX_NODES);
    *total += k;
    pp->nodes = pl_calloc((size_t)k, sizeof *pp->nodes);
    if (!pp->nodes) return pl_errf(err, errlen, "%s.nodes: out of memory", path);
    pp->nnodes = k;
    path_buf q;
    int j = 0;
    for (const cJSON *s = nodes->child; s; s = s->next, j++) {
        snprintf(q, sizeof q, "pipelines[%d].nodes[%d]", i, j);
        if (get_str_item(s, q, S_NAME, 1, PL_PROTO_NAME_MAX, pp->nodes[j], err, errlen)) return -1;
    }
    return 0;
}

/* pipelines[i], whose microbatches must start at *next_mb (advanced past them); *total
 * counts the workers of the plan so far. */
static int dec_pipeline(const cJSON *pi, int i, pl_msg_plan *p, int *total, int64_t *next_mb,
                        char *err, size_t errlen)
{
    pl_msg_pipeline *pp = &p->pipelines[i];
    path_buf path;
    snprintf(path, sizeof path, "pipelines[%d]", i);
    if (!cJSON_IsObject(pi)) return pl_errf(err, errlen, "%s: must be an object", path);
    if (check_keys(pi, path, pipeline_keys, err, errlen) ||
        dec_pipeline_nodes(pi, path, i, pp, total, err, errlen))
        return -1;
    if (get_i32(pi, path, "template_nodes", 1, PL_PROTO_MAX_NODES, &pp->template_nodes, err,
                errlen) ||
        get_int(pi, path, "microbatches", 1, PL_PROTO_MAX_MICROBATCHES, &pp->microbatches, err,
                errlen) ||
        get_int(pi, path, "first_microbatch", 0, PL_PROTO_INT_MAX, &pp->first_microbatch, err,
                errlen))
        return -1;
    if (pp->template_nodes != pp->nnodes)
        return pl_errf(err, errlen, "%s.template_nodes: must equal the number of nodes (%d)", path,
                       pp->nnodes);
    if (dec_layer_bounds(pi, path, pp, i ? p->pipelines[0].layers[p->pipelines[0].nnodes] : -1,
                         err, errlen))
        return -1;
    if (pp->first_microbatch != *next_mb)
        return pl_errf(err, errlen, "%s.first_microbatch: must be %lld (ranges are contiguous)", path,
                       (long long)*next_mb);
    *next_mb += pp->microbatches; /* ≤ 4096 · 2^40: no overflow */
    return 0;
}

/* Worker names are unique across the plan (total of them): a repeat names its later place,
 * then the earlier one. */
static int check_unique_nodes(const pl_msg_plan *p, int total, char *err, size_t errlen)
{
    node_ref *refs = malloc((size_t)total * sizeof *refs);
    if (!refs) return pl_errf(err, errlen, "pipelines: out of memory");
    int n = 0;
    for (int i = 0; i < p->npipelines; i++)
        for (int j = 0; j < p->pipelines[i].nnodes; j++)
            refs[n++] = (node_ref){p->pipelines[i].nodes[j], i, j};
    qsort(refs, (size_t)n, sizeof *refs, node_ref_cmp);
    int rc = 0;
    for (int i = 1; i < n && !rc; i++)
        if (!strcmp(refs[i - 1].name, refs[i].name)) {
            const node_ref *a = &refs[i - 1], *b = &refs[i];
            if (a->pipeline > b->pipeline || (a->pipeline == b->pipeline && a->node > b->node)) {
                const node_ref *t = a;
                a = b;
                b = t;
            }
            char nm[48];
            shown(nm, sizeof nm, b->name);
            rc = pl_errf(err, errlen, "pipelines[%d].nodes[%d]: \"%s\" already runs pipelines[%d].nodes[%d]",
                         b->pipeline, b->node, nm, a->pipeline, a->node);
        }
    free(refs);
    return rc;
}

static int dec_pipelines(const cJSON *o, pl_msg_plan *p, char *err, size_t errlen)
{
    int np;
    const cJSON *arr = get_arr(o, "pipelines", 1, PL_PROTO_MAX_NODES, &np, err, errlen);
    if (!arr) return -1;
    p->pipelines = pl_calloc((size_t)np, sizeof *p->pipelines);
    if (!p->pipelines) return pl_errf(err, errlen, "pipelines: out of memory");
    p->npipelines = np;
    int total = 0, i = 0;
    int64_t next_mb = 0;
    for (const cJSON *pi = arr->child; pi; pi = pi->next, i++)
        if (dec_pipeline(pi, i, p, &total, &next_mb, err, errlen)) return -1;
    if (p->global_batch % p->micro || p->global_batch / p->micro != next_mb)
        return pl_errf(err, errlen,
                       "global_batch: must equal micro × the pipelines' microbatches (%d × %lld)",
                       p->micro, (long long)next_mb);
    return check_unique_nodes(p, total, err, errlen);
}

/* "you": this worker's place in the plan, or null when it has none. */
static int dec_you(const cJSON *o, pl_msg_plan *p, char *err, size_t errlen)
{
    int isnull;
    const cJSON *you = get_obj(o, "", "you", 1, &isnull, err, errlen);
    if (!you) {
        p->you_pipeline = -1;
        return isnull ? 0 : -1;
    }
    if (check_keys(you, "you", you_keys, err, errlen) ||
        get_i32(you, "you", "pipeline", 0, p->npipelines - 1, &p->you_pipeline, err, errlen) ||
        get_i32(you, "you", "stage", 0, p->pipelines[p->you_pipeline].nnodes - 1, &p->you_stage,
                err, errlen) ||
        get_i32(you, "you", "layer_begin", 0, PL_PROTO_MAX_LAYERS - 1, &p->you_layer_begin, err,
                errlen) ||
        get_i32(you, "you", "layer_end", p->you_layer_begin + 1, PL_PROTO_MAX_LAYERS,
                &p->you_layer_end, err, errlen))
        return -1;
    const int *b = p->pipelines[p->you_pipeline].layers;
    if (p->you_layer_begin != b[p->you_stage] || p->you_layer_end != b[p->you_stage + 1])
        return pl_errf(err, errlen, "you: layers [%d, %d) differ from pipelines[%d].layers "
                       "(%d, %d) of stage %d", p->you_layer_begin, p->you_layer_end,
                       p->you_pipeline, b[p->you_stage], b[p->you_stage + 1], p->you_stage);
    return 0;
}

/* The array "key" of 0..max entries; *mem receives n zeroed entries of elem
 * bytes (NULL when there are none). */
static const cJSON *get_list(const cJSON *o, const char *key, int max, size_t elem, void **mem,
                             int *n, char *err, size_t errlen)
{
    const cJSON *arr = get_arr(o, key, 0, max, n, err, errlen);
    *mem = NULL;
    if (arr && *n && !(*mem = pl_calloc((size_t)*n, elem))) {
        pl_errf(err, errlen, "%s: out of memory", key);
        return NULL;
    }
    return arr;
}

typedef int (*dec_entry_fn)(const cJSON *e, const char *path, pl_msg_plan *p, int i, char *err,
                            size_t errlen);

/* Each entry of arr, "key[i]", an object with the given keys, decoded by entry. */
static int dec_entries(const cJSON *arr, const char *key, const char *const *keys,
                       dec_entry_fn entry, pl_msg_plan *p, char *err, size_t errlen)
{
    path_buf q;
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        snprintf(q, sizeof q, "%s[%d]", key, i);
        if (!cJSON_IsObject(e)) return pl_errf(err, errlen, "%s: must be an object", q);
        if (check_keys(e, q, keys, err, errlen) || entry(e, q, p, i, err, errlen)) return -1;
    }
    return 0;
}

/* The entries of "peers", "copies" and "sends": nonzero on error. */
static int dec_peer(const cJSON *e, const char *q, pl_msg_plan *p, int i, char *err,
                    size_t errlen)
{
    pl_msg_peer *x = &p->peers[i];
    return NAME(e, q, "name", x->name) ||
           get_str(e, q, "host", S_HOST, 1, PL_PROTO_HOST_MAX, x->host, err, errlen) ||
           get_i32(e, q, "port", 1, 65535, &x->port, err, errlen);
}

static int dec_copy(const cJSON *e, const char *q, pl_msg_plan *p, int i, char *err,
                    size_t errlen)
{
    pl_msg_copy *x = &p->copies[i];
    x->parts = 1;
    /* "part" and "parts" come together, for a layer copied in parts only */
    if ((field(e, "part") || field(e, "parts")) &&
        (get_i32(e, q, "parts", 2, PL_PROTO_MAX_PARTS, &x->parts, err, errlen) ||
         get_i32(e, q, "part", 0, x->parts - 1, &x->part, err, errlen)))
        return -1;
    return get_i32(e, q, "layer", 0, PL_PROTO_MAX_LAYERS - 1, &x->layer, err, errlen) ||
           NAME(e, q, "source", x->source) ||
           get_int(e, q, "bytes", 0, PL_PROTO_INT_MAX, &x->bytes, err, errlen);
}

static int dec_send(const cJSON *e, const char *q, pl_msg_plan *p, int i, char *err,
                    size_t errlen)
{
    pl_msg_send *x = &p->sends[i];
    return get_i32(e, q, "layer", 0, PL_PROTO_MAX_LAYERS - 1, &x->layer, err, errlen) ||
           NAME(e, q, "dest", x->dest);
}

/* "peers", "copies" and "sends". */
static int dec_plan_lists(const cJSON *o, pl_msg_plan *p, char *err, size_t errlen)
{
    void *mem;
    const cJSON *arr;
    if (!(arr = get_list(o, "peers", PL_PROTO_MAX_NODES, sizeof *p->peers, &mem, &p->npeers,
                         err, errlen)))
        return -1;
    p->peers = mem;
    if (dec_entries(arr, "peers", peer_keys, dec_peer, p, err, errlen)) return -1;
    if (!(arr = get_list(o, "copies", PL_PROTO_MAX_COPIES, sizeof *p->copies, &mem, &p->ncopies,
                         err, errlen)))
        return -1;
    p->copies = mem;
    if (dec_entries(arr, "copies", copy_keys, dec_copy, p, err, errlen)) return -1;
    if (!(arr = get_list(o, "sends", PL_PROTO_MAX_SENDS, sizeof *p->sends, &mem, &p->nsends,
                         err, errlen)))
        return -1;
    p->sends = mem;
    return dec_entries(arr, "sends", send_keys, dec_send, p, err, errlen);
}

/* "checkpoint": where to load from, or null (it must be there either way). */
static int dec_checkpoint(const cJSON *o, pl_msg_plan *p, char *err, size_t errlen)
{
    int isnull;
    const cJSON *ck = get_obj(o, "", "checkpoint", 1, &isnull, err, errlen);
    if (!ck) return isnull ? 0 : -1;
    p->has_checkpoint = 1;
    if (check_keys(ck, "checkpoint", ckpt_keys, err, errlen) ||
        get_str(ck, "checkpoint", "dir", S_PATH, 1, PL_PROTO_PATH_MAX, p->checkpoint_dir, err,
                errlen) ||
        get_int(ck, "checkpoint", "step", 0, PL_PROTO_INT_MAX, &p->checkpoint_step, err, errlen))
        return -1;
    return 0;
}

static int dec_transport(const cJSON *o, pl_msg_plan *p, char *err, size_t errlen)
{
    const cJSON *t = field(o, "transport");
    if (!t) return pl_errf(err, errlen, "transport: missing");
    for (p->transport = 0; p->transport < PL_TRANSPORT_COUNT; p->transport++)
        if (cJSON_IsString(t) && t->valuestring &&
            !strcmp(t->valuestring, transport_names[p->transport]))
            return 0;
    return pl_errf(err, errlen, "transport: must be \"tcp\" or \"nccl\"");
}

static int dec_plan(const cJSON *o, pl_msg *m, char *err, size_t errlen)
{
    pl_msg_plan *p = &m->u.plan;
    if (STEP(o, "generation", &p->generation)) return -1;
    if (p->generation != m->gen)
        return pl_errf(err, errlen, "generation: must equal gen (%lld)", (long long)m->gen);
    if (STEP(o, "step", &p->step) ||
        get_int(o, "", "global_batch", 1, PL_PROTO_INT_MAX, &p->global_batch, err, errlen) ||
        get_i32(o, "", "micro", 1, PL_PROTO_MAX_MICRO, &p->micro, err, errlen) ||
        get_i32(o, "", "seq_len", 1, PL_PROTO_MAX_SEQ_LEN, &p->seq_len, err, errlen) ||
        dec_pipelines(o, p, err, errlen) || dec_you(o, p, err, errlen) ||
        dec_plan_lists(o, p, err, errlen) || dec_checkpoint(o, p, err, errlen))
        return -1;
    if (dec_transport(o, p, err, errlen))
        return -1;
    /* optional: older coordinators send none */
    return field(o, "reserve") ? get_int(o, "", "reserve", 0, PL_PROTO_INT_MAX,
                                         &p->reserve_bytes, err, errlen)
                               : 0;
}

/* -------------------------------------------------------- the type table */

typedef int (*decode_fn)(const cJSON *, pl_msg *, char *, size_t);

#define ENV "v", "type", "gen"
static const char *const keys_register[] = {ENV, "job", "name", "node", "zone", "host", "port", "gpus", "device", "nccl", "pid", "token_proof", "checkpoint", NULL};
static const char *const keys_step[] = {ENV, "step", NULL};
static const char *const keys_leaving[] = {ENV, "reason", "grace_ms", NULL};
static const char *const keys_report[] = {ENV, "step", "loss", "tokens", "ms", "grad_sumsq", "samples_digest", NULL};
static const char *const keys_peer_broken[] = {ENV, "peer", "reason", NULL};
static const char *const keys_copy_done[] = {ENV, "bytes", NULL};
static const char *const keys_hello_resume[] = {ENV, "committed_step", "grad_scale", "lr", "reduced_step", NULL};
static const char *const keys_saved[] = {ENV, "step", "layer_begin", "layer_end", "bytes", "error", NULL};
static const char *const keys_reason[] = {ENV, "reason", NULL};
static const char *const keys_challenge[] = {ENV, "nonce", NULL};
static const char *const keys_welcome[] = {ENV, "rank", "job", "token_ok", "heartbeat_ms", NULL};
static const char *const keys_plan[] = {ENV, "generation", "step", "global_batch", "micro", "seq_len", "pipelines", "you", "peers", "copies", "sends", "checkpoint", "transport", "reserve", NULL};
static const char *const keys_nccl_id[] = {ENV, "id", NULL};
static const char *const keys_step_failed[] = {ENV, "step", "reason", NULL};
static const char *const keys_commit[] = {ENV, "step", "grad_scale", "lr", "save", NULL};
static const char *const keys_abort[] = {ENV, "step", "reason", NULL};
static const char *const keys_stop[] = {ENV, "reason", "exit_code", NULL};
static const char *const keys_checkpoint_done[] = {ENV, "step", "error", NULL};
static const char *const keys_profile_request[] = {ENV, "repeat", NULL};
static const char *const keys_profile_done[] = {ENV, "profile", "error", NULL};
static const char *const keys_eval_done[] = {ENV, "step", "loss", "batches", NULL};

static const struct {
    const char *const *keys;
    decode_fn decode;
} types[PL_MSG_COUNT] = {
    [PL_MSG_REGISTER] = {keys_register, dec_register},
    [PL_MSG_HEARTBEAT] = {keys_step, dec_step},
    [PL_MSG_LEAVING] = {keys_leaving, dec_leaving},
    [PL_MSG_REPORT] = {keys_report, dec_report},
    [PL_MSG_REDUCED] = {keys_step, dec_step},
    [PL_MSG_COMMITTED] = {keys_step, dec_step},
    [PL_MSG_PEER_BROKEN] = {keys_peer_broken, dec_peer_broken},
    [PL_MSG_COPY_DONE] = {keys_copy_done, dec_copy_done},
    [PL_MSG_HELLO_RESUME] = {keys_hello_resume, dec_hello_resume},
    [PL_MSG_SAVED] = {keys_saved, dec_saved},
    [PL_MSG_NCCL_ROOT] = {keys_nccl_id, dec_nccl_id},
    [PL_MSG_STEP_FAILED] = {keys_step_failed, dec_step_failed},
    [PL_MSG_CHALLENGE] = {keys_challenge, dec_challenge},
    [PL_MSG_WELCOME] = {keys_welcome, dec_welcome},
    [PL_MSG_PLAN] = {keys_plan, dec_plan},
    [PL_MSG_START_STEP] = {keys_step, dec_step},
    [PL_MSG_COMMIT] = {keys_commit, dec_commit},
    [PL_MSG_ABORT] = {keys_abort, dec_abort},
    [PL_MSG_STOP] = {keys_stop, dec_stop},
    [PL_MSG_REFUSE] = {keys_reason, dec_refuse},
    [PL_MSG_NCCL_INIT] = {keys_nccl_id, dec_nccl_id},
    [PL_MSG_CHECKPOINT_DONE] = {keys_checkpoint_done, dec_checkpoint_done},
    [PL_MSG_PROFILE_DONE] = {keys_profile_done, dec_profile_done},
    [PL_MSG_EVAL_DONE] = {keys_eval_done, dec_eval_done},
    [PL_MSG_COMPLETE_CHECKPOINT] = {keys_step, dec_complete_checkpoint},
    [PL_MSG_PROFILE_REQUEST] = {keys_profile_request, dec_profile_request},
    [PL_MSG_EVAL] = {keys_step, dec_eval},
    [PL_MSG_FATAL] = {keys_reason, dec_fatal},
    [PL_MSG_SAVE] = {keys_step, dec_save},
};

static int decode_root(const cJSON *root, pl_msg *out, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root)) return pl_errf(err, errlen, "message: must be a JSON object");
    int64_t version;
    if (pl_json_int(field(root, "v"), "v", -PL_PROTO_INT_MAX, PL_PROTO_INT_MAX, &version, err,
                    errlen))
        return -1;
    if (version != PL_PROTO_VERSION)
        return pl_errf(err, errlen, "v: unsupported protocol version %lld (this build speaks %d)",
                       (long long)version, PL_PROTO_VERSION);
    const cJSON *t = field(root, "type");
    if (!t) return pl_errf(err, errlen, "type: missing");
    if (!cJSON_IsString(t) || !t->valuestring) return pl_errf(err, errlen, "type: must be a string");
    int type = pl_msg_type_from_name(t->valuestring);
    if (type == PL_MSG_NONE) {
        char nm[48];
        shown(nm, sizeof nm, t->valuestring);
        return pl_errf(err, errlen, "type: unknown message type \"%s\"", nm);
    }
    out->type = type;
    if (check_keys(root, "", types[type].keys, err, errlen) ||
        get_int(root, "", "gen", 0, PL_PROTO_INT_MAX, &out->gen, err, errlen))
        return -1;
    return types[type].decode(root, out, err, errlen);
}

int pl_msg_decode(const char *text, size_t len, pl_msg *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!text) return pl_errf(err, errlen, "message: missing");
    if (len > PL_PROTO_MAX_BYTES)
        return pl_errf(err, errlen, "message: %zu bytes exceeds the limit of %u", len,
                       (unsigned)PL_PROTO_MAX_BYTES);
    if (len == 0) return pl_errf(err, errlen, "message: empty");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        return pl_errf(err, errlen, "message: not valid JSON (at byte %zu)", at);
    }
    if (end) /* only white space may follow the value */
        for (const char *c = end; c < text + len; c++)
            if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r' && !(*c == 0 && c + 1 == text + len)) {
                cJSON_Delete(root);
                return pl_errf(err, errlen, "message: unexpected data after the JSON value (at byte %zu)",
                               (size_t)(c - text));
            }
    int rc = decode_root(root, out, err, errlen);
    cJSON_Delete(root);
    if (rc) {
        pl_msg_free(out);
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------- encode */

typedef struct {
    int bad;        /* a string that does not end within its array, or no memory */
    const char *what;
} enc;

/* Numbers are written here, not by cJSON, whose printer may round to 15
 * significant digits: integers exactly, doubles in the fewest digits that
 * read back to the same value. */
static void add_raw(enc *e, cJSON *o, const char *key, const char *text)
{
    if (!cJSON_AddRawToObject(o, key, text)) e->bad = 1;
}

static void add_int(enc *e, cJSON *o, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    add_raw(e, o, key, buf);
}

static void add_num(enc *e, cJSON *o, const char *key, double v)
{
    cJSON *it;
    if (isnan(v))
        it = cJSON_AddStringToObject(o, key, "nan");
    else if (isinf(v))
        it = cJSON_AddStringToObject(o, key, v > 0 ? "inf" : "-inf");
    else {
        char buf[40];
        for (int digits = 15; digits <= 17; digits++) {
            snprintf(buf, sizeof buf, "%.*g", digits, v);
            if (strtod(buf, NULL) == v) break;
        }
        it = cJSON_AddRawToObject(o, key, buf);
    }
    if (!it) e->bad = 1;
}

static void add_str(enc *e, cJSON *o, const char *key, const char *s, size_t cap)
{
    if (strnlen(s, cap) == cap) {
        e->bad = 1;
        if (!e->what) e->what = key;
        return;
    }
    if (!cJSON_AddStringToObject(o, key, s)) e->bad = 1;
}

#define ADD_STR(e, o, key, arr) add_str(e, o, key, arr, sizeof(arr))

/* The encoders below return -1 where encoding stops (e->bad is then set). */

static int enc_stop(enc *e)
{
    e->bad = 1;
    return -1;
}

/* A new object appended to arr; NULL (e->bad) on failure. */
static cJSON *add_item(enc *e, cJSON *arr)
{
    cJSON *x = cJSON_CreateObject();
    if (!x || !cJSON_AddItemToArray(arr, x)) {
        cJSON_Delete(x);
        e->bad = 1;
        return NULL;
    }
    return x;
}

static int enc_pipeline(enc *e, cJSON *pj, const pl_msg_pipeline *pp)
{
    cJSON *nodes = cJSON_AddArrayToObject(pj, "nodes");
    if (!nodes || pp->nnodes < 0 || (pp->nnodes && !pp->nodes)) return enc_stop(e);
    for (int j = 0; j < pp->nnodes && !e->bad; j++) {
        if (strnlen(pp->nodes[j], sizeof pp->nodes[j]) == sizeof pp->nodes[j]) {
            e->what = "nodes";
            return enc_stop(e);
        }
        cJSON *s = cJSON_CreateString(pp->nodes[j]);
        if (!s || !cJSON_AddItemToArray(nodes, s)) {
            cJSON_Delete(s);
            e->bad = 1;
        }
    }
    cJSON *bounds = cJSON_AddArrayToObject(pj, "layers");
    if (!bounds || !pp->layers) return enc_stop(e);
    for (int j = 0; j <= pp->nnodes; j++)
        if (!cJSON_AddItemToArray(bounds, cJSON_CreateNumber(pp->layers[j]))) e->bad = 1;
    add_int(e, pj, "template_nodes", pp->template_nodes);
    add_int(e, pj, "microbatches", pp->microbatches);
    add_int(e, pj, "first_microbatch", pp->first_microbatch);
    return 0;
}

static int enc_pipelines(enc *e, cJSON *o, const pl_msg_plan *p)
{
    cJSON *arr = cJSON_AddArrayToObject(o, "pipelines");
    if (!arr || p->npipelines < 0 || (p->npipelines && !p->pipelines)) return enc_stop(e);
    for (int i = 0; i < p->npipelines && !e->bad; i++) {
        cJSON *pj = add_item(e, arr);
        if (!pj || enc_pipeline(e, pj, &p->pipelines[i])) return -1;
    }
    return 0;
}

/* key: a new object when present (NULL and e->bad on failure), else null. */
static cJSON *add_object_or_null(enc *e, cJSON *o, const char *key, int present)
{
    cJSON *x = present ? cJSON_AddObjectToObject(o, key) : NULL;
    if (present ? !x : !cJSON_AddNullToObject(o, key)) e->bad = 1;
    return x;
}

static int enc_you(enc *e, cJSON *o, const pl_msg_plan *p)
{
    int present = p->you_pipeline >= 0;
    cJSON *y = add_object_or_null(e, o, "you", present);
    if (!y) return present ? -1 : 0;
    add_int(e, y, "pipeline", p->you_pipeline);
    add_int(e, y, "stage", p->you_stage);
    add_int(e, y, "layer_begin", p->you_layer_begin);
    add_int(e, y, "layer_end", p->you_layer_end);
    return 0;
}

/* "peers", "copies" and "sends". */
static int enc_plan_lists(enc *e, cJSON *o, const pl_msg_plan *p)
{
    cJSON *peers = cJSON_AddArrayToObject(o, "peers");
    cJSON *copies = cJSON_AddArrayToObject(o, "copies");
    cJSON *sends = cJSON_AddArrayToObject(o, "sends");
    if (!peers || !copies || !sends || p->npeers < 0 || p->ncopies < 0 || p->nsends < 0 ||
        (p->npeers && !p->peers) || (p->ncopies && !p->copies) || (p->nsends && !p->sends))
        return enc_stop(e);
    for (int i = 0; i < p->npeers && !e->bad; i++) {
        cJSON *x = add_item(e, peers);
        if (!x) return -1;
        ADD_STR(e, x, "name", p->peers[i].name);
        ADD_STR(e, x, "host", p->peers[i].host);
        add_int(e, x, "port", p->peers[i].port);
    }
    for (int i = 0; i < p->ncopies && !e->bad; i++) {
        cJSON *x = add_item(e, copies);
        if (!x) return -1;
        add_int(e, x, "layer", p->copies[i].layer);
        if (p->copies[i].parts > 1) {
            add_int(e, x, "part", p->copies[i].part);
            add_int(e, x, "parts", p->copies[i].parts);
        }
        ADD_STR(e, x, "source", p->copies[i].source);
        add_int(e, x, "bytes", p->copies[i].bytes);
    }
    for (int i = 0; i < p->nsends && !e->bad; i++) {
        cJSON *x = add_item(e, sends);
        if (!x) return -1;
        add_int(e, x, "layer", p->sends[i].layer);
        ADD_STR(e, x, "dest", p->sends[i].dest);
    }
    return 0;
}

static int enc_checkpoint(enc *e, cJSON *o, const pl_msg_plan *p)
{
    cJSON *c = add_object_or_null(e, o, "checkpoint", p->has_checkpoint);
    if (!c) return p->has_checkpoint ? -1 : 0;
    ADD_STR(e, c, "dir", p->checkpoint_dir);
    add_int(e, c, "step", p->checkpoint_step);
    return 0;
}

static void enc_plan(enc *e, cJSON *o, const pl_msg_plan *p)
{
    add_int(e, o, "generation", p->generation);
    add_int(e, o, "step", p->step);
    add_int(e, o, "global_batch", p->global_batch);
    add_int(e, o, "micro", p->micro);
    add_int(e, o, "seq_len", p->seq_len);
    if (enc_pipelines(e, o, p) || enc_you(e, o, p) || enc_plan_lists(e, o, p) ||
        enc_checkpoint(e, o, p))
        return;
    if (p->transport < 0 || p->transport >= PL_TRANSPORT_COUNT) {
        e->bad = 1;
        return;
    }
    if (!cJSON_AddStringToObject(o, "transport", transport_names[p->transport])) e->bad = 1;
    if (p->reserve_bytes) /* 0 is the default: left out */
        add_int(e, o, "reserve", p->reserve_bytes);
}

static void enc_register(enc *e, cJSON *o, const pl_msg_register *r)
{
    ADD_STR(e, o, "job", r->job);
    ADD_STR(e, o, "name", r->name);
    ADD_STR(e, o, "node", r->node);
    ADD_STR(e, o, "zone", r->zone);
    ADD_STR(e, o, "host", r->host);
    add_int(e, o, "port", r->port);
    add_int(e, o, "gpus", r->gpus);
    ADD_STR(e, o, "device", r->device);
    if (!cJSON_AddBoolToObject(o, "nccl", r->nccl != 0)) e->bad = 1;
    add_int(e, o, "pid", r->pid);
    ADD_STR(e, o, "token_proof", r->token_proof);
    if (!r->has_checkpoint) return;
    cJSON *c = cJSON_AddObjectToObject(o, "checkpoint");
    if (!c) {
        e->bad = 1;
        return;
    }
    add_int(e, c, "step", r->checkpoint_step);
    ADD_STR(e, c, "error", r->checkpoint_error);
}

static void enc_leaving(enc *e, cJSON *o, const pl_msg_leaving *l)
{
    if (l->reason < 0 || l->reason >= PL_LEAVE_COUNT) {
        e->bad = 1;
        e->what = "reason";
        return;
    }
    if (!cJSON_AddStringToObject(o, "reason", leave_names[l->reason])) e->bad = 1;
    add_int(e, o, "grace_ms", l->grace_ms);
}

/* "loss": the number, or null without one. */
static void add_loss(enc *e, cJSON *o, int has_loss, double loss)
{
    if (has_loss) add_num(e, o, "loss", loss);
    else if (!cJSON_AddNullToObject(o, "loss")) e->bad = 1;
}

static void enc_report(enc *e, cJSON *o, const pl_msg_report *r)
{
    char hex[17];
    add_int(e, o, "step", r->step);
    add_loss(e, o, r->has_loss, r->loss);
    add_int(e, o, "tokens", r->tokens);
    add_num(e, o, "ms", r->ms);
    add_num(e, o, "grad_sumsq", r->grad_sumsq);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r->samples_digest);
    ADD_STR(e, o, "samples_digest", hex);
}

static void enc_profile_done(enc *e, cJSON *o, const pl_msg_profile_done *p)
{
    if (!p->profile) {
        if (!cJSON_AddNullToObject(o, "profile")) e->bad = 1;
    } else if (strnlen(p->profile, PL_PROTO_PROFILE_MAX + 1) > PL_PROTO_PROFILE_MAX) {
        e->bad = 1;
        e->what = "profile";
    } else if (!cJSON_AddStringToObject(o, "profile", p->profile)) {
        e->bad = 1;
    }
    ADD_STR(e, o, "error", p->error);
}

/* The types added with the workers' duties (checkpoint completion and saving again,
 * profiling, evaluation) and a worker's fatal error. */
static void enc_duty(enc *e, cJSON *o, const pl_msg *m)
{
    switch (m->type) {
    case PL_MSG_COMPLETE_CHECKPOINT: /* each is {step} */
    case PL_MSG_EVAL:
    case PL_MSG_SAVE:
        add_int(e, o, "step", m->type == PL_MSG_EVAL   ? m->u.eval.step
                              : m->type == PL_MSG_SAVE ? m->u.save.step
                                                       : m->u.complete_checkpoint.step);
        break;
    case PL_MSG_FATAL:
        ADD_STR(e, o, "reason", m->u.fatal.reason);
        break;
    case PL_MSG_CHECKPOINT_DONE:
        add_int(e, o, "step", m->u.checkpoint_done.step);
        ADD_STR(e, o, "error", m->u.checkpoint_done.error);
        break;
    case PL_MSG_PROFILE_REQUEST:
        add_int(e, o, "repeat", m->u.profile_request.repeat);
        break;
    case PL_MSG_PROFILE_DONE:
        enc_profile_done(e, o, &m->u.profile_done);
        break;
    case PL_MSG_EVAL_DONE:
        add_int(e, o, "step", m->u.eval_done.step);
        add_loss(e, o, m->u.eval_done.has_loss, m->u.eval_done.loss);
        add_int(e, o, "batches", m->u.eval_done.batches);
        break;
    default:
        e->bad = 1;
    }
}

static void enc_hello_resume(enc *e, cJSON *o, const pl_msg_hello_resume *h)
{
    add_int(e, o, "committed_step", h->committed_step);
    add_num(e, o, "grad_scale", h->grad_scale);
    add_num(e, o, "lr", h->lr);
    add_int(e, o, "reduced_step", h->reduced_step);
}

/* The messages a worker sends (enc_duty has those of its duties). */
static void enc_from_worker(enc *e, cJSON *o, const pl_msg *m)
{
    switch (m->type) {
    case PL_MSG_REGISTER:
        enc_register(e, o, &m->u.reg);
        break;
    case PL_MSG_HEARTBEAT:
    case PL_MSG_REDUCED:
    case PL_MSG_COMMITTED:
        add_int(e, o, "step", m->u.heartbeat.step);
        break;
    case PL_MSG_LEAVING:
        enc_leaving(e, o, &m->u.leaving);
        break;
    case PL_MSG_REPORT:
        enc_report(e, o, &m->u.report);
        break;
    case PL_MSG_PEER_BROKEN:
        ADD_STR(e, o, "peer", m->u.peer_broken.peer);
        ADD_STR(e, o, "reason", m->u.peer_broken.reason);
        break;
    case PL_MSG_COPY_DONE:
        add_int(e, o, "bytes", m->u.copy_done.bytes);
        break;
    case PL_MSG_HELLO_RESUME:
        enc_hello_resume(e, o, &m->u.hello_resume);
        break;
    case PL_MSG_SAVED:
        add_int(e, o, "step", m->u.saved.step);
        add_int(e, o, "layer_begin", m->u.saved.layer_begin);
        add_int(e, o, "layer_end", m->u.saved.layer_end);
        add_int(e, o, "bytes", m->u.saved.bytes);
        ADD_STR(e, o, "error", m->u.saved.error);
        break;
    case PL_MSG_NCCL_ROOT:
        ADD_STR(e, o, "id", m->u.nccl_root.id);
        break;
    case PL_MSG_STEP_FAILED:
        add_int(e, o, "step", m->u.step_failed.step);
        ADD_STR(e, o, "reason", m->u.step_failed.reason);
        break;
    default:
        enc_duty(e, o, m);
    }
}

/* The messages the coordinator sends (enc_duty has those of the workers' duties). */
static void enc_from_coordinator(enc *e, cJSON *o, const pl_msg *m)
{
    switch (m->type) {
    case PL_MSG_CHALLENGE:
        ADD_STR(e, o, "nonce", m->u.challenge.nonce);
        break;
    case PL_MSG_WELCOME:
        add_int(e, o, "rank", m->u.welcome.rank);
        ADD_STR(e, o, "job", m->u.welcome.job);
        if (!cJSON_AddBoolToObject(o, "token_ok", m->u.welcome.token_ok != 0)) e->bad = 1;
        add_int(e, o, "heartbeat_ms", m->u.welcome.heartbeat_ms);
        break;
    case PL_MSG_PLAN:
        enc_plan(e, o, &m->u.plan);
        break;
    case PL_MSG_START_STEP:
        add_int(e, o, "step", m->u.start_step.step);
        break;
    case PL_MSG_COMMIT:
        add_int(e, o, "step", m->u.commit.step);
        add_num(e, o, "grad_scale", m->u.commit.grad_scale);
        add_num(e, o, "lr", m->u.commit.lr);
        if (!cJSON_AddBoolToObject(o, "save", m->u.commit.save != 0)) e->bad = 1;
        break;
    case PL_MSG_ABORT:
        add_int(e, o, "step", m->u.abort_.step);
        ADD_STR(e, o, "reason", m->u.abort_.reason);
        break;
    case PL_MSG_STOP:
        ADD_STR(e, o, "reason", m->u.stop.reason);
        add_int(e, o, "exit_code", m->u.stop.exit_code);
        break;
    case PL_MSG_REFUSE:
        ADD_STR(e, o, "reason", m->u.refuse.reason);
        break;
    case PL_MSG_NCCL_INIT:
        ADD_STR(e, o, "id", m->u.nccl_init.id);
        break;
    default:
        enc_duty(e, o, m);
    }
}

/* The fields after the envelope; m->type is a known type. */
static void enc_body(enc *e, cJSON *o, const pl_msg *m)
{
    if (pl_msg_from_worker(m->type) == 1)
        enc_from_worker(e, o, m);
    else
        enc_from_coordinator(e, o, m);
}

char *pl_msg_encode_err(const pl_msg *m, char *err, size_t errlen)
{
    if (!m || m->type <= PL_MSG_NONE || m->type >= PL_MSG_COUNT) {
        pl_errf(err, errlen, "type: unknown message type %d", m ? m->type : -1);
        return NULL;
    }
    enc e = {0, NULL};
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        pl_errf(err, errlen, "message: out of memory");
        return NULL;
    }
    add_int(&e, o, "v", PL_PROTO_VERSION);
    if (!cJSON_AddStringToObject(o, "type", type_names[m->type])) e.bad = 1;
    add_int(&e, o, "gen", m->gen);
    enc_body(&e, o, m);
    char *text = e.bad ? NULL : cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) {
        if (e.what)
            pl_errf(err, errlen, "%s: string not terminated within its buffer", e.what);
        else
            pl_errf(err, errlen, "message: out of memory or bad array");
        return NULL;
    }
    /* Only ever send what a peer accepts. */
    pl_msg check;
    if (pl_msg_decode(text, strlen(text), &check, err, errlen)) {
        free(text);
        return NULL;
    }
    pl_msg_free(&check);
    return text;
}

char *pl_msg_encode(const pl_msg *m)
{
    return pl_msg_encode_err(m, NULL, 0);
}
