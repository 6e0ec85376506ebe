"""The batch functions (tensorlane._batch) without Ray: two runtimes in this
process in slab mode (one trust scope), allowed only shm, which they would
take from two processes on one node, as Ray's actors do."""

import numpy as np
import pytest

import tensorlane as tl
from tensorlane import errors

KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


@pytest.fixture(scope="module")
def pair():
    cfg = {"allow_transports": ["shm"], "slabs": True, "cluster_key": KEY}
    a, b = tl.Runtime(cfg), tl.Runtime(cfg)
    yield a, b
    b.close()
    a.close()


def state_dict(n=20):
    rng = np.random.default_rng(3)
    return [rng.standard_normal((i + 1, 1000)).astype(np.float32) for i in range(n)]


def test_put_get_view_batch(pair):
    a, b = pair
    sd = state_dict()
    before = b.stats()
    refs = tl.put_batch(sd, runtime=a)
    assert len(refs) == len(sd) and a.stats()["puts"] - 0 >= len(sd)
    got = tl.get_batch(refs, runtime=b, timeout=10)
    for x, y in zip(sd, got):
        assert y.flags.writeable and y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(x, y)
    views = tl.view_batch(refs, runtime=b, timeout=10)
    for x, y in zip(sd, views):
        assert not y.flags.writeable
        np.testing.assert_array_equal(x, y)
    after = b.stats()
    assert after["views"] - before["views"] == len(sd)
    assert after["gets_by_transport"].get("shm", 0) - before["gets_by_transport"].get("shm", 0) == 2 * len(sd)
    # The owner's memory is mapped once per slab, not once per tensor.
    assert after["shm_slabs"]["mapped"] <= 2, after["shm_slabs"]
    del views, got
    for r in refs:
        b.release(r)
        a.free(r)


def test_layouts_retype_raw_bytes(pair):
    """A dtype tensorlane has no name for (complex64) travels as raw bytes
    and comes back typed from the caller's layout."""
    a, b = pair
    x = (np.arange(4096) + 1j * np.arange(4096)).astype(np.complex64).reshape(64, 64)
    (ref,) = tl.put_batch([x.reshape(-1).view(np.uint8)], runtime=a, dtypes=["uint8"])
    (y,) = tl.view_batch([ref], runtime=b, layouts=[((64, 64), np.complex64)])
    np.testing.assert_array_equal(x, y)
    (z,) = tl.get_batch([ref], runtime=b, layouts=[((64, 64), np.complex64)])
    np.testing.assert_array_equal(x, z)
    with pytest.raises(errors.LayoutMismatch):
        tl.view_batch([ref], runtime=b, layouts=[((65, 64), np.complex64)])
    a.free(ref)


def test_item_errors(pair):
    a, b = pair
    refs = tl.put_batch(state_dict(3), runtime=a)
    a.free(refs[1])
    with pytest.raises(errors.Error) as info:
        tl.get_batch(refs, runtime=b, timeout=10)
    assert "item 1" in str(info.value)
    got = tl.get_batch(refs, runtime=b, timeout=10, return_exceptions=True)
    assert isinstance(got[0], np.ndarray) and isinstance(got[2], np.ndarray)
    assert isinstance(got[1], errors.Error)
    got = tl.view_batch([refs[0], b"junk"], runtime=b, return_exceptions=True)
    assert isinstance(got[1], errors.MalformedRef), got[1]
    for r in (refs[0], refs[2]):
        a.free(r)


def test_put_batch_refuses_and_publishes_nothing(pair):
    a, _ = pair
    objects = a.stats()["objects"]
    with pytest.raises(errors.InvalidArgument, match="item 1"):
        tl.put_batch([np.ones(8, np.float32), np.ones((8, 8), np.float32)[:, ::2]], runtime=a)
    with pytest.raises(errors.InvalidArgument, match="item 1"):
        tl.put_batch([np.ones(8, np.float32), np.ones(8, np.uint32)], runtime=a)
    assert a.stats()["objects"] == objects
    assert tl.put_batch([], runtime=a) == []


def test_batch_views_and_blocks_are_released_with_their_arrays():
    """The arrays view_batch and get_batch return give their views and
    blocks back when they go (a finaliser given the wrong handle used to
    keep every batch view mapped for the process's life)."""
    import gc

    owner, reader = tl.Runtime(), tl.Runtime()
    try:
        refs = [owner.put(np.arange(1024, dtype=np.float32) + i) for i in range(3)]
        views = tl.view_batch(refs, runtime=reader)
        assert reader.stats()["live_views"] == 3
        del views
        gc.collect()
        assert reader.stats()["live_views"] == 0
        got = tl.get_batch(refs, runtime=reader)
        used = reader.stats()["host_memory"]["used"]
        assert used > 0
        del got
        gc.collect()
        assert reader.stats()["host_memory"]["used"] < used
    finally:
        reader.close()
        owner.close()
