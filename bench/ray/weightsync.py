"""Weight sync to a fleet: one trainer, N readers, a state dict of --total
bytes in --tensors bf16 tensors, on a local Ray (one node).

    TENSORLANE_LIB=bin/libtensorlane.so PYTHONPATH=python \\
      python bench/ray/weightsync.py [--total 1G] [--tensors 100] [--readers 1,2,4,8] [--reps 3] [--json out.json]

Rows, each timed from the driver until every reader has the whole state
dict in its own parameter arrays (readers and trainer are made, and their
runtimes started, before the clock; reps are interleaved across rows so
drift on a shared machine hits them alike):

- ``weight sync`` : tensorlane.weightsync: WeightPublisher.publish, one
  broadcast along the tree; each reader's WeightReceiver.wait lands it and
  says done. The readers' parameters come from tensorlane.empty with slab
  mode off (TENSORLANE_SLABS=0; --slabs keeps it on: then weights are
  staged and copied in at wait), so same-host pushes write them in place.
- ``store`` : Ray's object store: the trainer ray.puts the state dict
  once (on the clock), each reader ray.gets it (mapped from plasma) and
  copies it into its parameters.
- ``TENSORLANE per reader`` : Ray Direct Transport with tensorlane: the
  trainer returns the state dict from a TENSORLANE method, each reader gets
  it as a task argument (its own tensorlane read) and copies it into its
  parameters.

``--delta`` runs the delta case instead (no Ray): bf16 weights after an
Adam step at lr 1e-6..1e-5, bytes on the wire against a full sync, every
byte verified against the full state (see delta_case).

Memory: every reader of the largest count holds its parameters for the
whole run (about --total times the largest reader count, plus the trainer's
and Ray's store copy): 1G with 8 readers needs about 11 GiB.

Every reader's bytes are verified against the trainer's (CRC-32 per
tensor), off the clock: weight sync's at every reader count, the baselines'
at the first. Reported: median seconds per
row and reader count, and each row's time at N readers over its time at
one reader (the goal for weight sync: 8 readers <= 1.3x one reader).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import zlib
from typing import Any, Dict, List

import numpy as np
import ray

import tensorlane as tl
import tensorlane.ray as tlr
from tensorlane import weightsync as ws

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def shapes(total: int, tensors: int) -> List[int]:
    """Element counts (bf16) of the tensors: equal, the last takes the rest."""
    each = total // tensors // 2
    out = [each] * tensors
    out[-1] += (total - 2 * each * tensors) // 2
    return out


def bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def crcs(params: Dict[str, np.ndarray]) -> Dict[str, int]:
    return {k: zlib.crc32(v.view(np.uint8)) for k, v in params.items()}


tlr.register()


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Trainer:
    def __init__(self, sizes: List[int]):
        rng = np.random.default_rng(0)
        self.sd = {}
        for i, n in enumerate(sizes):
            a = tl.empty(n, bf16())
            a[:] = rng.standard_normal(n, dtype=np.float32).astype(bf16())
            self.sd[f"layer{i}.weight"] = a
        self.pub = None

    def start(self, handles: List[ws.ReaderHandle]) -> bool:
        if self.pub is not None:
            self.pub.close()
        self.pub = ws.WeightPublisher(busy_wait=60.0, timeout=300.0)
        for h in handles:
            self.pub.join(h)
        return True

    def publish(self) -> Dict[str, Any]:
        r = self.pub.publish(self.sd)
        assert r.ok, r.failed()
        return {"seconds": r.seconds, "tree": r.tree}

    def store(self) -> List[Any]:
        return [ray.put(self.sd)]

    @ray.method(tensor_transport="TENSORLANE")
    def rdt(self) -> Dict[str, np.ndarray]:
        return self.sd

    def crcs(self) -> Dict[str, int]:
        return crcs(self.sd)


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Reader:
    def __init__(self, sizes: List[int], name: str):
        self.params = {f"layer{i}.weight": tl.empty(n, bf16()) for i, n in enumerate(sizes)}
        for v in self.params.values():
            v.view(np.uint8)[:] = 0  # resident before the clock, as a model's parameters are
        self.rx = ws.WeightReceiver(self.params, name=name)

    def handle(self) -> ws.ReaderHandle:
        return self.rx.handle()

    def landing(self) -> str:
        return self.rx.landing()

    def sync(self) -> int:
        v = self.rx.wait(timeout=300)
        self.rx.done()
        return v

    def from_store(self, refs: List[Any]) -> bool:
        sd = ray.get(refs[0])
        for k, v in sd.items():
            np.copyto(self.params[k], v)
        return True

    def from_rdt(self, sd: Dict[str, np.ndarray]) -> bool:
        for k, v in sd.items():
            np.copyto(self.params[k], v)
        return True

    def zero(self) -> bool:
        for v in self.params.values():
            v.view(np.uint8)[:] = 0
        return True

    def crcs(self) -> Dict[str, int]:
        return crcs(self.params)


def timed_weightsync(trainer, readers) -> float:
    t0 = time.perf_counter()
    pending = [r.sync.remote() for r in readers]
    ray.get([trainer.publish.remote()] + pending)
    return time.perf_counter() - t0


def timed_store(trainer, readers) -> float:
    t0 = time.perf_counter()
    refs = ray.get(trainer.store.remote())
    ray.get([r.from_store.remote(refs) for r in readers])
    dt = time.perf_counter() - t0
    del refs
    return dt


def timed_rdt(trainer, readers) -> float:
    t0 = time.perf_counter()
    ref = trainer.rdt.remote()
    ray.get([r.from_rdt.remote(ref) for r in readers])
    dt = time.perf_counter() - t0
    del ref
    return dt


ROWS = {"weight sync": timed_weightsync, "store": timed_store, "TENSORLANE per reader": timed_rdt}


def verify(trainer, readers) -> None:
    want = ray.get(trainer.crcs.remote())
    for i, got in enumerate(ray.get([r.crcs.remote() for r in readers])):
        bad = [k for k in want if got[k] != want[k]]
        assert not bad, f"reader {i}: {len(bad)} tensors differ ({bad[:3]})"
    ray.get([r.zero.remote() for r in readers])


def delta_case(total: int, tensors: int, lrs: List[float], steps: int = 5) -> List[Dict[str, Any]]:
    """The delta case, without Ray: fp32 master weights (std 0.02) take
    Adam steps (beta 0.9/0.999) with noisy gradients; the readers hold the
    bf16 cast. For the last step, the delta against the previous version
    (XOR, byte planes, zstd) is encoded per tensor, applied to a copy of the
    previous version and checked byte for byte against the new one (what a
    full transfer gives). Reported: bytes on the wire against the full
    state dict, elements changed, and the codec's rates on this machine."""
    out = []
    sizes = shapes(total, tensors)
    for lr in lrs:
        rng = np.random.default_rng(1)
        raw = enc = changed = 0
        t_enc = t_dec = cpu_enc = cpu_dec = 0.0
        for n in sizes:
            w = (rng.standard_normal(n, dtype=np.float32) * 0.02)
            m = np.zeros(n, np.float32)
            v = np.zeros(n, np.float32)
            prev = None
            for s in range(1, steps + 1):
                if s == steps:
                    prev = w.astype(bf16())
                g = rng.standard_normal(n, dtype=np.float32) * 1e-3
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                w -= lr * (m / (1 - 0.9 ** s)) / (np.sqrt(v / (1 - 0.999 ** s)) + 1e-8)
            cur = w.astype(bf16())
            base = prev.copy()
            c0, t0 = time.process_time(), time.perf_counter()
            d = ws.delta_encode(prev, cur)
            c1, t1 = time.process_time(), time.perf_counter()
            ws.delta_apply(base, d)
            c2, t2 = time.process_time(), time.perf_counter()
            cpu_enc, cpu_dec = cpu_enc + (c1 - c0), cpu_dec + (c2 - c1)
            assert base.view(np.uint16).tobytes() == cur.view(np.uint16).tobytes(), "delta != full transfer"
            raw, enc, changed = raw + cur.nbytes, enc + d.data.nbytes, changed + d.changed
            t_enc, t_dec = t_enc + (t1 - t0), t_dec + (t2 - t1)
        out.append({"lr": lr, "full_bytes": raw, "delta_bytes": enc, "ratio": raw / enc,
                    "changed_fraction": changed / (raw // 2), "encode_GBps": raw / t_enc / 1e9, "decode_GBps": raw / t_dec / 1e9,
                    "encode_GBps_per_cpu_second": raw / cpu_enc / 1e9, "decode_GBps_per_cpu_second": raw / cpu_dec / 1e9})
        print(f"delta lr {lr:g}: {100 * changed / (raw // 2):.2f}% of bf16 weights changed; {enc} of {raw} bytes on the wire "
              f"({raw / enc:.1f}x fewer); encode {raw / t_enc / 1e9:.2f} GB/s ({raw / cpu_enc / 1e9:.2f} per CPU second), "
              f"decode {raw / t_dec / 1e9:.2f} GB/s ({raw / cpu_dec / 1e9:.2f} per CPU second); "
              "every byte verified against the full state", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delta", action="store_true", help="only the delta case (no Ray): bytes on the wire after an Adam step")
    ap.add_argument("--lrs", default="1e-6,3e-6,1e-5")
    ap.add_argument("--total", default="1G")
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--readers", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--slabs", action="store_true", help="keep slab mode (weights staged, copied in at wait)")
    ap.add_argument("--json")
    args = ap.parse_args()
    total, counts = parse_size(args.total), [int(x) for x in args.readers.split(",")]
    if args.delta:
        res = delta_case(total, args.tensors, [float(x) for x in args.lrs.split(",")])
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"delta": res, "total_bytes": total, "tensors": args.tensors, "cpus": os.cpu_count(),
                           "loadavg": os.getloadavg()}, f, indent=1)
        return 0
    rows = [r.strip() for r in args.rows.split(",")]
    sizes = shapes(total, args.tensors)
    env = {"PYTHONPATH": os.pathsep.join([HERE, PKG]), "TENSORLANE_SLABS": "1" if args.slabs else "0"}
    for k in ("TENSORLANE_LIB", "TENSORLANE_TRANSPORTS"):
        if os.environ.get(k) is not None:
            env[k] = os.environ[k]
    ray.init(num_cpus=max(counts) + 2, include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": env})
    load0 = os.getloadavg()
    results: Dict[str, Dict[int, List[float]]] = {r: {} for r in rows}
    trees: Dict[int, str] = {}
    try:
        trainer = Trainer.remote(sizes)
        pool = [Reader.remote(sizes, f"reader{i}") for i in range(max(counts))]
        handles = ray.get([r.handle.remote() for r in pool])
        landing = ray.get(pool[0].landing.remote())
        for n in counts:
            readers = pool[:n]
            ray.get(trainer.start.remote(handles[:n]))
            # Warm: one of each row before the clock. Weight sync is
            # verified at every reader count, the baselines at the first
            # (a CRC of every reader's every byte is not cheap on a small
            # machine).
            for row in rows:
                ROWS[row](trainer, readers)
                if row == "weight sync" or n == counts[0]:
                    verify(trainer, readers)
            for _ in range(args.reps):
                for row in rows:
                    results[row].setdefault(n, []).append(ROWS[row](trainer, readers))
            print(f"{n} readers: " + ", ".join(f"{r} {statistics.median(results[r][n]):.3f} s" for r in rows), flush=True)
    finally:
        ray.shutdown()
    load1 = os.getloadavg()
    report(results, rows, counts, total, args, landing, load0, load1)
    return 0


def report(results, rows, counts, total, args, landing, load0, load1) -> None:
    med = {r: {n: statistics.median(v) for n, v in results[r].items()} for r in rows}
    out = {"total_bytes": total, "tensors": args.tensors, "readers": counts, "reps": args.reps, "landing": landing,
           "median_seconds": med, "samples": results, "host": platform.node(), "cpus": os.cpu_count(),
           "loadavg_before": load0, "loadavg_after": load1}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    gib = total / (1 << 30)
    print(f"\n### Weight sync: {gib:g} GiB in {args.tensors} tensors, one node, {os.cpu_count()} cores "
          f"(load {load0[0]:.1f} -> {load1[0]:.1f}); weights land {landing}\n")
    print("| readers | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for n in counts:
        cells = []
        for r in rows:
            s = med[r][n]
            cells.append(f"{s:.3f} s ({s / med[r][counts[0]]:.2f}x)")
        print(f"| {n} | " + " | ".join(cells) + " |")
    if "weight sync" in rows:
        last = counts[-1]
        print(f"\nweight sync at {last} readers over its 1 reader: {med['weight sync'][last] / med['weight sync'][counts[0]]:.2f}x; "
              + ", ".join(f"{r} over weight sync at {last}: {med[r][last] / med['weight sync'][last]:.2f}x"
                          for r in rows if r != "weight sync"))


if __name__ == "__main__":
    sys.exit(main())
