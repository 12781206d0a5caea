/* NCCL transport of the GPU worker: see nccl_comm.h and docs/nccl.md.
 *
 * Locking. n->mu guards every field and every NCCL call on an attached
 * communicator: NCCL communicators are not thread-safe, and ncclCommAbort must
 * not run while another thread is inside a call on the same communicator. All
 * communicators are non-blocking, so no call holds the lock for long; the loops
 * that wait for NCCL (settle, pl_nccl_wait) take the lock once per poll.
 * pl_nccl_abort / pl_nccl_revoke mark the module failed and DETACH the
 * communicators under the lock, then revoke and abort them outside it: a
 * thread polling sees `failed` at its next poll and returns, and nothing else
 * touches a detached communicator. n->aborting counts aborts still running, so
 * that destroy and shrink never free what they still use. */
#include "nccl_comm.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 0)
#error "nccl_comm.c needs NCCL >= 2.28 (ncclCommShrink, ncclCommRevoke)"
#endif

#define WHY_LEN 320
#define CLOSE_MS 10000    /* destroy: longest wait for a clean finalize */
#define REVOKE_MS 1000    /* abort: longest wait for revokes before aborting */

/* One member set of prepare_groups and its communicator. */
typedef struct {
    int n;
    int *ranks;        /* ascending world ranks */
    ncclComm_t comm;   /* NULL for a single rank, the world's set, or not (yet) split */
} nset;

struct pl_nccl {
    pthread_mutex_t mu;
    pthread_cond_t quiet;   /* signalled when aborting falls to 0 */
    int aborting;           /* pl_nccl_abort / revoke calls still running */
    int device, rank, nranks;
    ncclComm_t world;       /* NULL once aborted */
    int world_revoked;
    cudaStream_t stream;
    nset *sets;
    int nsets;
    /* NCCL's asynchronous split / shrink job writes the new communicator here
     * when it finishes: it must outlive the call that started it. */
    ncclComm_t split_slot;
    /* pl_nccl_create_cancel's test, polled by settle (the waiting thread only) */
    pl_nccl_cancel_fn cancel;
    void *cancel_ctx;
    int failed;
    char why[WHY_LEN];
};

/* ---- time and polling ---- */

/* Between polls: yield for the first ~100 polls (fast collectives), then sleep
 * 100 µs, so a long wait costs no CPU the compute thread could use. */
