"""Weight sync: one call from a trainer to a fleet of readers (inference
actors), landing in the readers' own parameters.

Two layers:

* The primitives of the C ABI: a reader reserves a :class:`Slot` over an
  array it already owns; a trainer :func:`push`\\ es an object into a slot,
  :func:`push_batch`\\ es many, or :func:`broadcast`\\ s a state dict to many
  readers' slots along a pipelined, topology-aware tree (an
  :class:`Operation` with progress that asyncio can await). A slot counts
  generations; a flow-controlled slot takes no new generation until its
  reader says :meth:`Slot.done`.
* Weight sync on top: each reader makes a :class:`WeightReceiver` over its
  parameters and hands its picklable :meth:`~WeightReceiver.handle` to the
  trainer's :class:`WeightPublisher`; :meth:`WeightPublisher.publish` sends
  a state dict to every reader in one call and returns a result per
  reader. Generations keep a reader from using a half-written state dict;
  a reader that joins late gets the latest one at once; dead readers are
  routed around within a broadcast and dropped after it; a streaming reader
  (:meth:`WeightReceiver.layers`) may use layer k while later layers still
  arrive. Each publish starts with a small mailbox per reader (the version,
  and whether the state dict comes whole or as a delta); in delta mode
  (``WeightPublisher(delta=True)``) readers that hold the last version get
  only what changed (:func:`delta_encode`: the changed words' XOR,
  entropy-coded), each checked against its parameter as it is applied and
  all reverted if any fails.

Nothing here needs Ray: handles and results are plain picklable values that
travel in Ray actor calls (``tensorlane.ray`` re-exports the classes). Where
bytes land: memory from :meth:`Runtime.empty` (without slab mode) is written
in place on every path; other memory (a model's numpy or torch CPU
tensors, slab memory) is written in place by network paths, and for
same-host writers into a staging allocation that :meth:`WeightReceiver.wait`
copies in, all slots together, so the parameters never hold a mix of
generations. docs/weightsync.md has the whole story.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from . import _lib, errors
from ._runtime import Ref, Runtime, as_array, tl_dtype
from ._runtime import runtime as _default_runtime

#: tl_slot_reserve's flag: the slot is flow-controlled.
SLOT_GENERATIONS = 1

#: Where a slot's bytes land (``Slot.info()["landing"]``).
LAND_IN_PLACE = "in place"
LAND_STAGED = "staged, copied in at wait"

# Room for one item's JSON result (capi.MaxItemJSON) and a slot's ref.
_ITEM_JSON = 1024
_REF_CAP = 2048

T = TypeVar("T")


def _ms(timeout: Optional[float]) -> int:
    """Seconds to the ABI's milliseconds (0: the runtime's default bound)."""
    if timeout is None:
        return 0
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"timeout {timeout!r}: want seconds") from None
    if not math.isfinite(t) or t < 0:
        raise errors.InvalidArgument(f"timeout {timeout}: want finite, non-negative seconds")
    return max(1, min(int(t * 1000), 2**62))


def _ref(r: Any) -> bytes:
    """A ref's bytes; anything else (an int would make zero bytes) is refused."""
    if not isinstance(r, (bytes, bytearray, memoryview)):
        raise errors.InvalidArgument(f"a ref is bytes, not {type(r).__name__}")
    return bytes(r)


def _b64(refs: Sequence[bytes]) -> List[str]:
    return [base64.b64encode(_ref(r)).decode("ascii") for r in refs]


def _error(d: Mapping[str, Any]) -> Optional[errors.Error]:
    """The exception a JSON result's kind and message stand for, or None."""
    kind = d.get("kind")
    if not kind:
        return None
    return errors.BY_KIND.get(kind, errors.Other)(d.get("error") or kind)


def _rt(rt: Optional[Runtime]) -> Runtime:
    return rt if rt is not None else _default_runtime()


def _writable(x: Any) -> Tuple[np.ndarray, str]:
    """A writable C-contiguous numpy view of x and its tensorlane dtype."""
    a = as_array(x)
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise errors.InvalidArgument(
            f"a slot needs a writable C-contiguous array (shape {a.shape}, strides {a.strides}, "
            f"writeable {a.flags.writeable})"
        )
    if a.nbytes == 0:
        raise errors.InvalidArgument(f"empty array (shape {a.shape}): nothing to reserve")
    name = "bfloat16" if str(getattr(x, "dtype", "")) == "torch.bfloat16" else tl_dtype(a.dtype)
    return a, name


# ---------------------------------------------------------------------------
# Slots


class Slot:
    """Memory a reader already owns (a parameter), reserved for owners to
    push into. Hand :attr:`ref` to the trainer. With ``generations`` (the
    default) the slot takes no new generation until :meth:`done`. The slot
    keeps ``array`` alive until :meth:`close`."""

    def __init__(self, array: Any, *, generations: bool = True, runtime: Optional[Runtime] = None):
        self._rt = _rt(runtime)
        a, name = _writable(array)
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        h = ctypes.c_uint64(0)
        out = ctypes.create_string_buffer(_REF_CAP)
        n = ctypes.c_size_t(0)
        ptr = a.__array_interface__["data"][0]
        _lib.check(_lib.lib().tl_slot_reserve(self._rt._h(), ptr, a.nbytes, name.encode(), a.ndim, shape, None,
                                              SLOT_GENERATIONS if generations else 0, ctypes.byref(h), out,
                                              _REF_CAP, ctypes.byref(n)))
        self._handle = h.value
        self._array = array  # the caller's object: alive while the slot is
        self._np = a
        self.ref = Ref(out.raw[: n.value])
        #: The last generation :meth:`wait` returned.
        self.generation = 0

    @property
    def array(self) -> Any:
        """The array the slot writes into."""
        return self._array

    def _h(self) -> int:
        if not self._handle:
            raise errors.Closed("tensorlane: slot closed")
        return self._handle

    def wait(self, after: Optional[int] = None, timeout: Optional[float] = None) -> int:
        """Waits for a generation after ``after`` (default: the last one this
        returned) and returns it; its bytes are in :attr:`array` then."""
        if after is None:
            after = self.generation
        g = ctypes.c_uint64(0)
        _lib.check(_lib.lib().tl_slot_wait(self._rt._h(), self._h(), after, _ms(timeout), ctypes.byref(g)))
        self.generation = max(self.generation, g.value)
        return g.value

    def done(self, gen: Optional[int] = None) -> None:
        """Says the reader is done with generation ``gen`` (default: the last
        one :meth:`wait` returned): the slot takes the next, and its writer
        is told."""
        _lib.check(_lib.lib().tl_slot_done(self._rt._h(), self._h(), self.generation if gen is None else gen))

    def info(self) -> Dict[str, Any]:
        """generation, done, landed, landing (:data:`LAND_IN_PLACE` or
        :data:`LAND_STAGED`), nbytes."""
        return json.loads(_lib.call_json(_lib.lib().tl_slot_info, self._rt._h(), self._h()))

    def close(self) -> None:
        """Unregisters the slot (later pushes fail: ObjectNotFound).
        Idempotent."""
        h, self._handle = self._handle, 0
        if h and self._rt._handle:
            _lib.check(_lib.lib().tl_slot_close(self._rt._h(), h))

    def __enter__(self) -> "Slot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Slot({self._np.dtype}{list(self._np.shape)}, generation {self.generation})"


def wait_slots(slots: Sequence[Slot], *, after: Optional[Sequence[int]] = None,
               timeout: Optional[float] = None) -> List[int]:
    """Waits until every slot holds a generation after ``after[i]`` (default:
    each slot's last) and only then lands the staged ones, so the set lands
    together or not at all (on an error no array changed). All slots must be
    of one runtime. Returns each slot's generation."""
    if not slots:
        raise errors.InvalidArgument("no slots to wait for")
    rt = slots[0]._rt
    if any(s._rt is not rt for s in slots):
        raise errors.InvalidArgument("slots of different runtimes")
    n = len(slots)
    hs = (ctypes.c_uint64 * n)(*[s._h() for s in slots])
    af = (ctypes.c_uint64 * n)(*[(s.generation if after is None else after[i]) for i, s in enumerate(slots)])
    gens = (ctypes.c_uint64 * n)()
    _lib.check(_lib.lib().tl_slots_wait(rt._h(), hs, af, n, _ms(timeout), gens))
    out = list(gens)
    for s, g in zip(slots, out):
        s.generation = max(s.generation, g)
    return out


