"""Batches: many tensors in one call each way.

A state dict is fifty to a few hundred tensors; one C call and one owner
round trip per tensor is what made it slower than Ray's store. These
functions cross into the library once per batch:

- :func:`put_batch` publishes many arrays in one call (all or nothing);
- :func:`get_batch` reads many refs with one lease request per owner and
  the transfers coalesced per owner and path (one shm frame, one tcp
  pipeline, one rdma registration), into new shareable memory;
- :func:`view_batch` maps many same-host refs read-only, zero-copy, with an
  owner's slab mapped once for every object in it.

They take the runtime to use (default: the process's default runtime,
:func:`tensorlane.runtime`). Nothing happens at import.
"""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib, _runtime, errors

#: One layout per ref when the caller knows it (Ray's metadata does): the
#: shape and the numpy dtype. Saves decoding the refs; the refs' tensors
#: must then be C-contiguous.
Layout = Tuple[Sequence[int], Any]


def _rt(runtime: Optional[_runtime.Runtime]) -> _runtime.Runtime:
    return runtime if runtime is not None else _runtime.runtime()


def _ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 0
    if timeout < 0:
        raise errors.InvalidArgument(f"negative timeout {timeout}")
    return max(1, int(timeout * 1000))


def _last_message() -> str:
    buf = ctypes.create_string_buffer(2048)
    _lib.lib().tl_last_error(buf, len(buf), None)
    return buf.value.decode("utf-8", "replace")


def put_batch(arrays: Sequence[Any], *, runtime: Optional[_runtime.Runtime] = None,
              dtypes: Optional[Sequence[Optional[str]]] = None) -> List[_runtime.Ref]:
    """Publishes every array in one call and returns their refs in order.

    Arrays are taken as :meth:`Runtime.put` takes them (numpy arrays, CPU
    torch tensors, DLPack and buffer-protocol objects, C-contiguous, no
    copy); the runtime keeps each alive until its ref is freed.
    ``dtypes[i]``, when given and not None, is the tensorlane dtype name to
    publish item i under (``"uint8"`` publishes any array as its raw bytes).
    All or nothing: a refused item raises, naming it, and publishes none."""
    rt = _rt(runtime)
    n = len(arrays)
    if n == 0:
        return []
    if dtypes is not None and len(dtypes) != n:
        raise errors.InvalidArgument(f"{len(dtypes)} dtypes for {n} arrays")
    views: List[np.ndarray] = []
    names: List[bytes] = []
    ndims: List[int] = []
    dims: List[int] = []
    for i, x in enumerate(arrays):
        a = _runtime.as_array(x)
        if not a.flags.c_contiguous:
            raise errors.InvalidArgument(
                f"item {i}: non-contiguous array (shape {a.shape}, strides {a.strides}): "
                "pass numpy.ascontiguousarray(a) (one copy) or publish a contiguous array")
        if a.nbytes == 0:
            raise errors.InvalidArgument(f"item {i}: empty array (shape {a.shape}): nothing to publish")
        name = dtypes[i] if dtypes is not None and dtypes[i] is not None else None
        if name is None:
            try:
                name = "bfloat16" if str(getattr(x, "dtype", "")) == "torch.bfloat16" else _runtime.tl_dtype(a.dtype)
            except errors.InvalidArgument as e:
                raise errors.InvalidArgument(f"item {i}: {e}") from None
        if name == "uint8" and a.dtype != np.uint8:
            a = a.reshape(-1).view(np.uint8)  # raw bytes: one dimension of nbytes
        views.append(a)
        names.append(name.encode())
        ndims.append(a.ndim)
        dims.extend(int(d) for d in a.shape)
    ptrs = (ctypes.c_void_p * n)(*[a.__array_interface__["data"][0] for a in views])
    nbytes = (ctypes.c_int64 * n)(*[a.nbytes for a in views])
    dts = (ctypes.c_char_p * n)(*names)
    nds = (ctypes.c_int32 * n)(*ndims)
    shapes = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    cap = 1024 * n
    while True:
        out = ctypes.create_string_buffer(cap)
        lens = (ctypes.c_size_t * n)()
        total = ctypes.c_size_t(0)
        code = _lib.lib().tl_put_batch(rt._h(), n, ptrs, nbytes, dts, nds, shapes, None, out, cap, lens, ctypes.byref(total))
        if code == 11 and total.value > cap:  # too_small: nothing stays published; again with room
            cap = total.value
            continue
        _lib.check(code)
        break
    refs: List[_runtime.Ref] = []
    off = 0
    raw = out.raw
    with rt._lock:
        for i in range(n):
            ref = _runtime.Ref(raw[off: off + lens[i]])
            off += lens[i]
            refs.append(ref)
            x = arrays[i]
            rt._held[bytes(ref)] = x if isinstance(x, np.ndarray) else (x, views[i])
    return refs


def _pack(refs: Sequence[bytes]) -> Tuple[bytes, Any]:
    lens = (ctypes.c_size_t * len(refs))(*[len(r) for r in refs])
    return b"".join(bytes(r) for r in refs), lens


def _shape_of(rt_ref: bytes, layout: Optional[Layout], nbytes: int, view: bool) -> Tuple[np.dtype, tuple, Optional[tuple]]:
    """(dtype, shape, byte strides or None for C order) of a ref's tensor."""
    if layout is not None:
        shape, dtype = layout
        return np.dtype(dtype), tuple(int(d) for d in shape), None
    info = _runtime.ref_info(rt_ref)
    dt = _runtime.np_dtype(info["dtype"])
    shape = tuple(info["shape"] or ())
    strides = tuple(int(s) * dt.itemsize for s in (info["strides"] or ()))
    return dt, shape, strides


