#!/usr/bin/env python3
"""End-to-end tests of `pliant-operator` against the Kubernetes API
emulator (tests/k8s/apiserver.py: fake kubelets run the worker Pods as local
`pliant worker` processes), with kubectl as the client.

Run: python3 tests/cli/test_operator_e2e.py --build build [-k SUBSTRING]

One emulator (TLS + token, 4 nodes of 2 GPUs in zones a,b,c, a state log) is
started for the whole file, then one operator watching namespace `default` (writing
each job's EndpointSlice with address 127.0.0.1 and a NetworkPolicy per job).
  crd_applies_and_kubectl_shows_the_columns     kubectl apply -f crds/; a job; kubectl get tj columns
  invalid_manifests_are_rejected_by_the_schema  kubectl apply refused, message naming the field
  job_runs_to_succeeded                         status (cost too), Events, Secret/Service/Pods, metrics
  dashboard_serves_each_job_on_the_leader       status.dashboard, the page and its feed, the final page
  deleted_worker_pod_is_replaced_without_restart     a Pod deleted mid-training
  deleted_node_loses_two_pods_without_restart        a Node deleted (F = 2, 5 Pods)
  unreadable_status_plan_restarts_the_workers   status.plan emptied under a killed operator
  invalid_spec_gets_a_failed_condition          specs beyond the schema
  api_faults_are_retried                        injected 500/409/timeouts and a forced re-list
  foreign_secret_is_not_reused                  a <job>-pliant Secret the job does not own: SecretConflict
  deleting_the_job_removes_what_it_created      kubectl delete tj mid-training; its metrics go
  long_job_name_gets_short_object_names         a 253-character job name; names and labels <= 63
  pending_job_meets_its_deadline                activeDeadlineSeconds from startTime, Pending included
  refused_pods_and_worker_pod_fields            403 on Pod creation (FailedCreate); spec.worker's Pod fields
  failed_pods_back_off_then_exhaust_the_backoff_limit   killed workers: back-off, BackoffLimitExceeded
  log_levels                                    --log-level error|warn|info|debug
  workers_profile_evaluate_and_checkpoint       profile auto, evalEvery, checkpoints: status, resume
  leader_failover_continues_training            two operators with --leader-elect; the EndpointSlice follows,
                                                the dashboard too (503 on the follower); a job
                                                created leaderless gets its own port; a port
                                                still held makes the new leader wait (PortInUse)
The first two need only the emulator and kubectl; the others are skipped while
build/bin/pliant-operator is missing, and the failover test while
`pliant-operator --version`/`--help` does not mention hello_resume (workers
reconnecting to a new leader). On a failure the operator's and emulator's
stderr tails and the job's worker logs are printed. Jobs that must outlast a
disruption are sized from the step rate the previous job ran at (about 20 s of
training); the disruption comes at 1/8 of their steps. PLIANT_E2E_VERBOSE=1
prints progress as "#" context lines. Standard library only.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "k8s"))

from clitest import REPO, SHAKESPEARE, WS, Failure, Suite, check, flatten, read_feed  # noqa: E402
import e2e  # noqa: E402
from e2e import E2EFailure  # noqa: E402

suite = Suite("operator_e2e", needs=[SHAKESPEARE])

KUBECTL = shutil.which("kubectl")
TLS = bool(shutil.which("openssl"))      # kubectl sends a token only over https
GROUP_VERSION = "pliant.dev/v1alpha1"
NS = "default"
OPERATOR_NS = "pliant-system"      # where the operator would run (the per-job NetworkPolicy's peer)
CRD_NAME = "trainingjobs.pliant.dev"
COLUMNS = ["NAME", "PHASE", "STEP", "STEPS", "LOSS", "NODES", "PIPELINES", "AGE"]
WIDE_COLUMNS = COLUMNS + ["PROGRESS", "RUNNING", "MAX", "RECONFIGURATIONS"]
PIPELINES_RE = re.compile(r"^\d+x\d+(\+\d+x\d+)*$")
FAILOVER_SKIP = "leader failover: operator reports no hello_resume support"

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
  namespace: {ns}
spec:
  model: {{layers: 3, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: 8, micro: 2, seqLen: 32}}
  optimizer: {{lr: 3.0e-3, warmupSteps: 2}}
  steps: {steps}
  evalEvery: 0
  profile: synthetic
  nodes: {{min: 1, max: {max}}}
  faultTolerance: {{tolerate: {tolerate}}}
  # the fake kubelet's Pods share this machine's cores: one compute thread each
  worker: {{terminationGracePeriodSeconds: 5, env: [{{name: PLIANT_THREADS, value: "1"}}]}}
{extra}"""

state = {"emu": None, "op": None, "pods": None, "jobs": None, "ops": [], "operator_bin": None}


# ---------------------------------------------------------------------------
# Fixtures

def emu():
    """The emulator (started once), with Recorders of every Pod and TrainingJob."""
    if state["emu"] is None:
        args = ["--kubelet", "--nodes", "4", "--zones", "a,b,c", "--gpus-per-node", "2"]
        state["emu"] = e2e.Emulator(os.path.join(suite.tmp, "cluster"), args, kubectl=KUBECTL or "kubectl",
                                    tls=TLS)
        state["pods"] = e2e.Recorder(state["emu"], "/api/v1/pods")
    return state["emu"]


def ensure_crd():
    e = emu()
    if e.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + CRD_NAME) is None:
        e.kubectl_ok("apply", "-f", os.path.join(REPO, "crds"))
    if state["jobs"] is None:
        wait_for("trainingjobs served", lambda: e.request("GET", "/apis/pliant.dev/v1alpha1/trainingjobs")[0] == 200,
                 10)
        state["jobs"] = e2e.Recorder(e, "/apis/pliant.dev/v1alpha1/trainingjobs")


def operator():
    """The operator watching namespace default (started once, after the CRD)."""
    if state.get("broken"):
        raise Failure(state["broken"])
    ensure_crd()
    old = state["op"]
    if old is not None and old.dead():
        why = old.dead()
        old.killed = True          # reported once: the next test starts a fresh one
        raise Failure("the operator died since the previous test: " + why)
    if old is None or not old.alive():
        op = e2e.Operator(state["operator_bin"], emu(), os.path.join(suite.tmp, "operator"), "operator",
                          ["--namespace", NS, "--coordinator-host", "127.0.0.1", "--worker-command",
                           suite.pliant, "--advertise-address", "127.0.0.1", "--job-network-policy",
                           "--operator-namespace", OPERATOR_NS])
        state["op"] = op
        state["ops"].append(op)
        try:
            wait_for("the operator's /healthz", lambda: op.health("/healthz")[0] == 200, 20, alive=op.dead)
        except Failure as e:
            state["broken"] = "the operator never answered /healthz (see the first failure): %s" % str(e)[:300]
            raise
    return state["op"]


def wait_for(what, fn, timeout=30.0, interval=0.1, alive=None):
    try:
        return e2e.wait_for(what, fn, timeout, interval, alive)
    except E2EFailure as e:
        raise Failure(str(e))


def ops_dead():
    for op in state["ops"]:
        why = op.dead()
        if why:
            return why
    if state["emu"] is not None and not state["emu"].alive():
        return "the emulator exited:\n" + state["emu"].stderr_tail(20)
    return None


def data_prefix():
    return suite.shakespeare_shards(100000)


def job_manifest(name, steps, ns=NS, max_=3, tolerate=1, extra=""):
    return JOB.format(name=name, ns=ns, data=data_prefix(), steps=steps, max=max_, tolerate=tolerate,
                      extra=extra)


def apply(manifest):
    return emu().kubectl_ok("apply", "-f", "-", stdin=manifest)


def table(out):
    """kubectl's table output as [{COLUMN: value}] (columns cut at the header's
    offsets, so empty cells stay empty)."""
    lines = [l for l in out.splitlines() if l.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [len(line) + 1])]
        rows.append(dict(zip(names, cells)))
    return names, rows


def rate():
    """Steps per second the operator's jobs ran at (the last finished job's), used to
    size the jobs that must outlast a disruption; 10 until a job has finished."""
    return state.get("rate") or 10.0


def note_rate(st):
    try:
        t0 = time.mktime(time.strptime(st["startTime"][:19], "%Y-%m-%dT%H:%M:%S"))
        t1 = time.mktime(time.strptime(st["completionTime"][:19], "%Y-%m-%dT%H:%M:%S"))
        if t1 > t0 and st.get("step"):
            state["rate"] = st["step"] / (t1 - t0)
    except (KeyError, ValueError, TypeError):
        pass


def long_steps(seconds=20):
    """Steps for a job that should train about `seconds` at the measured rate."""
    return int(min(20000, max(150, rate() * seconds)))


def tj_path(name, ns=NS):
    return "/apis/pliant.dev/v1alpha1/namespaces/%s/trainingjobs/%s" % (ns, name)


def get_tj(name, ns=NS):
    return emu().get(tj_path(name, ns))


def status_of(name, ns=NS):
    """The job's status as the TrainingJob Recorder last saw it (a GET before it saw any)."""
    seen = state["jobs"].objects(lambda o: o["metadata"]["name"] == name and o["metadata"].get("namespace") == ns)
    if seen:
        return {} if seen[-1][1] == "DELETED" else (seen[-1][2].get("status") or {})
    tj = get_tj(name, ns)
    return (tj or {}).get("status") or {}


VERBOSE = bool(os.environ.get("PLIANT_E2E_VERBOSE"))
T0 = time.monotonic()


