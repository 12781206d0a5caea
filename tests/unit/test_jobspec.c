/* TrainingJob manifests: defaults, presets, YAML and JSON input, every
 * validation error (by field path), and the example manifests. */
#include <stdint.h>
#include <stdlib.h>

#include <cJSON.h>

#include "check.h"
#include "jobspec.h"
#include "util.h"

#define HEAD "apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: t\nspec:\n"
#define DATA "  data:\n    train: a.bin\n"
#define BATCH "  batch:\n    global: 64\n    micro: 4\n    seqLen: 128\n"
#define STEPS "  steps: 10\n"
#define MINIMAL HEAD DATA BATCH STEPS
#define X16 "xxxxxxxxxxxxxxxx"
#define NAME64 X16 X16 X16 X16                                   /* 64 characters */
#define NAME253 NAME64 NAME64 NAME64 X16 X16 X16 "xxxxxxxxxxxxx" /* 253 */
#define NAME254 NAME253 "x"

static char err_[1024];

/* Parses text that must fail; returns the error. */
static const char *fails(const char *text)
{
    pl_job job;
    err_[0] = '\0';
    if (pl_job_parse(text, NULL, &job, err_, sizeof err_) == 0) {
        pl_job_free(&job);
        return "(parsed without error)";
    }
    if (job.worker_json || job.run_policy_json) return "(error left JSON allocated)";
    pl_job_free(&job);
    return err_;
}

static void test_defaults(void)
{
    pl_job job;
    char err[256];
    CHECK_EQ_INT(pl_job_parse(MINIMAL, NULL, &job, err, sizeof err), 0);
    CHECK(strcmp(job.name, "t") == 0);
    CHECK(strcmp(job.namespace_, "") == 0);
    CHECK(strcmp(job.model.preset, "gpt2-tiny") == 0);
    CHECK_EQ_INT(job.model.layers, 4);
    CHECK_EQ_INT(job.model.channels, 128);
    CHECK_EQ_INT(job.model.heads, 4);
    CHECK_EQ_INT(job.model.vocab_size, 256);
    CHECK_EQ_INT(job.model.max_seq_len, 256);
    CHECK_EQ_INT(job.model.init, PL_INIT_RANDOM);
    CHECK(job.model.init_path[0] == '\0');
    CHECK_EQ_INT(job.model.seed, 1337);
    CHECK(strcmp(job.data.train, "a.bin") == 0);
    CHECK(job.data.val[0] == '\0');
    CHECK_EQ_INT(job.data.order, PL_ORDER_SHUFFLED);
    CHECK_EQ_INT(job.data.seed, 42);
    CHECK_EQ_INT(job.batch.global, 64);
    CHECK_EQ_INT(job.batch.micro, 4);
    CHECK_EQ_INT(job.batch.seq_len, 128);
    CHECK(job.optimizer.lr == 3.0e-4);
    CHECK_EQ_INT(job.optimizer.schedule, PL_SCHEDULE_COSINE);
    CHECK_EQ_INT(job.optimizer.warmup_steps, 10);
    CHECK(job.optimizer.min_lr_ratio == 0.1);
    CHECK(job.optimizer.beta1 == 0.9);
    CHECK(job.optimizer.beta2 == 0.95);
    CHECK(job.optimizer.eps == 1.0e-8);
    CHECK(job.optimizer.weight_decay == 0.1);
    CHECK(job.optimizer.grad_clip == 1.0);
    CHECK_EQ_INT(job.steps, 10);
    CHECK_EQ_INT(job.eval_every, 50);
    CHECK_EQ_INT(job.eval_batches, 8);
    CHECK(job.checkpoint.dir[0] == '\0');
    CHECK_EQ_INT(job.checkpoint.every, 100);
    CHECK_EQ_INT(job.checkpoint.resume, PL_RESUME_AUTO);
    CHECK_EQ_INT(job.checkpoint.keep, 0); /* every checkpoint kept */
    CHECK_EQ_INT(job.fault_tolerance.strategy, PL_STRATEGY_TEMPLATES);
    CHECK_EQ_INT(job.fault_tolerance.redundant_forward, PL_FRC_LAZY);
    CHECK_EQ_INT(job.fault_tolerance.tolerate, 1);
    CHECK_EQ_INT(job.fault_tolerance.max_resets, 100);
    CHECK_EQ_INT(job.fault_tolerance.hosts_added_check_every, 1);
    CHECK(job.fault_tolerance.heartbeat_seconds == 3.0);
    CHECK(job.fault_tolerance.step_timeout_seconds == 0.0);
    CHECK(job.fault_tolerance.wait_for_nodes_timeout_seconds == 600.0);
    CHECK_EQ_INT(job.nodes.min, 1);
    CHECK_EQ_INT(job.nodes.max, 0);
    CHECK_EQ_INT(job.nodes.gpus_per_node, 1);
    CHECK(strcmp(job.profile, "auto") == 0);
    CHECK(job.worker_json == NULL);
    CHECK(job.run_policy_json == NULL);
    pl_job_free(&job);
    pl_job_free(&job); /* twice is harmless */
}