static void backoff(int *polls)
{
    if ((*polls)++ < 100) {
        sched_yield();
    } else {
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
}

static double deadline_of(int timeout_ms) { return timeout_ms < 0 ? -1.0 : pl_now_ms() + timeout_ms; }
static int passed(double deadline) { return deadline >= 0 && pl_now_ms() >= deadline; }

/* ---- errors ---- */

/* "what: NCCL's text (NCCL's last message)": the last message is process-wide
 * and may belong to an earlier error, so it comes second. */
static int nccl_errf(char *err, size_t errlen, const char *what, ncclResult_t r)
{
    const char *last = ncclGetLastError(NULL);
    if (last && *last)
        return pl_errf(err, errlen, "%s: %s (last NCCL message: %s)", what, ncclGetErrorString(r),
                       last);
    return pl_errf(err, errlen, "%s: %s", what, ncclGetErrorString(r));
}

static int cuda_errf(char *err, size_t errlen, const char *what, cudaError_t e)
{
    return pl_errf(err, errlen, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* With n->mu held: the first failure's reason stays. */
static void set_failed(pl_nccl *n, const char *why)
{
    if (!n->failed) {
        n->failed = 1;
        snprintf(n->why, sizeof n->why, "%s", why);
    }
}

/* With n->mu held: records err (already formatted) as the failure; returns −1. */
static int fail_locked(pl_nccl *n, const char *err)
{
    set_failed(n, err && *err ? err : "unknown error");
    return -1;
}

static int fail(pl_nccl *n, const char *err)
{
    pthread_mutex_lock(&n->mu);
    fail_locked(n, err);
    pthread_mutex_unlock(&n->mu);
    return -1;
}

/* Public calls record their error as the module's failure reason: give them a
 * buffer of their own when the caller passes none. */
#define NEED_ERRBUF(err, errlen)                                                  \
    char errbuf_[WHY_LEN];                                                        \
    if (!(err) || (errlen) == 0) {                                                \
        (err) = errbuf_;                                                          \
        (errlen) = sizeof errbuf_;                                                \
    }

/* With n->mu held: −1 with "nccl: failed: why" once failed. */
static int check_sound(pl_nccl *n, char *err, size_t errlen)
{
    if (n->failed) return pl_errf(err, errlen, "nccl: failed earlier: %s", n->why);
    return 0;
}

/* ---- communicator state ---- */

/* 1 settled, 0 still in progress, −1 with err (an NCCL error). */
static int comm_state(ncclComm_t c, const char *what, char *err, size_t errlen)
{
    ncclResult_t st = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c, &st);
    if (r != ncclSuccess) return nccl_errf(err, errlen, what, r);
    if (st == ncclInProgress) return 0;
    if (st != ncclSuccess) return nccl_errf(err, errlen, what, st);
    return 1;
}

/* Polls communicator c of n until its pending non-blocking call (init, split,
 * group end) is done. c stays attached while n is sound (abort detaches only
 * after marking n failed, under the lock). Any error or the deadline marks the
 * module failed. 0, or −1 with err. */
static int settle(pl_nccl *n, ncclComm_t c, double deadline, int timeout_ms, const char *what,
                  char *err, size_t errlen)
{
    for (int polls = 0;;) {
        pthread_mutex_lock(&n->mu);
        if (n->failed) {
            pl_errf(err, errlen, "%s: stopped: %s", what, n->why);
            pthread_mutex_unlock(&n->mu);
            return -1;
        }
        int r = comm_state(c, what, err, errlen);
        if (r < 0) {
            fail_locked(n, err);
            pthread_mutex_unlock(&n->mu);
            return -1;
        }
        pthread_mutex_unlock(&n->mu);
        if (r == 1) return 0;
        if (passed(deadline)) {
            pl_errf(err, errlen, "timeout: %s not done after %d ms (a peer missing or dead?)",
                    what, timeout_ms);
            return fail(n, err);
        }
        /* the caller gave up (a newer plan): the failed module is aborted by its
         * destroy, or by pl_nccl_abort */
        if (n->cancel && n->cancel(n->cancel_ctx)) {
            pl_errf(err, errlen, "%s: cancelled by the caller", what);
            return fail(n, err);
        }
        backoff(&polls);
    }
}

static ncclConfig_t comm_config(const char *name)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;          /* every call returns at once: we poll with deadlines */
    cfg.commName = name;       /* shows in NCCL_DEBUG=INFO logs */
    return cfg;
}

/* Ends a detached communicator: finalize (flushes its work) then destroy when it
 * is sound and settles before deadline, else abort (never blocks on a peer). */
static void close_comm(ncclComm_t c, int sound, double deadline)
{
    if (!c) return;
    if (sound) {
        ncclResult_t r = ncclCommFinalize(c);
        if (r == ncclSuccess || r == ncclInProgress) {
            int polls = 0, st;
            char ignored[8];
            while ((st = comm_state(c, "finalize", ignored, sizeof ignored)) == 0 && !passed(deadline))
                backoff(&polls);
            if (st == 1 && ncclCommDestroy(c) == ncclSuccess) return;
        }
    }
    ncclCommAbort(c);
}

/* Revokes (stops in-flight operations) then aborts detached communicators. */
static void abort_comms(ncclComm_t *cs, const int *revoked, int nc)
{
    int pending = 0;
    for (int i = 0; i < nc; i++) {
        if (!cs[i] || revoked[i]) continue;
        ncclResult_t r = ncclCommRevoke(cs[i], NCCL_REVOKE_DEFAULT);
        if (r == ncclInProgress) pending = 1;
    }
    /* Give the revokes a moment to quiesce; ncclCommAbort stops whatever is left. */
    double deadline = pl_now_ms() + REVOKE_MS;
    for (int polls = 0; pending && !passed(deadline); backoff(&polls)) {
        pending = 0;
        for (int i = 0; i < nc; i++) {
            char ignored[8];
            if (cs[i] && comm_state(cs[i], "revoke", ignored, sizeof ignored) == 0) pending = 1;
        }
    }
    for (int i = 0; i < nc; i++)
        if (cs[i]) ncclCommAbort(cs[i]);
}

/* With n->mu held: waits until no pl_nccl_abort / revoke is running. */
static void wait_quiet_locked(pl_nccl *n)
{
    while (n->aborting > 0) pthread_cond_wait(&n->quiet, &n->mu);
}

/* ---- id ---- */

static int id_encode(const ncclUniqueId *id, char *out, size_t outlen, char *err, size_t errlen)
{
    static const char hex[] = "0123456789abcdef";
    if (!out || outlen < PL_NCCL_ID_TEXT_LEN)
        return pl_errf(err, errlen, "nccl id: output buffer needs %d bytes", PL_NCCL_ID_TEXT_LEN);
    const unsigned char *b = (const unsigned char *)id->internal;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * NCCL_UNIQUE_ID_BYTES] = '\0';
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int id_decode(const char *text, ncclUniqueId *id, char *err, size_t errlen)
{
    if (!text || strlen(text) != 2 * NCCL_UNIQUE_ID_BYTES)
        return pl_errf(err, errlen, "nccl id: expected %d hex digits", 2 * NCCL_UNIQUE_ID_BYTES);
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        int hi = hexval(text[2 * i]), lo = hexval(text[2 * i + 1]);
        if (hi < 0 || lo < 0) return pl_errf(err, errlen, "nccl id: not hex at %d", 2 * i);
        id->internal[i] = (char)(hi << 4 | lo);
    }
    return 0;
}

/* ---- version, devices, id ---- */

static char version_text[96];
static pthread_once_t version_once = PTHREAD_ONCE_INIT;

static void version_init(void)
{
    int v = 0, rt = 0;
    if (ncclGetVersion(&v) != ncclSuccess) v = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    /* codes since 2.9: major·10000 + minor·100 + patch */
    snprintf(version_text, sizeof version_text, "NCCL %d.%d.%d (headers %d.%d.%d), CUDA runtime %d.%d",
             v / 10000, v / 100 % 100, v % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, rt / 1000,
             rt % 1000 / 10);
}

const char *pl_nccl_version(void)
{
    pthread_once(&version_once, version_init);
    return version_text;
}

int pl_nccl_device_count(char *err, size_t errlen)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        pl_errf(err, errlen, "no CUDA device (%s)",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount gave 0");
        cudaGetLastError(); /* not sticky: clear it */
        return -1;
    }
    return count;
}

int pl_nccl_make_id(char *out, size_t outlen, char *err, size_t errlen)
{
    /* check first: every id starts a bootstrap root (a listening thread) */
    if (!out || outlen < PL_NCCL_ID_TEXT_LEN)
        return pl_errf(err, errlen, "nccl id: output buffer needs %d bytes", PL_NCCL_ID_TEXT_LEN);
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_errf(err, errlen, "ncclGetUniqueId", r);
    return id_encode(&id, out, outlen, err, errlen);
}

/* ---- module ---- */

static pl_nccl *module_new(int device, int rank, int nranks, char *err, size_t errlen)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        cuda_errf(err, errlen, "cudaSetDevice", e);
        return NULL;
    }
    pl_nccl *n = calloc(1, sizeof *n);
    if (!n) {
        pl_errf(err, errlen, "nccl: out of memory");
        return NULL;
    }
    n->device = device;
    n->rank = rank;
    n->nranks = nranks;
    if (pthread_mutex_init(&n->mu, NULL) != 0 || pthread_cond_init(&n->quiet, NULL) != 0) {
        /* glibc never fails these without attributes */
        free(n);
        pl_errf(err, errlen, "nccl: pthread_mutex_init failed");
        return NULL;
    }
    /* Non-blocking: no implicit sync with the legacy default stream, so
     * communication overlaps compute on any other stream. */
    e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        pthread_cond_destroy(&n->quiet);
        pthread_mutex_destroy(&n->mu);
        free(n);
        cuda_errf(err, errlen, "cudaStreamCreateWithFlags", e);
        return NULL;
    }
    return n;
}

