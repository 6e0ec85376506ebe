"""The binding: runtimes, refs, shareable arrays."""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import sys
import threading
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib, _raynode, errors
from ._config import ALIASES, Config

_warned_aliases: set = set()


def normalize_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """config with its old key names (``listen``, ``allow``, ``deny``,
    ``transfer_timeout_ms``) replaced by their fields' names, warning once
    per name; a new dict. A key given by both names is left for the library
    to refuse (it names both)."""
    out = dict(config)
    for old, (new, factor) in ALIASES.items():
        if old not in out or new in out:
            continue
        if old not in _warned_aliases:
            _warned_aliases.add(old)
            warnings.warn(f"tensorlane config: {old!r} is deprecated, use {new!r} (docs/config.md)", DeprecationWarning, stacklevel=3)
        v = out.pop(old)
        out[new] = v * factor if factor != 1.0 and isinstance(v, (int, float)) and not isinstance(v, bool) else v
    return out

# numpy dtype -> tensorlane dtype name. Others (uint16..uint64, complex,
# object, strings) have no tensorlane dtype and are refused by name.
_TO_TL = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "int8",
    np.dtype(np.int16): "int16",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.float16): "float16",
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
}
_FROM_TL = {v: k for k, v in _TO_TL.items()}


def _bfloat16() -> Optional[np.dtype]:
    try:  # ml_dtypes (installed with jax and tensorflow) gives numpy a bfloat16
        import ml_dtypes  # type: ignore

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


def tl_dtype(dt: Any) -> str:
    """The tensorlane dtype name of a numpy dtype, or InvalidArgument."""
    dt = np.dtype(dt)
    name = _TO_TL.get(dt) if dt.isnative else None
    if name is None and dt.name == "bfloat16":
        name = "bfloat16"
    if name is None:
        supported = ", ".join(sorted(set(_TO_TL.values()) | {"bfloat16"}))
        raise errors.InvalidArgument(f"unsupported dtype {dt.str} ({dt}); supported: {supported}, in native byte order")
    return name


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a tensorlane dtype name."""
    if name in _FROM_TL:
        return _FROM_TL[name]
    if name == "bfloat16":
        bf = _bfloat16()
        if bf is not None:
            return bf
    # float8 and bfloat16 without ml_dtypes: raw bytes of the right width.
    widths = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}
    if name in widths:
        return np.dtype(widths[name])
    raise errors.InvalidArgument(f"tensorlane dtype {name!r} has no numpy equivalent")


def as_array(x: Any) -> np.ndarray:
    """A numpy view of x without copying: numpy arrays as they are, torch
    tensors (CPU) and anything with ``__dlpack__`` through DLPack, other
    objects through the buffer protocol."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise errors.InvalidArgument(f"tensor on {x.device}: tensorlane's Python binding moves CPU memory")
        if str(x.dtype) == "torch.bfloat16":  # numpy has none: its 16-bit pattern (put names it bfloat16)
            import torch

            return x.detach().view(torch.int16).numpy()
        return x.detach().numpy()
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        raise errors.InvalidArgument(
            f"cannot publish {type(x).__name__}: want a numpy array, a torch tensor, "
            "an object with __dlpack__, or one with the buffer protocol"
        ) from None


# Argument checks. What a caller passes goes to C as fixed-width integers
# and byte strings, where ctypes would wrap a negative op id or truncate a
# huge one silently, and a wrong type would fail deep inside with a bare
# TypeError: here each is a typed error that names the argument.

_U64 = 1 << 64


def _refb(ref: Any) -> bytes:
    """A ref's bytes, or MalformedRef for anything that is not bytes-like."""
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return bytes(ref)
    raise errors.MalformedRef(f"a ref is bytes (a tensorlane.Ref), not {type(ref).__name__}")


def _ms(timeout: Optional[float], default: int = 0) -> int:
    """A timeout in seconds as whole milliseconds (at least 1); None is
    default (0: the runtime's transfer timeout)."""
    if timeout is None:
        return default
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"timeout {timeout!r}: want seconds as a number") from None
    if not (t >= 0 and t * 1000 < (1 << 62)):  # also NaN and infinity
        raise errors.InvalidArgument(f"timeout {timeout!r}: want a finite, non-negative number of seconds")
    return max(1, int(t * 1000))


