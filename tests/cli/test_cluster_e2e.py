#!/usr/bin/env python3
"""End-to-end tests of the operator in the test cluster (tests/k8s/cluster.py): the
chart installed as `helm install pliant` would (namespace pliant, 2 operator Pods as
their ServiceAccount with the chart's RBAC, limits and NetworkPolicies, perJob on),
worker Pods in network namespaces with cgroups, Pod Security, DNS and the cloud's
failures. One cluster for the whole file (3 nodes in zones a,b, node-monitor grace
4 s, default tolerations 4 s; spot nodes added by the fault tests), brought down at
the end.

  shakespeare_example_trains_in_a_restricted_namespace
        examples/shakespeare-tiny.yaml (shortened) in namespace training (Pod
        Security restricted), data and checkpoints on claims: Succeeded; `kubectl
        get tj` and `kubectl describe tj` as README.md shows them; no 403 for the
        operator's ServiceAccount in the API server's request log; the job's final
        dashboard page at status.dashboard from inside the leading operator Pod (where
        kubectl port-forward connects), 503 from the other, nothing from outside
  no_403_for_the_operator_in_the_whole_file
        (last) no RBAC refusal of any request the operator made while the file ran
  profile_auto_is_measured_on_a_worker
        a model that takes ~1 GB to measure, profile auto: Profiling, status.profile,
        the worker's cgroup peak above the operator's 512Mi limit, the operator Pods
        never restarted nor OOMKilled
  worker_pods_are_restricted_and_mount_only_what_they_read
        the fault job's worker Pods: admitted in the restricted namespace, their
        security contexts, and from inside (the sandbox's mount namespace) the Secret
        mount holds token, ca.crt and job.yaml (no tls.key), no ServiceAccount token,
        a read-only root, uid 65532 without capabilities
  checkpoints_suspend_resume_and_export
        checkpoints on a claim (checkpoint.json, status.lastCheckpoint); suspend then
        resume from the newest complete checkpoint with the losses of an
        uninterrupted `pliant run`; deleted and re-applied (resume auto) resumes too;
        `pliant export` reads the claim's checkpoint
  preemption_loses_no_step
  silent_node_loss_is_detected_by_heartbeats
  partitions_end_in_a_new_plan
  leader_pod_oomkilled_mid_step_the_job_continues
  leader_pod_deleted_mid_step_the_other_replica_continues
        on one job of 3 workers (one per spot node, F = 1, heartbeat 2 s): a spot
        preemption with notice (no step lost, no checkpoint read), a silent loss
        (detected within 3 heartbeats, no checkpoint), partitions from the peers and
        from the coordinator (each ends in a new plan), the leading operator Pod
        OOMKilled (the next leader goes on from the same step with the same Pods),
        then deleted (the other replica goes on likewise)
  two_jobs_in_two_namespaces_stay_apart
        two jobs train side by side; a worker Pod of namespace B holding job A's
        token is refused by B's coordinator, B unaffected; the per-job NetworkPolicy
        (enforced by the cluster) keeps a Pod outside the job from the workers'
        ports, while the job's own Pods reach them; the operator's peak memory
  crash_looping_workers_exhaust_the_backoff_limit
        a worker that exits at once: Pods re-created after the back-off, then Failed
        (BackoffLimitExceeded) with an Event
  resource_quota_refusal_is_a_failed_create
        a namespace's ResourceQuota of 1 Pod: the second worker Pod refused, a
        FailedCreate Event and condition PodsCreated=False

Figures are printed as "# measured: ..." lines (docs/operator.md, bench/README.md).
Skipped where the machine cannot make the cluster (root, network namespaces,
cgroups), without kubectl or the shakespeare corpus.

Run: python3 tests/cli/test_cluster_e2e.py --build build [-k SUBSTRING]
Standard library only.
"""

import calendar
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "k8s"))

from clitest import REPO, SHAKESPEARE, Failure, Skip, Suite, check  # noqa: E402
import clusterfixture  # noqa: E402
import e2e  # noqa: E402
import yamlmini  # noqa: E402
from clusterfixture import phase_is, step_at_least  # noqa: E402
from client import E2EFailure  # noqa: E402

suite = Suite("cluster_e2e", needs=[SHAKESPEARE])
fx = clusterfixture.Fixture("pe", nodes=3, zones="a,b", grace=4, toleration=4)
suite.at_end(fx.down)
T0 = time.monotonic()
NS = "training"
OPERATOR_SA = "system:serviceaccount:pliant:pliant-operator"
COLUMNS = ["NAME", "PHASE", "STEP", "STEPS", "LOSS", "NODES", "PIPELINES", "AGE"]
HEARTBEAT = 2
TINY = {"layers": 3, "channels": 32, "heads": 2, "vocabSize": 256, "maxSeqLen": 64, "seed": 7}
state = {"pods": None, "fault": None, "seq": 0, "denied": [], "unseen": 0}


def measured(name, value, unit):
    print("# measured: %s %s %s" % (name, value, unit))
    sys.stdout.flush()


def say(msg, *args):
    if os.environ.get("PLIANT_E2E_VERBOSE"):
        print("# %6.1f %s" % (time.monotonic() - T0, msg % args if args else msg))
        sys.stdout.flush()


# ---------------------------------------------------------------------------
# The cluster, namespaces, jobs

def cluster():
    """The cluster (brought up once), with namespace training (Pod Security restricted)
    and its claim `data` holding the shards."""
    if not shutil.which("kubectl"):
        raise Skip("kubectl not installed")
    first = fx.api is None and not fx.skip
    try:
        fx.up(suite.tmp, suite.build)
    except clusterfixture.Unavailable as e:
        raise Skip(str(e))
    if first:
        state["pods"] = e2e.Recorder(fx.api, "/api/v1/pods")
        suite.at_end(state["pods"].stop)
        restricted_namespace(NS)
    return fx


