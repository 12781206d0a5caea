/* Leader election on a coordination.k8s.io/v1 Lease, as client-go does it (leader.h). */
#include "leader.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json_num.h"
#include "kube_client.h"
#include "kube_requests.h"
#include "oplog.h"
#include "util.h"

#define JITTER 1.2 /* candidates wait retry_ms · [1, JITTER) */

struct pl_leader {
    pl_leader_config cfg; /* strings below, copied */
    char *ns, *name, *identity;
    pl_kube_client *client;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* on CLOCK_MONOTONIC; signalled by stop */
    int stop;
    atomic_int leading;
    /* what this elector last saw of the Lease (thread only) */
    cJSON *lease;        /* the object as last read or written, with resourceVersion */
    char *observed_spec; /* its spec, printed */
    int64_t observed_ms; /* when the spec last changed, monotonic */
    struct drand48_data rng;
};

typedef enum { TRY_OK, TRY_HELD, TRY_FAILED } try_result;

void pl_leader_micro_time(char out[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%06ldZ", ts.tv_nsec / 1000);
}

/* Sleeps ms or until stop; 1 when stopping. */
static int wait_ms(pl_leader *l, int64_t ms)
{
    int64_t until = pl_now_ms() + ms;
    struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000L};
    pthread_mutex_lock(&l->lock);
    while (!l->stop && pl_now_ms() < until) pthread_cond_timedwait(&l->cond, &l->lock, &ts);
    int stop = l->stop;
    pthread_mutex_unlock(&l->lock);
    return stop;
}

static pl_kube_ref lease_ref(const pl_leader *l)
{
    pl_kube_ref r = {"coordination.k8s.io", "v1", l->ns, "leases", l->name, NULL};
    return r;
}

static const char *spec_string(const cJSON *spec, const char *field)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(spec, field);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* Notes a new Lease object: the local clock starts when its spec changes. */
static void observe(pl_leader *l, cJSON *lease)
{
    char *spec = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(lease, "spec"));
    if (!spec || !l->observed_spec || strcmp(spec, l->observed_spec) != 0) {
        free(l->observed_spec);
        l->observed_spec = spec;
        l->observed_ms = pl_now_ms();
    } else {
        free(spec);
    }
    cJSON_Delete(l->lease);
    l->lease = lease;
}

/* The spec this elector writes when it takes or renews old (NULL: none). */
static cJSON *new_spec(const pl_leader *l, const cJSON *old)
{
    char now[32];
    pl_leader_micro_time(now);
    int mine = old && strcmp(spec_string(old, "holderIdentity"), l->identity) == 0;
    const cJSON *transitions = cJSON_GetObjectItemCaseSensitive(old, "leaseTransitions");
    int n = (int)pl_json_int_or(transitions, 0, INT_MAX - 1, 0);
    cJSON *spec = cJSON_CreateObject();
    int ok = spec && cJSON_AddStringToObject(spec, "holderIdentity", l->identity) &&
             cJSON_AddNumberToObject(spec, "leaseDurationSeconds",
                                     (l->cfg.lease_ms + 999) / 1000) &&
             cJSON_AddStringToObject(spec, "acquireTime",
                                     mine && *spec_string(old, "acquireTime")
                                         ? spec_string(old, "acquireTime") : now) &&
             cJSON_AddStringToObject(spec, "renewTime", now) &&
             cJSON_AddNumberToObject(spec, "leaseTransitions", mine || !old ? n : n + 1);
    if (!ok) {
        cJSON_Delete(spec);
        return NULL;
    }
    return spec;
}

/* Puts spec (owned) into obj in place of its old one; −1 when out of memory. */
static int put_spec(cJSON *obj, cJSON *spec)
{
    cJSON_DeleteItemFromObjectCaseSensitive(obj, "spec");
    if (obj && spec && cJSON_AddItemToObject(obj, "spec", spec)) return 0;
    cJSON_Delete(spec);
    return -1;
}

/* A new Lease held by this elector: POST. */
static try_result create_lease(pl_leader *l)
{
    pl_kube_ref r = lease_ref(l);
    r.name = NULL;
    cJSON *obj = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(obj, "metadata");
    int ok = meta && cJSON_AddStringToObject(obj, "apiVersion", "coordination.k8s.io/v1") &&
             cJSON_AddStringToObject(obj, "kind", "Lease") &&
             cJSON_AddStringToObject(meta, "name", l->name) &&
             cJSON_AddStringToObject(meta, "namespace", l->ns) &&
             put_spec(obj, new_spec(l, NULL)) == 0;
    cJSON *out = NULL;
    pl_kube_status st;
    if (ok && PL_REQ(LEASE_CREATE, pl_kube_create(l->client, &r, obj, &out, &st)) == 0)
        observe(l, out);
    else if (ok && st.http != 409) /* 409: another candidate created it first */
        pl_log(PL_LOG_WARN, "leader: create lease %s: %s", l->name, st.message);
    cJSON_Delete(obj);
    return out ? TRY_OK : TRY_FAILED;
}