static void free_sets(nset *s, int ns)
{
    for (int i = 0; i < ns; i++) free(s[i].ranks);
    free(s);
}

int pl_nccl_create(const char *id_text, int nranks, int rank, int cuda_device, int timeout_ms,
                   pl_nccl **out, char *err, size_t errlen)
{
    return pl_nccl_create_cancel(id_text, nranks, rank, cuda_device, timeout_ms, NULL, NULL, out,
                                 err, errlen);
}

int pl_nccl_create_cancel(const char *id_text, int nranks, int rank, int cuda_device,
                          int timeout_ms, pl_nccl_cancel_fn cancel, void *cancel_ctx,
                          pl_nccl **out, char *err, size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    if (out) *out = NULL;
    if (!out || nranks < 1 || rank < 0 || rank >= nranks || cuda_device < 0 || timeout_ms <= 0)
        return pl_errf(err, errlen, "pl_nccl_create: bad arguments (rank %d of %d, device %d, "
                                    "timeout %d ms)", rank, nranks, cuda_device, timeout_ms);
    ncclUniqueId id;
    if (id_decode(id_text, &id, err, errlen) < 0) return -1;
    double deadline = deadline_of(timeout_ms);
    pl_nccl *n = module_new(cuda_device, rank, nranks, err, errlen);
    if (!n) return -1;
    n->cancel = cancel;
    n->cancel_ctx = cancel_ctx;
    ncclConfig_t cfg = comm_config("pliant-world");
    /* With blocking = 0 this returns at once (ncclInProgress) and n->world is
     * set; the bootstrap with the other ranks runs in an NCCL thread. */
    ncclResult_t r = ncclCommInitRankConfig(&n->world, nranks, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_errf(err, errlen, "ncclCommInitRankConfig", r);
        fail(n, err);
        pl_nccl_destroy(n);
        return -1;
    }
    char what[96];
    snprintf(what, sizeof what, "ncclCommInitRankConfig (rank %d of %d)", rank, nranks);
    if (settle(n, n->world, deadline, timeout_ms, what, err, errlen) < 0) {
        pl_nccl_destroy(n); /* failed: aborts the half-made communicator */
        return -1;
    }
    *out = n;
    return 0;
}

int pl_nccl_rank(const pl_nccl *n) { return n->rank; }
int pl_nccl_nranks(const pl_nccl *n) { return n->nranks; }
int pl_nccl_device(const pl_nccl *n) { return n->device; }
void *pl_nccl_stream(pl_nccl *n) { return (void *)n->stream; }

int pl_nccl_wait_event(pl_nccl *n, void *event, char *err, size_t errlen)
{
    if (!event) return pl_errf(err, errlen, "pl_nccl_wait_event: no event");
    cudaError_t e = cudaStreamWaitEvent(n->stream, (cudaEvent_t)event, 0);
    if (e != cudaSuccess) return cuda_errf(err, errlen, "cudaStreamWaitEvent", e);
    return 0;
}

int pl_nccl_record_event(pl_nccl *n, void *event, char *err, size_t errlen)
{
    if (!event) return pl_errf(err, errlen, "pl_nccl_record_event: no event");
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, n->stream);
    if (e != cudaSuccess) return cuda_errf(err, errlen, "cudaEventRecord", e);
    return 0;
}

/* ---- groups ---- */

