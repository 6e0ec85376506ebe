"""Weight sync to a fleet: one trainer, N readers, a state dict of --total
bytes in --tensors bf16 tensors, on a local Ray (one node) or across two
Ray nodes with shaped links (--nodes 2).

    TENSORLANE_LIB=bin/libtensorlane.so PYTHONPATH=python \\
      python bench/ray/weightsync.py [--total 1G] [--tensors 100] [--readers 1,2,4,8] [--reps 3] [--json out.json]
    # two nodes (root: network namespaces, tc), trainer on the head, readers on the worker ("far")
    # or alternately on both ("mixed"), each link shaped to --rate each way:
    sudo .../python bench/ray/weightsync.py --nodes 2 --rate 1gbit --placements far,mixed --total 256M
    # the delta mode end to end over the shaped link (Adam steps on bf16 weights):
    sudo .../python bench/ray/weightsync.py --nodes 2 --rate 1gbit --delta-e2e --lrs 1e-6,1e-5 --readers 1,8

Rows, each timed from the driver until every reader has the whole state
dict in its own parameter arrays (readers and trainer are made, and their
runtimes, agents and groups started, before the clock; reps are interleaved
across rows so drift on a shared machine hits them alike):

- ``weight sync`` : tensorlane.weightsync: WeightPublisher.publish, one
  broadcast along the tree (one copy crosses each host boundary, the far
  host's leader relays to the others there); each reader's
  WeightReceiver.wait lands it and says done. The readers' parameters come
  from tensorlane.empty with slab mode off (TENSORLANE_SLABS=0; --slabs
  keeps it on: then same-host weights are staged and copied in at wait).
- ``store`` : Ray's object store: the trainer ray.puts the state dict
  once (on the clock), each reader ray.gets it (mapped from plasma; Ray
  pulls it to each node once) and copies it into its parameters.
- ``TENSORLANE per reader`` : Ray Direct Transport with tensorlane: the
  trainer returns the state dict from a TENSORLANE method, each reader gets
  it as a task argument (its own tensorlane read) and copies it into its
  parameters.
- ``NIXL per reader``, ``GLOO per reader`` (torch; NIXL needs nixl): the
  same with Ray's own tensor transports on CPU torch tensors (views of the
  same bf16 memory); GLOO's group (trainer and every reader) is made before
  the clock.
- ``gloo broadcast`` (torch): ray.util.collective's gloo backend, a group of
  the trainer and the N readers (fresh actors per reader count, placed as
  the readers, group made before the clock), one broadcast per tensor into
  the readers' tensors.

``--delta`` runs the delta case without Ray (bytes on the wire after an
Adam step, every byte verified; see delta_case). ``--delta-e2e`` (with
--nodes 2) runs it end to end: the trainer holds fp32 master weights and
Adam state, its bf16 weights are the state dict; each step it publishes
either the delta (WeightPublisher(delta=True): encode on the trainer, each
reader fetches and applies it) or the whole state dict along the tree
(every reader resynced), alternating, timed from the driver until every
reader has the new version; every reader's bytes are checked against the
trainer's after every step.

Memory: every reader of the largest count holds its parameters for the
whole run (about --total times the largest reader count, plus the trainer's
and Ray's store copy, and the gloo broadcast's own actors): 1G with 8
readers needs about 20 GiB; 256M about 5.

Every reader's bytes are verified against the trainer's (CRC-32 per
tensor), off the clock: weight sync's at every reader count, the baselines'
at the first. Reported: median seconds per row and reader count, each row's
time at N readers over its time at one reader (goal for weight sync: 8
readers <= 1.3x one reader) and each row over weight sync at the largest
count (goal: Ray's best >= 3x weight sync's time).
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
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import ray

import tensorlane as tl
import tensorlane.ray as tlr
from tensorlane import weightsync as ws

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PKG = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
sys.path.insert(0, HERE)
from benchkit import NIXL, TORCH, nixl_agent, parse_size, rdt_ready, torch, via  # noqa: E402
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


def as_torch(a: np.ndarray) -> Any:
    """A CPU torch bf16 tensor over the same memory (no copy)."""
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)


def as_numpy(t: Any) -> np.ndarray:
    """The bf16 numpy view of a torch tensor, or the array itself."""
    if isinstance(t, np.ndarray):
        return t
    return t.contiguous().view(torch.int16).numpy().view(bf16())


def _ready(warm: str) -> bool:
    """Each transport's own once-per-actor set-up, before the clock."""
    rdt_ready()
    tlr.runtime()
    if warm == "nixl":
        nixl_agent()
    return True


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
        self.torch_sd = None
        self.adam = None

    def ready(self, warm: str = "") -> bool:
        return _ready(warm)

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def start(self, handles: List[ws.ReaderHandle], delta: bool = False) -> bool:
        if self.pub is not None:
            self.pub.close()
        self.pub = ws.WeightPublisher(busy_wait=60.0, timeout=600.0, delta=delta)
        for h in handles:
            self.pub.join(h)
        return True

    def publish(self) -> Dict[str, Any]:
        r = self.pub.publish(self.sd)
        assert r.ok, r.failed()
        return {"seconds": r.seconds, "tree": r.tree, "modes": r.modes, "full_bytes": r.full_bytes,
                "delta_bytes": r.delta_bytes, "delta_via": r.delta_via}

    def publish_full(self) -> Dict[str, Any]:
        """The whole state dict to every reader (delta mode's fallback)."""
        for name in self.pub.readers():
            self.pub.resync(name)
        return self.publish()

    def store(self) -> List[Any]:
        return [ray.put(self.sd)]

    @ray.method(tensor_transport="TENSORLANE")
    def rdt(self) -> Dict[str, np.ndarray]:
        return self.sd

    def _torch(self) -> Dict[str, Any]:
        if self.torch_sd is None:
            self.torch_sd = {k: as_torch(v) for k, v in self.sd.items()}
        return self.torch_sd

    @via("GLOO")
    def gloo(self) -> Dict[str, Any]:
        return self._torch()

    @via("NIXL")
    def nixl(self) -> Dict[str, Any]:
        return self._torch()

    def crcs(self) -> Dict[str, int]:
        return crcs(self.sd)

    def adam_init(self, lr: float) -> bool:
        """fp32 master weights (std 0.02) and Adam state; the bf16 state
        dict is their cast (as a trainer with bf16 inference weights)."""
        rng = np.random.default_rng(1)
        self.adam = {"lr": lr, "t": 0, "rng": rng, "w": {}, "m": {}, "v": {}}
        for k, a in self.sd.items():
            w = rng.standard_normal(a.size, dtype=np.float32) * np.float32(0.02)
            self.adam["w"][k], self.adam["m"][k], self.adam["v"][k] = w, np.zeros_like(w), np.zeros_like(w)
            a[:] = w.astype(bf16())
        return True

    def adam_step(self) -> float:
        """One Adam step (beta 0.9/0.999, noisy gradients, std 1e-3) in
        place; returns the fraction of bf16 weights that changed."""
        st = self.adam
        st["t"] += 1
        t, lr, rng = st["t"], np.float32(st["lr"]), st["rng"]
        changed = total = 0
        for k, a in self.sd.items():
            w, m, v = st["w"][k], st["m"][k], st["v"][k]
            g = rng.standard_normal(w.size, dtype=np.float32) * np.float32(1e-3)
            m *= np.float32(0.9)
            m += np.float32(0.1) * g
            v *= np.float32(0.999)
            v += np.float32(0.001) * g * g
            w -= lr * (m / np.float32(1 - 0.9 ** t)) / (np.sqrt(v / np.float32(1 - 0.999 ** t)) + np.float32(1e-8))
            new = w.astype(bf16())
            changed += int(np.count_nonzero(new.view(np.uint16) != a.view(np.uint16)))
            total += a.size
            a[:] = new
        return changed / total


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Reader:
    def __init__(self, sizes: List[int], name: str):
        self.params = {f"layer{i}.weight": tl.empty(n, bf16()) for i, n in enumerate(sizes)}
        for v in self.params.values():
            v.view(np.uint8)[:] = 0  # resident before the clock, as a model's parameters are
        self.rx = ws.WeightReceiver(self.params, name=name)

    def ready(self, warm: str = "") -> bool:
        return _ready(warm)

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def handle(self) -> ws.ReaderHandle:
        return self.rx.handle()

    def landing(self) -> str:
        return self.rx.landing()

    def sync(self) -> int:
        v = self.rx.wait(timeout=600)
        self.rx.done()
        return v

    def from_store(self, refs: List[Any]) -> bool:
        sd = ray.get(refs[0])
        for k, v in sd.items():
            np.copyto(self.params[k], v)
        return True

    def from_rdt(self, sd: Dict[str, Any]) -> bool:
        for k, v in sd.items():
            np.copyto(self.params[k], as_numpy(v))
        return True

    def zero(self) -> bool:
        for v in self.params.values():
            v.view(np.uint8)[:] = 0
        return True

    def crcs(self) -> Dict[str, int]:
        return crcs(self.params)


