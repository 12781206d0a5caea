#!/usr/bin/env python3
"""A Kubernetes API emulator for Pliant's tests: what a real kube-apiserver (plus
its controllers and, optionally, a scheduler and kubelets) does for an operator
and for `kubectl`, in one Python process, standard library only.

Usage:
  python3 tests/k8s/apiserver.py --port 0 [--host 127.0.0.1] [--tls] [--kubeconfig PATH]
      [--token TOKEN] [--kubelet] [--nodes N] [--zones z1,z2,z3] [--gpus-per-node G]
      [--bookmark-seconds S] [--history N] [--state-log PATH] [--work-dir DIR] [--verbose]
      [--authorization-mode AlwaysAllow|RBAC] [--enable-admission-plugins P1,P2]
      [--default-toleration-seconds S] [--controllers endpoints,deployments,serviceaccounts|all]
      [--cluster [--name pl] [--subnet 10.244.0.0/16] [--build-bin DIR]
                 [--node-monitor-grace-period S]]

It prints exactly one line, `listening URL` (e.g. `listening https://127.0.0.1:41234`),
once it accepts connections, and runs until SIGTERM/SIGINT (it then kills the Pod
processes it started). With --kubeconfig it writes a kubeconfig for kubectl and
for the operator: one cluster `emulator` (server URL and, with --tls, the CA as
certificate-authority-data), one user `emulator` (the --token, if any), one
context `emulator` (namespace default) that is the current-context. With --tls it
makes a throwaway CA (ca.pem in the --work-dir) and a server certificate for
127.0.0.1/localhost with the `openssl` command. With --token every API request needs `Authorization: Bearer
TOKEN` (else 401 with a Status); /healthz, /livez, /readyz and /_emulator/ are open.
kubectl (client-go) sends a token only over https: use --token with --tls.
ServiceAccount tokens (auth.py: TokenRequest, `kubectl create token`, the
tokens the --cluster kubelet mounts) are accepted besides --token.

--authorization-mode RBAC: rbac.py authorizes every request (the --token user is
system:masters, cluster-admin); a denied one is a 403 worded as kube-apiserver
words it. --enable-admission-plugins: admission.py's ServiceAccount,
DefaultTolerationSeconds and PodSecurity (podsecurity.py). --controllers: the
endpoints/EndpointSlice (endpoints.py), Deployment/ReplicaSet (deployments.py)
and ServiceAccount/root CA (serviceaccounts.py) controllers. --cluster: all of
these and the namespaced cluster (clustermode.py: nodes as network namespaces,
Pods in Linux namespaces with memory cgroups, DNS, node failures; needs root;
cluster.py is its front end); it listens on the bridge's address.

What is emulated (faithful to Kubernetes for what an operator and kubectl use):
- Discovery: /version, /api, /api/v1, /apis, /apis/GROUP, /apis/GROUP/VERSION
  (plain, not aggregated, discovery; kubectl falls back to it). /openapi/v2 is a
  valid empty document and /openapi/v3 lists no group-versions, so kubectl's
  client-side validation finds no schema and lets the server validate.
- Resources: namespaces, pods (+status, log, binding, eviction), services, secrets,
  configmaps, serviceaccounts, nodes (+status), events (core/v1 and events.k8s.io/v1,
  one storage with field conversion), leases (coordination.k8s.io/v1),
  endpointslices (discovery.k8s.io/v1) and networkpolicies (networking.k8s.io/v1)
  (stored only), customresourcedefinitions (apiextensions.k8s.io/v1; established at once). A CRD
  serves its resources (every served version, scope, short names, categories,
  status subresource, additionalPrinterColumns) with its structural schema:
  pruning (unknown fields: warning, or 400 with fieldValidation=Strict, which
  kubectl sends), defaults, and validation (type, enum, minimum/maximum, lengths,
  pattern, items, required, x-kubernetes-validations in a CEL subset: see cel.py)
  as 422 Invalid whose causes name the field (`spec.batch.micro`).
- CRUD: POST/GET/PUT/PATCH (merge patch, JSON patch, strategic merge patch with
  the core list merge keys: see patch.py)/DELETE, deletecollection; list with
  labelSelector (=, ==, !=, in, notin, exists, !exists), fieldSelector
  (metadata.name, metadata.namespace, spec.nodeName, status.phase, ...), limit
  and continue (a consistent snapshot; 410 once compacted), and
  resourceVersionMatch=Exact. One global resourceVersion counter; 409 Conflict
  on a stale metadata.resourceVersion, 409 AlreadyExists; custom resources need
  metadata.resourceVersion on PUT; a no-op update writes nothing; dryRun=All
  validates and answers without writing.
  metadata.generation (CRs, CRDs) is bumped on spec changes only; with a status
  subresource the main endpoint ignores status and /status ignores everything
  else. uid, creationTimestamp, generateName, deletionTimestamp and finalizers
  (deletion waits for them); a bound, running Pod is deleted gracefully (its
  kubelet stops it, then removes it); a Namespace is emptied, then removed;
  pods/NAME/eviction adds the DisruptionTarget condition, then deletes.
- Tables (Accept: application/json;as=Table;g=meta.k8s.io;v=v1) with the CRD's
  printer columns or kubectl's usual columns for built-ins; `kubectl get -w` too.
- Watch: ?watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=N,
  chunked, one JSON event per line: ADDED/MODIFIED/DELETED (selector-aware: an
  object leaving the selection is DELETED), BOOKMARK every --bookmark-seconds
  (default 1), ERROR with a 410 Expired Status (then the stream ends) for an RV
  older than the bounded history (--history events, default 2000) or after a
  forced compaction that ends watches.
- Garbage collection by ownerReferences uid: dependents of a deleted owner are
  deleted shortly after (Background); propagationPolicy Orphan removes the
  references; Foreground deletes the dependents before the owner.
- --kubelet (see kubelet.py): Nodes node-0..N-1 with zone labels, a scheduler
  (nodeSelector, nvidia.com/gpu), and kubelets that run each Pod's first container
  command as a local process with its own 127.0.0.X podIP (with --cluster: in
  its sandbox, runtime.py).
- Workloads, RBAC, service discovery and storage objects: deployments and
  replicasets (apps/v1), roles, clusterroles, rolebindings, clusterrolebindings
  (rbac.authorization.k8s.io/v1), endpoints, endpointslices (discovery.k8s.io/v1),
  persistentvolumeclaims (bound at once), poddisruptionbudgets (policy/v1, not
  enforced), networkpolicies (networking.k8s.io/v1, not enforced),
  serviceaccounts/NAME/token (authentication.k8s.io/v1 TokenRequest).

Admin endpoints (no authentication; with --cluster they answer this machine only,
not Pods; JSON in and out):
  POST   /_emulator/compact[?endWatches=true]  drop the event history (410 for older RVs);
                                               endWatches also ends open watches with 410
  POST   /_emulator/faults   {"status": 500|409|429|503|"timeout", "count": N, "method": "PUT",
                              "path_regex": "...", "seconds": S}  the next N (default 1) API requests
                              with that method (default: any) whose URL path matches the regex
                              (re.search; default: any) fail with that Status ("timeout": no answer
                              for S seconds (default 10), then the connection closes); a list of
                              such objects is accepted too; GET lists pending faults, DELETE clears them
  GET    /_emulator/requests[?since=SEQ]       {"count": N, "requests": [{"seq", "method", "path",
                                               "status", "userAgent", "user", "message" (of an
                                               error answer)}]} (the last 5000)
  POST   /_emulator/nodes    {"name"?, "zone"?, "gpus"?, "labels"?}  add a Ready node (the
                              "autoscaler"; needs --kubelet); delete one with DELETE /api/v1/nodes/NAME
  POST   /_emulator/nodes/NAME/notready   the node stops heartbeating: Ready=Unknown, taints
                              unreachable; its Pods are evicted (DisruptionTarget DeletionByTaintManager)
                              (with --cluster: the same as lose)
  POST   /_emulator/nodes/NAME/ACTION     with --cluster: preempt, lose, partition-from-peers,
                              partition-from-coordinator ({"address": IP}), restore (faults.py)

Not emulated: server-side apply (415), protobuf beyond the request bodies of
kubectl's typed create commands and `kubectl drain` (see protobuf.py; answers
are JSON), aggregated discovery, OpenAPI schemas, admission webhooks, RBAC
escalation checks, CRD conversion (versions differ only in apiVersion),
StatefulSets, Jobs and DaemonSets, ClusterIP routing (Services get a ClusterIP
that nothing routes to; the --cluster DNS answers with the endpoints'
addresses), PodDisruptionBudgets, NetworkPolicies, resource quotas, event TTLs.

--state-log PATH appends one JSON line per write: {"rv", "type" (ADDED, MODIFIED,
DELETED), "resource" (storage key, e.g. "pods", "pliant.dev/trainingjobs"),
"namespace", "name", "object"}.
"""