static int same_ranks(const int *a, int na, const int *b, int nb)
{
    return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

static int contains(const int *ranks, int nr, int r)
{
    for (int i = 0; i < nr; i++)
        if (ranks[i] == r) return 1;
    return 0;
}

/* Whether a set needs a communicator of its own. */
static int needs_split(const pl_nccl *n, const nset *s) { return s->n > 1 && s->n < n->nranks; }

static int check_set(const pl_nccl *n, const int *ranks, int size, int i, char *err, size_t errlen)
{
    if (!ranks || size < 1 || size > n->nranks)
        return pl_errf(err, errlen, "sets[%d]: size %d not in 1..%d", i, size, n->nranks);
    for (int k = 0; k < size; k++) {
        if (ranks[k] < 0 || ranks[k] >= n->nranks)
            return pl_errf(err, errlen, "sets[%d]: rank %d not in 0..%d", i, ranks[k], n->nranks - 1);
        if (k > 0 && ranks[k] <= ranks[k - 1])
            return pl_errf(err, errlen, "sets[%d]: ranks not ascending", i);
    }
    return 0;
}

int pl_nccl_split_rounds(const int *const *sets, const int *sizes, int nsets, int nranks,
                         int *round)
{
    int *used = calloc(nranks > 0 ? (size_t)nranks : 1, sizeof *used); /* round + 1 of a rank's last set */
    if (!used) return -1;
    int left = 0;
    for (int i = 0; i < nsets; i++) {
        round[i] = sizes[i] > 1 && sizes[i] < nranks ? -2 : -1; /* -2: not placed yet */
        left += round[i] == -2;
    }
    int nrounds = 0;
    for (; left > 0; nrounds++) {
        for (int i = 0; i < nsets; i++) {
            if (round[i] != -2) continue;
            int clash = 0;
            for (int k = 0; k < sizes[i] && !clash; k++) clash = used[sets[i][k]] == nrounds + 1;
            if (clash) continue;
            for (int k = 0; k < sizes[i]; k++) used[sets[i][k]] = nrounds + 1;
            round[i] = nrounds;
            left--;
        }
    }
    free(used);
    return nrounds;
}

/* The sets as given, each with a copy of its ranks; NULL when out of memory. */
static nset *copy_sets(const int *const *sets, const int *sizes, int nsets)
{
    nset *ns = calloc(nsets > 0 ? (size_t)nsets : 1, sizeof *ns);
    if (!ns) return NULL;
    for (int i = 0; i < nsets; i++) {
        ns[i].n = sizes[i];
        ns[i].ranks = malloc((size_t)sizes[i] * sizeof(int));
        if (!ns[i].ranks) {
            free_sets(ns, nsets);
            return NULL;
        }
        memcpy(ns[i].ranks, sets[i], (size_t)sizes[i] * sizeof(int));
    }
    return ns;
}

/* With n->mu held: moves the communicator of every old set that ns lists again
 * into ns (kept[i] = 1). Whether a set is kept must be decided from the LISTS
 * only, never from which communicators this rank holds: a rank outside a set
 * never had its communicator, and deciding from that it must be split again
 * would make it call ncclCommSplit for a round that the members skip (a hang).
 * Each old set is claimed once, so a set listed twice is kept once and split
 * once. −1 when out of memory. */
static int keep_split_sets_locked(pl_nccl *n, nset *ns, int nsets, char *kept)
{
    char *claimed = calloc(n->nsets > 0 ? (size_t)n->nsets : 1, 1);
    if (!claimed) return -1;
    for (int i = 0; i < nsets; i++) {
        if (!needs_split(n, &ns[i])) continue;
        for (int j = 0; j < n->nsets; j++) {
            nset *o = &n->sets[j];
            if (!claimed[j] && needs_split(n, o) &&
                same_ranks(o->ranks, o->n, ns[i].ranks, ns[i].n)) {
                claimed[j] = 1;
                kept[i] = 1;
                ns[i].comm = o->comm; /* NULL on a rank outside the set */
                o->comm = NULL;
                break;
            }
        }
    }
    free(claimed);
    return 0;
}

/* Installs the new sets: keeps the communicators of sets already split (every
 * rank has the same old and new lists, so all keep the same ones) and closes
 * the others. 0 (n owns ns), or −1 with err (ns not installed). */
static int install_sets(pl_nccl *n, nset *ns, int nsets, char *kept, char *err, size_t errlen)
{
    pthread_mutex_lock(&n->mu);
    if (check_sound(n, err, errlen) < 0) {
        pthread_mutex_unlock(&n->mu);
        return -1;
    }
    if (keep_split_sets_locked(n, ns, nsets, kept) < 0) {
        pthread_mutex_unlock(&n->mu);
        return pl_errf(err, errlen, "pl_nccl_prepare_groups: out of memory");
    }
    nset *old = n->sets;
    int nold = n->nsets;
    n->sets = ns;
    n->nsets = nsets;
    pthread_mutex_unlock(&n->mu);
    for (int j = 0; j < nold; j++) close_comm(old[j].comm, 1, deadline_of(CLOSE_MS));
    free_sets(old, nold);
    return 0;
}

/* This rank's color in round rd: the index of its set among the round's sets
 * still to split (also *mine), else NCCL_SPLIT_NOCOLOR (*mine −1). 0 when the
 * round has no set to split: every rank skips it alike. */
static int round_color(const pl_nccl *n, const nset *ns, int nsets, const int *round,
                       const char *kept, int rd, int *color, int *mine)
{
    int any = 0;
    *color = NCCL_SPLIT_NOCOLOR;
    *mine = -1;
    for (int i = 0; i < nsets; i++) {
        if (round[i] != rd || kept[i]) continue;
        any = 1;
        if (contains(ns[i].ranks, ns[i].n, n->rank)) *color = *mine = i;
    }
    return any;
}

/* Starts the split of the world with color; *world: the parent whose state
 * says when the child exists. */
static int start_split(pl_nccl *n, int color, ncclConfig_t *cfg, ncclComm_t *world, char *err,
                       size_t errlen)
{
    pthread_mutex_lock(&n->mu);
    if (check_sound(n, err, errlen) < 0) {
        pthread_mutex_unlock(&n->mu);
        return -1;
    }
    cudaSetDevice(n->device);
    n->split_slot = NULL;
    /* key = world rank: members keep the world's order in the new communicator */
    ncclResult_t r = ncclCommSplit(n->world, color, n->rank, &n->split_slot, cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_errf(err, errlen, "ncclCommSplit", r);
        int rc = fail_locked(n, err);
        pthread_mutex_unlock(&n->mu);
        return rc;
    }
    *world = n->world;
    pthread_mutex_unlock(&n->mu);
    return 0;
}

/* Takes the finished split's communicator into set mine (−1: this rank had no
 * color and must get none). *child: the communicator to settle, or NULL. */
static int adopt_child(pl_nccl *n, nset *ns, int mine, ncclComm_t *child, char *err,
                       size_t errlen)
{
    *child = NULL;
    pthread_mutex_lock(&n->mu);
    ncclComm_t c = n->split_slot;
    n->split_slot = NULL;
    if (n->failed) {
        /* aborted meanwhile: the abort did not see this child */
        pl_errf(err, errlen, "ncclCommSplit: stopped: %s", n->why);
        pthread_mutex_unlock(&n->mu);
        if (c) ncclCommAbort(c);
        return -1;
    }
    int rc = 0;
    if (mine >= 0 && !c) {
        pl_errf(err, errlen, "ncclCommSplit: no communicator for set %d", mine);
        rc = fail_locked(n, err);
    } else if (mine < 0 && c) {
        pl_errf(err, errlen, "ncclCommSplit: unexpected communicator (no color)");
        rc = fail_locked(n, err);
        ncclCommAbort(c);
    } else if (c) {
        ns[mine].comm = c; /* from now on abort and destroy see it */
    }
    pthread_mutex_unlock(&n->mu);
    if (rc == 0) *child = c;
    return rc;
}

/* One round's ncclCommSplit, waited for on the parent and then on the child. */
static int split_round(pl_nccl *n, nset *ns, int color, int mine, ncclConfig_t *cfg,
                       double deadline, int timeout_ms, char *err, size_t errlen)
{
    ncclComm_t world = NULL, child = NULL;
    if (start_split(n, color, cfg, &world, err, errlen) < 0 ||
        settle(n, world, deadline, timeout_ms, "ncclCommSplit", err, errlen) < 0 ||
        adopt_child(n, ns, mine, &child, err, errlen) < 0)
        return -1;
    if (child && settle(n, child, deadline, timeout_ms, "ncclCommSplit (child)", err, errlen) < 0)
        return -1;
    return 0;
}

int pl_nccl_prepare_groups(pl_nccl *n, const int *const *sets, const int *sizes, int nsets,
                           int timeout_ms, char *err, size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    if (nsets < 0 || (nsets > 0 && (!sets || !sizes)) || timeout_ms == 0)
        return pl_errf(err, errlen, "pl_nccl_prepare_groups: bad arguments");
    for (int i = 0; i < nsets; i++)
        if (check_set(n, sets[i], sizes[i], i, err, errlen) < 0) return -1;
    double deadline = deadline_of(timeout_ms);
    cudaSetDevice(n->device);

    nset *ns = copy_sets(sets, sizes, nsets);
    int *round = calloc(nsets > 0 ? (size_t)nsets : 1, sizeof *round);
    char *kept = calloc(nsets > 0 ? (size_t)nsets : 1, 1);
    int rc = 0;
    if (!ns || !round || !kept)
        rc = pl_errf(err, errlen, "pl_nccl_prepare_groups: out of memory");
    else
        rc = install_sets(n, ns, nsets, kept, err, errlen);
    if (rc < 0) {
        if (ns) free_sets(ns, nsets);
        free(round);
        free(kept);
        return -1;
    }

    /* Split the rest in rounds (pl_nccl_split_rounds: the same on every rank, as
     * the list is), one ncclCommSplit per round: color = set index for the
     * members of a set of the round, NCCL_SPLIT_NOCOLOR for the other ranks. */
    int nrounds = pl_nccl_split_rounds(sets, sizes, nsets, n->nranks, round);
    if (nrounds < 0) {
        free(round);
        free(kept);
        pl_errf(err, errlen, "pl_nccl_prepare_groups: out of memory");
        return fail(n, err); /* the sets are installed half-split: unusable */
    }
    ncclConfig_t cfg = comm_config("pliant-group");
    for (int rd = 0; rd < nrounds && rc == 0; rd++) {
        int color, mine;
        if (round_color(n, ns, nsets, round, kept, rd, &color, &mine))
            rc = split_round(n, ns, color, mine, &cfg, deadline, timeout_ms, err, errlen);
    }
    free(round);
    free(kept);
    return rc;
}

/* With n->mu held: the communicator of a prepared set (of ≥ 2 ranks) equal to
 * group, or the world's. −1 when the set was not prepared. */
static int find_group(pl_nccl *n, const int32_t *group, int size, ncclComm_t *comm)
{
    *comm = NULL;
    if (size == n->nranks) {
        for (int k = 0; k < size; k++)
            if (group[k] != k) return -1;
        *comm = n->world;
        return 0;
    }
    for (int i = 0; i < n->nsets; i++) {
        nset *s = &n->sets[i];
        if (s->n != size) continue;
        int eq = 1;
        for (int k = 0; k < size && eq; k++) eq = s->ranks[k] == (int)group[k];
        if (!eq || !s->comm) continue;
        *comm = s->comm;
        return 0;
    }
    return -1;
}

static void group_text(const int32_t *group, int size, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int k = 0; k < size && o + 16 < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s%d", k ? "," : "", (int)group[k]);
}

/* Starts the group of an enqueue on the module's device (under n->mu); *r is what the
 * operations of the group then report. −1 (module failed, err) when it cannot start. */
static int begin_group(pl_nccl *n, ncclResult_t *r, char *err, size_t errlen)
{
    cudaSetDevice(n->device);
    if ((*r = ncclGroupStart()) == ncclSuccess) return 0;
    nccl_errf(err, errlen, "ncclGroupStart", *r);
    fail_locked(n, err);
    return -1;
}

/* Ends the group (always: a group is per-thread state). −1 (module failed) when one of its
 * operations failed (r, already in err) or the end did (what). Under n->mu. */
static int end_group(pl_nccl *n, ncclResult_t r, const char *what, char *err, size_t errlen)
{
    ncclResult_t re = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) {
        fail_locked(n, err);
        return -1;
    }
    if (re != ncclSuccess && re != ncclInProgress) {
        nccl_errf(err, errlen, what, re);
        fail_locked(n, err);
        return -1;
    }
    return 0;
}