def _shaped(raw: np.ndarray, i: int, ref: bytes, layout: Optional[Layout], readonly: bool) -> np.ndarray:
    dt, shape, strides = _shape_of(ref, layout, raw.nbytes, readonly)
    count = int(np.prod(shape, dtype=np.int64))
    if strides is None or strides == _runtime._c_strides(shape, dt.itemsize):
        if count * dt.itemsize != raw.nbytes:
            raise errors.LayoutMismatch(f"item {i}: the object holds {raw.nbytes} bytes, not a {dt}{list(shape)} tensor")
        return raw.view(dt).reshape(shape)
    return np.lib.stride_tricks.as_strided(raw.view(dt), shape=shape, strides=strides, writeable=not readonly)


def _finish(n: int, code: int, codes: Any, build, return_exceptions: bool) -> List[Any]:
    first_msg = _last_message() if code != 0 else ""
    out: List[Any] = []
    first: Optional[errors.Error] = None
    for i in range(n):
        c = codes[i]
        if c == 0:
            try:
                out.append(build(i))
            except errors.Error as e:
                out.append(e)
                first = first or e
            continue
        msg = first_msg if first is None and first_msg else f"tensorlane: item {i} of {n}: {errors.KINDS[c] if 0 < c < len(errors.KINDS) else 'other'}"
        e = errors.from_code(c, msg)
        out.append(e)
        first = first or e
    if code != 0 and first is None:  # the batch failed as a whole
        raise errors.from_code(code, first_msg)
    if first is not None and not return_exceptions:
        raise first  # the items already made are released as they go out of scope
    return out


def _read_args(refs: Sequence[bytes], runtime: Optional[_runtime.Runtime],
               layouts: Optional[Sequence[Optional[Layout]]]) -> tuple:
    """What tl_get_batch and tl_view_batch take alike: the runtime, the
    count, the packed refs and their lengths, and the out arrays for each
    item's address, length and code."""
    rt = _rt(runtime)
    n = len(refs)
    if layouts is not None and len(layouts) != n:
        raise errors.InvalidArgument(f"{len(layouts)} layouts for {n} refs")
    blob, lens = _pack(refs)
    return rt, n, blob, lens, (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int32 * n)()


def get_batch(refs: Sequence[bytes], *, runtime: Optional[_runtime.Runtime] = None, timeout: Optional[float] = None,
              op: Optional[int] = None, layouts: Optional[Sequence[Optional[Layout]]] = None,
              return_exceptions: bool = False) -> List[Union[np.ndarray, errors.Error]]:
    """Reads every ref into new, writable shareable memory in one call: one
    lease request per owner, transfers coalesced per owner and path.

    ``timeout`` (seconds) bounds the whole batch; ``op`` names it for
    :meth:`Runtime.cancel`; ``layouts[i]`` ``(shape, dtype)`` reinterprets
    item i's bytes (e.g. a dtype tensorlane carries as raw bytes). Raises the
    first item's error unless ``return_exceptions``, which puts each failed
    item's exception in its place."""
    if not refs:
        return []
    rt, n, blob, lens, ptrs, nbytes, codes = _read_args(refs, runtime, layouts)
    code = _lib.lib().tl_get_batch(rt._h(), n, blob, lens, op or 0, _ms(timeout), ptrs, nbytes, codes)
    # Every successful item's memory is ours from here: wrap each before
    # anything can raise, so none leaks.
    blocks = [np.asarray(_runtime._Block(rt._h(), ptrs[i], nbytes[i])) if codes[i] == 0 and ptrs[i] else None for i in range(n)]

    def build(i: int) -> np.ndarray:
        return _shaped(blocks[i], i, refs[i], layouts[i] if layouts else None, False)

    return _finish(n, code, codes, build, return_exceptions)


def view_batch(refs: Sequence[bytes], *, runtime: Optional[_runtime.Runtime] = None, populate: bool = True,
               timeout: Optional[float] = None, op: Optional[int] = None,
               layouts: Optional[Sequence[Optional[Layout]]] = None,
               return_exceptions: bool = False) -> List[Union[np.ndarray, errors.Error]]:
    """Maps every same-host ref read-only into this process in one call (no
    copies; an owner's slab mapped once for all its objects), as
    :meth:`Runtime.view` does for one: each array's memory stays valid for
    as long as it lives. Items no path can map raise (or, with
    ``return_exceptions``, hold) :class:`~tensorlane.NoZeroCopy`: read those
    with :func:`get_batch`. Other arguments as :func:`get_batch`."""
    if not refs:
        return []
    rt, n, blob, lens, ptrs, nbytes, codes = _read_args(refs, runtime, layouts)
    views = (ctypes.c_uint64 * n)()
    flags = _runtime.VIEW_POPULATE if populate else 0
    code = _lib.lib().tl_view_batch(rt._h(), n, blob, lens, flags, op or 0, _ms(timeout), views, ptrs, nbytes, codes)
    held = [np.asarray(_runtime._View(rt._h(), views[i], ptrs[i], nbytes[i])) if codes[i] == 0 and ptrs[i] else None for i in range(n)]

    def build(i: int) -> np.ndarray:
        return _shaped(held[i], i, refs[i], layouts[i] if layouts else None, True)

    return _finish(n, code, codes, build, return_exceptions)