def restricted_namespace(ns):
    """A namespace labelled Pod Security restricted, with the claim `data`."""
    prefix = suite.shakespeare_shards(100000)
    fx.namespace(ns, {"pod-security.kubernetes.io/enforce": "restricted"})
    fx.claim(ns, "data", [prefix + "_train.bin", prefix + "_val.bin"])


def diagnostics():
    """Every job's phase, step and nodes, its live worker Pods' log tails, the operators'."""
    lines = []
    try:
        for tj_ in fx.ok("GET", "/apis/pliant.dev/v1alpha1/trainingjobs")["items"]:
            st, md = tj_.get("status") or {}, tj_["metadata"]
            lines.append("--- job %s/%s: %s step %s nodes %s" % (md["namespace"], md["name"], st.get("phase"),
                                                                st.get("step"), st.get("nodes")))
            for p in fx.job_pods(md["namespace"], md["name"]):
                if p["status"].get("phase") in ("Running", "Pending", "Failed"):
                    lines.append("    pod %s %s on %s: %s" % (p["metadata"]["name"], p["status"].get("phase"),
                                                             p["spec"].get("nodeName"), " | ".join(fx.log(
                                                                 md["namespace"], p["metadata"]["name"])
                                                                 .splitlines()[-3:])))
        lines.append("--- nodes: %s" % ", ".join("%s %s" % (n["metadata"]["name"], fx.node_ready(n["metadata"]["name"]))
                                                 for n in fx.ok("GET", "/api/v1/nodes")["items"]))
        lines += ["--- %s %s: %s" % (e["reason"], e["involvedObject"]["name"], e.get("message")) for e in fx.ok(
            "GET", "/api/v1/events")["items"] if e.get("type") == "Warning" and e["involvedObject"]["kind"] == "Pod"][-8:]
    except E2EFailure as e:
        lines.append("(diagnostics: %s)" % e)
    return "\n".join(lines) + "\n" + fx.operator_logs()


def e2e_test(fn):
    """A test whose failures carry the jobs' state and the operators' log tails."""
    def run():
        cluster()
        t0 = time.monotonic()
        try:
            fn()
        except (E2EFailure, Failure) as e:
            # the message last too: a runner that keeps only a failure's tail shows it
            raise Failure("%s\n%s\n=> %s" % (e, diagnostics(), str(e).splitlines()[0] if str(e) else ""))
        finally:
            say("%s: %.1f s", fn.__name__, time.monotonic() - t0)
            audit_requests()
    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    return suite.test(run)


def audit_requests():
    """Collects the operator's requests its RBAC refused (403 worded `... cannot VERB
    ...`; not admission's 403s: a quota exceeded, a namespace terminating) from the API
    server's request log (which keeps the last 5000) since the last call."""
    try:
        reqs, count = fx.requests(state["seq"])
    except E2EFailure:
        return
    if reqs and reqs[0]["seq"] > state["seq"] + 1:
        state["unseen"] += reqs[0]["seq"] - state["seq"] - 1
    state["denied"] += [r for r in reqs if r["status"] == 403 and r["user"] == OPERATOR_SA and
                        " cannot " in r.get("message", "")]
    state["seq"] = count


def tj(name, steps, ns=NS, max_=2, model=None, tolerate=0, worker=None, **spec):
    """A TrainingJob reading the claim `data`; worker: fields added to spec.worker. The
    workers use the OpenBLAS kernels this process was told to (OPENBLAS_CORETYPE), as the
    `pliant run` references do: losses compare exactly only between the same kernels."""
    env = [{"name": "PLIANT_THREADS", "value": "1"}]
    if os.environ.get("OPENBLAS_CORETYPE"):
        env.append({"name": "OPENBLAS_CORETYPE", "value": os.environ["OPENBLAS_CORETYPE"]})
    w = {"terminationGracePeriodSeconds": 5, "env": env,
         "resources": {"requests": {"cpu": "100m"}},
         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
         "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    for k, v in (worker or {}).items():
        w[k] = w[k] + v if isinstance(v, list) and k in w else v
    body = {"model": model or TINY, "data": {"train": "/data/ts_train.bin", "order": "shuffled", "seed": 3},
            "batch": {"global": 8, "micro": 2, "seqLen": 32}, "optimizer": {"lr": 3.0e-3, "warmupSteps": 2},
            "steps": steps, "evalEvery": 0, "profile": "synthetic", "nodes": {"min": 1, "max": max_},
            "faultTolerance": {"tolerate": tolerate}, "worker": w}
    body.update(spec)
    return {"apiVersion": "pliant.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name, "namespace": ns},
            "spec": body}


def apply(obj):
    return fx.api.kubectl_ok("apply", "-f", "-", stdin=json.dumps(obj))


def delete_job(ns, name):
    fx.api.kubectl_ok("delete", "tj", name, "-n", ns, "--wait=false")
    e2e.wait_for("job %s/%s's Pods gone" % (ns, name), lambda: not fx.job_pods(ns, name), 30, 0.2)


def ckpt_volume(claim="ckpt"):
    return {"volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": claim}}],
            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}


def check_steps_monotonic(hist, slack=1):
    """status.step never goes back by more than the step in flight."""
    steps = [st.get("step") for _, st in hist if st.get("step") is not None]
    for a, b in zip(steps, steps[1:]):
        check(b >= a - slack, "status.step went back from %d to %d: %s", a, b, steps[-40:])


def pod_seen(ns, name):
    """[(monotonic time, Pod)] the Pod Recorder saw of that Pod."""
    return [(t, o) for t, typ, o in state["pods"].objects(
        lambda o: o["metadata"]["name"] == name and o["metadata"].get("namespace") == ns)]


def operators_never_restarted():
    for p in fx.operator_pods():
        for cs in p["status"].get("containerStatuses") or []:
            check(cs.get("restartCount", 0) == 0 and "OOMKilled" not in json.dumps(cs),
                  "operator Pod %s: %s", p["metadata"]["name"], cs)


# ---------------------------------------------------------------------------
# 1. The example