int pl_nccl_group_allreduce(pl_nccl *n, const int32_t *group, int group_size, float *const *bufs,
                            const size_t *counts, int nbufs, int timeout_ms, char *err,
                            size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    if (!group || group_size < 1 || group_size > n->nranks || nbufs < 0 || nbufs > PL_NCCL_MAX_OPS ||
        (nbufs > 0 && (!bufs || !counts)) || timeout_ms == 0)
        return pl_errf(err, errlen, "pl_nccl_group_allreduce: bad arguments");
    for (int i = 0; i < nbufs; i++)
        if (counts[i] > 0 && !bufs[i])
            return pl_errf(err, errlen, "pl_nccl_group_allreduce: bufs[%d] is NULL", i);
    double deadline = deadline_of(timeout_ms);
    pthread_mutex_lock(&n->mu);
    if (check_sound(n, err, errlen) < 0) goto out_unlock;
    ncclComm_t comm;
    int in = 0;
    for (int k = 0; k < group_size; k++) in |= group[k] == n->rank;
    if (in && group_size == 1) { /* its sum is its own gradient */
        pthread_mutex_unlock(&n->mu);
        return 0;
    }
    if (!in || find_group(n, group, group_size, &comm) < 0 || !comm) {
        char text[128];
        group_text(group, group_size, text, sizeof text);
        pl_errf(err, errlen, "pl_nccl_group_allreduce: group {%s} %s", text,
                in ? "was not prepared" : "does not contain this rank");
        goto out_unlock;
    }
    ncclResult_t r;
    if (begin_group(n, &r, err, errlen)) goto out_unlock;
    int issued = 0;
    for (int i = 0; i < nbufs; i++) {
        if (counts[i] == 0) continue;
        r = ncclAllReduce(bufs[i], bufs[i], counts[i], ncclFloat32, ncclSum, comm, n->stream);
        if (r != ncclSuccess && r != ncclInProgress) {
            nccl_errf(err, errlen, "ncclAllReduce", r);
            break;
        }
        issued++;
    }
    if (end_group(n, r, "ncclGroupEnd (all-reduce)", err, errlen)) goto out_unlock;
    pthread_mutex_unlock(&n->mu);
    if (!issued) return 0;
    return settle(n, comm, deadline, timeout_ms, "ncclAllReduce (enqueue)", err, errlen);

out_unlock:
    pthread_mutex_unlock(&n->mu);
    return -1;
}