static void test_every_field(void)
{
    const char *text = "apiVersion: pliant.dev/v1alpha1\n"
                       "kind: TrainingJob\n"
                       "metadata: {name: every-field, namespace: ml, labels: {team: a}}\n"
                       "spec:\n"
                       "  model: {preset: gpt2-d6, init: 'checkpoint:/ck/step-100', seed: 18446744073709551615}\n"
                       "  data: {train: /d/tr*.bin, val: /d/va*.bin, order: sequential, seed: 0}\n"
                       "  batch: {global: 12, micro: 3, seqLen: 1024}\n"
                       "  optimizer: {lr: 6e-4, schedule: constant, warmupSteps: 0, minLrRatio: 0,\n"
                       "              beta1: 0, beta2: 0.999, eps: 1.0e-6, weightDecay: 0, gradClip: 0}\n"
                       "  steps: 1\n"
                       "  evalEvery: 0\n"
                       "  evalBatches: 1\n"
                       "  checkpoint: {dir: /ck, every: 0, resume: never, keep: 3}\n"
                       "  faultTolerance: {strategy: checkpoint, tolerate: 0, maxResets: 0,\n"
                       "                   hostsAddedCheckEvery: 5, heartbeatSeconds: 0.5,\n"
                       "                   stepTimeoutSeconds: 90,\n"
                       "                   waitForNodesTimeoutSeconds: 0}\n"
                       "  nodes: {min: 2, max: 2, gpusPerNode: 8}\n"
                       "  profile: /p/prof.json\n";
    pl_job job;
    char err[256];
    int rc = pl_job_parse(text, "/base", &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(job.name, "every-field") == 0);
    CHECK(strcmp(job.namespace_, "ml") == 0);
    CHECK(strcmp(job.model.preset, "gpt2-d6") == 0);
    CHECK_EQ_INT(job.model.layers, 6);
    CHECK_EQ_INT(job.model.channels, 384);
    CHECK_EQ_INT(job.model.heads, 6);
    CHECK_EQ_INT(job.model.vocab_size, 50257);
    CHECK_EQ_INT(job.model.max_seq_len, 1024);
    CHECK_EQ_INT(job.model.init, PL_INIT_CHECKPOINT);
    CHECK(strcmp(job.model.init_path, "/ck/step-100") == 0);
    CHECK(job.model.seed == UINT64_MAX);
    CHECK(strcmp(job.data.train, "/d/tr*.bin") == 0);
    CHECK(strcmp(job.data.val, "/d/va*.bin") == 0);
    CHECK_EQ_INT(job.data.order, PL_ORDER_SEQUENTIAL);
    CHECK_EQ_INT(job.data.seed, 0);
    CHECK_EQ_INT(job.batch.global, 12);
    CHECK_EQ_INT(job.batch.micro, 3);
    CHECK_EQ_INT(job.batch.seq_len, 1024);
    CHECK(job.optimizer.lr == 6e-4);
    CHECK_EQ_INT(job.optimizer.schedule, PL_SCHEDULE_CONSTANT);
    CHECK_EQ_INT(job.optimizer.warmup_steps, 0);
    CHECK(job.optimizer.min_lr_ratio == 0);
    CHECK(job.optimizer.beta1 == 0);
    CHECK(job.optimizer.beta2 == 0.999);
    CHECK(job.optimizer.eps == 1.0e-6);
    CHECK(job.optimizer.weight_decay == 0);
    CHECK(job.optimizer.grad_clip == 0);
    CHECK_EQ_INT(job.steps, 1);
    CHECK_EQ_INT(job.eval_every, 0);
    CHECK_EQ_INT(job.eval_batches, 1);
    CHECK(strcmp(job.checkpoint.dir, "/ck") == 0);
    CHECK_EQ_INT(job.checkpoint.every, 0);
    CHECK_EQ_INT(job.checkpoint.resume, PL_RESUME_NEVER);
    CHECK_EQ_INT(job.checkpoint.keep, 3);
    CHECK_EQ_INT(job.fault_tolerance.strategy, PL_STRATEGY_CHECKPOINT);
    CHECK_EQ_INT(job.fault_tolerance.tolerate, 0);
    CHECK_EQ_INT(job.fault_tolerance.max_resets, 0);
    CHECK_EQ_INT(job.fault_tolerance.hosts_added_check_every, 5);
    CHECK(job.fault_tolerance.heartbeat_seconds == 0.5);
    CHECK(job.fault_tolerance.step_timeout_seconds == 90.0);
    CHECK(job.fault_tolerance.wait_for_nodes_timeout_seconds == 0);
    CHECK_EQ_INT(job.nodes.min, 2);
    CHECK_EQ_INT(job.nodes.max, 2);
    CHECK_EQ_INT(job.nodes.gpus_per_node, 8);
    CHECK(strcmp(job.profile, "/p/prof.json") == 0);
    pl_job_free(&job);
}

/* strategy redundant and its FRC mode (docs/redundant.md). */
static void test_redundant(void)
{
    pl_job job;
    char err[256];
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  faultTolerance: {strategy: redundant}\n", NULL, &job, err,
                              sizeof err), 0);
    CHECK_EQ_INT(job.fault_tolerance.strategy, PL_STRATEGY_REDUNDANT);
    CHECK_EQ_INT(job.fault_tolerance.redundant_forward, PL_FRC_LAZY);
    pl_job_free(&job);
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  faultTolerance: {strategy: redundant, redundantForward: eager}\n",
                              NULL, &job, err, sizeof err), 0);
    CHECK_EQ_INT(job.fault_tolerance.strategy, PL_STRATEGY_REDUNDANT);
    CHECK_EQ_INT(job.fault_tolerance.redundant_forward, PL_FRC_EAGER);
    CHECK(!job.checkpoint.dir[0]); /* no checkpoint directory required */
    CHECK_EQ_INT(job.fault_tolerance.below_minimum, PL_BELOW_MIN_WAIT);
    pl_job_free(&job);
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  faultTolerance: {belowMinimum: degrade}\n", NULL, &job,
                              err, sizeof err), 0);
    CHECK_EQ_INT(job.fault_tolerance.below_minimum, PL_BELOW_MIN_DEGRADE);
    pl_job_free(&job);
}

static void test_presets(void)
{
    static const struct {
        const char *name;
        int L, C, NH, V, T;
    } want[] = {
        {"gpt2-tiny", 4, 128, 4, 256, 256},        {"gpt2-d6", 6, 384, 6, 50257, 1024},
        {"gpt2-124m", 12, 768, 12, 50257, 1024},   {"gpt2-350m", 24, 1024, 16, 50257, 1024},
        {"gpt2-774m", 36, 1280, 20, 50257, 1024}, {"gpt2-1558m", 48, 1600, 25, 50257, 1024},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        pl_model_spec m;
        memset(&m, 0, sizeof m);
        CHECK_EQ_INT(pl_model_preset(want[i].name, &m), 0);
        CHECK(strcmp(m.preset, want[i].name) == 0);
        CHECK_EQ_INT(m.layers, want[i].L);
        CHECK_EQ_INT(m.channels, want[i].C);
        CHECK_EQ_INT(m.heads, want[i].NH);
        CHECK_EQ_INT(m.vocab_size, want[i].V);
        CHECK_EQ_INT(m.max_seq_len, want[i].T);
    }
    pl_model_spec m;
    memset(&m, 0, sizeof m);
    CHECK_EQ_INT(pl_model_preset("gpt2-xl", &m), -1);
    CHECK_EQ_INT(pl_model_preset("GPT2-124M", &m), -1);
    CHECK_EQ_INT(pl_model_preset(NULL, &m), -1);
    CHECK_EQ_INT(m.layers, 0);
}

