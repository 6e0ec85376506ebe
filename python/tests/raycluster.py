"""A real two-node Ray cluster on one machine, for tests and benchmarks.

Each Ray node runs in a network namespace of its own (``ip netns``), with
its own host name (``unshare --uts``), joined to the other by a bridge with
routable addresses (10.x.y.1 head, .2 worker), so a runtime that listens on
loopback is unreachable from the other node, exactly as between machines.
Both nodes start with the default configuration (``ray start``; tensorlane's
only settings are where the library and the package are).

The driver runs in the head's namespace too (Ray wants a driver on one of
its nodes), as a child process serving calls: :meth:`Cluster.call` sends it a
function (by reference: it must be importable there, e.g. a module-level
function of the test module) and returns the function's result or raises its
exception. Actor classes defined in the test module reach the workers the
same way (PYTHONPATH holds the tests directory).

Every process the cluster starts joins a pids cgroup made for it before
``ip netns exec`` (which remounts /sys and hides /sys/fs/cgroup), so
:meth:`Cluster.close` ends exactly those processes and no other Ray on the
machine (never ``ray stop --force``). Namespaces, bridge and veths are named
after :data:`PREFIX` and this process's id, and removed on close.

Use::

    @pytest.fixture(scope="module")
    def cluster():
        with raycluster.start() as c:   # skips when not root or no ip/unshare
            yield c

Needs root, iproute2 (ip, and tc for :meth:`Cluster.shape`), util-linux
(unshare) and a pids cgroup (v1 ``/sys/fs/cgroup/pids`` or v2).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

#: Names of namespaces, links and cgroups start with this.
PREFIX = os.environ.get("RAYCLUSTER_PREFIX", "raynodes")

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


#: A custom resource each node has 1000 of: ``.options(resources={RESOURCE
#: % "worker": 1})`` places an actor or task on that node.
RESOURCE = "raycluster_%s"


class ClusterError(RuntimeError):
    """The cluster did not come up, or the driver broke; the message holds
    the tail of the failing process's output."""


def why_unavailable() -> Optional[str]:
    """None when this machine can host the cluster, else the reason."""
    if sys.platform != "linux":
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root (ip netns, a bridge, unshare --uts)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} on PATH"
    if _cgroup_root() is None:
        return "needs a pids cgroup (cgroup v1 /sys/fs/cgroup/pids or v2 /sys/fs/cgroup)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "needs ray"
    return None


def _cgroup_root() -> Optional[str]:
    if os.path.isdir("/sys/fs/cgroup/pids") and os.access("/sys/fs/cgroup/pids", os.W_OK):
        return "/sys/fs/cgroup/pids"
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and os.access("/sys/fs/cgroup", os.W_OK):
        return "/sys/fs/cgroup"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