def say(msg, *args):
    """A context line (PLIANT_E2E_VERBOSE=1): progress with the seconds since the start."""
    if VERBOSE:
        print("# %6.1f %s" % (time.monotonic() - T0, msg % args if args else msg))
        sys.stdout.flush()


def wait_status(name, what, pred, timeout, ns=NS, stall=30.0):
    """Polls the job until pred(status); fails early if an operator or the emulator
    died, if the job Failed (unless that is what pred wants), or if status.step stood
    still for `stall` seconds while the job was Running."""
    last = {"step": None, "since": time.monotonic()}
    start = time.monotonic()

    def poll():
        st = status_of(name, ns)
        if pred(st):
            return st or True
        if st.get("phase") == "Failed":
            raise Failure("job %s Failed while waiting for %s: %s" % (name, what, json.dumps(st)[:1500]))
        if not st.get("phase") and time.monotonic() - start > 30:
            raise Failure("job %s: no status.phase written in 30 s (waiting for %s)" % (name, what))
        step = st.get("step")
        if step != last["step"]:
            say("%s: phase %s step %s nodes %s reconfigurations %s", name, st.get("phase"), step,
                (st.get("nodes") or {}).get("ready"), st.get("reconfigurations"))
            last["step"], last["since"] = step, time.monotonic()
        elif st.get("phase") == "Running" and time.monotonic() - last["since"] > stall:
            raise Failure("job %s: status.step stuck at %s for %.0f s while waiting for %s: %s"
                          % (name, step, stall, what, json.dumps(st)[:1500]))
        return None
    say("%s: waiting for %s", name, what)
    got = wait_for("%s (job %s)" % (what, name), poll, timeout, 0.05, alive=ops_dead)
    say("%s: got %s", name, what)
    return got


def step_at_least(n):
    return lambda st: (st.get("step") or 0) >= n


def succeeded(st):
    return st.get("phase") == "Succeeded"


def step_history(name, ns=NS):
    """status.step values in the order the Recorder saw them (None dropped)."""
    out = []
    for _, typ, o in state["jobs"].objects(lambda o: o["metadata"]["name"] == name and
                                           o["metadata"].get("namespace") == ns):
        s = (o.get("status") or {}).get("step")
        if s is not None and typ != "DELETED":
            out.append(s)
    return out


def check_monotonic(name, ns=NS, slack=0):
    hist = step_history(name, ns)
    for a, b in zip(hist, hist[1:]):
        check(b >= a - slack, "job %s: status.step went back from %d to %d (restart or redone steps): %s",
              name, a, b, hist[-60:])
    return hist


def job_pods(name, ns=NS):
    """Names of the job's worker Pods ever seen (label pliant.dev/job)."""
    return state["pods"].names(lambda o: o["metadata"].get("namespace") == ns and
                               (o["metadata"].get("labels") or {}).get("pliant.dev/job") == name)


def pods_now(name, ns=NS):
    lst = emu().ok("GET", "/api/v1/namespaces/%s/pods?labelSelector=pliant.dev%%2Fjob%%3D%s" % (ns, name))
    return lst["items"]


def running_pods(name, ns=NS):
    return [p for p in pods_now(name, ns) if p["status"].get("phase") == "Running" and
            not p["metadata"].get("deletionTimestamp")]


def job_events(name, ns=NS):
    """events.k8s.io/v1 Events regarding the TrainingJob."""
    lst = emu().ok("GET", "/apis/events.k8s.io/v1/namespaces/%s/events" % ns)["items"]
    return [ev for ev in lst if (ev.get("regarding") or {}).get("name") == name and
            (ev.get("regarding") or {}).get("kind") == "TrainingJob"]


def event_reasons(name, ns=NS):
    return [ev.get("reason") for ev in job_events(name, ns)]


def process_gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def pod_index(pod_name, job):
    m = re.match(re.escape(job) + r"-w(\d+)$", pod_name)
    return int(m.group(1)) if m else None


def crd_has(field):
    """Whether the CRD file mentions a field name (status fields the schema would prune)."""
    with open(os.path.join(REPO, "crds", "trainingjob.yaml")) as f:
        return re.search(r"^\s+%s:\s*$" % re.escape(field), f.read(), re.M) is not None


def diagnostics(jobs=()):
    """Stderr tails of the operators and the emulator, and the job's worker logs."""
    lines = []
    for op in state["ops"]:
        lines.append("--- %s (%s) stderr tail:" % (op.name, "running" if op.alive() else
                                                    "exited %s" % op.proc.returncode))
        lines.append(op.stderr_tail(30))
    if state["emu"] is not None:
        lines.append("--- emulator (%s) stderr tail:" % ("running" if state["emu"].alive() else "exited"))
        lines.append(state["emu"].stderr_tail(15))
        for job, ns in jobs:
            try:
                st = status_of(job, ns)
                lines.append("--- job %s status: %s" % (job, json.dumps(st)[:1500]))
                for pod in pods_now(job, ns)[:6]:
                    log = state["emu"].text("/api/v1/namespaces/%s/pods/%s/log" % (ns, pod["metadata"]["name"]))
                    lines.append("--- pod %s (%s) log tail:" % (pod["metadata"]["name"],
                                                               pod["status"].get("phase")))
                    lines.append("\n".join(log.splitlines()[-8:]))
            except Exception as e:  # noqa: BLE001 -- diagnostics are best-effort
                lines.append("(diagnostics failed: %s)" % e)
    return "\n".join(lines)


_groups = {"emulator": [], "operator": [], "failover": []}


def e2e_test(group, jobs=()):
    """Registers a test of a group (emulator: needs kubectl; operator: needs the
    operator binary too; failover: and hello_resume). On a failure the diagnostics
    are appended to the message."""
    def wrap(fn):
        def run():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- every failure gets the diagnostics
                raise Failure("%s: %s\n%s" % (type(e).__name__, e, diagnostics(
                    [(j, NS) if isinstance(j, str) else j for j in jobs]) if group != "emulator" else
                    (state["emu"].stderr_tail(15) if state["emu"] else "")))
        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        _groups[group].append(run)
        return run
    return wrap


def owned_by(name, ns=NS):
    """Objects of a recorded kind are the job's when their controller ownerReference names it."""
    return lambda o: o["metadata"].get("namespace") == ns and any(
        r.get("kind") == "TrainingJob" and r.get("name") == name and r.get("controller")
        for r in o["metadata"].get("ownerReferences") or [])


def check_network_objects(job, address, ns=NS, service=None):
    """The job's coordinator Service has no selector (a Service selects Pods of its own
    namespace only); its EndpointSlice names `address` and the Service's port; the
    per-job NetworkPolicy admits the job's Pods and the operator's."""
    service = service or job + "-coordinator"
    svc = emu().get("/api/v1/namespaces/%s/services/%s" % (ns, service))
    check(svc is not None, "no Service %s/%s", ns, service)
    check(not svc["spec"].get("selector"), "Service %s has a selector: %s", service, svc["spec"])
    port = svc["spec"]["ports"][0]
    sl = emu().get("/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices/%s" % (ns, service))
    check(sl is not None, "no EndpointSlice %s/%s", ns, service)
    check((sl["metadata"].get("labels") or {}).get("kubernetes.io/service-name") == service,
          "EndpointSlice labels %s", sl["metadata"].get("labels"))
    check([e["addresses"] for e in sl["endpoints"]] == [[address]] and
          sl["endpoints"][0].get("conditions", {}).get("ready") is True,
          "EndpointSlice endpoints %s, want %s ready", sl["endpoints"], address)
    check(sl["ports"] == [{"name": port["name"], "protocol": "TCP", "port": port["port"]}],
          "EndpointSlice ports %s, Service ports %s", sl["ports"], svc["spec"]["ports"])
    label = (svc["metadata"].get("labels") or {}).get("pliant.dev/job")
    pols = [o for o in emu().ok("GET", "/apis/networking.k8s.io/v1/namespaces/%s/networkpolicies" % ns)["items"]
            if owned_by(job, ns)(o)]
    check(len(pols) == 1, "NetworkPolicies of job %s: %s", job, [p["metadata"]["name"] for p in pols])
    spec = pols[0]["spec"]
    check(spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "pliant-worker", "pliant.dev/job": label}
          and spec["policyTypes"] == ["Ingress"], "NetworkPolicy %s", spec)
    peers = [r["from"][0] for r in spec["ingress"]]
    check(peers[0]["podSelector"] == spec["podSelector"] and
          peers[1]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": OPERATOR_NS},
          "NetworkPolicy ingress %s", spec["ingress"])


def check_worker_pod(pod):
    """A worker Pod passes Pod Security "restricted" and reads only what workers need."""
    problems = e2e.worker_pod_problems(pod)
    check(not problems, "worker Pod %s: %s", pod["metadata"]["name"], "; ".join(problems))


def check_job_metrics(samples, text, job, steps, ns=NS):
    """The job's series are labelled trainingjob and trainingjob_namespace (never job or
    namespace, which Prometheus gives the target), and include workers, checkpoints and
    the loss; pliant_leader is 1."""
    lab = {"trainingjob": job, "trainingjob_namespace": ns}
    for name in ("pliant_steps_total", "pliant_workers_desired", "pliant_workers_ready",
                 "pliant_preemptions_total", "pliant_failed_pods_total", "pliant_reconfigurations_total",
                 "pliant_checkpoints_total", "pliant_loss"):
        check(e2e.metric_sum(samples, name, **lab) is not None, "/metrics lacks %s%s:\n%s", name, lab, text[:3000])
    check(e2e.metric_sum(samples, "pliant_steps_total", **lab) >= steps, "pliant_steps_total of %s", job)
    check(e2e.metric_sum(samples, "pliant_workers_desired", **lab) == 3, "pliant_workers_desired of %s", job)
    check(0 < e2e.metric_sum(samples, "pliant_loss", **lab) < 10, "pliant_loss of %s", job)
    bad = [k for k in samples if any(name in ("job", "namespace") for name, _ in k[1])]
    check(not bad, "series labelled job or namespace: %s", bad[:5])
    check(e2e.metric_sum(samples, "pliant_leader") == 1, "pliant_leader %s", e2e.metric_sum(samples, "pliant_leader"))


