"""tensorlane as a Ray Direct Transport.

Call :func:`register` in the driver before creating the actors, then::

    @ray.remote(enable_tensor_transport=True)
    class Trainer:
        @ray.method(tensor_transport="TENSORLANE")
        def weights(self) -> dict:
            return {"w": np.ones((4096, 4096), np.float32)}

Every numpy array in the returned value stays in the producing actor; a ref
to it (a few hundred bytes) rides Ray's object store, and the consuming
actor reads the bytes straight from the producer's memory: through shared
memory on one node, over rdma or tcp between nodes. The transport is
one-sided (only the receiver acts) and abortable.

Each actor process lazily starts one runtime (:func:`tensorlane.runtime`),
configured by the environment, so ``runtime_env={"env_vars": {...}}`` sets a
whole job: TENSORLANE_CONFIG (JSON, default ``{"discover": true}``: this
machine's topology, host named after the machine, so actors on one node
share a host and take shm, and actors on others take rdma or tcp),
TENSORLANE_TRANSPORTS (``tcp``, ``^rdma``, ...), TENSORLANE_CLUSTER_KEY (64
hex digits), TENSORLANE_TIMEOUT_S (a read's bound; default Ray's RDT
fetch timeout, 60 s), TENSORLANE_RECV (``view``, the default for numpy, or
``copy``, the default for torch), TENSORLANE_SLABS (slab mode, on by default here: the job's
actors share their objects' memory in large slabs, mapped once per reader,
with a pre-faulted pool of TENSORLANE_POOL_BYTES, default 256 MiB; ``0``
gives every object its own memory) and, with no TENSORLANE_CLUSTER_KEY, a
cluster key derived from the Ray session (docs/security-shm-grants.md),
and TENSORLANE_INLINE_BYTES (the eager threshold, below).

Small tensors ride inline: a tensor of fewer than TENSORLANE_INLINE_BYTES
bytes (default 64 KiB; ``0`` turns it off; read on the sender) travels
inside the transport metadata itself, as UCX's eager protocol or NCCL's LL
protocol carry small messages with their header. The receiver then makes
no tensorlane round trip at all, the sender publishes nothing, and
garbage_collect has nothing to free. Inline bytes of one object stop at
:data:`INLINE_TOTAL_MAX` (the metadata crosses Ray's control plane); the
rest go as refs. Each inline tensor carries a CRC-32 of its bytes, checked
on receipt (:class:`tensorlane.Corrupt` when it does not match).

On one node the receiver gets **read-only** numpy arrays mapped straight
from the sender's memory (zero copies, as Ray's object store hands out
read-only arrays): the memory stays valid for as long as the array lives,
even after the sender's ObjectRef dies. Set ``TENSORLANE_RECV=copy`` for
writable arrays in the receiver's own memory (one copy), which is also what
happens between nodes, or when Ray passes target buffers. The runtime's
stats count ``views`` (zero-copy reads) apart from copying gets.

Transfers are counted with Ray's metrics API (``ray.util.metrics``), so they
show in the Ray dashboard next to Ray's own: ``tensorlane_transfers``
(by transport), ``tensorlane_transfer_bytes``, ``tensorlane_transfer_errors``
(by kind), ``tensorlane_transfer_seconds`` (a histogram) and
``tensorlane_published_bytes``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from . import _runtime, errors

try:
    from ray.experimental.rdt.tensor_transport_manager import (
        CommunicatorMetadata,
        TensorTransportManager,
        TensorTransportMetadata,
    )
except ImportError as e:  # pragma: no cover - tested where Ray is installed
    raise ImportError("tensorlane.ray needs Ray 2.60 or newer: pip install 'ray[default]>=2.60'") from e

#: The transport's name in ``@ray.method(tensor_transport=...)``.
NAME = "TENSORLANE"
#: The name under which torch tensors travel, when torch is importable
#: (Ray takes one data type per transport name).
TORCH_NAME = "TENSORLANE_TORCH"

#: Tensors below this many bytes ride inside the metadata (``0``: never).
ENV_INLINE = "TENSORLANE_INLINE_BYTES"
INLINE_DEFAULT = 64 << 10
#: At most this many inline bytes per RDT object; further small tensors go
#: as refs, so a state dict of many small tensors does not swell Ray's
#: control messages past what they carry well.
INLINE_TOTAL_MAX = 1 << 20

ENV_TIMEOUT = "TENSORLANE_TIMEOUT_S"
#: ``view`` (default): same-node receivers map the sender's memory read-only;
#: ``copy``: they read into their own, writable memory.
ENV_RECV = "TENSORLANE_RECV"


def _recv_mode(torch: bool = False) -> str:
    """``view`` or ``copy``. numpy arrays default to view; torch tensors to
    copy, since torch code writes in place and a view is a read-only
    mapping (TENSORLANE_RECV=view asks for it anyway, as Ray's
    RAY_ENABLE_ZERO_COPY_TORCH_TENSORS does for its store)."""
    mode = (os.environ.get(ENV_RECV) or ("copy" if torch else "view")).strip().lower()
    if mode not in ("view", "copy"):
        raise errors.InvalidArgument(f"{ENV_RECV}={mode!r}: want view or copy")
    return mode


def _parse_bytes(v: str) -> int:
    """65536, 64K, 64KiB, 1M (powers of two)."""
    t = v.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    if mult > 1:
        t = t[:-1]
    return int(t) * mult


def _inline_limit() -> int:
    v = os.environ.get(ENV_INLINE)
    if v is None or not v.strip():
        return INLINE_DEFAULT
    try:
        n = _parse_bytes(v)
    except ValueError:
        raise errors.InvalidArgument(f"{ENV_INLINE}={v!r}: want a byte count (65536, 64K, 0 to turn off)") from None
    if n < 0:
        raise errors.InvalidArgument(f"{ENV_INLINE}={v!r}: negative")
    return n


@dataclass
class TensorlaneTransportMetadata(TensorTransportMetadata):
    """Ray's metadata plus, per tensor, a tensorlane Ref or its bytes inline.

    ``refs[i]`` is the marshalled Ref of tensor i, or ``b""`` when the tensor
    rides inline; then ``inline[i]`` is ``(dtype name, shape, bytes,
    crc32)``: numpy's dtype string, or torch's (``"torch.float32"``)."""

    refs: List[bytes] = field(default_factory=list)
    torch: bool = False
    inline: List[Optional[tuple]] = field(default_factory=list)


@dataclass
class TensorlaneCommunicatorMetadata(CommunicatorMetadata):
    """Nothing: refs carry all a reader needs (owner, addresses, capability)."""


_runtime_lock = threading.Lock()
_rt: Optional[_runtime.Runtime] = None


def runtime() -> _runtime.Runtime:
    """The actor process's runtime, started on first use (see module doc).
    In a Ray worker it is the process's default runtime
    (:func:`tensorlane.runtime`), the one :func:`tensorlane.empty` allocates
    from, so such arrays are published with no copy."""
    global _rt
    if _rt is None:
        with _runtime_lock:
            if _rt is None:
                if _runtime.in_ray_worker():
                    _rt = _runtime.runtime()
                else:
                    env = os.environ.get(_runtime.ENV_CONFIG)
                    config = json.loads(env) if env else {"discover": True}
                    _rt = _runtime.Runtime(_runtime._raynode.apply(config))  # the Ray node's address and host
    return _rt


def _timeout() -> float:
    if os.environ.get(ENV_TIMEOUT):
        return float(os.environ[ENV_TIMEOUT])
    try:
        from ray._private import ray_constants

        return float(ray_constants.RDT_FETCH_FAIL_TIMEOUT_SECONDS)
    except Exception:
        return 60.0


class _Metrics:
    """Ray metrics, made on first use inside a Ray worker; a no-op elsewhere."""

    def __init__(self):
        self._made = False
        self._ok = False

    def _make(self):
        self._made = True
        try:
            from ray.util import metrics

            self.transfers = metrics.Counter("tensorlane_transfers", "Tensors read through tensorlane, by transport.", tag_keys=("transport",))
            self.bytes = metrics.Counter("tensorlane_transfer_bytes", "Bytes read through tensorlane, by transport.", tag_keys=("transport",))
            self.errors = metrics.Counter("tensorlane_transfer_errors", "Failed tensorlane reads, by error kind.", tag_keys=("kind",))
            self.seconds = metrics.Histogram(
                "tensorlane_transfer_seconds", "Time to receive one RDT object through tensorlane (all its tensors).",
                boundaries=[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30], tag_keys=("transport",))
            self.rate = metrics.Gauge("tensorlane_transfer_gbps", "Byte rate of the last RDT object received, GB/s.", tag_keys=("transport",))
            self.published = metrics.Counter("tensorlane_published_bytes", "Bytes published through tensorlane (kept in place until the ObjectRef dies).")
            self._ok = True
        except Exception:
            self._ok = False

    def __getattr__(self, name):  # only reached for metric attributes before _make
        raise AttributeError(name)

    def received(self, transports: Dict[str, int], nbytes: int, seconds: float):
        if not self._made:
            self._make()
        if not self._ok:
            return
        t = ",".join(sorted(transports)) or "none"
        for name, n in transports.items():
            self.transfers.inc(n, tags={"transport": name})
        self.bytes.inc(nbytes, tags={"transport": t})
        self.seconds.observe(seconds, tags={"transport": t})
        if seconds > 0:
            self.rate.set(nbytes / seconds / 1e9, tags={"transport": t})

    def failed(self, kind: str):
        if not self._made:
            self._make()
        if self._ok:
            self.errors.inc(1, tags={"kind": kind})

    def put(self, nbytes: int):
        if not self._made:
            self._make()
        if self._ok and nbytes:
            self.published.inc(nbytes)


_metrics = _Metrics()


_releaser = None
_releaser_lock = threading.Lock()


def _release_later(rt: _runtime.Runtime, ref: bytes) -> None:
    """Drops the reader's lease off the transfer's critical path: one control
    round trip per tensor (a hundred for a state dict) that nobody waits for.
    Leases of a reader that dies expire on the owner anyway."""
    global _releaser
    if _releaser is None:
        with _releaser_lock:
            if _releaser is None:
                from concurrent.futures import ThreadPoolExecutor

                _releaser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorlane-release")

    def release():
        try:
            rt.release(ref)
        except errors.Error:
            pass  # freed or owner gone: nothing left to release

    _releaser.submit(release)


def _available(_self=None) -> bool:
    """Runs in the actor when Ray asks whether it has the transport (before
    its first RDT call): loads the library, and starts the runtime in the
    background so the first transfer does not wait for it."""
    try:
        from tensorlane import _lib

        _lib.lib()
    except Exception:
        return False
    threading.Thread(target=_warm, name="tensorlane-warm", daemon=True).start()
    return True


def _warm() -> None:
    try:
        runtime()
    except Exception:
        pass  # the first real use raises it


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


# torch dtypes tensorlane carries (the same set as numpy's, plus bfloat16).
_TORCH_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "bfloat16", "float32", "float64")


def _torch_dtype(name: str):
    import torch

    short = name.removeprefix("torch.")
    if short not in _TORCH_DTYPES:
        raise errors.InvalidArgument(f"unsupported dtype {name}; supported: {', '.join(_TORCH_DTYPES)}")
    return getattr(torch, short)


def _inline_entry(t: Any, torch_t: bool) -> tuple:
    """(dtype name, shape, bytes, crc32) of a small tensor, refused on the
    same grounds as a Put (non-contiguous, unsupported dtype), so whether a
    tensor rides inline never changes what is accepted."""
    if torch_t:
        import torch

        if t.device.type != "cpu":
            raise errors.InvalidArgument(f"tensor on {t.device}: tensorlane's Python binding moves CPU memory")
        if not t.is_contiguous():
            raise errors.InvalidArgument(
                f"non-contiguous tensor (shape {tuple(t.shape)}, strides {t.stride()}): "
                "pass t.contiguous() (one copy) or publish a contiguous tensor")
        _torch_dtype(str(t.dtype))
        raw = t.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
        return (str(t.dtype), tuple(t.shape), raw, zlib.crc32(raw))
    a = _runtime.as_array(t)
    if not a.flags.c_contiguous:
        raise errors.InvalidArgument(
            f"non-contiguous array (shape {a.shape}, strides {a.strides}): "
            "pass numpy.ascontiguousarray(a) (one copy) or publish a contiguous array")
    _runtime.tl_dtype(a.dtype)
    raw = a.tobytes()
    return (a.dtype.str, tuple(a.shape), raw, zlib.crc32(raw))


def _from_inline(entry: Any, i: int, torch_t: bool, expect: Any) -> Any:
    """A writable array (or torch tensor) from an inline entry, checked
    against its CRC, its shape and dtype, and Ray's tensor_meta."""
    try:
        dtname, shape, raw, crc = entry
        shape = tuple(int(d) for d in shape)
        if not isinstance(raw, (bytes, bytearray)) or not isinstance(dtname, str):
            raise TypeError
    except (TypeError, ValueError):
        raise errors.Corrupt(f"tensorlane: inline tensor {i}: malformed entry ({type(entry).__name__})") from None
    if zlib.crc32(raw) != crc:
        raise errors.Corrupt(f"tensorlane: inline tensor {i}: CRC mismatch ({len(raw)} bytes)")
    if any(d < 0 for d in shape):
        raise errors.Corrupt(f"tensorlane: inline tensor {i}: negative dimension in {shape}")
    if expect is not None and tuple(expect[0]) != shape:
        raise errors.Corrupt(f"tensorlane: inline tensor {i}: shape {shape}, Ray's metadata says {tuple(expect[0])}")
    count = int(np.prod(shape, dtype=np.int64))
    if torch_t:
        import torch

        try:
            dt = _torch_dtype(dtname)
        except errors.InvalidArgument as e:
            raise errors.Corrupt(f"tensorlane: inline tensor {i}: {e}") from None
        size = torch.empty((), dtype=dt).element_size()
        if count * size != len(raw):
            raise errors.Corrupt(f"tensorlane: inline tensor {i}: {len(raw)} bytes for a {dtname}{list(shape)}")
        if not raw:
            return torch.empty(shape, dtype=dt)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)
    try:
        dt = np.dtype(dtname)
        _runtime.tl_dtype(dt)
    except (TypeError, ValueError) as e:
        raise errors.Corrupt(f"tensorlane: inline tensor {i}: dtype {dtname!r}: {e}") from None
    if count * dt.itemsize != len(raw):
        raise errors.Corrupt(f"tensorlane: inline tensor {i}: {len(raw)} bytes for a {dt}{list(shape)}")
    return np.frombuffer(bytearray(raw), dtype=dt).reshape(shape)


