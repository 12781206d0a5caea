"""The emulator's object store: etcd plus the apiserver's watch cache, in memory.

Every write takes the next value of one global revision counter, which becomes
the object's metadata.resourceVersion, and appends an event to a bounded history.
Watches and list continuations read that history; a resourceVersion older than
the oldest event kept ("the compaction point") is gone (410), as in etcd.

All access goes through `store.cond` (a Condition around one lock): callers hold
it while they read or write, and every write wakes the waiters (watches, the
garbage collector, the fake kubelet). Stored objects are never mutated in place;
writers store a fresh dict, so a reference taken under the lock stays valid.
"""

import collections
import threading

Event = collections.namedtuple("Event", "rv type rkey obj prev")


class Gone(Exception):
    """The requested resourceVersion has been compacted away."""


class Store:
    def __init__(self, history_limit=2000):
        self.cond = threading.Condition()
        self.rv = 1
        self.objects = {}                 # rkey -> {(namespace, name): object}
        self.uids = {}                    # uid -> (rkey, namespace, name)
        self.history = collections.deque()
        self.history_limit = history_limit
        self.compacted = 1                # events with rv > compacted are kept
        self.watch_epoch = 0              # bumped to end every open watch with 410
        self.listeners = []               # called with each Event, under the lock

    def run_on_changes(self, fn, every=None):
        """Calls fn() (under the lock) now and after every change to the store, forever:
        the body of a controller thread (the kubelet, the garbage collector); with
        `every`, also after that many seconds without a change (a resync)."""
        seen = None
        with self.cond:
            while True:
                if self.rv == seen:
                    self.cond.wait(every)
                    if self.rv == seen and every is None:
                        continue
                seen = self.rv
                fn()

    # -- reads (caller holds cond) -------------------------------------------------

    def get(self, rkey, namespace, name):
        return self.objects.get(rkey, {}).get((namespace or "", name))

    def items(self, rkey, namespace=None):
        """The objects of one resource in key order (namespace, name), as etcd lists them."""
        table = self.objects.get(rkey, {})
        keys = sorted(k for k in table if namespace is None or k[0] == namespace)
        return [table[k] for k in keys]

    def events_after(self, rv):
        """Events with resourceVersion > rv, oldest first; Gone when some were compacted."""
        if rv < self.compacted:
            raise Gone("too old resource version: %d (%d)" % (rv, self.compacted))
        newer = []
        for ev in reversed(self.history):
            if ev.rv <= rv:
                break
            newer.append(ev)
        newer.reverse()
        return newer

    def snapshot(self, rkey, rv):
        """One resource's objects as they were at revision rv (for list continuations)."""
        table = dict(self.objects.get(rkey, {}))
        for ev in reversed(self.events_after(rv)):
            if ev.rkey != rkey:
                continue
            key = _key(ev.obj)
            if ev.type == "ADDED":
                table.pop(key, None)
            else:
                table[key] = ev.prev
        return [table[k] for k in sorted(table)]

    # -- writes (caller holds cond) ------------------------------------------------

    def put(self, rkey, obj):
        """Stores obj (new or replacing), stamping the next resourceVersion."""
        key = _key(obj)
        prev = self.objects.get(rkey, {}).get(key)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects.setdefault(rkey, {})[key] = obj
        self.uids[obj["metadata"]["uid"]] = (rkey,) + key
        self._record(Event(self.rv, "MODIFIED" if prev else "ADDED", rkey, obj, prev))
        return obj

    def remove(self, rkey, obj):
        """Deletes obj; the DELETED event carries the revision of the deletion."""
        key = _key(obj)
        prev = self.objects[rkey].pop(key)
        self.uids.pop(prev["metadata"]["uid"], None)
        self.rv += 1
        gone = dict(prev, metadata=dict(prev["metadata"], resourceVersion=str(self.rv)))
        self._record(Event(self.rv, "DELETED", rkey, gone, prev))
        return gone

    def drop_resource(self, rkey):
        """Forgets a resource's table once it is empty (a deleted CRD)."""
        if not self.objects.get(rkey):
            self.objects.pop(rkey, None)

    def compact(self, end_watches=False):
        """Drops all history, as `etcdctl compact` at the current revision would."""
        self.history.clear()
        self.compacted = self.rv
        if end_watches:
            self.watch_epoch += 1
        self.cond.notify_all()

    def _record(self, ev):
        self.history.append(ev)
        while len(self.history) > self.history_limit:
            self.compacted = self.history.popleft().rv
        for listener in self.listeners:
            listener(ev)
        self.cond.notify_all()


def _key(obj):
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])