def kill_worker(pod_name, ns=NS, sig=9):
    """SIGKILL (or sig) of a worker Pod's process: the Pod fails on its own (no disruption)."""
    pod = emu().get("/api/v1/namespaces/%s/pods/%s" % (ns, pod_name))
    cid = ((pod or {}).get("status", {}).get("containerStatuses") or [{}])[0].get("containerID", "")
    check("//" in cid, "pod %s has no process: %s", pod_name, cid)
    os.kill(int(cid.split("//")[1]), sig)


# ---------------------------------------------------------------------------
# Emulator + kubectl only

@e2e_test("emulator")
def crd_applies_and_kubectl_shows_the_columns():
    """kubectl apply -f crds/ establishes TrainingJobs (short name tj); a suspended job
    is accepted with the schema's defaults and `kubectl get tj` prints the CRD's
    printer columns (the wide ones with -o wide)."""
    e = emu()
    out = e.kubectl_ok("apply", "-f", os.path.join(REPO, "crds"))
    check("customresourcedefinition.apiextensions.k8s.io/%s" % CRD_NAME in out, "kubectl apply -f crds/: %s", out)
    ensure_crd()
    e.kubectl_ok("create", "namespace", "schema")
    try:
        out = apply(job_manifest("columns", 5, ns="schema", extra="  runPolicy: {suspend: true}\n"))
        check("trainingjob.pliant.dev/columns created" in out, "apply: %s", out)
        tj = get_tj("columns", "schema")
        spec = tj["spec"]
        check(spec["optimizer"]["schedule"] == "cosine" and spec["checkpoint"]["resume"] == "auto" and
              spec["faultTolerance"]["strategy"] == "templates" and spec["nodes"]["gpusPerNode"] == 1,
              "schema defaults not applied: %s", json.dumps(spec)[:800])
        out = e.kubectl_ok("get", "tj", "-n", "schema")
        lines = out.splitlines()
        check(lines[0].split() == COLUMNS, "kubectl get tj header %s, want %s", lines[0].split(), COLUMNS)
        check(lines[1].split()[0] == "columns", "kubectl get tj:\n%s", out)
        out = e.kubectl_ok("get", "trainingjobs.pliant.dev", "columns", "-n", "schema", "-o", "wide")
        names, rows = table(out)
        check(names == WIDE_COLUMNS, "kubectl get -o wide header:\n%s", out)
        check(rows[0]["STEPS"] == "5" and rows[0]["MAX"] == "3", "STEPS / MAX columns (spec):\n%s", out)
        out = e.kubectl_ok("get", "pliant", "-n", "schema")     # the category
        check("columns" in out, "kubectl get pliant (category):\n%s", out)
    finally:
        e.kubectl("delete", "namespace", "schema", "--wait=false")


@e2e_test("emulator")
def invalid_manifests_are_rejected_by_the_schema():
    """kubectl apply of manifests the CRD schema refuses: exit status 1, the message
    names the field, nothing is stored."""
    ensure_crd()
    e = emu()
    base = job_manifest("bad", 5, extra="  runPolicy: {suspend: true}\n")
    cases = [
        ("micro 0", base.replace("micro: 2", "micro: 0"), ["spec.batch.micro"]),
        ("micro does not divide global", base.replace("micro: 2", "micro: 3"),
         ["spec.batch.micro", "must divide spec.batch.global"]),
        ("seqLen above maxSeqLen", base.replace("seqLen: 32", "seqLen: 128"), ["spec.batch.seqLen"]),
        ("no data.train", base.replace("train: ", "val: "), ["spec.data.train"]),
        ("unknown strategy", base.replace("tolerate: 1", "tolerate: 1, strategy: restart"),
         ["spec.faultTolerance.strategy", "Unsupported value"]),
        ("negative tolerate", base.replace("tolerate: 1", "tolerate: -1"), ["spec.faultTolerance.tolerate"]),
        ("no steps", base.replace("  steps: 5\n", ""), ["spec.steps", "Required"]),
        ("heads do not divide channels", base.replace("heads: 2", "heads: 3"), ["spec.model.heads"]),
        ("nodes.max below min", base.replace("min: 1, max: 3", "min: 4, max: 3"), ["spec.nodes.max"]),
    ]
    for what, manifest, needles in cases:
        check(manifest != base, "case %s did not change the manifest", what)
        rc, out = e.kubectl("apply", "-f", "-", stdin=manifest)
        check(rc != 0, "%s: kubectl apply accepted it:\n%s", what, out)
        for needle in needles:
            check(needle in out, "%s: kubectl's message lacks %r:\n%s", what, needle, out)
        check(get_tj("bad") is None, "%s: the invalid job was stored", what)


# ---------------------------------------------------------------------------
# With the operator

@e2e_test("operator", jobs=["basic"])
def job_runs_to_succeeded():
    """a 3-node job runs to Succeeded; kubectl get tj shows its
    columns; status, conditions and Events are filled; the Secret, Service and
    worker Pods exist with labels and controller ownerReferences; /healthz,
    /readyz and /metrics answer."""
    op = operator()
    steps = 100
    apply(job_manifest("basic", steps, extra="  cost: {spot: 0.918, onDemand: 3.06}\n"))
    st = wait_status("basic", "Succeeded", succeeded, 90)
    note_rate(st)
    tj = get_tj("basic")
    uid = tj["metadata"]["uid"]
    # status
    check(st.get("step") == steps, "status.step %s, want %d", st.get("step"), steps)
    check(st.get("observedGeneration") == tj["metadata"]["generation"], "observedGeneration %s, generation %s",
          st.get("observedGeneration"), tj["metadata"]["generation"])
    check(abs(float(st.get("progressPercentage", -1)) - 100) < 1e-6, "progressPercentage %s",
          st.get("progressPercentage"))
    check(isinstance(st.get("loss"), (int, float)) and 0 < st["loss"] < 10, "loss %s", st.get("loss"))
    check(isinstance(st.get("samplesPerSecond"), (int, float)) and st["samplesPerSecond"] > 0,
          "samplesPerSecond %s", st.get("samplesPerSecond"))
    nodes = st.get("nodes") or {}
    check(nodes.get("desired") == 3, "status.nodes.desired %s, want 3: %s", nodes.get("desired"), nodes)
    check(re.match(r"^\d+/3$", str(nodes.get("ready", ""))), "status.nodes.ready %r, want 'N/3'", nodes.get("ready"))
    check(PIPELINES_RE.match(str(st.get("pipelines", ""))), "status.pipelines %r", st.get("pipelines"))
    check((st.get("planGeneration") or 0) >= 1, "planGeneration %s", st.get("planGeneration"))
    check((st.get("reconfigurations") or 0) == 0, "reconfigurations %s in an undisturbed run "
          "(the first plan waits for every Pod)", st.get("reconfigurations"))
    for key in ("startTime", "completionTime"):
        check(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$", str(st.get(key, ""))), "status.%s %r", key,
              st.get(key))
    check(st["startTime"] <= st["completionTime"], "startTime %s after completionTime %s", st["startTime"],
          st["completionTime"])
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    check("Succeeded" in conds and conds["Succeeded"].get("status") == "True",
          "no Succeeded=True condition: %s", st.get("conditions"))
    for c in st["conditions"]:
        check(c.get("status") in ("True", "False", "Unknown") and c.get("reason") and c.get("lastTransitionTime"),
              "condition lacks status/reason/lastTransitionTime: %s", c)
    check(conds["Succeeded"].get("observedGeneration") in (None, tj["metadata"]["generation"]),
          "Succeeded condition observedGeneration %s", conds["Succeeded"].get("observedGeneration"))
    hist = check_monotonic("basic")
    check(hist and hist[-1] == steps, "status.step history %s", hist[-20:])
    # kubectl get tj
    out = emu().kubectl_ok("get", "tj", "basic")
    names, rows = table(out)
    check(names == COLUMNS, "kubectl get tj header %s", names)
    row = rows[0]
    check([row[c] for c in COLUMNS[:4]] == ["basic", "Succeeded", str(steps), str(steps)], "kubectl get tj:\n%s",
          out)
    check(re.match(r"^\d+(\.\d+)?(e[-+]?\d+)?$", row["LOSS"]), "LOSS column %r", row["LOSS"])
    check(re.match(r"^\d+/3$", row["NODES"]) and PIPELINES_RE.match(row["PIPELINES"]), "NODES / PIPELINES:\n%s",
          out)
    out = emu().kubectl_ok("get", "tj", "basic", "-o", "wide")
    names, rows = table(out)
    check(names == WIDE_COLUMNS and rows[0]["PROGRESS"] == "100" and rows[0]["MAX"] == "3" and
          rows[0]["RECONFIGURATIONS"].isdigit(), "kubectl get tj -o wide:\n%s", out)
    # Events
    reasons = event_reasons("basic")
    for r in ("Started", "Succeeded"):
        check(r in reasons, "no %s Event for the job (reasons %s)", r, reasons)
    for ev in job_events("basic"):
        check(ev.get("reportingController") and ev.get("type") in ("Normal", "Warning") and ev.get("note"),
              "Event lacks reportingController/type/note: %s", json.dumps(ev)[:500])
    # what it created
    secret = emu().get("/api/v1/namespaces/default/secrets/basic-pliant")
    check(secret is not None, "no Secret basic-pliant")
    keys = set((secret.get("data") or {}).keys())
    check("token" in keys and "job.yaml" in keys and any(re.search("crt|pem|cert", k) for k in keys),
          "Secret basic-pliant keys %s (want token, job.yaml and a certificate)", sorted(keys))
    check(emu().get("/api/v1/namespaces/default/services/basic-coordinator") is not None,
          "no Service basic-coordinator")
    names = job_pods("basic")
    check(sorted(names) == ["basic-w0", "basic-w1", "basic-w2"], "worker Pods %s, want basic-w0..w2", names)
    pod = [o for _, _, o in state["pods"].objects(lambda o: o["metadata"]["name"] == "basic-w0")][0]
    labels = pod["metadata"].get("labels") or {}
    check(labels.get("app.kubernetes.io/name") == "pliant-worker", "worker Pod labels %s", labels)
    container = pod["spec"]["containers"][0]
    argv = (container.get("command") or []) + (container.get("args") or [])
    check(argv[:3] == [suite.pliant, "worker", "/etc/pliant/job.yaml"], "worker command %s", argv)
    for kind, obj in (("Secret", secret), ("Service", emu().get("/api/v1/namespaces/default/services/"
                                                                  "basic-coordinator")), ("Pod", pod)):
        refs = obj["metadata"].get("ownerReferences") or []
        check(any(r.get("uid") == uid and r.get("controller") is True and r.get("kind") == "TrainingJob"
                  for r in refs), "%s %s: no controller ownerReference to the job: %s", kind,
              obj["metadata"]["name"], refs)
    check_network_objects("basic", "127.0.0.1")
    check_worker_pod(pod)
    # health and metrics
    for path in ("/healthz", "/readyz"):
        code, body = op.health(path)
        check(code == 200, "%s: %s %s", path, code, body[:200])
    samples, text = op.metrics()
    check(e2e.metric_sum(samples, "pliant_jobs", phase="Succeeded") is not None and
          e2e.metric_sum(samples, "pliant_jobs", phase="Succeeded") >= 1,
          "pliant_jobs{phase=\"Succeeded\"} missing or 0:\n%s", text[:1500])
    for name in ("pliant_steps_total", "pliant_kube_requests_total", "pliant_samples_per_second"):
        check(e2e.metric_sum(samples, name) is not None, "/metrics lacks %s:\n%s", name, text[:1500])
    check(e2e.metric_sum(samples, "pliant_steps_total") >= steps, "pliant_steps_total %s < %d",
          e2e.metric_sum(samples, "pliant_steps_total"), steps)
    check_job_metrics(samples, text, "basic", steps)
    check_cost(st, samples, "basic", steps * 8)
    check(op.alive(), "the operator exited")


