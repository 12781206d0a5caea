"""The shape of every controller here (kube-controller-manager's loops): a thread
that calls sync() under the store's lock after every change to the store (the
informers' events) and, with `resync`, after that many seconds without one."""

import threading


class Controller(threading.Thread):
    resync = None       # seconds between syncs when nothing changes (None: only on changes)

    def __init__(self, api, name):
        super().__init__(name=name, daemon=True)
        self.api, self.store = api, api.store

    def run(self):
        self.store.run_on_changes(self.sync, every=self.resync)

    def sync(self):
        raise NotImplementedError