def _copy_into(target: Any, t: Any, torch_t: bool) -> None:
    if torch_t and _is_torch(target):
        target.copy_(t)
    else:
        np.copyto(_runtime.as_array(target), _runtime.as_array(t), casting="no")


def _torch_from_array(arr: np.ndarray, dtype: Any) -> Any:
    """A torch tensor over a received array, in the sender's torch dtype
    (bfloat16 travels as its 16-bit pattern). Read-only views (TENSORLANE_RECV=view)
    stay read-only: torch's warning about it is silenced, as the choice was the user's."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(arr)
    if dtype is not None and t.dtype != dtype:
        t = t.view(dtype)
    return t


class TensorlaneTransport(TensorTransportManager):
    """The Ray TensorTransportManager of tensorlane: one-sided and abortable."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inflight: Dict[str, List[int]] = {}
        self._view = True

    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    # Ray asks this before every call of a method with tensor_transport
    # (ray/actor.py, _remote), and our answer is a synchronous round trip to
    # the actor: at 4 KiB that round trip was a third of the transfer. The
    # library cannot vanish from a live actor, so a yes is kept per actor
    # (a no is asked again: the actor may not have loaded it yet).
    _has_lock = threading.Lock()
    _has: Dict[str, bool] = {}

    def actor_has_tensor_transport(self, actor) -> bool:
        import ray

        key = actor._actor_id.hex()
        # Except for actors that run tasks out of order (async actors,
        # max_concurrency > 1): with the answer cached, a driver submitting
        # in a tight loop to such a pair lost some of Ray's __ray_recv__
        # triggers (test_ray_semantics::test_async_actors_interleaved_transfers:
        # 3 of 12 runs of 100 transfers timed out after Ray's 60 s; asked
        # every time, as Ray's NIXL does, 0 of 8), so those are asked anew.
        cache = not getattr(actor, "_ray_allow_out_of_order_execution", False)
        if cache and TensorlaneTransport._has.get(key):
            return True
        ok = ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(_available))
        if ok and cache:
            with TensorlaneTransport._has_lock:
                TensorlaneTransport._has[key] = True
        return ok

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> TensorlaneTransportMetadata:
        limit = _inline_limit()
        budget = INLINE_TOTAL_MAX
        rt = None
        refs, meta, inline, is_torch = [], [], [], False
        try:
            for t in rdt_object:
                torch_t = _is_torch(t)
                is_torch = is_torch or torch_t
                if torch_t:
                    meta.append((t.shape, t.dtype))
                    nbytes = t.numel() * t.element_size()
                else:
                    a = _runtime.as_array(t)
                    meta.append((a.shape, a.dtype))
                    nbytes = a.nbytes
                if nbytes < limit and nbytes <= budget:
                    inline.append(_inline_entry(t, torch_t))
                    refs.append(b"")
                    budget -= nbytes
                    continue
                if rt is None:
                    rt = runtime()
                refs.append(bytes(rt.put(t)))
                inline.append(None)
                _metrics.put(nbytes)
        except BaseException:
            for r in refs:  # publish all or nothing
                if r:
                    rt.free(r)
            raise
        if not any(e is not None for e in inline):
            inline = []  # nothing inline: keep the metadata as small as before
        return TensorlaneTransportMetadata(tensor_meta=meta, tensor_device="cpu", refs=refs, torch=is_torch, inline=inline)

    def get_communicator_metadata(self, src_actor=None, dst_actor=None, backend: Optional[str] = None) -> TensorlaneCommunicatorMetadata:
        return TensorlaneCommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorlaneTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        meta = tensor_transport_metadata
        inline = getattr(meta, "inline", None) or []
        if inline and len(inline) != len(meta.refs):
            raise errors.Corrupt(f"tensorlane: inline metadata for {len(inline)} tensors, refs for {len(meta.refs)}")
        remote = [i for i, r in enumerate(meta.refs) if r]
        rt = runtime() if remote else None  # all inline: no runtime, no round trip
        timeout = _timeout()
        ops = {i: rt.next_op() for i in remote}
        if ops:
            with self._lock:
                self._inflight[obj_id] = list(ops.values())
        start = time.perf_counter()
        out, nbytes = [], 0
        paths: Dict[str, int] = {}  # transport -> tensors, for the metrics
        before = None  # copying gets' counters, read only when one copies
        # Zero-copy unless told otherwise (torch: only when asked, see
        # _recv_mode), or the last try found no path.
        view = self._view and _recv_mode(meta.torch) == "view"
        try:
            for i, ref in enumerate(meta.refs):
                target = target_buffers[i] if target_buffers else None
                if not ref:
                    entry = inline[i] if i < len(inline) else None
                    t = _from_inline(entry, i, meta.torch, meta.tensor_meta[i] if i < len(meta.tensor_meta) else None)
                    if target is not None:
                        _copy_into(target, t, meta.torch)
                        t = target
                    out.append(t)
                    nbytes += len(entry[2])
                    paths["inline"] = paths.get("inline", 0) + 1
                    continue
                arr = None
                if view and target is None:
                    shape, dtype = meta.tensor_meta[i] if i < len(meta.tensor_meta) else (None, None)
                    if meta.torch:
                        shape, dtype = None, None  # torch's dtype is not numpy's: decode the ref's
                    try:
                        arr = rt.view(ref, timeout=timeout, op=ops[i], shape=shape, dtype=dtype)
                        paths["shm"] = paths.get("shm", 0) + 1  # the one path that maps across processes
                    except errors.NoZeroCopy:
                        view = False  # another node: copy this one and the rest
                if arr is None:
                    if before is None:
                        before = rt.stats()["gets_by_transport"]
                    arr = rt.get(ref, out=_runtime.as_array(target) if target is not None else None, timeout=timeout, op=ops[i])
                nbytes += arr.nbytes
                _release_later(rt, ref)  # this reader is done: its lease on the owner goes
                if target is not None:
                    out.append(target)
                elif meta.torch:
                    out.append(_torch_from_array(arr, meta.tensor_meta[i][1] if i < len(meta.tensor_meta) else None))
                else:
                    out.append(arr)
        except errors.Error as e:
            _metrics.failed(e.kind)
            raise
        finally:
            if ops:
                with self._lock:
                    self._inflight.pop(obj_id, None)
        took = time.perf_counter() - start
        if before is not None:  # views stop at the first copy: the rest are copies
            for k, v in rt.stats()["gets_by_transport"].items():
                if v - before.get(k, 0):
                    paths[k] = paths.get(k, 0) + v - before.get(k, 0)
        _metrics.received(paths, nbytes, took)
        return out

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("tensorlane is one-sided: the receiver reads, the sender does nothing")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorlaneTransportMetadata, tensors: List[Any]) -> None:
        refs = [r for r in tensor_transport_meta.refs if r]
        if not refs:
            return  # all inline: nothing was published
        rt = runtime()
        errs = []
        for ref in refs:
            try:
                rt.free(ref)
            except errors.Error as e:
                errs.append(e)
        if errs:
            raise errs[0]

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        rt = runtime()
        with self._lock:
            ops = list(self._inflight.get(obj_id, ()))
        for op in ops:
            rt.cancel(op)


def register(name: str = NAME) -> None:
    """Registers tensorlane with Ray as the tensor transport ``name`` for
    numpy arrays on device cpu, and as ``TENSORLANE_TORCH`` for torch
    tensors when torch is importable. Call it in the driver before creating
    the actors that use it. Calling it again is a no-op."""
    from ray.experimental.rdt import util

    from ray.experimental import register_tensor_transport

    if name.upper() not in util.transport_manager_info:
        register_tensor_transport(name, ["cpu"], TensorlaneTransport, np.ndarray)
    try:
        import torch
    except ImportError:
        return
    if TORCH_NAME not in util.transport_manager_info:
        register_tensor_transport(TORCH_NAME, ["cpu"], TensorlaneTransport, torch.Tensor)