def feed_events(op, path, timeout=60):
    """The events of the job's dashboard feed at path (history, then live until the end),
    something sent to it first (the port is read-only: ignored)."""
    ws = WS(op.dashboard_port, path + "feed", "pliant-dashboard", timeout=timeout)
    ws.send('{"type": "stop"}')
    msgs = []
    read_feed(ws, msgs)
    ws.close()
    return flatten(msgs)


def check_feed(evs, job, steps, pods, first_step=0):
    """A job's dashboard events: its hello first, plans naming its worker Pods, one step
    event per committed step from first_step (0: the first) to the last, the end."""
    check(evs and evs[0]["type"] == "hello" and evs[0]["job"] == job and evs[0]["steps"] == steps,
          "the feed begins %s", json.dumps(evs[:1])[:300])
    plans = [e for e in evs if e["type"] == "plan"]
    check(plans, "no plan event: types %s", sorted({e["type"] for e in evs}))
    held = {w["name"] for w in plans[-1]["workers"] if w["pipeline"] >= 0 and w["layers"]}
    check(held and held <= set(pods), "the last plan's workers %s, worker Pods %s", sorted(held), sorted(pods))
    got = [e["step"] for e in evs if e["type"] == "step"]
    check(got == list(range(first_step, steps)), "step events %s ... %s, want %d..%d", got[:5], got[-5:],
          first_step, steps - 1)
    ends = [e["phase"] for e in evs if e["type"] == "phase" and e["phase"] in ("done", "failed")]
    check(ends == ["done"], "the feed's end phases %s", ends)


@e2e_test("operator", jobs=["dash"])
def dashboard_serves_each_job_on_the_leader():
    """the operator's dashboard port serves the job's page at status.dashboard
    (/jobs/default/dash/) and its feed (hello, plans of its worker Pods, one step event
    per committed step, the end); after the job's coordinator stopped, the same final
    page and history; 404 for what is no job's page."""
    op = operator()
    steps = min(long_steps(6), 3000)  # within the log's bound (no step event thinned)
    apply(job_manifest("dash", steps))
    path = "/jobs/default/dash/"
    st = wait_status("dash", "status.dashboard", lambda s: s.get("dashboard"), 60)
    check(st["dashboard"] == path, "status.dashboard %r, want %r", st["dashboard"], path)
    code, page = op.dashboard(path)
    check(code == 200 and "PliantDashboard" in page, "GET %s: %s %s", path, code, page[:200])
    evs = feed_events(op, path)
    st = wait_status("dash", "Succeeded", succeeded, 120)
    check(st.get("dashboard") == path, "status.dashboard %r once Succeeded", st.get("dashboard"))
    check_feed(evs, "dash", steps, job_pods("dash"))
    time.sleep(5)  # the coordinator stops 3 s after the end; its page stays
    late = feed_events(op, path)
    check(late[:len(evs)] == evs, "the final page's history differs from the live feed")
    for p, want in ((path, 200), (path[:-1], 200), (path + "feed", 404), ("/jobs/default/nothing/", 404),
                    ("/index.html", 404)):
        code, _ = op.dashboard(p)
        check(code == want, "GET %s: %s, want %d", p, code, want)
    code, index = op.dashboard("/")
    check(code == 200 and ('href="%s"' % path) in index, "GET / (the jobs' pages): %s %s", code, index[:300])


def check_cost(st, samples, job, trained):
    """status.cost (spec.cost: $0.918 spot, $3.06 on demand per node-hour): the node-hours
    of the worker Pods priced at both rates, the samples of the committed steps and their
    samples per dollar; the same figures on /metrics."""
    cost = st.get("cost") or {}
    hours = cost.get("nodeHours") or 0
    check(0 < hours < 1, "status.cost.nodeHours %s: %s", hours, cost)
    check(abs(cost.get("dollars", -1) - 0.918 * hours) < 1e-5 and
          abs(cost.get("onDemandDollars", -1) - 3.06 * hours) < 1e-5, "status.cost dollars: %s", cost)
    check(cost.get("samples") == trained, "status.cost.samples %s, want %d", cost.get("samples"), trained)
    check(abs(cost.get("samplesPerDollar", 0) * cost["dollars"] / trained - 1) < 0.01, "samplesPerDollar: %s",
          cost)  # dollars are rounded to 1e-6
    lab = {"trainingjob": job, "trainingjob_namespace": NS}
    for name in ("pliant_job_node_hours", "pliant_job_dollars", "pliant_job_on_demand_dollars",
                 "pliant_job_samples_per_dollar"):
        check((e2e.metric_sum(samples, name, **lab) or 0) > 0, "/metrics lacks %s%s", name, lab)


def disrupt_and_finish(job, steps, threshold, disrupt, lost, timeout=150):
    """Runs job until status.step >= threshold, calls disrupt() (which returns the names
    of the Pods it took away), then checks: reconfiguration without restart, a
    replacement Pod with a new index per lost Pod, a NodeLost and a NodeAdded Event,
    Succeeded with every step, status.step never going back."""
    wait_status(job, "status.step >= %d" % threshold, step_at_least(threshold), 60)
    before = status_of(job)
    check(before.get("phase") in ("Running", "Reconfiguring"), "phase %s at step %s", before.get("phase"),
          before.get("step"))
    check((before.get("step") or 0) < steps * 0.8, "the job reached step %s of %d before the disruption: raise "
          "its steps", before.get("step"), steps)
    first = sorted(job_pods(job), key=lambda n: pod_index(n, job))
    taken = disrupt()
    check(len(taken) == lost, "disruption took %s, want %d Pods", taken, lost)
    top = max(pod_index(n, job) for n in first)
    base = before.get("reconfigurations") or 0
    wait_status(job, "a reconfiguration after the disruption", lambda st: (st.get("reconfigurations") or 0) > base,
                60)
    wait_for("%d replacement Pods (%s-w%d and up)" % (lost, job, top + 1),
             lambda: len([n for n in job_pods(job) if pod_index(n, job) > top]) >= lost, 30, alive=ops_dead)
    wait_for("a replacement Pod to join (NodeAdded Event of %s)" % job, lambda: "NodeAdded" in event_reasons(job),
             60, 0.5, alive=ops_dead)
    st = wait_status(job, "Succeeded", succeeded, timeout)
    note_rate(st)
    check(st.get("step") == steps, "final status.step %s, want %d", st.get("step"), steps)
    hist = check_monotonic(job)
    check(hist[-1] == steps, "step history ends %s", hist[-5:])
    new = sorted((n for n in job_pods(job) if n not in first), key=lambda n: pod_index(n, job))
    idx = [pod_index(n, job) for n in new]
    check(len(set(idx)) == len(idx) and all(i > top for i in idx), "replacement Pods %s reuse an index (first %s)",
          new, first)
    check(not set(taken) & set(new), "a lost Pod's name was reused: %s", new)
    last = st.get("lastReconfiguration") or {}
    check(last.get("cause") and last.get("time") and isinstance(last.get("durationSeconds"), (int, float)) and
          last["durationSeconds"] >= 0 and isinstance(last.get("bytesCopied"), int) and last["bytesCopied"] >= 0,
          "status.lastReconfiguration %s", last)
    check(not st.get("lastCheckpoint"), "a checkpoint was used (no checkpoint dir configured): %s",
          st.get("lastCheckpoint"))
    reasons = event_reasons(job)
    for r in ("NodeLost", "Reconfigured", "NodeAdded", "Succeeded"):
        check(r in reasons, "no %s Event (reasons %s)", r, reasons)
    return st


