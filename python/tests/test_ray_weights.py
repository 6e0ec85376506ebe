"""The Ray plug-in as Ray users live with it (issue 23): the weights as
returned, the zero-copy opt-in and its verification, no side effects on
Ray's own numpy path, a state dict in one batch, every dtype, memory that
grows on demand, bounded failures, and the slab key. One real local Ray
for the module."""

import os
import signal
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import tensorlane as tl  # noqa: E402
import tensorlane.ray as tlr  # noqa: E402

MiB = 1 << 20
# (runtime_env's PYTHONPATH replaces the inherited one: keep the caller's.)
PATH = {"PYTHONPATH": os.pathsep.join(p for p in (os.path.dirname(os.path.abspath(__file__)),
                                                  os.environ.get("PYTHONPATH", "")) if p)}

tlr.register()


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=6, _node_ip_address="127.0.0.1", include_dashboard=False,
             runtime_env={"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="")})
    yield
    ray.shutdown()


def weights(count=8, n=256 * 1024, seed=0):
    rng = np.random.default_rng(seed)
    return {f"layer{i}": rng.standard_normal(n, dtype=np.float32) for i in range(count)}


def make_tensors(kind):
    """Every dtype and layout a user might return; small ones ride inline."""
    import ml_dtypes

    rng = np.random.default_rng(5)
    out = {}
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"):
        dt = np.dtype(getattr(ml_dtypes, name, None) or np.float32)
        n = 100 if kind == "small" else 300_000
        out[name] = rng.standard_normal(n).astype(dt)
    n = 16 if kind == "small" else 400
    base = rng.standard_normal((n, n)).astype(np.float32)
    out["strided"] = base[:, ::2]
    out["fortran"] = np.asfortranarray(base)
    out["transposed"] = base.T
    out["uint16"] = np.arange(n * n, dtype=np.uint16)
    out["complex64"] = (base + 1j * base).astype(np.complex64)
    out["zero_d"] = np.float64(3.5) * np.ones((), np.float64)
    return out


@ray.remote(enable_tensor_transport=True)
class Trainer:
    def __init__(self):
        self.w = weights()

    def pid(self):
        return os.getpid()

    @ray.method(tensor_transport="TENSORLANE")
    def state(self):
        return self.w

    @ray.method(tensor_transport="TENSORLANE")
    def state_borrowed(self):
        return {k: tlr.borrow(v) for k, v in self.w.items()}

    @ray.method(tensor_transport="TENSORLANE")
    def state_shareable(self):
        out = {}
        for k, v in self.w.items():
            a = tl.empty(v.shape, v.dtype)
            a[:] = v
            out[k] = a
        self.shared = out
        return out

    def mutate_shared(self):
        for v in self.shared.values():
            v += 1.0

    @ray.method(tensor_transport="TENSORLANE")
    def small_state(self):
        return {k: v[:256] for k, v in self.w.items()}  # 1 KiB each: inline

    def step(self):
        """An optimizer step, in place, as RL trainers do."""
        for v in self.w.values():
            v += 1.0

    def plain(self, n):
        return np.arange(n, dtype=np.float32)

    @ray.method(tensor_transport="TENSORLANE")
    def tensors(self, kind):
        return make_tensors(kind)

    @ray.method(tensor_transport="TENSORLANE")
    def objects(self):
        return np.array([{"a": 1}, None], dtype=object)

    def stats(self):
        return tlr.runtime().stats()


@ray.remote(enable_tensor_transport=True)
class Reader:
    def sums(self, sd):
        return {k: float(np.asarray(v, np.float64).sum()) for k, v in sd.items()}

    def flags(self, a):
        return bool(a.flags.writeable), a.dtype.str, a.shape

    def keep(self, sd):
        self.kept = sd
        return {k: float(np.asarray(v, np.float64).sum()) for k, v in sd.items()}

    def equal(self, sd, kind):
        import ml_dtypes  # noqa: F401  (the reader needs it as Ray's store would)

        want = make_tensors(kind)
        out = {}
        for k, w in want.items():
            g = sd[k]
            out[k] = (g.dtype == w.dtype, g.shape == w.shape,
                      bool(np.array_equal(g.view(np.uint8) if g.dtype.kind == "V" else g,
                                          w.view(np.uint8) if w.dtype.kind == "V" else w)))
        return out

    def stats(self):
        return tlr.runtime().stats()

    def fail_kind(self, sd):
        return "no error"


def expected_sums(step=0):
    return {k: float(v.astype(np.float64).sum() + step * v.size) for k, v in weights().items()}


def test_weights_as_returned():
    """The trainer updates its weights in place right after returning them:
    the reader still gets what was returned, as from Ray's store."""
    t, r = Trainer.remote(), Reader.remote()
    ref = t.state.remote()
    ray.get(t.step.remote())  # in place, before the reader reads
    got = ray.get(r.sums.remote(ref))
    assert got == pytest.approx(expected_sums(0)), "the reader saw the update: torn weights"
    st = ray.get(t.stats.remote())
    assert st["gathered_puts"] >= 1, "the library made the copy, in shareable memory, and published it sealed"


def test_borrow_is_zero_copy_and_verify_catches_mutation():
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_VERIFY="1")}
    t, r = Trainer.options(runtime_env=env).remote(), Reader.options(runtime_env=env).remote()
    # Unchanged: zero copies, the bytes as they are, verification passes.
    base = ray.get(t.stats.remote())
    ref = t.state_borrowed.remote()
    assert ray.get(r.sums.remote(ref)) == pytest.approx(expected_sums(0))
    st = ray.get(t.stats.remote())
    # Published in place: network readers read the arrays themselves; a
    # same-node reader of heap memory needs it in shareable memory, which the
    # owner stages once in the background (not on the method's path).
    assert st["foreign_puts"] - base["foreign_puts"] == 8, "borrowed arrays are published in place"
    assert st["zero_copy_puts"] == base["zero_copy_puts"], "no copy made before the method returned"
    del ref
    # Shareable memory (tensorlane.empty) changed before the read: the
    # reader maps the very memory that changed, and verification turns
    # silently torn weights into a typed error.
    ref = t.state_shareable.remote()
    ray.get(t.mutate_shared.remote())
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(r.sums.remote(ref), timeout=60)
    assert "Mutated" in str(info.value) or "changed after it was published" in str(info.value), info.value