/* ---- point to point ---- */

int pl_nccl_p2p_batch(pl_nccl *n, const pl_nccl_p2p *ops, int nops, int timeout_ms, char *err,
                      size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    if (nops < 0 || nops > PL_NCCL_MAX_OPS || (nops > 0 && !ops) || timeout_ms == 0)
        return pl_errf(err, errlen, "pl_nccl_p2p_batch: bad arguments");
    int live = 0;
    for (int i = 0; i < nops; i++) {
        if (ops[i].peer < 0 || ops[i].peer >= n->nranks)
            return pl_errf(err, errlen, "pl_nccl_p2p_batch: ops[%d]: peer %d not in 0..%d", i,
                           ops[i].peer, n->nranks - 1);
        if (ops[i].count > 0 && !ops[i].data)
            return pl_errf(err, errlen, "pl_nccl_p2p_batch: ops[%d]: no buffer", i);
        live += ops[i].count > 0;
    }
    double deadline = deadline_of(timeout_ms);
    pthread_mutex_lock(&n->mu);
    if (check_sound(n, err, errlen) < 0) goto out_unlock;
    if (!live) {
        pthread_mutex_unlock(&n->mu);
        return 0;
    }
    ncclResult_t r;
    if (begin_group(n, &r, err, errlen)) goto out_unlock;
    for (int i = 0; i < nops; i++) {
        const pl_nccl_p2p *o = &ops[i];
        if (o->count == 0) continue;
        r = o->send ? ncclSend(o->data, o->count, ncclFloat32, o->peer, n->world, n->stream)
                    : ncclRecv(o->data, o->count, ncclFloat32, o->peer, n->world, n->stream);
        if (r != ncclSuccess && r != ncclInProgress) {
            char what[64];
            snprintf(what, sizeof what, "%s (ops[%d], peer %d)", o->send ? "ncclSend" : "ncclRecv",
                     i, o->peer);
            nccl_errf(err, errlen, what, r);
            break;
        }
    }
    if (end_group(n, r, "ncclGroupEnd (send/recv)", err, errlen)) goto out_unlock;
    ncclComm_t world = n->world;
    pthread_mutex_unlock(&n->mu);
    /* the first exchange with a peer connects to it here: a dead peer shows as a timeout */
    return settle(n, world, deadline, timeout_ms, "ncclSend/ncclRecv (enqueue)", err, errlen);

out_unlock:
    pthread_mutex_unlock(&n->mu);
    return -1;
}

int pl_nccl_send(pl_nccl *n, int peer, const float *dev, size_t count, int timeout_ms, char *err,
                 size_t errlen)
{
    /* NCCL only reads a send buffer; the op struct is shared with receives */
    pl_nccl_p2p op = {peer, 1, (float *)(uintptr_t)dev, count};
    return pl_nccl_p2p_batch(n, &op, 1, timeout_ms, err, errlen);
}

int pl_nccl_recv(pl_nccl *n, int peer, float *dev, size_t count, int timeout_ms, char *err,
                 size_t errlen)
{
    pl_nccl_p2p op = {peer, 0, dev, count};
    return pl_nccl_p2p_batch(n, &op, 1, timeout_ms, err, errlen);
}

/* ---- completion ---- */

/* With n->mu held: −1 (module failed) if any attached communicator reports an
 * asynchronous error. */
static int check_comms_locked(pl_nccl *n, char *err, size_t errlen)
{
    if (n->world && comm_state(n->world, "world communicator", err, errlen) < 0)
        return fail_locked(n, err);
    for (int i = 0; i < n->nsets; i++) {
        if (!n->sets[i].comm) continue;
        char what[64];
        snprintf(what, sizeof what, "group communicator %d", i);
        if (comm_state(n->sets[i].comm, what, err, errlen) < 0) return fail_locked(n, err);
    }
    return 0;
}

/* With n->mu held: 1 idle, 0 busy, −1 failed. */
static int poll_locked(pl_nccl *n, char *err, size_t errlen)
{
    if (check_sound(n, err, errlen) < 0) return -1;
    cudaError_t e = cudaStreamQuery(n->stream);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
        cuda_errf(err, errlen, "cudaStreamQuery (nccl stream)", e);
        return fail_locked(n, err);
    }
    if (check_comms_locked(n, err, errlen) < 0) return -1;
    return e == cudaSuccess;
}

int pl_nccl_wait(pl_nccl *n, int timeout_ms, char *err, size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    double deadline = deadline_of(timeout_ms);
    for (int polls = 0;;) {
        pthread_mutex_lock(&n->mu);
        int r = poll_locked(n, err, errlen);
        pthread_mutex_unlock(&n->mu);
        if (r < 0) return -1;
        if (r == 1) return 0;
        if (passed(deadline)) {
            pl_errf(err, errlen, "timeout: nccl operations not done after %d ms (a peer dead or "
                                 "out of step?)", timeout_ms);
            return fail(n, err);
        }
        backoff(&polls);
    }
}

