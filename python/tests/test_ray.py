"""tensorlane as a Ray Direct Transport, on a real local Ray (one cluster for
the module; nodes pinned to loopback)."""

import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import tensorlane as tl  # noqa: E402
import tensorlane.ray as tlr  # noqa: E402

MiB = 1 << 20

# Workers import this module (the actor classes) from here.
# (runtime_env's PYTHONPATH replaces the inherited one: keep the caller's, so
# a development tree on PYTHONPATH reaches the workers too.)
PATH = {"PYTHONPATH": os.pathsep.join(p for p in (os.path.dirname(os.path.abspath(__file__)),
                                                  os.environ.get("PYTHONPATH", "")) if p)}

# Before any class uses the name (Ray checks it in @ray.method).
tlr.register()


@pytest.fixture(scope="module", autouse=True)
def cluster():
    tlr.register()  # again: a no-op
    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
             runtime_env={"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="")})
    yield
    ray.shutdown()


def expected(n, seed):
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


@ray.remote(enable_tensor_transport=True)
class Sender:
    @ray.method(tensor_transport="TENSORLANE")
    def produce(self, n, seed=0):
        return expected(n, seed)

    @ray.method(tensor_transport="TENSORLANE")
    def produce_shareable(self, n, seed=0):
        a = tl.empty(n, np.float32)  # the process's runtime: the transport's
        a[:] = expected(n, seed)
        return a

    @ray.method(tensor_transport="TENSORLANE")
    def state_dict(self, count):
        return {f"layer{i}.weight": np.full((i + 1, 7), i, np.float32) for i in range(count)}

    @ray.method(tensor_transport="TENSORLANE")
    def non_contiguous(self):
        return np.zeros((64, 64), np.float32)[:, ::2]

    @ray.method(tensor_transport="TENSORLANE")
    def complex_values(self):
        return np.zeros(16, np.complex64)

    @ray.method(tensor_transport="TENSORLANE")
    def object_values(self):
        return np.array([None, {}], dtype=object)

    @ray.method(tensor_transport="TENSORLANE")
    def produce_then_die_when_read(self, n):
        # Dies, as a crash would, as soon as a reader's transfer has begun.
        import threading

        rt = tlr.runtime()

        def watch():
            while rt.stats()["reads_in_flight"] == 0:
                time.sleep(0.0005)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
        return np.ones(n, np.float32)

    def stats(self):
        return tlr.runtime().stats()


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def check(self, a, n, seed=0):
        assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (n,)
        return bool(np.array_equal(a, expected(n, seed))), tlr.runtime().stats()["gets_by_transport"]

    def check_state_dict(self, sd):
        ok = all(np.array_equal(v, np.full((i + 1, 7), i, np.float32)) for i, v in enumerate(sd.values()))
        return len(sd), ok

    def first(self, a):
        return float(a[0])

    def echo(self, a):
        return np.array(a)  # a copy: the view goes with this call

    def metrics_exported(self):
        # The plug-in's counters were created through ray.util.metrics
        # (they reach the dashboard through Ray's own exporter).
        return tlr._metrics._ok

    def keep(self, a, n, seed=0):
        """Holds on to the received array (a zero-copy view on one node)."""
        self.kept = a
        return bool(np.array_equal(a, expected(n, seed))), bool(a.flags.writeable), tlr.runtime().stats()

    def check_kept(self, n, seed=0):
        return bool(np.array_equal(self.kept, expected(n, seed)))

    def drop_kept(self):
        del self.kept
        import gc

        gc.collect()
        return tlr.runtime().stats()

    def corrupted_ref(self):
        meta = tlr.TensorlaneTransportMetadata(tensor_meta=[((4,), np.dtype(np.float32))], tensor_device="cpu",
                                               refs=[b"TR\x01 definitely not a ref"])
        try:
            tlr.TensorlaneTransport().recv_multiple_tensors("x", meta, tlr.TensorlaneCommunicatorMetadata())
        except tl.Error as e:
            return type(e).__name__, str(e)
        return "no error", ""


def test_64mib_float32_between_two_actors():
    s, r = Sender.remote(), Receiver.remote()
    n = 64 * MiB // 4
    ok, transports = ray.get(r.check.remote(s.produce.remote(n, 1), n, 1))
    assert ok, "bytes differ"
    assert transports == {"shm": 1}, "two actors on one node take shared memory"
    assert ray.get(r.metrics_exported.remote()), "transfer metrics go through ray.util.metrics"


def test_forced_tcp_through_runtime_env():
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="tcp")}
    s = Sender.options(runtime_env=env).remote()
    r = Receiver.options(runtime_env=env).remote()
    n = 8 * MiB // 4
    ok, transports = ray.get(r.check.remote(s.produce.remote(n, 2), n, 2))
    assert ok
    assert transports == {"tcp": 1}