@ray.remote(num_cpus=0)
class Member:
    """A rank of the gloo broadcast: rank 0 holds the trainer's state dict
    (the same bytes), the others receive into their own tensors."""

    def __init__(self, sizes: List[int], rank: int):
        rng = np.random.default_rng(0)
        self.rank = rank
        self.params = {}
        for i, n in enumerate(sizes):
            a = np.empty(n, bf16())
            if rank == 0:
                a[:] = rng.standard_normal(n, dtype=np.float32).astype(bf16())
            else:
                a.view(np.uint8)[:] = 0
            self.params[f"layer{i}.weight"] = a
        self.ts = [as_torch(a) for a in self.params.values()]

    def join(self, world: int, group: str) -> bool:
        import ray.util.collective as col

        col.init_collective_group(world, self.rank, backend="gloo", group_name=group)
        col.barrier(group)
        return True

    def bcast(self, group: str) -> bool:
        import ray.util.collective as col

        for t in self.ts:
            col.broadcast(t, src_rank=0, group_name=group)
        return True

    def zero(self) -> bool:
        if self.rank:
            for v in self.params.values():
                v.view(np.uint8)[:] = 0
        return True

    def crcs(self) -> Dict[str, int]:
        return crcs(self.params)


#: Where actors go: Ray resources per role (two nodes), empty on one node.
PLACE: Dict[str, Dict[str, Any]] = {}