# ---------------------------------------------------------------------------
# Pushes


@dataclass
class PushResult:
    """One push's outcome: the transport, bytes, seconds, how many items
    moved together with it (coalesced) and shared its notice (notified),
    and the error (None: the slot holds the object)."""

    transport: str = ""
    bytes: int = 0
    seconds: float = 0.0
    coalesced: int = 0
    notified: int = 0
    degraded: bool = False
    error: Optional[errors.Error] = None

    @property
    def ok(self) -> bool:
        """Whether the push landed."""
        return self.error is None

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "PushResult":
        return cls(transport=d.get("transport", ""), bytes=int(d.get("bytes", 0)), seconds=float(d.get("seconds", 0.0)),
                   coalesced=int(d.get("coalesced", 0)), notified=int(d.get("notified", 0)),
                   degraded=bool(d.get("degraded", False)), error=_error(d))


def push(src: bytes, slot: bytes, *, runs: Optional[Any] = None, timeout: Optional[float] = None,
         runtime: Optional[Runtime] = None) -> PushResult:
    """Writes the object ``src`` (a ref this runtime published) into the slot
    ``slot`` (a slot's ref); raises on failure.

    ``runs``, (offset, length) pairs (a sequence of pairs or an (n, 2)
    integer array; offsets from the object's first byte), pushes their
    concatenation instead, in order, which must fill the slot exactly: a
    resharded shard's strided rows, say, with no pack buffer. tcp, rdma and
    shm send them from the object; a path that cannot packs them first (counted in
    ``tensorlane_gather_packed_total``). Runs that leave the object or do not
    fill the slot raise :class:`errors.BadRequest`."""
    rt = _rt(runtime)
    src, slot = _ref(src), _ref(slot)
    out = ctypes.create_string_buffer(_ITEM_JSON + 1024)
    n = ctypes.c_size_t(0)
    if runs is None:
        _lib.check(_lib.lib().tl_push(rt._h(), src, len(src), slot, len(slot), _ms(timeout), out, len(out),
                                      ctypes.byref(n)))
        return PushResult._from(json.loads(out.value.decode()))
    try:
        r = np.ascontiguousarray(np.asarray(runs, dtype=np.int64).reshape(-1, 2))
    except (TypeError, ValueError) as e:
        raise errors.InvalidArgument(f"runs: not (offset, length) pairs of integers: {e}") from None
    if len(r) == 0:
        raise errors.InvalidArgument("runs: no (offset, length) pairs")
    _lib.check(_lib.lib().tl_push_runs(rt._h(), src, len(src), slot, len(slot),
                                       r.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(r), _ms(timeout),
                                       out, len(out), ctypes.byref(n)))
    return PushResult._from(json.loads(out.value.decode()))


def push_batch(srcs: Sequence[bytes], slots: Sequence[bytes], *, parallel: int = 0, timeout: Optional[float] = None,
               runtime: Optional[Runtime] = None) -> List[PushResult]:
    """Pushes srcs[i] into slots[i] for every i at once (coalesced per path
    and destination, one notice per destination runtime). Each item's
    failure is in its result."""
    if len(srcs) != len(slots) or not srcs:
        raise errors.InvalidArgument(f"push batch of {len(srcs)} sources and {len(slots)} slots")
    rt = _rt(runtime)
    req = json.dumps({"srcs": _b64(srcs), "dsts": _b64(slots), "parallel": parallel}).encode()
    size = 4096 + _ITEM_JSON * len(srcs)
    out = ctypes.create_string_buffer(size)
    n = ctypes.c_size_t(0)
    _lib.check(_lib.lib().tl_push_batch(rt._h(), req, _ms(timeout), out, size, ctypes.byref(n)))
    return [PushResult._from(d) for d in json.loads(out.value.decode())]


def wait_consumed(slot: bytes, gen: int, *, timeout: Optional[float] = None, runtime: Optional[Runtime] = None) -> None:
    """Waits until the reader of ``slot`` said done with generation ``gen``;
    raises :class:`~tensorlane.errors.ReaderDied` if it died."""
    rt = _rt(runtime)
    slot = _ref(slot)
    if not isinstance(gen, int) or gen < 0 or gen >= 2**64:
        raise errors.InvalidArgument(f"generation {gen!r}")
    _lib.check(_lib.lib().tl_wait_consumed(rt._h(), slot, len(slot), gen, _ms(timeout)))


# ---------------------------------------------------------------------------
# Broadcasts and asynchronous operations


@dataclass
class ReaderResult:
    """One reader's outcome of a broadcast: who fed it in the end (``fed``:
    "owner" or "reader N"), over which path, whether it was re-parented
    around a dead or failing parent, the slot generation per object, and
    the error (None: every slot holds its object, verified)."""

    index: int
    parent: int = -1
    fed_by: int = -1
    fed: str = ""
    path: str = ""
    reparented: bool = False
    generations: List[int] = field(default_factory=list)
    error: Optional[errors.Error] = None

    @property
    def ok(self) -> bool:
        """Whether the reader got the whole batch."""
        return self.error is None


@dataclass
class BroadcastResult:
    """A broadcast's outcome: readers that got it, bytes per reader,
    seconds, the tree it followed (drawn), a result per reader, and per
    object why it was left out (None: sent)."""

    ok: int
    bytes: int
    seconds: float
    tree: str
    readers: List[ReaderResult]
    items: List[Optional[errors.Error]]
    plan: Dict[str, Any]

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> "BroadcastResult":
        readers = [
            ReaderResult(index=i, parent=r["parent"], fed_by=r["fed_by"], fed=r["fed"], path=r["path"],
                         reparented=r["reparented"], generations=list(r["generations"]), error=_error(r))
            for i, r in enumerate(d.get("readers") or [])
        ]
        return cls(ok=int(d["ok"]), bytes=int(d["bytes"]), seconds=float(d["seconds"]), tree=d["tree"], readers=readers,
                   items=[_error(x) for x in d.get("items") or []], plan=d.get("plan") or {})


@dataclass
class Progress:
    """Bytes done of total (all readers together), and whether it ended."""

    done: int
    total: int
    finished: bool


