"""Watch streams: the events after a resourceVersion, filtered like a list, with
bookmarks, and ended by an ERROR event (410 Expired) when the history they need
has been compacted away, as the real apiserver does."""

import random
import time

from errors import bad_request, status_object
from registry import table
from store import Gone


class Watch:
    """One watch request. `events()` yields event dicts (None while idle, so the
    caller can notice a closed connection); it returns at the timeout or after an
    ERROR event."""

    def __init__(self, api, res, namespace, query, bookmark_seconds, as_table=False):
        self.api, self.res, self.namespace = api, res, namespace
        self.store = api.store
        self.match = api.selector(res, namespace, query)
        self.rv = query.get("resourceVersion") or ""
        if not self.rv.isdigit() and self.rv != "":
            raise bad_request("invalid resourceVersion %r" % self.rv)
        self.bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        self.bookmark_seconds = bookmark_seconds
        self.as_table = as_table
        timeout = int(query.get("timeoutSeconds") or 0)
        # Without timeoutSeconds a real server ends a watch after 30-60 minutes.
        self.deadline = time.monotonic() + (timeout if timeout > 0 else random.uniform(1800, 3600))

    def events(self):
        with self.store.cond:
            epoch = self.store.watch_epoch
            if self.rv in ("", "0"):
                cursor = self.store.rv
                initial = [self._event("ADDED", o) for o in self.store.items(self.res.rkey) if self.match(o)]
            else:
                cursor, initial = int(self.rv), []
        yield from initial
        next_bookmark = time.monotonic() + self.bookmark_seconds
        while True:
            kind, value, cursor = self._poll(cursor, epoch, next_bookmark)
            if kind == "end":
                return
            if kind == "error":
                yield self._error(value)
                return
            if kind == "events":
                yield from value
                continue
            if kind == "bookmark":
                next_bookmark = time.monotonic() + self.bookmark_seconds
            yield value                 # a bookmark, or None when idle

    def _poll(self, cursor, epoch, next_bookmark):
        """Under the lock (never held across a yield): ("events", [event], cursor),
        ("bookmark", event, cursor), ("idle", None, cursor) after a wait, ("error",
        message, cursor) or ("end", None, cursor)."""
        with self.store.cond:
            try:
                if epoch != self.store.watch_epoch:
                    raise Gone("the watch was ended by a forced compaction")
                batch = self.store.events_after(cursor)
            except Gone as e:
                return "error", str(e), cursor
            if batch:
                return "events", [e for e in map(self._translate, batch) if e], batch[-1].rv
            now = time.monotonic()
            if now >= self.deadline:
                return "end", None, cursor
            if self.bookmarks and now >= next_bookmark:
                return "bookmark", self._bookmark(self.store.rv), self.store.rv
            wake = min(self.deadline, next_bookmark if self.bookmarks else now + 5)
            self.store.cond.wait(max(0.0, wake - now))
            return "idle", None, cursor

    def _translate(self, ev):
        """The event as this watch's selectors see it: an object that stops matching
        is DELETED for the watcher, one that starts matching is ADDED."""
        if ev.rkey != self.res.rkey:
            return None
        was = ev.prev is not None and ev.type != "ADDED" and self.match(ev.prev)
        now = ev.type != "DELETED" and self.match(ev.obj)
        if ev.type == "DELETED":
            return self._event("DELETED", ev.obj) if was else None
        if was and now:
            return self._event(ev.type, ev.obj)
        if now:
            return self._event("ADDED", ev.obj)
        return self._event("DELETED", ev.obj) if was else None

    def _event(self, kind, obj):
        obj = self.api.out(self.res, obj)
        if self.as_table:
            obj = table(self.res, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]})
        return {"type": kind, "object": obj}

    def _bookmark(self, rv):
        return {"type": "BOOKMARK", "object": {"kind": self.res.kind, "apiVersion": self.res.api_version,
                                               "metadata": {"resourceVersion": str(rv)}}}

    def _error(self, message):
        return {"type": "ERROR", "object": status_object(410, "Expired", message)}
