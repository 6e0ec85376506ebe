"""Resharding: trainers hold shards of a tensor in one layout (FSDP rows
over several trainer actors), readers need another (tensor-parallel
columns); each reader receives exactly the byte ranges it needs from every
trainer that holds them.

The :class:`ReshardPlan` is computed once by the Go core (rdt/reshard) from
the two layouts, a static schedule reused every step: per (trainer shard,
reader shard) pair, the strided runs of bytes. A :class:`ReshardSender`
(one per trainer) packs its runs for each reader into a buffer published
once and pushes them all in one push batch (every trainer at once, not one
rank 0); a :class:`ReshardReceiver` (one per reader) holds one
flow-controlled slot per incoming move and scatters them into its shard when
all have landed. Only the planned bytes cross the wire; packing and
scattering are memory copies (numpy, strided).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib, errors
from ._runtime import Runtime, as_array
from ._runtime import runtime as _default_runtime
from .weightsync import PushResult, Slot, push_batch, wait_slots

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
    feeds, published once."""

    def __init__(self, plan: ReshardPlan, shard: int, *, runtime: Optional[Runtime] = None):
        if not 0 <= shard < len(plan.src_bytes):
            raise errors.InvalidArgument(f"trainer shard {shard} of {len(plan.src_bytes)}")
        self._rt = runtime if runtime is not None else _default_runtime()
        self.plan, self.shard = plan, shard
        self.moves = plan.out_of(shard)
        self._packs = [self._rt.empty(m["bytes"], np.uint8) for m in self.moves]
        self._refs = [self._rt.put(p) for p in self._packs]

    def send(self, shard: Any, slots: Mapping[Tuple[int, int], bytes], *, timeout: Optional[float] = None) -> List[PushResult]:
        """Packs this step's shard (row-major) and pushes every move into its
        reader's slot at once. ``slots``: the readers' :meth:`ReshardReceiver.slots`,
        merged. Raises the first move's error, if any."""
        src = _bytes_of(as_array(shard), self.plan.src_bytes[self.shard], f"trainer shard {self.shard}")
        dsts = []
        for m, pack in zip(self.moves, self._packs):
            key = (m["src"], m["dst"])
            if key not in slots:
                raise errors.InvalidArgument(f"no slot for the move {key}")
            dsts.append(slots[key])
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

    def close(self) -> None:
        """Frees the pack buffers. Idempotent."""
        refs, self._refs = self._refs, []
        for ref in refs:
            try:
                self._rt.free(ref)
            except errors.Error:
                pass


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
