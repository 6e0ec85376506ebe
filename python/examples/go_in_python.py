"""Go code inside a Python process, the way GoRay runs Go actors in Ray
workers: the Go library is built -buildmode=c-shared and loaded with ctypes.

This example talks to libtensorlane.so through the C ABI directly (no
tensorlane Python package code on the data path), in two threads, then
checks that Python still owns SIGINT, and exits leaving its runtimes open:
the atexit hook (tl_shutdown_all) closes them so the process ends cleanly.

    python python/examples/go_in_python.py   # TENSORLANE_LIB=path/to/libtensorlane.so to override
"""

import ctypes
import json
import os
import signal
import threading

from tensorlane import _lib  # only to find and load the library

lib = _lib.lib()


def check(rc):
    if rc != 0:
        msg = ctypes.create_string_buffer(1024)
        kind = lib.tl_last_error(msg, len(msg), None)
        raise RuntimeError(f"{lib.tl_kind_name(kind).decode()}: {msg.value.decode()}")


def runtime(cfg):
    h = ctypes.c_uint64()
    check(lib.tl_runtime_new(json.dumps(cfg).encode(), ctypes.byref(h)))
    return h.value


owner, reader = runtime({"allow_transports": ["shm"]}), runtime({"allow_transports": ["shm"]})

# The producer writes into shareable memory it got from Go: zero copies.
n = 1 << 22
ptr = ctypes.c_void_p()
check(lib.tl_alloc(owner, n, ctypes.byref(ptr)))
ctypes.memset(ptr, 0x5A, n)
ref = ctypes.create_string_buffer(1024)
ref_len = ctypes.c_size_t()
shape = (ctypes.c_int64 * 1)(n)
check(lib.tl_put(owner, ptr, n, b"uint8", 1, shape, None, ref, len(ref), ctypes.byref(ref_len)))

results = []


def read():
    dst = ctypes.create_string_buffer(n)
    check(lib.tl_get_into(reader, ref.raw[: ref_len.value], ref_len.value, dst, n, 0, 10_000))
    results.append(dst.raw == b"\x5a" * n)


threads = [threading.Thread(target=read) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert results == [True, True], results
print("bytes verified in", len(results), "threads")

# The Go runtime took no signal Python handles: Ctrl-C is still Python's.
try:
    os.kill(os.getpid(), signal.SIGINT)
    signal.sigtimedwait([], 0.1) if hasattr(signal, "sigtimedwait") else None
    for _ in range(1000):
        pass
    print("no KeyboardInterrupt: SIGINT was taken from Python")
except KeyboardInterrupt:
    print("KeyboardInterrupt raised: Python keeps SIGINT")

# Runtimes stay open on purpose: atexit's tl_shutdown_all closes them.