def shakespeare_manifest():
    with open(os.path.join(REPO, "examples", "shakespeare-tiny.yaml")) as f:
        job = yamlmini.load(f.read())
    job["metadata"]["namespace"] = NS
    spec = job["spec"]
    spec["data"].update(train="/data/ts_train.bin", val="/data/ts_val.bin")
    spec.update(steps=20, evalEvery=10, evalBatches=2)
    spec["checkpoint"].update(dir="/ckpt/shakespeare-tiny", every=10)
    spec["nodes"]["max"] = 2
    spec["worker"] = tj("x", 1, worker=ckpt_volume())["spec"]["worker"]
    return job


@e2e_test
def shakespeare_example_trains_in_a_restricted_namespace():
    """The example, shortened to 20 steps with data and checkpoints on claims, in a
    namespace that is not the operator's: Succeeded, with what kubectl shows."""
    fx.claim(NS, "ckpt")
    job = shakespeare_manifest()
    name = job["metadata"]["name"]
    out = apply(job)
    check("trainingjob.pliant.dev/%s created" % name in out, "kubectl apply: %s", out)
    st = fx.wait_status(NS, name, "phase Succeeded", phase_is("Succeeded"), 240, stall=60)
    check(st["step"] == 20 and 0 < st["loss"] < 5.5, "status step %s loss %s", st.get("step"), st.get("loss"))
    check((st.get("lastValidation") or {}).get("step") == 19, "lastValidation %s", st.get("lastValidation"))
    check((st.get("lastCheckpoint") or {}).get("step") == 20, "lastCheckpoint %s", st.get("lastCheckpoint"))
    check(os.path.exists(os.path.join(fx.claim_dir(NS, "ckpt"), name, "step-00000020", "checkpoint.json")),
          "no checkpoint.json of step 20 in the claim")
    out = fx.api.kubectl_ok("get", "tj", "-n", NS)
    names, rows = clusterfixture.table(out)
    check(names == COLUMNS, "kubectl get tj header %s, want %s", names, COLUMNS)
    row = next((r for r in rows if r["NAME"] == name), None)
    check(row and row["PHASE"] == "Succeeded" and row["STEP"] == "20" and row["STEPS"] == "20" and
          re.match(r"^\d+/2$", row["NODES"]) and re.match(r"^\d+x\d+(\+\d+x\d+)*$", row["PIPELINES"]) and
          0 < float(row["LOSS"]) < 5.5, "kubectl get tj:\n%s", out)
    out = fx.api.kubectl_ok("describe", "tj", name, "-n", NS)
    for want in ("Name:         " + name, "Namespace:    " + NS, "Phase:", "Succeeded", "Conditions:",
                 "Last Checkpoint:", "Events:", "Started", "CheckpointSaved", "every step committed"):
        check(want in out, "kubectl describe tj lacks %r:\n%s", want, out)
    denied = [r for r in fx.requests()[0] if r["status"] == 403 and r["user"] == OPERATOR_SA]
    check(not denied, "403 for the operator: %s", [(r["method"], r["path"]) for r in denied][:5])
    check(any(r["user"] == OPERATOR_SA for r in fx.requests()[0]), "no request recorded as %s", OPERATOR_SA)
    check(st.get("dashboard") == "/jobs/%s/%s/" % (NS, name), "status.dashboard %r", st.get("dashboard"))
    dashboard_as_port_forward_sees_it(st["dashboard"])


GET = r"""
import http.client, json, sys
try:
    c = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=5)
    c.request("GET", sys.argv[3])
    r = c.getresponse()
    out = [r.status, r.read().decode(errors="replace")]
except OSError as e:
    out = [0, "error: %s" % (e.strerror or e)]
print(json.dumps(out))
"""
DASHBOARD_PORT = 8090  # the chart's dashboard.port, on 127.0.0.1 (dashboard.host)


