#!/usr/bin/env python3
"""Tests of the TrainingJob CRD (crds/trainingjob.yaml) against the C parser of
the same manifest (shared/jobspec.c, through `pliant train`): field names,
enums, ranges, required fields and defaults must agree.

No kube-apiserver here, so the file carries a small structural-schema validator
and defaulter written after apiextensions-apiserver's rules (type, properties,
required, enum, minimum/maximum with exclusive*, min/maxLength, pattern, items,
additionalProperties, x-kubernetes-preserve-unknown-fields, unknown fields
rejected as kubectl's strict field validation does). The CEL rules
(x-kubernetes-validations) are checked through RULES below: each rule text maps
to a Python function, and a rule without one fails the test.

`pliant train JOB` exits 2 with "field.path: reason" when the manifest is
invalid, before anything else happens; a valid manifest whose data glob matches
nothing exits 1. That is how the tests ask the C parser for its verdict.

Run: python3 tests/cli/test_crd.py --build build [-k SUBSTRING]
"""

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from clitest import REPO, Suite, check  # noqa: E402
import yamlmini  # noqa: E402

suite = Suite("crd")
test = suite.test

CRD_PATH = os.path.join(REPO, "crds", "trainingjob.yaml")
JOBSPEC_C = os.path.join(REPO, "shared", "jobspec.c")
INT_MAX = 2147483647
INT64_MAX = 2**63 - 1

# --------------------------------------------------------------------------
# The CRD and its schema


def load_crd():
    with open(CRD_PATH) as f:
        return yamlmini.load(f.read())


def root_schema():
    return load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def at(schema, path):
    """The schema of a dotted path ("spec.batch.micro") under the root schema."""
    s = schema
    for part in path.split("."):
        s = s["properties"][part]
    return s


# The CEL rules of the CRD, as Python. Every rule in the CRD must be here.
def _has(obj, *keys):
    for k in keys:
        if not isinstance(obj, dict) or k not in obj:
            return False
        obj = obj[k]
    return True


RULES = {
    "!has(self.faultTolerance) || !has(self.faultTolerance.strategy) || "
    "self.faultTolerance.strategy != 'checkpoint' || (has(self.checkpoint) && "
    "has(self.checkpoint.dir) && self.checkpoint.dir != '')":
        lambda s: (not _has(s, "faultTolerance", "strategy") or
                   s["faultTolerance"]["strategy"] != "checkpoint" or
                   (_has(s, "checkpoint", "dir") and s["checkpoint"]["dir"] != "")),
    "!has(self.faultTolerance) || !has(self.faultTolerance.redundantForward) || "
    "(has(self.faultTolerance.strategy) && self.faultTolerance.strategy == 'redundant')":
        lambda s: (not _has(s, "faultTolerance", "redundantForward") or
                   (_has(s, "faultTolerance", "strategy") and
                    s["faultTolerance"]["strategy"] == "redundant")),
    "!has(self.model) || !has(self.model.maxSeqLen) || self.batch.seqLen <= self.model.maxSeqLen":
        lambda s: not _has(s, "model", "maxSeqLen") or s["batch"]["seqLen"] <= s["model"]["maxSeqLen"],
    "!has(self.channels) || !has(self.heads) || self.channels % self.heads == 0":
        lambda s: "channels" not in s or "heads" not in s or s["channels"] % s["heads"] == 0,
    "self.global % self.micro == 0":
        lambda s: s["global"] % s["micro"] == 0,
    "!has(self.max) || !has(self.min) || self.max == 0 || self.max >= self.min":
        lambda s: "max" not in s or "min" not in s or s["max"] == 0 or s["max"] >= s["min"],
}

# --------------------------------------------------------------------------
# Structural schema: validation and defaulting (apiextensions-apiserver's rules)

TYPES = {"object", "array", "string", "integer", "number", "boolean"}
SCHEMA_KEYS = {"type", "description", "properties", "required", "items", "enum", "default",
               "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
               "maxLength", "pattern", "format", "additionalProperties", "nullable",
               "minItems", "maxItems", "x-kubernetes-preserve-unknown-fields",
               "x-kubernetes-int-or-string", "x-kubernetes-validations",
               "x-kubernetes-list-type", "x-kubernetes-list-map-keys"}


def structural_errors(s, path="<root>"):
    """Violations of the structural-schema rules (and of our own conventions)."""
    errs = []
    for k in s:
        if k not in SCHEMA_KEYS:
            errs.append("%s: keyword %s not allowed here" % (path, k))
    if "type" not in s and not s.get("x-kubernetes-int-or-string") and \
            not s.get("x-kubernetes-preserve-unknown-fields"):
        errs.append("%s: type missing" % path)
    t = s.get("type")
    if t is not None and t not in TYPES:
        errs.append("%s: bad type %r" % (path, t))
    if "properties" in s and "additionalProperties" in s:
        errs.append("%s: properties and additionalProperties together" % path)
    if t == "array" and "items" not in s:
        errs.append("%s: array without items" % path)
    for r in s.get("required", []):
        if r not in s.get("properties", {}) and not s.get("x-kubernetes-preserve-unknown-fields"):
            errs.append("%s: required %s is not a property" % (path, r))
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in s and t not in ("integer", "number"):
            errs.append("%s: %s on a %s" % (path, key, t))
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in s and not isinstance(s[key], bool):
            errs.append("%s: %s must be a boolean in apiextensions.k8s.io/v1" % (path, key))
    for rule in s.get("x-kubernetes-validations", []):
        if rule.get("rule") not in RULES:
            errs.append("%s: CEL rule %r has no Python twin in RULES" % (path, rule.get("rule")))
        if not rule.get("message"):
            errs.append("%s: CEL rule without a message" % path)
    if "default" in s:
        d = copy.deepcopy(s["default"])
        apply_defaults(d, s)
        for e in validate(d, s, path + "(default)", cel=False):
            errs.append("default: " + e)
    for name, sub in s.get("properties", {}).items():
        errs += structural_errors(sub, path + "." + name if path != "<root>" else name)
    if isinstance(s.get("items"), dict):
        errs += structural_errors(s["items"], path + "[*]")
    if isinstance(s.get("additionalProperties"), dict):
        errs += structural_errors(s["additionalProperties"], path + "[*]")
    return errs


