"""Resharding: trainers hold shards of a tensor in one layout (FSDP rows
over several trainer actors), readers need another (tensor-parallel
columns); each reader receives exactly the byte ranges it needs from every
trainer that holds them.

The :class:`ReshardPlan` is computed once by the Go core (rdt/reshard) from
the two layouts, a static schedule reused every step: per (trainer shard,
reader shard) pair, the strided runs of bytes. A :class:`ReshardSender`
(one per trainer) packs its runs for each reader into a buffer published
once and pushes them all in one push batch (every trainer at once, not one
rank 0); made ``over`` its shard's memory (an array from the runtime's
``empty``, updated in place by the trainer), it packs nothing and pushes
each move's runs straight from the shard (a gathered push: tcp and rdma
send the runs from it); a :class:`ReshardReceiver` (one per reader) holds one
flow-controlled slot per incoming move and scatters them into its shard when
all have landed. Only the planned bytes cross the wire; packing and
scattering are memory copies (numpy, strided).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib, errors
from ._runtime import Runtime, as_array
from ._runtime import runtime as _default_runtime
from .weightsync import PushResult, Slot, push, push_batch, wait_slots

#: A layout: ``("split", dimension, count)``, or a list of shard blocks,
#: each ``(start, end)`` per dimension.
LayoutArg = Union[Tuple[str, int, int], Sequence[Tuple[Sequence[int], Sequence[int]]]]


def rows(n: int) -> Tuple[str, int, int]:
    """FSDP-like: dimension 0 split over n holders."""
    return ("split", 0, n)


def cols(n: int, rank: int = 2) -> Tuple[str, int, int]:
    """Tensor-parallel columns: the last dimension split over n holders."""
    return ("split", rank - 1, n)


def _spec(layout: LayoutArg) -> Dict[str, Any]:
    if isinstance(layout, tuple) and len(layout) == 3 and layout[0] == "split":
        return {"split": [int(layout[1]), int(layout[2])]}
    try:
        return {"shards": [{"start": [int(x) for x in s], "end": [int(x) for x in e]} for s, e in layout]}
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"a layout is ('split', dim, n) or a list of (start, end) blocks, not {layout!r}") from None


class ReshardPlan:
    """The static plan from one layout of a tensor (``shape``, ``dtype``) to
    another. ``moves`` lists, per (src, dst) shard pair, the block, bytes
    and strided runs; :meth:`explain` draws it."""

    def __init__(self, shape: Sequence[int], dtype: Any, src: LayoutArg, dst: LayoutArg):
        self.shape = tuple(int(x) for x in shape)
        self.dtype = np.dtype(dtype)
        req = {"shape": list(self.shape), "elem_size": self.dtype.itemsize, "from": _spec(src), "to": _spec(dst)}
        p = json.loads(_lib.call_json(_lib.lib().tl_reshard_plan, json.dumps(req).encode()))
        self.moves: List[Dict[str, Any]] = p["moves"]
        self.src_bytes: List[int] = p["src_bytes"]
        self.dst_bytes: List[int] = p["dst_bytes"]
        self.bytes: int = p["bytes"]
        self._explain: str = p["explain"]

    def explain(self) -> str:
        """The plan, drawn: per reader shard, which trainer shards send which
        block as how many ranges."""
        return self._explain

    def into(self, dst: int) -> List[Dict[str, Any]]:
        """The moves into reader shard ``dst``."""
        return [m for m in self.moves if m["dst"] == dst]

    def out_of(self, src: int) -> List[Dict[str, Any]]:
        """The moves out of trainer shard ``src``."""
        return [m for m in self.moves if m["src"] == src]

    def block(self, box: Mapping[str, Sequence[int]]) -> Tuple[slice, ...]:
        """A block (a move's ``box``, or a shard's) as numpy slices."""
        return tuple(slice(s, e) for s, e in zip(box["start"], box["end"]))


def _bytes_of(a: np.ndarray, want: int, what: str) -> np.ndarray:
    if not a.flags.c_contiguous or a.nbytes != want:
        raise errors.InvalidArgument(f"{what}: a C-contiguous array of {want} bytes, not {a.nbytes} bytes")
    return a.reshape(-1).view(np.uint8)


def _runs(buf: np.ndarray, run: Mapping[str, int], side: str) -> np.ndarray:
    """The run's ranges in buf as a (count, len) strided view."""
    off, stride, n, count = run[f"{side}_off"], run[f"{side}_stride"], run["len"], run["count"]
    return np.lib.stride_tricks.as_strided(buf[off:], shape=(count, n), strides=(stride or n, 1))