def _op(op: Optional[int]) -> int:
    """An operation id for the C ABI: 0 (none) to 2^64-1."""
    if op is None:
        return 0
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)) or not 0 <= int(op) < _U64:
        raise errors.InvalidArgument(f"op {op!r}: want an int in [0, 2^64) (Runtime.next_op gives one)")
    return int(op)


def _dims(shape: Any) -> Tuple[int, ...]:
    """A shape as non-negative ints, or InvalidArgument."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise errors.InvalidArgument(f"shape {shape!r}: want a sequence of ints") from None
    if len(dims) > 16 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise errors.InvalidArgument(f"shape {shape!r}: want at most 16 non-negative ints")
    return tuple(int(d) for d in dims)


class Ref(bytes):
    """A marshalled tensorlane reference: a few hundred bytes that travel on
    any channel (a Ray task argument, a socket, a file)."""

    def info(self) -> Dict[str, Any]:
        """dtype, shape, strides (elements), nbytes, owner, host, device."""
        return ref_info(self)

    def __repr__(self) -> str:
        try:
            i = self.info()
            return f"Ref({i['dtype']}{i['shape']} on {i['host']}/{i['device']}, {len(self)} bytes)"
        except errors.Error:
            return f"Ref(<malformed, {len(self)} bytes>)"


def ref_info(ref: bytes) -> Dict[str, Any]:
    """Decodes a ref's description; raises MalformedRef for bad bytes."""
    l = _lib.lib()
    ref = _refb(ref)
    return json.loads(_lib.call_json(l.tl_ref_info, ref, len(ref)))


class _Block:
    """Owns one block of shareable memory; numpy arrays over it keep it
    (their base) alive, and it is given back when the last one goes. It
    remembers its runtime's handle, not the runtime: closing the runtime
    leaves the memory mapped (arrays may outlive it, at interpreter exit
    too), and the last array gives it back with that handle."""

    __slots__ = ("_handle", "_ptr", "_n", "__array_interface__", "__weakref__")

    def __init__(self, handle: int, ptr: int, n: int):
        self._handle, self._ptr, self._n = handle, ptr, n
        self.__array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    def __del__(self) -> None:
        h, self._handle = self._handle, 0
        try:  # (at interpreter exit too, and never in a forked child)
            if h and _lib.usable():
                _lib.lib().tl_free_memory(h, self._ptr)
        except Exception:
            pass


class _View:
    """Owns one zero-copy view (a read-only mapping of another process's
    object); numpy arrays over it keep it alive, and it is unmapped when the
    last one goes (with its runtime's handle, also after the runtime
    closed: the view then holds a private copy of the bytes)."""

    __slots__ = ("_handle", "_view", "__array_interface__", "__weakref__")

    def __init__(self, handle: int, view: int, ptr: int, n: int):
        self._handle, self._view = handle, view
        self.__array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, True), "version": 3}

    def __del__(self) -> None:
        h, self._handle = self._handle, 0
        try:  # (at interpreter exit too, and never in a forked child)
            if h and _lib.usable():
                _lib.lib().tl_view_release(h, self._view)
        except Exception:
            pass


#: tl_view's flag: build the page tables in the call.
VIEW_POPULATE = 1


def _shape_array(values: Sequence[int]):
    arr = (ctypes.c_int64 * max(len(values), 1))(*values)
    return arr


