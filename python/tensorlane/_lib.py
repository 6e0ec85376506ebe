"""Loads libtensorlane (the Go library built -buildmode=c-shared) with ctypes
and declares its functions. Nothing happens at import: the library loads on
first use."""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from pathlib import Path
from typing import Optional

from . import errors

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
#: The process that loaded the library. The Go runtime inside it does not
#: survive fork(): a child has the library's memory but none of its
#: threads, and any call into it (the inherited atexit hook included) waits
#: for ever on them.
_pid: Optional[int] = None

#: Environment variable naming the shared library to load instead of the
#: one built into the package (for development builds).
ENV_LIB = "TENSORLANE_LIB"

u64, i64, i32, sz = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_size_t
vp, cp, u8p = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint8)
_PROTOS = {
    "tl_abi_version": ([], ctypes.c_int),
    "tl_kind_name": ([ctypes.c_int], cp),
    "tl_last_error": ([cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_runtime_new": ([cp, ctypes.POINTER(u64)], ctypes.c_int),
    "tl_runtime_close": ([u64], ctypes.c_int),
    "tl_shutdown_all": ([], ctypes.c_int),
    "tl_node_pool_serve": ([cp, i64, i64], ctypes.c_int),
    "tl_alloc": ([u64, i64, ctypes.POINTER(vp)], ctypes.c_int),
    "tl_free_memory": ([u64, vp], ctypes.c_int),
    "tl_put": ([u64, vp, i64, cp, i32, ctypes.POINTER(i64), ctypes.POINTER(i64), cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_put_gathered": ([u64, vp, i64, i32, ctypes.POINTER(vp), ctypes.POINTER(i64), ctypes.POINTER(i64), i32, cp, sz,
                         ctypes.POINTER(sz)], ctypes.c_int),
    "tl_connect": ([u64, cp, i64], ctypes.c_int),
    "tl_get_into": ([u64, cp, sz, vp, i64, u64, i64], ctypes.c_int),
    "tl_get": ([u64, cp, sz, u64, i64, ctypes.POINTER(vp), ctypes.POINTER(i64)], ctypes.c_int),
    "tl_view": ([u64, cp, sz, ctypes.c_uint32, u64, i64, ctypes.POINTER(u64), ctypes.POINTER(vp), ctypes.POINTER(i64)], ctypes.c_int),
    "tl_view_release": ([u64, u64], ctypes.c_int),
    "tl_cancel": ([u64, u64], ctypes.c_int),
    "tl_release": ([u64, cp, sz], ctypes.c_int),
    "tl_free": ([u64, cp, sz, i64], ctypes.c_int),
    "tl_explain": ([u64, cp, sz, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_ref_info": ([cp, sz, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_stats": ([u64, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_hold": ([u64, cp, sz, i64], ctypes.c_int),
    # Device memory (tensorlane.h's "Device memory" section; device.py).
    "tl_device_alloc": ([u64, i32, i32, i64, ctypes.POINTER(u64)], ctypes.c_int),
    "tl_device_free": ([u64, u64], ctypes.c_int),
    "tl_put_device": ([u64, i32, i32, u64, cp, i32, ctypes.POINTER(i64), ctypes.POINTER(i64), cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_get_device": ([u64, cp, sz, i32, i32, u64, i64, u64, i64], ctypes.c_int),
    "tl_device_copy": ([u64, i32, i32, vp, i32, i32, vp, i64], ctypes.c_int),
    # Weight sync (weightsync.py).
    "tl_slot_reserve": ([u64, vp, i64, cp, i32, ctypes.POINTER(i64), ctypes.POINTER(i64), ctypes.c_uint32,
                         ctypes.POINTER(u64), cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_slot_wait": ([u64, u64, u64, i64, ctypes.POINTER(u64)], ctypes.c_int),
    "tl_slots_wait": ([u64, ctypes.POINTER(u64), ctypes.POINTER(u64), i32, i64, ctypes.POINTER(u64)], ctypes.c_int),
    "tl_slot_done": ([u64, u64, u64], ctypes.c_int),
    "tl_slot_info": ([u64, u64, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_slot_close": ([u64, u64], ctypes.c_int),
    "tl_push": ([u64, cp, sz, cp, sz, i64, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_push_runs": ([u64, cp, sz, cp, sz, ctypes.POINTER(i64), sz, i64, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_push_batch": ([u64, cp, i64, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_broadcast_start": ([u64, cp, i64, ctypes.POINTER(u64)], ctypes.c_int),
    "tl_broadcast_explain": ([u64, cp, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_op_progress": ([u64, u64, ctypes.POINTER(i64), ctypes.POINTER(i64), ctypes.POINTER(i32)], ctypes.c_int),
    "tl_op_wait": ([u64, u64, i64, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    "tl_op_wait_consumed": ([u64, u64, i64], ctypes.c_int),
    "tl_op_cancel": ([u64, u64], ctypes.c_int),
    "tl_op_close": ([u64, u64], ctypes.c_int),
    "tl_wait_consumed": ([u64, cp, sz, u64, i64], ctypes.c_int),
    "tl_delta_bound": ([i64], i64),
    "tl_delta_encode": ([vp, vp, i64, i32, vp, i64, ctypes.POINTER(i64), ctypes.POINTER(i64)], ctypes.c_int),
    "tl_delta_encode_advance": ([vp, vp, i64, i32, vp, i64, ctypes.POINTER(i64), ctypes.POINTER(i64)], ctypes.c_int),
    "tl_delta_decode": ([vp, i64, vp, i64], ctypes.c_int),
    "tl_delta_revert": ([vp, i64, vp, i64], ctypes.c_int),
    "tl_delta_check": ([vp, i64, vp, i64], ctypes.c_int),
    "tl_delta_codec_rate": ([], ctypes.c_double),
    "tl_reshard_plan": ([cp, cp, sz, ctypes.POINTER(sz)], ctypes.c_int),
    # Batches (_batch.py): refs back to back with their lengths beside.
    "tl_put_batch": ([u64, i32, ctypes.POINTER(vp), ctypes.POINTER(i64), ctypes.POINTER(cp), ctypes.POINTER(i32),
                      ctypes.POINTER(i64), ctypes.POINTER(i64), cp, sz, ctypes.POINTER(sz), ctypes.POINTER(sz)], ctypes.c_int),
    "tl_get_batch": ([u64, i32, cp, ctypes.POINTER(sz), u64, i64, ctypes.POINTER(vp), ctypes.POINTER(i64),
                      ctypes.POINTER(i32)], ctypes.c_int),
    "tl_view_batch": ([u64, i32, cp, ctypes.POINTER(sz), ctypes.c_uint32, u64, i64, ctypes.POINTER(u64),
                       ctypes.POINTER(vp), ctypes.POINTER(i64), ctypes.POINTER(i32)], ctypes.c_int),
}


def path() -> Path:
    """Where the shared library is loaded from."""
    override = os.environ.get(ENV_LIB)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "_lib" / "libtensorlane.so"


def usable() -> bool:
    """Whether this process may call into the library: it is loaded here,
    not inherited through fork() from the process that loaded it."""
    return _lib is not None and _pid == os.getpid()


def _forked() -> errors.Closed:
    return errors.Closed(
        f"tensorlane: the library was loaded by process {_pid} before it forked this one ({os.getpid()}); "
        "its Go runtime does not survive fork(), so no call into it can work here. Use tensorlane from the "
        "parent, or start children with multiprocessing's 'spawn' or 'forkserver' method"
    )


def _shutdown_at_exit() -> None:
    # Only in the process that loaded the library: in a forked child the
    # call would never return, and the child never exit.
    if usable():
        _lib.tl_shutdown_all()


def lib() -> ctypes.CDLL:
    """The loaded library (loaded once, on first use). Raises
    :class:`~tensorlane.Closed` in a child forked after it was loaded."""
    global _lib, _pid
    if _lib is not None:
        if _pid != os.getpid():
            raise _forked()
        return _lib
    with _lock:
        if _lib is None:
            p = path()
            if not p.exists():
                raise errors.Other(
                    f"tensorlane: shared library not found at {p}; install the package with "
                    f"`pip install ./python` (needs Go on PATH) or set {ENV_LIB}"
                )
            # CDLL releases the GIL during each call: transfers run while
            # other Python threads (Ray's) keep going.
            l = ctypes.CDLL(str(p))
            for name, (args, res) in _PROTOS.items():
                f = getattr(l, name)
                f.argtypes, f.restype = args, res
            if l.tl_abi_version() != 1:
                raise errors.Other(f"tensorlane: {p} has ABI version {l.tl_abi_version()}, want 1")
            _lib, _pid = l, os.getpid()
            # Leave cleanly at interpreter exit: peers see the runtimes go.
            atexit.register(_shutdown_at_exit)
    if _pid != os.getpid():
        raise _forked()
    return _lib


def check(code: int) -> None:
    """Raises the exception for a non-zero return code of the calling thread."""
    if code == 0:
        return
    buf = ctypes.create_string_buffer(2048)
    lib().tl_last_error(buf, len(buf), None)
    raise errors.from_code(code, buf.value.decode("utf-8", "replace"))


def call_json(fn, *args) -> str:
    """Calls a function that writes JSON into a buffer, growing it as needed."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = sz(0)
        code = fn(*args, buf, size, ctypes.byref(n))
        if code == 11 and n.value > size:  # too_small: retry with the size it asked for
            size = n.value
            continue
        check(code)
        return buf.value.decode("utf-8")