class Operation(Generic[T]):
    """An operation in flight (a broadcast): :meth:`progress`,
    :meth:`result` (blocking, bounded), ``await op`` in asyncio,
    :meth:`cancel`, :meth:`close`."""

    def __init__(self, rt: Runtime, op: int, decode: Callable[[Dict[str, Any]], T]):
        self._rt, self._op, self._decode = rt, op, decode
        self._result: Optional[T] = None

    def _h(self) -> int:
        if not self._op:
            raise errors.Closed("tensorlane: operation closed")
        return self._op

    def progress(self) -> Progress:
        """Bytes done so far, of the total."""
        d, t, f = ctypes.c_int64(0), ctypes.c_int64(0), ctypes.c_int32(0)
        _lib.check(_lib.lib().tl_op_progress(self._rt._h(), self._h(), ctypes.byref(d), ctypes.byref(t), ctypes.byref(f)))
        return Progress(done=d.value, total=t.value, finished=bool(f.value))

    def done(self) -> bool:
        """Whether the operation has ended."""
        return self._result is not None or self.progress().finished

    def result(self, timeout: Optional[float] = None) -> T:
        """Waits (up to ``timeout`` seconds; None: the operation's own bound)
        for the result; raises Timeout if the wait ran out (the operation
        goes on), or the operation's error."""
        if self._result is None:
            s = _lib.call_json(_lib.lib().tl_op_wait, self._rt._h(), self._h(), _ms(timeout))
            self._result = self._decode(json.loads(s))
        return self._result

    async def wait_async(self, poll: float = 0.2) -> T:
        """The result, for asyncio: waits in short slices on the default
        executor, so a cancelled task frees its thread within ``poll``
        seconds."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return await loop.run_in_executor(None, self.result, poll)
            except errors.Timeout:
                continue

    def __await__(self):
        return self.wait_async().__await__()

    def wait_consumed(self, timeout: Optional[float] = None) -> None:
        """Waits until every reader the broadcast reached said done with its
        generation; a reader that died is not waited for (the error names
        it: ReaderDied)."""
        _lib.check(_lib.lib().tl_op_wait_consumed(self._rt._h(), self._h(), _ms(timeout)))

    def cancel(self) -> None:
        """Stops the operation (its result then says so). Idempotent."""
        if self._op:
            _lib.check(_lib.lib().tl_op_cancel(self._rt._h(), self._op))

    def close(self) -> None:
        """Cancels it if it still runs, waits for it to stop and forgets it.
        Idempotent."""
        op, self._op = self._op, 0
        if op and self._rt._handle:
            _lib.check(_lib.lib().tl_op_close(self._rt._h(), op))

    def __enter__(self) -> "Operation[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _broadcast_request(srcs: Sequence[bytes], readers: Sequence[Sequence[bytes]], chunk_size: Optional[int],
                       window: Optional[int], busy_wait: Optional[float]) -> bytes:
    if not srcs or not readers:
        raise errors.InvalidArgument(f"broadcast of {len(srcs)} objects to {len(readers)} readers")
    req: Dict[str, Any] = {"srcs": _b64(srcs), "readers": [_b64(r) for r in readers]}
    if chunk_size:
        req["chunk_size"] = int(chunk_size)
    if window:
        req["window"] = int(window)
    if busy_wait is not None:
        req["busy_wait_ms"] = _ms(busy_wait)
    return json.dumps(req).encode()


def broadcast(srcs: Sequence[bytes], readers: Sequence[Sequence[bytes]], *, chunk_size: Optional[int] = None,
              window: Optional[int] = None, busy_wait: Optional[float] = None, timeout: Optional[float] = None,
              runtime: Optional[Runtime] = None) -> Operation[BroadcastResult]:
    """Starts broadcasting a batch: ``srcs`` are this runtime's objects (a
    state dict, in order), ``readers[j]`` reader j's slots, one per source.
    The objects flow as one pipelined stream along a topology-aware tree
    (one cross-host edge per host, readers forward chunks as they land);
    a reader that dies mid-way is routed around. ``chunk_size`` (bytes) and
    ``window`` (chunks in flight per edge) tune the pipeline;
    ``busy_wait`` is how long a slot whose reader has not said done is
    waited for; ``timeout`` bounds the whole broadcast."""
    rt = _rt(runtime)
    req = _broadcast_request(srcs, readers, chunk_size, window, busy_wait)
    op = ctypes.c_uint64(0)
    _lib.check(_lib.lib().tl_broadcast_start(rt._h(), req, _ms(timeout), ctypes.byref(op)))
    return Operation(rt, op.value, BroadcastResult._from)


def explain_broadcast(srcs: Sequence[bytes], readers: Sequence[Sequence[bytes]], *,
                      runtime: Optional[Runtime] = None) -> Dict[str, Any]:
    """The tree a broadcast would follow: ``owner``, ``nodes`` (endpoint,
    parent, path, leader) and ``text`` (drawn)."""
    rt = _rt(runtime)
    req = _broadcast_request(srcs, readers, None, None, None)
    return json.loads(_lib.call_json(_lib.lib().tl_broadcast_explain, rt._h(), req))


# ---------------------------------------------------------------------------
# Delta mode


@dataclass
class Delta:
    """A delta from one version of a tensor to the next (rdt/delta): the
    encoded bytes, the tensor's size, and how many elements changed."""

    data: np.ndarray
    nbytes: int
    changed: int

    @property
    def ratio(self) -> float:
        """How many times fewer bytes than the tensor."""
        return self.nbytes / max(1, self.data.nbytes)


def delta_encode(prev: Any, cur: Any, *, advance: bool = False) -> Delta:
    """The delta that turns ``prev`` into ``cur`` (same dtype and size): the
    8-byte words that changed (a bit each, a bit per unchanged 32 KiB chunk)
    and their XOR with the previous version in entropy-coded byte planes,
    with checksums of both versions. Pays when the link is slower than the
    codec (about 1 GB/s a core here): on bf16 weights after one Adam step
    at lr 1e-6..1e-5 it is 10-50 times smaller than the tensor. With
    ``advance`` (``prev`` writable), ``prev`` becomes ``cur`` as well,
    copied while the encoder compares them rather than in a second pass."""
    p, c = as_array(prev), as_array(cur)
    if p.nbytes != c.nbytes or p.dtype.itemsize != c.dtype.itemsize:
        raise errors.InvalidArgument(f"delta of {c.dtype}[{c.nbytes} bytes] against {p.dtype}[{p.nbytes} bytes]")
    if not (p.flags.c_contiguous and c.flags.c_contiguous) or c.nbytes == 0:
        raise errors.InvalidArgument("delta needs non-empty C-contiguous arrays")
    if advance and not p.flags.writeable:
        raise errors.InvalidArgument("delta_encode(advance=True) writes prev: it is read-only")
    l = _lib.lib()
    out = np.empty(int(l.tl_delta_bound(c.nbytes)), np.uint8)
    n, ch = ctypes.c_int64(0), ctypes.c_int64(0)
    encode = l.tl_delta_encode_advance if advance else l.tl_delta_encode
    _lib.check(encode(p.__array_interface__["data"][0], c.__array_interface__["data"][0], c.nbytes,
                      c.dtype.itemsize, out.__array_interface__["data"][0], out.nbytes,
                      ctypes.byref(n), ctypes.byref(ch)))
    return Delta(data=out[: n.value].copy(), nbytes=c.nbytes, changed=ch.value)


def delta_codec_gbps() -> float:
    """How fast one core of this host runs the delta codec now, in GB/s of
    tensor per side (encoding and decoding n bytes take 2*n/rate): rdt/delta
    measures it on bf16 with 15% of the elements changed, at most every 30 s
    (as the tcp codec measures its own), so a loaded host reads slower."""
    return float(_lib.lib().tl_delta_codec_rate()) / 1e9


#: delta="auto"'s reasons, and whether each sends the delta.
DELTA_REASONS = {"link-faster": False, "codec-faster": True, "delta-faster": True, "delta-slower": False}


def delta_decision(full_bytes: int, link_gbps: float, codec_gbps: float,
                   delta_bytes: Optional[int] = None) -> Tuple[bool, str]:
    """``delta="auto"``'s rule, rdt/delta's ``Worth`` (the tcp codec's: use it
    when the link is slower than the codec, with the delta's ratio in it):
    the delta's bytes on the link plus encoding and decoding the whole state
    dict (``2 * full / codec``, overlapped with nothing) against the whole
    state dict on the link. Without ``delta_bytes`` it says whether encoding
    can pay at all: when the codec alone takes as long as the link
    ("link-faster") no delta wins and none is encoded. Returns (send the
    delta, the reason: a key of :data:`DELTA_REASONS`)."""
    if full_bytes <= 0 or link_gbps <= 0 or codec_gbps <= 0:
        return False, "link-faster"
    whole = full_bytes / link_gbps
    codec = 2 * full_bytes / codec_gbps
    if codec >= whole:
        return False, "link-faster"
    if delta_bytes is None:
        return True, "codec-faster"
    if delta_bytes / link_gbps + codec < whole:
        return True, "delta-faster"
    return False, "delta-slower"