static void test_preset_overrides(void)
{
    pl_job job;
    char err[256];
    const char *text = MINIMAL "  model:\n    preset: gpt2-124m\n    layers: 2\n    maxSeqLen: 512\n";
    CHECK_EQ_INT(pl_job_parse(text, NULL, &job, err, sizeof err), 0);
    CHECK(strcmp(job.model.preset, "gpt2-124m") == 0);
    CHECK_EQ_INT(job.model.layers, 2);
    CHECK_EQ_INT(job.model.channels, 768);
    CHECK_EQ_INT(job.model.heads, 12);
    CHECK_EQ_INT(job.model.vocab_size, 50257);
    CHECK_EQ_INT(job.model.max_seq_len, 512);
    pl_job_free(&job);

    /* Sizes without a preset override gpt2-tiny's. */
    text = MINIMAL "  model:\n    channels: 96\n    heads: 3\n";
    CHECK_EQ_INT(pl_job_parse(text, NULL, &job, err, sizeof err), 0);
    CHECK(strcmp(job.model.preset, "gpt2-tiny") == 0);
    CHECK_EQ_INT(job.model.layers, 4);
    CHECK_EQ_INT(job.model.channels, 96);
    CHECK_EQ_INT(job.model.heads, 3);
    CHECK_EQ_INT(job.model.vocab_size, 256);
    pl_job_free(&job);

    /* Preset wins over order: sizes written before the preset still override it. */
    text = MINIMAL "  model:\n    layers: 3\n    preset: gpt2-350m\n";
    CHECK_EQ_INT(pl_job_parse(text, NULL, &job, err, sizeof err), 0);
    CHECK_EQ_INT(job.model.layers, 3);
    CHECK_EQ_INT(job.model.channels, 1024);
    pl_job_free(&job);
}

static void test_json_input(void)
{
    const char *json = "{\"apiVersion\": \"pliant.dev/v1alpha1\", \"kind\": \"TrainingJob\",\n"
                       " \"metadata\": {\"name\": \"from-json\"},\n"
                       " \"spec\": {\"model\": {\"preset\": \"gpt2-124m\", \"layers\": 2},\n"
                       "\t\"data\": {\"train\": \"x.bin\", \"val\": \"v.bin\"},\n"
                       "\t\"batch\": {\"global\": 64, \"micro\": 4, \"seqLen\": 128},\n"
                       "\t\"optimizer\": {\"lr\": 1e-3, \"beta2\": 0.99},\n"
                       "\t\"steps\": 10,\n"
                       "\t\"worker\": {\"image\": \"img:1\", \"env\": [{\"name\": \"A\", \"value\": \"1\"}]},\n"
                       "\t\"runPolicy\": {\"suspend\": true, \"cleanPodPolicy\": \"None\"}}}";
    pl_job job;
    char err[256];
    int rc = pl_job_parse(json, "base", &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(job.name, "from-json") == 0);
    CHECK_EQ_INT(job.model.layers, 2);
    CHECK_EQ_INT(job.model.channels, 768);
    CHECK(strcmp(job.data.train, "base/x.bin") == 0);
    CHECK(strcmp(job.data.val, "base/v.bin") == 0);
    CHECK(job.optimizer.lr == 1e-3);
    CHECK(job.optimizer.beta2 == 0.99);
    CHECK(job.worker_json != NULL);
    cJSON *w = cJSON_Parse(job.worker_json);
    CHECK(w != NULL);
    cJSON *img = cJSON_GetObjectItemCaseSensitive(w, "image");
    int ok = cJSON_IsString(img) && strcmp(img->valuestring, "img:1") == 0 &&
             cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(w, "env")) == 1;
    cJSON_Delete(w);
    CHECK(ok);
    CHECK(strcmp(job.run_policy_json, "{\"suspend\":true,\"cleanPodPolicy\":\"None\"}") == 0);
    pl_job_free(&job);
    CHECK(job.worker_json == NULL && job.run_policy_json == NULL);
}

static void test_worker_yaml_to_json(void)
{
    const char *text = MINIMAL "  worker:\n"
                               "    image: pliant-worker:dev\n"
                               "    resources:\n"
                               "      limits: {nvidia.com/gpu: 1, memory: 8Gi, cpu: \"4\"}\n"
                               "    nodeSelector: {spot: \"true\", zone: null}\n"
                               "    tolerations: [{key: spot, operator: Exists}]\n"
                               "    terminationGracePeriodSeconds: 25\n"
                               "  runPolicy:\n"
                               "    ttlSecondsAfterFinished: 0\n"
                               "    activeDeadlineSeconds: 3600\n";
    pl_job job;
    char err[256];
    int rc = pl_job_parse(text, NULL, &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(job.worker_json,
                 "{\"image\":\"pliant-worker:dev\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":1,"
                 "\"memory\":\"8Gi\",\"cpu\":\"4\"}},\"nodeSelector\":{\"spot\":\"true\",\"zone\":null},"
                 "\"tolerations\":[{\"key\":\"spot\",\"operator\":\"Exists\"}],"
                 "\"terminationGracePeriodSeconds\":25}") == 0);
    CHECK(strcmp(job.run_policy_json, "{\"ttlSecondsAfterFinished\":0,\"activeDeadlineSeconds\":3600}") == 0);
    pl_job_free(&job);

    CHECK_EQ_INT(pl_job_parse(MINIMAL "  worker: {}\n  runPolicy: {}\n", NULL, &job, err, sizeof err), 0);
    CHECK(strcmp(job.worker_json, "{}") == 0);
    CHECK(strcmp(job.run_policy_json, "{}") == 0);
    pl_job_free(&job);

    /* null means absent */
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  worker:\n  runPolicy: ~\n", NULL, &job, err, sizeof err), 0);
    CHECK(job.worker_json == NULL && job.run_policy_json == NULL);
    pl_job_free(&job);
}

/* metadata.name is a Kubernetes object name (253 characters, dots); the operator-only
 * fields a Pod takes from spec.worker, and runPolicy.backoffLimit, pass through. */
static void test_names_and_pod_fields(void)
{
    const char *names[] = {NAME253, "team.a.job-1", "9lives"};
    char text[4096], err[256];
    pl_job job;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(text, sizeof text,
                 "apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: '%s'}\n"
                 "spec:\n" DATA BATCH STEPS, names[i]);
        int rc = pl_job_parse(text, NULL, &job, err, sizeof err);
        if (rc) printf("    %s\n", err);
        CHECK_EQ_INT(rc, 0);
        CHECK(strcmp(job.name, names[i]) == 0);
        pl_job_free(&job);
    }
    const char *pod = MINIMAL "  worker:\n"
                              "    labels: {kueue.x-k8s.io/queue-name: gpu, empty: null}\n"
                              "    annotations: {karpenter.sh/do-not-disrupt: 'true'}\n"
                              "    imagePullSecrets: [{name: regcred}]\n"
                              "    serviceAccountName: trainer\n"
                              "    automountServiceAccountToken: true\n"
                              "    schedulerName: volcano\n"
                              "    runtimeClassName: nvidia\n"
                              "    podSecurityContext: {fsGroup: 1000}\n"
                              "    securityContext: {capabilities: {add: [IPC_LOCK]}}\n"
                              "    volumes: [{name: ckpt, persistentVolumeClaim: {claimName: ckpt}}]\n"
                              "    volumeMounts: [{name: ckpt, mountPath: /ckpt}]\n"
                              "  runPolicy: {backoffLimit: 0}\n";
    int rc = pl_job_parse(pod, NULL, &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    cJSON *w = cJSON_Parse(job.worker_json), *rp = cJSON_Parse(job.run_policy_json);
    CHECK(w && rp);
    CHECK(strcmp(cJSON_GetObjectItem(w, "serviceAccountName")->valuestring, "trainer") == 0);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(w, "automountServiceAccountToken")));
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(w, "imagePullSecrets")), 1);
    CHECK_EQ_INT(cJSON_GetObjectItem(rp, "backoffLimit")->valueint, 0);
    cJSON_Delete(w);
    cJSON_Delete(rp);
    pl_job_free(&job);
}