def test_tensorlane_empty_is_the_zero_copy_opt_in():
    t, r = Trainer.remote(), Reader.remote()
    base = ray.get(t.stats.remote())
    ref = t.state_shareable.remote()
    got = ray.get(r.keep.remote(ref))
    assert got == pytest.approx(expected_sums(0))
    st = ray.get(t.stats.remote())
    assert st["zero_copy_puts"] - base["zero_copy_puts"] == 8
    assert st["host_memory"]["used"] - base["host_memory"]["used"] == 8 * 256 * 1024 * 4, "no copy beside the arrays"


def test_plain_numpy_return_keeps_rays_zero_copy_path():
    """Ray registers a transport's serializer process-wide for its data type;
    after TENSORLANE calls, a plain method's numpy return must still reach
    the reader through Ray's own path: a read-only zero-copy view."""
    t, r = Trainer.remote(), Reader.remote()
    fresh = ray.get(r.flags.remote(t.plain.remote(MiB)))
    assert fresh == (False, "<f4", (MiB,)), "Ray's own path before any transport call"
    ray.get(r.sums.remote(t.state.remote()))  # a TENSORLANE call on the same actor
    after = ray.get(r.flags.remote(t.plain.remote(MiB)))
    assert after == fresh, "the transport changed how Ray serializes numpy arrays"
    # And the driver's own ray.get of a plain return likewise.
    a = ray.get(t.plain.remote(1000))
    assert not a.flags.writeable and np.array_equal(a, np.arange(1000, dtype=np.float32))


@pytest.mark.parametrize("kind", ["small", "large"], ids=["inline", "by-ref"])
def test_every_dtype_and_layout(kind):
    """bfloat16 and the float8 variants of ml_dtypes, uint16, complex64,
    strided, Fortran-order, transposed and 0-d arrays arrive equal, with
    their dtypes and shapes, as from Ray's store."""
    pytest.importorskip("ml_dtypes")
    t, r = Trainer.remote(), Reader.remote()
    got = ray.get(r.equal.remote(t.tensors.remote(kind), kind))
    bad = {k: v for k, v in got.items() if v != (True, True, True)}
    assert not bad, bad


def test_object_arrays_are_refused_clearly():
    t, r = Trainer.remote(), Reader.remote()
    with pytest.raises(Exception, match="Python objects"):
        ray.get(r.fail_kind.remote(t.objects.remote()), timeout=60)


def test_state_dict_is_one_batch():
    """A state dict's copy is one block, published as one object: the reader
    maps it with one view (one grant, one mapping) for all its arrays."""
    t, r = Trainer.remote(), Reader.remote()
    ray.get(t.step.remote())
    ref = t.state.remote()
    before = ray.get(r.stats.remote())
    assert ray.get(r.sums.remote(ref)) == pytest.approx(expected_sums(1))
    after = ray.get(r.stats.remote())
    assert after["views"] - before["views"] == 1, "one view of the block for 8 arrays"
    mapped = after["shm_slabs"].get("mapped", 0) - before["shm_slabs"].get("mapped", 0)
    assert mapped == 1, f"one mapping for one state dict's copy, got {after['shm_slabs']}"


