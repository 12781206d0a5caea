/* The objects the operator makes for a TrainingJob (job_objects.h, job_pod.c): names
 * within 63 characters for any job name, the selector-less Service and its
 * EndpointSlice, the per-job NetworkPolicy, and the worker Pod — the Secret's worker
 * files only, the restricted security defaults, spec.worker's Pod fields merged in
 * with the operator's own parts winning, a checkpoint PVC mounted, nodes cooling down
 * excluded by node affinity; and the run-policy arithmetic (job_policy.h). */
#include <stdlib.h>

#include "check.h"
#include "job_objects.h"
#include "job_policy.h"
#include "jobspec.h"
#include "kube_client.h"

#define HEAD "apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: t}\nspec:\n" \
             "  data: {train: a.bin}\n  batch: {global: 8, micro: 2, seqLen: 32}\n  steps: 5\n"

static cJSON *job_object(const char *name)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(j, "metadata");
    cJSON_AddStringToObject(md, "name", name);
    cJSON_AddStringToObject(md, "namespace", "training");
    cJSON_AddStringToObject(md, "uid", "uid-1");
    return j;
}

static int valid_name(const char *s, int dots)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 ((c == '-' || (dots && c == '.')) && i > 0 && i < n - 1);
        if (!ok) return 0;
    }
    return 1;
}

/* A parsed spec of HEAD + more (YAML lines of spec), its job object named "basic" (the
 * result) and the builders' input o. */
static cJSON *fixture(pl_job *spec, const char *more, pl_job_objects *o)
{
    char text[4096], err[256];
    snprintf(text, sizeof text, "%s%s", HEAD, more);
    if (pl_job_parse(text, NULL, spec, err, sizeof err)) {
        printf("    %s\n", err);
        return NULL;
    }
    cJSON *j = job_object("basic");
    *o = (pl_job_objects){j, spec, "img", "/pliant", "basic-coordinator.training.svc:8443", NULL, 0};
    return j;
}

/* The item of an array whose field `key` is `value`, or NULL. */
static const cJSON *find(const cJSON *arr, const char *key, const char *value)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        const char *v = pl_kube_field(it, key);
        if (v && !strcmp(v, value)) return it;
    }
    return NULL;
}

static void test_short_names(void)
{
    char a[PL_NAME_LEN], b[PL_NAME_LEN];
    cJSON *j = job_object("basic");
    pl_job_secret_name(j, a, sizeof a);
    CHECK(!strcmp(a, "basic-pliant"));
    pl_job_service_name(j, a, sizeof a);
    CHECK(!strcmp(a, "basic-coordinator"));
    pl_job_pod_name(j, 12, a, sizeof a);
    CHECK(!strcmp(a, "basic-w12"));
    pl_job_label_value(j, a, sizeof a);
    CHECK(!strcmp(a, "basic"));
    cJSON_Delete(j);

    char long1[254], long2[254];
    memset(long1, 'a', 253);
    long1[253] = 0;
    memcpy(long2, long1, sizeof long2);
    long2[252] = 'b'; /* same first 252 characters */
    cJSON *j1 = job_object(long1), *j2 = job_object(long2);
    void (*fns[])(const cJSON *, char *, size_t) = {pl_job_secret_name, pl_job_service_name,
                                                   pl_job_policy_name, pl_job_label_value};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        fns[i](j1, a, sizeof a);
        fns[i](j2, b, sizeof b);
        CHECK(valid_name(a, 0) && valid_name(b, 0));
        CHECK(strcmp(a, b) != 0); /* the hash of the whole name tells them apart */
    }
    pl_job_pod_name(j1, 999999, a, sizeof a);
    CHECK(valid_name(a, 0));
    pl_job_pod_prefix(j1, b, sizeof b);
    CHECK(!strncmp(a, b, strlen(b)) && !strcmp(a + strlen(b), "999999"));
    cJSON_Delete(j1);
    cJSON_Delete(j2);

    /* a Service is a DNS-1035 label: no dots, a letter first; labels keep dots */
    j = job_object("team.a");
    pl_job_service_name(j, a, sizeof a);
    CHECK(valid_name(a, 0) && !strncmp(a, "team-a-", 7) && strstr(a, "-coordinator"));
    pl_job_label_value(j, a, sizeof a);
    CHECK(!strcmp(a, "team.a"));
    pl_job_secret_name(j, b, sizeof b);
    CHECK(valid_name(b, 0) && strcmp(b, "team-a-pliant") != 0); /* not job team-a's */
    cJSON_Delete(j);
    j = job_object("9lives");
    pl_job_service_name(j, a, sizeof a);
    CHECK(valid_name(a, 0) && a[0] >= 'a' && a[0] <= 'z');
    pl_job_secret_name(j, a, sizeof a);
    CHECK(!strcmp(a, "9lives-pliant"));
    cJSON_Delete(j);
}