class ReshardSender:
    """A trainer shard's side of a plan: one pack buffer per reader it
    feeds, published once; or, made ``over`` the shard's own memory, no
    pack buffer at all.

    ``over``: the trainer's shard (row-major, the plan's bytes), in memory
    this runtime allocated (``runtime.empty``), which the trainer updates in
    place between steps. The shard is published once as an object and every
    :meth:`send` pushes each move's strided runs straight from it
    (``weightsync.push(runs=...)``, one push per reader in parallel): no
    copy of the move is made (tcp and rdma send the runs from it, shm copies
    them straight into the reader's mapped slot). It must not change while a
    :meth:`send` runs."""

    def __init__(self, plan: ReshardPlan, shard: int, *, runtime: Optional[Runtime] = None, over: Any = None):
        if not 0 <= shard < len(plan.src_bytes):
            raise errors.InvalidArgument(f"trainer shard {shard} of {len(plan.src_bytes)}")
        self._rt = runtime if runtime is not None else _default_runtime()
        self.plan, self.shard = plan, shard
        self.moves = plan.out_of(shard)
        self._over: Optional[np.ndarray] = None
        self._runs: List[np.ndarray] = []
        self._pool: Optional[ThreadPoolExecutor] = None
        if over is not None:
            self._over = _bytes_of(as_array(over), plan.src_bytes[shard], f"trainer shard {shard}")
            self._keep = over
            self._packs: List[np.ndarray] = []
            self._refs = [self._rt.put(self._over)] if self.moves else []
            self._runs = [_pairs(m) for m in self.moves]
            if len(self.moves) > 1:
                self._pool = ThreadPoolExecutor(len(self.moves), thread_name_prefix="tensorlane-reshard")
            return
        self._packs = [self._rt.empty(m["bytes"], np.uint8) for m in self.moves]
        self._refs = [self._rt.put(p) for p in self._packs]

    def send(self, shard: Any, slots: Mapping[Tuple[int, int], bytes], *, timeout: Optional[float] = None) -> List[PushResult]:
        """Packs this step's shard (row-major) and pushes every move into its
        reader's slot at once. ``slots``: the readers' :meth:`ReshardReceiver.slots`,
        merged. Raises the first move's error, if any. Made ``over`` the
        shard, ``shard`` is that memory (or None) and nothing is packed."""
        dsts = []
        for m in self.moves:
            key = (m["src"], m["dst"])
            if key not in slots:
                raise errors.InvalidArgument(f"no slot for the move {key}")
            dsts.append(slots[key])
        if self._over is not None:
            if shard is not None:
                mem = _bytes_of(as_array(shard), self.plan.src_bytes[self.shard], f"trainer shard {self.shard}")
                if mem.__array_interface__["data"][0] != self._over.__array_interface__["data"][0]:
                    raise errors.InvalidArgument(f"trainer shard {self.shard}: not the memory the sender was made over")
            return self._send_runs(dsts, timeout)
        src = _bytes_of(as_array(shard), self.plan.src_bytes[self.shard], f"trainer shard {self.shard}")
        for m, pack in zip(self.moves, self._packs):
            at = 0
            for r in m["runs"]:
                k = r["count"] * r["len"]
                pack[at:at + k].reshape(r["count"], r["len"])[:] = _runs(src, r, "src")
                at += k
        if not self.moves:
            return []
        res = push_batch(self._refs, dsts, timeout=timeout, runtime=self._rt)
        for r in res:
            if r.error is not None:
                raise r.error
        return res

    def _send_runs(self, dsts: List[bytes], timeout: Optional[float]) -> List[PushResult]:
        """One gathered push per move, in parallel (each call leaves the GIL
        while the library moves the bytes); every push finishes before the
        first error is raised, so none is left writing a reader's slot."""
        if not self.moves:
            return []
        src = self._refs[0]

        def one(i: int) -> PushResult:
            return push(src, dsts[i], runs=self._runs[i], timeout=timeout, runtime=self._rt)

        if self._pool is None:
            return [one(0)]
        futures = [self._pool.submit(one, i) for i in range(len(self.moves))]
        errs = [f.exception() for f in futures]
        for e in errs:
            if e is not None:
                raise e
        return [f.result() for f in futures]

    def close(self) -> None:
        """Frees the pack buffers (or the shard's object; the shard's memory
        stays the caller's). Idempotent."""
        refs, self._refs = self._refs, []
        for ref in refs:
            try:
                self._rt.free(ref)
            except errors.Error:
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _pairs(m: Mapping[str, Any]) -> np.ndarray:
    """A move's runs in the source shard as (offset, length) pairs, in the
    order a pack lays them out (what the reader's slot expects)."""
    out = []
    for r in m["runs"]:
        offs = r["src_off"] + np.arange(r["count"], dtype=np.int64) * (r["src_stride"] or r["len"])
        out.append(np.stack([offs, np.full(r["count"], r["len"], np.int64)], axis=1))
    pairs = np.concatenate(out) if out else np.zeros((0, 2), np.int64)
    # Runs that touch coalesce (a row split that keeps whole rows): fewer
    # pieces for the path to walk.
    if len(pairs) > 1:
        ends = pairs[:-1, 0] + pairs[:-1, 1]
        starts = np.flatnonzero(np.concatenate([[True], pairs[1:, 0] != ends]))
        lens = np.add.reduceat(pairs[:, 1], starts)
        pairs = np.stack([pairs[starts, 0], lens], axis=1)
    return np.ascontiguousarray(pairs)