def apply_defaults(obj, s):
    """Fills absent (or null, non-nullable) properties that have a default,
    then recurses, as the API server does before validation."""
    if isinstance(obj, dict):
        for name, sub in s.get("properties", {}).items():
            if (name not in obj or (obj[name] is None and not sub.get("nullable"))) and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                apply_defaults(obj[name], sub)
        if isinstance(s.get("additionalProperties"), dict):
            for v in obj.values():
                apply_defaults(v, s["additionalProperties"])
    elif isinstance(obj, list) and isinstance(s.get("items"), dict):
        for v in obj:
            apply_defaults(v, s["items"])


def _show(v):
    return json.dumps(v) if not isinstance(v, (dict, list)) else ("object" if isinstance(v, dict) else "array")


def validate(obj, s, path="", cel=True):
    """Errors "path: Invalid value ..." (empty when obj is valid)."""
    errs = []
    p = path or "<root>"
    if obj is None:
        if s.get("nullable"):
            return []
        return ["%s: Invalid value: \"null\": %s in body must be of type %s" % (p, p, s.get("type"))]
    t = s.get("type")
    if s.get("x-kubernetes-int-or-string"):
        if isinstance(obj, bool) or not isinstance(obj, (int, str)):
            errs.append("%s: must be an integer or a string" % p)
        return errs
    ok = {
        None: True,
        "object": isinstance(obj, dict),
        "array": isinstance(obj, list),
        "string": isinstance(obj, str),
        "integer": isinstance(obj, int) and not isinstance(obj, bool),
        "number": isinstance(obj, (int, float)) and not isinstance(obj, bool),
        "boolean": isinstance(obj, bool),
    }[t]
    if not ok:
        return ["%s: Invalid value: %s: %s in body must be of type %s" % (p, _show(obj), p, t)]
    if t == "integer" and s.get("format") == "int64" and not -2**63 <= obj < 2**63:
        errs.append("%s: Invalid value: %d: out of int64 range" % (p, obj))
    if "enum" in s and obj not in s["enum"]:
        errs.append("%s: Unsupported value: %s: supported values: %s" %
                    (p, _show(obj), ", ".join(json.dumps(e) for e in s["enum"])))
    if t in ("integer", "number"):
        if isinstance(obj, float) and not math.isfinite(obj):
            errs.append("%s: Invalid value: %s: must be finite" % (p, obj))
        if "minimum" in s:
            if s.get("exclusiveMinimum") and not obj > s["minimum"]:
                errs.append("%s: Invalid value: %s: %s in body should be greater than %s" % (p, obj, p, s["minimum"]))
            elif obj < s["minimum"]:
                errs.append("%s: Invalid value: %s: %s in body should be greater than or equal to %s"
                            % (p, obj, p, s["minimum"]))
        if "maximum" in s:
            if s.get("exclusiveMaximum") and not obj < s["maximum"]:
                errs.append("%s: Invalid value: %s: %s in body should be less than %s" % (p, obj, p, s["maximum"]))
            elif obj > s["maximum"]:
                errs.append("%s: Invalid value: %s: %s in body should be less than or equal to %s"
                            % (p, obj, p, s["maximum"]))
    if t == "string":
        if "minLength" in s and len(obj) < s["minLength"]:
            errs.append("%s: Invalid value: %s: %s in body should be at least %d chars long" % (p, _show(obj), p, s["minLength"]))
        if "maxLength" in s and len(obj) > s["maxLength"]:
            errs.append("%s: Too long: may not be longer than %d" % (p, s["maxLength"]))
        if "pattern" in s and not re.search(s["pattern"], obj):
            errs.append("%s: Invalid value: %s: %s in body should match '%s'" % (p, _show(obj), p, s["pattern"]))
    if t == "object" or (t is None and isinstance(obj, dict)):
        props = s.get("properties", {})
        for r in s.get("required", []):
            if r not in obj:
                errs.append("%s: Required value" % (path + "." + r if path else r))
        for k, v in obj.items():
            sub = path + "." + k if path else k
            if k in props:
                errs += validate(v, props[k], sub, cel)
            elif isinstance(s.get("additionalProperties"), dict):
                errs += validate(v, s["additionalProperties"], sub, cel)
            elif not s.get("x-kubernetes-preserve-unknown-fields") and not (path == "metadata"):
                errs.append("%s: unknown field \"%s\"" % (p, sub))
    if t == "array" or (t is None and isinstance(obj, list)):
        for i, v in enumerate(obj):
            errs += validate(v, s["items"], "%s[%d]" % (path, i), cel)
        if s.get("x-kubernetes-list-type") == "map":
            seen = set()
            for i, v in enumerate(obj):
                key = tuple(v.get(k) for k in s.get("x-kubernetes-list-map-keys", []))
                if key in seen:
                    errs.append("%s[%d]: Duplicate value: %s" % (path, i, key))
                seen.add(key)
    if cel and not errs:
        for rule in s.get("x-kubernetes-validations", []):
            fn = RULES.get(rule["rule"])
            if fn is None:
                errs.append("%s: no Python twin for CEL rule %r" % (p, rule["rule"]))
            elif not fn(obj):
                errs.append("%s: Invalid value: %s: %s" % (p, _show(obj), rule["message"]))
    return errs