/* A Secret of the job's name is reused only when it names this job (its uid) as owner. */
static void test_owns(void)
{
    cJSON *job = job_object("t");
    static const struct {
        const char *refs;
        int owned;
    } cases[] = {
        {"[{\"kind\": \"TrainingJob\", \"name\": \"t\", \"uid\": \"uid-1\", \"controller\": true}]", 1},
        {"[{\"kind\": \"Deployment\", \"name\": \"d\", \"uid\": \"u\"},"
         " {\"kind\": \"TrainingJob\", \"name\": \"t\", \"uid\": \"uid-1\"}]", 1},
        {"[{\"kind\": \"TrainingJob\", \"name\": \"t\", \"uid\": \"uid-0\"}]", 0}, /* an earlier t */
        {"[{\"kind\": \"ConfigMap\", \"name\": \"t\", \"uid\": \"uid-1\"}]", 0},
        {"[{\"kind\": \"TrainingJob\", \"name\": \"t\"}]", 0},
        {"[]", 0},
        {"null", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"metadata\": {\"name\": \"t-pliant\", \"ownerReferences\": %s}}",
                 cases[i].refs);
        cJSON *secret = cJSON_Parse(text);
        CHECK(secret);
        CHECK_EQ_INT(pl_job_owns(job, secret), cases[i].owned);
        cJSON_Delete(secret);
    }
    cJSON *plain = cJSON_Parse("{\"metadata\": {\"name\": \"t-pliant\"}}");
    CHECK_EQ_INT(pl_job_owns(job, plain), 0);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(job, "metadata"), "uid");
    cJSON *owned = cJSON_Parse("{\"metadata\": {\"ownerReferences\": [{\"kind\": \"TrainingJob\", \"uid\": \"\"}]}}");
    CHECK_EQ_INT(pl_job_owns(job, owned), 0); /* no uid: nothing is this job's */
    cJSON_Delete(owned);
    cJSON_Delete(plain);
    cJSON_Delete(job);
}

static void test_owner_name(void)
{
    cJSON *pod = cJSON_Parse("{\"metadata\": {\"labels\": {\"pliant.dev/job\": \"cut-1234abcd\"},"
                             " \"ownerReferences\": [{\"kind\": \"ReplicaSet\", \"name\": \"x\","
                             " \"controller\": false}, {\"kind\": \"TrainingJob\", \"name\":"
                             " \"the-whole-name\", \"controller\": true}]}}");
    CHECK(pod && !strcmp(pl_job_owner_name(pod), "the-whole-name"));
    cJSON_Delete(pod);
    pod = cJSON_Parse("{\"metadata\": {\"labels\": {\"pliant.dev/job\": \"short\"}}}");
    CHECK(pod && !strcmp(pl_job_owner_name(pod), "short"));
    cJSON_Delete(pod);
    pod = cJSON_Parse("{\"metadata\": {}}");
    CHECK(pod && !pl_job_owner_name(pod));
    cJSON_Delete(pod);
}

