"""A small client of the Kubernetes API for the tests and cluster.py (standard
library only): JSON requests over one keep-alive connection per thread (TLS with
the cluster's CA and a bearer token where given), kubectl against a kubeconfig,
and the emulator's admin endpoints. Errors are E2EFailure."""

import http.client
import json
import os
import ssl
import subprocess
import threading
import urllib.parse


class E2EFailure(Exception):
    """Raised by the helpers; the test file maps it to its harness' Failure."""


def fail(msg, *args):
    raise E2EFailure(msg % args if args else msg)


class ApiClient:
    def __init__(self, url, token=None, cafile=None, kubeconfig=None, kubectl="kubectl", workdir=None):
        self.url, self.token = url, token
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.ssl = ssl.create_default_context(cafile=cafile) if cafile else None
        self.kubeconfig, self.kubectl_bin, self.dir = kubeconfig, kubectl, workdir
        self._local = threading.local()

    def alive(self):
        return True

    # -- HTTP

    def connection(self, timeout=20):
        if self.ssl:
            return http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, content_type="application/json", timeout=20):
        """(HTTP status, decoded JSON body or None), over a keep-alive connection of
        this thread (a TLS handshake per request would cost the 2 cores the job needs)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"User-Agent": "pliant-e2e-test", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.connection(timeout)
            try:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    self._local.conn = None
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        try:
            return resp.status, (json.loads(raw) if raw.strip() else None)
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    def ok(self, method, path, body=None, **kw):
        code, obj = self.request(method, path, body, **kw)
        if not 200 <= code < 300:
            fail("%s %s: %d %s", method, path, code, json.dumps(obj)[:400])
        return obj

    def get(self, path):
        """The object, or None on 404."""
        code, obj = self.request("GET", path)
        if code == 404:
            return None
        if code != 200:
            fail("GET %s: %d %s", path, code, json.dumps(obj)[:400])
        return obj

    def text(self, path, timeout=10):
        """GET returning text (pods/NAME/log); '' on errors."""
        try:
            conn = self.connection(timeout)
            conn.request("GET", path, headers={"Authorization": "Bearer " + self.token} if self.token else {})
            resp = conn.getresponse()
            data = resp.read().decode(errors="replace")
            conn.close()
            return data if resp.status == 200 else ""
        except (OSError, http.client.HTTPException):
            return ""

    # -- kubectl

    def kubectl(self, *args, stdin=None, timeout=60):
        """(exit status, stdout + stderr)."""
        cmd = [self.kubectl_bin, "--kubeconfig", self.kubeconfig, "--cache-dir", os.path.join(self.dir or "/tmp",
                                                                                               "kcache")]
        try:
            p = subprocess.run(cmd + [str(a) for a in args], input=stdin.encode() if isinstance(stdin, str) else stdin,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        except subprocess.TimeoutExpired:
            fail("kubectl %s: no answer in %d s", " ".join(map(str, args)), timeout)
        return p.returncode, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")

    def kubectl_ok(self, *args, **kw):
        rc, out = self.kubectl(*args, **kw)
        if rc != 0:
            fail("kubectl %s: exit %d:\n%s", " ".join(map(str, args)), rc, out[-1500:])
        return out
