"""Unit tests of the binding, without Ray: two runtimes in this process
(allowed only the cross-process paths, which they would take from two
processes), the memory kinds, interop, and every error kind."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tensorlane as tl
from tensorlane import errors


@pytest.fixture(scope="module", params=["shm", "tcp"])
def pair(request):
    cfg = {"allow_transports": [request.param]}
    a, b = tl.Runtime(cfg), tl.Runtime(cfg)
    yield request.param, a, b
    a.close()
    b.close()


def test_roundtrip_foreign(pair):
    path, a, b = pair
    x = np.random.default_rng(1).standard_normal((256, 1024)).astype(np.float32)
    ref = a.put(x)
    assert ref.info()["shape"] == [256, 1024]
    y = b.get(ref)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(x, y)
    assert b.explain(ref)["plan"]["chosen"] == path
    # Network paths read the caller's array in place; a same-host reader in
    # another process gets one copy into shareable memory.
    want = "foreign, copied once into shareable memory" if path == "shm" else "foreign, not copied"
    assert a.explain(ref)["memory"] == want
    b.release(ref)
    a.free(ref)
    assert a.stats()["objects"] == 0


def test_shareable_zero_copy(pair):
    path, a, b = pair
    x = a.empty((64, 64), np.int64)
    x[:] = np.arange(64 * 64).reshape(64, 64)
    ref = a.put(x[16:32])  # a contiguous slice is still shareable memory
    assert a.explain(ref)["memory"] == "shareable"
    out = np.zeros((16, 64), np.int64)
    assert b.get(ref, out=out) is out
    np.testing.assert_array_equal(out, x[16:32])
    del x  # the object keeps its window of the memory
    a.free(ref)
    assert a.stats()["host_memory"]["used"] == 0


def test_put_gathered(pair):
    """A state dict copied into one block and published sealed: each part
    lands at its offset, and over tcp the owner computes the block's
    checksums once (in the copy once it has served a network read, else at
    the first read), never at every read."""
    path, a, b = pair
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal(n).astype(np.float32) for n in (300_000, 7, 65_536, 1)]
    offs, total = [], 0
    for p in parts:
        offs.append(total)
        total += -(-p.nbytes // 64) * 64
    before = a.stats()["tcp_owner_checksums"]
    block = a.empty(total, np.uint8)
    ref = a.put_gathered(block, list(zip(parts, offs)), threads=2)
    del block  # the object holds it
    got = b.get(ref)
    for p, off in zip(parts, offs):
        np.testing.assert_array_equal(got[off:off + p.nbytes].view(np.float32), p)
    s = a.stats()
    assert s["gathered_puts"] == 1
    if path == "tcp":
        b.get(ref)  # a second read: from the cache whatever the first did
        after = a.stats()["tcp_owner_checksums"]
        blocks = -(-total // (256 << 10))
        gained = {k: after.get(k, 0) - before.get(k, 0) for k in ("cached", "stored", "computed")}
        assert gained["computed"] == 0
        assert gained["cached"] + gained["stored"] == 2 * blocks
        assert gained["stored"] == (0 if s["gathered_summed"] else blocks)
    b.release(ref)
    a.free(ref)


def test_connect_ahead(pair):
    """A runtime dials another from its address before any transfer."""
    _, a, b = pair
    addr = a.address()
    assert "/p2p/" + a.stats()["peer"] in addr
    b.connect(addr, timeout=5)
    b.connect(b.address())  # itself: nothing to do
    with pytest.raises(errors.InvalidArgument):
        b.connect("not an address")


@pytest.mark.parametrize("bad,match", [
    (lambda a: (np.zeros(100, np.float32), [(np.zeros(10, np.uint8), 0)]), "uint8"),
    (lambda a: (a.empty(100, np.uint8), [(np.zeros(10, np.uint8), 95)]), "leaves"),
    (lambda a: (a.empty(100, np.uint8), [(np.zeros(10, np.uint8), 0), (np.zeros(10, np.uint8), 5)]), "overlap"),
    (lambda a: (a.empty(100, np.uint8), [(np.zeros((4, 4), np.uint8)[:, ::2], 0)]), "non-contiguous"),
    (lambda a: (np.zeros(100, np.uint8), [(np.zeros(10, np.uint8), 0)]), "not memory this runtime allocated"),
])
def test_put_gathered_bad_input(pair, bad, match):
    _, a, _ = pair
    block, parts = bad(a)
    objects = a.stats()["objects"]
    with pytest.raises(errors.InvalidArgument, match=match):
        a.put_gathered(block, parts)
    assert a.stats()["objects"] == objects


@pytest.mark.parametrize("shareable", [False, True], ids=["foreign", "tensorlane.empty"])
def test_view_zero_copy(pair, shareable):
    path, a, b = pair
    src = np.random.default_rng(3).standard_normal((512, 1024)).astype(np.float32)
    x = a.empty(src.shape, np.float32) if shareable else src.copy()
    x[:] = src
    ref = a.put(x)
    if path != "shm":
        with pytest.raises(tl.NoZeroCopy):
            b.view(ref)
        b.release(ref)
        a.free(ref)
        return
    base = b.stats()["host_memory"]["used"]
    y = b.view(ref)
    assert not y.flags.writeable, "a view is read-only, as Ray's store arrays are"
    with pytest.raises(ValueError):
        y[0, 0] = 1
    assert y.dtype == np.float32 and y.shape == src.shape
    np.testing.assert_array_equal(y, src)
    assert b.stats()["host_memory"]["used"] == base, "a view allocates nothing on the reader"
    assert b.stats()["views"] >= 1 and b.stats()["live_views"] == 1
    # Shape and dtype from the caller (Ray's metadata) give the same array.
    z = b.view(ref, shape=src.shape, dtype=np.float32, populate=False)
    np.testing.assert_array_equal(z, src)
    del z
    # The owner frees the object and lets go of its array: the view stays
    # valid, with the object's bytes, for as long as the array lives.
    b.release(ref)
    a.free(ref)
    del x
    x2 = np.zeros_like(src)  # likely reuses the freed array's pages
    np.testing.assert_array_equal(y, src)
    assert a.stats()["objects"] == 0
    assert a.stats()["host_memory"]["used"] == 0, "owner memory back to its baseline"
    del y, x2
    assert b.stats()["live_views"] == 0, "the mapping goes with the last array over it"


def test_get_result_is_shareable_and_dlpack(pair):
    _, a, b = pair
    ref = a.put(bytearray(b"tensorlane" * 100))  # buffer protocol: uint8
    y = b.get(ref)
    assert bytes(y) == b"tensorlane" * 100
    again = b.put(y)  # received memory is shareable: republished with no copy
    assert b.explain(again)["memory"] == "shareable"
    z = np.from_dlpack(y)  # numpy results speak DLPack (torch.from_dlpack too)
    assert z.ctypes.data == y.ctypes.data
    b.free(again)
    a.free(ref)


@pytest.mark.parametrize("bad, exc, match", [
    (np.zeros((8, 8), np.float32)[:, ::2], tl.InvalidArgument, "non-contiguous"),
    (np.zeros(8, np.complex64), tl.InvalidArgument, "unsupported dtype"),
    (np.zeros(8, np.uint32), tl.InvalidArgument, "unsupported dtype"),
    (np.zeros(8, ">f4"), tl.InvalidArgument, "unsupported dtype"),
    (np.zeros(0, np.float32), tl.InvalidArgument, "empty"),
    (object(), tl.InvalidArgument, "cannot publish"),
])
def test_put_bad_input(pair, bad, exc, match):
    _, a, _ = pair
    with pytest.raises(exc, match=match):
        a.put(bad)


def test_get_bad_input(pair):
    _, a, b = pair
    ref = a.put(np.ones(16, np.float32))
    corrupt = bytes([ref[0] ^ 0xFF]) + ref[1:]
    with pytest.raises(tl.MalformedRef):
        b.get(corrupt)
    with pytest.raises(ValueError):  # MalformedRef is a ValueError too
        b.get(ref[: len(ref) // 2])
    with pytest.raises(tl.TooSmall):
        b.get(ref, out=np.zeros(4, np.float32))
    with pytest.raises(tl.InvalidArgument, match="writable"):
        b.get(ref, out=np.zeros(32, np.float32)[::2])
    a.free(ref)
    with pytest.raises(tl.ObjectFreed):
        b.get(ref)
    assert not b.cancel(b.next_op())


def test_errors_one_class_per_kind():
    assert set(errors.KINDS[1:]) == set(errors.BY_KIND)
    for code, kind in enumerate(errors.KINDS[1:], start=1):
        e = errors.from_code(code, "m")
        assert isinstance(e, tl.Error) and e.kind == kind and str(e) == "m"
    assert issubclass(tl.Timeout, TimeoutError) and issubclass(tl.InvalidArgument, ValueError)


def test_closed_runtime_and_bad_config():
    rt = tl.Runtime({"allow_transports": ["tcp"]})
    rt.close()
    rt.close()  # idempotent
    with pytest.raises(tl.Closed):
        rt.put(np.ones(4, np.float32))
    with pytest.raises(tl.InvalidArgument, match="unknown field"):
        tl.Runtime({"nope": 1})
    with pytest.raises(tl.InvalidArgument, match="cluster key"):
        tl.Runtime({"cluster_key": "short"})


def test_concurrent_gets_from_threads(pair):
    _, a, b = pair
    xs = [np.full(1 << 16, i, np.int32) for i in range(8)]
    refs = [a.put(x) for x in xs]
    got = [None] * 8

    def read(i):
        got[i] = b.get(refs[i])

    ts = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for x, y in zip(xs, got):
        np.testing.assert_array_equal(x, y)
    for r in refs:
        a.free(r)


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


def test_import_does_no_work():
    p = run_python("""
        import tensorlane, tensorlane.errors, tensorlane._lib as l
        assert l._lib is None, "the library loaded at import"
        print("ok")
    """)
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_go_library_in_python_process():
    """Item 5: the Go library built -buildmode=c-shared, loaded into Python as
    GoRay loads Go actors: it works, leaves SIGINT to Python, and the process
    exits cleanly at interpreter exit with runtimes still open."""
    here = os.path.dirname(__file__)
    p = subprocess.run([sys.executable, os.path.join(here, "..", "examples", "go_in_python.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "bytes verified" in p.stdout
    assert "KeyboardInterrupt raised" in p.stdout


def test_view_survives_runtime_close():
    # Arrays may outlive the runtimes (interpreter exit): closing them never
    # unmaps a live view under the array.
    a, b = tl.Runtime({"allow_transports": ["shm"]}), tl.Runtime({"allow_transports": ["shm"]})
    x = np.arange(1 << 18, dtype=np.float32)
    ref = a.put(x)
    y = b.view(ref)
    b.close()
    a.free(ref, timeout=5)
    a.close()
    np.testing.assert_array_equal(y, x)
    del y  # the reader's runtime is gone: the release is skipped, no error


SLAB_KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


def test_slab_mode_maps_each_slab_once():
    """Slab mode (one trust scope: the cluster key): the reader maps the
    owner's slab once for every object in it, copies and views alike; a
    view keeps its bytes after the owner frees the object and allocates
    again (the owner holds the range until the view goes)."""
    cfg = {"allow_transports": ["shm"], "slabs": True, "cluster_key": SLAB_KEY, "pool_bytes": 16 << 20}
    a, b = tl.Runtime(cfg), tl.Runtime(cfg)
    try:
        assert a.stats()["host_memory"]["slabs"]
        refs, want = [], []
        for i in range(3):
            x = a.empty(1 << 18, np.float32)
            x[:] = i
            refs.append(a.put(x))
            want.append(x.copy())
        f = np.arange(1 << 16, dtype=np.int32)
        refs.append(a.put(f))  # foreign: staged into a slab
        want.append(f)
        for ref, w in zip(refs, want):
            y = b.get(ref)
            np.testing.assert_array_equal(y, w)
            assert y.flags.writeable
        v = b.view(refs[0])
        assert not v.flags.writeable
        np.testing.assert_array_equal(v, want[0])
        assert b.stats()["shm_slabs"]["mapped"] == 1, b.stats()["shm_slabs"]
        slabs = a.stats()["host_memory"]["slab_count"]
        for ref in refs:
            b.release(ref)
            a.free(ref)
        xs = [a.empty(1 << 18, np.float32) for _ in range(4)]  # freed ranges again: no new slab
        for x in xs:
            x[:] = -1
        assert a.stats()["host_memory"]["slab_count"] == slabs
        np.testing.assert_array_equal(v, want[0])  # its range was not reused
        del v, xs
    finally:
        a.close()
        b.close()


def test_slab_mode_needs_a_cluster_key():
    with pytest.raises(errors.InvalidArgument, match="cluster key"):
        tl.Runtime({"slabs": True})