def get_in_pod_network(pod, host, port, path):
    """GET http://host:port/path from the operator Pod's network namespace, as kubectl
    port-forward connects: (status, body), status 0 and the error when nothing answers."""
    pid = fx.pod_pids("pliant", pod)[0]
    p = subprocess.run(["nsenter", "-t", str(pid), "-n", "--", sys.executable, "-c", GET, host, str(port), path],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    out = p.stdout.decode(errors="replace")
    check(p.returncode == 0, "GET %s in %s: %s", path, pod, out)
    return tuple(json.loads(out.strip().splitlines()[-1]))


def dashboard_as_port_forward_sees_it(path):
    """The leader serves the job's page to what connects inside its Pod; the other
    replica answers 503 naming the Lease; the port is not reachable from outside."""
    leader = fx.leader()
    code, body = get_in_pod_network(leader, "127.0.0.1", DASHBOARD_PORT, path)
    check(code == 200 and "PliantDashboard" in body, "the leader %s's dashboard %s: %s %s", leader, path, code,
          body[:300])
    ip = fx.pod("pliant", leader)["status"]["podIP"]
    for p in fx.operator_pods():
        other = p["metadata"]["name"]
        if other == leader:
            continue
        code, body = get_in_pod_network(other, "127.0.0.1", DASHBOARD_PORT, path)
        check(code == 503 and "does not lead" in body, "the follower %s's dashboard: %s %s", other, code,
              body[:300])
        code, body = get_in_pod_network(other, ip, DASHBOARD_PORT, path)
        check(code == 0, "the leader's dashboard from another Pod: %s %s", code, body[:300])


# ---------------------------------------------------------------------------
# 2. Profiling on a worker

@e2e_test
def profile_auto_is_measured_on_a_worker():
    """One 2048-wide block with a microbatch of one 8-token sequence: measuring it
    needs ~1 GB (parameters, gradients, AdamW moments), twice the operator's limit."""
    wide = {"layers": 1, "channels": 2048, "heads": 16, "vocabSize": 256, "maxSeqLen": 16, "seed": 7}
    t0 = time.monotonic()
    apply(tj("wide", 2, max_=1, model=wide, profile="auto", batch={"global": 1, "micro": 1, "seqLen": 8}))
    st = fx.wait_status(NS, "wide", "phase Succeeded", phase_is("Succeeded"), 120, stall=60)
    phases = [s.get("phase") for _, s in fx.history(NS, "wide", t0)]
    check("Profiling" in phases, "phase Profiling never seen: %s", phases)
    prof = json.loads(st.get("profile") or "{}")
    check([l["name"] for l in prof.get("layers", [])] == ["embedding", "block0", "head"],
          "status.profile %s", str(st.get("profile"))[:300])
    worker = fx.job_pods(NS, "wide")[0]["metadata"]["name"]
    _, peak = fx.memory(NS, worker)
    measured("worker memory peak measuring a 2048-wide block", "%.0f" % (peak / 2**20), "MiB")
    check(peak > 512 * 2**20, "the worker's peak %s bytes: the model does not need more than 512Mi", peak)
    operators_never_restarted()
    for p in fx.operator_pods():
        _, op_peak = fx.memory("pliant", p["metadata"]["name"])
        check(op_peak < 128 * 2**20, "operator %s peaked at %s bytes", p["metadata"]["name"], op_peak)
    delete_job(NS, "wide")


# ---------------------------------------------------------------------------
# 3. Checkpoints on a claim

CK_STEPS, CK_EVERY = 600, 100


def reference_losses(job):
    """{status.step: loss} of the same job run uninterrupted by `pliant run` (2 workers,
    the same plan 2x1) on this machine's copy of the shards."""
    ref = copy.deepcopy(job)
    ref["spec"]["data"]["train"] = suite.shakespeare_shards(100000) + "_train.bin"
    del ref["spec"]["checkpoint"], ref["spec"]["worker"]
    path, metrics = os.path.join(suite.tmp, "ck-ref.json"), os.path.join(suite.tmp, "ck-ref.jsonl")
    with open(path, "w") as f:
        json.dump(ref, f)
    rc, out, err = suite.run("run", path, "--workers", 2, "--threads", 1, "--metrics", metrics, timeout=120)
    check(rc == 0, "pliant run: %s %s", out[-500:], err[-500:])
    with open(metrics) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    return {r["step"] + 1: r["loss"] for r in lines if "loss" in r and "step" in r}


def newest_checkpoint(claim, name):
    """The step of the newest checkpoint.json in the claim's directory of the job."""
    d = os.path.join(claim, name)
    return max([int(s[5:]) for s in os.listdir(d) if os.path.exists(os.path.join(d, s, "checkpoint.json"))] + [0])


def suspend(name, value):
    fx.api.kubectl_ok("patch", "tj", name, "-n", NS, "--type", "merge", "-p",
                      json.dumps({"spec": {"runPolicy": {"suspend": value}}}))


def resumed_from(name):
    """The checkpoint steps the operator's log says the job started from."""
    logs = "\n".join(fx.log("pliant", p["metadata"]["name"]) for p in fx.operator_pods())
    return [int(m) for m in re.findall(r"%s/%s: starting from the checkpoint of step (\d+)" % (NS, name), logs)]


@e2e_test
def checkpoints_suspend_resume_and_export():
    """Checkpoints every 100 steps on a claim; suspended after the checkpoint of step
    200 and resumed; deleted after that of 400 and applied again; then exported."""
    claim = fx.claim(NS, "ck")
    job = tj("ck", CK_STEPS, worker=ckpt_volume("ck"), checkpoint={"dir": "/ckpt/ck", "every": CK_EVERY,
                                                                   "resume": "auto"})
    t0 = time.monotonic()
    apply(job)
    st = fx.wait_status(NS, "ck", "a checkpoint of step >= 200", lambda st: (st.get("lastCheckpoint") or {}).get(
        "step", 0) >= 200, 60)
    suspend("ck", True)
    st = fx.wait_status(NS, "ck", "phase Suspended", phase_is("Suspended"), 30)
    e2e.wait_for("the suspended job's Pods gone", lambda: not fx.job_pods(NS, "ck"), 30, 0.2)
    # the newest complete checkpoint is the newest checkpoint.json: the status may lag
    # behind one completed as the job stopped
    first = newest_checkpoint(claim, "ck")
    status_ckpt = (fx.status(NS, "ck").get("lastCheckpoint") or {}).get("step") or 0
    check(200 <= status_ckpt <= first < CK_STEPS, "checkpoint.json up to step %d, status.lastCheckpoint %d", first,
          status_ckpt)
    t_resume = time.monotonic()
    suspend("ck", False)
    fx.wait_status(NS, "ck", "a checkpoint of step >= %d" % (first + 200), lambda st: (
        st.get("lastCheckpoint") or {}).get("step", 0) >= first + 200, 60)
    check(resumed_from("ck")[-1:] == [first], "after the suspension the job started from %s, want [%d]",
          resumed_from("ck"), first)
    after = [s.get("step") for _, s in fx.history(NS, "ck", t_resume) if s.get("phase") == "Running"]
    check(after and min(after) >= first, "after resuming, status.step went below %d: %s", first, after[:10])
    delete_job(NS, "ck")
    second = newest_checkpoint(claim, "ck")
    t_again = time.monotonic()
    apply(job)
    st = fx.wait_status(NS, "ck", "phase Succeeded", phase_is("Succeeded"), 60)
    check(resumed_from("ck")[-1:] == [second], "applied again, the job started from %s, want [%d]",
          resumed_from("ck"), second)
    again = [s.get("step") for _, s in fx.history(NS, "ck", t_again) if s.get("step")]
    check(again and min(again) >= second, "applied again, status.step went below %d: %s", second, again[:10])
    check((st.get("lastCheckpoint") or {}).get("step") == CK_STEPS, "lastCheckpoint %s", st.get("lastCheckpoint"))
    ref = reference_losses(job)
    seen = {s["step"]: s["loss"] for _, s in fx.history(NS, "ck", t0) if s.get("step") and s.get("loss")}
    compared = [k for k in seen if k in ref and k > first]
    check(len(compared) >= 3, "too few steps to compare: status saw %s", sorted(seen)[:20])
    for k in compared:
        check(abs(seen[k] - ref[k]) <= 1e-6 * abs(ref[k]), "step %d: loss %r, uninterrupted %r", k, seen[k], ref[k])
    out = os.path.join(suite.tmp, "ck.llmc.bin")
    rc, so, se = suite.run("export", os.path.join(claim, "ck", "step-%08d" % CK_STEPS), "--llmc", out)
    check(rc == 0 and os.path.getsize(out) > 1024, "pliant export: %d %s %s", rc, so, se)
    delete_job(NS, "ck")


# ---------------------------------------------------------------------------
# 5. Two namespaces

CONNECT = r"""
import json, socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); out = "connected"
except socket.timeout:
    out = "timeout"
except OSError as e:
    out = "error: %s" % (e.strerror or e)
print(json.dumps(out))
"""
SLEEPER = "import time\nwhile True: time.sleep(60)"
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_manifest(name, command, env=(), volumes=(), mounts=(), labels=None):
    """A Pod that Pod Security "restricted" admits."""
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "securityContext": RESTRICTED_POD,
        "automountServiceAccountToken": False, "volumes": list(volumes),
        "containers": [{"name": "main", "image": "python:3", "command": command, "env": list(env),
                        "volumeMounts": list(mounts), "securityContext": RESTRICTED_CONTAINER}]}}