import argparse
import base64
import collections
import json
import os
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from api import Api  # noqa: E402
from collector import Collector  # noqa: E402
import protobuf  # noqa: E402
from errors import ApiError, method_not_allowed, status_object  # noqa: E402
from registry import group_document, table  # noqa: E402
import rbac  # noqa: E402
import admission  # noqa: E402
import clustermode  # noqa: E402
from auth import Authenticator  # noqa: E402
from deployments import DeploymentController  # noqa: E402
from endpoints import EndpointsController  # noqa: E402
from serviceaccounts import ServiceAccountController  # noqa: E402
from store import Store  # noqa: E402
from watch import Watch  # noqa: E402

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0-pliant-emulator", "gitCommit": "emulator",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "python",
           "compiler": "python", "platform": "linux/amd64"}
OPEN_PATHS = ("/healthz", "/livez", "/readyz")
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ssl.SSLError)
REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
           410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable", 504: "Timeout"}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, opts, api, kubelet, authenticator, authorizer=None):
        super().__init__(addr, Handler)
        self.opts, self.api, self.kubelet = opts, api, kubelet
        self.authenticator, self.authorizer = authenticator, authorizer
        self.admin_hosts = None     # client addresses the /_emulator/ endpoints answer (None: any)
        self.node_faults = None     # faults.Faults with --cluster
        self.tls = None
        self.lock = threading.Lock()        # faults and the request log
        self.faults = []
        self.requests = collections.deque(maxlen=5000)
        self.seq = 0

    def finish_request(self, request, client_address):
        """Runs in the connection's thread, so a slow TLS handshake blocks only it."""
        if self.tls is None:
            return super().finish_request(request, client_address)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()

    def take_fault(self, method, path):
        with self.lock:
            for fault in self.faults:
                if fault.get("method", method).upper() == method and re.search(fault.get("path_regex", ""), path):
                    fault["count"] = fault.get("count", 1) - 1
                    if fault["count"] <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def log_request_done(self, method, path, code, agent, user, message):
        with self.lock:
            self.seq += 1
            entry = {"seq": self.seq, "method": method, "path": path, "status": code, "userAgent": agent,
                     "user": user}
            if message:
                entry["message"] = message[:300]
            self.requests.append(entry)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 600           # idle keep-alive connections are closed after this

    def log_message(self, fmt, *args):
        if self.server.opts.verbose:
            sys.stderr.write("apiserver: %s\n" % (fmt % args))

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_PATCH(self):
        self.dispatch("PATCH")

    def do_DELETE(self):
        self.dispatch("DELETE")

    # -- plumbing ------------------------------------------------------------------

    def dispatch(self, method):
        url = urllib.parse.urlsplit(self.path)
        self.query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        self.code = 0
        self.user = None
        self.error = None           # the message of an error answer, for the request log
        path = url.path.rstrip("/") or "/"
        try:
            body = self.read_body()
            if path.startswith("/_emulator/"):
                self.admin(method, path, body)
            elif path in OPEN_PATHS:
                self.send_text(200, "ok")
            else:
                self.user = self.server.authenticator.authenticate(self.headers.get("Authorization", ""))
                if self.server.authorizer:
                    self.server.authorizer.authorize(self.user, rbac.request_info(method, path, self.query))
                if not self.inject_fault(method, path):
                    return
                self.route(method, path, body)
        except ApiError as e:
            try:
                self.send_json(e.code, e.status())
            except CLIENT_GONE:         # the client left (a timed-out heartbeat, say)
                self.close_connection = True
        except CLIENT_GONE:
            self.close_connection = True
        except Exception as e:  # an emulator bug: say so, as a real server's 500 would
            traceback.print_exc()
            if self.code:                   # mid-stream: only closing is left
                self.close_connection = True
            else:
                self.send_json(500, status_object(500, "InternalError", "emulator error: %s: %s"
                                                  % (type(e).__name__, e)))
        finally:
            if not path.startswith("/_emulator/"):
                self.server.log_request_done(method, self.path, self.code, self.headers.get("User-Agent", ""),
                                             self.user.name if self.user else "", self.error)

    def read_body(self):
        kind = self.headers.get("Content-Type", "")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                raw += self.rfile.read(size + 2)[:size]
                if size == 0:
                    break
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not raw.strip():
            return None
        if "protobuf" in kind:
            return protobuf.decode(raw)     # kubectl's typed commands (create secret, drain) send it
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(400, "BadRequest", "the body is not JSON (YAML is not accepted): %s" % e)

    def inject_fault(self, method, path):
        """False when a configured fault answered (or swallowed) the request."""
        fault = self.server.take_fault(method, path)
        if fault is None:
            return True
        if fault.get("status") == "timeout":
            time.sleep(float(fault.get("seconds", 10)))
            self.close_connection = True
            self.code = -1
            return False
        code = int(fault.get("status", 500))
        reason = REASONS.get(code, "InternalError")
        headers = {"Retry-After": "1"} if code in (429, 503) else {}
        self.send_json(code, status_object(code, reason, "injected fault: %s" % reason), headers)
        return False

    def send_json(self, code, obj, headers=None):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        self.code = code
        if code >= 400 and isinstance(obj, dict):
            self.error = obj.get("message")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def send_text(self, code, text, content_type="text/plain; charset=utf-8"):
        data = text.encode() if isinstance(text, str) else text
        self.code = code
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self, content_type):
        self.code = 200
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

    def send_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def client_gone(self):
        """True when the client closed the connection (readable and at EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- routing -------------------------------------------------------------------

    def route(self, method, path, body):
        registry = self.server.api.registry
        if path == "/version":
            return self.send_json(200, VERSION)
        if path == "/api":
            host = "%s:%d" % self.server.server_address[:2]
            return self.send_json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs":
                                        [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]})
        if path == "/apis":
            groups = [group_document(g, v) for g, v in registry.groups().items()]
            for g in groups:
                del g["apiVersion"], g["kind"]
            return self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if path == "/openapi/v2":
            return self.send_text(200, OPENAPI_V2_PROTO, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        if path == "/openapi/v3":
            return self.send_json(200, {"paths": {}})
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2 and parts[1] == "v1":
            gv, rest = "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 2:
            if len(parts) == 2:
                versions = registry.groups().get(parts[1])
                if versions is None:
                    raise _no_route()
                return self.send_json(200, group_document(parts[1], versions))
            gv, rest = parts[1] + "/" + parts[2], parts[3:]
        else:
            raise _no_route()
        if not rest:
            doc = registry.resource_list(gv)
            if doc is None:
                raise _no_route()
            return self.send_json(200, doc)
        self.resource_request(method, gv, rest, body)

    def resource_request(self, method, gv, rest, body):
        api = self.server.api
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            res = api.registry.lookup(gv, rest[2])
            if res and res.namespaced:
                namespace, rest = rest[1], rest[2:]
        res = api.registry.lookup(gv, rest[0])
        if res is None or len(rest) > 3 or (res.namespaced and namespace is None and len(rest) > 1):
            raise _no_route()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in res.subresources:
            raise _no_route()
        if name is None:
            return self.collection_request(method, res, namespace, body)
        if sub in ("log", "binding", "eviction"):
            return self.pod_subresource(method, res, namespace, name, sub, body)
        if sub == "token" and method == "POST":
            return self.send_json(201, self.server.authenticator.token_request(namespace, name, body))
        if method == "GET":
            obj = api.get(res, namespace, name)
            if self.wants_table():
                obj = table(res, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]},
                            self.query.get("includeObject", "Metadata"))
            return self.send_json(200, obj)
        if method == "PUT":
            obj, warnings = api.update(res, namespace, name, body, self.query, sub)
            return self.send_json(200, obj, _warning_headers(warnings))
        if method == "PATCH":
            obj, warnings = api.patch(res, namespace, name, self.headers.get("Content-Type"), body, self.query,
                                      sub)
            return self.send_json(200, obj, _warning_headers(warnings))
        if method == "DELETE" and sub is None:
            code, obj = api.delete(res, namespace, name, self.delete_options(body))
            return self.send_json(code, obj)
        raise method_not_allowed()

    def collection_request(self, method, res, namespace, body):
        api = self.server.api
        if method == "GET" and self.query.get("watch") in ("1", "true"):
            return self.stream_watch(res, namespace)
        if method == "GET":
            meta, items = api.list(res, namespace, self.query)
            if self.wants_table():
                return self.send_json(200, table(res, items, meta, self.query.get("includeObject", "Metadata")))
            return self.send_json(200, {"kind": res.kind + "List", "apiVersion": res.api_version,
                                        "metadata": meta, "items": items})
        if method == "POST":
            if namespace is None and res.namespaced:
                raise method_not_allowed()
            obj, warnings = api.create(res, namespace, body, self.query)
            return self.send_json(201, obj, _warning_headers(warnings))
        if method == "DELETE":
            return self.send_json(200, api.delete_collection(res, namespace, self.query, self.delete_options(body)))
        raise method_not_allowed()

    def wants_table(self):
        return "as=Table" in self.headers.get("Accept", "")

    def delete_options(self, body):
        """DeleteOptions from the body, overridden by query parameters."""
        options = dict(body) if isinstance(body, dict) else {}
        if "gracePeriodSeconds" in self.query:
            options["gracePeriodSeconds"] = int(self.query["gracePeriodSeconds"])
        if "propagationPolicy" in self.query:
            options["propagationPolicy"] = self.query["propagationPolicy"]
        if "orphanDependents" in self.query:
            options["orphanDependents"] = self.query["orphanDependents"] == "true"
        if self.query.get("dryRun") == "All":
            options["dryRun"] = ["All"]
        return options

    def stream_watch(self, res, namespace):
        watch = Watch(self.server.api, res, namespace, self.query, self.server.opts.bookmark_seconds,
                      as_table=self.wants_table())
        events = watch.events()
        self.start_chunked("application/json")
        for event in events:
            if event is None:
                if self.client_gone():
                    break
                continue
            self.send_chunk(json.dumps(event, separators=(",", ":")).encode() + b"\n")
        else:
            self.send_chunk(b"")
            return
        events.close()
        self.close_connection = True

    def pod_subresource(self, method, res, namespace, name, sub, body):
        kubelet = self.server.kubelet
        if sub == "log" and method == "GET":
            self.server.api.get(res, namespace, name)    # 404 for an unknown Pod
            if kubelet is None:
                raise ApiError(400, "BadRequest", 'pod "%s" has no running kubelet (start with --kubelet)' % name)
            return kubelet.serve_log(self, namespace, name, self.query)
        if sub == "binding" and method == "POST":
            node = ((body or {}).get("target") or {}).get("name", "")
            self.server.api.bind(namespace, name, node)
            return self.send_json(201, status_object(201, "", "", status="Success"))
        if sub == "eviction" and method == "POST":
            self.server.api.evict(namespace, name, (body or {}).get("deleteOptions") or {})
            return self.send_json(201, status_object(201, "", "", status="Success"))
        raise method_not_allowed()

    # -- admin ---------------------------------------------------------------------

    def admin(self, method, path, body):
        server, api = self.server, self.server.api
        if server.admin_hosts is not None and self.client_address[0] not in server.admin_hosts:
            raise ApiError(403, "Forbidden", "the emulator's admin endpoints answer this machine only")
        if path == "/_emulator/compact" and method == "POST":
            with api.store.cond:
                api.store.compact(end_watches=self.query.get("endWatches") in ("1", "true"))
                compacted = api.store.compacted
            return self.send_json(200, {"compactedRevision": compacted})
        if path == "/_emulator/faults":
            faults = [dict(f) for f in (body if isinstance(body, list) else [body])] if method == "POST" else []
            for fault in faults:
                try:
                    re.compile(fault.get("path_regex", ""))
                except re.error as e:
                    raise ApiError(400, "BadRequest", "path_regex: %s" % e)
            with server.lock:
                if method == "DELETE":
                    server.faults.clear()
                server.faults.extend(faults)
                pending = [dict(f) for f in server.faults]
            return self.send_json(200, {"faults": pending})
        if path == "/_emulator/requests" and method == "GET":
            since = int(self.query.get("since") or 0)
            with server.lock:
                log = [r for r in server.requests if r["seq"] > since]
                count = server.seq
            return self.send_json(200, {"count": count, "requests": log})
        if path.startswith("/_emulator/nodes") and method == "POST":
            if server.kubelet is None:
                raise ApiError(400, "BadRequest", "nodes are added by the fake kubelet: start with --kubelet")
            parts = path.split("/")
            if len(parts) == 5 and server.node_faults:
                action = "lose" if parts[4] == "notready" else parts[4]
                return self.send_json(200, server.node_faults.act(parts[3], action, body))
            if len(parts) == 5 and parts[4] == "notready":
                return self.send_json(200, server.kubelet.node_not_ready(parts[3]))
            return self.send_json(201, server.kubelet.add_node(body or {}))
        raise _no_route()


def _no_route():
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def _warning_headers(warnings):
    # One header can carry several comma-separated warnings (RFC 7234 warn-values).
    return {"Warning": ", ".join('299 - "%s"' % w.replace('"', '\\"') for w in warnings)} if warnings else {}


def _proto_string(field, text):
    data = text.encode()
    return bytes([field << 3 | 2, len(data)]) + data


# An OpenAPI v2 Document (gnostic protobuf) with only `swagger` and `info`: kubectl
# parses it, finds no model for any kind, and leaves validation to the server.
_INFO = _proto_string(1, "Kubernetes") + _proto_string(2, "v1.32.0")
OPENAPI_V2_PROTO = _proto_string(1, "2.0") + bytes([2 << 3 | 2, len(_INFO)]) + _INFO


# -- TLS and kubeconfig --------------------------------------------------------------------

def make_certificates(directory, host):
    """A throwaway CA and a server certificate for host, 127.0.0.1 and localhost,
    made with the openssl command; returns (ca.pem, server.pem, server.key)."""
    ca_key, ca_pem = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, csr, pem = (os.path.join(directory, n) for n in ("server.key", "server.csr", "server.pem"))
    ext = os.path.join(directory, "san.ext")
    alt = "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default," \
          "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" + (
        ",IP:%s" % host if re.match(r"^[\d.]+$", host) and host != "127.0.0.1" else "")
    with open(ext, "w") as f:
        f.write(alt + "\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n")
    run = lambda *args: subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_pem, "-days", "2",
        "-subj", "/CN=pliant-emulator-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=kube-apiserver")
    run("x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial", "-out", pem,
        "-days", "2", "-extfile", ext)
    return ca_pem, pem, key


def write_kubeconfig(path, url, ca_pem, token):
    cluster = ["    server: %s" % url]
    if ca_pem:
        with open(ca_pem, "rb") as f:
            cluster.append("    certificate-authority-data: %s" % base64.b64encode(f.read()).decode())
    user = "    token: %s" % token if token else "    {}"
    text = "\n".join([
        "apiVersion: v1", "kind: Config", "clusters:", "- name: emulator", "  cluster:"] + cluster + [
        "users:", "- name: emulator", "  user:", user,
        "contexts:", "- name: emulator", "  context:", "    cluster: emulator", "    user: emulator",
        "    namespace: default", "current-context: emulator", ""])
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# -- main ---------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description="Kubernetes API emulator for Pliant's tests")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--token")
    ap.add_argument("--kubelet", action="store_true", help="run the fake scheduler and kubelets")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--zones", default="zone-a,zone-b,zone-c")
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--bookmark-seconds", type=float, default=1.0)
    ap.add_argument("--history", type=int, default=2000, help="watch events kept before compaction")
    ap.add_argument("--state-log", help="append every write as a JSON line to this file")
    ap.add_argument("--work-dir", help="where Pod files and logs go (default: a temporary directory)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--authorization-mode", choices=["AlwaysAllow", "RBAC"], default="AlwaysAllow",
                    help="RBAC: rbac.py authorizes every API request")
    ap.add_argument("--enable-admission-plugins", default="",
                    help="comma-separated: " + ", ".join(admission.PLUGINS))
    ap.add_argument("--default-toleration-seconds", type=int, default=300)
    ap.add_argument("--controllers", default="",
                    help="comma-separated: " + ", ".join(CONTROLLERS) + " (or all)")
    clustermode.add_options(ap)
    opts = ap.parse_args(argv)
    opts.admission_plugins = [p for p in opts.enable_admission_plugins.split(",") if p]
    opts.controller_names = CONTROLLERS if opts.controllers == "all" else [
        c for c in opts.controllers.split(",") if c]
    for name in opts.controller_names:
        if name not in CONTROLLERS:
            ap.error("unknown controller %s" % name)
    clustermode.apply_options(opts)
    return opts


# --controllers: kube-controller-manager's controllers beyond the garbage collector
CONTROLLERS = ("endpoints", "deployments", "serviceaccounts")


def start_controllers(api, names, ca_pem, api_endpoint):
    if "serviceaccounts" in names:
        ServiceAccountController(api, ca_pem).start()
    if "endpoints" in names:
        EndpointsController(api, api_endpoint).start()
    if "deployments" in names:
        DeploymentController(api).start()


def bootstrap_rbac(api):
    """The default ClusterRoles and ClusterRoleBindings (rbac.bootstrap_policy)."""
    with api.store.cond:
        for plural, obj in rbac.bootstrap_policy():
            res = api.registry.lookup(rbac.GROUP + "/v1", plural)
            if api.store.get(res.rkey, "", obj["metadata"]["name"]) is None:
                api.create(res, None, obj)


def state_logger(path):
    out = open(path, "a", buffering=1)

    def log(ev):
        out.write(json.dumps({"rv": ev.rv, "type": ev.type, "resource": ev.rkey,
                              "namespace": ev.obj["metadata"].get("namespace", ""),
                              "name": ev.obj["metadata"]["name"], "object": ev.obj}) + "\n")
    return log


def main(argv=None):
    opts = parse_args(argv)
    work = opts.work_dir or tempfile.mkdtemp(prefix="pliant-k8s-")
    os.makedirs(work, exist_ok=True)
    store = Store(history_limit=opts.history)
    api = Api(store)
    if opts.state_log:
        store.listeners.append(state_logger(opts.state_log))
    Collector(api).start()
    authenticator = Authenticator(store, opts.token)
    authorizer = None
    if opts.authorization_mode == "RBAC":
        authorizer = rbac.Authorizer(store)
        bootstrap_rbac(api)
    if opts.admission_plugins:
        api.admission = admission.Admission(store, opts.admission_plugins, opts.default_toleration_seconds)
    kubelet = cluster = None
    if opts.cluster:
        why = clustermode.missing(opts.name)
        if why:
            print("apiserver.py --cluster: this machine cannot run it: " + why, file=sys.stderr)
            sys.exit(3)
        cluster = clustermode.Cluster(opts, api, authenticator, work)
        kubelet = cluster.kubelet
    elif opts.kubelet:
        from kubelet import Kubelet
        kubelet = Kubelet(api, work, zones=opts.zones.split(","), gpus=opts.gpus_per_node)

    def stop(signum, frame):
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)     # a second signal must not cut the clean-up short
        raise SystemExit(0)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        server = Server((opts.host, opts.port), opts, api, kubelet, authenticator, authorizer)
        server.node_faults = cluster.faults if cluster else None
        server.admin_hosts = cluster.admin_hosts if cluster else None
        scheme = "http"
        if opts.tls:
            ca_pem, pem, key = make_certificates(work, opts.host)
            server.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.tls.load_cert_chain(pem, key)
            scheme = "https"
        else:
            ca_pem = None
        url = "%s://%s:%d" % (scheme, opts.host, server.server_address[1])
        start_controllers(api, opts.controller_names, ca_pem,
                          (opts.host, server.server_address[1]) if cluster else None)
        if opts.kubeconfig:
            write_kubeconfig(opts.kubeconfig, url, ca_pem, opts.token)
        if cluster:
            cluster.start(url, ca_pem)
        if kubelet:
            kubelet.start(url, opts.nodes, opts.token, ca_pem)
        print("listening " + url, flush=True)
        server.serve_forever()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        if cluster:
            cluster.shutdown()
        elif kubelet:
            kubelet.shutdown()


if __name__ == "__main__":
    main()