static void test_paths(void)
{
    const char *text = HEAD "  data: {train: tr/*.bin, val: /abs/val.bin}\n" BATCH STEPS
                            "  model: {init: 'llmc:gpt2_124M.bin'}\n"
                            "  checkpoint: {dir: ck}\n"
                            "  profile: prof.json\n";
    pl_job job;
    char err[256];
    CHECK_EQ_INT(pl_job_parse(text, "examples", &job, err, sizeof err), 0);
    CHECK(strcmp(job.data.train, "examples/tr/*.bin") == 0);
    CHECK(strcmp(job.data.val, "/abs/val.bin") == 0);
    CHECK_EQ_INT(job.model.init, PL_INIT_LLMC);
    CHECK(strcmp(job.model.init_path, "examples/gpt2_124M.bin") == 0);
    CHECK(strcmp(job.checkpoint.dir, "examples/ck") == 0);
    CHECK(strcmp(job.profile, "examples/prof.json") == 0);
    pl_job_free(&job);

    CHECK_EQ_INT(pl_job_parse(text, "/srv/jobs/", &job, err, sizeof err), 0);
    CHECK(strcmp(job.data.train, "/srv/jobs/tr/*.bin") == 0);
    pl_job_free(&job);

    /* No base (or ".") leaves paths as written. */
    CHECK_EQ_INT(pl_job_parse(text, NULL, &job, err, sizeof err), 0);
    CHECK(strcmp(job.data.train, "tr/*.bin") == 0);
    CHECK(strcmp(job.model.init_path, "gpt2_124M.bin") == 0);
    CHECK(strcmp(job.checkpoint.dir, "ck") == 0);
    CHECK(strcmp(job.profile, "prof.json") == 0);
    pl_job_free(&job);
    CHECK_EQ_INT(pl_job_parse(text, ".", &job, err, sizeof err), 0);
    CHECK(strcmp(job.data.train, "tr/*.bin") == 0);
    pl_job_free(&job);

    /* "auto" is not a path. */
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  profile: auto\n", "examples", &job, err, sizeof err), 0);
    CHECK(strcmp(job.profile, "auto") == 0);
    pl_job_free(&job);

    /* A path that overflows once the base is prepended. */
    char big[PL_PATH_MAX + 200];
    char name[PL_PATH_MAX - 4];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(big, sizeof big, HEAD "  data: {train: %s}\n" BATCH STEPS, name);
    CHECK_EQ_INT(pl_job_parse(big, NULL, &job, err, sizeof err), 0);
    pl_job_free(&job);
    CHECK_EQ_INT(pl_job_parse(big, "some/base/dir", &job, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "spec.data.train: path too long");
}

static void test_init_kinds(void)
{
    pl_job job;
    char err[256];
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  model: {init: random}\n", NULL, &job, err, sizeof err), 0);
    CHECK_EQ_INT(job.model.init, PL_INIT_RANDOM);
    pl_job_free(&job);
    CHECK_EQ_INT(pl_job_parse(MINIMAL "  model: {init: \"checkpoint:ckpt/s100\"}\n", "b", &job, err, sizeof err), 0);
    CHECK_EQ_INT(job.model.init, PL_INIT_CHECKPOINT);
    CHECK(strcmp(job.model.init_path, "b/ckpt/s100") == 0);
    pl_job_free(&job);
    CHECK_STR_CONTAINS(fails(MINIMAL "  model: {init: \"llmc:\"}\n"), "spec.model.init: llmc needs a path");
    CHECK_STR_CONTAINS(fails(MINIMAL "  model: {init: zeros}\n"),
                       "spec.model.init: must be random, llmc:PATH or checkpoint:DIR");
}

static void test_yaml_scalars(void)
{
    pl_job job;
    char err[256];
    /* Hex and octal integers, explicit tags, quoted strings, nulls as defaults. */
    const char *text = HEAD DATA "  batch: {global: 0x40, micro: 0o10, seqLen: !!int 128}\n"
                                 "  steps: +10\n"
                                 "  evalEvery: null\n"
                                 "  optimizer: {lr: !!float 1, eps: 1E-7, minLrRatio: .5}\n"
                                 "  metadataNotHere: ~\n";
    CHECK_STR_CONTAINS(fails(text), "spec.metadataNotHere: unknown field");
    const char *ok = HEAD DATA "  batch: {global: 0x40, micro: 0o10, seqLen: !!int 128}\n"
                               "  steps: +10\n"
                               "  evalEvery: null\n"
                               "  optimizer: {lr: !!float 1, eps: 1E-7, minLrRatio: .5}\n";
    int rc = pl_job_parse(ok, NULL, &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(job.batch.global, 64);
    CHECK_EQ_INT(job.batch.micro, 8);
    CHECK_EQ_INT(job.batch.seq_len, 128);
    CHECK_EQ_INT(job.steps, 10);
    CHECK_EQ_INT(job.eval_every, 50);
    CHECK(job.optimizer.lr == 1.0);
    CHECK(job.optimizer.eps == 1e-7);
    CHECK(job.optimizer.min_lr_ratio == 0.5);
    pl_job_free(&job);

    /* Block scalars and quoting produce strings. */
    CHECK_EQ_INT(pl_job_parse(HEAD "  data:\n    train: >-\n      /a/b.bin\n" BATCH STEPS, NULL, &job, err,
                              sizeof err),
                 0);
    CHECK(strcmp(job.data.train, "/a/b.bin") == 0);
    pl_job_free(&job);
    CHECK_EQ_INT(pl_job_parse(HEAD "  data:\n    train: '123'\n" BATCH STEPS, NULL, &job, err, sizeof err), 0);
    CHECK(strcmp(job.data.train, "123") == 0);
    pl_job_free(&job);
    /* An anchor alone is harmless. */
    CHECK_EQ_INT(pl_job_parse(HEAD "  data:\n    train: &t x.bin\n" BATCH STEPS, NULL, &job, err, sizeof err), 0);
    pl_job_free(&job);
}

typedef struct {
    const char *text;
    const char *want;
} err_case;

static void test_validation_errors(void)
{
    static const err_case cases[] = {
        /* document and top level */
        {"", "empty"},
        {"hello", "manifest: must be a mapping"},
        {"- a\n- b\n", "manifest: must be a mapping"},
        {"kind: TrainingJob\nmetadata: {name: t}\nspec: {}\n", "apiVersion: required"},
        {"apiVersion: v1\nkind: TrainingJob\n", "apiVersion: must be pliant.dev/v1alpha1"},
        {"apiVersion: pliant.dev/v1alpha1\nmetadata: {name: t}\n", "kind: required"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: Job\n", "kind: must be TrainingJob"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nspec: {}\n", "metadata: required"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {}\n", "metadata.name: required"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: []\n", "metadata: must be a mapping"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: t}\n", "spec: required"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: t}\nspec: 3\n",
         "spec: must be a mapping"},
        {MINIMAL "extra: 1\n", "extra: unknown field"},
        /* metadata.name */
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: Big}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: -a}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a-}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a..b}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a.-b}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a.}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a_b}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: ''}\n", "metadata.name: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: 12}\n",
         "metadata.name: must be a string"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " NAME254 "\n",
         "metadata.name: too long (at most 253 bytes)"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: t, namespace: a.b}\n",
         "metadata.namespace: must be"},
        {"apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: t, namespace: Ns}\n",
         "metadata.namespace: must be"},
        /* required */
        {HEAD BATCH STEPS, "spec.data: required"},
        {HEAD "  data: {val: v.bin}\n" BATCH STEPS, "spec.data.train: required"},
        {HEAD "  data: {train: ''}\n" BATCH STEPS, "spec.data.train: must not be empty"},
        {HEAD DATA STEPS, "spec.batch: required"},
        {HEAD DATA "  batch: {micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: required"},
        {HEAD DATA "  batch: {global: 64, seqLen: 128}\n" STEPS, "spec.batch.micro: required"},
        {HEAD DATA "  batch: {global: 64, micro: 4}\n" STEPS, "spec.batch.seqLen: required"},
        {HEAD DATA "  batch: {global: ~, micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: required"},
        {HEAD DATA BATCH, "spec.steps: required"},
        /* unknown fields */
        {MINIMAL "  model: {layerz: 4}\n", "spec.model.layerz: unknown field"},
        {MINIMAL "  stepz: 4\n", "spec.stepz: unknown field"},
        {HEAD "  data: {train: a, shuffle: true}\n" BATCH STEPS, "spec.data.shuffle: unknown field"},
        {HEAD DATA "  batch: {global: 64, micro: 4, seqLen: 128, size: 1}\n" STEPS, "spec.batch.size: unknown field"},
        {MINIMAL "  optimizer: {momentum: 0.9}\n", "spec.optimizer.momentum: unknown field"},
        {MINIMAL "  checkpoint: {path: /c}\n", "spec.checkpoint.path: unknown field"},
        {MINIMAL "  faultTolerance: {f: 1}\n", "spec.faultTolerance.f: unknown field"},
        {MINIMAL "  nodes: {count: 1}\n", "spec.nodes.count: unknown field"},
        {MINIMAL "  worker: {imag: x}\n", "spec.worker.imag: unknown field"},
        {MINIMAL "  runPolicy: {restartPolicy: Never}\n", "spec.runPolicy.restartPolicy: unknown field"},
        /* types */
        {HEAD DATA "  batch: {global: 64.0, micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: must be an integer"},
        {HEAD DATA "  batch: {global: \"64\", micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: must be an integer"},
        {HEAD DATA "  batch: {global: 1e2, micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: must be an integer"},
        {HEAD DATA "  batch: {global: [64], micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: must be an integer"},
        {HEAD DATA "  batch: {global: true, micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: must be an integer"},
        {HEAD DATA "  batch: [1, 2]\n" STEPS, "spec.batch: must be a mapping"},
        {HEAD "  data: {train: 5}\n" BATCH STEPS, "spec.data.train: must be a string"},
        {HEAD "  data: {train: [a, b]}\n" BATCH STEPS, "spec.data.train: must be a string"},
        {MINIMAL "  model: 4\n", "spec.model: must be a mapping"},
        {MINIMAL "  model: {preset: 124}\n", "spec.model.preset: must be gpt2-tiny"},
        {MINIMAL "  model: {preset: gpt2-xl}\n", "spec.model.preset: must be gpt2-tiny, gpt2-d6"},
        {MINIMAL "  model: {layers: 2.5}\n", "spec.model.layers: must be an integer"},
        {MINIMAL "  model: {seed: -1}\n", "spec.model.seed: must be a non-negative integer"},
        {MINIMAL "  model: {seed: 18446744073709551616}\n", "spec.model.seed: must be at most"},
        {MINIMAL "  model: {seed: 1.5}\n", "spec.model.seed: must be an integer"},
        {MINIMAL "  optimizer: {lr: fast}\n", "spec.optimizer.lr: must be a number"},
        {MINIMAL "  optimizer: {lr: \"0.1\"}\n", "spec.optimizer.lr: must be a number"},
        {MINIMAL "  optimizer: {lr: .inf}\n", "spec.optimizer.lr: must be a finite number"},
        {MINIMAL "  optimizer: {lr: .nan}\n", "spec.optimizer.lr: must be a finite number"},
        {MINIMAL "  optimizer: {lr: 1e999}\n", "spec.optimizer.lr: must be a finite number"},
        {MINIMAL "  profile: 3\n", "spec.profile: must be a string"},
        {MINIMAL "  profile: ''\n", "spec.profile: must be auto, synthetic or a path"},
        {MINIMAL "  worker: []\n", "spec.worker: must be a mapping"},
        {MINIMAL "  worker: {image: 3}\n", "spec.worker.image: must be a string"},
        {MINIMAL "  worker: {resources: 3}\n", "spec.worker.resources: must be a mapping"},
        {MINIMAL "  worker: {tolerations: {a: b}}\n", "spec.worker.tolerations: must be a list"},
        {MINIMAL "  worker: {env: x}\n", "spec.worker.env: must be a list"},
        {MINIMAL "  worker: {terminationGracePeriodSeconds: -1}\n",
         "spec.worker.terminationGracePeriodSeconds: must be a non-negative integer"},
        {MINIMAL "  worker: {env: [{name: A, value: .inf}]}\n", "spec.worker.env[0].value: .inf is not a finite"},
        {MINIMAL "  runPolicy: \"x\"\n", "spec.runPolicy: must be a mapping"},
        {MINIMAL "  runPolicy: {suspend: yes}\n", "spec.runPolicy.suspend: must be a boolean"},
        {MINIMAL "  runPolicy: {cleanPodPolicy: all}\n", "spec.runPolicy.cleanPodPolicy: must be All, Running or None"},
        {MINIMAL "  runPolicy: {activeDeadlineSeconds: -5}\n", "spec.runPolicy.activeDeadlineSeconds: must be a non-negative"},
        {MINIMAL "  runPolicy: {ttlSecondsAfterFinished: 1.5}\n", "spec.runPolicy.ttlSecondsAfterFinished: must be an integer"},
        {MINIMAL "  runPolicy: {backoffLimit: -1}\n", "spec.runPolicy.backoffLimit: must be at least 0"},
        {MINIMAL "  runPolicy: {backoffLimit: 2147483648}\n", "spec.runPolicy.backoffLimit: must be at most"},
        {MINIMAL "  runPolicy: {backoffLimit: \"3\"}\n", "spec.runPolicy.backoffLimit: must be an integer"},
        {MINIMAL "  worker: {labels: {team: 1}}\n", "spec.worker.labels.team: must be a string"},
        {MINIMAL "  worker: {labels: {team: " NAME64 "}}\n", "spec.worker.labels.team: must be at most 63"},
        {MINIMAL "  worker: {labels: [a]}\n", "spec.worker.labels: must be a mapping"},
        {MINIMAL "  worker: {annotations: {a: [1]}}\n", "spec.worker.annotations.a: must be a string"},
        {MINIMAL "  worker: {nodeSelector: {pool: 1}}\n", "spec.worker.nodeSelector.pool: must be a string"},
        {MINIMAL "  worker: {imagePullSecrets: [{}]}\n", "spec.worker.imagePullSecrets[0].name: required"},
        {MINIMAL "  worker: {imagePullSecrets: [regcred]}\n", "spec.worker.imagePullSecrets[0]: must be a mapping"},
        {MINIMAL "  worker: {volumes: [{emptyDir: {}}]}\n", "spec.worker.volumes[0].name: required"},
        {MINIMAL "  worker: {volumeMounts: [{name: c}]}\n", "spec.worker.volumeMounts[0].mountPath: required"},
        {MINIMAL "  worker: {env: [{name: 3}]}\n", "spec.worker.env[0].name: must be a string"},
        {MINIMAL "  worker: {serviceAccountName: 3}\n", "spec.worker.serviceAccountName: must be a string"},
        {MINIMAL "  worker: {automountServiceAccountToken: 1}\n",
         "spec.worker.automountServiceAccountToken: must be a boolean"},
        {MINIMAL "  worker: {schedulerName: [a]}\n", "spec.worker.schedulerName: must be a string"},
        {MINIMAL "  worker: {runtimeClassName: 1}\n", "spec.worker.runtimeClassName: must be a string"},
        {MINIMAL "  worker: {podSecurityContext: 1}\n", "spec.worker.podSecurityContext: must be a mapping"},
        {MINIMAL "  worker: {securityContext: []}\n", "spec.worker.securityContext: must be a mapping"},
        /* integers that do not fit */
        {MINIMAL "  evalBatches: 2147483648\n", "spec.evalBatches: must be at most 2147483647"},
        {MINIMAL "  evalBatches: 99999999999999999999999\n", "spec.evalBatches: must be at most"},
        {MINIMAL "  evalEvery: -99999999999999999999999\n", "spec.evalEvery: must be at least 0"},
        /* ranges */
        {MINIMAL "  model: {layers: 0}\n", "spec.model.layers: must be at least 1"},
        {MINIMAL "  model: {heads: 0}\n", "spec.model.heads: must be at least 1"},
        {MINIMAL "  model: {channels: 0}\n", "spec.model.channels: must be at least 1"},
        {MINIMAL "  model: {channels: 130}\n", "spec.model.heads: must divide spec.model.channels (130)"},
        {MINIMAL "  model: {preset: gpt2-124m, heads: 7}\n", "spec.model.heads: must divide spec.model.channels (768)"},
        {MINIMAL "  model: {vocabSize: 0}\n", "spec.model.vocabSize: must be at least 1"},
        {MINIMAL "  model: {vocabSize: 65537}\n", "spec.model.vocabSize: must be at most 65536"},
        {MINIMAL "  model: {maxSeqLen: 0}\n", "spec.model.maxSeqLen: must be at least 1"},
        {MINIMAL "  model: {maxSeqLen: 100}\n", "spec.batch.seqLen: must be at most spec.model.maxSeqLen (100)"},
        {HEAD DATA "  batch: {global: 64, micro: 4, seqLen: 257}\n" STEPS,
         "spec.batch.seqLen: must be at most spec.model.maxSeqLen (256)"},
        {HEAD DATA "  batch: {global: 64, micro: 5, seqLen: 128}\n" STEPS,
         "spec.batch.micro: must divide spec.batch.global (64)"},
        {HEAD DATA "  batch: {global: 4, micro: 8, seqLen: 128}\n" STEPS,
         "spec.batch.micro: must divide spec.batch.global (4)"},
        {HEAD DATA "  batch: {global: 0, micro: 4, seqLen: 128}\n" STEPS, "spec.batch.global: must be at least 1"},
        {HEAD DATA "  batch: {global: 64, micro: 0, seqLen: 128}\n" STEPS, "spec.batch.micro: must be at least 1"},
        {HEAD DATA "  batch: {global: 64, micro: 4, seqLen: 0}\n" STEPS, "spec.batch.seqLen: must be at least 1"},
        {MINIMAL "  optimizer: {lr: 0}\n", "spec.optimizer.lr: must be greater than 0"},
        {MINIMAL "  optimizer: {lr: -1e-3}\n", "spec.optimizer.lr: must be greater than 0"},
        {MINIMAL "  optimizer: {beta1: 1}\n", "spec.optimizer.beta1: must be at least 0 and less than 1"},
        {MINIMAL "  optimizer: {beta1: -0.1}\n", "spec.optimizer.beta1: must be at least 0 and less than 1"},
        {MINIMAL "  optimizer: {beta2: 1.0}\n", "spec.optimizer.beta2: must be at least 0 and less than 1"},
        {MINIMAL "  optimizer: {eps: 0}\n", "spec.optimizer.eps: must be greater than 0"},
        {MINIMAL "  optimizer: {weightDecay: -0.1}\n", "spec.optimizer.weightDecay: must be at least 0"},
        {MINIMAL "  optimizer: {gradClip: -1}\n", "spec.optimizer.gradClip: must be at least 0"},
        {MINIMAL "  optimizer: {minLrRatio: 1.5}\n", "spec.optimizer.minLrRatio: must be between 0 and 1"},
        {MINIMAL "  optimizer: {minLrRatio: -0.5}\n", "spec.optimizer.minLrRatio: must be between 0 and 1"},
        {MINIMAL "  optimizer: {warmupSteps: -1}\n", "spec.optimizer.warmupSteps: must be at least 0"},
        {MINIMAL "  optimizer: {schedule: linear}\n", "spec.optimizer.schedule: must be cosine or constant"},
        {HEAD DATA BATCH "  steps: 0\n", "spec.steps: must be at least 1"},
        {MINIMAL "  evalEvery: -1\n", "spec.evalEvery: must be at least 0"},
        {MINIMAL "  evalBatches: 0\n", "spec.evalBatches: must be at least 1"},
        {MINIMAL "  checkpoint: {every: -1}\n", "spec.checkpoint.every: must be at least 0"},
        {MINIMAL "  checkpoint: {resume: always}\n", "spec.checkpoint.resume: must be auto or never"},
        {MINIMAL "  checkpoint: {keep: -1}\n", "spec.checkpoint.keep: must be at least 0"},
        {MINIMAL "  checkpoint: {keep: 2.5}\n", "spec.checkpoint.keep: must be an integer"},
        {MINIMAL "  checkpoint: {keep: two}\n", "spec.checkpoint.keep: must be an integer"},
        {MINIMAL "  checkpoint: {keep: 2147483648}\n", "spec.checkpoint.keep: must be at most 2147483647"},
        {MINIMAL "  faultTolerance: {tolerate: -1}\n", "spec.faultTolerance.tolerate: must be at least 0"},
        {MINIMAL "  faultTolerance: {strategy: mirror}\n",
         "spec.faultTolerance.strategy: must be templates, checkpoint or redundant"},
        {MINIMAL "  faultTolerance: {strategy: redundant, redundantForward: sometimes}\n",
         "spec.faultTolerance.redundantForward: must be eager or lazy"},
        {MINIMAL "  faultTolerance: {redundantForward: lazy}\n",
         "spec.faultTolerance.redundantForward: only with strategy redundant"},
        {MINIMAL "  faultTolerance: {maxResets: -1}\n", "spec.faultTolerance.maxResets: must be at least 0"},
        {MINIMAL "  faultTolerance: {hostsAddedCheckEvery: 0}\n",
         "spec.faultTolerance.hostsAddedCheckEvery: must be at least 1"},
        {MINIMAL "  faultTolerance: {heartbeatSeconds: 0}\n",
         "spec.faultTolerance.heartbeatSeconds: must be greater than 0"},
        {MINIMAL "  faultTolerance: {belowMinimum: shrink}\n",
         "spec.faultTolerance.belowMinimum: must be wait or degrade"},
        {MINIMAL "  faultTolerance: {stepTimeoutSeconds: -1}\n",
         "spec.faultTolerance.stepTimeoutSeconds: must be in 0..1e9 (0: automatic; got -1)"},
        {MINIMAL "  faultTolerance: {waitForNodesTimeoutSeconds: -1}\n",
         "spec.faultTolerance.waitForNodesTimeoutSeconds: must be at least 0"},
        {MINIMAL "  faultTolerance: {strategy: bamboo}\n",
         "spec.faultTolerance.strategy: must be templates, checkpoint or redundant"},
        {MINIMAL "  faultTolerance: {strategy: checkpoint}\n", "spec.checkpoint.dir: required when"},
        {MINIMAL "  nodes: {min: 0}\n", "spec.nodes.min: must be at least 1"},
        {MINIMAL "  nodes: {min: 4, max: 2}\n", "spec.nodes.max: must be 0 (unset) or at least spec.nodes.min (4)"},
        {MINIMAL "  nodes: {max: -1}\n", "spec.nodes.max: must be at least 0"},
        {MINIMAL "  nodes: {gpusPerNode: 0}\n", "spec.nodes.gpusPerNode: must be at least 1"},
        {HEAD "  data: {train: a, order: random}\n" BATCH STEPS, "spec.data.order: must be shuffled or sequential"},
        {HEAD "  data: {train: a, seed: -3}\n" BATCH STEPS, "spec.data.seed: must be a non-negative integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = fails(cases[i].text);
        if (!strstr(got, cases[i].want)) printf("    case %zu:\n%s\n", i, cases[i].text);
        CHECK_STR_CONTAINS(got, cases[i].want);
    }
}