def connect_from(ns, pod, ip, port):
    """What a TCP connect to ip:port from inside the Pod gives: connected, timeout, error."""
    rc, out = fx.in_pod(ns, pod, "python3", "-c", CONNECT, ip, str(port))
    check(rc == 0, "connect from %s/%s: %s", ns, pod, out)
    return json.loads(out.strip().splitlines()[-1])


def listening_port(ns, pod):
    """The worker's peer port (its one listening TCP socket)."""
    rc, out = fx.in_pod(ns, pod, "cat", "/proc/net/tcp")
    ports = [int(l.split()[1].split(":")[1], 16) for l in out.splitlines()[1:] if l.split()[3] == "0A"]
    check(rc == 0 and len(ports) == 1, "listening sockets of %s/%s: %s", ns, pod, out)
    return ports[0]


def intruder(job_a, job_b):
    """A Pod of job B's namespace running `pliant worker` with job B's certificate and
    manifest but job A's token, dialling B's coordinator; labelled as a worker, which
    the chart's NetworkPolicy lets reach the coordinator's ports."""
    token = fx.ok("GET", "/api/v1/namespaces/team-a/secrets/%s-pliant" % job_a)["data"]["token"]
    svc = fx.ok("GET", "/api/v1/namespaces/team-b/services/%s-coordinator" % job_b)
    env = [{"name": "PLIANT_TOKEN", "value": __import__("base64").b64decode(token).decode()},
           {"name": "PLIANT_CA", "value": "/etc/pliant/ca.crt"},
           {"name": "PLIANT_COORDINATOR", "value": "%s-coordinator.team-b.svc:%d" % (
               job_b, svc["spec"]["ports"][0]["port"])},
           {"name": "PLIANT_WORKER_NAME", "value": "intruder"}, {"name": "PLIANT_HOST", "value": "0.0.0.0"}]
    vol = {"name": "job", "secret": {"secretName": job_b + "-pliant", "items": [
        {"key": "ca.crt", "path": "ca.crt"}, {"key": "job.yaml", "path": "job.yaml"}]}}
    data = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}
    fx.create("team-b", pod_manifest("intruder", ["/usr/local/bin/pliant", "worker", "/etc/pliant/job.yaml"], env,
                                     [vol, data], [{"name": "job", "mountPath": "/etc/pliant"},
                                                   {"name": "data", "mountPath": "/data"}],
                                     {"app.kubernetes.io/name": "pliant-worker"}))
    return fx.wait_phase("team-b", "intruder", ("Failed",), 30)


@e2e_test
def two_jobs_in_two_namespaces_stay_apart():
    """Jobs A (team-a) and B (team-b) train side by side; job A's token does not open
    job B; the per-job NetworkPolicy keeps other Pods off B's workers."""
    for ns in ("team-a", "team-b"):
        restricted_namespace(ns)
    apply(tj("job-a", 10 ** 6, ns="team-a"))
    apply(tj("job-b", 10 ** 6, ns="team-b"))
    fx.create("team-b", pod_manifest("outsider", ["python3", "-c", SLEEPER]))
    usage = []
    for ns, name in (("team-a", "job-a"), ("team-b", "job-b")):
        fx.wait_status(ns, name, "step >= 20 on 2 workers", lambda st: (st.get("step") or 0) >= 20 and (
            st.get("nodes") or {}).get("ready") == "2/2", 60)
        usage.append(fx.memory("pliant", fx.leader())[0])
    before = fx.status("team-b", "job-b")
    pod = intruder("job-a", "job-b")
    log = fx.log("team-b", "intruder")
    check(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1 and
          "refused: bad token proof" in log, "the intruder:\n%s", log)
    st = fx.wait_status("team-b", "job-b", "B to go on", step_at_least(before["step"] + 20), 30)
    check(st.get("reconfigurations", 0) == before.get("reconfigurations", 0) and st["nodes"]["ready"] == "2/2",
          "job B disturbed: %s", json.dumps(st)[:800])
    usage.append(fx.memory("pliant", fx.leader())[0])
    pol = fx.ok("GET", "/apis/networking.k8s.io/v1/namespaces/team-b/networkpolicies/job-b-peers")
    check(pol["spec"]["podSelector"]["matchLabels"].get("pliant.dev/job") == "job-b", "NetworkPolicy %s", pol)
    workers = sorted(p["metadata"]["name"] for p in training_pods_of("team-b", "job-b"))
    target = fx.pod("team-b", workers[0])["status"]["podIP"]
    port = listening_port("team-b", workers[0])
    check(connect_from("team-b", workers[1], target, port) == "connected", "a worker of the job is kept off")
    got = connect_from("team-b", "outsider", target, port)
    check(got == "timeout", "a Pod outside the job connecting to a worker's port: %s", got)
    leader = fx.pod("pliant", fx.leader())["status"]["podIP"]
    got = connect_from("team-b", "outsider", leader, fx.ok("GET", "/api/v1/namespaces/team-b/services/"
                                                                  "job-b-coordinator")["spec"]["ports"][0]["port"])
    check(got == "timeout", "a Pod that is no worker connecting to the coordinator: %s", got)
    other = training_pods_of("team-a", "job-a")[0]["metadata"]["name"]
    got = connect_from("team-a", other, target, port)
    check(got == "timeout", "job A's worker connecting to job B's: %s", got)
    _, peak = fx.memory("pliant", fx.leader())
    measured("operator memory with 2 jobs running (largest usage seen, cgroup peak)", "%.1f %.1f" % (
        max(u for u in usage if u) / 2**20, peak / 2**20), "MiB")
    for ns, name in (("team-a", "job-a"), ("team-b", "job-b")):
        delete_job(ns, name)