def admit(manifest):
    """What the API server would do on create: (defaulted object, errors)."""
    obj = copy.deepcopy(manifest)
    schema = root_schema()
    apply_defaults(obj, schema)
    errs = []
    if obj.get("apiVersion") != "pliant.dev/v1alpha1":
        errs.append("apiVersion: must be pliant.dev/v1alpha1")
    if obj.get("kind") != "TrainingJob":
        errs.append("kind: must be TrainingJob")
    if not isinstance(obj.get("metadata"), dict) or not obj["metadata"].get("name"):
        errs.append("metadata.name: Required value")
    errs += validate(obj, schema)
    return obj, errs


# --------------------------------------------------------------------------
# The C parser's verdict


def pliant_verdict(manifest, name="job"):
    """(accepted, stderr) of `pliant train` on manifest (a dict, written as JSON
    with a data glob that matches nothing, so that nothing trains)."""
    m = copy.deepcopy(manifest)
    spec = m.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("data"), dict) and isinstance(spec["data"].get("train"), str) \
            and spec["data"]["train"]:
        spec["data"]["train"] = os.path.join(suite.tmp, "no-such-dir", "none_*.bin")
    if isinstance(spec, dict) and isinstance(spec.get("checkpoint"), dict) and \
            isinstance(spec["checkpoint"].get("dir"), str) and spec["checkpoint"]["dir"]:
        spec["checkpoint"]["dir"] = os.path.join(suite.tmp, "no-such-dir", "ckpt")
    path = os.path.join(suite.tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(m, f)
    rc, out, err = suite.run("train", path, timeout=120)
    check(rc in (1, 2), "pliant train %s: exit %d (expected 1 or 2)\n%s%s", name, rc, out[-2000:], err[-2000:])
    return rc == 1, err


BASE = {
    "apiVersion": "pliant.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "base"},
    "spec": {
        "model": {"layers": 2, "channels": 32, "heads": 2, "vocabSize": 256, "maxSeqLen": 64},
        "data": {"train": "/data/t_*.bin"},
        "batch": {"global": 8, "micro": 4, "seqLen": 32},
        "steps": 10,
    },
}


def with_field(path, value, base=BASE):
    """A copy of base with the dotted path set to value (None deletes it)."""
    m = copy.deepcopy(base)
    parts = path.split(".")
    d = m
    for part in parts[:-1]:
        d = d.setdefault(part, {})
    if value is None:
        d.pop(parts[-1], None)
    else:
        d[parts[-1]] = value
    return m


def names_field(errs, field):
    return any(field in e for e in errs)


# --------------------------------------------------------------------------
# jobspec.c, read as text: known fields, enums, ranges, defaults

FUNC_PATH = {"parse_root": "", "parse_spec": "spec", "parse_model": "spec.model",
             "parse_data": "spec.data", "parse_batch": "spec.batch",
             "parse_optimizer": "spec.optimizer", "parse_checkpoint": "spec.checkpoint",
             "parse_fault_tolerance": "spec.faultTolerance", "parse_nodes": "spec.nodes",
             "parse_worker": "spec.worker", "parse_run_policy": "spec.runPolicy",
             "parse_cost": "spec.cost"}
# the parts of a parse_* function above that read fields of its object (no known[] list)
PART_PATH = dict(FUNC_PATH, parse_preset="spec.model", parse_model_sizes="spec.model",
                 parse_init="spec.model")


def jobspec_functions():
    with open(JOBSPEC_C) as f:
        src = f.read()
    out = {}
    for m in re.finditer(r"^static int (parse_\w+)\([^)]*\)\n\{(.*?)^\}", src, re.S | re.M):
        out[m.group(1)] = m.group(2)
    return src, out


def c_strings(body, var):
    m = re.search(r"static const char \*const %s\[\] = \{(.*?)\};" % var, body, re.S)
    return re.findall(r'"([^"]*)"', m.group(1)) if m else None


def c_int(tok):
    tok = tok.strip()
    if tok == "INT_MAX":
        return INT_MAX
    m = re.match(r"^(\d+) << (\d+)$", tok)
    if m:
        return int(m.group(1)) << int(m.group(2))
    return int(tok)


# Defaults: CRD path -> jobspec.c's set_defaults() expression it must equal.
DEFAULTS = {
    "spec.model.preset": ('pl_model_preset("gpt2-tiny"', "gpt2-tiny"),
    "spec.model.init": ("job->model.init = PL_INIT_RANDOM", "random"),
    "spec.model.seed": ("job->model.seed = 1337", 1337),
    "spec.data.order": ("job->data.order = PL_ORDER_SHUFFLED", "shuffled"),
    "spec.data.seed": ("job->data.seed = 42", 42),
    "spec.optimizer.lr": (".lr = 3.0e-4", 3.0e-4),
    "spec.optimizer.schedule": (".schedule = PL_SCHEDULE_COSINE", "cosine"),
    "spec.optimizer.warmupSteps": (".warmup_steps = 10", 10),
    "spec.optimizer.minLrRatio": (".min_lr_ratio = 0.1", 0.1),
    "spec.optimizer.beta1": (".beta1 = 0.9", 0.9),
    "spec.optimizer.beta2": (".beta2 = 0.95", 0.95),
    "spec.optimizer.eps": (".eps = 1.0e-8", 1.0e-8),
    "spec.optimizer.weightDecay": (".weight_decay = 0.1", 0.1),
    "spec.optimizer.gradClip": (".grad_clip = 1.0", 1.0),
    "spec.evalEvery": ("job->eval_every = 50", 50),
    "spec.evalBatches": ("job->eval_batches = 8", 8),
    "spec.checkpoint.every": ("job->checkpoint.every = 100", 100),
    "spec.checkpoint.resume": ("job->checkpoint.resume = PL_RESUME_AUTO", "auto"),
    "spec.checkpoint.keep": ("job->checkpoint.keep = 0", 0),
    "spec.faultTolerance.strategy": (".strategy = PL_STRATEGY_TEMPLATES", "templates"),
    "spec.faultTolerance.tolerate": (".tolerate = 1", 1),
    "spec.faultTolerance.maxResets": (".max_resets = 100", 100),
    "spec.faultTolerance.hostsAddedCheckEvery": (".hosts_added_check_every = 1", 1),
    "spec.faultTolerance.heartbeatSeconds": (".heartbeat_seconds = 3", 3),
    "spec.faultTolerance.waitForNodesTimeoutSeconds": (".wait_for_nodes_timeout_seconds = 600", 600),
    "spec.nodes.min": ("job->nodes.min = 1", 1),
    "spec.nodes.max": ("job->nodes.max = 0", 0),
    "spec.nodes.gpusPerNode": ("job->nodes.gpus_per_node = 1", 1),
    "spec.profile": ('snprintf(job->profile, sizeof job->profile, "auto")', "auto"),
}
# Defaults of the operator-only fields, which jobspec.c passes through as JSON.
OPERATOR_DEFAULTS = {"spec.runPolicy.suspend": False, "spec.runPolicy.cleanPodPolicy": "Running"}


def all_default_paths(s, path=""):
    out = {}
    for name, sub in s.get("properties", {}).items():
        p = path + "." + name if path else name
        if "default" in sub and not isinstance(sub["default"], dict):
            out[p] = sub["default"]
        out.update(all_default_paths(sub, p))
    return out


# --------------------------------------------------------------------------
# Tests


@test
def crd_names_and_versions():
    crd = load_crd()
    check(crd["apiVersion"] == "apiextensions.k8s.io/v1", "apiVersion %r", crd["apiVersion"])
    check(crd["kind"] == "CustomResourceDefinition", "kind %r", crd["kind"])
    check(crd["metadata"]["name"] == "trainingjobs.pliant.dev", "name %r", crd["metadata"]["name"])
    s = crd["spec"]
    check(s["group"] == "pliant.dev" and s["scope"] == "Namespaced", "group/scope %r %r", s["group"], s["scope"])
    n = s["names"]
    check((n["kind"], n["plural"], n["singular"], n["shortNames"]) ==
          ("TrainingJob", "trainingjobs", "trainingjob", ["tj"]), "names %r", n)
    check(len(s["versions"]) == 1, "versions: %d", len(s["versions"]))
    v = s["versions"][0]
    check(v["name"] == "v1alpha1" and v["served"] is True and v["storage"] is True, "version %r", v)
    check(v["subresources"] == {"status": {}}, "subresources %r", v.get("subresources"))


@test
def crd_schema_is_structural():
    errs = structural_errors(root_schema())
    check(not errs, "structural-schema violations:\n%s", "\n".join(errs))
    s = root_schema()
    check(s["properties"]["metadata"] == {"type": "object"}, "metadata schema must be just type: object")
    check(s["required"] == ["spec"], "root required %r", s["required"])


@test
def crd_printer_columns():
    v = load_crd()["spec"]["versions"][0]
    cols = {c["name"]: c for c in v["additionalPrinterColumns"]}
    first = [c["name"] for c in v["additionalPrinterColumns"] if not c.get("priority")]
    check(first == ["Phase", "Step", "Steps", "Loss", "Nodes", "Pipelines", "Age"], "default columns %r", first)
    s = root_schema()
    for c in cols.values():
        jp = c["jsonPath"]
        check(jp.startswith("."), "%s: jsonPath %r", c["name"], jp)
        if jp == ".metadata.creationTimestamp":
            check(c["type"] == "date", "Age must be a date column")
            continue
        field = at(s, jp[1:])
        want = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}[field["type"]]
        check(c["type"] == want, "%s: column type %s, field type %s", c["name"], c["type"], field["type"])
    check(cols["Nodes"]["jsonPath"] == ".status.nodes.ready", "Nodes column %r", cols["Nodes"])


