"""The kubelet's container probes, in the namespaced cluster: the first
container's readinessProbe and livenessProbe (httpGet with path, port (a number
or a container port's name), scheme and httpHeaders; tcpSocket), with
initialDelaySeconds, periodSeconds, timeoutSeconds, successThreshold and
failureThreshold (Kubernetes' defaults: 0, 10, 1, 1, 3). Connections leave from
the Pod's node (the runtime makes the socket there), as the kubelet's do.

Readiness: the Pod's Ready condition follows it (Runner.set_ready); without a
readinessProbe a running container is ready. Liveness: after failureThreshold
failures the container is killed and restarted by its restartPolicy. exec and
grpc probes are not run (they count as succeeding).
"""

import ssl
import threading
import time


def _port(container, port):
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p["containerPort"]
    raise ValueError("no container port named %s" % port)


def probe_once(make_socket, address, container, probe):
    """True when the probe succeeds against address (the Pod's IP)."""
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "httpGet" in probe:
            spec = probe["httpGet"]
            sock = make_socket()
            sock.settimeout(timeout)
            port = _port(container, spec.get("port"))
            sock.connect((spec.get("host") or address, port))
            if spec.get("scheme", "HTTP").upper() == "HTTPS":
                context = ssl.create_default_context()
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                sock = context.wrap_socket(sock)
            headers = "".join("%s: %s\r\n" % (h["name"], h["value"]) for h in spec.get("httpHeaders") or [])
            with sock:
                sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: kube-probe/1.32\r\nAccept: */*\r\n"
                              "%sConnection: close\r\n\r\n" % (spec.get("path", "/"), address, port, headers))
                             .encode())
                status = sock.makefile("rb").readline().split()
            return len(status) >= 2 and 200 <= int(status[1]) < 400
        if "tcpSocket" in probe:
            with make_socket() as sock:
                sock.settimeout(timeout)
                sock.connect((probe["tcpSocket"].get("host") or address, _port(container, probe["tcpSocket"]["port"])))
            return True
        return True
    except (OSError, ValueError):
        return False


class Prober:
    """Runs one container's probes until stop() (its process ended)."""

    def __init__(self, runner, proc):
        self.runner, self.proc = runner, proc
        self.container = runner.pod["spec"]["containers"][0]
        self.stopped = threading.Event()
        self.threads = []
        for kind in ("readinessProbe", "livenessProbe"):
            probe = self.container.get(kind)
            if probe:
                t = threading.Thread(target=self._loop, args=(kind, probe), daemon=True,
                                     name="%s-%s" % (kind, runner.name))
                t.start()
                self.threads.append(t)
        if not self.container.get("readinessProbe"):
            runner.set_ready(True)

    def stop(self):
        self.stopped.set()
        self.runner.ready = False

    def _loop(self, kind, probe):
        if self.stopped.wait(probe.get("initialDelaySeconds", 0)):
            return
        period = probe.get("periodSeconds", 10)
        successes = failures = 0
        verdict = None
        while not self.stopped.is_set() and self.proc.poll() is None:
            started = time.monotonic()
            ok = probe_once(lambda: self.runner.runtime.socket(self.runner), self.runner.ip, self.container, probe)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if kind == "readinessProbe":
                if successes >= probe.get("successThreshold", 1) and verdict is not True:
                    verdict = True
                    self.runner.set_ready(True)
                elif failures >= probe.get("failureThreshold", 3) and verdict is not False:
                    verdict = False
                    self.runner.set_ready(False)
            elif failures >= probe.get("failureThreshold", 3):
                self.runner.liveness_failed()
                return
            self.stopped.wait(max(0.0, period - (time.monotonic() - started)))