def placed(role: str) -> Dict[str, Any]:
    return {"resources": {PLACE[role]: 1}} if role in PLACE else {}


def reader_role(placement: str, i: int) -> str:
    """far: every reader on the node without the trainer; mixed: readers
    alternate, the first on the far node."""
    if placement == "mixed":
        return "far" if i % 2 == 0 else "near"
    return "far"


class Ctx:
    """The actors of one placement."""

    def __init__(self, trainer: Any, pool: List[Any]):
        self.trainer, self.pool = trainer, pool
        self.readers: List[Any] = []
        self.members: List[Any] = []
        self.group = ""


def timed_weightsync(c: Ctx) -> float:
    t0 = time.perf_counter()
    pending = [r.sync.remote() for r in c.readers]
    ray.get([c.trainer.publish.remote()] + pending)
    return time.perf_counter() - t0


def timed_store(c: Ctx) -> float:
    t0 = time.perf_counter()
    refs = ray.get(c.trainer.store.remote())
    ray.get([r.from_store.remote(refs) for r in c.readers])
    dt = time.perf_counter() - t0
    del refs
    return dt


def _timed_rdt(method: str) -> Callable[[Ctx], float]:
    def timed(c: Ctx) -> float:
        t0 = time.perf_counter()
        ref = getattr(c.trainer, method).remote()
        ray.get([r.from_rdt.remote(ref) for r in c.readers])
        dt = time.perf_counter() - t0
        del ref
        return dt

    return timed


def timed_bcast(c: Ctx) -> float:
    t0 = time.perf_counter()
    ray.get([m.bcast.remote(c.group) for m in c.members])
    return time.perf_counter() - t0


