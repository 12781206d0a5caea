"""The ServiceAccount and root-CA publisher controllers (kube-controller-manager):
every active Namespace gets the ServiceAccount `default` and the ConfigMap
`kube-root-ca.crt` (data ca.crt: the cluster's CA, when it has one). Tokens are
not Secrets: auth.py issues them (TokenRequest, the kubelet's projected token)."""

from controller import Controller


class ServiceAccountController(Controller):
    def __init__(self, api, ca_pem=None):
        super().__init__(api, "serviceaccounts")
        self.sa_res = api.registry.lookup("v1", "serviceaccounts")
        self.cm_res = api.registry.lookup("v1", "configmaps")
        self.ca = None
        if ca_pem:
            with open(ca_pem) as f:
                self.ca = f.read()

    def sync(self):
        for ns in self.store.items("namespaces"):
            name = ns["metadata"]["name"]
            if ns["metadata"].get("deletionTimestamp"):
                continue
            if self.store.get("serviceaccounts", name, "default") is None:
                self.api.create(self.sa_res, name, {"metadata": {"name": "default"}})
            if self.ca and self.store.get("configmaps", name, "kube-root-ca.crt") is None:
                self.api.create(self.cm_res, name, {"metadata": {"name": "kube-root-ca.crt", "annotations": {
                    "kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver "
                                                 "when using internal endpoints such as the internal service IP or "
                                                 "kubernetes.default.svc. No other usage is guaranteed across "
                                                 "distributions of Kubernetes clusters."}},
                                                   "data": {"ca.crt": self.ca}})
