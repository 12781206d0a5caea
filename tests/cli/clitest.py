"""The harness shared by the command-line tests (standard library only).

A test file defines functions decorated with @suite.test and ends with
`sys.exit(suite.main())`. Each test prints "ok NAME", "FAIL NAME" (after
indented detail lines) or "skip NAME: why" (missing inputs, or a test raising
Skip), as tests/run_tests.py expects;
main() exits 1 if any test failed. Tests get `suite.pliant` (the binary),
`suite.tmp` (a temporary directory for the run) and `suite.repo`; functions
given to `suite.at_end(fn)` run after the tests, before that directory goes
(processes that write there are stopped by them).
"""

import argparse
import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# PLIANT_SHAKESPEARE: another copy (a GPU machine gets the repository without ../shared)
SHAKESPEARE = os.environ.get("PLIANT_SHAKESPEARE") or os.path.join(
    os.path.dirname(REPO), "shared", "data", "tinyshakespeare.txt")


class Failure(Exception):
    pass


class Skip(Exception):
    """Raised by a test that cannot run here (the reason is printed)."""


SIM_JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: simjob
spec:
  model: {{layers: 4, channels: 64, heads: 2, vocabSize: 256, maxSeqLen: 64}}
  data: {{train: /nowhere/x_*.bin}}
  batch: {{global: {global_}, micro: {micro}, seqLen: 32}}
  steps: 100
  checkpoint: {{dir: /nowhere/ckpt, every: 10}}
  faultTolerance: {{tolerate: 1, maxResets: 0}}
  cost: {{spot: 2.0, onDemand: 5.0}}
  profile: {profile}