ROWS: Dict[str, Callable[[Ctx], float]] = {
    "weight sync": timed_weightsync,
    "store": timed_store,
    "TENSORLANE per reader": _timed_rdt("rdt"),
    "NIXL per reader": _timed_rdt("nixl"),
    "GLOO per reader": _timed_rdt("gloo"),
    "gloo broadcast": timed_bcast,
}
#: Ray's own ways (the goal compares weight sync with the best of them).
RAY_ROWS = ("store", "NIXL per reader", "GLOO per reader", "gloo broadcast")


def runnable(rows: List[str]) -> Dict[str, str]:
    """The rows this Python cannot run, and why."""
    out = {}
    for r in rows:
        if r in ("NIXL per reader", "GLOO per reader", "gloo broadcast") and not TORCH:
            out[r] = "torch is not installed (Ray's GLOO, NIXL and collectives move torch tensors)"
        elif r == "NIXL per reader" and not NIXL:
            out[r] = "nixl is not installed"
    return out


def verify(c: Ctx, who: Optional[List[Any]] = None) -> None:
    want = ray.get(c.trainer.crcs.remote())
    who = c.readers if who is None else who
    for i, got in enumerate(ray.get([r.crcs.remote() for r in who])):
        bad = [k for k in want if got[k] != want[k]]
        assert not bad, f"reader {i}: {len(bad)} tensors differ ({bad[:3]})"
    ray.get([r.zero.remote() for r in who])


def _register_rdt(actors: List[Any]) -> None:
    # Ray's own once-per-actor RDT set-up (the custom transports registered
    # on each actor), before the clock for every transport alike.
    rdt = ray._private.worker.global_worker.rdt_manager
    for a in actors:
        rdt.wait_until_custom_transports_registered(a)


def _tx() -> Optional[int]:
    """Bytes this node has sent on eth0 (two nodes: the driver runs in the
    head's namespace, where the trainer is, so this counts what crossed the
    shaped link toward far readers, Ray's own traffic included); None where
    there is no eth0."""
    try:
        with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return None


def _on_wire(fn: Callable[[Ctx], float], c: Ctx, wire: List[Any]) -> float:
    """fn(c), appending to wire the bytes the head sent meanwhile."""
    a = _tx()
    dt = fn(c)
    b = _tx()
    wire.append(None if a is None or b is None else b - a)
    return dt