def training_pods_of(ns, name):
    return [p for p in fx.job_pods(ns, name) if p["status"].get("phase") == "Running" and
            not p["metadata"].get("deletionTimestamp")]


# ---------------------------------------------------------------------------
# 6. Failing workers, refused Pods

@e2e_test
def crash_looping_workers_exhaust_the_backoff_limit():
    """A worker that exits at once (PLIANT_THREADS=0: exit 2), one Pod, backoffLimit 1:
    its replacement comes after the 10 s back-off, fails too, and the job Failed."""
    job = tj("crashy", 100, max_=1, runPolicy={"backoffLimit": 1})
    job["spec"]["worker"]["env"] = [{"name": "PLIANT_THREADS", "value": "0"}]
    apply(job)
    st = fx.wait_status(NS, "crashy", "phase Failed", phase_is("Failed"), 60)
    failed = clusterfixture.condition(st, "Failed") or {}
    check(failed.get("reason") == "BackoffLimitExceeded", "Failed condition %s", failed)
    check((st.get("nodes") or {}).get("failed") == 2, "status.nodes %s", st.get("nodes"))
    evs = [e for e in fx.events(NS, "crashy") if e["reason"] == "BackoffLimitExceeded"]
    check(evs and evs[0]["type"] == "Warning", "Events %s", [e["reason"] for e in fx.events(NS, "crashy")])
    ends = {}
    for name in ("crashy-w0", "crashy-w1"):
        seen = pod_seen(NS, name)
        check(seen, "no Pod %s seen", name)
        ends[name] = (seen[0][0], next((t for t, o in seen if o["status"].get("phase") == "Failed"), None))
        check(ends[name][1], "Pod %s never Failed", name)
    gap = ends["crashy-w1"][0] - ends["crashy-w0"][1]
    check(gap >= 9, "the replacement came %.1f s after the failure (back-off 10 s)", gap)
    check("PLIANT_THREADS" in fx.log(NS, "crashy-w0"), "the worker's log: %s", fx.log(NS, "crashy-w0"))
    fx.api.kubectl_ok("delete", "tj", "crashy", "-n", NS)