def test_memory_grows_on_demand():
    """No pre-faulted pool per actor: a fresh actor holds no slab; a state
    dict's copy takes its size and, freed, stays cached for reuse."""
    t, r = Trainer.remote(), Reader.remote()
    st = ray.get(t.stats.remote())
    assert st["host_memory"]["slabs"], "slab mode is the Ray default"
    assert st["host_memory"]["slab_count"] == 0 and st["host_memory"]["used"] == 0, st["host_memory"]
    ref = t.state.remote()
    ray.get(r.sums.remote(ref))
    st = ray.get(t.stats.remote())
    assert st["host_memory"]["used"] >= 8 * MiB
    del ref
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = ray.get(t.stats.remote())
        if st["host_memory"]["used"] == 0:
            break
        time.sleep(0.2)
    assert st["host_memory"]["used"] == 0, st["host_memory"]
    assert st["host_memory"]["cached"] >= 8 * MiB, "freed memory stays populated for the next state dict"


@ray.remote
def slab_key_of_worker():
    return tlr.slab_key(), ray._private.worker.global_worker.node.session_name


def test_slab_key_is_a_secret_shared_by_the_cluster():
    import hashlib

    (k1, session), (k2, _) = ray.get([slab_key_of_worker.remote(), slab_key_of_worker.remote()])
    assert k1 == k2 and len(bytes.fromhex(k1)) == 32
    derived = hashlib.sha256(b"tensorlane ray session scope\0" + session.encode()).hexdigest()
    assert k1 != derived, "the key must not derive from the session name (public)"
    info = ray.get(Trainer.remote().stats.remote())
    assert info["host_memory"]["slabs"], "slab mode on with the cluster's key"


def test_key_file(tmp_path, monkeypatch):
    key = os.urandom(32).hex()
    p = tmp_path / "key"
    p.write_text(key + "\n")
    p.chmod(0o600)
    monkeypatch.setenv(tlr.ENV_KEY_FILE, str(p))
    assert tlr.slab_key() == key
    p.chmod(0o640)
    with pytest.raises(tl.InvalidArgument, match="chmod 600"):
        tlr.slab_key()
    p.chmod(0o600)
    p.write_text("short")
    with pytest.raises(tl.InvalidArgument, match="64 hex"):
        tlr.slab_key()
    link = tmp_path / "link"
    link.symlink_to(p)
    monkeypatch.setenv(tlr.ENV_KEY_FILE, str(link))
    with pytest.raises(tl.InvalidArgument):
        tlr.slab_key()


@pytest.mark.parametrize("inline, connected", [(True, False), (False, False), (False, True)],
                         ids=["inline", "by-ref", "by-ref-connected"])
def test_frozen_sender_is_a_typed_failure(inline, connected):
    """SIGSTOP the sender after its method returned, before the reader
    reads. Inline: the bytes are in the metadata Ray already holds, and the
    read needs no sender. By ref, a reader already connected to the sender
    gets OwnerDied once the heartbeats miss (about 4 s); a reader that never
    connected cannot complete the control handshake, and its probe of the
    sender's listener (accepted, silent: rdt/probe.go) makes that OwnerDied
    too (about 5 s). Both well inside TENSORLANE_TIMEOUT_S (30 s here)."""
    env = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_TIMEOUT_S="30")}
    t, r = Trainer.options(runtime_env=env).remote(), Reader.options(runtime_env=env).remote()
    pid = ray.get(t.pid.remote())
    if connected:  # the reader has read from this sender before: its connection is open
        ray.get(r.sums.remote(t.state.remote()))
    ref = t.small_state.remote() if inline else t.state.remote()
    ray.wait([ref], fetch_local=False)
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        try:
            got = ray.get(r.sums.remote(ref), timeout=90)
            err = None
        except ray.exceptions.RayError as e:
            got, err = None, e
        took = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"frozen sender, {'inline' if inline else 'by ref'}{', connected' if connected else ''}: "
          f"{type(err).__name__ if err else 'ok'} after {took:.1f}s: {str(err)[-200:] if err else ''}")
    if inline:
        assert err is None, err
        assert len(got) == 8
        return
    assert err is not None and not isinstance(err, ray.exceptions.GetTimeoutError), "a hang, not an error"
    if connected:
        # The heartbeats' verdict (3 missed, 1 s apart) ends the wait: the
        # lease request no longer runs unwatched until the read's own bound
        # (it took the whole 30 s and said Timeout before rdt's guard fix).
        assert "OwnerDied" in str(err), err
        assert took < 20, f"not ended by the heartbeats: {took:.1f}s"
        return
    # Never connected: the control handshake cannot complete, and the
    # sender's kernel accepts connections that no process serves.
    assert "OwnerDied" in str(err), err
    assert took < 20, f"not bounded: {took:.1f}s"