def measure(sizes: List[int], counts: List[int], rows: List[str], reps: int, placements: List[str],
            two_node: bool = False) -> Dict[str, Any]:
    """Every row at every reader count and placement, in a connected
    driver; returns the samples, the trees and what failed."""
    if two_node:
        import raycluster

        PLACE.update({"trainer": raycluster.RESOURCE % "head", "near": raycluster.RESOURCE % "head",
                      "far": raycluster.RESOURCE % "worker"})
    skipped = runnable(rows)
    rows = [r for r in rows if r not in skipped]
    out: Dict[str, Any] = {"samples": {}, "trees": {}, "failed": {}, "skipped": skipped, "landing": {}, "load": {}}
    warm = "nixl" if "NIXL per reader" in rows else ""
    for placement in placements:
        samples: Dict[str, Dict[int, List[float]]] = {r: {} for r in rows}
        failed: Dict[str, str] = {}
        trainer = Trainer.options(**placed("trainer")).remote(sizes)
        # The gloo broadcast has actors of its own: alone, it needs no readers.
        pool = [] if rows == ["gloo broadcast"] else [
            Reader.options(**placed(reader_role(placement, i))).remote(sizes, f"reader{i}") for i in range(max(counts))]
        ray.get([a.ready.remote(warm) for a in [trainer] + pool])
        _register_rdt([trainer] + pool)
        if "GLOO per reader" in rows:
            try:
                from ray.experimental.collective import create_collective_group

                create_collective_group([trainer] + pool, backend="gloo")
            except Exception as e:
                failed["GLOO per reader"] = f"group: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
        handles = ray.get([r.handle.remote() for r in pool])
        out["landing"][placement] = ray.get([r.landing.remote() for r in pool])
        c = Ctx(trainer, pool)
        for n in counts:
            c.readers = pool[:n]
            ray.get(trainer.start.remote(handles[:n]))
            skip = set()
            if "gloo broadcast" in rows and "gloo broadcast" not in failed:
                try:
                    c.group = f"wsbcast{placement}{n}"
                    c.members = [Member.options(**placed("trainer")).remote(sizes, 0)] + [
                        Member.options(**placed(reader_role(placement, i))).remote(sizes, i + 1) for i in range(n)]
                    ray.get([m.join.remote(n + 1, c.group) for m in c.members], timeout=300)
                except Exception as e:
                    # This count only: its group of fresh actors did not form.
                    failed[f"gloo broadcast at {n}"] = f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"
                    skip.add("gloo broadcast")
            live = [r for r in rows if r not in failed and r not in skip]
            # Warm: one of each row before the clock, every reader's bytes
            # verified (weight sync at every count, the others at the first).
            for row in live:
                try:
                    ROWS[row](c)
                    if row == "gloo broadcast":
                        if n == counts[0]:
                            verify(Ctx(c.members[0], []), c.members[1:])
                    elif row == "weight sync" or n == counts[0]:
                        verify(c)
                except Exception as e:
                    failed[row] = f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"
            live = [r for r in rows if r not in failed and r not in skip]
            load = [os.getloadavg()[0]]
            for _ in range(reps):
                for row in live:
                    wire = out.setdefault("wire", {}).setdefault(f"{placement} {row}", {}).setdefault(str(n), [])
                    samples[row].setdefault(n, []).append(_on_wire(ROWS[row], c, wire))
            load.append(os.getloadavg()[0])
            out["load"][f"{placement} {n}"] = load
            if "weight sync" in live:
                out["trees"][f"{placement} {n}"] = ray.get(trainer.publish.remote())["tree"]
                ray.get([r.sync.remote() for r in c.readers])
            for m in c.members:
                ray.kill(m)
            c.members = []
            wires = {r: out["wire"][f"{placement} {r}"][str(n)] for r in live}
            partial({"placement": placement, "readers": n, "load": load, "failed": failed,
                     "samples": {r: samples[r][n] for r in live}, "wire": wires})
            print(f"{placement}, {n} readers (load {load[0]:.1f} -> {load[1]:.1f}): "
                  + ", ".join(f"{r} {statistics.median(samples[r][n]):.3f} s"
                              + (f" ({statistics.median(wires[r]) / 1e6:.0f} MB sent)" if None not in wires[r] else "")
                              for r in live), flush=True)
        ray.get(trainer.start.remote([]))
        for a in [trainer] + pool:
            ray.kill(a)
        out["samples"][placement] = samples
        out["failed"][placement] = failed
    return out


def measure_delta(sizes: List[int], counts: List[int], lrs: List[float], reps: int, two_node: bool = False) -> Dict[str, Any]:
    """The delta mode end to end (see the module doc), far placement."""
    if two_node:
        import raycluster

        PLACE.update({"trainer": raycluster.RESOURCE % "head", "far": raycluster.RESOURCE % "worker"})
    out: Dict[str, Any] = {}
    trainer = Trainer.options(**placed("trainer")).remote(sizes)
    pool = [Reader.options(**placed("far")).remote(sizes, f"reader{i}") for i in range(max(counts))]
    handles = ray.get([r.handle.remote() for r in pool])
    c = Ctx(trainer, pool)
    for lr in lrs:
        ray.get(trainer.adam_init.remote(lr))
        for n in counts:
            c.readers = pool[:n]
            ray.get(trainer.start.remote(handles[:n], True))
            timed_weightsync(c)  # the first version, whole: every reader holds it
            verify_kept(c)
            res: Dict[str, List[Any]] = {"delta": [], "full": [], "changed": [], "delta_bytes": [], "full_bytes": []}
            load = [os.getloadavg()[0]]
            for _ in range(reps):
                for mode in ("delta", "full"):
                    res["changed"].append(ray.get(trainer.adam_step.remote()))  # off the clock
                    a = _tx()
                    t0 = time.perf_counter()
                    pending = [r.sync.remote() for r in c.readers]
                    pub = trainer.publish.remote() if mode == "delta" else trainer.publish_full.remote()
                    r = ray.get([pub] + pending)[0]
                    res[mode].append(time.perf_counter() - t0)
                    b = _tx()
                    res.setdefault(f"{mode}_wire", []).append(None if a is None or b is None else b - a)
                    assert set(r["modes"].values()) == {mode}, r["modes"]
                    if mode == "delta":
                        res["delta_bytes"].append(r["delta_bytes"])
                        res.setdefault("delta_via", []).append(r["delta_via"])
                        res["full_bytes"].append(r["full_bytes"])
                    verify_kept(c)
            load.append(os.getloadavg()[0])
            d, f = statistics.median(res["delta"]), statistics.median(res["full"])
            db, fb = statistics.median(res["delta_bytes"]), statistics.median(res["full_bytes"])
            out[f"{lr:g} {n}"] = dict(res, lr=lr, readers=n, load=load)
            partial(out[f"{lr:g} {n}"])
            print(f"delta e2e lr {lr:g}, {n} readers (load {load[0]:.1f} -> {load[1]:.1f}): delta {d:.3f} s, full {f:.3f} s "
                  f"({f / d:.2f}x faster), {fb / db:.1f}x fewer bytes from the trainer per reader, "
                  f"{100 * statistics.median(res['changed']):.2f}% of weights changed", flush=True)
    for a in [trainer] + pool:
        ray.kill(a)
    return out