@test
def crd_status_schema():
    st = root_schema()["properties"]["status"]["properties"]
    for name in ("phase", "conditions", "observedGeneration", "step", "progressPercentage",
                 "estimatedRemainingSeconds", "loss", "samplesPerSecond", "nodes", "pipelines",
                 "planGeneration", "plan", "reconfigurations", "lastReconfiguration", "lastCheckpoint",
                 "startTime", "completionTime", "dashboard"):
        check(name in st, "status.%s missing", name)
    cond = st["conditions"]["items"]["properties"]
    check(set(cond) == {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"},
          "condition fields %r", sorted(cond))
    check(set(st["nodes"]["properties"]) >= {"desired", "running", "training"}, "status.nodes %r", st["nodes"])
    check(set(st["lastReconfiguration"]["properties"]) == {"time", "cause", "durationSeconds", "bytesCopied", "fromCheckpoint"},
          "lastReconfiguration %r", st["lastReconfiguration"])
    check(set(st["lastCheckpoint"]["properties"]) == {"step", "time", "dir"}, "lastCheckpoint %r",
          st["lastCheckpoint"])
    status = {"phase": "Running", "step": 120, "loss": 2.5, "pipelines": "2x4+1x3",
              "nodes": {"desired": 8, "running": 7, "training": 7, "ready": "7/8"},
              "conditions": [{"type": "Running", "status": "True", "reason": "Training",
                              "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                              "observedGeneration": 1}],
              "lastReconfiguration": {"time": "2026-01-01T00:00:00Z", "cause": "NodeLost",
                                      "durationSeconds": 1.5, "bytesCopied": 123456},
              "lastCheckpoint": {"step": 100, "time": "2026-01-01T00:00:00Z", "dir": "/ckpt/x"},
              "dashboard": "/jobs/default/gpt2/"}
    m = copy.deepcopy(BASE)
    m["status"] = status
    _, errs = admit(m)
    check(not errs, "a full status is rejected:\n%s", "\n".join(errs))
    m["status"]["conditions"].append(dict(status["conditions"][0]))
    _, errs = admit(m)
    check(names_field(errs, "status.conditions[1]"), "duplicate condition type accepted: %r", errs)


@test
def crd_fields_are_jobspec_fields():
    """Every field jobspec.c knows is in the CRD and vice versa (read from its known[] lists)."""
    _, funcs = jobspec_functions()
    s = root_schema()
    for fn, path in FUNC_PATH.items():
        check(fn in funcs, "jobspec.c: %s not found", fn)
        known = c_strings(funcs[fn], "known")
        check(known, "jobspec.c: %s has no known[] list", fn)
        node = at(s, path) if path else s
        crd_fields = set(node["properties"])
        extra = crd_fields - set(known)
        # imagePullPolicy: in the CRD and, once jobspec.c lists it, in both.
        pending = extra & {"imagePullPolicy"} if path == "spec.worker" else set()
        check(set(known) <= crd_fields, "%s: jobspec.c fields missing from the CRD: %s", path or "<root>",
              sorted(set(known) - crd_fields))
        check(not (extra - pending), "%s: CRD fields jobspec.c does not know: %s", path or "<root>",
              sorted(extra - pending))


@test
def crd_enums_are_jobspec_enums():
    src, funcs = jobspec_functions()
    s = root_schema()
    presets = re.findall(r'^\s*\{"(gpt2-[^"]+)",', src, re.M)
    check(presets, "no presets found in jobspec.c")
    check(at(s, "spec.model.preset")["enum"] == presets, "presets: CRD %r, jobspec %r",
          at(s, "spec.model.preset")["enum"], presets)
    for fn, var, path in (("parse_data", "orders", "spec.data.order"),
                          ("parse_optimizer", "schedules", "spec.optimizer.schedule"),
                          ("parse_checkpoint", "resumes", "spec.checkpoint.resume"),
                          (None, "STRATEGIES", "spec.faultTolerance.strategy"),
                          ("parse_fault_tolerance", "frc_modes", "spec.faultTolerance.redundantForward"),
                          ("parse_run_policy", "policies", "spec.runPolicy.cleanPodPolicy")):
        names = c_strings(funcs[fn] if fn else src, var)  # None: a file-scope table
        check(names and at(s, path)["enum"] == names, "%s: CRD %r, jobspec %r", path, at(s, path)["enum"], names)


@test
def crd_ranges_are_jobspec_ranges():
    _, funcs = jobspec_functions()
    s = root_schema()
    seen = 0
    for fn, body in funcs.items():
        for m in re.finditer(r'get_int\(c, (?:map|spec), (?:P|"spec"), "(\w+)", ([01]), ([^,]+), ([^,]+),', body):
            key, req, lo, hi = m.group(1), m.group(2) == "1", c_int(m.group(3)), c_int(m.group(4))
            base = PART_PATH[fn]
            path = base + "." + key
            f = at(s, path)
            seen += 1
            check(f["type"] == "integer", "%s: type %s", path, f["type"])
            check(f.get("minimum") == lo and f.get("maximum") == hi,
                  "%s: CRD [%s, %s], jobspec [%s, %s]", path, f.get("minimum"), f.get("maximum"), lo, hi)
            parent = at(s, base)
            check((key in parent.get("required", [])) == req, "%s: required in jobspec %s, CRD %s",
                  path, req, key in parent.get("required", []))
        for m in re.finditer(r'get_u64\(c, map, P, "(\w+)"', body):
            path = PART_PATH[fn] + "." + m.group(1)
            f = at(s, path)
            seen += 1
            check(f["type"] == "integer" and f.get("minimum") == 0 and f.get("format") == "int64",
                  "%s: must be a non-negative int64 (%r)", path, f)
    check(seen >= 20, "only %d integer fields found in jobspec.c", seen)


@test
def crd_defaults_are_jobspec_defaults():
    src, _ = jobspec_functions()
    m = re.search(r"static void set_defaults\(pl_job \*job\)\n\{(.*?)^\}", src, re.S | re.M)
    check(m, "set_defaults not found in jobspec.c")
    body = m.group(1)
    crd = all_default_paths(root_schema())
    for path, (c_expr, value) in DEFAULTS.items():
        check(c_expr in body, "jobspec.c set_defaults no longer has %r (the default of %s): update the CRD "
              "and this table", c_expr, path)
        check(path in crd, "%s: no default in the CRD (jobspec.c: %r)", path, value)
        check(crd[path] == value and type(crd[path]) in (type(value), int, float),
              "%s: CRD default %r, jobspec.c %r", path, crd[path], value)
    extra = set(crd) - set(DEFAULTS) - set(OPERATOR_DEFAULTS)
    check(not extra, "CRD defaults that jobspec.c does not have: %s", sorted(extra))
    for path, value in OPERATOR_DEFAULTS.items():
        check(crd.get(path) == value, "%s: default %r, expected %r", path, crd.get(path), value)
    for path in ("spec.model.layers", "spec.model.channels", "spec.model.heads", "spec.model.vocabSize",
                 "spec.model.maxSeqLen"):
        check("default" not in at(root_schema(), path), "%s must have no default (the preset's)", path)


@test
def defaulted_minimal_job_is_what_pliant_assumes():
    minimal = {"apiVersion": "pliant.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "min"},
               "spec": {"data": {"train": "/data/t_*.bin"},
                        "batch": {"global": 8, "micro": 4, "seqLen": 32}, "steps": 10}}
    obj, errs = admit(minimal)
    check(not errs, "minimal job rejected:\n%s", "\n".join(errs))
    spec = obj["spec"]
    for path, (_, value) in DEFAULTS.items():
        d = spec
        for part in path.split(".")[1:]:
            d = d[part]
        check(d == value, "%s defaulted to %r, expected %r", path, d, value)
    check(spec["runPolicy"] == {"suspend": False, "cleanPodPolicy": "Running"}, "runPolicy %r", spec["runPolicy"])
    check("worker" not in spec, "worker defaulted: %r", spec.get("worker"))
    # The C parser accepts what the API server stores (defaults written out).
    ok, err = pliant_verdict(obj, "defaulted")
    check(ok, "pliant rejects the defaulted minimal job: %s", err)


@test
def examples_validate():
    found = 0
    for name in sorted(os.listdir(os.path.join(REPO, "examples"))):
        if not name.endswith(".yaml"):
            continue
        found += 1
        with open(os.path.join(REPO, "examples", name)) as f:
            docs = yamlmini.load_all(f.read())
        for doc in docs:
            obj, errs = admit(doc)
            check(not errs, "examples/%s rejected by the CRD schema:\n%s", name, "\n".join(errs))
            ok, err = pliant_verdict(doc, "example-" + name)
            check(ok, "examples/%s rejected by pliant: %s", name, err)
            ok, err = pliant_verdict(obj, "example-defaulted-" + name)
            check(ok, "examples/%s after CRD defaulting rejected by pliant: %s", name, err)
    check(found >= 2, "only %d examples found", found)


# Manifests both must reject, and the field each error must name.
INVALID = [
    ("spec.model.preset", "gpt3"),
    ("spec.model.layers", 0),
    ("spec.model.layers", 1025),
    ("spec.model.channels", "128"),
    ("spec.model.heads", 3),                    # does not divide channels (CEL)
    ("spec.model.init", "pretrained"),
    ("spec.model.init", "llmc:"),
    ("spec.model.seed", -1),
    ("spec.data", None),
    ("spec.data.train", None),
    ("spec.data.train", ""),
    ("spec.data.order", "random"),
    ("spec.batch", None),
    ("spec.batch.global", None),
    ("spec.batch.micro", None),
    ("spec.batch.seqLen", None),
    ("spec.batch.micro", 3),                    # does not divide global (CEL)
    ("spec.batch.micro", 0),
    ("spec.batch.seqLen", 65),                  # more than maxSeqLen (CEL)
    ("spec.batch.global", 1.5),
    ("spec.optimizer.lr", 0),
    ("spec.optimizer.lr", "fast"),
    ("spec.optimizer.schedule", "linear"),
    ("spec.optimizer.warmupSteps", -1),
    ("spec.optimizer.minLrRatio", 1.5),
    ("spec.optimizer.beta1", 1),
    ("spec.optimizer.beta2", -0.1),
    ("spec.optimizer.eps", 0),
    ("spec.optimizer.weightDecay", -0.1),
    ("spec.optimizer.gradClip", -1),
    ("spec.optimizer.momentum", 0.9),           # unknown field
    ("spec.steps", None),
    ("spec.steps", 0),
    ("spec.steps", 2147483648),
    ("spec.evalEvery", -1),
    ("spec.evalBatches", 0),
    ("spec.checkpoint.every", -1),
    ("spec.checkpoint.resume", "always"),
    ("spec.checkpoint.keep", -1),
    ("spec.checkpoint.keep", 1.5),
    ("spec.checkpoint.keep", "2"),
    ("spec.faultTolerance.strategy", "mirror"),
    ("spec.faultTolerance.redundantForward", "sometimes"),
    ("spec.faultTolerance.redundantForward", "lazy"),  # only with strategy redundant (CEL)
    ("spec.faultTolerance.strategy", "checkpoint"),  # needs checkpoint.dir (CEL)
    ("spec.faultTolerance.tolerate", -1),
    ("spec.faultTolerance.hostsAddedCheckEvery", 0),
    ("spec.faultTolerance.heartbeatSeconds", 0),
    ("spec.faultTolerance.waitForNodesTimeoutSeconds", -1),
    ("spec.nodes.min", 0),
    ("spec.nodes.max", -1),
    ("spec.nodes.gpusPerNode", 0),
    ("spec.cost.spot", -1),
    ("spec.cost.onDemand", "3"),
    ("spec.cost.hourly", 1),                    # unknown field
    ("spec.profile", ""),
    ("spec.worker.image", 5),
    ("spec.worker.tolerations", {"key": "x"}),
    ("spec.worker.env", "A=B"),
    ("spec.worker.terminationGracePeriodSeconds", -1),
    ("spec.worker.hostNetwork", True),          # unknown field
    ("spec.worker.labels", {"team": 1}),
    ("spec.worker.labels", {"team": "x" * 64}),  # a label value has at most 63 characters
    ("spec.worker.annotations", ["a"]),
    ("spec.worker.nodeSelector", {"pool": 1}),
    ("spec.worker.imagePullSecrets", [{}]),
    ("spec.worker.imagePullSecrets", {"name": "regcred"}),
    ("spec.worker.volumeMounts", [{"name": "ckpt"}]),
    ("spec.worker.serviceAccountName", 3),
    ("spec.worker.automountServiceAccountToken", "yes"),
    ("spec.worker.schedulerName", ["a"]),
    ("spec.worker.runtimeClassName", 1),
    ("spec.worker.podSecurityContext", []),
    ("spec.worker.securityContext", "restricted"),
    ("spec.runPolicy.suspend", "yes"),
    ("spec.runPolicy.cleanPodPolicy", "all"),
    ("spec.runPolicy.activeDeadlineSeconds", -5),
    ("spec.runPolicy.ttlSecondsAfterFinished", 1.5),
    ("spec.runPolicy.backoffLimit", -1),
    ("spec.runPolicy.backoffLimit", "3"),
    ("spec.extra", 1),                          # unknown field
]


@test
def invalid_manifests_rejected_naming_the_field():
    problems = []
    for path, value in INVALID:
        m = with_field(path, value)
        label = "%s=%s" % (path, json.dumps(value))
        _, errs = admit(m)
        if not errs:
            problems.append("%s: accepted by the CRD schema" % label)
        elif not names_field(errs, path):
            problems.append("%s: CRD errors do not name %s: %s" % (label, path, errs))
        ok, err = pliant_verdict(m, "invalid")
        if ok:
            problems.append("%s: accepted by pliant" % label)
        elif path not in err:
            problems.append("%s: pliant's error does not name %s: %s" % (label, path, err.strip()))
    check(not problems, "\n".join(problems))


@test
def job_names_are_kubernetes_object_names():
    """metadata.name is any Kubernetes object name (a DNS-1123 subdomain of up to 253
    characters: the operator shortens the names it derives), for the schema and pliant."""
    for name in ("a" * 253, "team.a.job-1", "9lives"):
        m = copy.deepcopy(BASE)
        m["metadata"]["name"] = name
        _, errs = admit(m)
        check(not errs, "CRD rejects name %r: %r", name, errs)
        ok, err = pliant_verdict(m, "name")
        check(ok, "pliant rejects name %r: %s", name, err)
    for name in ("a" * 254, "a..b", "a.-b", "-a", "a.", "Big"):
        m = copy.deepcopy(BASE)
        m["metadata"]["name"] = name
        ok, err = pliant_verdict(m, "badname")
        check(not ok and "metadata.name" in err, "pliant accepts name %r: %s", name, err)


@test
def nodes_max_below_min_rejected():
    m = with_field("spec.nodes", {"min": 4, "max": 2})
    _, errs = admit(m)
    check(names_field(errs, "spec.nodes.max"), "CRD: %r", errs)
    ok, err = pliant_verdict(m, "nodes")
    check(not ok and "spec.nodes.max" in err, "pliant: %s", err)
    m = with_field("spec.nodes", {"min": 4, "max": 0})
    _, errs = admit(m)
    check(not errs, "max 0 (unset) rejected: %r", errs)


@test
def boundaries_agree_with_pliant():
    """At every range boundary of every numeric field, the CRD and pliant agree."""
    s = root_schema()
    probes = []

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            p = path + "." + name
            if sub.get("type") in ("integer", "number") and p.startswith("spec."):
                lo, hi = sub.get("minimum"), sub.get("maximum")
                step = 1 if sub["type"] == "integer" else 1e-9
                if lo is not None:
                    probes.extend([(p, lo), (p, lo - step), (p, lo + step)])
                if hi is not None:
                    probes.extend([(p, hi), (p, hi + step), (p, hi - step)])
                if sub["type"] == "integer":
                    probes.append((p, 1.5))
            walk(sub, p)

    walk(s["properties"]["spec"], "spec")
    problems = []
    for path, value in probes:
        if path.endswith(".seed") and isinstance(value, int) and value > INT64_MAX:
            continue  # jobspec.c takes seeds up to 2^64-1; Kubernetes integers stop at 2^63-1
        m = with_field(path, value)
        _, errs = admit(m)
        ok, err = pliant_verdict(m, "probe")
        if ok != (not errs):
            problems.append("%s=%r: CRD %s, pliant %s" % (path, value, errs or "accepts",
                                                          "accepts" if ok else err.strip()))
    check(len(probes) > 60, "only %d probes", len(probes))
    check(not problems, "\n".join(problems))


@test
def every_crd_field_accepted_by_pliant():
    worker = {"image": "ghcr.io/pliant-dev/pliant-worker:0.1", "imagePullPolicy": "IfNotPresent",
              "resources": {"limits": {"nvidia.com/gpu": 1}}, "nodeSelector": {"pool": "spot"},
              "tolerations": [{"key": "spot", "operator": "Exists"}], "affinity": {"nodeAffinity": {}},
              "priorityClassName": "spot", "env": [{"name": "A", "value": "b"}],
              "volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/d"}],
              "terminationGracePeriodSeconds": 30, "labels": {"kueue.x-k8s.io/queue-name": "gpu"},
              "annotations": {"karpenter.sh/do-not-disrupt": "true"}, "imagePullSecrets": [{"name": "regcred"}],
              "serviceAccountName": "trainer", "automountServiceAccountToken": True,
              "schedulerName": "volcano", "runtimeClassName": "nvidia",
              "podSecurityContext": {"fsGroup": 1000}, "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}
    m = with_field("spec.worker", worker)
    m = with_field("spec.runPolicy", {"suspend": True, "activeDeadlineSeconds": 3600,
                                      "ttlSecondsAfterFinished": 0, "cleanPodPolicy": "None",
                                      "backoffLimit": 3}, m)
    m = with_field("spec.checkpoint", {"dir": "/ckpt", "every": 5, "resume": "never", "keep": 2}, m)
    m = with_field("spec.faultTolerance", {"strategy": "redundant", "redundantForward": "lazy",
                                           "tolerate": 2, "maxResets": 3,
                                           "hostsAddedCheckEvery": 2, "heartbeatSeconds": 0.5,
                                           "stepTimeoutSeconds": 30, "belowMinimum": "degrade",
                                           "waitForNodesTimeoutSeconds": 0}, m)
    m = with_field("spec.nodes", {"min": 2, "max": 4, "gpusPerNode": 8}, m)
    m = with_field("spec.cost", {"spot": 0.918, "onDemand": 3.06}, m)
    m = with_field("spec.optimizer", {"lr": 1e-3, "schedule": "constant", "warmupSteps": 0, "minLrRatio": 0,
                                      "beta1": 0, "beta2": 0.999, "eps": 1e-6, "weightDecay": 0,
                                      "gradClip": 0}, m)
    m = with_field("spec.data", {"train": "/d/t_*.bin", "val": "/d/v_*.bin", "order": "sequential",
                                 "seed": 7}, m)
    m = with_field("spec.model.preset", "gpt2-d6", m)
    m = with_field("spec.model.init", "checkpoint:/ckpt/x", m)
    m = with_field("spec.model.seed", 1, m)
    m = with_field("spec.evalEvery", 0, m)
    m = with_field("spec.evalBatches", 1, m)
    m = with_field("spec.profile", "/profiles/p.json", m)
    _, errs = admit(m)
    check(not errs, "CRD rejects a job using every field:\n%s", "\n".join(errs))
    # Every CRD spec leaf is set above (so that a new CRD field needs a line here).
    s = root_schema()["properties"]["spec"]

    def leaves(node, obj, path):
        missing = []
        for name, sub in node.get("properties", {}).items():
            if name not in obj:
                missing.append(path + "." + name)
            elif sub.get("type") == "object" and "properties" in sub and \
                    not sub.get("x-kubernetes-preserve-unknown-fields"):
                missing += leaves(sub, obj[name], path + "." + name)
        return missing

    missing = leaves(s, m["spec"], "spec")
    check(not missing, "fields not exercised: %s", missing)
    ok, err = pliant_verdict(m, "every-field")
    if not ok and "spec.worker.imagePullPolicy: unknown field" in err:
        # The CRD has it; jobspec.c's parse_worker has not listed it yet.
        ok, err = pliant_verdict(with_field("spec.worker.imagePullPolicy", None, m), "every-field-2")
        check(ok, "pliant rejects a job using every field: %s", err)
        print("skip crd.every_crd_field_accepted_by_pliant.imagePullPolicy: "
              "shared/jobspec.c does not accept spec.worker.imagePullPolicy yet")
        return
    check(ok, "pliant rejects a job using every field: %s", err)


@test
def yamlmini_agrees_with_kubectl():
    """The tests' YAML reader reads the CRD and the examples as kubectl does (offline)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("skip crd.yamlmini_agrees_with_kubectl.kubectl: kubectl not installed")
        return
    files = [CRD_PATH] + [os.path.join(REPO, "examples", n) for n in sorted(os.listdir(os.path.join(REPO, "examples")))
                          if n.endswith(".yaml")]
    for path in files:
        p = subprocess.run([kubectl, "annotate", "--local", "-f", path, "pliant.dev/test=x", "-o", "json"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        check(p.returncode == 0, "kubectl annotate --local %s: %s", path, p.stderr.decode()[-500:])
        theirs = json.loads(p.stdout)
        del theirs["metadata"]["annotations"]["pliant.dev/test"]
        if not theirs["metadata"]["annotations"]:
            del theirs["metadata"]["annotations"]
        with open(path) as f:
            ours = yamlmini.load(f.read())
        check(ours == theirs, "%s: yamlmini and kubectl disagree", os.path.relpath(path, REPO))


if __name__ == "__main__":
    sys.exit(suite.main())
