"""Ray transports side by side: the same actor pair, interleaved in one run.

    /work/benchvenv/bin/python bench/ray/bench.py [--sizes 4K,1M,64M,256M] [--reps 5] [--json out.json]
    sudo .../python bench/ray/bench.py --nodes 2 [--rate 10gbit] --sizes 64M,256M

With ``--nodes 2`` the pair spans two Ray nodes: a real two-node Ray cluster
on this machine (python/tests/raycluster.py: each node in its own network
namespace and UTS namespace, joined by a bridge, every setting at its
default), links shaped with tc to ``--rate`` each way (``0``: unshaped), the
sender on the worker node and the receiver on the head; the driver runs on
the head. Needs root, iproute2 and util-linux.

For each size, ``--cold`` fresh sender/receiver pairs per transport (3;
rows interleaved) each time their first transfer once the machine's CPUs
are quiet again (Ray starts idle workers after each actor), and their
median is the cold figure; the last pair then times warm transfers
interleaved round-robin across transports, so drift on a shared machine
hits them alike. Before any pair, a runtime on each node (NodeWarm) brings
up the node's pool helper, as Ray's store is up before its first transfer
(``--fresh-nodes``: not). A transfer
is timed from the driver: the sender returns a prepared array or tensor
(made once, before the clock), the receiver gets it as a task argument and
touches every byte (sums it), and the driver waits for the receiver's
answer. Reported: median seconds, GB/s, ratios measured in the same run.

Rows, numpy (need only ray and numpy):
- ``store`` : Ray's object store (one copy into plasma; the reader maps it).
- ``wire`` : the floor, not a transport: the sender writes the array to one
  plain TCP connection to the receiver (node address to node address, the
  path every row's bytes take between nodes), which reads it into a
  populated array and sums it. No copy, checksum or framing: a transport
  beats it only with streams and cores to spare, so a goal whose time is
  under it is out of reach on this machine.
- ``TENSORLANE`` : the plug-in's defaults (slab mode; a caller's array is
  staged once on the sender; the same-node reader maps it read-only; under
  TENSORLANE_INLINE_BYTES, 64 KiB, the bytes ride inline in the metadata).
- ``TENSORLANE empty`` : the array comes from tensorlane.empty (no copy anywhere).
- ``TENSORLANE tcp`` : forced onto tcp (the reader's copy), for GLOO's peer.
Rows, torch (when torch is importable):
- ``store torch`` : Ray's object store, torch's own pickling.
- ``store zero-copy torch`` : RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1 in both
  actors' runtime_env (ray/_private/ray_constants.py; the tensor is pickled
  as a uint8 numpy view, so the reader maps plasma as with numpy).
- ``GLOO`` : Ray's collective transport, a gloo group over the pair
  (ray.experimental.collective.create_collective_group, made before the clock).
- ``NIXL`` : Ray's NIXL transport on CPU tensors (UCX; both agents made
  before the clock).
- ``TENSORLANE torch`` : TENSORLANE_TORCH, the reader copies into its own
  writable memory (the plug-in's torch default).
- ``TENSORLANE torch view`` : TENSORLANE_RECV=view, read-only torch tensors
  mapped from the sender (as the zero-copy store gives).
Floor rows (sizes up to 1 MiB; floor.py):
- ``NULL`` : a trivial one-sided transport with the bytes in its metadata:
  what any plug-in transport pays Ray.
- ``TENSORLANE no inline`` : TENSORLANE_INLINE_BYTES=0 (a tensorlane read).
- ``TENSORLANE ask`` : as TENSORLANE, but Ray's per-call "does the actor have
  the transport" check asks the actor every time (the old behaviour, and NIXL's).
- ``TENSORLANE nested get`` : the ref passed inside a list; the receiver's own
  ray.get fetches it in its thread (Ray's one path without ``__ray_recv__``),
  after the driver waited for the sender (on the clock; Ray needs it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import ray

import tensorlane
import tensorlane.ray as tlr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import floor  # noqa: E402
from benchkit import NIXL, TORCH, human, nixl_agent, parse_size, rdt_ready, torch, via  # noqa: E402

tlr.register()
floor.register()

@ray.remote(enable_tensor_transport=True)
class Sender:
    def __init__(self, n: int, kind: str):
        count = n // 4
        if kind == "empty":
            self.a = tensorlane.empty(count, np.float32)
        else:
            self.a = np.empty(count, np.float32)
        # Values like a model's weights: a constant array would let tcp's
        # codec (auto: on where the link is slower than the codec) carry it
        # in a few bytes, which no real tensor allows and the other rows
        # never try.
        self.a[:] = np.random.default_rng(count).standard_normal(count, dtype=np.float32) * np.float32(0.02)
        if kind == "torch":
            import torch

            self.a = torch.from_numpy(self.a)

    def ready(self, warm: str = ""):
        if warm == "tensorlane":
            tlr.runtime()  # see make_pair
        elif warm == "nixl":
            nixl_agent()
        return True

    def rdt_ready(self):
        return rdt_ready()

    def plain(self):
        return self.a

    @ray.method(tensor_transport="TENSORLANE")
    def tensorlane(self):
        return self.a

    @via("TENSORLANE_TORCH")
    def tensorlane_torch(self):
        return self.a

    @via("GLOO")
    def gloo(self):
        return self.a

    @via("NIXL")
    def nixl(self):
        return self.a

    @ray.method(tensor_transport="NULL")
    def null(self):
        return self.a

    @ray.method(tensor_transport="TENSORLANE_ASK")
    def ask(self):
        return self.a

    def wire_send(self, addr):
        # The floor: the same bytes over one plain TCP connection, straight
        # from the array (no copy in user space, no checksum, no framing).
        import socket

        with socket.create_connection(tuple(addr)) as c:
            c.sendall(memoryview(self.a).cast("B"))
        return True


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def rdt_ready(self):
        return rdt_ready()

    def ready(self, warm: str = ""):
        if warm == "tensorlane":
            tlr.runtime()
        elif warm == "nixl":
            nixl_agent()
        return True

    def touch(self, a):
        # Every byte read, by the same numpy reduction for every row: a CPU
        # torch tensor's .numpy() is a view (torch's own sum to float64 is
        # several times slower and would hide the transports' differences).
        if not isinstance(a, np.ndarray):
            a = a.numpy()
        return float(np.add.reduce(a, dtype=np.float64))

    def wire_listen(self, n: int):
        """A listener on this node's address, and a destination of n bytes
        with its pages populated (as a warm transport's would be)."""
        import socket

        self.dst = np.ones(n // 4, np.float32)
        self.lis = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lis.bind((ray.util.get_node_ip_address(), 0))
        self.lis.listen(1)
        return self.lis.getsockname()

    def wire_recv(self):
        c, _ = self.lis.accept()
        with c:
            buf, got = memoryview(self.dst).cast("B"), 0
            while got < len(buf):
                k = c.recv_into(buf[got:])
                if k == 0:
                    raise ConnectionError(f"wire: {got} of {len(buf)} bytes")
                got += k
        return self.touch(self.dst)

    def touch_nested(self, refs):
        # The ref arrived inside a list, so Ray resolved nothing: this
        # ray.get fetches the RDT object here, in this thread, through the
        # transport's fetch_multiple_tensors, with no __ray_recv__ task.
        return self.touch(ray.get(refs[0]))

    def transports(self):
        try:
            st = tlr.runtime().stats()
            out = dict(st["gets_by_transport"])
            if st.get("views"):
                out["views"] = st["views"]
            if st.get("shm_slabs", {}).get("mapped"):
                out["slab mmaps"] = st["shm_slabs"]["mapped"]
            z = st.get("tcp_compression") or {}
            if z.get("compressed"):  # the codec carried these: say so beside the figure
                out["tcp compressed"] = f'{z["compressed"]} (x{z["raw_bytes"] / max(1, z["wire_bytes"]):.1f})'
            return out
        except Exception:
            return {}


@ray.remote(num_cpus=0)
class NodeWarm:
    """Holds a tensorlane runtime on one node for the whole run, so the
    node's pool helper (tensor/nodepool) is up and populated before any
    pair is timed, as Ray's object store is up before its first transfer:
    cold is a pair's first transfer on a node that has run actors, not the
    node's first use (``--fresh-nodes`` measures that)."""

    def ready(self, timeout: float = 10.0) -> dict:
        rt = tlr.runtime()
        deadline = time.monotonic() + timeout
        while not (rt.stats().get("node_pool") or {}).get("connected") and time.monotonic() < deadline:
            time.sleep(0.02)
        return rt.stats().get("node_pool") or {}


def warm_nodes(two_node: bool) -> list:
    """One NodeWarm per node, ready (see NodeWarm); kill them when done."""
    where = [PLACE["sender"], PLACE["receiver"]] if two_node else [{}]
    actors = [NodeWarm.options(runtime_env=env(), **w).remote() for w in where]
    for a, st in zip(actors, ray.get([a.ready.remote() for a in actors])):
        if not st.get("connected"):
            print(f"node pool not connected on a node: {st}", file=sys.stderr, flush=True)
    return actors


#: --fresh-nodes: no NodeWarm, so the first pairs run while the nodes'
#: pool helpers start.
FRESH_NODES = False


# PYTHONPATH: workers import floor.py (NULL, TENSORLANE_ASK) from here (a
# runtime_env's PYTHONPATH replaces the worker's, so the rest is kept).
PY = {"PYTHONPATH": os.pathsep.join(p for p in [HERE, os.environ.get("PYTHONPATH", "")] if p)}
#: Two-node mode: the Ray resources that put the sender on the worker node
#: and the receiver on the head (raycluster.RESOURCE); empty on one node.
PLACE: dict = {}
SMALL = 1 << 20  # floor rows only up to this size (NULL carries the bytes through Ray's control plane)


def env(**kw):
    return {"env_vars": dict(PY, **kw)}


#: --actor-pools: each actor pre-faults a pool of its own sized to the
#: transfer (the set-up before the node's warm pool existed). By default the
#: actors run with the defaults: new slabs from the node's pool helper.
ACTOR_POOLS = False


def pools(n: int, copies: bool):
    """Slab mode's pre-faulted pools (TENSORLANE_POOL_BYTES), sized to the
    transfer, as Ray's object store memory would be, so a dozen actor pairs
    fit in a small machine's memory: the sender stages a caller's array
    anew for each transfer (two in flight at most: the last one is freed when
    its ObjectRef dies), and a receiver that copies needs one destination; a
    receiver that maps the sender's memory needs none."""
    mib = 1 << 20
    sender = 2 * n + 32 * mib
    receiver = n + 32 * mib if copies else 0
    return str(sender), str(receiver)


def rows():
    """name -> (runtime_env, sender kind, method, warm-up, max size) or a skip reason."""
    out = {
        "store": (env(), "numpy", "plain", "", None),
        "wire": (env(), "numpy", "wire", "wire", None),
        "TENSORLANE": (env(), "numpy", "tensorlane", "tensorlane", None),
        "TENSORLANE empty": (env(), "empty", "tensorlane", "tensorlane", None),
        "TENSORLANE tcp": (env(TENSORLANE_TRANSPORTS="tcp"), "numpy", "tensorlane", "tensorlane", None),
        "NULL": (env(), "numpy", "null", "", SMALL),
        "TENSORLANE no inline": (env(TENSORLANE_INLINE_BYTES="0"), "numpy", "tensorlane", "tensorlane", SMALL),
        "TENSORLANE ask": (env(), "numpy", "ask", "tensorlane", SMALL),
        "TENSORLANE nested get": (env(), "numpy", "tensorlane+nested", "tensorlane", SMALL),
    }
    why = "torch is not installed (Ray's GLOO, NIXL and zero-copy store paths move torch tensors only)"
    torch_rows = {
        "store torch": (env(), "torch", "plain", "", None),
        "store zero-copy torch": (env(RAY_ENABLE_ZERO_COPY_TORCH_TENSORS="1"), "torch", "plain", "", None),
        "GLOO": (env(), "torch", "gloo", "gloo", None),
        "NIXL": (env(), "torch", "nixl", "nixl", None) if NIXL else "nixl is not installed",
        "TENSORLANE torch": (env(), "torch", "tensorlane_torch", "tensorlane", None),
        "TENSORLANE torch view": (env(TENSORLANE_RECV="view"), "torch", "tensorlane_torch", "tensorlane", None),
    }
    for k, v in torch_rows.items():
        out[k] = v if TORCH else why
    only = os.environ.get("BENCH_ONLY")  # a comma-separated subset, for quick looks
    if only:
        keep = {"store", "wire", *[x.strip() for x in only.split(",")]}
        out = {k: v for k, v in out.items() if k in keep}
    return out


def make_pair(opts, n, kind, warm, method=""):
    """A fresh pair, set up before the clock as each transport's own
    machinery is: Ray's RDT set-up in both actors, tensorlane's runtimes (the plug-in starts them in the
    background when Ray first asks whether the actor has the transport;
    slab mode populates its pool then), NIXL's agents, the gloo group. Ray's
    object store is up before its first transfer too: cold is the pair's
    first transfer, not the transport's start."""
    sopts, ropts = opts, opts
    if warm == "tensorlane" and ACTOR_POOLS and "TENSORLANE_POOL_BYTES" not in os.environ:
        v = opts["env_vars"]
        # The receiver needs a destination where it cannot map the
        # sender's memory: forced onto tcp, torch's copy, or another node.
        copies = (v.get("TENSORLANE_TRANSPORTS") == "tcp" or bool(PLACE)
                  or (method.startswith("tensorlane_torch") and v.get("TENSORLANE_RECV") != "view"))
        sp, rp = pools(n, copies)
        sopts = {"env_vars": dict(v, TENSORLANE_POOL_BYTES=sp)}
        ropts = {"env_vars": dict(v, TENSORLANE_POOL_BYTES=rp)}
    s = Sender.options(runtime_env=sopts, **PLACE.get("sender", {})).remote(n, kind)
    r = Receiver.options(runtime_env=ropts, **PLACE.get("receiver", {})).remote()
    ray.get([s.ready.remote(warm), r.ready.remote(warm)])
    if method != "plain":
        # Ray's own once-per-actor RDT set-up, for every transport alike:
        # the custom transports registered on each actor (a task the owner
        # waits for on the first transfer to it) and Ray's default ones
        # (which imports torch in the actor, seconds under load).
        rdt = ray._private.worker.global_worker.rdt_manager
        rdt.wait_until_custom_transports_registered(s)
        rdt.wait_until_custom_transports_registered(r)
        ray.get([s.rdt_ready.remote(), r.rdt_ready.remote()])
    if warm == "gloo":
        from ray.experimental.collective import create_collective_group

        create_collective_group([s, r], backend="gloo")
    if warm == "wire":
        return s, r, ray.get(r.wire_listen.remote(n))
    return s, r


def _cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # total, idle + iowait


def quiesce(idle: float = 0.75, window: float = 0.25, limit: float = 4.0) -> float:
    """Waits until the machine's CPUs were at least ``idle`` idle over a
    ``window`` (or ``limit`` seconds pass) and returns the idle share seen
    last. Before a cold transfer: Ray starts idle workers in the background
    after each actor (2-3 s of the cores importing), and a first transfer
    that meets them measures Ray's churn, not its transport. Bounded, as
    the machine may never be that idle: NIXL's agents (Ray's defaults)
    each keep a progress thread polling, about a core apiece."""
    deadline = time.monotonic() + limit
    t0, i0 = _cpu_times()
    while True:
        time.sleep(window)
        t1, i1 = _cpu_times()
        share = (i1 - i0) / max(1, t1 - t0)
        if share >= idle or time.monotonic() > deadline:
            return share
        t0, i0 = t1, i1


def once(pair, method) -> float:
    s, r = pair[:2]
    t = time.perf_counter()
    if method == "wire":
        got = r.wire_recv.remote()
        ray.get([s.wire_send.remote(pair[2]), got])
        return time.perf_counter() - t
    if method.endswith("+nested"):
        # Ray can pass a borrowed RDT ref only once the owner has its
        # metadata (else NotImplementedError, Ray issue #59644): wait for
        # the sender first, on the clock.
        ref = getattr(s, method.removesuffix("+nested")).remote()
        ray.wait([ref], fetch_local=False)
        ray._private.worker.global_worker.rdt_manager.wait_for_tensor_transport_metadata(ref.hex(), 60)
        ray.get(r.touch_nested.remote([ref]))
        took = time.perf_counter() - t
        del ref
        return took
    ref = getattr(s, method).remote()
    ray.get(r.touch.remote(ref))
    took = time.perf_counter() - t
    del ref
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4K,1M,64M,256M")
    ap.add_argument("--reps", type=int, default=5, help="warm transfers per transport and size")
    ap.add_argument("--cold", type=int, default=3, help="fresh pairs per transport and size, each timed on its first "
                                                         "transfer (the median is the cold figure)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2), help="2: sender and receiver on two Ray nodes")
    ap.add_argument("--rate", default="10gbit", help="two nodes: each link's rate (tc units; 0 = unshaped)")
    ap.add_argument("--actor-pools", action="store_true",
                    help="each TENSORLANE actor pre-faults its own pool sized to the transfer (TENSORLANE_POOL_BYTES), "
                         "instead of the default: new slabs from the node's warm pool")
    ap.add_argument("--fresh-nodes", action="store_true",
                    help="no runtime holds each node before the pairs (NodeWarm), so the first pairs run while the "
                         "nodes' pool helpers start: the node's first use, not a pair's")
    args = ap.parse_args()
    global ACTOR_POOLS, FRESH_NODES
    ACTOR_POOLS, FRESH_NODES = args.actor_pools, args.fresh_nodes
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    load0 = os.getloadavg()[0]
    if args.nodes == 2:
        results, skipped = two_nodes(sizes, args.reps, args.rate, args.cold)
    else:
        ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": PY})
        results, skipped = measure(sizes, args.reps, False, ACTOR_POOLS, FRESH_NODES, args.cold)
        ray.shutdown()
    load1 = os.getloadavg()[0]
    report(results, skipped, args, load0, load1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ray": ray.__version__, "torch": getattr(torch, "__version__", None), "load": [load0, load1],
                       "nodes": args.nodes, "rate": args.rate if args.nodes == 2 else None,
                       "results": results, "skipped": skipped}, f, indent=2)


def two_nodes(sizes, reps, rate, cold):
    """measure() in the driver of a two-node cluster (see the module doc)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python", "tests"))
    import raycluster

    import bench  # this file by name, so the driver imports it (not __main__)

    biggest = max(sizes)
    # GLOO_SOCKET_IFNAME: gloo finds its interface by resolving the host
    # name, and the nodes' names (unshare --uts) are in no resolver here.
    # UCX_TLS=tcp: the nodes share one kernel, so UCX (NIXL) would pick its
    # shared-memory and cma transports between them and never touch the
    # link; two real hosts have only the network.
    with raycluster.start(num_cpus=8, object_store=max(1 << 30, 4 * biggest),
                          env={"PYTHONPATH": os.pathsep.join([HERE, raycluster.PYTHON_DIR, raycluster.HERE]),
                               "GLOO_SOCKET_IFNAME": "eth0",
                               "UCX_TLS": os.environ.get("UCX_TLS", "tcp")}) as c:
        if rate and rate != "0":
            c.shape(rate)
        return c.call(bench.measure, sizes, reps, True, ACTOR_POOLS, FRESH_NODES, cold, timeout=3600)


def measure(sizes, reps, two_node: bool = False, actor_pools: bool = False, fresh_nodes: bool = False,
            cold_pairs: int = 3):
    """The rows at each size (in a connected driver); (results, skipped).
    The flags are main's (--actor-pools, --fresh-nodes, --cold), passed in:
    a two-node driver imports this module anew."""
    global ACTOR_POOLS, FRESH_NODES
    ACTOR_POOLS, FRESH_NODES = actor_pools, fresh_nodes
    if two_node:
        import raycluster

        PLACE["sender"] = {"resources": {raycluster.RESOURCE % "worker": 1}}
        PLACE["receiver"] = {"resources": {raycluster.RESOURCE % "head": 1}}
    plan = rows()
    skipped = {k: v for k, v in plan.items() if isinstance(v, str)}
    results = []
    tensorlane_rows = any(not isinstance(v, str) and v[3] == "tensorlane" for v in plan.values())
    warmers = warm_nodes(two_node) if tensorlane_rows and not FRESH_NODES else []
    for n in sizes:
        runnable = {k: v for k, v in plan.items() if not isinstance(v, str) and (v[4] is None or n <= v[4])}
        pairs, colds, failed = {}, {}, {}
        # Cold: the first transfer of each of cold_pairs fresh pairs per row,
        # rows interleaved, each once the machine is quiet (quiesce); the
        # last pair stays for the warm transfers.
        for _ in range(cold_pairs):
            for name, (opts, kind, method, warm, _) in runnable.items():
                if name in failed:
                    continue
                pair = None
                try:
                    pair = make_pair(opts, n, kind, warm, method)
                    quiesce()
                    colds.setdefault(name, []).append(once(pair, method))
                except Exception as e:  # a transport that cannot run here: say why, measure the rest
                    msg = " ".join(str(e).split())
                    failed[name] = f"{type(e).__name__}: {msg[:300]} ... {msg[-600:]}"
                    if pair is not None:  # made, but its transfer failed: its actors go now
                        ray.kill(pair[0])
                        ray.kill(pair[1])
                    continue
                if name in pairs:  # only an earlier pair's first transfer counts
                    ray.kill(pairs[name][0])
                    ray.kill(pairs[name][1])
                pairs[name] = pair
        cold = {name: statistics.median(v) for name, v in colds.items() if name not in failed}
        warm_t = {name: [] for name in cold}
        for _ in range(reps):
            for name in list(cold):
                try:
                    warm_t[name].append(once(pairs[name], runnable[name][2]))
                except Exception as e:
                    failed[name] = f"warm: {type(e).__name__}: {' '.join(str(e).split())[:600]}"
                    del cold[name], warm_t[name]
        seen = {name: ray.get(pairs[name][1].transports.remote()) for name in cold
                if runnable[name][2].startswith(("tensorlane", "ask"))}
        for name in cold:
            w = statistics.median(warm_t[name])
            results.append({"size": n, "transport": name, "warm_s": w, "cold_s": cold[name], "cold_all_s": colds[name],
                            "warm_all_s": warm_t[name], "warm_gbps": n / w / 1e9, "cold_gbps": n / cold[name] / 1e9,
                            "paths": seen.get(name, {})})
        for name, why in failed.items():
            results.append({"size": n, "transport": name, "error": why})
        for p in pairs.values():
            ray.kill(p[0])
            ray.kill(p[1])
        print(f"{human(n)} done", file=sys.stderr, flush=True)
    for a in warmers:
        ray.kill(a)
    return results, skipped


# TENSORLANE row, Ray row: the goals' comparisons (the issue's), each at every size.
VERSUS = [
    ("TENSORLANE", "store"), ("TENSORLANE empty", "store"),
    ("TENSORLANE torch", "store torch"),
    ("TENSORLANE torch", "store zero-copy torch"), ("TENSORLANE torch view", "store zero-copy torch"),
    ("TENSORLANE empty", "store zero-copy torch"),
    ("TENSORLANE torch", "GLOO"), ("TENSORLANE tcp", "GLOO"),
    ("TENSORLANE torch", "NIXL"), ("TENSORLANE torch view", "NIXL"),
    ("TENSORLANE", "wire"), ("TENSORLANE empty", "wire"), ("TENSORLANE torch", "wire"),
]

# The goals across nodes (issue 23): TENSORLANE at least this much faster.
GOALS = [("store", 3.0), ("GLOO", 2.0), ("NIXL", 2.0)]


def _rate_bps(rate: str) -> float:
    """tc's rate ("10gbit", "400mbit") in bits per second; 0 when unshaped."""
    r = (rate or "0").strip().lower()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if r.endswith(unit):
            return float(r[:-len(unit)]) * mult
    return float(r) if r.replace(".", "", 1).isdigit() else 0.0


def report(results, skipped, args, load0, load1):
    where = f"two Ray nodes, links {args.rate}" if args.nodes == 2 else "one Ray node"
    print(f"Ray {ray.__version__}, numpy {np.__version__}, torch {getattr(torch, '__version__', 'absent')}, "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load0:.1f} -> {load1:.1f}; "
          f"{where}; {args.reps} warm transfers per cell (median), cold: median of {args.cold} fresh pairs\n")
    ok = [r for r in results if "error" not in r]
    by = {(r["size"], r["transport"]): r for r in ok}
    # "best": the fastest warm transfer, the least disturbed by a loaded
    # machine's other work (the median is the row's figure).
    print("| size | transport | warm ms | warm GB/s | best warm ms | cold ms | cold GB/s | paths (receiver) |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in ok:
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r["paths"].items())) or "-"
        print(f"| {human(r['size'])} | {r['transport']} | {r['warm_s'] * 1e3:.2f} | {r['warm_gbps']:.2f} | "
              f"{min(r['warm_all_s']) * 1e3:.2f} | {r['cold_s'] * 1e3:.2f} | {r['cold_gbps']:.2f} | {paths} |")
    sizes = sorted({r["size"] for r in ok})
    print("\nRatios, the Ray row's time over the TENSORLANE row's (above 1: TENSORLANE is faster), warm / cold:\n")
    print("| TENSORLANE row | × Ray row | " + " | ".join(human(n) for n in sizes) + " |")
    print("|---|---|" + "---:|" * len(sizes))
    for a, b in VERSUS:
        cells = []
        for n in sizes:
            ra, rb = by.get((n, a)), by.get((n, b))
            cells.append(f"{rb['warm_s'] / ra['warm_s']:.2f} / {rb['cold_s'] / ra['cold_s']:.2f}" if ra and rb else "-")
        if any(c != "-" for c in cells):
            print(f"| {a} | {b} | " + " | ".join(cells) + " |")
    if any(r["transport"] == "wire" for r in ok):
        rate = _rate_bps(getattr(args, "rate", "0")) if args.nodes == 2 else 0
        print("\nThe goals against the floor, warm / cold ms: the time each goal asks of TENSORLANE "
              "(the Ray row's over the factor) and the wire's (the floor on these cores)"
              + (f"; the link's own floor (the bytes at {args.rate}) beside the size" if rate else "") + ":\n")
        print("| size | wire | " + " | ".join(f"{b} / {k:g}" for b, k in GOALS) + " |")
        print("|---|---:|" + "---:|" * len(GOALS))
        for n in sizes:
            w = by.get((n, "wire"))
            if not w:
                continue
            cells = []
            for b, k in GOALS:
                rb = by.get((n, b))
                cells.append(f"{rb['warm_s'] / k * 1e3:.1f} / {rb['cold_s'] / k * 1e3:.1f}" if rb else "-")
            line = f" (line rate {n * 8 / rate * 1e3:.1f})" if rate else ""
            print(f"| {human(n)}{line} | {w['warm_s'] * 1e3:.1f} / {w['cold_s'] * 1e3:.1f} | " + " | ".join(cells) + " |")
    small = [n for n in sizes if n <= SMALL]
    if small:
        ray_rows = ["store", "store torch", "store zero-copy torch", "GLOO", "NIXL"]
        print("\nThe small-transfer floor, warm ms (cold ms):\n")
        names = ray_rows + ["NULL", "TENSORLANE", "TENSORLANE no inline", "TENSORLANE ask", "TENSORLANE nested get"]
        print("| size | " + " | ".join(names) + " | Ray's fastest |")
        print("|---|" + "---:|" * (len(names) + 1))
        for n in small:
            cells = []
            for name in names:
                r = by.get((n, name))
                cells.append(f"{r['warm_s'] * 1e3:.2f} ({r['cold_s'] * 1e3:.2f})" if r else "-")
            fastest = min((by[(n, x)] for x in ray_rows if (n, x) in by), key=lambda r: r["warm_s"], default=None)
            cells.append(fastest["transport"] if fastest else "-")
            print(f"| {human(n)} | " + " | ".join(cells) + " |")
    errs = [r for r in results if "error" in r]
    if skipped or errs:
        print("\nNot measured:")
        for k, v in skipped.items():
            print(f"- {k}: {v}")
        for r in errs:
            print(f"- {r['transport']} at {human(r['size'])}: {r['error']}")


if __name__ == "__main__":
    main()