"""


def sim_job(micro, profile):
    """A small job for pliant simulate (its data is never read): 16 microbatches of `micro`
    a step, planned from the profile file `profile`."""
    return SIM_JOB.format(global_=16 * micro, micro=micro, profile=profile)


def check(cond, msg, *args):
    if not cond:
        raise Failure(msg % args if args else msg)


class Suite:
    def __init__(self, prefix, needs=()):
        self.prefix = prefix
        self.needs = needs  # files without which every test is skipped (e.g. ../shared data)
        self.tests = []
        self.pliant = None
        self.tmp = None
        self.repo = REPO
        self.build = None
        self.cleanups = []

    def test(self, fn):
        self.tests.append(fn)
        return fn

    def at_end(self, fn):
        """fn() after the tests, inside the temporary directory's lifetime."""
        self.cleanups.append(fn)
        return fn

    def run(self, *args, timeout=300):
        """Runs `pliant ARGS` from the repository root: (status, stdout, stderr)."""
        p = subprocess.run([self.pliant] + [str(a) for a in args], cwd=REPO,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def shakespeare_shards(self, nbytes):
        """Byte shards PREFIX_train.bin / PREFIX_val.bin of the first nbytes of Tiny
        Shakespeare in the run's temporary directory (made once); returns PREFIX."""
        prefix = os.path.join(self.tmp, "ts")
        if not os.path.exists(prefix + "_train.bin"):
            text = os.path.join(self.tmp, "ts.txt")
            with open(SHAKESPEARE, "rb") as src, open(text, "wb") as dst:
                dst.write(src.read(nbytes))
            rc, out, err = self.run("tokenize", "--bytes", text, prefix)
            check(rc == 0, "tokenize failed: %s", err)
        return prefix

    def main(self):
        ap = argparse.ArgumentParser()
        ap.add_argument("--build", default="build")
        ap.add_argument("-k", "--filter", default="")
        args = ap.parse_args()
        build = self.build = args.build if os.path.isabs(args.build) else os.path.join(REPO, args.build)
        self.pliant = os.path.join(build, "bin", "pliant")
        tests = [t for t in self.tests if args.filter in t.__name__]
        missing = [p for p in self.needs if not os.path.exists(p)]
        why = ("build/bin/pliant not built" if not os.access(self.pliant, os.X_OK) else
               "%s not found (shared/ must sit beside the checkout)" % missing[0] if missing else None)
        if why:
            for t in tests:
                print("skip %s.%s: %s" % (self.prefix, t.__name__, why))
            return 0
        failures = 0
        with tempfile.TemporaryDirectory(prefix="pliant-%s-" % self.prefix) as tmp:
            self.tmp = tmp
            for t in tests:
                name = "%s.%s" % (self.prefix, t.__name__)
                try:
                    t()
                    print("ok " + name)
                except Skip as e:
                    print("skip %s: %s" % (name, e))
                except Failure as e:
                    failures += 1
                    for line in str(e).splitlines():
                        print("    " + line)
                    print("FAIL " + name)
                except Exception as e:  # a bug in the command's output shape, or in the test
                    failures += 1
                    print("    %s: %s" % (type(e).__name__, e))
                    print("FAIL " + name)
                sys.stdout.flush()
            for fn in self.cleanups:
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 -- the other clean-ups must run
                    print("# clean-up %s: %s: %s" % (fn.__name__, type(e).__name__, e))
        return 1 if failures else 0


def websocket_upgrade(sock, port, path, protocol=None):
    """The client's side of a WebSocket upgrade (RFC 6455) on a connected socket."""
    key = base64.b64encode(os.urandom(16)).decode()
    req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
           % (path, port, key))
    if protocol:
        req += "Sec-WebSocket-Protocol: %s\r\n" % protocol
    sock.sendall((req + "\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        check(chunk, "connection closed during the upgrade")
        head += chunk
    check(head.startswith(b"HTTP/1.1 101"), "upgrade refused: %r", head[:200])


class WS:
    """A WebSocket client (RFC 6455, masked frames; fragmented messages reassembled) on
    plain TCP: the dashboard's feed, or chromium's DevTools."""

    def __init__(self, port, path, protocol=None, timeout=30, sock=None):
        self.s = sock or socket.create_connection(("127.0.0.1", port), timeout=timeout)
        websocket_upgrade(self.s, port, path, protocol)

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.s.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def frame(self):
        """(fin, opcode, payload) of the next frame; EOFError once closed."""
        h = self._read(2)
        n = h[1] & 0x7F
        if n == 126:
            n = int.from_bytes(self._read(2), "big")
        elif n == 127:
            n = int.from_bytes(self._read(8), "big")
        return bool(h[0] & 0x80), h[0] & 0x0F, self._read(n)

    def send(self, text, opcode=1, declared=None):
        """One masked final frame; declared: a length to announce instead of the real one."""
        payload = text.encode() if isinstance(text, str) else text
        n = len(payload) if declared is None else declared
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.s.sendall(head + mask + body)

    def recv(self):
        """The next text message (str), or None once closed."""
        parts = []
        try:
            while True:
                fin, op, payload = self.frame()
                if op == 8:
                    return None
                if op in (1, 0):
                    parts.append(payload)
                    if fin:
                        return b"".join(parts).decode()
        except (OSError, EOFError):
            return None

    def close(self):
        self.s.close()


def read_feed(ws, into, until=("done", "failed")):
    """Messages into `into` until a phase event in `until` (or the end)."""
    while True:
        text = ws.recv()
        if text is None:
            return
        m = json.loads(text)
        into.append(m)
        evs = m["events"] if m["type"] == "history" else [m]
        if any(e["type"] == "phase" and e["phase"] in until for e in evs):
            return


def flatten(msgs):
    """A page's messages as the events in order: the history's, then the live ones."""
    check(msgs and msgs[0]["type"] == "history", "first message: %s", msgs[:1])
    check(all(m["type"] != "history" for m in msgs[1:]), "a second history message")
    return msgs[0]["events"] + msgs[1:]


class WebSocket(WS):
    """A minimal client of the control channel (TLS), for sending what a real worker
    never would."""

    def __init__(self, port, ca):
        ctx = ssl.create_default_context(cafile=ca)
        ctx.check_hostname = False
        sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10))
        super().__init__(port, "/control", "pliant.v1", sock=sock)

    def send(self, payload, declared=None):
        """One masked text frame; declared: a length to announce instead of the real one."""
        try:
            super().send(payload, 1, declared)
        except OSError:
            pass  # the server may close before reading it all

    def recv(self):
        """(opcode, payload), or None once the connection is closed."""
        try:
            _, op, payload = self.frame()
            return op, payload
        except (OSError, EOFError):
            return None

    def closed_after(self):
        """Reads until the connection ends: the text messages received on the way."""
        texts = []
        while True:
            f = self.recv()
            if f is None or f[0] == 8:
                return texts
            if f[0] == 1:
                texts.append(json.loads(f[1]))