def _delta_call(what: str, cfn: str, base: Any, delta: Any, writes: bool) -> None:
    """Runs the C codec's ``cfn`` on ``base`` (C-contiguous; writable when
    it ``writes``) and the delta's bytes (a :class:`Delta` or its bytes)."""
    b = as_array(base)
    if not b.flags.c_contiguous or (writes and not b.flags.writeable):
        raise errors.InvalidArgument(f"{what} needs a {'writable ' if writes else ''}C-contiguous array")
    d = np.ascontiguousarray(as_array(delta.data if isinstance(delta, Delta) else delta)).view(np.uint8)
    _lib.check(getattr(_lib.lib(), cfn)(b.__array_interface__["data"][0], b.nbytes,
                                        d.__array_interface__["data"][0], d.nbytes))


def delta_check(base: Any, delta: Any) -> None:
    """Raises LayoutMismatch unless ``base`` is the version the delta was
    made against (Corrupt if it is no delta); changes nothing."""
    _delta_call("delta_check", "tl_delta_check", base, delta, writes=False)


def delta_apply(base: Any, delta: Any) -> None:
    """Applies a delta (a :class:`Delta` or its bytes) to ``base`` in place.
    Raises LayoutMismatch when base is not the version the delta was made
    against (fetch the tensor whole), Corrupt when the delta is damaged;
    base is then unchanged."""
    _delta_call("delta_apply", "tl_delta_decode", base, delta, writes=True)


def delta_revert(base: Any, delta: Any) -> None:
    """Undoes :func:`delta_apply`: ``base`` must hold the delta's result
    (LayoutMismatch otherwise) and becomes the version the delta was made
    against, checked against the delta's checksum of it."""
    _delta_call("delta_revert", "tl_delta_revert", base, delta, writes=True)


# ---------------------------------------------------------------------------
# Weight sync


#: The mailbox: a small slot per reader, first in every publish, that says
#: what the publish is: {"v": version, "mode": "full" | "delta", "blob": ref}
#: (JSON, length-prefixed, zero-padded).
MAILBOX_BYTES = 2048


def _mail(version: int, mode: str, blob: Optional[bytes] = None, **extra: Any) -> np.ndarray:
    doc: Dict[str, Any] = {"v": version, "mode": mode, **extra}
    if blob is not None:
        doc["blob"] = base64.b64encode(bytes(blob)).decode("ascii")
    p = json.dumps(doc).encode()
    if len(p) + 4 > MAILBOX_BYTES:
        raise errors.Other(f"mailbox of {len(p)} bytes")
    out = np.zeros(MAILBOX_BYTES, np.uint8)
    out[:4] = np.frombuffer(len(p).to_bytes(4, "little"), np.uint8)
    out[4:4 + len(p)] = np.frombuffer(p, np.uint8)
    return out


_pool_lock = threading.Lock()
_pool_exec: Optional[Any] = None


def _pool() -> Any:
    """A thread pool for the delta codec (made on first use, one per
    process): ctypes releases the GIL, so tensors encode on all cores."""
    global _pool_exec
    with _pool_lock:
        if _pool_exec is None:
            import concurrent.futures
            import os

            _pool_exec = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                                               thread_name_prefix="tensorlane-delta")
        return _pool_exec


def _read_mail(a: np.ndarray) -> Dict[str, Any]:
    n = int.from_bytes(a[:4].tobytes(), "little")
    if not 0 < n <= MAILBOX_BYTES - 4:
        raise errors.Corrupt(f"mailbox of {n} bytes")
    return json.loads(a[4:4 + n].tobytes())