static void test_exact_micro_wording(void)
{
    const char *got = fails(HEAD DATA "  batch: {global: 64, micro: 5, seqLen: 128}\n" STEPS);
    CHECK(strcmp(got, "spec.batch.micro: must divide spec.batch.global (64)") == 0);
    CHECK(strcmp(fails(MINIMAL "  model:\n    layerz: 4\n"), "spec.model.layerz: unknown field") == 0);
    CHECK(strcmp(fails(HEAD DATA "  batch: {global: x, micro: 5, seqLen: 128}\n" STEPS),
                 "spec.batch.global: must be an integer (got \"x\")") == 0);
    CHECK(strcmp(fails(HEAD BATCH STEPS), "spec.data: required") == 0);
}

static void test_duplicate_keys(void)
{
    CHECK_STR_CONTAINS(fails(MINIMAL "  model:\n    layers: 2\n    layers: 3\n"),
                       "spec.model.layers: duplicate key (line 15; first at line 14)");
    CHECK_STR_CONTAINS(fails(MINIMAL "  steps: 11\n"), "spec.steps: duplicate key");
    CHECK_STR_CONTAINS(fails("apiVersion: a\napiVersion: b\n"), "apiVersion: duplicate key");
    CHECK_STR_CONTAINS(fails("{\"kind\": 1, \"kind\": 2}"), "kind: duplicate key");
    /* inside worker, where fields are not checked one by one */
    CHECK_STR_CONTAINS(fails(MINIMAL "  worker:\n    env:\n      - {name: A, name: B}\n"),
                       "spec.worker.env[0].name: duplicate key");
}