class Runtime:
    """One tensorlane runtime in this process: it publishes arrays (Put) and
    reads others' (Get). Many may exist; :func:`tensorlane.runtime` returns
    the process's default one.

    config is the C ABI's JSON config as a dict, typed as
    :class:`tensorlane.Config`: the fields of docs/config.md (``preset``,
    ``host``, ``listen_addrs``, ``allow_transports``, ``cluster_key``,
    ``encrypt_data``, ``stall_timeout``, ``device_backend``, ``slabs``, ...;
    slab mode: docs/ray.md), by the same names as Go's rdt.Config and the
    worker's flags. An unknown key raises :class:`InvalidArgument` naming it
    and the field it most likely meant; an old name (``listen``, ``allow``,
    ``deny``, ``transfer_timeout_ms``) still works, with a
    ``DeprecationWarning`` once. The fields' environment variables
    (TENSORLANE_TRANSPORTS, TENSORLANE_CLUSTER_KEY, TENSORLANE_SLABS, ...)
    apply when the config does not set them.
    """

    def __init__(self, config: Optional[Union[Config, Dict[str, Any]]] = None):
        l = _lib.lib()
        h = ctypes.c_uint64(0)
        try:
            cfg = json.dumps(normalize_config(config or {}))
        except (TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"config: {e}") from None
        _lib.check(l.tl_runtime_new(cfg.encode(), ctypes.byref(h)))
        self._handle = h.value
        self._lock = threading.Lock()
        self._held: Dict[bytes, Any] = {}  # published foreign arrays, alive until free
        self._ops = itertools.count(1)

    # Lifecycle

    def close(self) -> None:
        """Shuts the runtime down (idempotent). Objects it owns are gone.
        Arrays from :meth:`empty`, :meth:`get` and :meth:`view` stay valid
        (their memory is given back when the last array over it goes; a
        view's bytes become a private copy at close)."""
        h, self._handle = self._handle, 0
        if h:
            _lib.check(_lib.lib().tl_runtime_close(h))
        self._held.clear()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _h(self) -> int:
        if not self._handle:
            raise errors.Closed("tensorlane: runtime closed")
        return self._handle

    # Memory

    def empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
        """A numpy array over shareable memory: putting it (or a contiguous
        slice of it) costs no copy on any path, also to readers in other
        processes on this host. Contents are uninitialised."""
        shape = _dims(shape)
        dt = np.dtype(dtype)
        tl_dtype(dt)
        n = dt.itemsize
        for d in shape:  # Python ints: np.prod would wrap past 2^63 silently
            n *= d
        if n >= 1 << 47:
            raise errors.InvalidArgument(f"shape {shape} of {dt}: {n} bytes, more than any address space holds")
        return self._block(max(n, 1))[:n].view(dt).reshape(shape)

    def _block(self, n: int) -> np.ndarray:
        h = self._h()
        p = ctypes.c_void_p(0)
        _lib.check(_lib.lib().tl_alloc(h, n, ctypes.byref(p)))
        return np.asarray(_Block(h, p.value, n))

    # Objects

    def put(self, x: Any) -> Ref:
        """Publishes an array and returns its Ref. numpy arrays, CPU torch
        tensors, DLPack and buffer-protocol objects are accepted without a
        copy; they must be C-contiguous. The runtime keeps the array alive,
        and it must not change, until :meth:`free`."""
        a = as_array(x)
        if a.ndim > 16:
            raise errors.InvalidArgument(f"{a.ndim} dimensions: tensorlane takes at most 16")
        if not a.flags.c_contiguous:
            raise errors.InvalidArgument(
                f"non-contiguous array (shape {a.shape}, strides {a.strides}): "
                "pass numpy.ascontiguousarray(a) (one copy) or publish a contiguous array"
            )
        name = "bfloat16" if str(getattr(x, "dtype", "")) == "torch.bfloat16" else tl_dtype(a.dtype)
        if a.nbytes == 0:
            raise errors.InvalidArgument(f"empty array (shape {a.shape}): nothing to publish")
        shape = _shape_array(a.shape)
        out = ctypes.create_string_buffer(4096)
        n = ctypes.c_size_t(0)
        ptr = a.__array_interface__["data"][0]
        _lib.check(_lib.lib().tl_put(self._h(), ptr, a.nbytes, name.encode(), a.ndim, shape, None, out, len(out), ctypes.byref(n)))
        ref = Ref(out.raw[: n.value])
        # Both the object and the array over its memory: a DLPack producer
        # may hand out a buffer it does not own (the capsule, kept by the
        # array, owns it), and an array over a buffer export (mmap) keeps
        # the export alive, so the producer cannot close it under the
        # published object.
        with self._lock:
            self._held[bytes(ref)] = (x, a)
        return ref

    def address(self) -> str:
        """This runtime's control address (comma-separated /p2p multiaddrs),
        what another runtime's :meth:`connect` takes."""
        return str(self.stats()["address"])

    def connect(self, address: str, *, timeout: Optional[float] = None) -> None:
        """Opens the control channel to the runtime at ``address`` (its
        :meth:`address`) ahead of a transfer, so the first read from it
        skips the dial and the handshake. ``timeout`` in seconds (default:
        the runtime's transfer timeout). Raises InvalidArgument for a
        malformed address, PeerUnreachable when nothing answers."""
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        _lib.check(_lib.lib().tl_connect(self._h(), address.encode(), ms))

    def put_gathered(self, block: np.ndarray, parts: Sequence[Tuple[Any, int]], *, threads: int = 0) -> Ref:
        """Copies each part, a C-contiguous array and the byte offset it
        goes to, into ``block`` (a uint8 array from :meth:`empty`, parts
        inside it and not overlapping), on up to ``threads`` threads (0: the
        cores, at most 8), and publishes the block as one sealed object: its
        256 KiB checksums are computed at most once, not at every network
        read (by the copy itself, as each block lands, once this runtime has
        served a network read; else by the first such read). The block must
        not change after this call (a network reader would see it as
        corrupt). A state dict copied once on publish (the Ray plug-in's
        default) is its use."""
        if not isinstance(block, np.ndarray) or block.dtype != np.uint8 or block.ndim != 1 or not block.flags.c_contiguous:
            raise errors.InvalidArgument("block: want a one-dimensional C-contiguous uint8 array from Runtime.empty")
        if block.nbytes == 0:
            raise errors.InvalidArgument("empty block: nothing to publish")
        n = len(parts)
        arrays = []
        for i, (x, at) in enumerate(parts):
            a = as_array(x)
            if not a.flags.c_contiguous:
                raise errors.InvalidArgument(f"part {i}: non-contiguous array (shape {a.shape}, strides {a.strides})")
            arrays.append((a, int(at)))
        srcs = (ctypes.c_void_p * max(n, 1))(*[a.__array_interface__["data"][0] for a, _ in arrays])
        lens = (ctypes.c_int64 * max(n, 1))(*[a.nbytes for a, _ in arrays])
        offs = (ctypes.c_int64 * max(n, 1))(*[at for _, at in arrays])
        out = ctypes.create_string_buffer(4096)
        k = ctypes.c_size_t(0)
        base = block.__array_interface__["data"][0]
        _lib.check(_lib.lib().tl_put_gathered(self._h(), base, block.nbytes, n, srcs, lens, offs, threads, out, len(out),
                                              ctypes.byref(k)))
        ref = Ref(out.raw[: k.value])
        with self._lock:
            self._held[bytes(ref)] = block
        return ref

    def get(self, ref: bytes, out: Optional[np.ndarray] = None, *, timeout: Optional[float] = None,
            op: Optional[int] = None) -> np.ndarray:
        """Reads a ref's tensor. Into ``out`` (a writable C-contiguous array
        of the same byte size) when given, else into a new array over
        shareable memory (which :meth:`put` can republish with no copy).
        ``timeout`` in seconds (default: the runtime's transfer timeout);
        ``op`` names the read for :meth:`cancel`."""
        info = ref_info(ref)
        nbytes = int(info["nbytes"])
        dt = np_dtype(info["dtype"])
        shape = tuple(info["shape"] or ())
        ms = _ms(timeout)
        if out is not None:
            target = as_array(out)
            if not target.flags.c_contiguous or not target.flags.writeable:
                raise errors.InvalidArgument("out must be a writable C-contiguous array")
            if target.nbytes != nbytes:
                raise errors.TooSmall(f"out holds {target.nbytes} bytes, the tensor has {nbytes}")
            ptr = target.__array_interface__["data"][0]
            _lib.check(_lib.lib().tl_get_into(self._h(), _refb(ref), len(ref), ptr, nbytes, _op(op), ms))
            return out
        # tl_get allocates only after the owner confirmed the ref's layout:
        # a shape forged larger than the object costs this process nothing
        # (allocating nbytes first, as before, made a forged 1 GiB resident,
        # in slab mode for good).
        h = self._h()
        p, n = ctypes.c_void_p(0), ctypes.c_int64(0)
        _lib.check(_lib.lib().tl_get(h, _refb(ref), len(ref), _op(op), ms, ctypes.byref(p), ctypes.byref(n)))
        buf = np.asarray(_Block(h, p.value, n.value))
        if n.value != nbytes:  # the owner confirmed this ref's layout: a bug if so
            raise errors.LayoutMismatch(f"the read delivered {n.value} bytes, the ref says {nbytes}")
        strides = tuple(int(s) * dt.itemsize for s in info["strides"] or ())
        arr = buf.view(dt)
        if strides == _c_strides(shape, dt.itemsize):
            return arr.reshape(shape)
        return np.lib.stride_tricks.as_strided(arr, shape=shape, strides=strides)

    def view(self, ref: bytes, *, populate: bool = True, timeout: Optional[float] = None,
             op: Optional[int] = None, shape: Optional[Sequence[int]] = None, dtype: Any = None) -> np.ndarray:
        """Reads a ref's tensor with no copy, when its owner is on this host:
        a read-only numpy array over the owner's memory, mapped into this
        process (as Ray's object store returns numpy arrays). The memory
        stays valid for as long as the array (or any view of it) lives, even
        after the owner frees the object. ``populate`` builds the page
        tables up front, for readers that touch every byte. Raises
        :class:`~tensorlane.NoZeroCopy` when no path maps the object (another
        host, shm not allowed, or this runtime's own object, whose array the
        caller has already): use :meth:`get` then. ``shape`` and
        ``dtype``, when the caller knows them (Ray's metadata does), save
        decoding the ref; the ref's tensor must then be C-contiguous."""
        if shape is None or dtype is None:
            info = ref_info(ref)
            dt = np_dtype(info["dtype"])
            shape = tuple(info["shape"] or ())
            strides = tuple(int(s) * dt.itemsize for s in info["strides"] or ())
        else:
            try:
                dt = np.dtype(dtype)
            except TypeError:
                raise errors.InvalidArgument(f"dtype {dtype!r} is no numpy dtype") from None
            shape, strides = _dims(shape), None
        ms = _ms(timeout)
        handle = self._h()
        h, p, n = ctypes.c_uint64(0), ctypes.c_void_p(0), ctypes.c_int64(0)
        flags = VIEW_POPULATE if populate else 0
        _lib.check(_lib.lib().tl_view(handle, _refb(ref), len(ref), flags, _op(op), ms,
                                      ctypes.byref(h), ctypes.byref(p), ctypes.byref(n)))
        raw = np.asarray(_View(handle, h.value, p.value, n.value))
        if strides is None:
            want = dt.itemsize
            for d in shape:
                want *= d
            if n.value != want:  # the caller's shape and dtype are not the object's
                raise errors.LayoutMismatch(f"the object holds {n.value} bytes, not a {dt}{list(shape)} tensor")
            return raw.view(dt).reshape(shape)
        arr = raw.view(dt)
        if strides == _c_strides(shape, dt.itemsize):
            return arr.reshape(shape)
        return np.lib.stride_tricks.as_strided(arr, shape=shape, strides=strides, writeable=False)

    def next_op(self) -> int:
        """A fresh operation id for :meth:`get` and :meth:`cancel`."""
        return next(self._ops)

    def cancel(self, op: int) -> bool:
        """Cancels the read named op; False if none is in flight."""
        code = _lib.lib().tl_cancel(self._h(), _op(op))
        if code == 5:  # object_not_found: nothing in flight under op
            return False
        _lib.check(code)
        return True

    def hold(self, ref: bytes, timeout: Optional[float] = None) -> None:
        """Keeps another runtime's object alive for this reader until
        :meth:`release` (a read's own lease lasts for the read only). The
        owner confirms the ref's layout: a forged one raises
        :class:`~tensorlane.LayoutMismatch`."""
        ms = _ms(timeout)
        _lib.check(_lib.lib().tl_hold(self._h(), _refb(ref), len(ref), ms))

    def release(self, ref: bytes) -> None:
        """A reader is done with a ref (drops its :meth:`hold`); the owner
        asks for its object to be freed once no reader holds it."""
        _lib.check(_lib.lib().tl_release(self._h(), _refb(ref), len(ref)))

    def free(self, ref: bytes, timeout: float = 30.0) -> None:
        """The owner revokes an object; returns once no read uses its memory,
        and only then lets go of the array it was published from."""
        _lib.check(_lib.lib().tl_free(self._h(), _refb(ref), len(ref), _ms(timeout)))
        with self._lock:
            self._held.pop(bytes(ref), None)

    def explain(self, ref: bytes) -> Dict[str, Any]:
        """Which path a read of ref here would take and why; for the owner,
        also how the memory is shared (``memory``: shareable, or foreign and
        whether it was copied once for a same-host reader).

        ``plan`` is rdt's Plan: ``src``, ``dst``, ``path`` (``"NV18"``,
        ``"NET"``), ``best``, ``chosen`` (``""``: none), ``via``,
        ``stripes``, ``zero_copy``, ``degraded`` and ``fallback`` (why the
        best path is not taken), ``problem``, and ``candidates`` (each with
        ``transport``, ``usable``, ``gbps``, ``reason``)."""
        return json.loads(_lib.call_json(_lib.lib().tl_explain, self._h(), _refb(ref), len(ref)))

    def stats(self) -> Dict[str, Any]:
        """Counters: puts (zero-copy and foreign), gets by transport, bytes,
        errors, live objects, host memory."""
        return json.loads(_lib.call_json(_lib.lib().tl_stats, self._h()))