def _delta_area(total: int, fraction: float = 0.125) -> Tuple[int, int]:
    """(piece bytes, pieces) of a reader's delta area for a state dict of
    ``total`` bytes: ``fraction`` of it (a delta up to that size travels
    along the tree; a larger one is fetched from the trainer by each
    reader), in pieces of 4 KiB to 1 MiB (a delta is padded to whole
    pieces, so they stay small against the delta)."""
    if fraction <= 0 or total <= 0:
        return 0, 0
    piece = 4096
    while piece < (1 << 20) and piece * 64 < total:
        piece *= 2
    return piece, max(1, -(-int(total * fraction) // piece))


@dataclass(frozen=True)
class ReaderHandle:
    """What a trainer needs of a reader: its name, parameter names, and one
    slot ref per parameter (the mailbox slot first). Picklable: pass it in a
    Ray actor call."""

    name: str
    names: Tuple[str, ...]
    refs: Tuple[bytes, ...]
    nbytes: Tuple[int, ...]
    #: The delta area's slots (equal pieces of ``piece_bytes``): a delta
    #: that fits travels along the broadcast tree into them.
    pieces: Tuple[bytes, ...] = ()
    piece_bytes: int = 0

    @property
    def mailbox(self) -> bytes:
        """The mailbox slot's ref."""
        return self.refs[0]

    @property
    def params(self) -> Tuple[bytes, ...]:
        """The parameter slots' refs, in the order of :attr:`names`."""
        return self.refs[1:]


class WeightReceiver:
    """The reader side: slots over the reader's own parameters (a dict of
    numpy arrays, CPU torch tensors, DLPack or buffer-protocol objects).
    Hand :meth:`handle` to the trainer's :meth:`WeightPublisher.join`; then
    :meth:`wait` for each state dict, use it, and :meth:`done` before the
    next can land.

    ``delta_area``: the share of the parameters' bytes reserved (for good)
    for the publisher's deltas, which then come along the broadcast tree; a
    larger delta is fetched from the trainer instead. 0 reserves none (a
    publisher that sends whole state dicts only)."""

    def __init__(self, params: Mapping[str, Any], *, name: Optional[str] = None, runtime: Optional[Runtime] = None,
                 delta_area: float = 0.125):
        if not params:
            raise errors.InvalidArgument("no parameters to receive into")
        self._rt = _rt(runtime)
        self.name = name or f"reader-{id(self):x}"
        self._names = tuple(params)
        self._params = params
        self._mailbox = np.zeros(MAILBOX_BYTES, np.uint8)
        self._slots: List[Slot] = []
        self._pieces: List[Slot] = []
        self._piece_gen: List[int] = []  # per piece: the generation taken
        self._piece_held: List[Tuple[Slot, int]] = []  # pieces to say done with
        try:
            self._slots.append(Slot(self._mailbox, runtime=self._rt))
            for k in self._names:
                self._slots.append(Slot(params[k], runtime=self._rt))
            # The delta area (``delta_area`` of the parameters' bytes): a
            # publisher's delta that fits comes along the tree into it.
            self._piece_bytes, n = _delta_area(sum(int(s._np.nbytes) for s in self._slots[1:]), delta_area)
            for _ in range(n):
                self._pieces.append(Slot(self._rt.empty(self._piece_bytes, np.uint8), runtime=self._rt))
                self._piece_gen.append(0)
        except BaseException:
            self.close()
            raise
        self._mail_gen = 0  # the mailbox generation taken
        self._full = 0  # the parameter slots' generation landed
        self._full_done = 0  # the parameter slots' generation said done
        self._version = -1
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """The publisher's version of the state dict in the parameters (-1:
        none yet)."""
        return self._version

    def handle(self) -> ReaderHandle:
        """The picklable handle the trainer joins."""
        return ReaderHandle(name=self.name, names=self._names, refs=tuple(bytes(s.ref) for s in self._slots),
                            nbytes=tuple(int(s._np.nbytes) for s in self._slots[1:]),
                            pieces=tuple(bytes(s.ref) for s in self._pieces), piece_bytes=self._piece_bytes)

    def landing(self) -> str:
        """:data:`LAND_IN_PLACE` if every parameter is written in place, else
        :data:`LAND_STAGED` (some land in a staging buffer first and are
        copied in at :meth:`wait`)."""
        modes = {s.info()["landing"] for s in self._slots[1:]}
        return LAND_STAGED if LAND_STAGED in modes else LAND_IN_PLACE

    def _next_mail(self, timeout: Optional[float]) -> Dict[str, Any]:
        mbox = self._slots[0]
        gen = wait_slots([mbox], after=[self._mail_gen], timeout=timeout)[0]
        self._mail_gen = gen
        return _read_mail(self._mailbox)

    def _apply_delta(self, mail: Mapping[str, Any], timeout: Optional[float]) -> None:
        if mail.get("stream"):
            self._apply_stream(timeout)
            return
        if "pieces" in mail:
            # It came along the tree, into the delta area's first pieces.
            k, size = int(mail["pieces"]), int(mail["size"])
            if not 0 < k <= len(self._pieces) or size > k * self._piece_bytes:
                raise errors.Corrupt(f"a delta of {size} bytes in {k} pieces for an area of {len(self._pieces)}")
            blob = self._take_pieces(0, k, timeout)[:size]
            self._apply_blob(blob, list(self._names))
            return
        self._apply_fetched(mail["blob"], list(self._names), timeout)

    def _take_pieces(self, at: int, k: int, timeout: Optional[float]) -> np.ndarray:
        """Waits for pieces [at, at+k) of the delta area, notes them to say
        done with, and returns their bytes."""
        slots = self._pieces[at:at + k]
        gens = wait_slots(slots, after=self._piece_gen[at:at + k], timeout=timeout)
        self._piece_gen[at:at + k] = gens
        self._piece_held.extend(zip(slots, gens))
        if k == 1:
            return np.asarray(slots[0].array).reshape(-1).view(np.uint8)
        return np.concatenate([np.asarray(s.array).reshape(-1).view(np.uint8) for s in slots])

    def _apply_fetched(self, ref_b64: str, names: List[str], timeout: Optional[float]) -> List[Tuple[Any, Any]]:
        ref = base64.b64decode(ref_b64)
        blob = self._rt.get(ref, timeout=timeout).reshape(-1).view(np.uint8)
        try:
            return self._apply_blob(blob, names)
        finally:
            try:
                self._rt.release(ref)
            except errors.Error:
                pass

    def _apply_stream(self, timeout: Optional[float]) -> None:
        """A streamed delta: groups in consecutive pieces of the delta area,
        each applied as it lands; the index at the front of each group says
        how many pieces it fills and whether it is the last. If any group
        fails, every group applied is reverted."""
        applied: List[Tuple[Any, Any]] = []
        names: List[str] = []
        at = 0
        try:
            while True:
                if at >= len(self._pieces):
                    raise errors.Corrupt(f"a streamed delta past the delta area's {len(self._pieces)} pieces")
                first = self._take_pieces(at, 1, timeout)
                n = int.from_bytes(first[:4].tobytes(), "little")
                if not 0 < n <= first.nbytes - 4:
                    raise errors.Corrupt(f"a delta group's index of {n} bytes")
                head = json.loads(first[4:4 + n].tobytes())
                if "fetch" in head:
                    rest = list(self._names[len(names):])
                    applied += self._apply_fetched(head["fetch"], rest, timeout)
                    names += rest
                    break
                k, size = int(head["pieces"]), int(head["size"])
                if not 0 < k <= len(self._pieces) - at or size > k * self._piece_bytes:
                    raise errors.Corrupt(f"a delta group of {size} bytes in {k} pieces at piece {at}")
                blob = first if k == 1 else np.concatenate([first, self._take_pieces(at + 1, k - 1, timeout)])
                group = list(head["names"])
                if group != list(self._names[len(names):len(names) + len(group)]):
                    raise errors.LayoutMismatch("the delta's parameters are not this reader's")
                applied += self._apply_blob(blob[:size], group)
                names += group
                at += k
                if head["last"]:
                    break
            if names != list(self._names):
                raise errors.LayoutMismatch("the delta's parameters are not this reader's")
        except BaseException:
            self._revert(applied)
            raise

    @staticmethod
    def _revert(applied: List[Tuple[Any, Any]]) -> None:
        """Reverts the deltas applied (a later one failed)."""
        list(_pool().map(lambda pd: delta_revert(*pd), applied))

    def _apply_blob(self, blob: np.ndarray, names: List[str]) -> List[Tuple[Any, Any]]:
        """Applies the deltas of ``names`` in blob (a length-prefixed JSON
        index, then the deltas) and returns (parameter, delta) pairs. Each
        delta checks its base as it applies (one pass over the parameter);
        if any fails, the ones applied here are reverted and its error
        raised, so a reader whose parameters are not the last version ends
        with none of them changed (never a mix of two versions)."""
        n = int.from_bytes(blob[:4].tobytes(), "little")
        index = json.loads(blob[4:4 + n].tobytes())
        at = 4 + n
        if index["names"] != names:
            raise errors.LayoutMismatch("the delta's parameters are not this reader's")
        parts = []
        for k, size in zip(names, index["sizes"]):
            parts.append((self._params[k], blob[at:at + size]))
            at += size

        def one(pd: Tuple[Any, Any]) -> Optional[BaseException]:
            try:
                delta_apply(*pd)
                return None
            except errors.Error as e:
                return e

        failed = list(_pool().map(one, parts))
        if any(e is not None for e in failed):
            self._revert([pd for pd, e in zip(parts, failed) if e is None])
            raise next(e for e in failed if e is not None)
        return parts

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits until a whole new state dict has arrived and lands it in the
        parameters, all together (never a mix of two versions), and returns
        its version. Call :meth:`done` when the next may come. A delta
        (the publisher's delta mode) is fetched and applied to the
        parameters, which must hold the previous version (LayoutMismatch
        otherwise; the trainer then sends the whole state dict)."""
        with self._lock:
            mail = self._next_mail(timeout)
            if mail["mode"] == "delta":
                self._apply_delta(mail, timeout)
            else:
                gens = wait_slots(self._slots[1:], after=[self._full] * (len(self._slots) - 1), timeout=timeout)
                self._full = min(gens)
            self._version = int(mail["v"])
            return self._version

    def layers(self, timeout: Optional[float] = None) -> Iterator[Tuple[str, Any]]:
        """Streaming: yields (name, parameter) as each parameter of the next
        state dict lands, in the publisher's order, so layer k can be used
        while later layers still arrive. ``timeout`` bounds each layer.
        After the last, :attr:`version` is the new version; call
        :meth:`done` then."""
        with self._lock:
            mail = self._next_mail(timeout)
            if mail["mode"] == "delta":
                self._apply_delta(mail, timeout)
                for k in self._names:
                    yield k, self._params[k]
            else:
                after = self._full
                for k, s in zip(self._names, self._slots[1:]):
                    self._full = s.wait(after=after, timeout=timeout)
                    yield k, self._params[k]
            self._version = int(mail["v"])

    def done(self) -> None:
        """Says the reader is done with the state dict it holds: the next
        one may land (flow control); the publisher is told."""
        with self._lock:
            if self._mail_gen:
                self._slots[0].done(self._mail_gen)
            for slot, gen in self._piece_held:
                slot.done(gen)
            self._piece_held = []
            if self._full > self._full_done:  # a delta leaves the parameter slots as they were
                for s in self._slots[1:]:
                    s.done(self._full)
                self._full_done = self._full

    def close(self) -> None:
        """Closes the slots; later publishes skip this reader. Idempotent."""
        for s in self._slots + self._pieces:
            try:
                s.close()
            except errors.Error:
                pass
        self._slots, self._pieces = [], []

    def __enter__(self) -> "WeightReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class SyncResult:
    """One publish: its version, a result per reader (by name), the readers
    dropped as dead, and the broadcast's tree, bytes per reader and
    seconds. In delta mode, ``mode`` is "delta" for readers that were sent
    the delta (``delta_bytes`` against ``full_bytes``) and the rest got the
    whole state dict."""

    version: int
    readers: Dict[str, ReaderResult]
    dropped: List[str]
    seconds: float = 0.0
    bytes: int = 0
    tree: str = ""
    modes: Dict[str, str] = field(default_factory=dict)
    full_bytes: int = 0
    delta_bytes: int = 0
    #: How the delta went: "tree" (along the broadcast tree, into the
    #: readers' delta areas) or "fetch" (each reader read it from the
    #: trainer: it did not fit a reader's area); "" without a delta.
    delta_via: str = ""
    #: delta="auto"'s decision (a key of DELTA_REASONS) and the codec rate
    #: it weighed (GB/s per side, one core); "" and 0 otherwise.
    delta_reason: str = ""
    codec_gbps: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every reader got the state dict."""
        return all(r.ok for r in self.readers.values())

    def failed(self) -> Dict[str, errors.Error]:
        """The readers that did not get it, and why."""
        return {k: r.error for k, r in self.readers.items() if r.error is not None}


#: Errors after which a reader is dropped from later publishes (it rejoins
#: with a new handle): it is gone, not merely busy.
_DEAD_KINDS = frozenset({"reader_died", "peer_unreachable", "owner_died", "peer_closed", "stale_ref",
                         "object_not_found", "object_freed", "owner_closed", "closed"})


class WeightPublisher:
    """The trainer side: readers :meth:`join`; :meth:`publish` sends a state
    dict to all of them in one call along the broadcast tree.

    The publisher publishes each array of the state dict once and reuses
    its ref while the same array is passed again (an optimizer that steps
    in place), so keep the arrays unchanged while a publish runs (publish
    blocks until it is done). Arrays from :meth:`Runtime.empty` are sent
    with no copy on any path. ``busy_wait`` bounds how long a publish waits
    for readers that have not said done with the previous version (those
    still busy get SlotBusy in their result); ``timeout`` bounds a
    broadcast.

    Delta mode (``delta=True``, or ``"auto"``): the publisher keeps a copy of
    the last version, encodes the next against it (rdt/delta) and sends
    readers that hold the last version only the delta, which they fetch and
    apply; readers that missed it get the whole state dict. ``"auto"`` does
    so only when the delta beats the whole state dict at ``link_gbps`` (the
    readers' link, GB/s) with the codec at the rate this host measures
    (:func:`delta_codec_gbps`, re-measured every 30 s; ``codec_gbps`` fixes
    it instead), or at the rate this publisher measured encoding when that
    is slower (:func:`delta_decision`; ``SyncResult.delta_reason`` says
    what it decided and why). When even the codec alone is slower than the
    link, it does not encode.

    ``delta=True`` streams the delta along the tree in groups of about
    ``delta_stream`` bytes of tensors (64 MiB): group g+1 is encoded while
    group g is on the wire, and readers apply each group as it lands (the
    applied ones are reverted if a later one fails). 0 sends it as one blob
    after encoding all of it, as ``"auto"`` does (it decides by the whole
    delta's size).
    """

    def __init__(self, *, runtime: Optional[Runtime] = None, chunk_size: Optional[int] = None,
                 window: Optional[int] = None, busy_wait: float = 30.0, timeout: Optional[float] = None,
                 delta: Union[bool, str] = False, link_gbps: Optional[float] = None, codec_gbps: Optional[float] = None,
                 delta_stream: int = 64 << 20):
        if delta not in (False, True, "auto"):
            raise errors.InvalidArgument(f"delta={delta!r}: want False, True or 'auto'")
        if delta == "auto" and not link_gbps:
            raise errors.InvalidArgument("delta='auto' needs link_gbps, the readers' link rate")
        self._rt = _rt(runtime)
        self._chunk, self._window, self._busy, self._timeout = chunk_size, window, busy_wait, timeout
        self._delta, self._link, self._codec = delta, link_gbps, codec_gbps
        if delta_stream < 0:
            raise errors.InvalidArgument(f"delta_stream={delta_stream}: want bytes per group, or 0")
        self._stream = delta_stream
        self._codec_seen: Optional[float] = None  # GB/s of state dict encoded, as measured
        self._lock = threading.RLock()
        self._readers: Dict[str, ReaderHandle] = {}
        self._names: Optional[Tuple[str, ...]] = None
        self._sizes: Optional[Tuple[int, ...]] = None
        self._refs: Dict[str, Tuple[Tuple[int, int, int], Ref, Any]] = {}
        self._mail_full = np.zeros(MAILBOX_BYTES, np.uint8)
        self._mail_delta = np.zeros(MAILBOX_BYTES, np.uint8)
        self._mail_refs: Optional[Tuple[Ref, Ref]] = None
        self._mail_gen: Dict[str, int] = {}  # per reader: mailbox generations sent
        self._fresh: set = set()  # readers holding the last version
        self._prev: Optional[Dict[str, np.ndarray]] = None  # the last version (delta mode)
        self._blobs: List[Ref] = []  # the last two deltas: a reader may still fetch the previous one
        self._piece_src: List[Tuple[np.ndarray, Ref]] = []  # the delta's pieces, published once, rewritten per publish
        self._last: Optional[Operation[BroadcastResult]] = None
        #: The version of the last publish (0: none yet).
        self.version = 0

    def readers(self) -> List[str]:
        """The names of the readers that will get the next publish."""
        with self._lock:
            return list(self._readers)

    def _check(self, h: ReaderHandle) -> None:
        if len(h.refs) != len(h.names) + 1:
            raise errors.InvalidArgument(f"reader {h.name}: {len(h.refs)} slots for {len(h.names)} parameters")
        if self._names is not None and h.names != self._names:
            missing = set(self._names) ^ set(h.names)
            raise errors.LayoutMismatch(f"reader {h.name}: parameters differ from the state dict's (by {sorted(missing)[:5]}) "
                                        "or come in another order")
        if self._sizes is not None and h.nbytes != self._sizes:
            bad = [k for k, a, b in zip(h.names, h.nbytes, self._sizes) if a != b]
            raise errors.LayoutMismatch(f"reader {h.name}: parameters of other sizes than the state dict's: {bad[:5]}")

    def _mails(self) -> Tuple[Ref, Ref]:
        if self._mail_refs is None:
            self._mail_refs = (self._rt.put(self._mail_full), self._rt.put(self._mail_delta))
        return self._mail_refs

    def _full_srcs(self) -> List[Ref]:
        return [self._mails()[0]] + [self._refs[k][1] for k in self._names or ()]

    def join(self, handle: ReaderHandle, *, timeout: Optional[float] = None) -> Optional[ReaderResult]:
        """Adds a reader. If a state dict was published already, the reader
        gets the latest at once (a push batch into its slots) and the result
        says how that went; else None."""
        with self._lock:
            self._check(handle)
            self._readers[handle.name] = handle
            self._mail_gen[handle.name] = 0
            self._fresh.discard(handle.name)
            if not self.version:
                return None
            self._mail_full[:] = _mail(self.version, "full")
            res = push_batch(self._full_srcs(), handle.refs, timeout=timeout or self._timeout, runtime=self._rt)
            err = next((r.error for r in res if r.error is not None), None)
            rr = ReaderResult(index=len(self._readers) - 1, fed="owner", path=res[0].transport,
                              generations=[1 if r.ok else 0 for r in res[1:]], error=err)
            if err is None:
                self._mail_gen[handle.name] = 1
                self._fresh.add(handle.name)
            elif err.kind in _DEAD_KINDS:
                self._readers.pop(handle.name, None)
            return rr

    def resync(self, name: str) -> None:
        """The next publish sends reader ``name`` the whole state dict (after
        its wait raised LayoutMismatch on a delta: its parameters are not the
        last version)."""
        with self._lock:
            self._fresh.discard(name)

    def leave(self, name: str) -> None:
        """Removes a reader (idempotent)."""
        with self._lock:
            self._readers.pop(name, None)
            self._fresh.discard(name)

    def _ref(self, name: str, x: Any) -> Ref:
        a = as_array(x)
        key = (id(x), a.__array_interface__["data"][0], a.nbytes)
        old = self._refs.get(name)
        if old is not None and old[0] == key:
            return old[1]
        ref = self._rt.put(x)
        self._refs[name] = (key, ref, x)
        if old is not None:
            self._rt.free(old[1])
        return ref

    def explain(self) -> Dict[str, Any]:
        """The tree the next publish would follow (after one publish)."""
        with self._lock:
            if not self._refs or not self._readers:
                raise errors.InvalidArgument("explain needs a published state dict and a reader")
            return explain_broadcast(self._full_srcs(), [h.refs for h in self._readers.values()], runtime=self._rt)

    def _encode(self, state_dict: Mapping[str, Any], names: Optional[Sequence[str]] = None,
                piece: int = 0, last: bool = True, done: Sequence[Delta] = (),
                advanced: Optional[List[str]] = None) -> Tuple[np.ndarray, int, List[Delta]]:
        """The deltas of ``names`` (every tensor by default) against the last
        version, as one blob: a length-prefixed JSON index, then the deltas
        in order. With ``piece`` (a streamed group) the index also says how
        many pieces of that size the blob fills, its size, and whether it is
        the last group. ``done`` are the deltas of the first names, encoded
        already. The last version of each tensor encoded becomes this one
        as it is encoded (the codec copies it over during its compare) and
        its name goes to ``advanced``. Returns the blob, the tensors' bytes,
        and the deltas."""
        assert self._prev is not None and self._names is not None
        names = list(self._names if names is None else names)
        # One tensor per thread: the codec runs in Go with the GIL released.
        todo = names[len(done):]
        ds = list(done) + list(_pool().map(lambda k: delta_encode(self._prev[k], state_dict[k], advance=True), todo))
        if advanced is not None:
            advanced.extend(todo)
        head: Dict[str, Any] = {"names": names, "sizes": [d.data.nbytes for d in ds]}
        if piece:
            # Fixed-width fields: the index's length must not depend on them.
            head.update(pieces="0" * 10, size="0" * 16, last=last)
        index = json.dumps(head).encode()
        total = 4 + len(index) + sum(d.data.nbytes for d in ds)
        if piece:
            head.update(pieces=f"{-(-total // piece):010d}", size=f"{total:016d}")
            index = json.dumps(head).encode()
        blob = self._rt.empty(total, np.uint8)
        blob[:4] = np.frombuffer(len(index).to_bytes(4, "little"), np.uint8)
        blob[4:4 + len(index)] = np.frombuffer(index, np.uint8)
        at = 4 + len(index)
        for d in ds:
            blob[at:at + d.data.nbytes] = d.data
            at += d.data.nbytes
        return blob, sum(d.nbytes for d in ds), ds

    def _pieces(self, blob: np.ndarray, piece: int, k: int, at: int = 0) -> List[Ref]:
        """The refs of k pieces of ``piece`` bytes holding the blob (the
        last one padded), from piece ``at`` on: published once, rewritten in
        place each publish (publish blocks until its broadcasts are done)."""
        if self._piece_src and self._piece_src[0][0].nbytes != piece:
            for _, ref in self._piece_src:
                self._rt.free(ref)
            self._piece_src = []
        while len(self._piece_src) < at + k:
            a = self._rt.empty(piece, np.uint8)
            self._piece_src.append((a, self._rt.put(a)))
        flat = blob.reshape(-1).view(np.uint8)
        for i in range(k):
            part = flat[i * piece:(i + 1) * piece]
            self._piece_src[at + i][0][:part.nbytes] = part
        return [ref for _, ref in self._piece_src[at:at + k]]

    def _groups(self) -> List[List[str]]:
        """The streamed delta's groups: consecutive tensors of about
        ``delta_stream`` bytes each."""
        assert self._names is not None and self._sizes is not None
        out: List[List[str]] = [[]]
        acc = 0
        for k, n in zip(self._names, self._sizes):
            if out[-1] and acc + n > self._stream:
                out.append([])
                acc = 0
            out[-1].append(k)
            acc += n
        return out

    def _stream_delta(self, state_dict: Mapping[str, Any], readers: List[ReaderHandle],
                      timeout: Optional[float], advanced: List[str]) -> Tuple[int, float, int, str, Dict[str, ReaderResult], str]:
        """Delta mode along the tree, streamed: the tensors go in groups, one
        broadcast each into consecutive pieces of the readers' delta areas;
        group g+1 is encoded while group g is on the wire (the broadcast
        runs in Go), and a reader applies each group as it lands. A group
        that would not fit what is left of the area goes, with every tensor
        after it, as one blob each reader fetches (its index, in one piece,
        names it). Returns the delta's bytes, seconds, bytes moved, the
        first tree, a result per reader, and how it went ("tree", or
        "tree+fetch" when part of it was fetched)."""
        piece, area = readers[0].piece_bytes, min(len(h.pieces) for h in readers)
        self._mail_delta[:] = _mail(self.version, "delta", stream=True)
        groups = self._groups()
        ops: List[Any] = []
        at, blob_bytes, t0, via = 0, 0, time.perf_counter(), "tree"
        try:
            for g, names in enumerate(groups):
                last = g == len(groups) - 1
                blob, _, ds = self._encode(state_dict, names, piece=piece, last=last, advanced=advanced)
                k = -(-int(blob.nbytes) // piece)
                if at + k + (0 if last else 1) > area:
                    # It does not fit (with a piece kept for a later group's
                    # index): this group and the rest, fetched (this
                    # group's deltas as they are, the rest encoded now).
                    rest = [n for gg in groups[g:] for n in gg]
                    if len(rest) > len(names):
                        blob, _, _ = self._encode(state_dict, rest, done=ds, advanced=advanced)
                    fetched = int(blob.nbytes)
                    self._blobs.append(self._rt.put(blob))
                    if len(self._blobs) > 2:
                        self._rt.free(self._blobs.pop(0))
                    head = json.dumps({"fetch": base64.b64encode(bytes(self._blobs[-1])).decode(), "last": True,
                                       "pieces": f"{1:010d}"}).encode()
                    blob = np.zeros(4 + len(head), np.uint8)
                    blob[:4] = np.frombuffer(len(head).to_bytes(4, "little"), np.uint8)
                    blob[4:] = np.frombuffer(head, np.uint8)
                    blob_bytes += fetched
                    k, last, via = 1, True, "tree+fetch"
                blob_bytes += int(blob.nbytes)
                srcs = ([self._mails()[1]] if g == 0 else []) + self._pieces(blob, piece, k, at)
                dsts = [([h.mailbox] if g == 0 else []) + list(h.pieces[at:at + k]) for h in readers]
                ops.append(broadcast(srcs, dsts, chunk_size=self._chunk, window=self._window, busy_wait=self._busy,
                                     timeout=timeout or self._timeout, runtime=self._rt))
                at += k
                if last:
                    break
            results = [op.result() for op in ops]
        finally:
            for op in ops:
                op.close()
        out: Dict[str, ReaderResult] = {}
        for i, h in enumerate(readers):
            rrs = [r.readers[i] for r in results]
            out[h.name] = next((rr for rr in rrs if not rr.ok), rrs[0])
        return blob_bytes, time.perf_counter() - t0, sum(r.bytes for r in results), results[0].tree, out, via

    def publish(self, state_dict: Mapping[str, Any], *, timeout: Optional[float] = None) -> SyncResult:
        """Sends the state dict to every reader (one broadcast along the tree;
        in delta mode, the delta to readers that hold the last version) and
        returns a result per reader. Readers that died are routed around and
        dropped; readers still busy with the previous version (not done
        within ``busy_wait``) keep it and get SlotBusy."""
        with self._lock:
            try:
                return self._publish(state_dict, timeout)
            except BaseException:
                # The last version may be partly this one now: no reader
                # holds it, so the next publish sends whole state dicts.
                self._fresh.clear()
                raise

    def _publish(self, state_dict: Mapping[str, Any], timeout: Optional[float]) -> SyncResult:
        """publish's body, under its lock."""
        advanced: List[str] = []  # tensors whose last version the codec made this one as it encoded
        names = tuple(state_dict)
        if not names:
            raise errors.InvalidArgument("an empty state dict")
        if self._names is None:
            self._names = names
            self._sizes = tuple(int(as_array(state_dict[k]).nbytes) for k in names)
            for h in list(self._readers.values()):
                self._check(h)
        elif names != self._names:
            raise errors.LayoutMismatch("the state dict's keys differ from the first publish's (or their order)")
        srcs = [self._ref(k, state_dict[k]) for k in names]
        self.version += 1
        handles = list(self._readers.values())
        full_bytes = sum(self._sizes or ())
        # Delta mode: readers that hold the last version get the delta.
        delta_readers: List[ReaderHandle] = []
        blob_bytes = 0
        # Encode only for readers that hold the last version: with none
        # (all new or resynced) the delta would be made for nobody.
        out: Dict[str, ReaderResult] = {}
        modes: Dict[str, str] = {}
        dropped: List[str] = []
        seconds, nbytes, tree, via = 0.0, 0, "", ""
        streamed = False
        reason, codec = "", 0.0
        fresh = [h for h in handles if h.name in self._fresh]
        if self._delta is True and self._prev is not None and fresh and self._stream and \
                fresh[0].piece_bytes and all(h.piece_bytes == fresh[0].piece_bytes and len(h.pieces) >= 2 for h in fresh):
            # Streamed along the tree (see _stream_delta).
            delta_readers, streamed = fresh, True
            blob_bytes, seconds, nbytes, tree, res, via = self._stream_delta(state_dict, fresh, timeout, advanced)
            out.update(res)
            modes.update({h.name: "delta" for h in fresh})
        elif self._delta and self._prev is not None and fresh:
            if self._delta == "auto":
                # The host's codec as measured now (or as configured), and
                # as this publisher saw it encode, the slower: a loaded
                # host's codec can be slower than its link.
                codec = self._codec if self._codec else delta_codec_gbps()
                if self._codec_seen is not None:
                    codec = min(codec, self._codec_seen)
                worth, reason = delta_decision(full_bytes, self._link, codec)
            if self._delta is True or worth:
                t0 = time.perf_counter()
                blob, _, _ = self._encode(state_dict, advanced=advanced)
                seen = full_bytes / max(time.perf_counter() - t0, 1e-9) / 1e9
                # Encoding as seen (smoothed).
                self._codec_seen = seen if self._codec_seen is None else (self._codec_seen + seen) / 2
                blob_bytes = int(blob.nbytes)
                if self._delta == "auto":
                    codec = min(codec, self._codec_seen)
                    worth, reason = delta_decision(full_bytes, self._link, codec, blob_bytes)
                if self._delta is True or worth:
                    delta_readers = fresh
            elif self._codec_seen is not None:
                # Not encoding: forget the old sighting slowly, so a host
                # whose load passed may try the delta again.
                self._codec_seen *= 2
        full_readers = [h for h in handles if h not in delta_readers]
        if delta_readers and not streamed:
            piece = delta_readers[0].piece_bytes
            k = -(-blob_bytes // piece) if piece else 0
            if piece and all(h.piece_bytes == piece and len(h.pieces) >= k for h in delta_readers):
                # Along the tree: one copy per host, as the full state dict.
                via = "tree"
                self._mail_delta[:] = _mail(self.version, "delta", pieces=k, size=blob_bytes)
                op = broadcast([self._mails()[1]] + self._pieces(blob, piece, k),
                               [[h.mailbox] + list(h.pieces[:k]) for h in delta_readers], chunk_size=self._chunk,
                               window=self._window, busy_wait=self._busy, timeout=timeout or self._timeout,
                               runtime=self._rt)
                try:
                    res = op.result()
                finally:
                    op.close()
                seconds, nbytes, tree = res.seconds, res.bytes, res.tree
                for h, rr in zip(delta_readers, res.readers):
                    out[h.name] = rr
                    modes[h.name] = "delta"
            else:
                via = "fetch"
                self._blobs.append(self._rt.put(blob))
                if len(self._blobs) > 2:
                    self._rt.free(self._blobs.pop(0))
                self._mail_delta[:] = _mail(self.version, "delta", self._blobs[-1])
                mref = self._mails()[1]
                for h in delta_readers:
                    # The reader says done with the last mailbox before the next lands.
                    try:
                        wait_consumed(h.mailbox, self._mail_gen[h.name], timeout=self._busy, runtime=self._rt)
                    except errors.Error:
                        pass  # the push below reports it (SlotBusy, ReaderDied...)
                res = push_batch([mref] * len(delta_readers), [h.mailbox for h in delta_readers],
                                 timeout=timeout or self._timeout, runtime=self._rt)
                for i, (h, r) in enumerate(zip(delta_readers, res)):
                    out[h.name] = ReaderResult(index=i, fed="owner", path=r.transport, error=r.error)
                    modes[h.name] = "delta"
        if full_readers:
            self._mail_full[:] = _mail(self.version, "full")
            if self._last is not None:
                self._last.close()
                self._last = None
            op = broadcast(self._full_srcs()[:1] + srcs, [h.refs for h in full_readers], chunk_size=self._chunk,
                           window=self._window, busy_wait=self._busy, timeout=timeout or self._timeout,
                           runtime=self._rt)
            res = op.result()
            self._last = op
            seconds, nbytes, tree = seconds + res.seconds, res.bytes, res.tree
            for h, rr in zip(full_readers, res.readers):
                out[h.name] = rr
                modes[h.name] = "full"
        for h in handles:
            rr = out[h.name]
            if rr.ok:
                self._mail_gen[h.name] += 1
                self._fresh.add(h.name)
            else:
                self._fresh.discard(h.name)
                if rr.error is not None and rr.error.kind in _DEAD_KINDS:
                    self._readers.pop(h.name, None)
                    dropped.append(h.name)
        if self._delta:
            # The last version becomes this one where the codec did not
            # make it so (a whole publish).
            if self._prev is None:
                self._prev = {k: np.array(as_array(state_dict[k]), copy=True) for k in names}
            elif len(advanced) < len(names):
                done = set(advanced)
                for k in names:
                    if k not in done:
                        np.copyto(self._prev[k], as_array(state_dict[k]))
        return SyncResult(version=self.version, readers=out, dropped=dropped, seconds=seconds, bytes=nbytes,
                          tree=tree, modes=modes, full_bytes=full_bytes,
                          delta_bytes=blob_bytes if delta_readers else 0, delta_via=via, delta_reason=reason,
                          codec_gbps=codec)

    def wait_consumed(self, timeout: Optional[float] = None) -> None:
        """Waits until every reader the last full publish reached said done
        with it (ReaderDied names one that died meanwhile)."""
        with self._lock:
            if self._last is not None:
                self._last.wait_consumed(timeout)

    def close(self) -> None:
        """Frees the published state dict and forgets the readers.
        Idempotent."""
        with self._lock:
            if self._last is not None:
                self._last.close()
                self._last = None
            refs = [r for _, r, _ in self._refs.values()] + list(self._mail_refs or ()) + self._blobs + \
                [r for _, r in self._piece_src]
            for ref in refs:
                try:
                    self._rt.free(ref)
                except errors.Error:
                    pass
            self._refs.clear()
            self._mail_refs, self._blobs, self._prev, self._piece_src = None, [], None, []
            self._readers.clear()

    def __enter__(self) -> "WeightPublisher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = [
    "Slot", "wait_slots", "PushResult", "push", "push_batch", "wait_consumed", "ReaderResult", "BroadcastResult",
    "Progress", "Operation", "broadcast", "explain_broadcast", "ReaderHandle", "WeightReceiver", "WeightPublisher",
    "SyncResult", "Delta", "delta_encode", "delta_codec_gbps", "delta_decision", "DELTA_REASONS", "delta_check", "delta_apply", "delta_revert", "SLOT_GENERATIONS", "LAND_IN_PLACE", "LAND_STAGED",
    "MAILBOX_BYTES",
]