def partial(rec: Dict[str, Any]) -> None:
    """Appends a finished cell to WSYNC_PARTIAL (JSON lines), so a run cut
    short (a node out of memory on a shared machine) keeps what it measured."""
    path = os.environ.get("WSYNC_PARTIAL")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")


def verify_kept(c: Ctx) -> None:
    """verify() without zeroing (delta mode needs the readers' last version)."""
    want = ray.get(c.trainer.crcs.remote())
    for i, got in enumerate(ray.get([r.crcs.remote() for r in c.readers])):
        bad = [k for k in want if got[k] != want[k]]
        assert not bad, f"reader {i}: {len(bad)} tensors differ ({bad[:3]})"


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


def two_nodes(fn: Callable[..., Any], args: tuple, rate: str, object_store: int, slabs: bool) -> Any:
    """fn(*args, two_node=True) in the driver of a two-node cluster
    (python/tests/raycluster.py), links shaped to rate each way."""
    sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
    import raycluster

    import weightsync as me  # this file by name, so the driver imports it (not __main__)

    env = {"PYTHONPATH": os.pathsep.join([HERE, raycluster.PYTHON_DIR, raycluster.HERE]),
           "TENSORLANE_SLABS": "1" if slabs else "0",
           # gloo finds its interface by the host name, which no resolver knows here
           "GLOO_SOCKET_IFNAME": "eth0",
           # The nodes share one kernel: UCX (NIXL) would find its shared-
           # memory and cma transports between them and never touch the
           # shaped link. Two real hosts have only the network.
           "UCX_TLS": os.environ.get("UCX_TLS", "tcp")}
    for k in ("TENSORLANE_TRANSPORTS", "WSYNC_PARTIAL"):
        if os.environ.get(k) is not None:
            env[k] = os.environ[k]
    with raycluster.start(num_cpus=8, object_store=object_store, env=env) as c:
        if rate and rate != "0":
            c.shape(rate)
        return c.call(getattr(me, fn.__name__), *args, two_node=True, timeout=4 * 3600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delta", action="store_true", help="only the delta case (no Ray): bytes on the wire after an Adam step")
    ap.add_argument("--delta-e2e", action="store_true", help="the delta mode end to end against full syncs (Ray)")
    ap.add_argument("--lrs", default="1e-6,3e-6,1e-5")
    ap.add_argument("--total", default="1G")
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--readers", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2), help="2: trainer and readers on two Ray nodes")
    ap.add_argument("--rate", default="1gbit", help="two nodes: each link's rate (tc units; 0 = unshaped)")
    ap.add_argument("--placements", default="far", help="two nodes: far (readers on the other node), mixed (both)")
    ap.add_argument("--slabs", action="store_true", help="keep slab mode (same-host weights staged, copied in at wait)")
    ap.add_argument("--json")
    args = ap.parse_args()
    total, counts = parse_size(args.total), [int(x) for x in args.readers.split(",")]
    lrs = [float(x) for x in args.lrs.split(",")]
    if args.delta:
        res = delta_case(total, args.tensors, lrs)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"delta": res, "total_bytes": total, "tensors": args.tensors, "cpus": os.cpu_count(),
                           "loadavg": os.getloadavg()}, f, indent=1)
        return 0
    rows = [r.strip() for r in args.rows.split(",")]
    placements = [p.strip() for p in args.placements.split(",")] if args.nodes == 2 else ["one node"]
    sizes = shapes(total, args.tensors)
    load0 = os.getloadavg()
    if args.nodes == 2:
        store = max(1 << 30, 3 * total)
        if args.delta_e2e:
            res = two_nodes(measure_delta, (sizes, counts, lrs, args.reps), args.rate, store, args.slabs)
        else:
            res = two_nodes(measure, (sizes, counts, rows, args.reps, placements), args.rate, store, args.slabs)
    else:
        env = {"PYTHONPATH": os.pathsep.join([HERE, PKG]), "TENSORLANE_SLABS": "1" if args.slabs else "0"}
        for k in ("TENSORLANE_LIB", "TENSORLANE_TRANSPORTS"):
            if os.environ.get(k) is not None:
                env[k] = os.environ[k]
        ray.init(num_cpus=max(counts) + 2, include_dashboard=False, _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": env})
        try:
            res = measure_delta(sizes, counts, lrs, args.reps) if args.delta_e2e else \
                measure(sizes, counts, rows, args.reps, placements)
        finally:
            ray.shutdown()
    load1 = os.getloadavg()
    meta = {"total_bytes": total, "tensors": args.tensors, "readers": counts, "reps": args.reps, "nodes": args.nodes,
            "rate": args.rate if args.nodes == 2 else None, "host": platform.node(), "cpus": os.cpu_count(),
            "loadavg_before": load0, "loadavg_after": load1, "ray": ray.__version__,
            "torch": getattr(torch, "__version__", None)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta, results=res), f, indent=1, default=str)
    if not args.delta_e2e:
        report(res, rows, counts, meta)
    return 0


