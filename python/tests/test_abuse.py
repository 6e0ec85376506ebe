"""The abuse suite over the Python package (issue 29): forged refs, forged
shapes, huge lengths, bad handles and closed runtimes through the public API
must raise typed errors, never crash the interpreter, hang, or grow the
resident memory; and the binding's own defects of that review (items 2, 4,
7, 11, 17, 18, 20), each with a test that fails on the code before its fix.

What could crash the interpreter on the old code runs in a subprocess, so a
regression fails one test instead of killing the run."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import subprocess
import sys
import textwrap
import time
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np
import pytest

import tensorlane as tl
from tensorlane import _lib, errors

KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

CONFIGS = {
    "per-object": {"allow_transports": ["shm"]},
    "slabs": {"allow_transports": ["shm"], "slabs": True, "cluster_key": KEY, "pool_bytes": 8 << 20, "slab_bytes": 8 << 20},
    "tcp": {"allow_transports": ["tcp"]},
}


@pytest.fixture(params=sorted(CONFIGS))
def pair(request) -> Iterator[Tuple[str, tl.Runtime, tl.Runtime]]:
    a, b = tl.Runtime(CONFIGS[request.param]), tl.Runtime(CONFIGS[request.param])
    yield request.param, a, b
    a.close()
    b.close()


# Refs are forged byte by byte, as an attacker would: the format is
# rdt.Ref.MarshalBinary's (magic, version, object id, then length-prefixed
# fields and uvarints up to the tensor's desc).


def _uvarint(p: bytes, i: int) -> Tuple[int, int]:
    x = s = 0
    while True:
        b = p[i]
        i += 1
        x |= (b & 0x7F) << s
        if b < 0x80:
            return x, i
        s += 7


def _enc(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def forge(ref: bytes, shape: Optional[Sequence[int]] = None, dtype_code: Optional[int] = None) -> bytes:
    """ref with its shape (row-major strides) or dtype code replaced."""
    p = bytes(ref)
    i = 3 + 16  # magic, version, object id

    def skip_bytes(i: int) -> int:
        n, i = _uvarint(p, i)
        return i + n

    i = skip_bytes(i)  # owner
    _, i = _uvarint(p, i)  # incarnation
    n, i = _uvarint(p, i)
    for _ in range(n):  # control addresses
        i = skip_bytes(i)
    n, i = _uvarint(p, i)
    for _ in range(2 * n):  # data addresses
        i = skip_bytes(i)
    i = skip_bytes(skip_bytes(i))  # host, device kind
    _, i = _uvarint(p, i)  # device index
    dt = i
    i += 1
    ndim, i = _uvarint(p, i)
    dims = []
    for _ in range(ndim):
        d, i = _uvarint(p, i)
        dims.append(d)
    flag = p[i]
    i += 1
    if flag:
        for _ in range(ndim):
            _, i = _uvarint(p, i)
    code = p[dt] if dtype_code is None else dtype_code
    if shape is None:
        layout = p[dt + 1 : i]  # shape and strides as they were
    else:  # the new shape, strides absent (row-major)
        layout = _enc(len(shape)) + b"".join(_enc(d) for d in shape) + b"\0"
    return p[:dt] + bytes([code]) + layout + p[i:]


def rss() -> int:
    """This process's resident memory, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise RuntimeError("no VmRSS")