static void test_service_slice_policy(void)
{
    pl_job spec;
    pl_job_objects o;
    cJSON *j = fixture(&spec, "", &o);
    CHECK(j);
    cJSON *svc = pl_job_service(&o, 8443);
    CHECK(!cJSON_GetObjectItem(cJSON_GetObjectItem(svc, "spec"), "selector"));
    const cJSON *port = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(svc, "spec"),
                                                               "ports"), 0);
    CHECK(!strcmp(pl_kube_field(port, "name"), PL_CONTROL_PORT_NAME));
    cJSON *slice = pl_job_endpoint_slice(&o, "10.1.2.3", 8443);
    CHECK(!strcmp(pl_kube_field(slice, "apiVersion"), "discovery.k8s.io/v1"));
    CHECK(!strcmp(pl_kube_field(slice, "metadata.name"), pl_kube_field(svc, "metadata.name")));
    CHECK(!strcmp(pl_kube_field(slice, "metadata.namespace"), "training"));
    const cJSON *labels = cJSON_GetObjectItem(cJSON_GetObjectItem(slice, "metadata"), "labels");
    CHECK(!strcmp(cJSON_GetObjectItem(labels, "kubernetes.io/service-name")->valuestring,
                  "basic-coordinator"));
    CHECK(cJSON_GetObjectItem(labels, "endpointslice.kubernetes.io/managed-by"));
    CHECK(!strcmp(pl_kube_field(slice, "addressType"), "IPv4"));
    const cJSON *ep = cJSON_GetArrayItem(cJSON_GetObjectItem(slice, "endpoints"), 0);
    CHECK(!strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(ep, "addresses"), 0)->valuestring,
                  "10.1.2.3"));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(ep, "conditions"), "ready")));
    const cJSON *sp = cJSON_GetArrayItem(cJSON_GetObjectItem(slice, "ports"), 0);
    CHECK(!strcmp(pl_kube_field(sp, "name"), PL_CONTROL_PORT_NAME));
    CHECK_EQ_INT(cJSON_GetObjectItem(sp, "port")->valueint, 8443);
    cJSON_Delete(slice);
    slice = pl_job_endpoint_slice(&o, "fd00::1", 8443);
    CHECK(!strcmp(pl_kube_field(slice, "addressType"), "IPv6"));
    cJSON_Delete(slice);
    cJSON_Delete(svc);

    cJSON *np = pl_job_network_policy(&o, "pliant-system");
    const cJSON *nps = cJSON_GetObjectItem(np, "spec");
    const cJSON *sel = cJSON_GetObjectItem(cJSON_GetObjectItem(nps, "podSelector"), "matchLabels");
    CHECK(!strcmp(cJSON_GetObjectItem(sel, PL_JOB_LABEL)->valuestring, "basic"));
    CHECK(!strcmp(cJSON_GetObjectItem(sel, "app.kubernetes.io/name")->valuestring, PL_WORKER_LABEL));
    const cJSON *ingress = cJSON_GetObjectItem(nps, "ingress");
    CHECK_EQ_INT(cJSON_GetArraySize(ingress), 2);
    const cJSON *peer = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ingress, 0), "from"), 0);
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(peer, "podSelector"),
                                                          "matchLabels"), PL_JOB_LABEL)->valuestring,
                  "basic"));
    CHECK(!cJSON_GetObjectItem(cJSON_GetArrayItem(ingress, 0), "ports")); /* NCCL's ports too */
    const cJSON *op = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ingress, 1), "from"), 0);
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(op, "namespaceSelector"),
                                                          "matchLabels"),
                                      "kubernetes.io/metadata.name")->valuestring, "pliant-system"));
    cJSON_Delete(np);
    cJSON_Delete(j);
    pl_job_free(&spec);
}

