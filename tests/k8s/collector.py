"""The garbage collector and namespace controller, one thread woken by every
write: dependents whose owners (ownerReferences, by uid) are all gone are
deleted in the background, dangling references to some gone owners are removed,
Foreground deletions wait for their dependents, and a deleted Namespace is
emptied before it disappears."""

from controller import Controller


class Collector(Controller):
    def __init__(self, api):
        super().__init__(api, "collector")

    def sync(self):
        for rkey in list(self.store.objects):
            res = self.api.storage_resource(rkey)
            for obj in self.store.items(rkey):
                meta = obj["metadata"]
                if meta.get("ownerReferences") and not meta.get("deletionTimestamp"):
                    self._check_owners(res, obj)
                if meta.get("deletionTimestamp") and "foregroundDeletion" in meta.get("finalizers", []):
                    self._foreground(res, obj)
        for ns in self.store.items("namespaces"):
            if ns["metadata"].get("deletionTimestamp"):
                self._empty_namespace(ns)

    def _check_owners(self, res, obj):
        refs = obj["metadata"]["ownerReferences"]
        alive = [r for r in refs if r.get("uid") in self.store.uids]
        meta = obj["metadata"]
        if not alive:
            self.api.delete(res, meta.get("namespace"), meta["name"], {"propagationPolicy": "Background"})
        elif len(alive) < len(refs):
            self.api.mutate(res, meta.get("namespace"), meta["name"],
                            lambda o: o["metadata"].__setitem__("ownerReferences", alive))

    def _foreground(self, res, owner):
        dependents = self.api.dependents(owner["metadata"]["uid"])
        for dep_res, dep in dependents:
            if not dep["metadata"].get("deletionTimestamp"):
                self.api.delete(dep_res, dep["metadata"].get("namespace"), dep["metadata"]["name"], {})
        if not dependents:
            meta = owner["metadata"]
            self.api.mutate(res, meta.get("namespace"), meta["name"], lambda o: o["metadata"].__setitem__(
                "finalizers", [f for f in o["metadata"]["finalizers"] if f != "foregroundDeletion"]))

    def _empty_namespace(self, ns):
        name = ns["metadata"]["name"]
        left = 0
        for rkey in list(self.store.objects):
            res = self.api.storage_resource(rkey)
            if not res or not res.namespaced:
                continue
            for obj in self.store.items(rkey, name):
                left += 1
                if not obj["metadata"].get("deletionTimestamp"):
                    self.api.delete(res, name, obj["metadata"]["name"], {})
        if not left:
            self.api.remove_now(self.api.ns_res, ns)
