"""tensorlane as a Ray Direct Transport.

Call :func:`register` in the driver before creating the actors, then::

    @ray.remote(enable_tensor_transport=True)
    class Trainer:
        @ray.method(tensor_transport="TENSORLANE")
        def weights(self) -> dict:
            return {"w": self.w}          # the weights as returned (one copy)

        @ray.method(tensor_transport="TENSORLANE")
        def weights_borrowed(self) -> dict:
            return {"w": tensorlane.ray.borrow(self.w)}   # zero-copy: do not mutate

**What a reader receives.** By default exactly what the method returned,
as with Ray's object store: the sender copies each array once, with several
threads, into pre-faulted shareable memory before the method's result is
published (non-contiguous and Fortran-order arrays are made C-ordered by
that same copy), so a trainer that updates its weights in place right after
returning them never tears a reader's copy. The copy is the only one: same-
node readers map it read-only (as Ray hands out read-only numpy arrays),
other nodes read it over rdma or tcp. Callers who promise not to mutate an
array until its ObjectRef is gone publish it with no copy at all: arrays
from :func:`tensorlane.empty`, or any array wrapped with :func:`borrow`.
TENSORLANE_VERIFY=1 checks that promise: checksums taken at publish are
compared at read, and a changed tensor raises :class:`tensorlane.Mutated`.

**No side effects on Ray.** Ray registers a transport's serializer for its
data type process-wide (``serialize_rdt_objects`` in
``ray/_private/serialization.py``), here ``numpy.ndarray``; left alone, every
later plain method of the actor would return numpy arrays pickled in-band
(a copy, writable, several times slower). The plug-in installs its own
reducer instead (:func:`_install_reducers`): inside a transport call it does
what Ray's does, and outside it hands the array to numpy's own protocol-5
reduction, which is Ray's zero-copy path.

**A state dict is one batch.** The sender copies all of an object's
tensors into one block and publishes it sealed in one call
(``tl_put_gathered``; borrowed arrays in one ``tl_put_batch``); the receiver maps them with one
``tl_view_batch`` (an owner's slab mapped once) or reads them with one
``tl_get_batch`` (one lease request per owner, the transfers coalesced per
owner and path): :mod:`tensorlane._batch`.

**Every dtype.** Any numpy dtype without Python objects travels: the ones
tensorlane knows by name (bool, int8..int64, uint8, float16, bfloat16,
float32, float64) as themselves, the rest (uint16..uint64, complex,
ml_dtypes' float8 variants...) as their raw bytes, re-typed by the receiver
from Ray's own metadata. Small tensors ride inline (below).

Each actor process lazily starts one runtime (:func:`tensorlane.runtime`),
configured by the environment, so ``runtime_env={"env_vars": {...}}`` sets a
whole job: TENSORLANE_CONFIG (JSON, default ``{"discover": true}``: this
machine's topology, host named after the machine, so actors on one node
share a host and take shm, and actors on others take rdma or tcp),
TENSORLANE_TRANSPORTS (``tcp``, ``^rdma``, ...), TENSORLANE_TIMEOUT_S (a
read's bound; default Ray's RDT fetch timeout, 60 s), TENSORLANE_RECV
(``view``, the default for numpy, or ``copy``, the default for torch),
TENSORLANE_COPY_THREADS (the sender's copy threads, default up to 8),
TENSORLANE_VERIFY, TENSORLANE_SLABS (slab mode, on by default here: the
job's actors share their objects' memory in large slabs, mapped once per
reader; the memory grows on demand and freed ranges are reused, pages
populated; new slabs come from the node's warm pool, a helper process that
outlives the actors and holds TENSORLANE_NODE_POOL_BYTES of populated memory,
default 512 MiB, see tensorlane._nodepool; TENSORLANE_POOL_BYTES pre-faults
that much in each actor at start, default 0)
and TENSORLANE_INLINE_BYTES (the eager threshold, below).

**The slab key** (who may map a runtime's slabs) is, in order:
TENSORLANE_CLUSTER_KEY_FILE (a path to a file of 64 hex digits, readable by
its owner only; the path may ride in ``runtime_env``, the secret does not),
TENSORLANE_CLUSTER_KEY set in the nodes' own environment (not through
``runtime_env``: Ray's dashboard and state API show ``runtime_env``), or a
random key made once per Ray cluster and kept in Ray's internal key-value
store (GCS), which only processes able to run code in the cluster can read
(:func:`slab_key`; docs/security.md).

Small tensors ride inline: a tensor of fewer than TENSORLANE_INLINE_BYTES
bytes (default 64 KiB; ``0`` turns it off; read on the sender) travels
inside the transport metadata itself, as UCX's eager protocol or NCCL's LL
protocol carry small messages with their header. The receiver then makes
no tensorlane round trip at all, the sender publishes nothing, and
garbage_collect has nothing to free. Inline bytes of one object stop at
:data:`INLINE_TOTAL_MAX` (the metadata crosses Ray's control plane); the
rest go as refs. Each inline tensor carries a CRC-32 of its bytes, checked
on receipt (:class:`tensorlane.Corrupt` when it does not match).

**Failures.** A reader's wait is bounded: a killed sender surfaces as
:class:`tensorlane.OwnerDied` (or :class:`tensorlane.PeerClosed` when its
connection drops mid-read), a frozen one as OwnerDied once the heartbeat
bound passes, and every read stops at TENSORLANE_TIMEOUT_S
(:class:`tensorlane.Timeout`); docs/ray.md says which and when.

Transfers are counted with Ray's metrics API (``ray.util.metrics``), so they
show in the Ray dashboard next to Ray's own: ``tensorlane_transfers``
(by transport), ``tensorlane_transfer_bytes``, ``tensorlane_transfer_errors``
(by kind), ``tensorlane_transfer_seconds`` (a histogram),
``tensorlane_published_bytes`` (by mode: copied, of which copied_strided, or borrowed) and
``tensorlane_host_memory_bytes`` (by state: used, cached, slabs).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _batch, _raycuda, _runtime, errors

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
#: ``1``: checksums of zero-copy (borrowed) tensors at publish, checked at read.
ENV_VERIFY = "TENSORLANE_VERIFY"
#: Threads of the sender's copy (default: the CPUs, at most 8).
ENV_COPY_THREADS = "TENSORLANE_COPY_THREADS"
#: A file holding the slab key (64 hex digits), readable by its owner only.
ENV_KEY_FILE = "TENSORLANE_CLUSTER_KEY_FILE"

#: Verification checksums cover this many bytes each (CRC-32 per chunk, so
#: the chunks are summed in parallel).
VERIFY_CHUNK = 8 << 20
#: Arrays smaller than this are copied by the calling thread alone.
_PARALLEL_MIN = 1 << 20
#: Each published copy starts at a multiple of this (cache lines, SIMD).
_ALIGN = 64


def _recv_mode(torch: bool = False) -> str:
    """``view`` or ``copy``. numpy arrays default to view; torch tensors to
    copy, since torch code writes in place and a view is a read-only
    mapping (TENSORLANE_RECV=view asks for it anyway, as Ray's
    RAY_ENABLE_ZERO_COPY_TORCH_TENSORS does for its store)."""
    mode = (os.environ.get(ENV_RECV) or ("copy" if torch else "view")).strip().lower()
    if mode not in ("view", "copy"):
        raise errors.InvalidArgument(f"{ENV_RECV}={mode!r}: want view or copy")
    return mode


def _verify() -> bool:
    v = (os.environ.get(ENV_VERIFY) or "0").strip().lower()
    if v in ("0", "false", "off", "no", ""):
        return False
    if v in ("1", "true", "on", "yes"):
        return True
    raise errors.InvalidArgument(f"{ENV_VERIFY}={v!r}: want 1 or 0")


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


def _copy_threads() -> int:
    v = os.environ.get(ENV_COPY_THREADS)
    if v and v.strip():
        try:
            n = int(v)
        except ValueError:
            raise errors.InvalidArgument(f"{ENV_COPY_THREADS}={v!r}: want a thread count") from None
        if n < 1:
            raise errors.InvalidArgument(f"{ENV_COPY_THREADS}={v!r}: want at least 1")
        return n
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


@dataclass
class TensorlaneTransportMetadata(TensorTransportMetadata):
    """Ray's metadata plus, per tensor, a tensorlane Ref or its bytes inline.

    ``refs[i]`` is the marshalled Ref of tensor i, or ``b""`` when the tensor
    rides inline; then ``inline[i]`` is ``(dtype token, shape, bytes,
    crc32)``: numpy's dtype string (``"<f4"``), the dtype's name where the
    string is ambiguous (ml_dtypes' ``"bfloat16"``, ``"float8_e4m3fn"``), or
    torch's (``"torch.float32"``). ``layouts[i]`` is ``(shape, numpy dtype,
    offset)`` of tensor i's bytes as the receiver should see them (the ref
    may carry them as raw bytes): offset None for a ref of its own, else
    the byte offset in a block that several tensors share (the sender's
    copies: ``refs[i]`` is then the block's ref for each); ``sums[i]``, in verification mode, the CRC-32s of a
    borrowed tensor's :data:`VERIFY_CHUNK`-byte chunks at publish."""

    refs: List[bytes] = field(default_factory=list)
    torch: bool = False
    inline: List[Optional[tuple]] = field(default_factory=list)
    layouts: List[Optional[tuple]] = field(default_factory=list)
    sums: List[Optional[List[int]]] = field(default_factory=list)
    #: Per tensor, for a torch GPU tensor (TENSORLANE_TORCH): its shape,
    #: dtype and sender's device (_raycuda.put); refs[i] is then its own
    #: object in device memory. Empty when no tensor is on a GPU.
    devices: List[Optional[Dict[str, Any]]] = field(default_factory=list)


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


# The slab key.

#: Where the per-cluster key lives in Ray's internal key-value store.
KV_NAMESPACE = "tensorlane"
KV_KEY = "slab-cluster-key"


def _key_from_file(path: str) -> str:
    """The key in a file that only its owner (this user) may read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise errors.InvalidArgument(f"{ENV_KEY_FILE}={path!r}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise errors.InvalidArgument(f"{ENV_KEY_FILE}={path!r}: not a regular file")
        if st.st_uid != os.getuid():
            raise errors.InvalidArgument(f"{ENV_KEY_FILE}={path!r}: owned by uid {st.st_uid}, not this user")
        if st.st_mode & 0o077:
            raise errors.InvalidArgument(
                f"{ENV_KEY_FILE}={path!r}: mode {stat.S_IMODE(st.st_mode):o} lets others read it (chmod 600)")
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    key = raw.decode("ascii", "replace").strip()
    try:
        ok = len(bytes.fromhex(key)) == 32
    except ValueError:
        ok = False
    if not ok:
        raise errors.InvalidArgument(f"{ENV_KEY_FILE}={path!r}: want 64 hex digits (32 bytes)")
    return key


def slab_key() -> str:
    """The slab key of this Ray worker's runtime (64 hex digits).

    TENSORLANE_CLUSTER_KEY_FILE when set (see :func:`_key_from_file`); else a
    random 32-byte key made once per Ray cluster by the first worker that
    asks, kept in Ray's internal key-value store (namespace ``tensorlane``):
    not in ``runtime_env``, the dashboard or the state API, and not derived
    from anything public (the session name is in ``ps`` and ``/tmp/ray``).
    Who can read it could also run code in the cluster's actors. Raises
    :class:`tensorlane.Error` when neither is available (the caller then
    turns slab mode off rather than use a guessable key)."""
    path = os.environ.get(ENV_KEY_FILE)
    if path:
        return _key_from_file(path)
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        raise errors.Other("tensorlane: no Ray cluster to keep the slab key in")
    fresh = os.urandom(32).hex().encode()
    internal_kv._internal_kv_put(KV_KEY, fresh, overwrite=False, namespace=KV_NAMESPACE)
    key = internal_kv._internal_kv_get(KV_KEY, namespace=KV_NAMESPACE)  # the first writer's
    if not key:
        raise errors.Other("tensorlane: Ray's key-value store lost the slab key")
    return key.decode()


# Ray's serializer, without side effects.

def _rdt_placeholder(i: int) -> Any:
    """Deserializes a tensor that travelled out of band: Ray hands the
    received tensors to the deserializing thread (its thread-local list)."""
    import ray

    ctx = ray._private.worker.global_worker.get_serialization_context()
    tensors = ctx._thread_local.rdt_tensors
    if not isinstance(i, int) or not 0 <= i < len(tensors):
        raise errors.Corrupt(f"tensorlane: out-of-band tensor {i!r} of {len(tensors)}")
    return tensors[i]


def _reducer(data_type: type, previous: Optional[Callable]) -> Callable:
    def reduce(obj: Any) -> Any:
        import ray

        ctx = ray._private.worker.global_worker.get_serialization_context()
        local = ctx._thread_local
        if getattr(local, "use_external_transport", False):
            local.rdt_tensors.append(obj)  # as Ray's own serializer does
            return _rdt_placeholder, (len(local.rdt_tensors) - 1,)
        if isinstance(obj, Borrowed):
            obj = obj.view(np.ndarray)
        if previous is not None:
            return previous(obj)
        # What pickle does with no dispatch entry: numpy's protocol-5
        # reduction, whose buffers Ray sends out of band (zero-copy,
        # read-only on the reader).
        return obj.__reduce_ex__(5)

    reduce._tensorlane = True  # type: ignore[attr-defined]
    return reduce


_install_lock = threading.Lock()


def _install_reducers() -> None:
    """Makes this process's Ray serializer for the transport's data types
    ours (see the module doc): a transport call's tensors go out of band as
    with Ray's serializer, every other serialization of an array goes Ray's
    own zero-copy way. Idempotent; a no-op outside a connected Ray worker
    or driver."""
    try:
        import ray
        from ray import cloudpickle

        worker = ray._private.worker.global_worker
        if not worker.connected:
            return
        ctx = worker.get_serialization_context()
    except Exception:
        return
    types: List[type] = [np.ndarray, Borrowed]
    torch = _torch_module()
    if torch is not None:
        types.append(torch.Tensor)
    with _install_lock:
        dispatch = cloudpickle.CloudPickler.dispatch
        for t in types:
            current = dispatch.get(t)
            if current is not None and getattr(current, "_tensorlane", False):
                continue
            # Ray's RDT reducer (a closure named _CloudPicklerReducer) is the
            # one we replace; anything else registered before us is kept.
            previous = None
            if current is not None and getattr(current, "__name__", "") != "_CloudPicklerReducer":
                previous = current
            ctx._register_cloudpickle_reducer(t, _reducer(t, previous))
        # Ray registers its serializer once per data type, then trusts the
        # flag: with it set, Ray leaves ours in place.
        flags = getattr(ctx, "_rdt_custom_serializer_registered", None)
        if isinstance(flags, dict):
            for t in types:
                flags[t] = True


def _torch_module():
    import sys

    return sys.modules.get("torch")


# The zero-copy opt-in.

class Borrowed(np.ndarray):
    """A numpy array published with no copy (see :func:`borrow`); otherwise
    an ordinary array (the reader receives a plain ``numpy.ndarray``)."""

    def __reduce_ex__(self, protocol):  # outside Ray's serializer: a plain array
        return self.view(np.ndarray).__reduce_ex__(protocol)


_borrowed_torch: Dict[int, Any] = {}
_borrowed_lock = threading.Lock()


def borrow(x: Any) -> Any:
    """Marks x for zero-copy publishing: returned from a method with
    ``tensor_transport="TENSORLANE"``, its memory is read in place by the
    readers (no copy on the sender), so the caller must not change it until
    the ObjectRef is gone (TENSORLANE_VERIFY=1 checks). A numpy array comes
    back as a :class:`Borrowed` view of the same memory; a torch tensor
    comes back as itself, remembered for as long as it lives. The array must
    be C-contiguous (a strided one is refused: its copy would not be a
    borrow)."""
    if _is_torch(x):
        import weakref

        if not x.is_contiguous():
            raise errors.InvalidArgument(f"borrow: non-contiguous tensor (shape {tuple(x.shape)}): nothing to borrow")
        key = id(x)
        with _borrowed_lock:
            _borrowed_torch[key] = weakref.ref(x, lambda _r, k=key: _borrowed_torch.pop(k, None))
        return x
    a = _runtime.as_array(x)
    if not a.flags.c_contiguous:
        raise errors.InvalidArgument(
            f"borrow: non-contiguous array (shape {a.shape}, strides {a.strides}): its publish would copy it anyway")
    return a.view(Borrowed)


def _is_borrowed(t: Any, a: np.ndarray) -> bool:
    """Borrowed arrays and tensors, and arrays over tensorlane memory
    (tensorlane.empty, received arrays), publish without a copy."""
    if isinstance(t, Borrowed):
        return True
    if _is_torch(t):
        with _borrowed_lock:
            r = _borrowed_torch.get(id(t))
        if r is not None and r() is t:
            return True
    b: Any = a
    while b is not None:
        if isinstance(b, _runtime._Block):
            return True
        b = getattr(b, "base", None)
    return False


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
            self.published = metrics.Counter(
                "tensorlane_published_bytes", "Bytes published through tensorlane (kept until the ObjectRef dies), by mode: copied (of which copied_strided: non-contiguous arrays C-ordered by the copy) or borrowed.",
                tag_keys=("mode",))
            self.memory = metrics.Gauge(
                "tensorlane_host_memory_bytes", "The actor's tensorlane host memory: used (live objects, received arrays), "
                "cached (freed, populated, kept for reuse), slabs (slab count).", tag_keys=("state",))
            self.node_pool = metrics.Gauge(
                "tensorlane_node_pool", "The node's warm pool as this actor saw it (tensor/nodepool): ready_bytes (populated, "
                "held by the node's helper), taken_bytes (handed to this actor), and new slabs it served (hits) or not "
                "(misses: nothing that large; absent: no helper), each of those a fallback to fresh pages.", tag_keys=("state",))
            self._ok = True
        except Exception:
            self._ok = False

    def __getattr__(self, name):  # only reached for attributes not set yet
        raise AttributeError(name)

    def _ready(self) -> bool:
        if not self._made:
            self._make()
        return self._ok

    def received(self, transports: Dict[str, int], nbytes: int, seconds: float):
        if not self._ready():
            return
        t = ",".join(sorted(transports)) or "none"
        for name, n in transports.items():
            self.transfers.inc(n, tags={"transport": name})
        self.bytes.inc(nbytes, tags={"transport": t})
        self.seconds.observe(seconds, tags={"transport": t})
        if seconds > 0:
            self.rate.set(nbytes / seconds / 1e9, tags={"transport": t})

    def failed(self, kind: str):
        if self._ready():
            self.errors.inc(1, tags={"kind": kind})

    def put(self, nbytes: int, mode: str):
        if self._ready() and nbytes:
            self.published.inc(nbytes, tags={"mode": mode})

    def host_memory(self, rt: Optional[_runtime.Runtime]):
        if rt is None or not self._ready():
            return
        # stats() gathers the runtime's registry: at most once a second, not
        # once per transfer on the transfer's path.
        now = time.monotonic()
        if now - getattr(self, "_memory_at", -1.0) < 1.0:
            return
        self._memory_at = now
        try:
            st = rt.stats()
        except errors.Error:
            return
        m = st["host_memory"]
        for k, v in (st.get("node_pool") or {}).items():
            if k != "connected":
                self.node_pool.set(v, tags={"state": k})
        self.memory.set(m.get("used", 0), tags={"state": "used"})
        self.memory.set(m.get("cached", 0), tags={"state": "cached"})
        self.memory.set(m.get("slab_count", 0), tags={"state": "slabs"})


_metrics = _Metrics()


_releaser = None
_releaser_lock = threading.Lock()


def _release_later(rt: _runtime.Runtime, refs: List[bytes]) -> None:
    """Drops the reader's leases off the transfer's critical path: one control
    round trip per tensor that nobody waits for. Leases of a reader that
    dies expire on the owner anyway."""
    global _releaser
    if _releaser is None:
        with _releaser_lock:
            if _releaser is None:
                _releaser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorlane-release")

    def release():
        for ref in refs:
            try:
                rt.release(ref)
            except errors.Error:
                pass  # freed or owner gone: nothing left to release

    _releaser.submit(release)


_pool: Optional[ThreadPoolExecutor] = None
_pool_size = 0
_pool_lock = threading.Lock()


def _copier() -> Tuple[ThreadPoolExecutor, int]:
    """The sender's copy (and checksum) threads, made on first use. numpy's
    copy and zlib's CRC release the GIL on large buffers, so they run in
    parallel."""
    global _pool, _pool_size
    n = _copy_threads()
    with _pool_lock:
        if _pool is None or _pool_size != n:
            old, _pool, _pool_size = _pool, ThreadPoolExecutor(max_workers=n, thread_name_prefix="tensorlane-copy"), n
            if old is not None:
                old.shutdown(wait=False)
        return _pool, _pool_size


def _copy_parts(dst: np.ndarray, src: np.ndarray, parts: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Splits one copy into about ``parts`` pieces that can run at once:
    flat byte ranges for contiguous sources, slabs of the first axis with
    more than one row otherwise."""
    if parts <= 1 or src.nbytes < _PARALLEL_MIN:
        return [(dst, src)]
    if src.flags.c_contiguous:
        d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        step = -(-d.size // parts)
        step = -(-step // 4096) * 4096
        return [(d[o:o + step], s[o:o + step]) for o in range(0, d.size, step)]
    axis = next((k for k, n in enumerate(src.shape) if n > 1), None)
    if axis is None:
        return [(dst, src)]
    n = src.shape[axis]
    step = max(1, -(-n // parts))
    out = []
    for o in range(0, n, step):
        idx = (slice(None),) * axis + (slice(o, o + step),)
        out.append((dst[idx], src[idx]))
    return out


def _checksums(a: np.ndarray, pool: Optional[ThreadPoolExecutor]) -> List[int]:
    """CRC-32 of each VERIFY_CHUNK bytes of a C-contiguous array."""
    flat = a.reshape(-1).view(np.uint8)
    chunks = [flat[o:o + VERIFY_CHUNK] for o in range(0, flat.size, VERIFY_CHUNK)] or [flat]
    if pool is None or len(chunks) == 1:
        return [zlib.crc32(c) for c in chunks]
    return list(pool.map(zlib.crc32, chunks))


def _available(_self=None) -> bool:
    """Runs in the actor when Ray asks whether it has the transport (before
    its first RDT call): loads the library, makes the serializer side-effect
    free, and starts the runtime in the background so the first transfer
    does not wait for it."""
    try:
        from tensorlane import _lib

        _lib.lib()
    except Exception:
        return False
    _install_reducers()
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


def _wire_dtype(dt: np.dtype) -> Optional[str]:
    """The tensorlane dtype name an array is published under, or None when
    tensorlane has none for it (it then travels as raw bytes)."""
    try:
        return _runtime.tl_dtype(dt)
    except errors.InvalidArgument:
        return None


def _check_dtype(dt: np.dtype, what: str) -> None:
    if dt.hasobject:
        raise errors.InvalidArgument(
            f"{what}: unsupported dtype {dt} (holds Python objects, which have no bytes to move); "
            "return it from a method without tensor_transport")


def _dtype_token(dt: np.dtype) -> str:
    """How an inline entry names its dtype: numpy's string where it says
    everything ("<f4"), the name where it does not (ml_dtypes' types are
    all "<V2"/"<V1" by string)."""
    return dt.name if dt.kind == "V" else dt.str


def _dtype_of_token(token: str, expect: Any) -> np.dtype:
    if expect is not None:
        try:
            e = np.dtype(expect)
            if token in (e.str, e.name):
                return e
        except TypeError:
            pass
    try:
        return np.dtype(token)
    except TypeError:
        pass
    try:
        import ml_dtypes  # type: ignore

        return np.dtype(getattr(ml_dtypes, token))
    except (ImportError, AttributeError, TypeError):
        raise TypeError(f"no numpy dtype named {token!r} (ml_dtypes not installed?)") from None


def _inline_entry(t: Any, torch_t: bool) -> tuple:
    """(dtype token, shape, bytes, crc32) of a small tensor. Non-contiguous
    ones are made contiguous here (their bytes are copied anyway)."""
    if torch_t:
        import torch

        if t.device.type != "cpu":
            raise errors.InvalidArgument(f"tensor on {t.device}: tensorlane's Python binding moves CPU memory")
        _torch_dtype(str(t.dtype))
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return (str(t.dtype), tuple(t.shape), raw, zlib.crc32(raw))
    a = _runtime.as_array(t)
    _check_dtype(a.dtype, "inline tensor")
    raw = a.tobytes()  # C order, whatever a's layout
    return (_dtype_token(a.dtype), tuple(a.shape), raw, zlib.crc32(raw))


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
        dt = _dtype_of_token(dtname, expect[1] if expect is not None else None)
        _check_dtype(dt, "inline tensor")
        if expect is not None and np.dtype(expect[1]) != dt:
            raise TypeError(f"Ray's metadata says {np.dtype(expect[1])}")
    except (TypeError, ValueError, errors.InvalidArgument) as e:
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
    (bfloat16 travels as its 16-bit pattern). torch has no read-only
    tensors: one over a read-only mapping (a view, TENSORLANE_RECV=view)
    would take an in-place write (``add_``, an optimizer step) and crash the
    worker with SIGSEGV. So a read-only array is copied first: torch gets
    private, writable memory, and a torch reader's view mode costs one copy,
    as copy mode does (issue 29)."""
    import torch

    if not arr.flags.writeable:
        arr = arr.copy()
    t = torch.from_numpy(arr)
    if dtype is not None and t.dtype != dtype:
        t = t.view(dtype)
    return t


def _verify_read(arr: np.ndarray, sums: Optional[List[int]], i: int) -> None:
    if not sums:
        return
    got = _checksums(np.ascontiguousarray(arr), _copier()[0] if arr.nbytes >= 2 * VERIFY_CHUNK else None)
    if got != list(sums):
        bad = next((k for k, (g, w) in enumerate(zip(got, sums)) if g != w), min(len(got), len(sums)))
        raise errors.Mutated(
            f"tensorlane: tensor {i} ({arr.nbytes} bytes) changed after it was published without a copy "
            f"(first differing chunk {bad} of {len(sums)}, {VERIFY_CHUNK} bytes each): a borrowed array "
            "must not be written until its ObjectRef is gone; return it without borrow() for a copy")


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
        # Ray registered its serializer for our data type to pull these
        # tensors out (the first time, if _available did not run here
        # first): ours takes its place before any other method serializes.
        _install_reducers()
        limit = _inline_limit()
        verify = _verify()
        budget = INLINE_TOTAL_MAX
        n = len(rdt_object)
        meta: List[tuple] = []
        refs: List[bytes] = [b""] * n
        inline: List[Optional[tuple]] = [None] * n
        layouts: List[Optional[tuple]] = [None] * n
        sums: List[Optional[List[int]]] = [None] * n
        on_device: List[Optional[Dict[str, Any]]] = [None] * n
        is_torch = False
        # What goes as refs, (index, array): published in place, or copied.
        borrowed: List[Tuple[int, np.ndarray]] = []
        copies: List[Tuple[int, np.ndarray]] = []
        for i, t in enumerate(rdt_object):
            torch_t = _is_torch(t)
            is_torch = is_torch or torch_t
            if torch_t and t.device.type != "cpu":
                # A GPU tensor is an object of its own in device memory
                # (one device copy; a reader on this node imports the
                # allocation read-only, one elsewhere reads through pinned
                # host memory): _raycuda.py.
                ref, on_device[i] = _raycuda.put(runtime(), t)
                refs[i] = ref
                meta.append((tuple(t.shape), t.dtype))
                continue
            a = _runtime.as_array(t)
            _check_dtype(a.dtype, f"tensor {i}")
            meta.append((tuple(t.shape), t.dtype) if torch_t else (a.shape, a.dtype))
            if a.nbytes < limit and a.nbytes <= budget:
                inline[i] = _inline_entry(t, torch_t)
                budget -= a.nbytes
                continue
            if a.nbytes == 0:  # at or above a threshold of 0: nothing to publish, nothing to move
                inline[i] = _inline_entry(t, torch_t)
                continue
            layouts[i] = (tuple(a.shape), a.dtype)
            if a.flags.c_contiguous and _is_borrowed(t, a):
                borrowed.append((i, a))
            else:
                copies.append((i, a))
        if borrowed or copies:
            rt = runtime()
            pool, threads = _copier()
            futures: List[Future] = []
            sum_futures: Dict[int, List[Future]] = {}
            # Checksums of borrowed memory first: they are what "as
            # published" means for them.
            if verify:
                for i, a in borrowed:
                    flat = a.reshape(-1).view(np.uint8)
                    sum_futures[i] = [pool.submit(zlib.crc32, flat[o:o + VERIFY_CHUNK])
                                      for o in range(0, flat.size, VERIFY_CHUNK)]
            # One block of shareable memory for every copy: one grant, one
            # mapping, one read and one free for the whole state dict, each
            # tensor a window at its offset. Contiguous tensors are copied
            # in by the library (put_gathered: several threads, each 256 KiB
            # checksummed as it lands, the block published sealed, so
            # network readers never make the owner read it again for
            # checksums); strided ones first, here, C-ordered. Borrowed
            # arrays are objects of their own (their memory is the
            # caller's), published after the block, all or nothing.
            block_ref: Optional[_runtime.Ref] = None
            if copies:
                offs, total = [], 0
                for _, a in copies:
                    offs.append(total)
                    total += -(-a.nbytes // _ALIGN) * _ALIGN
                block = rt.empty(total, np.uint8)
                gathered: List[Tuple[np.ndarray, int]] = []
                for (i, a), off in zip(copies, offs):
                    layouts[i] = (tuple(a.shape), a.dtype, off)
                    if a.flags.c_contiguous:
                        gathered.append((a.reshape(-1).view(np.uint8), off))
                        continue
                    d = block[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
                    for dp, sp in _copy_parts(d, a, threads):
                        futures.append(pool.submit(np.copyto, dp, sp, "no"))
                failed = None
                for f in futures:
                    failed = failed or f.exception()
                if failed is not None:
                    raise failed
                block_ref = rt.put_gathered(block, gathered, threads=threads)
            made: List[_runtime.Ref] = []
            if borrowed:
                pub = [a if _wire_dtype(a.dtype) else a.reshape(-1).view(np.uint8) for _, a in borrowed]
                names = [_wire_dtype(a.dtype) or "uint8" for _, a in borrowed]
                try:
                    made = _batch.put_batch(pub, runtime=rt, dtypes=names)
                except BaseException:
                    if block_ref is not None:  # publish all or nothing
                        rt.free(block_ref)
                    raise
            for (i, _), ref in zip(borrowed, made):
                refs[i] = bytes(ref)
            if block_ref is not None:
                for i, _ in copies:
                    refs[i] = bytes(block_ref)
            for i, fs in sum_futures.items():
                sums[i] = [f.result() for f in fs]
            _metrics.put(sum(a.nbytes for _, a in borrowed), "borrowed")
            _metrics.put(sum(a.nbytes for _, a in copies), "copied")
            # Of which non-contiguous (strided, transposed, Fortran-order):
            # C-ordered by their one copy.
            _metrics.put(sum(a.nbytes for _, a in copies if not a.flags.c_contiguous), "copied_strided")
            _metrics.host_memory(rt)
        has_inline = any(e is not None for e in inline)
        has_refs = any(refs)
        gpu = any(d is not None for d in on_device)
        return TensorlaneTransportMetadata(
            tensor_meta=meta, tensor_device="cuda" if gpu else "cpu", refs=refs, torch=is_torch,
            inline=inline if has_inline else [],  # nothing inline: keep the metadata as small as before
            layouts=layouts if has_refs else [], sums=sums if any(s is not None for s in sums) else [],
            devices=on_device if gpu else [])

    def get_communicator_metadata(self, src_actor=None, dst_actor=None, backend: Optional[str] = None) -> TensorlaneCommunicatorMetadata:
        return TensorlaneCommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorlaneTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        meta = tensor_transport_metadata
        n = len(meta.refs)
        inline = getattr(meta, "inline", None) or []
        layouts = getattr(meta, "layouts", None) or []
        sums = getattr(meta, "sums", None) or []
        on_device = getattr(meta, "devices", None) or []
        for name, lst in (("inline", inline), ("layouts", layouts), ("sums", sums), ("devices", on_device)):
            if lst and len(lst) != n:
                raise errors.Corrupt(f"tensorlane: {name} metadata for {len(lst)} tensors, refs for {n}")
        remote = [i for i, r in enumerate(meta.refs) if r]
        rt = runtime() if remote else None  # all inline: no runtime, no round trip
        timeout = _timeout()
        op = rt.next_op() if remote else 0
        if remote:
            with self._lock:
                self._inflight[obj_id] = [op]
        start = time.perf_counter()
        out: List[Any] = [None] * n
        nbytes = 0
        paths: Dict[str, int] = {}  # transport -> tensors, for the metrics
        view = self._view and _recv_mode(meta.torch) == "view" and not target_buffers
        try:
            for i, ref in enumerate(meta.refs):
                if ref:
                    continue
                target = target_buffers[i] if target_buffers else None
                entry = inline[i] if i < len(inline) else None
                t = _from_inline(entry, i, meta.torch, meta.tensor_meta[i] if i < len(meta.tensor_meta) else None)
                if target is not None:
                    _copy_into(target, t, meta.torch)
                    t = target
                out[i] = t
                nbytes += len(entry[2])
                paths["inline"] = paths.get("inline", 0) + 1
            gpu = [i for i in remote if on_device and on_device[i] is not None]
            host = [i for i in remote if not (on_device and on_device[i] is not None)]
            if gpu:  # GPU tensors: each into a new tensor on the device asked for
                for i in gpu:
                    target = target_buffers[i] if target_buffers else None
                    dev = str(target.device) if target is not None else None
                    t = _raycuda.recv(rt, meta.refs[i], on_device[i], dev, timeout=timeout, op=op)
                    if target is not None:
                        target.copy_(t)
                        t = target
                    out[i] = t
                    nbytes += t.numel() * t.element_size()
                    paths["device"] = paths.get("device", 0) + 1
                _release_later(rt, [meta.refs[i] for i in gpu])
            if host:
                got, urefs = self._read(rt, meta, host, layouts, view, target_buffers, timeout, op, paths)
                for i, arr in zip(host, got):
                    if sums:
                        _verify_read(arr, sums[i], i)
                    nbytes += arr.nbytes
                    if target_buffers:
                        out[i] = target_buffers[i]
                    elif meta.torch:
                        out[i] = _torch_from_array(arr, meta.tensor_meta[i][1] if i < len(meta.tensor_meta) else None)
                    else:
                        out[i] = arr
                _release_later(rt, urefs)  # this reader is done: its leases go
        except errors.Error as e:
            _metrics.failed(e.kind)
            raise
        finally:
            if remote:
                with self._lock:
                    self._inflight.pop(obj_id, None)
        _metrics.received(paths, nbytes, time.perf_counter() - start)
        if remote:
            _metrics.host_memory(rt)
        return out

    def _read(self, rt: _runtime.Runtime, meta: TensorlaneTransportMetadata, remote: List[int],
              layouts: List[Optional[tuple]], view: bool, target_buffers: Optional[List[Any]], timeout: float,
              op: int, paths: Dict[str, int]) -> Tuple[List[np.ndarray], List[bytes]]:
        """The ref'd tensors and the distinct refs read, in one batch: mapped
        (same node) or read. Tensors the sender copied share one object
        (its block), read once, each a window at its offset."""
        uniq: Dict[bytes, int] = {}
        for i in remote:
            uniq.setdefault(meta.refs[i], len(uniq))
        urefs = list(uniq)
        lays = {i: self._layout(meta, layouts, i) for i in remote}
        users: Dict[int, List[int]] = {}
        for i in remote:
            users.setdefault(uniq[meta.refs[i]], []).append(i)
        # A ref read for one whole tensor is typed by its layout; a block
        # comes as its bytes.
        ulays: List[Optional[tuple]] = []
        for u in range(len(urefs)):
            us = users[u]
            lay = lays[us[0]]
            ulays.append(lay[:2] if len(us) == 1 and lay is not None and lay[2] is None else None)
        try:
            got = self._fetch(rt, urefs, ulays, users, view, timeout, op, paths)
        except BaseException:
            # The batch calls leave this actor holding what they leased
            # (one request per owner): a failed read drops those holds
            # too, or their leases would be renewed for the process's life.
            _release_later(rt, urefs)
            raise
        out: List[np.ndarray] = []
        for i in remote:
            arr = got[uniq[meta.refs[i]]]
            lay = lays[i]
            if lay is not None and lay[2] is not None:
                shape, dt, off = lay
                n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                raw = arr.reshape(-1).view(np.uint8)
                if off < 0 or off + n > raw.size:
                    raise errors.Corrupt(f"tensorlane: tensor {i}: bytes {off}..{off + n} of a {raw.size}-byte object")
                arr = raw[off:off + n].view(dt).reshape(shape)
            if target_buffers:  # Ray's buffers: the bytes go there
                dst = _runtime.as_array(target_buffers[i])
                if dst.nbytes != arr.nbytes or not dst.flags.c_contiguous:
                    raise errors.TooSmall(f"tensorlane: tensor {i}: Ray's buffer holds {dst.nbytes} bytes "
                                          f"(contiguous: {dst.flags.c_contiguous}), the tensor has {arr.nbytes}")
                np.copyto(dst.reshape(-1).view(np.uint8), np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
            out.append(arr)
        return out, urefs

    def _fetch(self, rt: _runtime.Runtime, urefs: List[bytes], ulays: List[Optional[tuple]], users: Dict[int, List[int]],
               view: bool, timeout: float, op: int, paths: Dict[str, int]) -> List[np.ndarray]:
        """Each distinct ref's array: mapped with one view_batch where the
        sender is on this node, the rest read with one get_batch."""
        got: List[Optional[np.ndarray]] = [None] * len(urefs)
        rest = list(range(len(urefs)))
        if view:
            items = _batch.view_batch(urefs, runtime=rt, timeout=timeout, op=op, layouts=ulays, return_exceptions=True)
            rest = []
            for k, it in enumerate(items):
                if isinstance(it, errors.NoZeroCopy):
                    rest.append(k)  # another node: copy these
                elif isinstance(it, errors.Error):
                    raise it
                else:
                    got[k] = it
            mapped = sum(len(users[u]) for u in range(len(urefs)) if u not in rest)
            if mapped:
                paths["shm"] = paths.get("shm", 0) + mapped  # the one path that maps across processes
        if rest:
            before = rt.stats()["gets_by_transport"]
            for k, arr in zip(rest, _batch.get_batch([urefs[k] for k in rest], runtime=rt, timeout=timeout, op=op,
                                                     layouts=[ulays[k] for k in rest])):
                got[k] = arr
            self._count(rt, before, paths)
        return got

    @staticmethod
    def _layout(meta: TensorlaneTransportMetadata, layouts: List[Optional[tuple]], i: int) -> Optional[tuple]:
        """(shape, dtype, offset or None) of tensor i's bytes in its ref."""
        if layouts and layouts[i] is not None:
            lay = layouts[i]
            try:
                shape, dt = tuple(int(d) for d in lay[0]), np.dtype(lay[1])
                off = int(lay[2]) if len(lay) > 2 and lay[2] is not None else None
            except (TypeError, ValueError, IndexError):
                raise errors.Corrupt(f"tensorlane: tensor {i}: malformed layout {lay!r}") from None
            return shape, dt, off
        if not meta.torch and i < len(meta.tensor_meta):
            shape, dt = meta.tensor_meta[i]
            try:
                return tuple(shape), np.dtype(dt), None
            except TypeError:
                return None
        return None  # decode the ref (torch without layouts: an older sender)

    @staticmethod
    def _count(rt: _runtime.Runtime, before: Optional[Dict[str, int]], paths: Dict[str, int]) -> None:
        before = before or {}
        for k, v in rt.stats()["gets_by_transport"].items():
            if v - before.get(k, 0):
                paths[k] = paths.get(k, 0) + v - before.get(k, 0)

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("tensorlane is one-sided: the receiver reads, the sender does nothing")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorlaneTransportMetadata, tensors: List[Any]) -> None:
        refs = list(dict.fromkeys(r for r in tensor_transport_meta.refs if r))  # a block once
        if not refs:
            return  # all inline: nothing was published
        rt = runtime()
        errs = []
        for ref in refs:
            try:
                rt.free(ref)
            except errors.Error as e:
                errs.append(e)
        _metrics.host_memory(rt)
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
    the actors that use it; named as Ray's ``worker_process_setup_hook``, it
    also registers in every worker and starts the worker's runtime in the
    background as the worker starts. Calling it again is a no-op."""
    from ray.experimental.rdt import util

    from ray.experimental import register_tensor_transport

    if name.upper() not in util.transport_manager_info:
        register_tensor_transport(name, ["cpu"], TensorlaneTransport, np.ndarray)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and TORCH_NAME not in util.transport_manager_info:
        # cpu, and cuda when torch sees a GPU: _raycuda.py moves those.
        register_tensor_transport(TORCH_NAME, _raycuda.devices(), TensorlaneTransport, torch.Tensor)
    _install_reducers()
    if _runtime.in_ray_worker():
        # Named as Ray's worker_process_setup_hook (docs/ray.md), this runs
        # as each worker starts: its runtime starts in the background beside
        # the actor's construction, as Ray's object store client connects at
        # worker start, rather than on the worker's first receive (30-60 ms
        # of a cold transfer's path).
        threading.Thread(target=_warm, name="tensorlane-warm", daemon=True).start()


from .weightsync import ReaderHandle, SyncResult, WeightPublisher, WeightReceiver  # noqa: E402,F401  weight sync: docs/weightsync.md