static void test_syntax_errors(void)
{
    CHECK_STR_CONTAINS(fails(MINIMAL "  model: {layers: 2\n"), "line");
    CHECK_STR_CONTAINS(fails("apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\n  bad: indent\n"), "line 3");
    CHECK_STR_CONTAINS(fails("a: b: c\n"), "line 1, column");
    CHECK_STR_CONTAINS(fails("key: \"unterminated\n"), "line");
    CHECK_STR_CONTAINS(fails("{\"apiVersion\": \"x\",}"), "");
    CHECK_STR_CONTAINS(fails("\tapiVersion: x\n"), "line 1");
    CHECK_STR_CONTAINS(fails("a: \xff\xfe\n"), "");
    /* several documents, aliases, complex keys, tags */
    CHECK_STR_CONTAINS(fails(MINIMAL "---\n" MINIMAL), "only one YAML document");
    CHECK_STR_CONTAINS(fails("---\n" MINIMAL "...\n---\n"), "only one YAML document");
    CHECK_STR_CONTAINS(fails(HEAD "  data: &d {train: a}\n" BATCH STEPS "  model: *d\n"), "aliases are not supported");
    CHECK_STR_CONTAINS(fails("? [a, b]\n: c\n"), "mapping keys must be scalars");
    CHECK_STR_CONTAINS(fails(MINIMAL "  evalEvery: !!int abc\n"), "is not a valid !!int");
    CHECK_STR_CONTAINS(fails(MINIMAL "  evalEvery: !custom 5\n"), "unsupported tag");
    CHECK_STR_CONTAINS(fails("!!set {a, b}\n"), "unsupported tag");
    /* deep nesting is refused, not recursed into without bound */
    char deep[2000];
    size_t n = 0;
    for (int i = 0; i < 200; i++) deep[n++] = '[';
    for (int i = 0; i < 200; i++) deep[n++] = ']';
    deep[n] = '\0';
    CHECK_STR_CONTAINS(fails(deep), "nested deeper than");
    /* leading document marker and comments are fine */
    pl_job job;
    char err[256];
    CHECK_EQ_INT(pl_job_parse("%YAML 1.1\n---\n# c\n" MINIMAL "...\n", NULL, &job, err, sizeof err), 0);
    pl_job_free(&job);
}

