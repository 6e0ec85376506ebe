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
fetch timeout, 60 s), TENSORLANE_RECV (``view``, the default, or
``copy``), TENSORLANE_SLABS (slab mode, on by default here: the job's
actors share their objects' memory in large slabs, mapped once per reader,
with a pre-faulted pool of TENSORLANE_POOL_BYTES, default 256 MiB; ``0``
gives every object its own memory) and, with no TENSORLANE_CLUSTER_KEY, a
cluster key derived from the Ray session (docs/security-shm-grants.md).

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

ENV_TIMEOUT = "TENSORLANE_TIMEOUT_S"
#: ``view`` (default): same-node receivers map the sender's memory read-only;
#: ``copy``: they read into their own, writable memory.
ENV_RECV = "TENSORLANE_RECV"


def _recv_mode() -> str:
    mode = (os.environ.get(ENV_RECV) or "view").strip().lower()
    if mode not in ("view", "copy"):
        raise errors.InvalidArgument(f"{ENV_RECV}={mode!r}: want view or copy")
    return mode


@dataclass
class TensorlaneTransportMetadata(TensorTransportMetadata):
    """Ray's metadata plus one tensorlane Ref per tensor."""

    refs: List[bytes] = field(default_factory=list)
    torch: bool = False


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
                    _rt = _runtime.Runtime(config)
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

    def actor_has_tensor_transport(self, actor) -> bool:
        import ray

        return ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(_available))

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> TensorlaneTransportMetadata:
        rt = runtime()
        refs, meta, is_torch = [], [], False
        try:
            for t in rdt_object:
                if type(t).__module__.startswith("torch"):
                    is_torch = True
                    meta.append((t.shape, t.dtype))
                else:
                    a = _runtime.as_array(t)
                    meta.append((a.shape, a.dtype))
                refs.append(bytes(rt.put(t)))
                _metrics.put(_runtime.as_array(t).nbytes)
        except BaseException:
            for r in refs:  # publish all or nothing
                rt.free(r)
            raise
        return TensorlaneTransportMetadata(tensor_meta=meta, tensor_device="cpu", refs=refs, torch=is_torch)

    def get_communicator_metadata(self, src_actor=None, dst_actor=None, backend: Optional[str] = None) -> TensorlaneCommunicatorMetadata:
        return TensorlaneCommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: TensorlaneTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        rt = runtime()
        meta = tensor_transport_metadata
        timeout = _timeout()
        ops = [rt.next_op() for _ in meta.refs]
        with self._lock:
            self._inflight[obj_id] = ops
        start = time.perf_counter()
        out, nbytes = [], 0
        paths: Dict[str, int] = {}  # transport -> tensors, for the metrics
        before = None  # copying gets' counters, read only when one copies
        # Zero-copy unless told otherwise, or torch (whose tensors over
        # read-only memory warn on every use), or the last try found no path.
        view = self._view and not meta.torch and _recv_mode() == "view"
        try:
            for i, ref in enumerate(meta.refs):
                target = target_buffers[i] if target_buffers else None
                arr = None
                if view and target is None:
                    shape, dtype = meta.tensor_meta[i] if i < len(meta.tensor_meta) else (None, None)
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
                    import torch

                    out.append(torch.from_numpy(arr))
                else:
                    out.append(arr)
        except errors.Error as e:
            _metrics.failed(e.kind)
            raise
        finally:
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
        rt = runtime()
        errs = []
        for ref in tensor_transport_meta.refs:
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
