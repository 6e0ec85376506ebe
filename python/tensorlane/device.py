"""Device (GPU) memory from Python: arrays on a CUDA or ROCm device that
speak DLPack, copies between host and device, and publishing and reading
device tensors (torch CUDA tensors, CuPy arrays, anything with
``__dlpack__`` on a CUDA or ROCm device).

The runtime must have real memory for the device: create it with
``{"device_backend": "cuda"}`` (or ``"hip"``; ``"auto"`` on a discovered
host with the driver there), or with ``{"sim_devices": true}`` and
``TENSORLANE_DEVICE_BACKEND`` saying the same. Otherwise every call
here raises :class:`tensorlane.UnknownDevice`, saying the runtime's devices
are simulated.

Devices are named as torch names them: ``"cuda:0"``, ``"rocm:0"`` (also
``"hip:0"``), ``"cpu"``; the index is the driver's ordinal, as
``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` number the GPUs.
Nothing happens at import.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from . import _lib, errors
from ._runtime import Ref, Runtime, np_dtype, runtime as default_runtime, tl_dtype

#: DLPack device type codes.
DL_CPU, DL_CUDA, DL_ROCM = 1, 2, 10

_NAMES = {"cpu": DL_CPU, "cuda": DL_CUDA, "rocm": DL_ROCM, "hip": DL_ROCM}


def parse_device(device: Any) -> Tuple[int, int]:
    """(DLPack type, index) of ``"cuda:0"``, ``"rocm:1"``, ``"cpu"``, a
    ``(type, index)`` pair or a ``torch.device``."""
    if isinstance(device, tuple) and len(device) == 2:
        return int(device[0]), int(device[1])
    s = str(device).strip().lower()
    kind, _, idx = s.partition(":")
    if kind not in _NAMES:
        raise errors.InvalidArgument(f"unknown device {device!r} (want cuda:N, rocm:N or cpu)")
    try:
        index = int(idx) if idx else 0
    except ValueError:
        raise errors.InvalidArgument(f"bad device index in {device!r}") from None
    if index < 0:
        raise errors.InvalidArgument(f"bad device index in {device!r}")
    return _NAMES[kind], index


def _device_name(t: int, i: int) -> str:
    return {DL_CPU: "cpu", DL_CUDA: f"cuda:{i}", DL_ROCM: f"rocm:{i}"}.get(t, f"dlpack({t}):{i}")


# ---- DLPack structures (dlpack.h, the legacy unversioned ABI every
# producer and consumer speaks).


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# DLPack dtype codes: int 0, uint 1, float 2, bfloat 4, bool 6.
_DL_CODES = {
    "bool": (6, 8), "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64), "uint8": (1, 8),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16),
}
_FROM_DL = {v: k for k, v in _DL_CODES.items()}

_api = ctypes.pythonapi
# The destructor gets the dying capsule as a raw pointer: wrapping an object
# whose reference count already reached zero in a py_object would revive and
# free it twice.
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_raw_is_valid: Any = None
_raw_get_pointer: Any = None
_pyapi_lock = threading.Lock()
_pyapi_ready = False


def _pyapi() -> None:
    """Declares the CPython capsule functions (once, on first use)."""
    global _pyapi_ready, _raw_is_valid, _raw_get_pointer
    with _pyapi_lock:
        if _pyapi_ready:
            return
        _raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
        _raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
        _api.PyCapsule_New.restype = ctypes.py_object
        _api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
        _api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        _api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        _api.PyCapsule_IsValid.restype = ctypes.c_int
        _api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
        _pyapi_ready = True


# Managed tensors handed out by __dlpack__, alive until their deleter runs:
# address -> (the struct, its shape array, the array it keeps alive).
_exported: Dict[int, Tuple[Any, Any, Any]] = {}
_exported_lock = threading.Lock()


@_DELETER
def _delete_managed(p):  # called by the consumer when done (or by our capsule destructor)
    with _exported_lock:
        _exported.pop(ctypes.addressof(p.contents), None)


@_CAPSULE_DESTRUCTOR
def _capsule_gone(capsule):
    # A capsule nobody consumed (still named "dltensor") owns its tensor.
    if _raw_is_valid(capsule, b"dltensor"):
        p = _raw_get_pointer(capsule, b"dltensor")
        with _exported_lock:
            _exported.pop(p, None)


class DLPackInfo:
    """What a DLPack producer says of its tensor: device, data pointer
    (byte_offset applied), dtype name, shape, whether it is C-contiguous,
    and its size in bytes."""

    def __init__(self, dev: Tuple[int, int], ptr: int, dtype: str, shape: Tuple[int, ...], contiguous: bool):
        self.device, self.ptr, self.dtype, self.shape, self.contiguous = dev, ptr, dtype, shape, contiguous
        self.nbytes = math.prod(shape) * _DL_CODES[dtype][1] // 8

    def __repr__(self) -> str:
        return f"DLPackInfo({_device_name(*self.device)}, {self.dtype}{list(self.shape)}, ptr={self.ptr:#x})"


def dlpack_info(x: Any) -> DLPackInfo:
    """Reads the DLPack tensor of x (an object with ``__dlpack__``) without
    taking it over; x must stay alive while its memory is used. A torch
    CUDA tensor's stream is synchronised first: tensorlane copies on its
    own streams."""
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise errors.InvalidArgument(f"{type(x).__name__} does not speak DLPack (__dlpack__, __dlpack_device__)")
    dev = tuple(int(v) for v in x.__dlpack_device__())
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda:
        torch.cuda.current_stream(x.device).synchronize()
    _pyapi()
    capsule = x.__dlpack__() if dev[0] == DL_CPU else x.__dlpack__(stream=None)
    p = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    if not p:
        raise errors.InvalidArgument("not a DLPack capsule")
    t = ctypes.cast(p, ctypes.POINTER(_DLManagedTensor)).contents.dl_tensor
    code = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or code not in _FROM_DL:
        raise errors.InvalidArgument(f"unsupported DLPack dtype code {t.dtype.code} bits {t.dtype.bits} lanes {t.dtype.lanes}")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    contiguous = True
    if t.strides:
        want = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != want:
                contiguous = False
            want *= shape[i]
    info = DLPackInfo((dev[0], dev[1]), (t.data or 0) + t.byte_offset, _FROM_DL[code], shape, contiguous)
    del capsule  # the producer's destructor frees its managed tensor; x keeps the memory
    return info


class DeviceArray:
    """Shareable device memory of a runtime (``tensorlane.empty(...,
    device="cuda:0")``): it speaks DLPack on its device (``torch.from_dlpack``,
    ``cupy.from_dlpack``), publishing it costs no copy, and a reader process
    on the host imports the allocation's own handle. The memory is freed by
    :meth:`free` (or when the array is collected); objects published from
    it keep their bytes until they are freed."""

    def __init__(self, rt: Runtime, dev: Tuple[int, int], ptr: int, shape: Tuple[int, ...], dtype: np.dtype, name: str):
        self._rt, self.device_type, self.device_index = rt, dev[0], dev[1]
        self.ptr, self.shape, self.dtype, self._name = ptr, shape, dtype, name
        self.nbytes = math.prod(shape) * dtype.itemsize

    @property
    def device(self) -> str:
        """``"cuda:0"`` or ``"rocm:0"``."""
        return _device_name(self.device_type, self.device_index)

    def __repr__(self) -> str:
        return f"DeviceArray({self._name}{list(self.shape)} on {self.device}, ptr={self.ptr:#x})"

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device_type, self.device_index

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        """A DLPack capsule over the memory. Every tensorlane copy into it
        has completed when its call returned, so no stream needs waiting."""
        if not self.ptr:
            raise errors.Closed("tensorlane: device array freed")
        _pyapi()
        code, bits = _DL_CODES[self._name]
        shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        m = _DLManagedTensor()
        m.dl_tensor = _DLTensor(self.ptr, _DLDevice(self.device_type, self.device_index), len(self.shape),
                                _DLDataType(code, bits, 1), ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, 0)
        m.deleter = _delete_managed
        with _exported_lock:
            _exported[ctypes.addressof(m)] = (m, shape, self)
        return _api.PyCapsule_New(ctypes.addressof(m), b"dltensor", _capsule_gone)

    def numpy(self) -> np.ndarray:
        """A host copy."""
        out = np.empty(self.shape, self.dtype)
        copy(self, out, runtime=self._rt)
        return out

    def free(self) -> None:
        """Gives the memory back (idempotent)."""
        p, self.ptr = self.ptr, 0
        if p and self._rt._handle:
            _lib.check(_lib.lib().tl_device_free(self._rt._handle, ctypes.c_uint64(p)))

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # at interpreter exit the library may be gone
            pass


def empty(shape: Sequence[int] | int, dtype: Any = np.float32, device: Any = "cuda:0",
          runtime: Optional[Runtime] = None) -> DeviceArray:
    """Uninitialised shareable memory on a device, as a :class:`DeviceArray`."""
    rt = runtime or default_runtime()
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    dt = np.dtype(dtype) if not (isinstance(dtype, str) and dtype == "bfloat16") else np_dtype("bfloat16")
    name = "bfloat16" if dtype == "bfloat16" or dt.name == "bfloat16" else tl_dtype(dt)
    t, i = parse_device(device)
    if t == DL_CPU:
        raise errors.InvalidArgument("device='cpu': use tensorlane.empty(shape, dtype) for host memory")
    n = max(math.prod(shape) * dt.itemsize, 1)
    p = ctypes.c_uint64(0)
    _lib.check(_lib.lib().tl_device_alloc(rt._h(), t, i, n, ctypes.byref(p)))
    return DeviceArray(rt, (t, i), p.value, shape, dt, name)


def _endpoint(x: Any) -> Tuple[int, int, int, int, Any]:
    """(type, index, pointer, nbytes, keepalive) of a copy's source or
    destination: a numpy array (host), a DeviceArray, or a DLPack object."""
    if isinstance(x, DeviceArray):
        if not x.ptr:
            raise errors.Closed("tensorlane: device array freed")
        return x.device_type, x.device_index, x.ptr, x.nbytes, x
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise errors.InvalidArgument("non-contiguous numpy array: pass numpy.ascontiguousarray(a)")
        return DL_CPU, 0, x.__array_interface__["data"][0], x.nbytes, x
    info = dlpack_info(x)
    if not info.contiguous:
        raise errors.InvalidArgument(f"non-contiguous tensor {info}: make it contiguous first")
    return info.device[0], info.device[1], info.ptr, info.nbytes, x


def copy(src: Any, dst: Any, runtime: Optional[Runtime] = None) -> Any:
    """Copies src's bytes into dst (same byte size): host to device, device
    to host or device to device, each a numpy array, a :class:`DeviceArray`
    or a DLPack object (a torch CUDA tensor). Returns dst once the bytes are
    there."""
    rt = runtime or (src._rt if isinstance(src, DeviceArray) else dst._rt if isinstance(dst, DeviceArray) else default_runtime())
    st, si, sp, sn, keep_s = _endpoint(src)
    dt, di, dp, dn, keep_d = _endpoint(dst)
    if sn != dn:
        raise errors.InvalidArgument(f"copy of {sn} bytes into {dn}: sizes differ")
    if st == DL_CPU and dt == DL_CPU:
        np.copyto(np.asarray(dst), np.asarray(src))
        return dst
    _lib.check(_lib.lib().tl_device_copy(rt._h(), dt, di, ctypes.c_void_p(dp), st, si, ctypes.c_void_p(sp), sn))
    del keep_s, keep_d
    return dst


def put(x: Any, runtime: Optional[Runtime] = None) -> Ref:
    """Publishes a device tensor: a :class:`DeviceArray` (no copy; it stays
    alive until the object is freed) or any C-contiguous DLPack object on a
    CUDA or ROCm device (copied once on the device into shareable memory the
    object owns; the caller may reuse its tensor at once)."""
    rt = runtime or (x._rt if isinstance(x, DeviceArray) else default_runtime())
    t, i, p, n, _ = _endpoint(x)
    if t == DL_CPU:
        return rt.put(x)
    if isinstance(x, DeviceArray):
        name, shape = x._name, x.shape
    else:
        info = dlpack_info(x)
        name, shape = info.dtype, info.shape
    if n == 0:
        raise errors.InvalidArgument("empty tensor: nothing to publish")
    out = ctypes.create_string_buffer(4096)
    ln = ctypes.c_size_t(0)
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    _lib.check(_lib.lib().tl_put_device(rt._h(), t, i, ctypes.c_uint64(p), name.encode(), len(shape), dims, None,
                                        out, len(out), ctypes.byref(ln)))
    ref = Ref(out.raw[: ln.value])
    if isinstance(x, DeviceArray):
        with rt._lock:
            rt._held[bytes(ref)] = x  # published in place: alive until free
    return ref


def get_into(ref: bytes, dst: Any, runtime: Optional[Runtime] = None, *, timeout: Optional[float] = None,
             op: Optional[int] = None) -> Any:
    """Reads a ref's tensor into dst: a :class:`DeviceArray` or a DLPack
    object on a CUDA or ROCm device (a torch CUDA tensor) holding its bytes,
    or a numpy array (host). Returns dst."""
    rt = runtime or (dst._rt if isinstance(dst, DeviceArray) else default_runtime())
    t, i, p, n, keep = _endpoint(dst)
    if t == DL_CPU:
        return rt.get(ref, out=np.asarray(dst), timeout=timeout, op=op)
    ms = 0 if timeout is None else max(int(timeout * 1000), 1)
    _lib.check(_lib.lib().tl_get_device(rt._h(), bytes(ref), len(ref), t, i, ctypes.c_uint64(p), n, op or 0, ms))
    del keep
    return dst


__all__ = ["DL_CPU", "DL_CUDA", "DL_ROCM", "DeviceArray", "DLPackInfo", "copy", "dlpack_info", "empty", "get_into",
           "parse_device", "put"]