def _c_strides(shape: Tuple[int, ...], itemsize: int) -> Tuple[int, ...]:
    out, acc = [], itemsize
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


_default: Optional[Runtime] = None
_default_lock = threading.Lock()

#: Environment: a JSON config for the default runtime.
ENV_CONFIG = "TENSORLANE_CONFIG"


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (an actor or a task)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        from ray._private.worker import WORKER_MODE, global_worker

        return global_worker.mode == WORKER_MODE
    except Exception:
        return False


#: Slab mode (shareable host memory from large memfds shared within one
#: trust scope, and a pre-faulted pool; see docs/security-shm-grants.md):
#: ``1`` on, ``0`` off. Ray workers default to :data:`RAY_SLABS_DEFAULT`.
ENV_SLABS = "TENSORLANE_SLABS"
#: The pre-faulted pool's size in slab mode (bytes, or 256M, 1G...), like
#: Ray's object store memory. Ray workers default to :data:`RAY_POOL_DEFAULT`.
ENV_POOL_BYTES = "TENSORLANE_POOL_BYTES"
RAY_SLABS_DEFAULT = True
RAY_POOL_DEFAULT = 0  # grows on demand (freed ranges reused, populated): not 256 MiB per actor


def _ray_scope_key() -> str:
    """The slab key every worker of this Ray cluster gets alike, a secret
    (not the session name, which any local process reads): see
    :func:`tensorlane.ray.slab_key`."""
    from .ray import slab_key

    return slab_key()