def run_script(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter with this environment (the library
    under test); a hang is killed at timeout and reported as such."""
    env = dict(os.environ, TENSORLANE_TRANSPORTS="")
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the script hung (killed after {timeout} s): {e.stdout} {e.stderr}")


def test_forge_helper_round_trips():
    with tl.Runtime({}) as a:
        ref = a.put(np.arange(6, dtype=np.float32).reshape(2, 3))
        assert forge(ref) == bytes(ref)
        assert tl.ref_info(forge(ref, [3, 2]))["shape"] == [3, 2]


# Item 2: a forged shape allocates nothing on the reader.


def test_forged_shape_allocates_nothing(pair):
    name, a, b = pair
    ref = a.put(np.ones(2, np.float32))  # 8 bytes
    forged = forge(ref, [256 << 20])  # 1 GiB of float32
    assert tl.ref_info(forged)["nbytes"] == 1 << 30
    for who, rt in (("reader", b), ("owner", a)):
        before, rss0 = rt.stats()["host_memory"], rss()
        for _ in range(3):
            with pytest.raises(errors.LayoutMismatch):
                rt.get(forged)
        after = rt.stats()["host_memory"]
        assert after["slab_count"] == before["slab_count"], f"{who}: a slab was made for the forged size"
        assert after["peak"] - before["peak"] < 1 << 20, f"{who}: the forged size was allocated"
        assert rss() - rss0 < 256 << 20, f"{who}: resident memory grew by {(rss() - rss0) >> 20} MiB"
    for who, rt in (("reader", b), ("owner", a)):  # the other reads that take the ref's word for its size
        before, rss0 = rt.stats()["host_memory"], rss()
        if who == "reader":
            with pytest.raises(errors.LayoutMismatch):
                rt.hold(forged)
            if name != "tcp":
                with pytest.raises(errors.LayoutMismatch):
                    rt.view(forged)
        with pytest.raises(errors.TooSmall):
            rt.get(forged, out=np.empty(2, np.float32))  # a destination of the true size: refused unread
        after = rt.stats()["host_memory"]
        assert after["slab_count"] == before["slab_count"], f"{who}: a slab was made for the forged size"
        assert after["peak"] - before["peak"] < 1 << 20, f"{who}: the forged size was allocated"
        assert rss() - rss0 < 256 << 20, f"{who}: resident memory grew by {(rss() - rss0) >> 20} MiB"
    np.testing.assert_array_equal(b.get(ref), np.ones(2, np.float32))


def test_forged_metadata_shape_on_view():
    """Ray passes the shape in its metadata: a forged one is refused."""
    a, b = tl.Runtime(CONFIGS["per-object"]), tl.Runtime(CONFIGS["per-object"])
    try:
        ref = a.put(np.ones(16, np.float32))
        with pytest.raises(errors.LayoutMismatch):
            b.view(ref, shape=(1 << 20,), dtype=np.float32)
        with pytest.raises(errors.LayoutMismatch):
            b.get(forge(ref, [4, 4]), out=np.empty((4, 4), np.float32))  # the right size, not the published layout
        for code in range(32):  # another dtype: not the published layout, or no dtype at all
            if forge(ref, dtype_code=code) != bytes(ref):
                with pytest.raises(errors.MalformedRef):
                    b.get(forge(ref, dtype_code=code))
    finally:
        a.close()
        b.close()


def test_forged_and_garbage_refs_are_typed():
    a, b = tl.Runtime(CONFIGS["per-object"]), tl.Runtime(CONFIGS["per-object"])
    try:
        ref = a.put(np.arange(64, dtype=np.int32))
        rng = np.random.default_rng(29)
        bad = [b"", b"TR", b"TR\x01", bytes(ref)[:20], bytes(ref) + b"x" * 3, b"\xff" * 300,
               bytes(rng.integers(0, 256, 400, dtype=np.uint8))]
        for i in range(40):  # single-byte corruptions
            p = bytearray(ref)
            p[int(rng.integers(len(p)))] ^= 1 << int(rng.integers(8))
            bad.append(bytes(p))
        for r in bad:
            for call in (lambda: b.get(r), lambda: b.view(r), lambda: b.hold(r), lambda: b.release(r),
                         lambda: a.free(r, timeout=1), lambda: b.explain(r), lambda: tl.ref_info(r),
                         lambda: b.get(r, out=np.empty(64, np.int32))):
                try:
                    call()
                except errors.Error as e:
                    assert e.kind != "other" or "internal error" not in e.message, e.message
                except (TypeError, ValueError, KeyError) as e:
                    pytest.fail(f"an untyped {type(e).__name__} for a bad ref: {e}")
        # (A flip that spares the object id and token still names the
        # object: its free was legitimate.) Both runtimes still work.
        np.testing.assert_array_equal(b.get(a.put(np.arange(8, dtype=np.int32))), np.arange(8, dtype=np.int32))
    finally:
        a.close()
        b.close()


# Huge lengths and bad handles straight through the C ABI (what the Python
# API passes for callers), and closed runtimes through the API.


def test_hostile_lengths_and_handles():
    l = _lib.lib()
    with tl.Runtime({}) as a:
        ref = bytes(a.put(np.arange(16, dtype=np.float32)))
        dst = np.empty(16, np.float32)
        ptr = dst.__array_interface__["data"][0]
        for n in (1 << 31, (1 << 32) + 5, (1 << 64) - 1):
            assert l.tl_get_into(a._handle, ref, n, ptr, dst.nbytes, 0, 1000) == 2  # invalid_argument
            assert l.tl_release(a._handle, ref, n) == 2
            out = ctypes.create_string_buffer(64)
            assert l.tl_ref_info(ref, n, out, 64, None) == 2
        for n in (-1, 1 << 62):
            assert l.tl_get_into(a._handle, ref, len(ref), ptr, n, 0, 1000) == 2
            assert l.tl_alloc(a._handle, n, ctypes.byref(ctypes.c_void_p())) == 2
        need = ctypes.c_size_t(0)
        assert l.tl_last_error(None, 64, ctypes.byref(need)) == 2 and need.value > 1  # used to abort the process
        for h in (0, 12345, (1 << 64) - 1):
            assert l.tl_get_into(h, ref, len(ref), ptr, dst.nbytes, 0, 1000) == 2
            assert l.tl_view_release(h, 1) == 2
            assert l.tl_stats(h, out, 64, None) == 2
        a.free(ref)


def test_closed_runtime_is_typed():
    a, b = tl.Runtime({}), tl.Runtime({})
    ref = a.put(np.arange(16, dtype=np.float32))
    a.close()
    a.close()  # idempotent
    for call in (lambda: a.put(np.ones(4)), lambda: a.get(ref), lambda: a.view(ref), lambda: a.empty(4),
                 lambda: a.free(ref), lambda: a.release(ref), lambda: a.hold(ref), lambda: a.explain(ref),
                 lambda: a.stats(), lambda: a.cancel(1)):
        with pytest.raises(errors.Closed):
            call()
    # A reader of a closed owner's ref gets a typed error, within its timeout.
    with pytest.raises(errors.Error) as e:
        b.get(ref, timeout=10)
    assert e.value.kind != "other", e.value.message
    b.close()


def test_abuse_keeps_resident_memory_flat():
    """Many rounds of forged and bad calls: resident memory stays put."""
    a, b = tl.Runtime(CONFIGS["slabs"]), tl.Runtime(CONFIGS["slabs"])
    try:
        ref = a.put(np.ones(1024, np.float32))
        forged = forge(ref, [64 << 20])  # 256 MiB each

        def round_():
            for call in (lambda: b.get(forged), lambda: b.view(forged), lambda: b.hold(forged),
                         lambda: b.get(forged[:-3]), lambda: b.get(ref, out=np.empty(3, np.float32))):
                with pytest.raises(errors.Error):
                    call()
            b.view(ref)  # and a legitimate view and copy, dropped at once
            b.get(ref)

        for _ in range(5):
            round_()
        gc.collect()
        base = rss()
        for _ in range(50):
            round_()
        gc.collect()
        grew = rss() - base
        assert grew < 64 << 20, f"resident memory grew by {grew >> 20} MiB over 50 rounds of 256 MiB forgeries"
        assert b.stats()["live_views"] == 0
    finally:
        a.close()
        b.close()


# Item 4: closing a runtime (or the exit hook) unmaps nothing live arrays use.


def test_arrays_outlive_close_and_exit():
    r = run_script("""
        import atexit
        import numpy as np
        import tensorlane as tl

        keep = []
        def late_hook():  # registered before tensorlane loads: runs after its exit hook
            for x in keep:
                x.sum()
            print("late hook ok", flush=True)
        atexit.register(late_hook)

        for cfg in ({"allow_transports": ["shm"]}, {"allow_transports": ["shm"], "slabs": True, "cluster_key": "%s"}):
            a, b = tl.Runtime(cfg), tl.Runtime(cfg)
            x = a.empty((256, 1024), np.float32)
            x[:] = 7
            ref = a.put(x)
            y = b.get(ref)
            v = b.view(ref)
            a.close(); b.close()
            x[:] = 3  # writable, still mapped
            assert float(y.sum()) == 7 * x.size and float(v.sum()) == 7 * x.size
            keep += [x, y, v]
        a = tl.Runtime({})
        z = a.empty(1 << 20, np.uint8)
        z[:] = 1
        keep.append(z)
        print("closed ok", flush=True)
    """ % KEY)
    assert r.returncode == 0, f"rc {r.returncode}: {r.stdout} {r.stderr[-3000:]}"
    assert "closed ok" in r.stdout and "late hook ok" in r.stdout


def test_memory_given_back_after_close():
    """An array's memory goes back when the last array over it goes, also
    after its runtime closed (it used to be unmapped at close)."""
    a = tl.Runtime({})
    x = a.empty(1 << 20, np.uint8)
    h, ptr = a._handle, x.__array_interface__["data"][0]
    a.close()
    del x
    gc.collect()
    # Given back: the same pointer is no longer anyone's to free.
    assert _lib.lib().tl_free_memory(h, ptr) == 2


# Item 7: put keeps the buffer it published, not only the object.


class _Borrowing:
    """A DLPack producer that exports a buffer it does not own: only the
    capsule (kept by the consumer's array) keeps it alive."""

    def __init__(self, n: int, value: int):
        self.n, self.value = n, value

    def __dlpack__(self, **kw):
        return np.full(self.n, self.value, np.int64).__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


def test_put_keeps_the_exported_buffer():
    a, b = tl.Runtime(CONFIGS["tcp"]), tl.Runtime(CONFIGS["tcp"])
    try:
        ref = a.put(_Borrowing(64, 42))
        gc.collect()
        junk = [np.full(64, -1, np.int64) for _ in range(64)]  # would take over freed memory
        np.testing.assert_array_equal(b.get(ref), np.full(64, 42, np.int64))
        del junk
        a.free(ref)
    finally:
        a.close()
        b.close()


def test_put_of_mmap_pins_it_until_free():
    a, b = tl.Runtime(CONFIGS["tcp"]), tl.Runtime(CONFIGS["tcp"])
    try:
        m = mmap.mmap(-1, 1 << 16)
        m.write(b"\x07" * (1 << 16))
        ref = a.put(m)
        with pytest.raises(BufferError):
            m.close()  # it used to close, and a reader then read unrelated memory
        assert bytes(b.get(ref)[:4]) == b"\x07" * 4
        a.free(ref)
        m.close()  # free let go of the export
    finally:
        a.close()
        b.close()


# Item 11: fork.


def test_fork_child_exits_and_gets_a_typed_error():
    r = run_script("""
        import os, sys, time
        import numpy as np
        import tensorlane as tl
        from tensorlane import errors

        a = tl.Runtime({})
        x = a.empty(1024, np.uint8)
        ref = a.put(np.ones(4, np.float32))
        for mode in ("untouched", "call"):
            pid = os.fork()
            if pid == 0:
                code = 0
                if mode == "call":
                    try:
                        tl.Runtime({})
                        code = 3
                    except errors.Closed as e:
                        code = 0 if "fork" in str(e) else 4
                    try:
                        a.get(ref)
                        code = 5
                    except errors.Closed:
                        pass
                del x  # an inherited array's memory is not the child's to give back
                sys.exit(code)  # runs atexit: the inherited exit hook must not hang
            deadline = time.monotonic() + 60
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    print("child hung:", mode, flush=True)
                    sys.exit(1)
                time.sleep(0.05)
            assert os.waitstatus_to_exitcode(status) == 0, (mode, status)
        np.testing.assert_array_equal(a.get(ref), np.ones(4, np.float32))  # the parent is fine
        print("fork ok", flush=True)
    """)
    assert r.returncode == 0 and "fork ok" in r.stdout, f"rc {r.returncode}: {r.stdout} {r.stderr[-3000:]}"


# Items 17, 18, 20, 10, 19 through the binding.


def test_view_handles_are_process_wide():
    a, b = tl.Runtime(CONFIGS["per-object"]), tl.Runtime(CONFIGS["per-object"])
    try:
        ra, rb = a.put(np.arange(1024, dtype=np.int32)), b.put(np.arange(1024, dtype=np.int32) * 2)
        va, vb = a.view(rb), b.view(ra)
        hva, hvb = _find_view(va)._view, _find_view(vb)._view
        assert hva != hvb  # they used to be 1 and 1
        # a's handle given to b releases nothing of b's.
        assert _lib.lib().tl_view_release(b._handle, hva) == 0
        assert b.stats()["live_views"] == 1 and a.stats()["live_views"] == 1
        np.testing.assert_array_equal(vb, np.arange(1024, dtype=np.int32))
    finally:
        a.close()
        b.close()


def _find_view(arr: np.ndarray):
    base = arr
    while base is not None and not hasattr(base, "_view"):
        base = base.base
    assert base is not None
    return base


def test_scalar_round_trip(pair):
    name, a, b = pair
    ref = a.put(np.array(3.5, np.float32))
    assert ref.info()["shape"] == []
    y = b.get(ref)
    assert y.shape == () and float(y) == 3.5
    if name != "tcp":
        v = b.view(ref)
        assert v.shape == () and float(v) == 3.5
        del v
    a.free(ref)


def test_own_view_does_not_pin():
    with tl.Runtime({}) as a:
        ref = a.put(np.arange(1024, dtype=np.int64))
        with pytest.raises(errors.NoZeroCopy):
            a.view(ref)
        a.free(ref, timeout=5)  # used to wait the whole timeout and raise Timeout


def test_slab_view_keeps_bytes_after_reader_close():
    a, b = tl.Runtime(CONFIGS["slabs"]), tl.Runtime(CONFIGS["slabs"])
    try:
        x = a.empty(1 << 18, np.float32)
        x[:] = 1.5
        ref = a.put(x)
        del x
        v = b.view(ref)
        b.close()
        a.free(ref)
        fill = [a.empty(1 << 18, np.float32) for _ in range(4)]  # the freed range, reused
        for f in fill:
            f[:] = -1
        assert float(v.min()) == 1.5 and float(v.max()) == 1.5, "the view shows another object"
        del v
    finally:
        a.close()
        b.close()


def test_hold_keeps_the_object():
    a, b = tl.Runtime(CONFIGS["per-object"]), tl.Runtime(CONFIGS["per-object"])
    try:
        ref = a.put(np.arange(32, dtype=np.int16))
        b.hold(ref)
        a.release(ref)  # the owner is done; the reader's hold keeps it
        assert a.stats()["objects"] == 1
        np.testing.assert_array_equal(b.get(ref), np.arange(32, dtype=np.int16))
        b.release(ref)
        a.free(ref, timeout=10)
        assert a.stats()["objects"] == 0
    finally:
        a.close()
        b.close()


def test_torch_never_over_a_read_only_mapping():
    """torch has no read-only tensors: one over a view would take an in-place
    write and crash the worker. The Ray receive path copies a read-only
    array before torch sees it (needs torch; skipped without it)."""
    torch = pytest.importorskip("torch")
    from tensorlane.ray import _torch_from_array

    a, b = tl.Runtime(CONFIGS["per-object"]), tl.Runtime(CONFIGS["per-object"])
    try:
        ref = a.put(np.arange(1024, dtype=np.float32))
        v = b.view(ref)
        assert not v.flags.writeable
        t = _torch_from_array(v, torch.float32)
        t.add_(1)  # would fault on the mapping
        assert float(t[0]) == 1.0 and float(v[0]) == 0.0
        w = np.arange(4, dtype=np.float32)
        assert _torch_from_array(w, None).data_ptr() == w.__array_interface__["data"][0], "writable arrays are not copied"
    finally:
        a.close()
        b.close()


def test_hostile_python_arguments_are_typed():
    """What a Python caller can pass wrong: each a tensorlane error (the
    C ABI would otherwise wrap a negative op id, truncate a huge one, or
    fail with a bare TypeError deep inside)."""
    with tl.Runtime({}) as a, tl.Runtime({}) as b:
        ref = a.put(np.ones(4, np.float32))
        cases = {
            "negative dim": lambda: a.empty((-1, 4)),
            "dims past 2^63": lambda: a.empty((1 << 40, 1 << 40)),
            "float dim": lambda: a.empty((2.5,)),
            "17 dims": lambda: a.empty((1,) * 17),
            "negative op": lambda: a.get(ref, op=-1),
            "op past 2^64": lambda: a.get(ref, op=1 << 70),
            "cancel of a negative op": lambda: a.cancel(-1),
            "negative timeout": lambda: a.get(ref, timeout=-5),
            "NaN timeout": lambda: a.get(ref, timeout=float("nan")),
            "infinite timeout": lambda: a.free(ref, timeout=float("inf")),
            "str ref": lambda: a.get("abc"),
            "None ref": lambda: a.get(None),
            "int ref": lambda: a.view(5),
            "None ref info": lambda: tl.ref_info(None),
            "config not JSON": lambda: tl.Runtime({"x": object()}),
            "view shape not the object's": lambda: b.view(ref, shape=(3,), dtype=np.float32),
            "view dtype not the object's": lambda: b.view(ref, shape=(4,), dtype=np.float64),
            "view dtype not a dtype": lambda: b.view(ref, shape=(4,), dtype="no such dtype"),
        }
        for name, call in cases.items():
            with pytest.raises(errors.Error) as e:
                call()
            assert e.value.kind != "no_zero_copy", name
        np.testing.assert_array_equal(a.get(ref), np.ones(4, np.float32))
        a.free(ref)