static void test_load_examples(void)
{
    pl_job job;
    char err[512];
    int rc = pl_job_load("examples/shakespeare-tiny.yaml", &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(job.name, "shakespeare-tiny") == 0);
    CHECK_EQ_INT(job.model.layers, 4);
    CHECK_EQ_INT(job.model.channels, 128);
    CHECK_EQ_INT(job.model.heads, 4);
    CHECK_EQ_INT(job.model.vocab_size, 256);
    CHECK_EQ_INT(job.model.max_seq_len, 256);
    CHECK(strcmp(job.data.train, "examples/../data/ts_train.bin") == 0);
    CHECK(strcmp(job.data.val, "examples/../data/ts_val.bin") == 0);
    CHECK_EQ_INT(job.batch.global, 32);
    CHECK_EQ_INT(job.batch.micro, 8);
    CHECK_EQ_INT(job.batch.seq_len, 128);
    CHECK(job.optimizer.lr == 1e-3);
    CHECK_EQ_INT(job.optimizer.warmup_steps, 20);
    CHECK(job.steps > 0 && job.eval_every > 0 && job.eval_batches > 0);
    CHECK(strcmp(job.checkpoint.dir, "examples/../build/ckpt/shakespeare-tiny") == 0);
    CHECK(job.checkpoint.every > 0);
    CHECK(job.worker_json == NULL);
    pl_job_free(&job);

    rc = pl_job_load("examples/gpt2-124m.yaml", &job, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK(strcmp(job.name, "gpt2-124m") == 0);
    CHECK(strcmp(job.model.preset, "gpt2-124m") == 0);
    CHECK_EQ_INT(job.model.layers, 12);
    CHECK_EQ_INT(job.model.channels, 768);
    CHECK_EQ_INT(job.model.vocab_size, 50257);
    CHECK_EQ_INT(job.model.init, PL_INIT_LLMC);
    size_t il = strlen(job.model.init_path);
    CHECK(il >= 13 && strcmp(job.model.init_path + il - 13, "gpt2_124M.bin") == 0);
    CHECK_EQ_INT(job.batch.global, 512);
    CHECK_EQ_INT(job.batch.micro, 4);
    CHECK_EQ_INT(job.batch.seq_len, 1024);
    CHECK(job.optimizer.lr == 6e-4);
    CHECK_EQ_INT(job.optimizer.warmup_steps, 700);
    CHECK_EQ_INT(job.steps, 19560);
    CHECK(job.nodes.min >= 1 && job.nodes.max >= job.nodes.min);
    CHECK(job.worker_json != NULL && job.run_policy_json != NULL);
    cJSON *w = cJSON_Parse(job.worker_json);
    CHECK(w != NULL);
    int ok = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(w, "image")) &&
             cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(w, "tolerations"));
    cJSON_Delete(w);
    CHECK(ok);
    pl_job_free(&job);

    CHECK_EQ_INT(pl_job_load("no/such/job.yaml", &job, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "no/such/job.yaml");
}