@dataclass
class Node:
    """One Ray node: its namespace, address and host name."""

    name: str
    netns: str
    ip: str
    hostname: str
    veth: str
    proc: Optional[subprocess.Popen] = None
    log: str = ""


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Cluster:
    """A head and a worker node in two network namespaces, and a driver."""

    tag: str
    subnet: str
    bridge: str
    cgroup: str
    tmp: str
    env: Dict[str, str]
    head: Node = field(init=False)
    worker: Node = field(init=False)
    _driver: Optional[subprocess.Popen] = None
    _to: Any = None
    _from: Any = None
    _closed: bool = False

    # Lifecycle

    def _setup_network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        for n in (self.head, self.worker):
            _run("ip", "netns", "add", n.netns)
            _run("ip", "link", "add", n.veth, "type", "veth", "peer", "name", n.veth + "p")
            _run("ip", "link", "set", n.veth, "master", self.bridge)
            _run("ip", "link", "set", n.veth, "up")
            _run("ip", "link", "set", n.veth + "p", "netns", n.netns)
            ns = ("ip", "netns", "exec", n.netns)
            _run(*ns, "ip", "link", "set", n.veth + "p", "name", "eth0")
            _run(*ns, "ip", "addr", "add", f"{n.ip}/24", "dev", "eth0")
            _run(*ns, "ip", "link", "set", "eth0", "up")
            _run(*ns, "ip", "link", "set", "lo", "up")

    def _launch(self, node: Node, argv: List[str], log: str, group: str = "", **kw: Any) -> subprocess.Popen:
        """argv in node's namespace and UTS namespace, as a member of the
        cgroup ``group`` (default: the node's) of the cluster's, joined
        before ip netns exec hides the cgroup fs."""
        cg = os.path.join(self.cgroup, group or node.name)
        os.makedirs(cg, exist_ok=True)
        script = (f'echo $$ > {cg}/cgroup.procs && exec ip netns exec {node.netns} '
                  f'unshare --uts sh -c \'hostname {node.hostname} && exec "$0" "$@"\' "$@"')
        f = open(log, "ab")
        try:
            return subprocess.Popen(["sh", "-c", script, "sh", *argv], env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kw)
        finally:
            f.close()

    def _start_nodes(self, num_cpus: int, object_store: int) -> None:
        # Ray's CLI through this interpreter, not the venv's ``ray`` script:
        # a copied venv's scripts keep the original's interpreter in their
        # #! line, and the nodes' workers would run that one (without this
        # venv's packages, e.g. torch for GLOO/NIXL).
        ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
        common = ["--num-cpus", str(num_cpus), "--object-store-memory", str(object_store),
                  "--resources", '{"%s": 1000}' % (RESOURCE % "{name}"),
                  "--disable-usage-stats", "--block"]
        h = self.head
        h.log = os.path.join(self.tmp, "head.log")
        h.proc = self._launch(h, [*ray_cli, "start", "--head", "--node-ip-address", h.ip, "--port", "6379",
                                  "--include-dashboard", "false", "--temp-dir", os.path.join(self.tmp, "ray"), *_named(common, h)], h.log)
        self._wait_port(h, 6379, 60)
        w = self.worker
        w.log = os.path.join(self.tmp, "worker.log")
        self._worker_argv = [*ray_cli, "start", "--address", f"{h.ip}:6379", "--node-ip-address", w.ip,
                             "--temp-dir", os.path.join(self.tmp, "ray"), *_named(common, w)]
        w.proc = self._launch(w, self._worker_argv, w.log)

    def _wait_port(self, node: Node, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        probe = ["ip", "netns", "exec", node.netns, sys.executable, "-c",
                 f"import socket; socket.create_connection(('{node.ip}', {port}), 1).close()"]
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                raise ClusterError(f"{node.name} exited ({node.proc.returncode}):\n{_tail(node.log)}")
            if subprocess.run(probe, capture_output=True, timeout=10).returncode == 0:
                return
            time.sleep(0.5)
        raise ClusterError(f"{node.name}: port {port} not up after {timeout:.0f} s:\n{_tail(node.log)}")

    def _start_driver(self) -> None:
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        log = os.path.join(self.tmp, "driver.log")
        argv = [sys.executable, os.path.abspath(__file__), "--serve", str(to_r), str(from_w),
                f"{self.head.ip}:6379", self.head.ip]
        self._driver = self._launch(self.head, argv, log, group="driver", pass_fds=(to_r, from_w))
        os.close(to_r)
        os.close(from_w)
        self._to = os.fdopen(to_w, "wb")
        self._from = os.fdopen(from_r, "rb")
        self._driver_log = log
        # The driver answers once ray.init saw both nodes alive.
        self._recv(timeout=120)

    def close(self) -> None:
        """Ends every process the cluster started (and only those), removes
        its namespaces, links and cgroup. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._to is not None:
            try:
                self._to.close()  # the driver's ray.shutdown and exit
            except OSError:
                pass
            try:
                self._driver.wait(timeout=15)
            except Exception:
                pass
        for group in ("driver", "worker", "head"):
            self._end(group)
        for p in (self._driver, self.head.proc, self.worker.proc):
            if p is not None:
                try:
                    p.wait(timeout=5)
                except Exception:
                    pass
        if self._from is not None:
            self._from.close()
        for group in ("driver", "worker", "head", ""):
            try:
                os.rmdir(os.path.join(self.cgroup, group))
            except OSError:
                pass
        for n in (self.head, self.worker):
            _run("ip", "netns", "del", n.netns, check=False)
            _run("ip", "link", "del", n.veth, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pids(self, group: str) -> List[int]:
        """The processes of one part of the cluster now (``head``,
        ``worker`` or ``driver``: its cgroup's members)."""
        try:
            with open(os.path.join(self.cgroup, group, "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def _end(self, group: str) -> None:
        """Ends every process of group: SIGTERM, then SIGKILL after 10 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self._kill_cgroup(group, sig, 10.0):
                return

    def kill_worker(self) -> None:
        """Kills the worker node at once (SIGKILL to each of its processes,
        as a machine that loses power): a node lost mid-transfer."""
        self._kill_cgroup("worker", signal.SIGKILL, 10.0)
        if self.worker.proc is not None:
            self.worker.proc.wait(timeout=10)

    def restart_worker(self) -> None:
        """Starts the worker node again (after :meth:`kill_worker`) and
        waits until Ray counts two live nodes."""
        self._kill_cgroup("worker", signal.SIGKILL, 10.0)
        w = self.worker
        w.proc = self._launch(w, self._worker_argv, w.log)
        self.call(_wait_nodes, 2, 90.0)

    def _kill_cgroup(self, group: str, sig: int, wait: float) -> bool:
        """Signals every member; True if some are left after wait seconds."""
        deadline = time.monotonic() + wait
        while True:
            pids = self.pids(group)
            if not pids:
                return False
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
            if time.monotonic() > deadline:
                return bool(self.pids(group))
            if sig == signal.SIGTERM:
                sig = 0  # once, then watch them go

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # The driver

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 300, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) in the driver (on the head node, connected to
        the cluster); returns its result or raises its exception."""
        from ray import cloudpickle

        _send(self._to, cloudpickle.dumps((fn, args, kwargs)))
        return self._recv(timeout)

    def _recv(self, timeout: float) -> Any:
        import pickle
        import select

        r, _, _ = select.select([self._from], [], [], timeout)
        if not r:
            raise ClusterError(f"driver: no answer in {timeout:.0f} s:\n{_tail(self._driver_log)}")
        data = _read(self._from)
        if data is None:
            raise ClusterError(f"driver exited:\n{_tail(self._driver_log)}")
        ok, value = pickle.loads(data)
        if ok:
            return value
        raise value

    # Network shaping (benchmarks)

    def shape(self, rate: str) -> None:
        """Limits both nodes' links to rate (tc's units, e.g. ``10gbit``)
        each way: a token bucket on each veth (towards the node) and on the
        node's eth0 (from it)."""
        for n in (self.head, self.worker):
            _run("tc", "qdisc", "replace", "dev", n.veth, "root", "tbf", "rate", rate, "burst", "4mb", "latency", "50ms")
            _run("ip", "netns", "exec", n.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                 "rate", rate, "burst", "4mb", "latency", "50ms")

    def unshape(self) -> None:
        """Removes :meth:`shape`'s limits."""
        for n in (self.head, self.worker):
            _run("tc", "qdisc", "del", "dev", n.veth, "root", check=False)
            _run("ip", "netns", "exec", n.netns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


def _named(argv: List[str], node: Node) -> List[str]:
    return [a.replace("{name}", node.name) for a in argv]


def _send(f: Any, data: bytes) -> None:
    f.write(struct.pack("<Q", len(data)))
    f.write(data)
    f.flush()


def _read(f: Any) -> Optional[bytes]:
    head = f.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    return data if len(data) == n else None


def _installed_lib() -> Optional[str]:
    """The library of the tensorlane package this test process imports (the
    installed one, as .ci/run installs it), or None."""
    try:
        from tensorlane import _lib

        p = _lib.path()
    except Exception:
        return None
    return str(p) if p.exists() else None


def start(num_cpus: int = 4, object_store: int = 512 << 20, lib: Optional[str] = None,
          env: Optional[Dict[str, str]] = None) -> Cluster:
    """Starts the cluster (skipping the calling test when the machine cannot
    host it: see :func:`why_unavailable`). ``lib`` is libtensorlane.so
    (default TENSORLANE_LIB, else the installed package's own); env adds
    variables to every node and the driver."""
    why = why_unavailable()
    if why is not None:
        import pytest

        pytest.skip(f"two-node Ray cluster: {why}")
    tag = f"{os.getpid() % 100000:05d}"
    # A /24 per process, so concurrent runs (other engineers, CI) do not meet.
    b, c = 200 + os.getpid() % 50, (os.getpid() // 50) % 250
    subnet = f"10.{b}.{c}"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "TENSORLANE_CONFIG"))}
    lib = lib or os.environ.get("TENSORLANE_LIB") or _installed_lib()
    if lib:  # the nodes import the package from this checkout (PYTHONPATH), which has no library of its own
        base_env["TENSORLANE_LIB"] = lib
    base_env.update({
        "PYTHONPATH": os.pathsep.join([PYTHON_DIR, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray 2.60 turns token auth on for a head off loopback and, with no
        # token given, writes one to ~/.ray/auth_token, which every other Ray
        # of this user would then pick up: the cluster gets its own instead.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    })
    base_env.update(env or {})
    root = _cgroup_root()
    cl = Cluster(tag=tag, subnet=subnet, bridge=f"{PREFIX}{tag}"[:15], cgroup=os.path.join(root, f"{PREFIX}-{tag}"),
                 tmp=tempfile.mkdtemp(prefix=f"{PREFIX}-{tag}-"), env=base_env)
    link = f"{PREFIX}{tag}"[:13]  # + "h"/"w", + "p" for the peer: 15, Linux's limit
    cl.head = Node("head", f"{PREFIX}-{tag}-head", f"{subnet}.1", f"{PREFIX}-head", link + "h")
    cl.worker = Node("worker", f"{PREFIX}-{tag}-worker", f"{subnet}.2", f"{PREFIX}-worker", link + "w")
    try:
        os.makedirs(cl.cgroup, exist_ok=True)
        cl._setup_network()
        cl._start_nodes(num_cpus, object_store)
        cl._start_driver()
    except BaseException:
        cl.close()
        raise
    import atexit

    atexit.register(cl.close)  # a run that ends without closing still leaves nothing behind
    return cl


def _wait_nodes(n: int, timeout: float) -> None:
    """In the driver: waits until Ray counts n live nodes."""
    import ray

    deadline = time.monotonic() + timeout
    while sum(1 for x in ray.nodes() if x["Alive"]) < n:
        if time.monotonic() > deadline:
            raise ClusterError(f"fewer than {n} live Ray nodes after {timeout:.0f} s")
        time.sleep(0.2)


# The driver process (run inside the head's namespace by Cluster).


def _serve(to_fd: int, from_fd: int, address: str, ip: str) -> None:
    import pickle

    import ray
    from ray import cloudpickle

    import raycluster  # this file by its name, so its exceptions unpickle in the caller
    import tensorlane.ray as tlr

    ClusterError = raycluster.ClusterError
    inp, out = os.fdopen(to_fd, "rb"), os.fdopen(from_fd, "wb")
    tlr.register()
    ray.init(address=address, _node_ip_address=ip, log_to_driver=True)
    try:
        raycluster._wait_nodes(2, 90.0)
    except ClusterError as e:
        _send(out, pickle.dumps((False, e)))
        return
    _send(out, pickle.dumps((True, None)))
    while True:
        data = _read(inp)
        if data is None:
            break
        try:
            fn, args, kwargs = cloudpickle.loads(data)
            res = (True, fn(*args, **kwargs))
        except BaseException as e:  # the caller gets it, typed
            res = (False, e)
        try:
            payload = cloudpickle.dumps(res)
        except Exception as e:
            payload = cloudpickle.dumps((False, ClusterError(f"unpicklable result: {e!r}: {res[1]!r}")))
        _send(out, payload)
    ray.shutdown()


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--serve":
    _serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
