/* Leader election. Without the API emulator only the configuration checks and
 * the time format run; `test_leader --kubeconfig PATH` (tests/cli/
 * test_leader_emulator.py starts the emulator) runs two electors against one
 * Lease: exactly one leads, a stopped leader hands over at once, and a leader
 * whose renewals fail steps down and is replaced once the lease expires. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kube_client.h"
#include "leader.h"

/* Short durations: leaseDurationSeconds is written as 2. */
#define LEASE_MS 1500
#define RENEW_MS 500
#define RETRY_MS 200

static const char *kubeconfig_;
static pl_kube_config kc_;

typedef struct {
    atomic_int started, stopped;
} calls;

static void on_started(void *user)
{
    atomic_fetch_add(&((calls *)user)->started, 1);
}

static void on_stopped(void *user)
{
    atomic_fetch_add(&((calls *)user)->stopped, 1);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pl_leader *elector(const char *lease, const char *identity, calls *c)
{
    char err[256];
    pl_leader_config cfg = {&kc_,     NULL,     lease,      identity,   LEASE_MS, RENEW_MS,
                            RETRY_MS, on_started, on_stopped, c};
    pl_leader *l = pl_leader_start(&cfg, err, sizeof err);
    if (!l) printf("    pl_leader_start: %s\n", err);
    return l;
}

/* Waits up to ms for pl_leader_is_leader(l) == want. */
static int wait_leading(const pl_leader *l, int want, int ms)
{
    int64_t until = mono_ms() + ms;
    while (pl_leader_is_leader(l) != want) {
        if (mono_ms() > until) return 0;
        usleep(10 * 1000);
    }
    return 1;
}

/* A request to the API server on a client of its own; 0 or −1. */
static int api(const char *method, const char *path, const char *json, cJSON **out)
{
    char err[256];
    pl_kube_client *c = pl_kube_client_new(&kc_, err, sizeof err);
    if (!c) return -1;
    pl_kube_status st;
    cJSON *body = json ? cJSON_Parse(json) : NULL;
    int rc = pl_kube_request(c, method, path, body ? "application/json" : NULL, body, out, &st);
    if (rc) printf("    %s %s: %ld %s\n", method, path, st.http, st.message);
    cJSON_Delete(body);
    pl_kube_client_free(c);
    return rc;
}

/* The lease's spec field (a string, or a number printed), "" when absent. */
static const char *lease_field(const char *lease, const char *field, char *out, size_t cap)
{
    char path[256];
    cJSON *obj = NULL;
    snprintf(path, sizeof path, "/apis/coordination.k8s.io/v1/namespaces/default/leases/%s",
             lease);
    out[0] = 0;
    if (api("GET", path, NULL, &obj) == 0) {
        const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "spec"), field);
        if (cJSON_IsString(v)) snprintf(out, cap, "%s", v->valuestring);
        else if (cJSON_IsNumber(v)) snprintf(out, cap, "%d", v->valueint);
    }
    cJSON_Delete(obj);
    return out;
}

#define CHECK_LEASE(lease, field, want)                                                 \
    do {                                                                                \
        char v_[64];                                                                    \
        CHECK_STR_CONTAINS(lease_field(lease, field, v_, sizeof v_), want);             \
        CHECK_EQ_INT(strlen(v_), strlen(want));                                         \
    } while (0)

/* ---- without the emulator ---- */

static void test_config_checks(void)
{
    pl_kube_config kc = {0};
    char err[256];
    pl_leader_config cfg = {&kc, "ns", "lease", "me", 1500, 1500, 200, NULL, NULL, NULL};
    CHECK(!pl_leader_start(&cfg, err, sizeof err));
    CHECK_STR_CONTAINS(err, "lease_ms > renew_ms");
    cfg.renew_ms = 500;
    cfg.retry_ms = 450; /* the jitter would reach the deadline */
    CHECK(!pl_leader_start(&cfg, err, sizeof err));
    cfg.retry_ms = 200;
    cfg.identity = "";
    CHECK(!pl_leader_start(&cfg, err, sizeof err));
    CHECK_STR_CONTAINS(err, "identity");
}

static void test_micro_time(void)
{
    char t[32];
    pl_leader_micro_time(t);
    CHECK_EQ_INT(strlen(t), 27);
    struct tm tm = {0};
    const char *rest = strptime(t, "%Y-%m-%dT%H:%M:%S", &tm);
    CHECK(rest && rest[0] == '.' && strspn(rest + 1, "0123456789") == 6 && rest[7] == 'Z');
    CHECK(timegm(&tm) - time(NULL) < 2 && time(NULL) - timegm(&tm) < 2);
}