/* The default Pod: the Secret's worker files only, restricted security, no token. */
static void test_default_pod(void)
{
    pl_job spec;
    pl_job_objects o;
    cJSON *j = fixture(&spec, "", &o);
    CHECK(j);
    cJSON *pod = pl_job_pod(&o, 0);
    const cJSON *ps = cJSON_GetObjectItem(pod, "spec");
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(ps, "automountServiceAccountToken")));
    CHECK(!cJSON_GetObjectItem(ps, "affinity"));
    const cJSON *psc = cJSON_GetObjectItem(ps, "securityContext");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(psc, "runAsNonRoot")));
    CHECK_EQ_INT(cJSON_GetObjectItem(psc, "runAsUser")->valueint, 65532);
    CHECK_EQ_INT(cJSON_GetObjectItem(psc, "fsGroup")->valueint, 65532);
    CHECK(!strcmp(pl_kube_field(psc, "seccompProfile.type"), "RuntimeDefault"));
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(ps, "containers"), 0);
    const cJSON *sc = cJSON_GetObjectItem(c, "securityContext");
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(sc, "allowPrivilegeEscalation")));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(sc, "readOnlyRootFilesystem")));
    CHECK(!strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(sc, "capabilities"),
                                                         "drop"), 0)->valuestring, "ALL"));
    const cJSON *lim = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "resources"), "limits");
    CHECK(!strcmp(cJSON_GetObjectItem(lim, "nvidia.com/gpu")->valuestring, "1"));
    const cJSON *vols = cJSON_GetObjectItem(ps, "volumes"), *mounts = cJSON_GetObjectItem(c, "volumeMounts");
    const cJSON *m = find(mounts, "mountPath", PL_SECRET_MOUNT);
    CHECK(m && cJSON_IsTrue(cJSON_GetObjectItem(m, "readOnly")));
    const cJSON *sv = cJSON_GetObjectItem(find(vols, "name", pl_kube_field(m, "name")), "secret");
    CHECK(sv && !strcmp(pl_kube_field(sv, "secretName"), "basic-pliant"));
    CHECK_EQ_INT(cJSON_GetObjectItem(sv, "defaultMode")->valueint, 0440);
    const cJSON *items = cJSON_GetObjectItem(sv, "items");
    CHECK_EQ_INT(cJSON_GetArraySize(items), 3);
    CHECK(find(items, "key", "token") && find(items, "key", "ca.crt") && find(items, "key", "job.yaml"));
    CHECK(!find(items, "key", "tls.key")); /* the coordinator's key stays out */
    const cJSON *tmp = find(mounts, "mountPath", "/tmp");
    CHECK(tmp && cJSON_GetObjectItem(find(vols, "name", pl_kube_field(tmp, "name")), "emptyDir"));
    const cJSON *env = cJSON_GetObjectItem(c, "env");
    CHECK(!strcmp(pl_kube_field(find(env, "name", "PLIANT_COORDINATOR"), "value"),
                  "basic-coordinator.training.svc:8443"));
    /* the worker checks the coordinator's certificate: the Secret's ca.crt, mounted */
    CHECK(!strcmp(pl_kube_field(find(env, "name", "PLIANT_CA"), "value"), PL_SECRET_MOUNT "/ca.crt"));
    CHECK(!find(env, "name", "PLIANT_INSECURE"));
    /* the Pod's grace period (the default), for the worker's `leaving` */
    CHECK(!strcmp(pl_kube_field(find(env, "name", "PLIANT_GRACE_SECONDS"), "value"), "30"));
    CHECK(!strcmp(pl_kube_field(pod, "metadata.name"), "basic-w0"));
    cJSON_Delete(pod);
    cJSON_Delete(j);
    pl_job_free(&spec);
}