def _dst_range(m: Mapping[str, Any]) -> Optional[int]:
    """The move's offset in the reader's shard if its bytes lie there as one
    contiguous range, in the order the sender packs them; else None."""
    runs = m["runs"]
    if not runs:
        return None
    at = off = runs[0]["dst_off"]
    for r in runs:
        if r["dst_off"] != at or (r["count"] > 1 and r["dst_stride"] != r["len"]):
            return None
        at += r["count"] * r["len"]
    return off if at - off == m["bytes"] else None


class ReshardReceiver:
    """A reader shard's side of a plan: one flow-controlled slot per trainer
    shard that feeds it.

    With ``into`` (the reader's shard, for good: every :meth:`receive`
    passes it), each move that is one contiguous range of the shard (rows
    to columns: every move) gets its slot over that range, so trainers on
    other hosts write it in place and nothing is scattered; same-host
    trainers' bytes are staged and copied in at :meth:`receive`, as a
    scatter would. A move that lands in place writes the shard as it
    arrives: after an error the shard may hold part of the step."""

    def __init__(self, plan: ReshardPlan, shard: int, *, runtime: Optional[Runtime] = None, into: Any = None):
        if not 0 <= shard < len(plan.dst_bytes):
            raise errors.InvalidArgument(f"reader shard {shard} of {len(plan.dst_bytes)}")
        self._rt = runtime if runtime is not None else _default_runtime()
        self.plan, self.shard = plan, shard
        self.moves = plan.into(shard)
        self._into = None if into is None else _bytes_of(as_array(into), plan.dst_bytes[shard], f"reader shard {shard}")
        self._keep = into
        #: Per move: whether it lands in the shard itself.
        self.in_place: List[bool] = []
        self._slots: List[Slot] = []
        for m in self.moves:
            off = None if self._into is None else _dst_range(m)
            buf = np.empty(m["bytes"], np.uint8) if off is None else self._into[off:off + m["bytes"]]
            self._slots.append(Slot(buf, runtime=self._rt))
            self.in_place.append(off is not None)

    def slots(self) -> Dict[Tuple[int, int], bytes]:
        """This reader's slot refs by (trainer shard, reader shard): hand them
        to the senders."""
        return {(m["src"], m["dst"]): bytes(s.ref) for m, s in zip(self.moves, self._slots)}

    def receive(self, shard: Any, *, timeout: Optional[float] = None) -> None:
        """Waits until every move of the next step has landed, scatters those
        not landed in place into ``shard`` (row-major, written in place; with
        ``into``, that memory) and says done, so the step after can land. On
        a timeout ``shard`` is unchanged, but for moves landed in place."""
        dst = _bytes_of(as_array(shard), self.plan.dst_bytes[self.shard], f"reader shard {self.shard}")
        if self._into is not None and dst.__array_interface__["data"][0] != self._into.__array_interface__["data"][0]:
            raise errors.InvalidArgument(f"reader shard {self.shard}: not the memory the receiver was made over")
        wait_slots(self._slots, timeout=timeout)
        for m, s, inplace in zip(self.moves, self._slots, self.in_place):
            if inplace:
                continue
            buf, at = s.array, 0
            for r in m["runs"]:
                k = r["count"] * r["len"]
                _runs(dst, r, "dst")[:] = buf[at:at + k].reshape(r["count"], r["len"])
                at += k
        for s in self._slots:
            s.done()

    def close(self) -> None:
        """Closes the slots. Idempotent."""
        for s in self._slots:
            s.close()


__all__ = ["ReshardPlan", "ReshardSender", "ReshardReceiver", "rows", "cols"]