def test_state_dict_of_100_arrays():
    s, r = Sender.remote(), Receiver.remote()
    assert ray.get(r.check_state_dict.remote(s.state_dict.remote(100))) == (100, True)


def test_sender_killed_mid_transfer_fails_within_timeout():
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="tcp")}  # a streamed read, so there is a "mid"
    s = Sender.options(runtime_env=env, max_restarts=0).remote()
    r = Receiver.options(runtime_env=env).remote()
    ref = s.produce_then_die_when_read.remote(256 * MiB // 4)
    start = time.monotonic()
    with pytest.raises(ray.exceptions.RayError) as info:
        ray.get(r.first.remote(ref), timeout=50)
    took = time.monotonic() - start
    assert took < 50, f"the failure took {took:.1f}s"
    assert not isinstance(info.value, ray.exceptions.GetTimeoutError), "a hang, not an error"


def test_owner_memory_returns_after_objectref_dies():
    s, r = Sender.remote(), Receiver.remote()
    base = ray.get(s.stats.remote())
    ref = s.produce.remote(64 * MiB // 4, 3)
    assert ray.get(r.check.remote(ref, 64 * MiB // 4, 3))[0]
    during = ray.get(s.stats.remote())
    assert during["objects"] == base["objects"] + 1
    assert during["host_memory"]["used"] >= 64 * MiB, "the staged copy for the same-host reader"
    del ref
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = ray.get(s.stats.remote())
        if now["objects"] == base["objects"] and now["host_memory"]["used"] == base["host_memory"]["used"]:
            break
        time.sleep(0.2)
    assert now["objects"] == base["objects"], now
    assert now["host_memory"]["used"] == base["host_memory"]["used"], now


def test_zero_copy_receive_outlives_the_objectref():
    s, r = Sender.remote(), Receiver.remote()
    n = 16 * MiB // 4
    base = ray.get(s.stats.remote())
    ref = s.produce.remote(n, 4)
    ok, writable, rstats = ray.get(r.keep.remote(ref, n, 4))
    assert ok, "bytes differ"
    assert not writable, "same-node arrays are read-only views, as Ray's object store hands out"
    assert rstats["views"] >= 1 and rstats["live_views"] == 1
    assert rstats["host_memory"]["used"] == 0, "the receiver allocated nothing"
    # The ObjectRef dies: the sender frees the object (garbage_collect) and
    # its memory accounting returns to the baseline, while the receiver's
    # array stays valid with the same bytes.
    del ref
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = ray.get(s.stats.remote())
        if now["objects"] == base["objects"] and now["host_memory"]["used"] == base["host_memory"]["used"]:
            break
        time.sleep(0.2)
    assert now["objects"] == base["objects"], now
    assert now["host_memory"]["used"] == base["host_memory"]["used"], now
    assert ray.get(r.check_kept.remote(n, 4)), "the view changed after the sender freed the object"
    assert ray.get(r.drop_kept.remote())["live_views"] == 0, "the mapping goes with the array"


def test_tensorlane_empty_is_zero_copy_end_to_end():
    s, r = Sender.remote(), Receiver.remote()
    n = 8 * MiB // 4
    ok, writable, rstats = ray.get(r.keep.remote(s.produce_shareable.remote(n, 6), n, 6))
    assert ok and not writable
    st = ray.get(s.stats.remote())
    assert st["zero_copy_puts"] == 1 and st["foreign_puts"] == 0, "published by the runtime that allocated it"
    assert st["stage_pool"]["hits"] + st["stage_pool"]["misses"] == 0, "no staged copy"
    assert rstats["host_memory"]["used"] == 0, "and no copy on the reader"
    ray.get(r.drop_kept.remote())


def test_forced_copy_gives_writable_arrays():
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_RECV="copy")}
    s, r = Sender.remote(), Receiver.options(runtime_env=env).remote()
    n = MiB // 4
    ok, writable, rstats = ray.get(r.keep.remote(s.produce.remote(n, 5), n, 5))
    assert ok and writable
    assert rstats["views"] == 0 and rstats["gets_by_transport"] == {"shm": 1}


def test_bad_input_gives_clear_error():
    """Arrays of Python objects have no bytes to move: refused by name."""
    s, r = Sender.remote(), Receiver.remote()
    with pytest.raises(Exception, match="Python objects"):
        ray.get(r.first.remote(s.object_values.remote()), timeout=60)


@pytest.mark.parametrize("method, want", [
    ("non_contiguous", np.zeros((64, 64), np.float32)[:, ::2]),
    ("complex_values", np.zeros(16, np.complex64)),
])
def test_what_rays_store_accepts_is_accepted(method, want):
    """Strided arrays (staged once, C-ordered) and dtypes tensorlane has no
    name for (raw bytes, typed from Ray's metadata) arrive as sent."""
    s, r = Sender.remote(), Receiver.remote()
    got = ray.get(r.echo.remote(getattr(s, method).remote()))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_corrupted_ref_is_malformed_ref():
    name, msg = ray.get(Receiver.remote().corrupted_ref.remote())
    assert name == "MalformedRef", msg


def test_slab_mode_through_ray():
    """TENSORLANE_SLABS=1 (the job's trust scope: the cluster's secret key,
    tensorlane.ray.slab_key) and a pre-faulted pool: the receiver maps the sender's slab once for every transfer,
    bytes verified, and the sender's memory returns to its baseline."""
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_SLABS="1", TENSORLANE_POOL_BYTES="64M")}
    s, r = Sender.options(runtime_env=env).remote(), Receiver.options(runtime_env=env).remote()
    n = 4 * MiB // 4
    base = ray.get(s.stats.remote())
    assert base["host_memory"]["slabs"]
    for seed in range(3):
        ok, _, rstats = ray.get(r.keep.remote(s.produce.remote(n, seed), n, seed))
        assert ok, "bytes differ"
    ok, _, rstats = ray.get(r.keep.remote(s.produce_shareable.remote(n, 9), n, 9))
    assert ok
    assert rstats["shm_slabs"]["mapped"] == 1, rstats["shm_slabs"]
    assert rstats["gets_by_transport"] == {"shm": 4}
    ray.get(r.drop_kept.remote())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = ray.get(s.stats.remote())
        if now["objects"] == base["objects"] and now["host_memory"]["used"] == base["host_memory"]["used"]:
            break
        time.sleep(0.2)
    assert now["host_memory"]["used"] == base["host_memory"]["used"], now