@e2e_test("operator", jobs=["podloss"])
def deleted_worker_pod_is_replaced_without_restart():
    """`kubectl delete pod` of a worker mid-training: the job
    reconfigures without a restart or checkpoint, a replacement Pod podloss-w3
    joins, the job succeeds with every step; metrics count the reconfiguration."""
    op = operator()
    steps = long_steps(20)
    apply(job_manifest("podloss", steps))

    def delete_pod():
        emu().kubectl_ok("delete", "pod", "podloss-w1", "--wait=true", timeout=60)
        return ["podloss-w1"]
    st = disrupt_and_finish("podloss", steps, steps // 8, delete_pod, 1)
    check(st.get("reconfigurations", 0) >= 1, "reconfigurations %s", st.get("reconfigurations"))
    samples, text = op.metrics()
    check((e2e.metric_sum(samples, "pliant_reconfigurations_total") or 0) >= 1,
          "pliant_reconfigurations_total < 1:\n%s", text[:1500])
    check((e2e.metric_sum(samples, "pliant_recovery_seconds_count") or 0) >= 1 and
          e2e.metric_sum(samples, "pliant_recovery_seconds_bucket") is not None,
          "no pliant_recovery_seconds histogram samples:\n%s", text[:1500])
    check(op.alive(), "the operator exited")


@e2e_test("operator", jobs=["badplan"])
def unreadable_status_plan_restarts_the_workers():
    """The operator killed mid-training and status.plan emptied before the next one
    starts: it cannot take the plan over, says so (Warning Event BadStatusPlan naming the
    field), replaces the worker Pods (their state belongs to a plan it does not know) and
    trains from the start on the job's port; the job succeeds with every step."""
    op = operator()
    steps = long_steps(20)
    apply(job_manifest("badplan", steps))
    st = wait_status("badplan", "status.step >= %d" % (steps // 8), step_at_least(steps // 8), 60)
    port = st.get("coordinatorPort")
    before = sorted(p["metadata"]["name"] for p in pods_now("badplan"))
    op.kill()
    emu().ok("PATCH", tj_path("badplan") + "/status", {"status": {"plan": {"pipelines": []}}},
             content_type="application/merge-patch+json")
    operator()
    st = wait_status("badplan", "Succeeded", succeeded, 150, stall=60)
    check(st.get("step") == steps and st.get("coordinatorPort") == port,
          "final status.step %s of %d, coordinatorPort %s (%s before)", st.get("step"), steps,
          st.get("coordinatorPort"), port)
    bad = [ev.get("note") or "" for ev in job_events("badplan") if ev.get("reason") == "BadStatusPlan"]
    check(bad and "status.plan.pipelines" in bad[0], "BadStatusPlan Events %s", bad)
    after = [n for n in job_pods("badplan") if n not in before]
    check(len(after) >= 3, "worker Pods %s after the new operator, %s before", after, before)


@e2e_test("operator", jobs=["silent"])
def silent_worker_pod_is_deleted_and_replaced():
    """A worker Pod's process stopped (SIGSTOP: as a node cut off or hung, the Pod still
    Running): the coordinator loses it to missed heartbeats, the operator deletes the Pod
    (a LostWorkerDeleted Event) so that a replacement joins, and the job succeeds."""
    operator()
    steps = long_steps(20)
    apply(job_manifest("silent", steps, tolerate="1, heartbeatSeconds: 0.5"))

    def stop_pod():
        kill_worker("silent-w1", sig=signal.SIGSTOP)
        return ["silent-w1"]
    disrupt_and_finish("silent", steps, steps // 8, stop_pod, 1)
    check("LostWorkerDeleted" in event_reasons("silent"), "no LostWorkerDeleted Event: %s",
          event_reasons("silent"))
    wait_for("the stopped Pod silent-w1 to be gone",
             lambda: "silent-w1" not in [p["metadata"]["name"] for p in pods_now("silent")], 30)


@e2e_test("operator", jobs=["nodeloss"])
def deleted_node_loses_two_pods_without_restart():
    """With a Node: 5 worker Pods (F = 2) on 4 nodes of 2 GPUs, so one
    Node holds two; `kubectl delete node` kills both at once: one reconfiguration
    from the survivors, two replacement Pods, Succeeded with every step."""
    operator()
    steps = long_steps(20)
    apply(job_manifest("nodeloss", steps, max_=5, tolerate=2))
    wait_for("5 running worker Pods", lambda: len(running_pods("nodeloss")) == 5, 60, 0.3, alive=ops_dead)

    def delete_node():
        by_node = {}
        for p in running_pods("nodeloss"):
            by_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
        node, names = max(by_node.items(), key=lambda kv: len(kv[1]))
        check(len(names) == 2, "no node holds two of the job's Pods: %s", by_node)
        emu().kubectl_ok("delete", "node", node, timeout=60)
        state["deleted_node"] = node
        return names
    try:
        st = disrupt_and_finish("nodeloss", steps, steps // 8, delete_node, 2)
    finally:   # the "autoscaler" brings the capacity back for the other tests
        if state.pop("deleted_node", None):
            emu().ok("POST", "/_emulator/nodes", {"zone": "a", "gpus": 2})
    if crd_has("preempted"):
        check(((st.get("nodes") or {}).get("preempted") or 0) >= 2, "status.nodes.preempted %s, want >= 2",
              (st.get("nodes") or {}).get("preempted"))


@e2e_test("operator", jobs=["badspec", "badheads"])
def invalid_spec_gets_a_failed_condition():
    """specs the schema accepts but the job spec does not (seqLen
    above the preset's maxSeqLen, heads not dividing the preset's channels): phase
    Failed, a Failed=True condition whose message names the field, no worker Pods."""
    op = operator()
    cases = [("badspec", "spec.batch.seqLen",
              lambda m: m.replace("layers: 3, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, ",
                                  "preset: gpt2-tiny, ").replace("seqLen: 32", "seqLen: 1024")),
             ("badheads", "spec.model.heads",
              lambda m: m.replace("layers: 3, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, ",
                                  "preset: gpt2-tiny, channels: 30, "))]
    for name, field, edit in cases:
        manifest = edit(job_manifest(name, 10))
        check(manifest != job_manifest(name, 10), "case %s: manifest unchanged", name)
        apply(manifest)       # the schema lets it through
    for name, field, _ in cases:
        st = wait_status(name, "phase Failed", lambda s: s.get("phase") == "Failed", 30)
        conds = {c.get("type"): c for c in st.get("conditions") or []}
        c = conds.get("Failed") or {}
        check(c.get("status") == "True" and field in (c.get("message") or ""),
              "job %s: Failed condition %s does not name %s", name, c, field)
        check(any(field in (ev.get("note") or "") for ev in job_events(name) if ev.get("reason") == "Failed"),
              "job %s: no Failed Event naming %s: %s", name, field, [ev.get("note") for ev in job_events(name)])
        check(not job_pods(name), "job %s: worker Pods created for an invalid spec: %s", name, job_pods(name))
        emu().kubectl_ok("delete", "tj", name)
    check(op.alive(), "the operator exited")


@e2e_test("operator", jobs=["squatted"])
def foreign_secret_is_not_reused():
    """A Secret squatted-pliant made before the job (no ownerReferences): the operator
    takes neither its token nor its key, creates no Pod, and says why in the Created
    condition (reason SecretConflict) and an Event; once the Secret is deleted, the job
    starts with a Secret of its own."""
    op = operator()
    emu().kubectl_ok("create", "secret", "generic", "squatted-pliant", "--from-literal=token=planted")
    apply(job_manifest("squatted", 10))

    def created_cond(st):
        return {c.get("type"): c for c in st.get("conditions") or []}.get("Created") or {}
    st = wait_status("squatted", "Created=False SecretConflict",
                     lambda s: created_cond(s).get("reason") == "SecretConflict", 30)
    c = created_cond(st)
    check(c.get("status") == "False" and "squatted-pliant" in (c.get("message") or ""),
          "Created condition %s does not name the Secret", c)
    check(any(ev.get("reason") == "SecretConflict" for ev in job_events("squatted")),
          "no SecretConflict Event: %s", [ev.get("reason") for ev in job_events("squatted")])
    time.sleep(1.0)
    check(not job_pods("squatted"), "worker Pods created with a foreign Secret: %s", job_pods("squatted"))
    secret = emu().get("/api/v1/namespaces/%s/secrets/squatted-pliant" % NS)
    check(secret and not secret["metadata"].get("ownerReferences"), "the foreign Secret was changed: %s", secret)
    emu().kubectl_ok("delete", "secret", "squatted-pliant")
    uid = get_tj("squatted")["metadata"]["uid"]

    def own_secret():
        s = emu().get("/api/v1/namespaces/%s/secrets/squatted-pliant" % NS)
        return s and any(r.get("uid") == uid for r in s["metadata"].get("ownerReferences") or [])
    wait_for("a Secret owned by the job", own_secret, 60, 0.3, alive=ops_dead)
    wait_status("squatted", "Created=True", lambda s: created_cond(s).get("status") == "True", 30)
    emu().kubectl_ok("delete", "tj", "squatted", timeout=60)
    check(op.alive(), "the operator exited")


@e2e_test("operator", jobs=["faulty"])
def api_faults_are_retried():
    """500s, 409s and timeouts injected into the operator's creates,
    status writes and Events, and a compaction that ends every watch (410, re-list)
    mid-training: the operator retries, the job succeeds, the operator never exits."""
    op = operator()
    ns_path = "^/api/v1/namespaces/default/"
    required = [
        {"status": "timeout", "seconds": 3, "count": 1, "method": "POST", "path_regex": ns_path + "pods$"},
        {"status": 500, "count": 2, "method": "POST", "path_regex": ns_path + "pods$"},
        {"status": 500, "count": 1, "method": "POST", "path_regex": ns_path + "secrets$"},
        {"status": 503, "count": 1, "method": "POST", "path_regex": ns_path + "services$"},
        {"status": 409, "count": 3, "path_regex": "/trainingjobs/faulty/status$"},
        {"status": 500, "count": 2, "path_regex": "/trainingjobs/faulty/status$"},
        {"status": "timeout", "seconds": 3, "count": 1, "path_regex": "/trainingjobs/faulty/status$"},
        {"status": 500, "count": 2, "method": "POST", "path_regex": "/namespaces/default/events$"},
    ]
    emu().faults("DELETE")
    emu().faults("POST", required)
    steps = long_steps(12)
    apply(job_manifest("faulty", steps))
    wait_status("faulty", "status.step >= %d" % (steps // 5), step_at_least(steps // 5), 90)
    # every watch ends with 410; the next list of TrainingJobs fails once more
    emu().faults("POST", [{"status": 500, "count": 1, "method": "GET",
                           "path_regex": "^/apis/pliant.dev/v1alpha1/(namespaces/default/)?trainingjobs$"}])
    emu().ok("POST", "/_emulator/compact?endWatches=true")
    st = wait_status("faulty", "Succeeded", succeeded, 120)
    note_rate(st)
    check(st.get("step") == steps, "final status.step %s", st.get("step"))
    check_monotonic("faulty")
    pending = [f for f in emu().faults() if f.get("path_regex") != "^/apis/pliant.dev/v1alpha1/(namespaces/default/)"
               "?trainingjobs$"]
    check(not pending, "faults the operator never met (it did not retry?): %s", pending)
    check(op.alive(), "the operator exited: %s" % op.dead())
    check(op.health("/healthz")[0] == 200, "/healthz after the faults")
    samples, text = op.metrics()
    errs = [v for (n, _), v in samples.items() if n.startswith("pliant_kube_") and "error" in n]
    check(errs and sum(errs) >= 1, "no pliant_kube_*error* metric counting the injected failures:\n%s",
          text[:1500])
    emu().faults("DELETE")


@e2e_test("operator", jobs=["doomed"])
def deleting_the_job_removes_what_it_created():
    """`kubectl delete tj` mid-training: every Pod, Secret and Service
    the operator created for the job (found in the emulator's state log by owner or
    label) is removed, the worker processes end, nothing is created again."""
    op = operator()
    apply(job_manifest("doomed", long_steps(60)))
    wait_status("doomed", "status.step >= 5", step_at_least(5), 60)
    uid = get_tj("doomed")["metadata"]["uid"]
    emu().kubectl_ok("delete", "tj", "doomed", timeout=60)
    t0 = time.monotonic()

    def created():
        out = {}
        for rec in emu().states():
            obj = rec.get("object") or {}
            meta = obj.get("metadata") or {}
            if rec.get("type") != "ADDED" or rec.get("resource") not in ("pods", "secrets", "services"):
                continue
            owned = any(r.get("uid") == uid for r in meta.get("ownerReferences") or [])
            if owned or (meta.get("labels") or {}).get("pliant.dev/job") == "doomed":
                out[(rec["resource"], meta.get("namespace"), meta.get("name"))] = obj
        return out
    made = created()
    kinds = {k[0] for k in made}
    check({"pods", "secrets", "services"} <= kinds, "the state log shows no Pod/Secret/Service for the job: %s",
          sorted(made))
    check(("secrets", NS, "doomed-pliant") in made and ("services", NS, "doomed-coordinator") in made,
          "Secret doomed-pliant / Service doomed-coordinator not among %s", sorted(made))

    def remaining():
        left = []
        for (res, ns, name) in created():
            if emu().get("/api/v1/namespaces/%s/%s/%s" % (ns, res, name)) is not None:
                left.append("%s/%s" % (res, name))
        return left
    wait_for("every Pod, Secret and Service of the job to go", lambda: not remaining(), 30, 0.3, alive=ops_dead)
    pids = []
    for (res, _, _), obj in made.items():
        for _, _, o in state["pods"].objects(lambda o: o["metadata"]["uid"] == obj["metadata"].get("uid")):
            for cs in (o.get("status") or {}).get("containerStatuses") or []:
                if "//" in (cs.get("containerID") or ""):
                    pids.append(int(cs["containerID"].split("//")[1]))
    for pid in set(pids):
        wait_for("worker process %d to end" % pid, lambda: process_gone(pid), 10)
    time.sleep(max(0.0, 3 - (time.monotonic() - t0)))
    again = remaining() + [p["metadata"]["name"] for p in pods_now("doomed")]
    check(not again, "created again after the deletion: %s", again)
    check(get_tj("doomed") is None, "the TrainingJob is still there")
    samples, text = op.metrics()
    left = [k for k in samples if ("trainingjob", "doomed") in k[1]]
    check(not left, "series of the deleted job remain on /metrics: %s", left[:5])
    check(op.alive(), "the operator exited")


LONG_NAME = ("a-job-whose-name-is-as-long-as-kubernetes-allows." * 6)[:250] + "end"


@e2e_test("operator", jobs=[LONG_NAME])
def long_job_name_gets_short_object_names():
    """a job named with 253 characters (dots included) runs to Succeeded: its Secret,
    Service, EndpointSlice, NetworkPolicy and Pods have names of at most 63 characters
    (cut, with a hash of the whole name) and their pliant.dev/job label too."""
    operator()
    check(len(LONG_NAME) == 253, "name of %d characters", len(LONG_NAME))
    apply(job_manifest(LONG_NAME, 20))
    st = wait_status(LONG_NAME, "Succeeded", succeeded, 90)
    check(st.get("step") == 20, "status.step %s", st.get("step"))
    pods = [o for _, _, o in state["pods"].objects(owned_by(LONG_NAME))]
    check(len({p["metadata"]["name"] for p in pods}) >= 3, "worker Pods %s", {p["metadata"]["name"] for p in pods})
    made = [(res, o) for res in ("secrets", "services") for o in
            emu().ok("GET", "/api/v1/namespaces/%s/%s" % (NS, res))["items"] if owned_by(LONG_NAME)(o)]
    for res in ("apis/discovery.k8s.io/v1/namespaces/%s/endpointslices", "apis/networking.k8s.io/v1/namespaces/%s/networkpolicies"):
        made += [(res.split("/")[-1], o) for o in emu().ok("GET", "/" + res % NS)["items"] if owned_by(LONG_NAME)(o)]
    made += [("pods", p) for p in pods]
    check({r for r, _ in made} == {"secrets", "services", "endpointslices", "networkpolicies", "pods"},
          "objects of the job: %s", sorted({r for r, _ in made}))
    for res, o in made:
        name, label = o["metadata"]["name"], (o["metadata"].get("labels") or {}).get("pliant.dev/job", "")
        check(len(name) <= 63 and re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", name), "%s name %r", res, name)
        check(0 < len(label) <= 63, "%s %s: pliant.dev/job label %r", res, name, label)
    svc = [o for r, o in made if r == "services"][0]
    check_network_objects(LONG_NAME, "127.0.0.1", service=svc["metadata"]["name"])
    emu().kubectl_ok("delete", "tj", LONG_NAME)


@e2e_test("operator", jobs=["stuck"])
def pending_job_meets_its_deadline():
    """activeDeadlineSeconds counts from status.startTime, set when the job is first
    reconciled: a job whose Pods can never be scheduled fails with DeadlineExceeded, its
    Pods are cleaned up, and ttlSecondsAfterFinished deletes it."""
    operator()
    manifest = job_manifest("stuck", 50, extra="  runPolicy: {activeDeadlineSeconds: 4, "
                                               "ttlSecondsAfterFinished: 6}\n").replace(
        "worker: {", "worker: {nodeSelector: {pool: none}, ")
    apply(manifest)
    st = wait_status("stuck", "startTime while Pending", lambda s: s.get("startTime"), 20)
    check(st.get("phase") in (None, "Pending"), "phase %s before the deadline", st.get("phase"))
    st = wait_status("stuck", "phase Failed", lambda s: s.get("phase") == "Failed", 30)
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    check(conds.get("Failed", {}).get("reason") == "DeadlineExceeded", "Failed condition %s", conds.get("Failed"))
    check(not st.get("step"), "the stuck job trained: %s", st.get("step"))
    check("DeadlineExceeded" in event_reasons("stuck"), "Events %s", event_reasons("stuck"))
    wait_for("the pending Pods to be cleaned up", lambda: not pods_now("stuck"), 30, 0.3, alive=ops_dead)
    wait_for("ttlSecondsAfterFinished to delete the job", lambda: get_tj("stuck") is None, 30, 0.3, alive=ops_dead)


@e2e_test("operator", jobs=["refused", "ckpt"])
def refused_pods_and_worker_pod_fields():
    """a Pod creation the API server refuses (403) is a Warning Event FailedCreate and
    condition PodsCreated=False with its message, retried until created
    (PodsCreated=True); spec.worker's Pod fields reach the Pods: labels, annotations,
    image pull secrets, service account, scheduler, and the checkpoint PVC at
    checkpoint.dir."""
    operator()
    emu().faults("POST", [{"status": 403, "count": 2, "method": "POST",
                           "path_regex": "^/api/v1/namespaces/%s/pods$" % NS}])
    worker = ("worker: {terminationGracePeriodSeconds: 5, labels: {kueue.x-k8s.io/queue-name: gpu}, "
              "annotations: {karpenter.sh/do-not-disrupt: 'true'}, imagePullSecrets: [{name: regcred}], "
              "serviceAccountName: trainer, "
              "volumes: [{name: ckpt, persistentVolumeClaim: {claimName: ckpt}}], "
              "volumeMounts: [{name: ckpt, mountPath: /ckpt}], ")
    manifest = job_manifest("refused", 20000, extra="  checkpoint: {dir: /ckpt, every: 0}\n").replace(
        "worker: {terminationGracePeriodSeconds: 5, ", worker)
    apply(manifest)
    wait_for("3 worker Pods of job refused", lambda: len(pods_now("refused")) == 3, 60, 0.3, alive=ops_dead)
    seen = [(o.get("status") or {}).get("conditions") or [] for _, _, o in
            state["jobs"].objects(lambda o: o["metadata"]["name"] == "refused")]
    refused = [c for cs in seen for c in cs if c.get("type") == "PodsCreated" and c.get("status") == "False"]
    check(refused and refused[0].get("reason") == "FailedCreate" and "Forbidden" in refused[0].get("message", ""),
          "no PodsCreated=False/FailedCreate condition with the API's message: %s", seen[-3:])
    evs = [ev for ev in job_events("refused") if ev.get("reason") == "FailedCreate"]
    check(evs and evs[0].get("type") == "Warning" and "Forbidden" in evs[0].get("note", ""), "FailedCreate Events %s",
          [(ev.get("reason"), ev.get("note")) for ev in job_events("refused")])
    wait_status("refused", "PodsCreated=True", lambda st: any(
        c.get("type") == "PodsCreated" and c.get("status") == "True" for c in st.get("conditions") or []), 30)
    for pod in pods_now("refused"):
        md, spec = pod["metadata"], pod["spec"]
        c = spec["containers"][0]
        check(md["labels"].get("kueue.x-k8s.io/queue-name") == "gpu" and
              md["labels"].get("app.kubernetes.io/name") == "pliant-worker" and
              (md.get("annotations") or {}).get("karpenter.sh/do-not-disrupt") == "true", "metadata %s", md)
        check(spec.get("imagePullSecrets") == [{"name": "regcred"}] and spec.get("serviceAccountName") == "trainer",
              "Pod spec %s", {k: spec.get(k) for k in ("imagePullSecrets", "serviceAccountName")})
        vols = {v["name"]: v for v in spec["volumes"]}
        check(vols.get("ckpt", {}).get("persistentVolumeClaim") == {"claimName": "ckpt"} and
              {"name": "ckpt", "mountPath": "/ckpt"} in c["volumeMounts"],
              "checkpoint PVC volume / mount: %s %s", spec["volumes"], c["volumeMounts"])
        check_worker_pod(pod)
    emu().faults("DELETE")
    emu().kubectl_ok("delete", "tj", "refused")


@e2e_test("operator", jobs=["flaky"])
def failed_pods_back_off_then_exhaust_the_backoff_limit():
    """a worker process killed (a Pod that fails on its own, not a disruption) counts
    in status.nodes.failed, not preempted; its replacement waits for the 10 s back-off;
    the failed Pod is kept for its logs; a second failure with backoffLimit 1 fails
    the job with reason BackoffLimitExceeded and an Event."""
    op = operator()
    # as many steps as it may take: the second failure ends it
    apply(job_manifest("flaky", 20000, extra="  runPolicy: {backoffLimit: 1}\n"))
    wait_for("3 running worker Pods", lambda: len(running_pods("flaky")) == 3, 60, 0.3, alive=ops_dead)
    wait_status("flaky", "status.step >= 3", step_at_least(3), 60)
    first = sorted(p["metadata"]["name"] for p in pods_now("flaky"))
    kill_worker(first[0])
    t_fail = time.monotonic()
    st = wait_status("flaky", "status.nodes.failed == 1",
                     lambda s: (s.get("nodes") or {}).get("failed") == 1, 30)
    check(not (st.get("nodes") or {}).get("preempted"), "a failure counted as a preemption: %s", st.get("nodes"))
    time.sleep(max(0.0, 6 - (time.monotonic() - t_fail)))
    check(sorted(job_pods("flaky")) == first, "a replacement was created within the back-off: %s",
          sorted(job_pods("flaky")))
    wait_for("the replacement after the back-off", lambda: len(job_pods("flaky")) == 4, 30, 0.3, alive=ops_dead)
    waited = time.monotonic() - t_fail
    check(waited >= 9, "the replacement came %.1f s after the failure (back-off 10 s)", waited)
    check(emu().get("/api/v1/namespaces/%s/pods/%s" % (NS, first[0])) is not None,
          "the failed Pod %s was deleted (the last few stay for their logs)", first[0])
    kill_worker(first[1])
    st = wait_status("flaky", "phase Failed", lambda s: s.get("phase") == "Failed", 30)
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    check(conds.get("Failed", {}).get("reason") == "BackoffLimitExceeded" and
          "backoffLimit" in conds["Failed"].get("message", ""), "Failed condition %s", conds.get("Failed"))
    check((st.get("nodes") or {}).get("failed") == 2, "status.nodes %s", st.get("nodes"))
    check("BackoffLimitExceeded" in event_reasons("flaky"), "Events %s", event_reasons("flaky"))
    samples, text = op.metrics()
    check(e2e.metric_sum(samples, "pliant_failed_pods_total", trainingjob="flaky") == 2,
          "pliant_failed_pods_total of flaky:\n%s", text[:2000])
    emu().kubectl_ok("delete", "tj", "flaky")


@e2e_test("operator")
def log_levels():
    """--log-level takes error, warn, info and debug (anything else: exit 2) and
    filters: at error, a healthy operator writes nothing."""
    for level in ("error", "warn", "info", "debug"):
        p = subprocess.run([state["operator_bin"], "--log-level", level, "--version"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
        check(p.returncode == 0, "--log-level %s: exit %d %s", level, p.returncode, p.stderr.decode())
    p = subprocess.run([state["operator_bin"], "--log-level", "verbose"], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    check(p.returncode == 2 and "--log-level" in p.stderr.decode(), "--log-level verbose: %d %s", p.returncode,
          p.stderr.decode())
    ensure_crd()
    quiet = e2e.Operator(state["operator_bin"], emu(), os.path.join(suite.tmp, "operator"), "quiet",
                         ["--namespace", "quiet", "--log-level", "error", "--coordinator-host", "127.0.0.1"])
    state["ops"].append(quiet)
    wait_for("the quiet operator's /readyz", lambda: quiet.health("/readyz")[0] == 200, 20, alive=quiet.dead)
    quiet.stop()
    check(not quiet.stderr_tail(5).strip(), "an operator at --log-level error wrote:\n%s", quiet.stderr_tail(5))
    check("debug: " in state["op"].stderr_tail(400) if state["op"] else True,
          "the operator at --log-level debug logs no requests")


@e2e_test("operator", jobs=["duties", "duties-again"])
def workers_profile_evaluate_and_checkpoint():
    """spec.profile auto, evalEvery with validation data and checkpoints: a worker measures
    the model (status.profile, its JSON with the model's layers), the workers' validation
    loss reaches status.lastValidation, a worker completes each checkpoint (checkpoint.json,
    status.lastCheckpoint, CheckpointSaved); a second job over the same checkpoint
    directory finds the last step's checkpoint through its workers and succeeds at once."""
    op = operator()
    ck = os.path.join(suite.tmp, "duties.ckpt")
    steps = 20

    def manifest(name):
        m = job_manifest(name, steps, max_=2,
                         extra="  checkpoint: {dir: %s, every: 10}\n  evalBatches: 4\n" % ck)
        return (m.replace("evalEvery: 0", "evalEvery: 5").replace("profile: synthetic", "profile: auto")
                 .replace("_train.bin,", "_train.bin, val: %s_val.bin," % data_prefix(), 1))
    apply(manifest("duties"))
    st = wait_status("duties", "Succeeded", succeeded, 120)
    prof = st.get("profile")
    check(isinstance(prof, str) and len(json.loads(prof).get("layers", [])) == 5,
          "status.profile %r (want the measured profile of 3 blocks + embedding + head)",
          str(prof)[:300])
    val = st.get("lastValidation") or {}
    check(val.get("step") == steps - 1 and isinstance(val.get("loss"), (int, float)) and
          0 < val["loss"] < 10, "status.lastValidation %s", val)
    check((st.get("lastCheckpoint") or {}).get("step") == steps, "status.lastCheckpoint %s",
          st.get("lastCheckpoint"))
    for step in (10, 20):
        check(os.path.exists(os.path.join(ck, "step-%08d" % step, "checkpoint.json")),
              "no checkpoint.json for step %d", step)
    check("CheckpointSaved" in event_reasons("duties"), "no CheckpointSaved Event: %s",
          event_reasons("duties"))
    samples, text = op.metrics()
    vloss = e2e.metric_sum(samples, "pliant_validation_loss", trainingjob="duties",
                           trainingjob_namespace=NS)
    check(vloss is not None and abs(vloss - val["loss"]) <= 1e-6 * abs(val["loss"]),
          "pliant_validation_loss %s, status %s:\n%s", vloss, val, text[:2000])
    apply(manifest("duties-again"))
    st = wait_status("duties-again", "Succeeded", succeeded, 60)
    check(st.get("step") == steps and not st.get("lastValidation"),
          "the second job trained: status %s", json.dumps(st)[:800])
    check(op.alive(), "the operator exited")


def other_of(ident):
    return "op-b" if ident == "op-a" else "op-a"


def hold_port(port):
    """A socket listening on the port (0.0.0.0), once the process that had it let it go."""
    deadline = time.monotonic() + 5
    while True:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(1)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@e2e_test("failover", jobs=[("ha", "ha"), ("a-new", "ha")])
def leader_failover_continues_training():
    """two operators with --leader-elect; SIGKILL of the Lease holder
    mid-training: the other takes the Lease over and training continues on the same
    worker Pods (no new Pod, no container restart), status.step never goes back by
    more than the in-flight step, the job succeeds. A job created while no operator
    leads (named to come first) starts on a port of its own: the running job keeps
    the control port its workers dial, and while that port is still held (as by a
    leader still exiting) the new leader waits for it (a PortInUse Event) rather than
    move the job."""
    if state["op"] is not None:     # it watches namespace default only, but leave the field to the pair
        state["op"].stop()
    ensure_crd()
    e = emu()
    e.kubectl_ok("create", "namespace", "ha")
    pair = {}
    address = {"op-a": "127.0.0.2", "op-b": "127.0.0.3"}   # what each writes into the EndpointSlice
    for ident in ("op-a", "op-b"):
        op = e2e.Operator(state["operator_bin"], e, os.path.join(suite.tmp, "operator"), ident,
                          ["--namespace", "ha", "--leader-elect", "--lease-namespace", "ha", "--identity", ident,
                           "--coordinator-host", "127.0.0.1", "--worker-command", suite.pliant,
                           "--advertise-address", address[ident]])
        pair[ident] = op
        state["ops"].append(op)

    def holder():
        for lease in e.ok("GET", "/apis/coordination.k8s.io/v1/namespaces/ha/leases")["items"]:
            h = (lease.get("spec") or {}).get("holderIdentity")
            if h in pair:
                return h
        return None
    leader = wait_for("a Lease held by op-a or op-b", holder, 30, 0.2, alive=ops_dead)
    steps = long_steps(20)
    apply(job_manifest("ha", steps, ns="ha"))
    wait_status("ha", "status.step >= %d" % (steps // 8), step_at_least(steps // 8), 60, ns="ha")
    before = {p["metadata"]["name"]: p for p in pods_now("ha", "ha")}
    check(len(before) == 3, "worker Pods before the failover: %s", sorted(before))
    slice_path = "/apis/discovery.k8s.io/v1/namespaces/ha/endpointslices/ha-coordinator"
    check(emu().get(slice_path)["endpoints"][0]["addresses"] == [address[leader]],
          "the EndpointSlice does not name the leader %s: %s", leader, emu().get(slice_path))
    code, body = pair[leader].dashboard("/jobs/ha/ha/")
    check(code == 200, "the leader's dashboard: %s %s", code, body[:200])
    code, body = pair[other_of(leader)].dashboard("/jobs/ha/ha/")
    check(code == 503 and "does not lead" in body, "the follower's dashboard: %s %s", code, body[:300])
    s_kill = status_of("ha", "ha").get("step") or 0
    check(s_kill < steps * 0.8, "step %s of %d before the failover: raise the steps", s_kill, steps)
    port = status_of("ha", "ha").get("coordinatorPort")
    check(port, "status.coordinatorPort %r", port)
    t_kill = time.monotonic()
    pair[leader].kill()
    held = hold_port(port)          # as a leader still exiting would: the new one waits for it
    apply(job_manifest("a-new", 30, ns="ha", max_=1, tolerate=0))
    other = other_of(leader)
    wait_for("%s to take the Lease over" % other, lambda: holder() == other, 60, 0.2, alive=ops_dead)
    wait_for("a PortInUse Event while port %d is held" % port,
             lambda: "PortInUse" in event_reasons("ha", ns="ha"), 30, 0.2, alive=ops_dead)
    held.close()
    wait_for("the new leader %s to rewrite the EndpointSlice" % other,
             lambda: emu().get(slice_path)["endpoints"][0]["addresses"] == [address[other]], 60, 0.2,
             alive=ops_dead)
    samples, _ = pair[other].metrics()
    check(e2e.metric_sum(samples, "pliant_leader") == 1, "pliant_leader of the new leader %s",
          e2e.metric_sum(samples, "pliant_leader"))
    wait_status("ha", "training to continue after the failover", step_at_least(s_kill + 10), 90, ns="ha",
                stall=90)
    st = wait_status("ha", "Succeeded", succeeded, 150, ns="ha", stall=60)
    check(st.get("step") == steps, "final status.step %s", st.get("step"))
    check(st.get("coordinatorPort") == port, "status.coordinatorPort %r after the failover, %r before",
          st.get("coordinatorPort"), port)
    new = wait_status("a-new", "Succeeded", succeeded, 90, ns="ha", stall=60)
    check(new.get("coordinatorPort") not in (None, port), "the new job's coordinatorPort %r (the other's %r)",
          new.get("coordinatorPort"), port)
    # the new leader's page: the job from where it took it over
    check(st.get("dashboard") == "/jobs/ha/ha/", "status.dashboard %r", st.get("dashboard"))
    evs = feed_events(pair[other], "/jobs/ha/ha/")
    first = min([e["step"] for e in evs if e["type"] == "step"] or [0])
    check(first >= s_kill - 1, "the new leader's first step event %d, status.step %d before the failover",
          first, s_kill)
    check_feed(evs, "ha", steps, job_pods("ha", "ha"), first)
    hist = check_monotonic("ha", "ha", slack=1)
    check(hist[-1] == steps, "step history ends %s", hist[-5:])
    seen = [(t, (o.get("status") or {}).get("step")) for t, typ, o in state["jobs"].objects(
        lambda o: o["metadata"]["name"] == "ha" and o["metadata"].get("namespace") == "ha") if typ != "DELETED"]
    top = max([s for t, s in seen if t <= t_kill and s is not None] + [s_kill])
    after = [s for t, s in seen if t > t_kill and s is not None]
    check(after and min(after) >= top - 1, "steps redone after the failover: step %d before the kill, then %s",
          top, after[:30])
    names = job_pods("ha", "ha")
    check(sorted(names) == sorted(before), "worker Pods %s after the failover, %s before", names, sorted(before))
    for p in pods_now("ha", "ha"):
        name = p["metadata"]["name"]
        check(p["metadata"]["uid"] == before[name]["metadata"]["uid"], "Pod %s was recreated", name)
        for cs in p["status"].get("containerStatuses") or []:
            check(cs.get("restartCount", 0) == 0, "Pod %s restarted its container: %s", name, cs)
    check(pair[other].alive(), "the new leader exited")


# ---------------------------------------------------------------------------

def operator_info(binary):
    """The text of `--version` (and of `--help` unless --version mentions hello_resume)."""
    text = ""
    for flag in ("--version", "--help"):
        if "hello_resume" in text:
            break
        try:
            p = subprocess.run([binary, flag], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=10)
            text += p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
        except (OSError, subprocess.TimeoutExpired) as e:
            text += str(e)
    return text


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--build", default="build")
    ap.add_argument("-k", "--filter", default="")
    args, _ = ap.parse_known_args()
    build = args.build if os.path.isabs(args.build) else os.path.join(REPO, args.build)
    binary = os.path.join(build, "bin", "pliant-operator")
    state["operator_bin"] = binary
    skips = []
    if not KUBECTL:
        skips = [(t, "kubectl not installed") for g in _groups.values() for t in g]
    else:
        for t in _groups["emulator"]:
            suite.test(t)
        if not os.access(binary, os.X_OK):
            skips += [(t, "build/bin/pliant-operator not built") for t in _groups["operator"] + _groups["failover"]]
        else:
            for t in _groups["operator"]:
                suite.test(t)
            if "hello_resume" in operator_info(binary):
                for t in _groups["failover"]:
                    suite.test(t)
            else:
                skips += [(t, FAILOVER_SKIP) for t in _groups["failover"]]
    for t, why in skips:
        if args.filter in t.__name__:
            print("skip %s.%s: %s" % (suite.prefix, t.__name__, why))
    sys.stdout.flush()
    # Stop the processes inside the last test, before Suite.main removes the temporary
    # directory they write in (and again below, whatever happens).
    selected = [i for i, t in enumerate(suite.tests) if args.filter in t.__name__]
    if selected:
        last = suite.tests[selected[-1]]

        def last_then_cleanup():
            try:
                last()
            finally:
                cleanup()
        last_then_cleanup.__name__ = last.__name__
        suite.tests[selected[-1]] = last_then_cleanup
    try:
        return suite.main()
    finally:
        cleanup()


def cleanup():
    for rec in ("pods", "jobs"):
        if state[rec] is not None:
            state[rec].stop()
    e2e.stop_all()


if __name__ == "__main__":
    sys.exit(main())