#define WORKER                                                                                  \
    "  checkpoint: {dir: /ckpt}\n"                                                              \
    "  worker:\n"                                                                               \
    "    labels: {kueue.x-k8s.io/queue-name: gpu, app.kubernetes.io/name: mine, pliant.dev/job: x}\n" \
    "    annotations: {karpenter.sh/do-not-disrupt: 'true'}\n"                                   \
    "    imagePullSecrets: [{name: regcred}]\n"                                                 \
    "    serviceAccountName: trainer\n"                                                         \
    "    automountServiceAccountToken: true\n"                                                  \
    "    schedulerName: volcano\n"                                                              \
    "    runtimeClassName: nvidia\n"                                                            \
    "    podSecurityContext: {fsGroup: 1000}\n"                                                 \
    "    securityContext: {capabilities: {add: [IPC_LOCK]}}\n"                                  \
    "    env: [{name: PLIANT_COORDINATOR, value: evil:1}, {name: PLIANT_THREADS, value: '2'}]\n" \
    "    volumes: [{name: ckpt, persistentVolumeClaim: {claimName: ckpt}},\n"                  \
    "              {name: pliant-job, emptyDir: {}}]\n"                                         \
    "    volumeMounts: [{name: ckpt, mountPath: /ckpt}, {name: x, mountPath: /etc/pliant}]\n"  \
    "    affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution:\n"         \
    "      {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [a]}]},\n" \
    "                           {matchExpressions: [{key: pool, operator: In, values: [b]}]}]}}}\n"

/* spec.worker merged in: the user's fields where a Pod has them, the operator's
 * labels, env, volumes and mounts winning; nodes cooling down kept out. */