/* client-go's tryAcquireOrRenew: read the Lease, and write it as ours when it
 * is ours already, free, or expired. One re-read after a 409. */
static try_result try_acquire_or_renew(pl_leader *l, int64_t timeout_ms)
{
    pl_kube_client_set_timeout(l->client, timeout_ms > 0 ? (long)timeout_ms : 1);
    pl_kube_ref r = lease_ref(l);
    for (int attempt = 0; attempt < 2; attempt++) {
        cJSON *lease = NULL;
        pl_kube_status st;
        if (PL_REQ(LEASE_GET, pl_kube_get(l->client, &r, NULL, &lease, &st)) != 0) {
            if (st.http == 404) return create_lease(l);
            pl_log(PL_LOG_WARN, "leader: get lease %s: %s", l->name, st.message);
            return TRY_FAILED;
        }
        observe(l, lease);
        const cJSON *old = cJSON_GetObjectItemCaseSensitive(lease, "spec");
        const char *holder = spec_string(old, "holderIdentity");
        const cJSON *dur = cJSON_GetObjectItemCaseSensitive(old, "leaseDurationSeconds");
        const int64_t dur_s = pl_json_int_or(dur, 1, 86400, -1); /* a day at most */
        const int64_t dur_ms = dur_s > 0 ? dur_s * 1000 : l->cfg.lease_ms;
        if (*holder && strcmp(holder, l->identity) != 0 && l->observed_ms + dur_ms > pl_now_ms())
            return TRY_HELD;
        cJSON *obj = cJSON_Duplicate(lease, 1);
        if (put_spec(obj, new_spec(l, old)) != 0) {
            cJSON_Delete(obj);
            return TRY_FAILED;
        }
        cJSON *out = NULL;
        int rc = PL_REQ(LEASE_UPDATE, pl_kube_replace(l->client, &r, obj, &out, &st));
        cJSON_Delete(obj);
        if (rc == 0) {
            observe(l, out);
            return TRY_OK;
        }
        if (st.http != 409) {
            pl_log(PL_LOG_WARN, "leader: update lease %s: %s", l->name, st.message);
            return TRY_FAILED;
        }
    }
    return TRY_FAILED;
}

/* Clears holderIdentity on the Lease as last written, so that candidates take
 * it without waiting for it to expire. A 409 means it is no longer ours. */
static void release(pl_leader *l)
{
    cJSON *spec = cJSON_GetObjectItemCaseSensitive(l->lease, "spec");
    if (!spec || strcmp(spec_string(spec, "holderIdentity"), l->identity) != 0) return;
    char now[32];
    pl_leader_micro_time(now);
    cJSON_ReplaceItemInObject(spec, "holderIdentity", cJSON_CreateString(""));
    cJSON_ReplaceItemInObject(spec, "leaseDurationSeconds", cJSON_CreateNumber(1));
    cJSON_ReplaceItemInObject(spec, "renewTime", cJSON_CreateString(now));
    pl_kube_ref r = lease_ref(l);
    pl_kube_status st;
    pl_kube_client_set_timeout(l->client, l->cfg.renew_ms);
    if (PL_REQ(LEASE_UPDATE, pl_kube_replace(l->client, &r, l->lease, NULL, &st)) != 0)
        pl_log(PL_LOG_WARN, "leader: release lease %s: %s", l->name, st.message);
}

static void set_leading(pl_leader *l, int leading)
{
    atomic_store(&l->leading, leading);
    void (*cb)(void *) = leading ? l->cfg.on_started : l->cfg.on_stopped;
    if (cb) cb(l->cfg.user);
}