# Inline (eager) small tensors: below TENSORLANE_INLINE_BYTES (read on the
# sender, default 64 KiB) a tensor rides inside the transport metadata.

@ray.remote(enable_tensor_transport=True)
class InlineSender:
    @ray.method(tensor_transport="TENSORLANE")
    def state_dict(self, count):
        return {f"layer{i}.weight": np.full((i + 1, 7), i, np.float32) for i in range(count)}

    @ray.method(tensor_transport="TENSORLANE")
    def mixed(self):
        return {"small": expected(1024, 7), "big": expected(MiB // 4, 8), "flags": np.arange(5, dtype=np.int8),
                "empty": np.zeros((0, 3), np.float64)}

    def stats(self):
        return tlr.runtime().stats()

    # No decorator: Ray validates a decorator's transport name when the
    # class is defined, and TENSORLANE_TORCH exists only where torch does.
    # The test names the transport with .options() instead.
    def torch_state(self):
        import torch

        g = torch.Generator().manual_seed(11)
        return {"w": torch.randn(MiB // 4, generator=g), "b": torch.randn(100, generator=g),
                "w16": torch.randn(MiB // 2, generator=g).to(torch.bfloat16),
                "b16": torch.randn(33, generator=g).to(torch.bfloat16), "step": torch.tensor([7], dtype=torch.int64)}


@ray.remote(enable_tensor_transport=True)
class InlineReceiver:
    def check_state_dict(self, sd):
        ok = all(np.array_equal(v, np.full((i + 1, 7), i, np.float32)) for i, v in enumerate(sd.values()))
        return len(sd), ok, all(v.flags.writeable for v in sd.values()), tlr.runtime().stats()

    def check_mixed(self, d):
        ok = (np.array_equal(d["small"], expected(1024, 7)) and np.array_equal(d["big"], expected(MiB // 4, 8))
              and np.array_equal(d["flags"], np.arange(5, dtype=np.int8)) and d["empty"].shape == (0, 3))
        return ok, tlr.runtime().stats()

    def check_torch(self, d):
        import torch

        g = torch.Generator().manual_seed(11)
        want = {"w": torch.randn(MiB // 4, generator=g), "b": torch.randn(100, generator=g),
                "w16": torch.randn(MiB // 2, generator=g).to(torch.bfloat16),
                "b16": torch.randn(33, generator=g).to(torch.bfloat16), "step": torch.tensor([7], dtype=torch.int64)}
        return {k: (type(d[k]).__name__, str(d[k].dtype), bool(torch.equal(d[k], want[k]))) for k in want}

    def corrupted_inline(self):
        """Each broken metadata must raise a tensorlane error, never return."""
        a = np.arange(4, dtype=np.float32)
        raw = a.tobytes()
        import zlib

        good = (a.dtype.str, (4,), raw, zlib.crc32(raw))
        cases = {
            "crc": (a.dtype.str, (4,), raw[:-1] + b"\x01", zlib.crc32(raw)),
            "length": (a.dtype.str, (5,), raw, zlib.crc32(raw)),
            "dtype": ("<c8", (2,), raw, zlib.crc32(raw)),
            "garbage dtype": ("not a dtype", (4,), raw, zlib.crc32(raw)),
            "not a tuple": b"junk",
            "missing": None,
        }
        out = {}
        for name, entry in cases.items():
            shape = (5,) if name == "length" else (2,) if name == "dtype" else (4,)
            meta = tlr.TensorlaneTransportMetadata(tensor_meta=[(shape, a.dtype)], tensor_device="cpu",
                                                   refs=[b""], inline=[entry])
            try:
                tlr.TensorlaneTransport().recv_multiple_tensors("x", meta, tlr.TensorlaneCommunicatorMetadata())
                out[name] = ("no error", "")
            except tl.Error as e:
                out[name] = (type(e).__name__, str(e))
        # inline list and refs disagree in length
        meta = tlr.TensorlaneTransportMetadata(tensor_meta=[((4,), a.dtype)] * 2, tensor_device="cpu",
                                               refs=[b"", b""], inline=[good])
        try:
            tlr.TensorlaneTransport().recv_multiple_tensors("x", meta, tlr.TensorlaneCommunicatorMetadata())
            out["count"] = ("no error", "")
        except tl.Error as e:
            out["count"] = (type(e).__name__, str(e))
        return out


def test_inline_state_dict_needs_no_transfer():
    s, r = InlineSender.remote(), InlineReceiver.remote()
    base = ray.get(s.stats.remote())
    ref = s.state_dict.remote(100)
    n, ok, writable, rstats = ray.get(r.check_state_dict.remote(ref))
    assert (n, ok, writable) == (100, True, True)
    assert rstats["gets_by_transport"] == {} and rstats["views"] == 0, "no tensorlane read for inline tensors"
    assert ray.get(s.stats.remote())["objects"] == base["objects"], "nothing published on the sender"
    del ref  # garbage_collect has nothing to free: must not fail


def test_inline_mixed_with_large():
    s, r = InlineSender.remote(), InlineReceiver.remote()
    ok, rstats = ray.get(r.check_mixed.remote(s.mixed.remote()))
    assert ok, "bytes differ"
    assert sum(rstats["gets_by_transport"].values()) == 1, "only the 1 MiB array is read (views count there too)"


def test_inline_disabled_sends_refs():
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_INLINE_BYTES="0")}
    s, r = InlineSender.options(runtime_env=env).remote(), InlineReceiver.remote()
    base = ray.get(s.stats.remote())
    ref = s.state_dict.remote(20)
    n, ok, _, rstats = ray.get(r.check_state_dict.remote(ref))
    assert (n, ok) == (20, True)
    # The sender's copies of the 20 arrays are one block: one object, one read.
    assert sum(rstats["gets_by_transport"].values()) == 1, rstats
    assert ray.get(s.stats.remote())["objects"] == base["objects"] + 1


def test_corrupted_inline_metadata_is_a_clear_error():
    out = ray.get(InlineReceiver.remote().corrupted_inline.remote())
    for name, (kind, msg) in out.items():
        assert kind == "Corrupt", (name, kind, msg)
        assert "inline" in msg, (name, msg)


def test_torch_tensors_end_to_end():
    """TENSORLANE_TORCH: a state dict of torch tensors (float32 and bfloat16,
    large ones read through tensorlane, small ones inline) arrives as torch
    tensors with the sender's dtypes and bytes."""
    pytest.importorskip("torch")
    s, r = InlineSender.remote(), InlineReceiver.remote()
    got = ray.get(r.check_torch.remote(s.torch_state.options(tensor_transport="TENSORLANE_TORCH").remote()))
    for k, (typ, dtype, equal) in got.items():
        assert typ == "Tensor", (k, typ)
        assert equal, (k, dtype)
    assert got["w16"][1] == got["b16"][1] == "torch.bfloat16"


@pytest.mark.parametrize("value, want", [("", tlr.INLINE_DEFAULT), ("0", 0), ("4096", 4096), ("64K", 65536),
                                         ("1MiB", 1 << 20), (" 8kb ", 8192)])
def test_inline_threshold_from_environment(monkeypatch, value, want):
    monkeypatch.setenv(tlr.ENV_INLINE, value)
    assert tlr._inline_limit() == want


@pytest.mark.parametrize("value", ["lots", "-1", "1.5M", "K"])
def test_bad_inline_threshold_is_invalid_argument(monkeypatch, value):
    monkeypatch.setenv(tlr.ENV_INLINE, value)
    with pytest.raises(tl.InvalidArgument, match=tlr.ENV_INLINE):
        tlr._inline_limit()