static void test_merged_pod(void)
{
    pl_job spec;
    pl_job_objects o;
    char err[256];
    cJSON *j = fixture(&spec, WORKER, &o);
    CHECK(j);
    const char *avoid[] = {"node-1", "node-7"};
    o.avoid = avoid;
    o.navoid = 2;
    cJSON *pod = pl_job_pod(&o, 3);
    const cJSON *md = cJSON_GetObjectItem(pod, "metadata"), *labels = cJSON_GetObjectItem(md, "labels");
    CHECK(!strcmp(cJSON_GetObjectItem(labels, "kueue.x-k8s.io/queue-name")->valuestring, "gpu"));
    CHECK(!strcmp(cJSON_GetObjectItem(labels, "app.kubernetes.io/name")->valuestring, PL_WORKER_LABEL));
    CHECK(!strcmp(cJSON_GetObjectItem(labels, PL_JOB_LABEL)->valuestring, "basic"));
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(md, "annotations"),
                                      "karpenter.sh/do-not-disrupt")->valuestring, "true"));
    const cJSON *ps = cJSON_GetObjectItem(pod, "spec");
    CHECK(!strcmp(pl_kube_field(ps, "serviceAccountName"), "trainer"));
    CHECK(!strcmp(pl_kube_field(ps, "schedulerName"), "volcano"));
    CHECK(!strcmp(pl_kube_field(ps, "runtimeClassName"), "nvidia"));
    CHECK(!strcmp(pl_kube_field(cJSON_GetArrayItem(cJSON_GetObjectItem(ps, "imagePullSecrets"), 0),
                                "name"), "regcred"));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(ps, "automountServiceAccountToken")));
    const cJSON *psc = cJSON_GetObjectItem(ps, "securityContext");
    CHECK_EQ_INT(cJSON_GetObjectItem(psc, "fsGroup")->valueint, 1000);  /* the user's */
    CHECK_EQ_INT(cJSON_GetObjectItem(psc, "runAsUser")->valueint, 65532); /* the default */
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(ps, "containers"), 0);
    const cJSON *sc = cJSON_GetObjectItem(c, "securityContext");
    CHECK(!strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(sc, "capabilities"),
                                                         "add"), 0)->valuestring, "IPC_LOCK"));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(sc, "readOnlyRootFilesystem")));
    const cJSON *env = cJSON_GetObjectItem(c, "env"), *e;
    int coordinators = 0;
    cJSON_ArrayForEach(e, env) coordinators += !strcmp(pl_kube_field(e, "name"), "PLIANT_COORDINATOR");
    CHECK_EQ_INT(coordinators, 1);
    CHECK(!strcmp(pl_kube_field(find(env, "name", "PLIANT_COORDINATOR"), "value"), o.coordinator));
    CHECK(!strcmp(pl_kube_field(find(env, "name", "PLIANT_THREADS"), "value"), "2"));
    /* the checkpoint PVC at checkpoint.dir; the user's pliant-job volume and
     * /etc/pliant mount are dropped */
    const cJSON *vols = cJSON_GetObjectItem(ps, "volumes"), *mounts = cJSON_GetObjectItem(c, "volumeMounts");
    CHECK(!strcmp(pl_kube_field(find(vols, "name", "ckpt"), "persistentVolumeClaim.claimName"), "ckpt"));
    CHECK(!strcmp(pl_kube_field(find(mounts, "mountPath", spec.checkpoint.dir), "name"), "ckpt"));
    CHECK(cJSON_GetObjectItem(find(vols, "name", "pliant-job"), "secret"));
    int secrets = 0;
    cJSON_ArrayForEach(e, vols) secrets += !strcmp(pl_kube_field(e, "name"), "pliant-job");
    CHECK_EQ_INT(secrets, 1);
    CHECK(!strcmp(pl_kube_field(find(mounts, "mountPath", PL_SECRET_MOUNT), "name"), "pliant-job"));
    CHECK(!find(mounts, "name", "x"));
    /* every required term excludes the nodes cooling down */
    const cJSON *terms = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(ps, "affinity"), "nodeAffinity"),
                            "requiredDuringSchedulingIgnoredDuringExecution"),
        "nodeSelectorTerms"), *t;
    CHECK_EQ_INT(cJSON_GetArraySize(terms), 2);
    cJSON_ArrayForEach(t, terms)
    {
        const cJSON *x = find(cJSON_GetObjectItem(t, "matchExpressions"), "operator", "NotIn");
        CHECK(x && !strcmp(pl_kube_field(x, "key"), "kubernetes.io/hostname"));
        CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(x, "values")), 2);
        CHECK(find(cJSON_GetObjectItem(t, "matchExpressions"), "key", "pool"));
    }
    cJSON_Delete(pod);
    /* without affinity of the user's: one term of the exclusion */
    pl_job plain;
    CHECK_EQ_INT(pl_job_parse(HEAD, NULL, &plain, err, sizeof err), 0);
    o.spec = &plain;
    o.navoid = 1;
    pod = pl_job_pod(&o, 0);
    terms = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetObjectItem(pod, "spec"), "affinity"), "nodeAffinity"),
        "requiredDuringSchedulingIgnoredDuringExecution"), "nodeSelectorTerms");
    CHECK_EQ_INT(cJSON_GetArraySize(terms), 1);
    cJSON_Delete(pod);
    pl_job_free(&plain);
    cJSON_Delete(j);
    pl_job_free(&spec);
}

/* A user's mount at /tmp replaces the operator's emptyDir. */
static void test_user_tmp(void)
{
    pl_job spec;
    pl_job_objects o;
    cJSON *j = fixture(&spec, "  worker: {volumes: [{name: scratch, emptyDir: {medium: Memory}}],\n"
                              "           volumeMounts: [{name: scratch, mountPath: /tmp}]}\n", &o);
    CHECK(j);
    cJSON *pod = pl_job_pod(&o, 0);
    const cJSON *ps = cJSON_GetObjectItem(pod, "spec");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(ps, "containers"), 0), *m;
    int tmps = 0;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "volumeMounts"))
        tmps += !strcmp(pl_kube_field(m, "mountPath"), "/tmp");
    CHECK_EQ_INT(tmps, 1);
    CHECK(!strcmp(pl_kube_field(find(cJSON_GetObjectItem(c, "volumeMounts"), "mountPath", "/tmp"), "name"),
                  "scratch"));
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(ps, "volumes")), 2);
    cJSON_Delete(pod);
    cJSON_Delete(j);
    pl_job_free(&spec);
}