int pl_nccl_query(pl_nccl *n, char *err, size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    pthread_mutex_lock(&n->mu);
    int r = poll_locked(n, err, errlen);
    pthread_mutex_unlock(&n->mu);
    return r;
}

int pl_nccl_failed(pl_nccl *n, char *err, size_t errlen)
{
    pthread_mutex_lock(&n->mu);
    int f = n->failed;
    if (f) pl_errf(err, errlen, "%s", n->why);
    pthread_mutex_unlock(&n->mu);
    return f;
}

/* ---- revoke, abort ---- */

/* With n->mu held: moves the sub-communicators (and the world's when `world`)
 * into cs; returns how many. */
static int detach_locked(pl_nccl *n, int world, ncclComm_t *cs, int *revoked)
{
    int nc = 0;
    for (int i = 0; i < n->nsets; i++) {
        if (!n->sets[i].comm) continue;
        revoked[nc] = 0;
        cs[nc++] = n->sets[i].comm;
        n->sets[i].comm = NULL;
    }
    if (world && n->world) {
        revoked[nc] = n->world_revoked;
        cs[nc++] = n->world;
        n->world = NULL;
    }
    return nc;
}

static void stop(pl_nccl *n, const char *prefix, const char *reason, int whole)
{
    char why[WHY_LEN];
    snprintf(why, sizeof why, "%s: %s", prefix, reason && *reason ? reason : "no reason given");
    pthread_mutex_lock(&n->mu);
    set_failed(n, why);
    ncclComm_t *cs = malloc(((size_t)n->nsets + 1) * sizeof *cs);
    int *revoked = malloc(((size_t)n->nsets + 1) * sizeof *revoked);
    int nc = 0;
    if (cs && revoked) {
        nc = detach_locked(n, whole, cs, revoked);
    }
    if (!whole && n->world && !n->world_revoked) {
        /* non-blocking: stops in-flight work, the world stays a shrink parent */
        int old = -1;
        cudaGetDevice(&old);
        cudaSetDevice(n->device);
        ncclCommRevoke(n->world, NCCL_REVOKE_DEFAULT);
        n->world_revoked = 1;
        if (old >= 0) cudaSetDevice(old);
    }
    n->aborting++;
    pthread_mutex_unlock(&n->mu);

    if (nc > 0) {
        int old = -1;
        cudaGetDevice(&old);
        cudaSetDevice(n->device);
        abort_comms(cs, revoked, nc);
        if (old >= 0) cudaSetDevice(old);
    }
    /* Without memory to detach, the communicators stay attached: destroy
     * aborts them (the module is failed, so nothing else issues work). */
    free(cs);
    free(revoked);

    pthread_mutex_lock(&n->mu);
    if (--n->aborting == 0) pthread_cond_broadcast(&n->quiet);
    pthread_mutex_unlock(&n->mu);
}

void pl_nccl_revoke(pl_nccl *n, const char *reason)
{
    if (n) stop(n, "revoked", reason, 0);
}

void pl_nccl_abort(pl_nccl *n, const char *reason)
{
    if (n) stop(n, "aborted", reason, 1);
}

/* ---- shrink ---- */

/* Polls the world communicator `parent` of n until its pending job (a revoke, a
 * shrink) is done, whatever the state it ends in: the parent of a failed world
 * may keep reporting the old error, and the new communicator's own state is what
 * counts. 0, or −1 with err (aborted meanwhile, or the deadline). */
static int wait_parent(pl_nccl *n, ncclComm_t parent, double deadline, int timeout_ms,
                       const char *what, char *err, size_t errlen)
{
    for (int polls = 0;; backoff(&polls)) {
        pthread_mutex_lock(&n->mu);
        ncclResult_t st = ncclSuccess;
        int gone = n->world != parent;
        if (!gone && ncclCommGetAsyncError(parent, &st) != ncclSuccess) st = ncclInternalError;
        pthread_mutex_unlock(&n->mu);
        if (gone) return pl_errf(err, errlen, "%s: the world communicator was aborted", what);
        if (st != ncclInProgress) return 0;
        if (passed(deadline))
            return pl_errf(err, errlen, "timeout: %s not done after %d ms", what, timeout_ms);
    }
}

/* The excluded ranks must be in range, other than this one and distinct;
 * *below counts those under this rank. */
static int check_excluded(const pl_nccl *n, const int *excluded_ranks, int nexcluded, int *below,
                          char *err, size_t errlen)
{
    *below = 0;
    for (int i = 0; i < nexcluded; i++) {
        int r = excluded_ranks[i];
        if (r < 0 || r >= n->nranks)
            return pl_errf(err, errlen, "pl_nccl_shrink: excluded rank %d not in 0..%d", r,
                           n->nranks - 1);
        if (r == n->rank) return pl_errf(err, errlen, "pl_nccl_shrink: this rank is excluded");
        for (int j = 0; j < i; j++)
            if (excluded_ranks[j] == r)
                return pl_errf(err, errlen, "pl_nccl_shrink: rank %d excluded twice", r);
        *below += r < n->rank;
    }
    return 0;
}

/* The world to shrink (*parent), revoked first when it failed: NCCL refuses to
 * shrink a parent whose state is an error, and a finished revoke resets it to
 * success (the collective → revoke → shrink flow). *failed and *revoked: its
 * state then. */
static int shrink_parent(pl_nccl *n, ncclComm_t *parent, int *failed, int *revoked, char *err,
                         size_t errlen)
{
    pthread_mutex_lock(&n->mu);
    wait_quiet_locked(n); /* a pl_nccl_revoke may still be aborting sub-communicators */
    *parent = n->world;
    *failed = n->failed;
    if (*parent && *failed && !n->world_revoked) {
        cudaSetDevice(n->device);
        ncclResult_t rr = ncclCommRevoke(*parent, NCCL_REVOKE_DEFAULT);
        n->world_revoked = 1;
        if (rr != ncclSuccess && rr != ncclInProgress) {
            pthread_mutex_unlock(&n->mu);
            return nccl_errf(err, errlen, "ncclCommRevoke (before shrink)", rr);
        }
    }
    *revoked = n->world_revoked;
    pthread_mutex_unlock(&n->mu);
    if (!*parent)
        return pl_errf(err, errlen, "pl_nccl_shrink: the world communicator was aborted (create "
                                    "a new one from a fresh id)");
    return 0;
}