/* ---- against the emulator ---- */

static void emu_one_leader_and_handover(void)
{
    if (!kubeconfig_) SKIP("needs --kubeconfig");
    calls ca = {0}, cb = {0};
    pl_leader *a = elector("handover", "a", &ca), *b = elector("handover", "b", &cb);
    CHECK(a && b);
    int64_t until = mono_ms() + 3000;
    while (!pl_leader_is_leader(a) && !pl_leader_is_leader(b) && mono_ms() < until)
        usleep(10 * 1000);
    pl_leader *first = pl_leader_is_leader(a) ? a : b, *second = first == a ? b : a;
    calls *cfirst = first == a ? &ca : &cb, *csecond = first == a ? &cb : &ca;
    const char *first_id = first == a ? "a" : "b", *second_id = first == a ? "b" : "a";
    CHECK(pl_leader_is_leader(first));
    usleep(2500 * 1000); /* longer than the lease: renewals keep it */
    CHECK(pl_leader_is_leader(first));
    CHECK(!pl_leader_is_leader(second));
    CHECK_EQ_INT(atomic_load(&cfirst->started), 1);
    CHECK_EQ_INT(atomic_load(&csecond->started), 0);
    CHECK_LEASE("handover", "holderIdentity", first_id);
    CHECK_LEASE("handover", "leaseDurationSeconds", "2");
    CHECK_LEASE("handover", "leaseTransitions", "0");
    char renew[64];
    CHECK_EQ_INT(strlen(lease_field("handover", "renewTime", renew, sizeof renew)), 27);

    int64_t t0 = mono_ms();
    pl_leader_stop(first); /* releases the lease */
    CHECK_EQ_INT(atomic_load(&cfirst->stopped), 1);
    CHECK(wait_leading(second, 1, 3000));
    CHECK(mono_ms() - t0 < 1000); /* not waiting for the 2 s lease to expire */
    CHECK_EQ_INT(atomic_load(&csecond->started), 1);
    CHECK_LEASE("handover", "holderIdentity", second_id);
    CHECK_LEASE("handover", "leaseTransitions", "1");
    pl_leader_stop(second);
    CHECK_LEASE("handover", "holderIdentity", "");
    CHECK_EQ_INT(atomic_load(&csecond->stopped), 1);
}

static void emu_failed_renewals(void)
{
    if (!kubeconfig_) SKIP("needs --kubeconfig");
    calls ca = {0}, cb = {0};
    pl_leader *a = elector("renewals", "a", &ca), *b = NULL;
    CHECK(a);
    int ok = wait_leading(a, 1, 3000);
    if (ok) b = elector("renewals", "b", &cb);
    ok = ok && b;
    usleep(300 * 1000);
    int64_t t0 = mono_ms();
    ok = ok && api("POST", "/_emulator/faults",
                   "{\"status\":500,\"count\":1000,\"method\":\"PUT\","
                   "\"path_regex\":\"leases/renewals$\"}", NULL) == 0;
    int lost = ok && wait_leading(a, 0, 3000);
    int64_t t_lost = mono_ms() - t0;
    int b_early = b && pl_leader_is_leader(b);
    ok = ok && api("DELETE", "/_emulator/faults", NULL, NULL) == 0;
    int took = ok && wait_leading(b, 1, 5000);
    int64_t t_took = mono_ms() - t0;
    pl_leader_stop(a);
    pl_leader_stop(b);
    CHECK(ok);
    CHECK(lost);
    CHECK(t_lost < LEASE_MS); /* stepped down before anyone may take over */
    CHECK(!b_early);
    CHECK_EQ_INT(atomic_load(&ca.started), 1);
    CHECK_EQ_INT(atomic_load(&ca.stopped), 1);
    CHECK(took);
    CHECK(t_took >= LEASE_MS); /* only once the lease expired */
    CHECK_EQ_INT(atomic_load(&cb.started), 1);
    CHECK_LEASE("renewals", "leaseTransitions", "1");
}

int main(int argc, char **argv)
{
    int failures_ = 0;
    if (argc == 3 && strcmp(argv[1], "--kubeconfig") == 0) {
        char err[256];
        if (pl_kube_config_load_file(&kc_, argv[2], NULL, err, sizeof err)) {
            printf("FAIL emulator_setup: %s\n", err);
            return 1;
        }
        kubeconfig_ = argv[2];
    }
    RUN(test_config_checks);
    RUN(test_micro_time);
    RUN(emu_one_leader_and_handover);
    RUN(emu_failed_renewals);
    if (kubeconfig_) pl_kube_config_free(&kc_);
    return failures_ ? 1 : 0;
}
