"""Ray transports side by side: the same actor pair, interleaved in one run.

    .venv/bin/python bench/ray/bench.py [--sizes 4K,1M,64M,256M] [--reps 5] [--json out.json]

For each size, a fresh sender/receiver pair per transport measures the cold
transfer (the pair's first), then warm transfers interleaved round-robin
across transports, so drift on a shared machine hits them alike. A transfer
is timed from the driver: the sender returns a prepared array, the receiver
gets it as a task argument and touches every byte (sums it), and the driver
waits for the receiver's answer. Reported: median seconds, GB/s, and each
transport's ratio to the plain object store measured in the same run.

Transports: the object store (numpy: Ray copies the array into plasma once
and the reader maps it read-only); TENSORLANE with per-object grants
("views", TENSORLANE_SLABS=0) and in slab mode ("slabs", the plug-in's
default: the reader maps the sender's slab once for every object), each
publishing the caller's numpy array (foreign memory: one staged copy for a
same-node reader, made in the background at Put into pre-populated memory;
the reader maps it read-only) and an array from tensorlane.empty (no copy
anywhere: the reader maps the sender's array read-only); TENSORLANE forced
onto tcp (the reader's copy); and, when torch (and nixl)
are installed, GLOO, NIXL and the zero-copy torch object store
(RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1). Ones that cannot run are listed with
the reason.
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

tlr.register()

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def human(n: int) -> str:
    for u, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {u}"
    return f"{n} B"


@ray.remote(enable_tensor_transport=True)
class Sender:
    def __init__(self, n: int, shareable: bool):
        count = n // 4
        self.a = tensorlane.empty(count, np.float32) if shareable else np.empty(count, np.float32)
        self.a[:] = 1.0

    def ready(self, start_runtime=False):
        if start_runtime:
            tlr.runtime()  # see make_pair
        return True

    def plain(self):
        return self.a

    @ray.method(tensor_transport="TENSORLANE")
    def tensorlane(self):
        return self.a


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def ready(self, start_runtime=False):
        if start_runtime:
            tlr.runtime()  # see make_pair
        return True

    def touch(self, a):
        return float(np.add.reduce(a, dtype=np.float64))  # every byte read

    def transports(self):
        try:
            st = tlr.runtime().stats()
            out = dict(st["gets_by_transport"])
            if st.get("views"):
                out["views"] = st["views"]
            if st.get("shm_slabs", {}).get("mapped"):
                out["slab mmaps"] = st["shm_slabs"]["mapped"]
            return out
        except Exception:
            return {}


# Per-object grants (each object its own memfd; same-node readers map a
# read-only view of it), and slab mode (objects in large memfds shared
# within the job's trust scope, the reader maps each slab once and copies
# into its pre-faulted pool; the plug-in's default). POOL sizes slab mode's
# pre-faulted pool, the analogue of Ray's object store memory.
POOL = os.environ.get("TENSORLANE_POOL_BYTES", "640M")
VIEW_ENV = {"env_vars": {"TENSORLANE_SLABS": "0"}}
SLAB_ENV = {"env_vars": {"TENSORLANE_SLABS": "1", "TENSORLANE_POOL_BYTES": POOL}}
TCP_ENV = {"env_vars": {"TENSORLANE_TRANSPORTS": "tcp", "TENSORLANE_SLABS": "0"}}


def transports(torch_ok: bool, nixl_ok: bool):
    """name -> (sender options, shareable, method name) or a skip reason."""
    out = {
        "object store": ({}, False, "plain"),
        "TENSORLANE views": (VIEW_ENV, False, "tensorlane"),
        "TENSORLANE views (tensorlane.empty)": (VIEW_ENV, True, "tensorlane"),
        "TENSORLANE slabs": (SLAB_ENV, False, "tensorlane"),
        "TENSORLANE slabs (tensorlane.empty)": (SLAB_ENV, True, "tensorlane"),
        "TENSORLANE tcp": (TCP_ENV, False, "tensorlane"),
    }
    only = os.environ.get("BENCH_ONLY")  # a comma-separated subset, for quick looks
    if only:
        keep = {"object store", *[x.strip() for x in only.split(",")]}
        out = {k: v for k, v in out.items() if k in keep}
    why = "torch is not installed (Ray's GLOO, NIXL and zero-copy store paths move torch tensors only)"
    out["object store zero-copy"] = why if not torch_ok else "torch installed: not wired in this script yet"
    out["GLOO"] = why if not torch_ok else "torch installed: not wired in this script yet"
    out["NIXL"] = why if not torch_ok else ("nixl is not installed" if not nixl_ok else "not wired in this script yet")
    return out


def make_pair(opts, n, shareable, tensorlane_row):
    """A fresh pair. For the tensorlane rows both actors start their runtime
    before the clock starts (the plug-in starts it in the background when
    Ray first asks whether the actor has the transport; slab mode populates
    its pool then), as Ray's object store is up before its first transfer:
    cold is the pair's first transfer, not the runtime's start."""
    s = Sender.options(runtime_env=opts or None).remote(n, shareable)
    r = Receiver.options(runtime_env=opts or None).remote()
    ray.get([s.ready.remote(tensorlane_row), r.ready.remote(tensorlane_row)])
    return s, r


def once(pair, method) -> float:
    s, r = pair
    t = time.perf_counter()
    ref = getattr(s, method).remote()
    ray.get(r.touch.remote(ref))
    took = time.perf_counter() - t
    del ref
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4K,1M,64M,256M")
    ap.add_argument("--reps", type=int, default=5, help="warm transfers per transport and size")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    try:
        import torch  # noqa: F401

        torch_ok = True
    except ImportError:
        torch_ok = False
    try:
        import nixl  # noqa: F401

        nixl_ok = True
    except ImportError:
        nixl_ok = False

    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    plan = transports(torch_ok, nixl_ok)
    runnable = {k: v for k, v in plan.items() if not isinstance(v, str)}
    skipped = {k: v for k, v in plan.items() if isinstance(v, str)}
    results = []
    for n in sizes:
        pairs, cold = {}, {}
        for name, (opts, shareable, method) in runnable.items():
            pairs[name] = make_pair(opts, n, shareable, method == "tensorlane")
            cold[name] = once(pairs[name], method)
        warm = {name: [] for name in runnable}
        for _ in range(args.reps):
            for name, (_, _, method) in runnable.items():
                warm[name].append(once(pairs[name], method))
        seen = {name: ray.get(pairs[name][1].transports.remote()) for name in runnable}
        base_w = statistics.median(warm["object store"])
        base_c = cold["object store"]
        for name in runnable:
            w = statistics.median(warm[name])
            results.append({
                "size": n, "transport": name, "warm_s": w, "cold_s": cold[name],
                "warm_gbps": n / w / 1e9, "cold_gbps": n / cold[name] / 1e9,
                "warm_vs_store": base_w / w, "cold_vs_store": base_c / cold[name],
                "paths": seen[name],
            })
        for s, r in pairs.values():
            ray.kill(s)
            ray.kill(r)
        print(f"{human(n)} done", file=sys.stderr, flush=True)
    ray.shutdown()

    print(f"Ray {ray.__version__}, numpy {np.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; {args.reps} warm transfers per cell (median); ratios are the object store's time over the transport's (higher is faster)\n")
    print("| size | transport | warm ms | warm GB/s | × store warm | cold ms | × store cold | paths taken |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r["paths"].items())) or "-"
        print(f"| {human(r['size'])} | {r['transport']} | {r['warm_s'] * 1e3:.2f} | {r['warm_gbps']:.2f} | "
              f"{r['warm_vs_store']:.2f} | {r['cold_s'] * 1e3:.2f} | {r['cold_vs_store']:.2f} | {paths} |")
    if skipped:
        print("\nNot measured:")
        for k, v in skipped.items():
            print(f"- {k}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ray": ray.__version__, "results": results, "skipped": skipped}, f, indent=2)


if __name__ == "__main__":
    main()