@e2e_test
def resource_quota_refusal_is_a_failed_create():
    """A ResourceQuota of one Pod in the job's namespace: the second worker Pod is
    refused (403 exceeded quota), a Warning Event FailedCreate and PodsCreated=False
    with the API server's message; the first Pod runs."""
    restricted_namespace("quota")
    fx.create("quota", {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1"}}}, "resourcequotas")
    apply(tj("refused", 10 ** 6, ns="quota"))
    st = fx.wait_status("quota", "refused", "PodsCreated=False", lambda st: (clusterfixture.condition(
        st, "PodsCreated") or {}).get("status") == "False", 30)
    cond = clusterfixture.condition(st, "PodsCreated")
    check(cond["reason"] == "FailedCreate" and "exceeded quota: pods" in cond["message"], "PodsCreated %s", cond)
    evs = [e for e in fx.events("quota", "refused") if e["reason"] == "FailedCreate"]
    check(evs and evs[0]["type"] == "Warning" and "exceeded quota" in evs[0].get("note", ""), "Events %s",
          [(e["reason"], e.get("note")) for e in fx.events("quota", "refused")])
    check(len(fx.job_pods("quota", "refused")) == 1, "worker Pods %s",
          [p["metadata"]["name"] for p in fx.job_pods("quota", "refused")])
    fx.api.kubectl_ok("delete", "namespace", "quota", "--wait=false")


# ---------------------------------------------------------------------------
# 7. Worker Pods, on the fault tests' job

def fault_job():
    """A job of 3 workers, one per spot node (a GPU each), F = 1, heartbeat 2 s, that
    trains until deleted; started once, running at step >= 50."""
    if state["fault"] is None:
        for node, zone in (("spot-a", "a"), ("spot-b", "b"), ("spot-c", "a"), ("spot-d", "b")):
            fx.add_node(node, zone, {"pool": "spot"})
        job = tj("ft", 10 ** 7, max_=3, tolerate=1, faultTolerance={"tolerate": 1, "heartbeatSeconds": HEARTBEAT},
                 worker={"nodeSelector": {"pool": "spot"}})
        del job["spec"]["worker"]["resources"]           # the default: one GPU, so one Pod a node
        apply(job)
        state["fault"] = "ft"
    fx.wait_status(NS, "ft", "step >= 50 with 3 workers", lambda st: (st.get("step") or 0) >= 50 and
                   (st.get("nodes") or {}).get("ready") == "3/3", 90)
    return "ft"


def training_pods(name):
    return training_pods_of(NS, name)


@e2e_test
def worker_pods_are_restricted_and_mount_only_what_they_read():
    """Admitted in the restricted namespace; from inside, the Secret's mount holds what a
    worker reads and nothing else."""
    job = fault_job()
    pods = training_pods(job)
    check(len(pods) == 3, "running worker Pods %s", [p["metadata"]["name"] for p in pods])
    for pod in pods:
        problems = e2e.worker_pod_problems(pod)
        check(not problems, "worker Pod %s: %s", pod["metadata"]["name"], "; ".join(problems))
    name = pods[0]["metadata"]["name"]
    rc, out = fx.in_pod(NS, name, "python3", "-c", INSIDE)
    check(rc == 0, "inside %s: %s", name, out)
    seen = json.loads(out.strip().splitlines()[-1])
    check(sorted(seen["etc_pliant"]) == ["ca.crt", "job.yaml", "token"], "/etc/pliant holds %s", seen["etc_pliant"])
    check(all(m == "0o440" for m in seen["modes"].values()), "/etc/pliant modes %s", seen["modes"])
    check(not seen["sa_token"], "a ServiceAccount token is mounted")
    check(seen["root_write"] == "Read-only file system", "writing / : %s", seen["root_write"])
    worker = fx.pod_pids(NS, name)[-1]
    with open("/proc/%d/status" % worker) as f:
        status = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
    check(status["Uid"].split()[0] == "65532" and int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip()
          == "1", "the worker process: Uid %s CapEff %s NoNewPrivs %s", status["Uid"], status["CapEff"],
          status["NoNewPrivs"])


INSIDE = r"""
import json, os
d = "/etc/pliant"
names = [n for n in os.listdir(d) if not n.startswith("..")]
out = {"etc_pliant": names, "modes": {n: oct(os.stat(os.path.join(d, n)).st_mode & 0o777) for n in names},
       "sa_token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount")}
try:
    open("/x", "w"); out["root_write"] = "written"
except OSError as e:
    out["root_write"] = e.strerror
print(json.dumps(out))
"""


# ---------------------------------------------------------------------------
# 4. Failures, on the fault job

def plan_members(st):
    return [n for p in ((st.get("plan") or {}).get("pipelines") or []) for n in p.get("nodes") or []]


def victim(job):
    """A worker of the current plan (of 3) and its node."""
    full_strength(job)
    st = fx.status(NS, job)
    pods = {p["metadata"]["name"]: p for p in training_pods(job)}
    name = sorted(n for n in plan_members(st) if n in pods)[0]
    return name, pods[name]["spec"]["nodeName"], st


def new_plan(job, st0, t0, what, timeout, cause=None):
    """Waits for a plan newer than st0's (whose cause names `cause`) and a step
    committed under it, both seen after t0 (the failure's time: the new plan may come
    before the command that made the failure returns): (time the new plan was seen,
    time of that step, status when the plan was seen: by the step a replacement may
    have joined already)."""
    gen0 = st0.get("planGeneration") or 0

    def replanned(st):
        last = st.get("lastReconfiguration") or {}
        return (st.get("planGeneration") or 0) > gen0 and (cause is None or cause in last.get("cause", ""))
    fx.wait_status(NS, job, what, replanned, timeout, stall=timeout)
    hist = fx.history(NS, job, t0)
    t_plan, st_plan = next((t, s) for t, s in hist if replanned(s))
    fx.wait_status(NS, job, "a step committed after " + what, lambda s: (s.get("planGeneration") or 0) > gen0 and
                   (s.get("step") or 0) > (st_plan.get("step") or 0), 30)
    t_step = next(t for t, s in fx.history(NS, job, t0) if (s.get("planGeneration") or 0) > gen0 and
                  (s.get("step") or 0) > (st_plan.get("step") or 0))
    return t_plan, t_step, st_plan


def full_strength(job, n=3):
    fx.wait_status(NS, job, "%d workers in the plan" % n, lambda st: len(plan_members(st)) == n and
                   (st.get("nodes") or {}).get("ready") == "%d/%d" % (n, n), 60)


@e2e_test
def preemption_loses_no_step():
    """A spot preemption with notice: the worker gets SIGTERM, leaves at the step
    boundary; no committed step is lost and no checkpoint read; a replacement joins."""
    job = fault_job()
    name, node, st0 = victim(job)
    t0 = time.monotonic()
    fx.node_action(node, "preempt")
    t_plan, t_step, st = new_plan(job, st0, t0, "the plan without %s" % name, 30, "leaving " + name)
    last = st["lastReconfiguration"]
    check(last["fromCheckpoint"] is False, "lastReconfiguration %s", last)
    check_steps_monotonic(fx.history(NS, job, t0 - 1))
    # the plan moves on when the worker says it leaves; its process exits a moment
    # later (within the Pod's grace, 5 s), which a loaded machine can put after the step
    ended = e2e.wait_for("the preempted Pod %s to end" % name,
                         lambda: [t for t, p in pod_seen(NS, name) if p["status"].get("phase") == "Failed"], 10, 0.2)
    measured("preemption notice to the worker's exit", "%.1f" % (ended[0] - t0), "s")
    measured("preemption notice to the plan without it", "%.1f" % (t_plan - t0), "s")


@e2e_test
def silent_node_loss_is_detected_by_heartbeats():
    """The link of a worker's node goes down (no FIN, no RST): the coordinator misses
    its heartbeats (heartbeatSeconds 2) and re-plans without a checkpoint."""
    job = fault_job()
    name, node, st0 = victim(job)
    t0, wall0 = time.monotonic(), time.time()
    fx.node_action(node, "lose")
    try:
        t_plan, t_step, st = new_plan(job, st0, t0, "the plan without %s" % name, 30, "lost " + name)
    finally:
        fx.node_action(node, "restore")
    last = st["lastReconfiguration"]
    check("missed heartbeats" in last["cause"] and last["fromCheckpoint"] is False, "lastReconfiguration %s", last)
    # when the coordinator re-planned (lastReconfiguration.time, whole seconds, so at most
    # 1 s early); status shows it a status write later, which a loaded machine delays
    detected = calendar.timegm(time.strptime(last["time"], "%Y-%m-%dT%H:%M:%SZ")) - wall0
    check(detected <= 3 * HEARTBEAT + 1, "the coordinator re-planned %.1f s after the loss (3 heartbeats: %d s)",
          detected, 3 * HEARTBEAT)
    check_steps_monotonic(fx.history(NS, job, t0 - 1))
    measured("silent node loss to the plan in status (heartbeat %d s)" % HEARTBEAT, "%.1f" % (t_plan - t0), "s")
    measured("silent node loss to the next committed step (heartbeat %d s)" % HEARTBEAT, "%.1f" % (t_step - t0), "s")


@e2e_test
def partitions_end_in_a_new_plan():
    """A node cut off from its peers but not from the coordinator, then one cut off
    from the coordinator only: each ends in a new plan without that worker (not a
    hang), and training goes on; the worker taken out is told to exit, and its
    replacement Pod (after the failure's back-off) joins."""
    job = fault_job()
    for action, cause in (("partition-from-peers", "lost %s (peer_broken: its links to"), ("partition-from-coordinator",
                                                                            "lost %s (missed heartbeats")):
        name, node, st0 = victim(job)
        t0 = time.monotonic()
        fx.node_action(node, action)
        try:
            t_plan, t_step, st = new_plan(job, st0, t0, "a plan without %s after %s" % (name, action), 40,
                                          cause % name)
        finally:
            fx.node_action(node, "restore")
        check(st["lastReconfiguration"]["fromCheckpoint"] is False, "lastReconfiguration %s",
              st["lastReconfiguration"])
        measured("%s to the next committed step" % action, "%.1f" % (t_step - t0), "s")


def oom_killed(ns, name):
    """The Pod's container status when its container was OOMKilled at least once."""
    pod = fx.pod(ns, name) or {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (cs.get("state"), cs.get("lastState")):
            if ((state or {}).get("terminated") or {}).get("reason") == "OOMKilled":
                return cs
    return None


@e2e_test
def leader_pod_oomkilled_mid_step_the_job_continues():
    """The leading operator Pod's memory exhausted while the job trains: the kernel
    OOM-kills the operator; the operator that takes the Lease next (the Pod's restarted
    container, whose identity holds the Lease, or else the other replica once it
    expires) goes on from the same step with the same worker Pods, without a
    checkpoint."""
    job = fault_job()
    leader = fx.leader()
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in training_pods(job)}
    st0 = fx.status(NS, job)
    t0 = time.monotonic()
    fx.oom_kill("pliant", leader)
    t_oom, at = time.monotonic(), fx.status(NS, job).get("step") or 0
    cs = e2e.wait_for("the operator Pod %s OOMKilled" % leader, lambda: oom_killed("pliant", leader), 30, 0.1)
    check(cs["restartCount"] >= 1, "the OOMKilled operator Pod %s: %s", leader, cs)
    st = fx.wait_status(NS, job, "training to go on", step_at_least(at + 50), 90, stall=90)
    t_step = next(t for t, s in fx.history(NS, job, t_oom) if (s.get("step") or 0) > at)
    now = fx.leader()
    check_steps_monotonic(fx.history(NS, job, t0 - 1))
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in training_pods(job)}
    check(after == before, "worker Pods %s after the OOM kill, %s before", after, before)
    check(st.get("planGeneration") == st0.get("planGeneration") or
          not (st.get("lastReconfiguration") or {}).get("fromCheckpoint"),
          "a checkpoint was read after the OOM kill: %s", st.get("lastReconfiguration"))
    fx.wait_ready("pliant", leader, 60)
    measured("leader Pod OOMKilled to a step committed under the next leader (%s)" % (
        "its restarted container" if now == leader else "the other replica"), "%.1f" % (t_step - t_oom), "s")


@e2e_test
def leader_pod_deleted_mid_step_the_other_replica_continues():
    """The leading operator Pod deleted while the job trains: the other replica takes
    the Lease, points the job's EndpointSlice at itself and goes on from the same step
    with the same worker Pods."""
    job = fault_job()
    leader = fx.leader()
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in training_pods(job)}
    st0 = fx.status(NS, job)
    t0 = time.monotonic()
    fx.api.kubectl_ok("delete", "pod", leader, "-n", "pliant", "--wait=false")
    other = e2e.wait_for("another operator Pod to lead", lambda: (lambda l: l if l and l != leader else None)(
        fx.leader()), 60, 0.1)
    t_lead, at = time.monotonic(), fx.status(NS, job).get("step") or 0
    ip = fx.pod("pliant", other)["status"]["podIP"]
    slice_path = "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices/%s-coordinator" % (NS, job)
    e2e.wait_for("the EndpointSlice to name the new leader", lambda: fx.api.get(slice_path)["endpoints"][0][
        "addresses"] == [ip], 30, 0.2)
    fx.wait_status(NS, job, "training to go on", step_at_least(at + 50), 60, stall=60)
    t_step = next(t for t, s in fx.history(NS, job, t_lead) if (s.get("step") or 0) > at)
    check_steps_monotonic(fx.history(NS, job, t0 - 1))
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in training_pods(job)}
    check(after == before, "worker Pods %s after the failover, %s before", after, before)
    measured("leader Pod deleted to the other replica leading", "%.1f" % (t_lead - t0), "s")
    measured("leader Pod deleted to a step committed under the new leader", "%.1f" % (t_step - t0), "s")
    delete_job(NS, job)

# ---------------------------------------------------------------------------
# 1. Every request the operator made in this file, allowed

@e2e_test
def no_403_for_the_operator_in_the_whole_file():
    """Every request of the operator's ServiceAccount that the API server logged while
    the tests above ran was allowed by its RBAC (admission may refuse some: a quota, a
    namespace being deleted)."""
    audit_requests()
    check(state["seq"] > 0 and state["unseen"] == 0, "the request log dropped %d requests between checks (of %d)",
          state["unseen"], state["seq"])
    check(not state["denied"], "403 for the operator: %s", [(r["method"], r["path"], r.get("message"))
                                                            for r in state["denied"]][:5])


if __name__ == "__main__":
    sys.exit(suite.main())