static void test_policy(void)
{
    CHECK_EQ_INT(pl_replacement_backoff_ms(0), 0);
    CHECK_EQ_INT(pl_replacement_backoff_ms(1), 10000);
    CHECK_EQ_INT(pl_replacement_backoff_ms(2), 20000);
    CHECK_EQ_INT(pl_replacement_backoff_ms(5), 160000);
    CHECK_EQ_INT(pl_replacement_backoff_ms(6), 300000);
    CHECK_EQ_INT(pl_replacement_backoff_ms(60), 300000);
    CHECK_EQ_INT(pl_failure_streak(0, -1), 1);
    CHECK_EQ_INT(pl_failure_streak(3, 1000), 4);
    CHECK_EQ_INT(pl_failure_streak(3, 2 * PL_BACKOFF_MAX_MS + 1), 1);
    CHECK(!pl_backoff_limit_exceeded(5, -1));
    CHECK(!pl_backoff_limit_exceeded(0, 0));
    CHECK(pl_backoff_limit_exceeded(1, 0));
    CHECK(!pl_backoff_limit_exceeded(2, 2) && pl_backoff_limit_exceeded(3, 2));
    int ks[] = {4, 9, 1, 7, 3}, del[5];
    int n = pl_finished_to_delete(ks, 5, del);
    CHECK_EQ_INT(n, 2);
    CHECK((del[0] == 3 && del[1] == 1) || (del[0] == 1 && del[1] == 3));
    CHECK_EQ_INT(pl_finished_to_delete(ks, 3, del), 0);
    CHECK(pl_rfc3339_to_now_ms("garbage", 1000) == PL_NO_TIME);
    char now[32];
    pl_rfc3339_now(now, sizeof now);
    int64_t t = pl_rfc3339_to_now_ms(now, 50000);
    CHECK(t <= 50000 && t > 50000 - 2000);
    CHECK_EQ_INT(pl_rfc3339_to_now_ms("2020-01-01T00:00:10Z", 0) -
                     pl_rfc3339_to_now_ms("2020-01-01T00:00:00Z", 0), 10000);
}

/* spec.runPolicy is read from the object as it is now: suspend set on a running job */
static void test_run_policy_fields(void)
{
    cJSON *tj = cJSON_Parse("{\"spec\":{\"steps\":5}}");
    CHECK(pl_run_policy_int(tj, "suspend") == -1 && pl_run_policy_int(NULL, "suspend") == -1);
    CHECK(!strcmp(pl_run_policy_str(tj, "cleanPodPolicy", "Running"), "Running"));
    cJSON_AddItemToObject(cJSON_GetObjectItem(tj, "spec"), "runPolicy",
                          cJSON_Parse("{\"suspend\":true,\"backoffLimit\":2,"
                                      "\"cleanPodPolicy\":\"All\"}"));
    CHECK(pl_run_policy_int(tj, "suspend") == 1 && pl_run_policy_int(tj, "backoffLimit") == 2);
    CHECK(!strcmp(pl_run_policy_str(tj, "cleanPodPolicy", "Running"), "All"));
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "spec"), "runPolicy"),
                              "suspend", cJSON_CreateFalse());
    CHECK(pl_run_policy_int(tj, "suspend") == 0);
    CHECK(pl_run_policy_int(tj, "activeDeadlineSeconds") == -1);
    cJSON_Delete(tj);
}

TEST_MAIN_BEGIN
RUN(test_short_names);
RUN(test_owner_name);
RUN(test_owns);
RUN(test_service_slice_policy);
RUN(test_default_pod);
RUN(test_merged_pod);
RUN(test_user_tmp);
RUN(test_policy);
RUN(test_run_policy_fields);
TEST_MAIN_END