/* Every prefix of a real manifest, and single-byte corruptions of it, must
 * parse or fail cleanly (the sanitizer build checks memory). */
static void test_truncations_and_corruptions(void)
{
    char err[512];
    char *text = pl_read_file("examples/gpt2-124m.yaml", err, sizeof err);
    CHECK(text != NULL);
    size_t n = strlen(text);
    char *buf = malloc(n + 1);
    CHECK(buf != NULL);
    int parsed = 0;
    for (size_t cut = 0; cut <= n; cut = (cut < n && cut + 7 > n) ? n : cut + 7) {
        memcpy(buf, text, cut);
        buf[cut] = '\0';
        pl_job job;
        if (pl_job_parse(buf, "examples", &job, err, sizeof err) == 0) parsed++;
        else if (!err[0]) { free(buf); free(text); CHECK(!"empty error"); }
        pl_job_free(&job);
    }
    static const char junk[] = {':', '{', '[', '-', '\'', '"', '&', '*', '!', '\t', '#', '|', '>', '%', '@'};
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 2000; i++) {
        memcpy(buf, text, n + 1);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[x % n] = junk[(x >> 32) % sizeof junk];
        pl_job job;
        if (pl_job_parse(buf, NULL, &job, err, sizeof err) != 0 && !err[0]) {
            free(buf);
            free(text);
            CHECK(!"empty error");
        }
        pl_job_free(&job);
    }
    free(buf);
    free(text);
    CHECK(parsed >= 1); /* the whole file */
}

/* spec.faultTolerance.strategy's words and back. */
static void test_strategy_names(void)
{
    const pl_ft_strategy all[] = {PL_STRATEGY_TEMPLATES, PL_STRATEGY_CHECKPOINT,
                                  PL_STRATEGY_REDUNDANT};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        pl_ft_strategy back = PL_STRATEGY_TEMPLATES;
        CHECK_EQ_INT(pl_ft_strategy_from_name(pl_ft_strategy_name(all[i]), &back), 0);
        CHECK_EQ_INT((int)back, (int)all[i]);
    }
    CHECK_STR_CONTAINS(pl_ft_strategy_name(PL_STRATEGY_REDUNDANT), "redundant");
    pl_ft_strategy none;
    CHECK_EQ_INT(pl_ft_strategy_from_name("Templates", &none), -1);
    CHECK_EQ_INT(pl_ft_strategy_from_name("", &none), -1);
}

TEST_MAIN_BEGIN
RUN(test_defaults);
RUN(test_every_field);
RUN(test_presets);
RUN(test_redundant);
RUN(test_preset_overrides);
RUN(test_json_input);
RUN(test_worker_yaml_to_json);
    RUN(test_names_and_pod_fields);
RUN(test_paths);
RUN(test_init_kinds);
RUN(test_yaml_scalars);
RUN(test_validation_errors);
RUN(test_exact_micro_wording);
RUN(test_duplicate_keys);
RUN(test_syntax_errors);
RUN(test_load_examples);
RUN(test_truncations_and_corruptions);
RUN(test_strategy_names);
TEST_MAIN_END