static void *run(void *arg)
{
    pl_leader *l = arg;
    /* acquire */
    int64_t renewed; /* when the last successful write was sent: no later than
                      * others saw its renewTime */
    for (;;) {
        renewed = pl_now_ms();
        if (try_acquire_or_renew(l, l->cfg.renew_ms) == TRY_OK) break;
        double r;
        drand48_r(&l->rng, &r);
        if (wait_ms(l, (int64_t)(l->cfg.retry_ms * (1 + (JITTER - 1) * r)))) return NULL;
    }
    set_leading(l, 1);
    /* renew */
    while (!wait_ms(l, l->cfg.retry_ms)) {
        int64_t start = pl_now_ms(), left = renewed + l->cfg.renew_ms - start;
        try_result tr = left > 0 ? try_acquire_or_renew(l, left) : TRY_FAILED;
        if (tr == TRY_OK) {
            renewed = start;
        } else if (tr == TRY_HELD || pl_now_ms() - renewed >= l->cfg.renew_ms) {
            pl_log(PL_LOG_ERROR, "leader: %s lost lease %s/%s", l->identity, l->ns, l->name);
            set_leading(l, 0);
            return NULL;
        }
    }
    /* stopped while leading: stop acting as leader before others may */
    set_leading(l, 0);
    release(l);
    return NULL;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void leader_free(pl_leader *l)
{
    pl_kube_client_free(l->client);
    cJSON_Delete(l->lease);
    free(l->observed_spec);
    free(l->ns);
    free(l->name);
    free(l->identity);
    free(l);
}

/* Fills in the default periods, then checks what election needs: a lease outlasting the
 * renew deadline, which outlasts a jittered retry. */
static int settle_config(pl_leader_config *c, char *err, size_t errlen)
{
    if (!c->lease_ms) c->lease_ms = 15000;
    if (!c->renew_ms) c->renew_ms = 10000;
    if (!c->retry_ms) c->retry_ms = 2000;
    if (!c->kc || !c->name || !*c->name || !c->identity || !*c->identity)
        return pl_errf(err, errlen,
                       "leader election: kube config, lease name and identity are required");
    if (c->retry_ms <= 0 || c->renew_ms <= c->retry_ms * JITTER || c->lease_ms <= c->renew_ms)
        return pl_errf(err, errlen,
                       "leader election: want lease_ms > renew_ms > 1.2 * retry_ms > 0, "
                       "got %d, %d, %d", c->lease_ms, c->renew_ms, c->retry_ms);
    return 0;
}

/* An elector for c with its own copies of the strings and its kube client; no thread yet. */
static pl_leader *leader_new(const pl_leader_config *c, char *err, size_t errlen)
{
    pl_leader *l = calloc(1, sizeof *l);
    if (!l) {
        pl_errf(err, errlen, "leader election: out of memory");
        return NULL;
    }
    l->cfg = *c;
    l->ns = dup_or_null(c->namespace_ && *c->namespace_ ? c->namespace_ : c->kc->namespace_);
    l->name = strdup(c->name);
    l->identity = strdup(c->identity);
    if (!l->ns || !l->name || !l->identity) {
        pl_errf(err, errlen, "leader election: out of memory");
        leader_free(l);
        return NULL;
    }
    l->cfg.namespace_ = l->ns;
    l->cfg.name = l->name;
    l->cfg.identity = l->identity;
    srand48_r((long)pl_now_ms() ^ (long)getpid() ^ (long)(uintptr_t)l, &l->rng);
    l->client = pl_kube_client_new(c->kc, err, errlen);
    if (!l->client) {
        leader_free(l);
        return NULL;
    }
    return l;
}

/* The lock, the condition variable (on CLOCK_MONOTONIC, as wait_ms times it) and the
 * elector's thread. 0, or -1 with err. */
static int start_thread(pl_leader *l, char *err, size_t errlen)
{
    pthread_condattr_t attr;
    int ok = pthread_condattr_init(&attr) == 0;
    ok = ok && pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
         pthread_cond_init(&l->cond, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (!ok) return pl_errf(err, errlen, "leader election: condition variable");
    if (pthread_mutex_init(&l->lock, NULL) != 0 || pthread_create(&l->thread, NULL, run, l) != 0) {
        pl_errf(err, errlen, "leader election: cannot start its thread");
        pthread_cond_destroy(&l->cond);
        return -1;
    }
    return 0;
}

pl_leader *pl_leader_start(const pl_leader_config *cfg, char *err, size_t errlen)
{
    pl_leader_config c = *cfg;
    if (settle_config(&c, err, errlen)) return NULL;
    pl_leader *l = leader_new(&c, err, errlen);
    if (!l) return NULL;
    if (start_thread(l, err, errlen)) {
        leader_free(l);
        return NULL;
    }
    return l;
}

int pl_leader_is_leader(const pl_leader *l)
{
    return atomic_load(&l->leading);
}

void pl_leader_stop(pl_leader *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    l->stop = 1;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    leader_free(l);
}