def ray_slab_config() -> Dict[str, Any]:
    """The slab settings of a Ray worker's runtime: slab mode unless
    TENSORLANE_SLABS=0, with TENSORLANE_CLUSTER_KEY or a key derived from
    the Ray cluster (tensorlane.ray.slab_key), and a pool of
    TENSORLANE_POOL_BYTES (default none: the memory grows on demand)."""
    v = (os.environ.get(ENV_SLABS) or ("1" if RAY_SLABS_DEFAULT else "0")).strip().lower()
    if v in ("0", "false", "off", "no"):
        return {"slabs": False}
    cfg: Dict[str, Any] = {"slabs": True}
    if not os.environ.get("TENSORLANE_CLUSTER_KEY"):
        try:
            cfg["cluster_key"] = _ray_scope_key()
        except errors.InvalidArgument:
            raise  # a key file named but unusable: say so, do not fall back
        except Exception:
            return {"slabs": False}  # no session to scope by: per-object grants
    if not os.environ.get(ENV_POOL_BYTES):
        cfg["pool_bytes"] = RAY_POOL_DEFAULT
    # New slabs come from the node's warm pool, held by a helper process
    # that outlives the actors (as Ray's store's memory does); the first
    # runtime of the node starts it (tensorlane._nodepool).
    from . import _nodepool

    cfg["node_pool_helper"] = _nodepool.helper_command()
    return cfg


def default_config() -> Dict[str, Any]:
    """TENSORLANE_CONFIG (JSON) if set; else, in a Ray worker, ``{"discover":
    true}`` (this machine's topology, as the Ray transport uses) with slab
    mode (:func:`ray_slab_config`); else ``{}`` (the simulated dgx-h100
    host h0)."""
    env = os.environ.get(ENV_CONFIG)
    if env:
        return json.loads(env)
    return {"discover": True, **ray_slab_config()} if in_ray_worker() else {}


def runtime() -> Runtime:
    """The process's default runtime, started on first use from
    :func:`default_config`. In a Ray worker it is also the Ray transport's
    runtime, so arrays from :func:`tensorlane.empty` are published by the
    runtime that allocated them, with no copy."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Runtime(_raynode.apply(default_config()))  # Ray: the node's address and host
    return _default