def report(res: Dict[str, Any], rows: List[str], counts: List[int], meta: Dict[str, Any]) -> None:
    gib = meta["total_bytes"] / (1 << 30)
    where = f"two nodes, links {meta['rate']}" if meta["nodes"] == 2 else "one node"
    for placement, samples in res["samples"].items():
        live = [r for r in rows if r in samples and samples[r]]
        med = {r: {n: statistics.median(v) for n, v in samples[r].items()} for r in live}
        loads = [x for k, v in res["load"].items() if k.startswith(placement) for x in v]
        print(f"\n### Weight sync: {gib:g} GiB in {meta['tensors']} tensors, {where}, readers {placement}, "
              f"{meta['cpus']} cores (load {min(loads):.1f}-{max(loads):.1f}); weights land {set(res['landing'][placement])}\n")
        print("| readers | " + " | ".join(live) + " |")
        print("|---|" + "---|" * len(live))
        for n in counts:
            cells = []
            for r in live:
                s = med[r].get(n)
                cells.append("-" if s is None else f"{s:.2f} s ({s / med[r][counts[0]]:.2f}x)")
            print(f"| {n} | " + " | ".join(cells) + " |")
        last = counts[-1]
        if "weight sync" in live and last in med["weight sync"]:
            w = med["weight sync"][last]
            ray_best = min((med[r][last], r) for r in live if r in RAY_ROWS and last in med[r]) if any(
                r in RAY_ROWS for r in live) else None
            print(f"\nweight sync at {last} readers over its 1 reader: {w / med['weight sync'][counts[0]]:.2f}x (goal <= 1.3x)"
                  + (f"; Ray's best at {last} ({ray_best[1]}) over weight sync: {ray_best[0] / w:.2f}x (goal >= 3x)"
                     if ray_best else ""))
        for r, why in {**res["skipped"], **res["failed"].get(placement, {})}.items():
            print(f"- {r}: not measured: {why}")
        for k, t in res["trees"].items():
            if k.startswith(placement):
                print(f"\ntree ({k} readers):\n{t}")


if __name__ == "__main__":
    sys.exit(main())