/* Starts the shrink of parent, still n's world, into m->world. */
static int start_shrink(pl_nccl *n, pl_nccl *m, ncclComm_t parent, int *excl, int nexcluded,
                        int failed, ncclConfig_t *cfg, char *err, size_t errlen)
{
    pthread_mutex_lock(&n->mu);
    if (n->world != parent) {
        pthread_mutex_unlock(&n->mu);
        return pl_errf(err, errlen, "pl_nccl_shrink: the world communicator was aborted");
    }
    cudaSetDevice(n->device);
    /* SHRINK_ABORT first stops whatever the failed world still runs */
    ncclResult_t r = ncclCommShrink(parent, excl, nexcluded, &m->world, cfg,
                                    failed ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
    pthread_mutex_unlock(&n->mu);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_errf(err, errlen, "ncclCommShrink", r);
    return 0;
}

/* The shrink job runs on the parent and writes m->world when done; then the
 * new world settles. */
static int await_new_world(pl_nccl *n, pl_nccl *m, ncclComm_t parent, double deadline,
                           int timeout_ms, char *why, size_t whylen)
{
    if (wait_parent(n, parent, deadline, timeout_ms, "ncclCommShrink", why, whylen) < 0) return -1;
    if (!m->world) return pl_errf(why, whylen, "ncclCommShrink: no communicator");
    return settle(m, m->world, deadline, timeout_ms, "ncclCommShrink (new world)", why, whylen);
}

int pl_nccl_shrink(pl_nccl *n, const int *excluded_ranks, int nexcluded, int timeout_ms,
                   pl_nccl **out, char *err, size_t errlen)
{
    NEED_ERRBUF(err, errlen);
    if (out) *out = NULL;
    if (!out || !excluded_ranks || nexcluded < 1 || nexcluded >= n->nranks || timeout_ms <= 0)
        return pl_errf(err, errlen, "pl_nccl_shrink: bad arguments");
    int below;
    if (check_excluded(n, excluded_ranks, nexcluded, &below, err, errlen) < 0) return -1;
    double deadline = deadline_of(timeout_ms);
    /* NCCL sorts the list in place: give it a copy */
    int *excl = malloc((size_t)nexcluded * sizeof *excl);
    if (!excl) return pl_errf(err, errlen, "pl_nccl_shrink: out of memory");
    memcpy(excl, excluded_ranks, (size_t)nexcluded * sizeof *excl);
    pl_nccl *m = module_new(n->device, n->rank - below, n->nranks - nexcluded, err, errlen);
    if (!m) {
        free(excl);
        return -1;
    }

    ncclConfig_t cfg = comm_config("pliant-world");
    ncclComm_t parent = NULL;
    int failed = 0, revoked = 0;
    int rc = shrink_parent(n, &parent, &failed, &revoked, err, errlen);
    /* ncclCommRevoke finishes asynchronously; shrink only once it has */
    if (rc == 0 && revoked)
        rc = wait_parent(n, parent, deadline, timeout_ms, "ncclCommRevoke", err, errlen);
    if (rc == 0) rc = start_shrink(n, m, parent, excl, nexcluded, failed, &cfg, err, errlen);
    free(excl);
    if (rc < 0) {
        fail(m, err);
        pl_nccl_destroy(m);
        return -1;
    }
    char why[WHY_LEN] = "";
    if (await_new_world(n, m, parent, deadline, timeout_ms, why, sizeof why) < 0) {
        pl_errf(err, errlen, "%s", why);
        /* the job may still be running: only aborting the parent ends it for sure */
        pl_nccl_abort(n, "shrink failed");
        pthread_mutex_lock(&n->mu);
        wait_quiet_locked(n);
        pthread_mutex_unlock(&n->mu);
        fail(m, why);
        pl_nccl_destroy(m);
        return -1;
    }
    *out = m;
    return 0;
}

/* ---- destroy ---- */

void pl_nccl_destroy(pl_nccl *n)
{
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    wait_quiet_locked(n); /* an abort still running on another thread */
    int sound = !n->failed;
    pthread_mutex_unlock(&n->mu);
    /* From here on nothing else uses n. */
    cudaSetDevice(n->device);
    if (sound) {
        double deadline = deadline_of(CLOSE_MS);
        for (int i = 0; i < n->nsets; i++) close_comm(n->sets[i].comm, 1, deadline);
        close_comm(n->world, 1, deadline);
    } else {
        /* The world first: aborting it also ends a split or shrink job still
         * running on it, which would write split_slot after we looked. */
        if (n->world) ncclCommAbort(n->world);
        for (int i = 0; i < n->nsets; i++)
            if (n->sets[i].comm) ncclCommAbort(n->sets[i].comm);
    }
    if (n->split_slot) ncclCommAbort(n->split_slot);
    /* ncclCommAbort stops NCCL's kernels but does not wait for the module's stream:
     * an aborted receive may still be exiting there, and the caller frees or reuses
     * the buffers of the operations once this returns (xport.h). Wait for the
     * stream to drain, bounded (its work after an abort is short). */
    {
        double deadline = deadline_of(CLOSE_MS);
        int polls = 0;
        while (cudaStreamQuery(n->stream) == cudaErrorNotReady && !passed(deadline))
            backoff(&polls);
    }
    /* returns at once; CUDA frees the stream once its work is done */
    cudaStreamDestroy(n->stream);
    free_sets(n->sets, n->nsets);
    pthread_cond_destroy(&n->quiet);
    pthread_mutex_destroy(&n->mu);
    free(n);
}
