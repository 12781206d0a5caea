"""What the apiserver does with a request once routed: CRUD with resourceVersion
preconditions, generation, the status subresource, finalizers and graceful Pod
deletion, CRD registration, structural schemas of custom resources, lists with
selectors and chunking. Every operation runs under the store's lock, so each is
atomic; the HTTP layer (apiserver.py) only parses and renders.
"""

import base64
import copy
import json
import random
import re
import time
import uuid

import core
import schema as structural
from errors import ApiError, already_exists, bad_request, conflict, gone, invalid, not_found, status_object
from patch import apply_patch
from registry import Registry, Resource, printer_columns
from selection import parse_fields, parse_labels
from store import Gone

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                "resourceVersion", "namespace", "name")
CRD_RKEY = "apiextensions.k8s.io/customresourcedefinitions"


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Api:
    def __init__(self, store):
        self.store = store
        self.registry = Registry()
        for res in core.builtin_resources():
            self.registry.add(res)
        self.ns_res = self.registry.lookup("v1", "namespaces")
        self.pod_res = self.registry.lookup("v1", "pods")
        self.admission = None       # admission.Admission: called on every create (after validation)
        with store.cond:
            for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
                self.create(self.ns_res, None, {"metadata": {"name": ns}})

    # -- representation ------------------------------------------------------------

    def out(self, res, obj):
        """The stored object as res's version presents it (a copy)."""
        obj = core.event_from_storage(res, copy.deepcopy(obj))
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        return obj

    def _incoming(self, res, body, namespace):
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        if body.get("apiVersion", res.api_version) != res.api_version:
            raise bad_request("the API version in the data (%s) does not match the expected API version (%s)"
                              % (body["apiVersion"], res.api_version))
        if body.get("kind", res.kind) != res.kind:
            raise bad_request("the kind in the data (%s) does not match the expected kind (%s)"
                              % (body["kind"], res.kind))
        obj = core.event_to_storage(res, copy.deepcopy(body))
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if res.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request("the namespace of the provided object does not match the namespace sent "
                                  "on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj

    # -- reads ---------------------------------------------------------------------

    def get(self, res, namespace, name):
        with self.store.cond:
            return self.out(res, self._current(res, namespace, name))

    def _current(self, res, namespace, name):
        obj = self.store.get(res.rkey, namespace, name)
        if obj is None:
            raise not_found(res, name)
        return obj

    def list(self, res, namespace, query):
        """(list metadata, items) honouring selectors, limit/continue and resourceVersionMatch=Exact."""
        match = self.selector(res, namespace, query)
        limit = query.get("limit") or "0"
        if not limit.isdigit():
            raise bad_request("invalid limit %r" % limit)
        limit = int(limit)
        with self.store.cond:
            rv, start = self.store.rv, None
            try:
                if query.get("continue"):
                    rv, start = _decode_continue(query["continue"])
                    items = self.store.snapshot(res.rkey, rv)
                elif query.get("resourceVersionMatch") == "Exact":
                    rv = int(query.get("resourceVersion") or 0)
                    items = self.store.snapshot(res.rkey, rv)
                else:
                    items = self.store.items(res.rkey)
            except Gone:
                raise gone("The provided continue parameter is too old to display a consistent list result. "
                           "You can start a new list without the continue parameter." if start is not None
                           else "too old resource version: %d (%d)" % (rv, self.store.compacted))
            items = [o for o in items if (start is None or _key(o) > start) and match(o)]
            meta = {"resourceVersion": str(rv)}
            if limit and len(items) > limit:
                meta["continue"] = _encode_continue(rv, _key(items[limit - 1]))
                meta["remainingItemCount"] = len(items) - limit
                items = items[:limit]
            return meta, [self.out(res, o) for o in items]

    def selector(self, res, namespace, query):
        """A predicate over stored objects for the request's namespace and selectors."""
        labels = parse_labels(query.get("labelSelector"))
        fields = parse_fields(query.get("fieldSelector"), res.fields)

        def match(obj):
            meta = obj["metadata"]
            return ((namespace is None or meta.get("namespace") == namespace)
                    and labels(meta.get("labels")) and fields(core.event_from_storage(res, obj)))
        return match

    # -- writes --------------------------------------------------------------------

    def create(self, res, namespace, body, query=None):
        """(created object, warnings for the Warning header)."""
        query = query or {}
        obj = self._incoming(res, body, namespace)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choice("bcdfghjklmnpqrstvwxz2456789")
                                                          for _ in range(5))
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        for key in _SYSTEM_META[:5]:
            meta.pop(key, None)
        meta.pop("managedFields", None)
        meta["uid"], meta["creationTimestamp"] = str(uuid.uuid4()), now()
        if res.crd or res.rkey == CRD_RKEY:
            meta["generation"] = 1
        if res.status and res.crd:
            obj.pop("status", None)
        with self.store.cond:
            warnings = self._admit(res, obj, None, query)
            if namespace is not None:
                self._check_namespace(namespace)
            if self.admission:
                warnings += self.admission(res, obj)
            if self.store.get(res.rkey, namespace, meta["name"]) is not None:
                raise already_exists(res, meta["name"])
            if query.get("dryRun") == "All":
                return self.out(res, obj), warnings
            stored = self.store.put(res.rkey, obj)
            self._after_write(res, stored)
            return self.out(res, stored), warnings

    def update(self, res, namespace, name, body, query=None, sub=None):
        query = query or {}
        obj = self._incoming(res, body, namespace)
        if obj["metadata"].get("name", name) != name:
            raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                              % (obj["metadata"]["name"], name))
        obj["metadata"]["name"] = name
        with self.store.cond:
            old = self._current(res, namespace, name)
            rv = obj["metadata"].get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise conflict(res, name)
            if not rv and res.crd:
                raise invalid(res, name, [("FieldValueInvalid", "metadata.resourceVersion",
                                           "Invalid value: 0x0: must be specified for an update")])
            return self._replace(res, old, obj, query, sub)

    def patch(self, res, namespace, name, content_type, patch, query=None, sub=None):
        with self.store.cond:
            old = self._current(res, namespace, name)
            patched = apply_patch(content_type, self.out(res, old), patch)
            if not isinstance(patched, dict):
                raise bad_request("the patch does not produce an object")
            patched.setdefault("metadata", {})
            if patched["metadata"].get("resourceVersion", old["metadata"]["resourceVersion"]) != \
                    old["metadata"]["resourceVersion"]:
                raise conflict(res, name)
            patched["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self.update(res, namespace, name, patched, query, sub)

    def mutate(self, res, namespace, name, fn, sub=None):
        """Internal writers (kubelet, garbage collector): fn edits a copy of the object;
        returns the stored result, or None if the object is gone."""
        with self.store.cond:
            old = self.store.get(res.rkey, namespace, name)
            if old is None:
                return None
            new = self.out(res, old)
            fn(new)
            return self._replace(res, old, self._incoming(res, new, namespace), {}, sub)[0]

    def _replace(self, res, old, obj, query, sub):
        """Applies the update rules to obj replacing old; returns (object, warnings)."""
        if sub == "status":
            status = obj.get("status")
            obj = self.out(res, old)
            obj = core.event_to_storage(res, obj)
            if status is None:
                obj.pop("status", None)
            else:
                obj["status"] = status
        elif res.status and "status" in old:
            obj["status"] = copy.deepcopy(old["status"])
        elif res.status:
            obj.pop("status", None)
        meta = obj["metadata"]
        for key in _SYSTEM_META:
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        meta.pop("managedFields", None)
        warnings = self._admit(res, obj, old, query)
        if "generation" in meta and _spec_part(res, obj) != _spec_part(res, old):
            meta["generation"] += 1
        if obj == dict(old, apiVersion=obj["apiVersion"], kind=obj["kind"]):
            return self.out(res, old), warnings   # a no-op update writes nothing, as in Kubernetes
        if query.get("dryRun") == "All":
            return self.out(res, obj), warnings
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not self._removal_waits(res, obj):
            return self.remove_now(res, obj), warnings
        stored = self.store.put(res.rkey, obj)
        self._after_write(res, stored)
        return self.out(res, stored), warnings

    def _admit(self, res, obj, old, query):
        """Defaults and validation (built-in strategy or CRD schema); 422 on violations."""
        warnings = []
        if res.schema:
            unknown = structural.prune(res.schema, obj)
            if unknown and query.get("fieldValidation") == "Strict":
                raise bad_request('%s in version "%s" cannot be handled as a %s: strict decoding error: %s'
                                  % (res.kind, res.version, res.kind,
                                     ", ".join('unknown field "%s"' % u for u in unknown)))
            if query.get("fieldValidation") != "Ignore":
                warnings += ['unknown field "%s"' % u for u in unknown]
            structural.apply_defaults(res.schema, obj)
        default, check = core.STRATEGIES.get(res.rkey, (None, None))
        if default:
            default(obj, old)
        causes = self._validate_name(res, obj["metadata"])
        if res.schema:
            causes += structural.validate(res.schema, obj)
        if check:
            causes += check(obj, old)
        if causes:
            raise invalid(res, obj["metadata"].get("name", ""), causes)
        return warnings

    def _validate_name(self, res, meta):
        name = meta.get("name")
        if not name:
            return [("FieldValueRequired", "metadata.name", "name or generateName is required")]
        if res.group == "rbac.authorization.k8s.io":     # path segment names (system:discovery)
            if name in (".", "..") or "/" in name or "%" in name:
                return [("FieldValueInvalid", "metadata.name", 'Invalid value: "%s": may not contain \'/\' or '
                         "'%%'" % name)]
            return []
        label = res.rkey in ("namespaces", "services")
        if label and (len(name) > 63 or not _LABEL.match(name)):
            return [("FieldValueInvalid", "metadata.name", 'Invalid value: "%s": a lowercase RFC 1123 label must '
                     "consist of lower case alphanumeric characters or '-', and must start and end with an "
                     "alphanumeric character" % name)]
        if len(name) > 253 or not _SUBDOMAIN.match(name):
            return [("FieldValueInvalid", "metadata.name", 'Invalid value: "%s": a lowercase RFC 1123 subdomain '
                     "must consist of lower case alphanumeric characters, '-' or '.', and must start and end "
                     "with an alphanumeric character" % name)]
        return []

    def _check_namespace(self, namespace):
        ns = self.store.get("namespaces", "", namespace)
        if ns is None:
            raise not_found(self.ns_res, namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", "unable to create new content in namespace %s because it is being "
                           "terminated" % namespace)

    # -- deletion ------------------------------------------------------------------

    def delete(self, res, namespace, name, options):
        """(HTTP status, body): 200 when gone now, 202 when deletion is pending
        (finalizers, a running Pod's grace period)."""
        with self.store.cond:
            obj = self._current(res, namespace, name)
            meta = obj["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta["uid"] or \
                    pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise conflict(res, name, "Precondition failed")
            if meta.get("deletionTimestamp") or "All" in (options.get("dryRun") or []):
                return 202, self.out(res, obj)
            policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "")
            if policy == "Orphan":
                self.orphan_dependents(meta["uid"])
            new = copy.deepcopy(obj)
            finalizers = new["metadata"].setdefault("finalizers", [])
            if policy == "Foreground" and self.dependents(meta["uid"]):
                finalizers.append("foregroundDeletion")
            if not finalizers:
                new["metadata"].pop("finalizers")
            grace = self._grace(res, obj, options)
            if finalizers or grace or res.rkey == "namespaces":
                new["metadata"]["deletionTimestamp"] = _later(grace)
                new["metadata"]["deletionGracePeriodSeconds"] = grace
                if res.rkey == "namespaces":
                    new["status"] = {"phase": "Terminating"}
                stored = self.store.put(res.rkey, new)
                return 202, self.out(res, stored)
            gone_obj = self.remove_now(res, obj)
            if res.rkey == "pods":
                return 200, gone_obj
            details = {"name": name, "kind": res.plural, "uid": meta["uid"]}
            if res.group:
                details["group"] = res.group
            return 200, status_object(200, "", "", details, status="Success")

    def _grace(self, res, pod, options):
        """Seconds a Pod gets to stop: only a running, bound Pod waits for its kubelet."""
        if res.rkey != "pods" or not pod["spec"].get("nodeName"):
            return 0
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        grace = options.get("gracePeriodSeconds")
        return int(pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)

    def _removal_waits(self, res, obj):
        """A deleted object without finalizers that is still not removed: a Pod its
        kubelet is stopping, a Namespace the collector is emptying."""
        return res.rkey == "namespaces" or res.rkey == "pods" and obj["metadata"].get("deletionGracePeriodSeconds")

    def finish_pod_deletion(self, namespace, name):
        """The kubelet's final delete once the containers stopped (grace period 0)."""
        with self.store.cond:
            pod = self.store.get("pods", namespace, name)
            if pod is not None:
                self.remove_now(self.pod_res, pod)

    # -- Pod subresources -----------------------------------------------------------

    def bind(self, namespace, name, node):
        """pods/NAME/binding: the scheduler's write of spec.nodeName (once only)."""
        with self.store.cond:
            pod = self._current(self.pod_res, namespace, name)
            if pod["spec"].get("nodeName"):
                raise conflict(self.pod_res, name, "pod %s is already assigned to node %s"
                               % (name, pod["spec"]["nodeName"]))
            new = copy.deepcopy(pod)
            new["spec"]["nodeName"] = node
            set_condition(new, "PodScheduled", "True", "", "")
            self.store.put("pods", new)

    def evict(self, namespace, name, options):
        """pods/NAME/eviction: a DisruptionTarget condition, then a graceful delete."""
        with self.store.cond:
            self._current(self.pod_res, namespace, name)
            self.mutate(self.pod_res, namespace, name, lambda p: set_condition(
                p, "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting"), sub="status")
            return self.delete(self.pod_res, namespace, name, options)

    def remove_now(self, res, obj):
        """Removes obj from the store at once (no grace, no finalizers)."""
        gone_obj = self.store.remove(res.rkey, obj)
        if res.rkey == CRD_RKEY:
            self._unregister_crd(obj)
        return self.out(res, gone_obj)

    def delete_collection(self, res, namespace, query, options):
        match = self.selector(res, namespace, query)
        with self.store.cond:
            doomed = [o for o in self.store.items(res.rkey) if match(o)]
            for obj in doomed:
                self.delete(res, obj["metadata"].get("namespace"), obj["metadata"]["name"], options)
            meta = {"resourceVersion": str(self.store.rv)}
            return {"kind": res.kind + "List", "apiVersion": res.api_version, "metadata": meta,
                    "items": [self.out(res, o) for o in doomed]}

    def dependents(self, owner_uid):
        """(resource, object) of every object with an ownerReference to owner_uid."""
        out = []
        for rkey, table in self.store.objects.items():
            for obj in table.values():
                if any(r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences", [])):
                    out.append((self.storage_resource(rkey), obj))
        return out

    def orphan_dependents(self, owner_uid):
        for res, obj in self.dependents(owner_uid):
            self.mutate(res, obj["metadata"].get("namespace"), obj["metadata"]["name"],
                        lambda o: o["metadata"].__setitem__("ownerReferences", [
                            r for r in o["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]))

    def storage_resource(self, rkey):
        """Some Resource stored under rkey (for internal writes)."""
        with self.registry.lock:
            for table in self.registry.by_gv.values():
                for res in table.values():
                    if res.rkey == rkey:
                        return res
        return None

    def record_event(self, obj, kind, reason, message, component, host=""):
        """A core/v1 Event about obj, as controllers and kubelets report them; one the API
        refuses (a namespace being terminated) is dropped, as client-go's recorder does."""
        meta = obj["metadata"]
        stamp = now()
        source = {"component": component, "host": host} if host else {"component": component}
        event = {
            "metadata": {"name": "%s.%s" % (meta["name"], uuid.uuid4().hex[:16])},
            "involvedObject": {"kind": obj["kind"], "apiVersion": obj["apiVersion"],
                               "namespace": meta.get("namespace", ""), "name": meta["name"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "source": source,
            "reportingComponent": component, "reportingInstance": host or component}
        try:
            self.create(self.registry.lookup("v1", "events"), meta.get("namespace") or "default", event)
        except ApiError:
            pass

    # -- CustomResourceDefinitions ---------------------------------------------------

    def _after_write(self, res, stored):
        if res.rkey == CRD_RKEY:
            self._register_crd(stored)

    def _register_crd(self, crd):
        spec, name = crd["spec"], crd["metadata"]["name"]
        names = spec["names"]
        self.registry.remove_crd(name)
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            self.registry.add(Resource(
                spec["group"], version["name"], names["plural"], names["kind"],
                namespaced=spec.get("scope") == "Namespaced", short_names=names.get("shortNames", ()),
                categories=names.get("categories", ()),
                status="status" in (version.get("subresources") or {}),
                columns=printer_columns(version.get("additionalPrinterColumns")), fields=(), crd=name,
                schema=(version.get("schema") or {}).get("openAPIV3Schema")))

    def _unregister_crd(self, crd):
        """Deleting a CRD deletes its custom resources (events included) and stops serving them."""
        rkey = "%s/%s" % (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        res = self.storage_resource(rkey)
        for obj in self.store.items(rkey):
            self.remove_now(res, obj)
        self.store.drop_resource(rkey)
        self.registry.remove_crd(crd["metadata"]["name"])


def condition_true(obj, kind):
    """Whether obj's status has the condition kind (Ready, ...) with status True."""
    return any(c["type"] == kind and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions", []))


def set_condition(obj, kind, status, reason, message):
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    old = next((c for c in conds if c["type"] == kind), None)
    new = {"type": kind, "status": status, "lastTransitionTime": now()}
    if reason:
        new.update(reason=reason, message=message)
    if old and old["status"] == status:
        new["lastTransitionTime"] = old.get("lastTransitionTime", new["lastTransitionTime"])
    conds[:] = [c for c in conds if c["type"] != kind] + [new]


def _spec_part(res, obj):
    """What metadata.generation tracks: everything but metadata (and status, when it
    has its own subresource)."""
    skip = ("metadata", "status") if res.status else ("metadata",)
    return {k: v for k, v in obj.items() if k not in skip + ("apiVersion", "kind")}


def _key(obj):
    return [obj["metadata"].get("namespace", ""), obj["metadata"]["name"]]


def _later(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + (seconds or 0)))


def _encode_continue(rv, key):
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": key}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token):
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        return int(data["rv"]), list(data["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid: %s" % token)
