"""Authentication as kube-apiserver does it for bearer tokens.

- The static admin token (--token, kubectl's): user `kubernetes-admin` in the
  group `system:masters` (cluster-admin under RBAC).
- ServiceAccount tokens: JWTs the apiserver signs (HS256 with a key made at
  start-up; kube-apiserver uses RS256) with kube-apiserver's claims (iss, sub
  `system:serviceaccount:NS:NAME`, kubernetes.io.namespace / serviceaccount /
  pod), as the TokenRequest API (serviceaccounts/NAME/token, `kubectl create
  token`) and the kubelet's projected token issue them. A token is valid while it
  has not expired and the ServiceAccount (and the Pod it is bound to) still exists
  with the uid it names, as bound tokens are. The user is
  `system:serviceaccount:NS:NAME` in the groups system:serviceaccounts,
  system:serviceaccounts:NS and system:authenticated.
- Node tokens (the kubelets' credentials): `system:node:NAME` in system:nodes.
- No Authorization header: `system:anonymous` (system:unauthenticated) when no
  admin token is configured, else 401, as before.
"""

import base64
import collections
import hashlib
import hmac
import json
import os
import time

from errors import ApiError

User = collections.namedtuple("User", "name groups")
ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN = User("kubernetes-admin", ("system:masters", "system:authenticated"))
ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


def service_account_user(namespace, name):
    return User("system:serviceaccount:%s:%s" % (namespace, name),
                ("system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"))


def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(self, store, admin_token=None):
        self.store = store
        self.admin_token = admin_token
        self.key = os.urandom(32)

    # -- issuing -------------------------------------------------------------------

    def _sign(self, claims):
        head = _b64(json.dumps({"alg": "HS256", "kid": "pliant-emulator"}).encode())
        body = _b64(json.dumps(claims, separators=(",", ":")).encode())
        mac = hmac.new(self.key, ("%s.%s" % (head, body)).encode(), hashlib.sha256).digest()
        return "%s.%s.%s" % (head, body, _b64(mac))

    def service_account_token(self, sa, pod=None, seconds=3607 * 24):
        """A token for the ServiceAccount object sa (bound to the Pod object pod);
        returns (token, expiry as a Unix time)."""
        now = int(time.time())
        k8s = {"namespace": sa["metadata"]["namespace"],
               "serviceaccount": {"name": sa["metadata"]["name"], "uid": sa["metadata"]["uid"]}}
        if pod is not None:
            k8s["pod"] = {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        claims = {"iss": ISSUER, "aud": [ISSUER], "iat": now, "nbf": now, "exp": now + seconds,
                  "sub": "system:serviceaccount:%s:%s" % (k8s["namespace"], k8s["serviceaccount"]["name"]),
                  "kubernetes.io": k8s}
        return self._sign(claims), now + seconds

    def node_token(self, node):
        return self._sign({"iss": ISSUER, "sub": "system:node:" + node, "iat": int(time.time())})

    def token_request(self, namespace, name, body):
        """serviceaccounts/NAME/token: an authentication.k8s.io/v1 TokenRequest with the token."""
        with self.store.cond:
            sa = self.store.get("serviceaccounts", namespace, name)
            if sa is None:
                raise ApiError(404, "NotFound", 'serviceaccounts "%s" not found' % name,
                               {"name": name, "kind": "serviceaccounts"})
            spec = dict((body or {}).get("spec") or {})
            seconds = int(spec.get("expirationSeconds") or 3600)
            if seconds < 600:
                raise ApiError(422, "Invalid", 'TokenRequest.authentication.k8s.io "%s" is invalid: '
                               "spec.expirationSeconds: Invalid value: %d: may not specify a duration less than "
                               "10 minutes" % (name, seconds))
            token, expiry = self.service_account_token(sa, seconds=seconds)
        spec.update(expirationSeconds=seconds, audiences=spec.get("audiences") or [ISSUER])
        return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None}, "spec": spec,
                "status": {"token": token, "expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                time.gmtime(expiry))}}

    # -- checking ------------------------------------------------------------------

    def authenticate(self, header):
        """The User of an Authorization header value; ApiError 401 when the token is
        not valid (or missing where a token is required)."""
        if not header:
            if self.admin_token:
                raise _unauthorized()
            return ANONYMOUS
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if self.admin_token and hmac.compare_digest(token, self.admin_token):
            return ADMIN
        user = self._verify(token)
        if user is None:
            raise _unauthorized()
        return user

    def _verify(self, token):
        parts = token.split(".")
        if len(parts) != 3:
            return None
        mac = hmac.new(self.key, ("%s.%s" % (parts[0], parts[1])).encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(_unb64(parts[2]), mac):
                return None
            claims = json.loads(_unb64(parts[1]))
        except ValueError:
            return None
        if claims.get("exp") and claims["exp"] < time.time():
            return None
        sub = claims.get("sub", "")
        if sub.startswith("system:node:"):
            return User(sub, ("system:nodes", "system:authenticated"))
        k8s = claims.get("kubernetes.io") or {}
        with self.store.cond:
            sa = self.store.get("serviceaccounts", k8s.get("namespace"), k8s.get("serviceaccount", {}).get("name"))
            if sa is None or sa["metadata"]["uid"] != k8s["serviceaccount"].get("uid"):
                return None
            if "pod" in k8s:
                pod = self.store.get("pods", k8s["namespace"], k8s["pod"]["name"])
                if pod is None or pod["metadata"]["uid"] != k8s["pod"]["uid"]:
                    return None
        return service_account_user(k8s["namespace"], k8s["serviceaccount"]["name"])


def _unauthorized():
    return ApiError(401, "Unauthorized", "Unauthorized")
