"""Ray's own RDT semantics with TENSORLANE on CPU numpy arrays.

The cases of Ray's RDT suites (python/ray/tests/rdt/test_rdt_nixl.py,
test_rdt_custom.py in ray-project/ray), written anew for this transport:
actor to actor, the driver getting an RDT ref, the same actor, ``ray.put``
with ``_tensor_transport`` inside an actor, ``_use_object_store=True``,
duplicate tensors and GC, a sender killed before creating and before
sending, del before creating, async actors with many interleaved
transfers, shared tensors in two puts, borrowed refs, many consumers, and
``set_target_for_ref``.

Workers are set up the way docs/ray.md tells users to: the job's
``runtime_env`` names ``tensorlane.ray.register`` as Ray's
``worker_process_setup_hook``, so no actor calls ``register()`` itself (this
module registers only in the driver: see the guard below). One local Ray for
the module, pinned to loopback.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import tensorlane.ray as tlr  # noqa: E402
from tensorlane import _runtime  # noqa: E402

T = tlr.NAME
GUARD_S = 120  # a bound on every wait: turns a hang into a failure, never a timing assertion

# The driver registers before the classes below name the transport. A worker
# importing this module does not: it was registered by the setup hook before
# the module was imported (else the decorators below would refuse the name).
if not _runtime.in_ray_worker():
    tlr.register()


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
             runtime_env={"worker_process_setup_hook": "tensorlane.ray.register",
                          "env_vars": {"PYTHONPATH": os.pathsep.join(
                              [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")])}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pair():
    """A sender and a receiver for the cases that kill nothing (a worker
    process costs seconds to start on a small machine)."""
    src, dst = Actor.remote(), Actor.remote()
    ray.get([src.ready.remote(), dst.ready.remote()], timeout=GUARD_S)
    return src, dst


def arange(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32)


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Actor:
    def __init__(self):
        self.a1 = arange(1 << 16, 1)  # large enough for a ref, not inline
        self.a2 = arange(1 << 16, 2)
        self.a3 = arange(1 << 16, 3)

    def ready(self) -> bool:
        return True

    def runtime_started(self) -> bool:
        return tlr._rt is not None

    @ray.method(tensor_transport=T)
    def echo(self, data: np.ndarray) -> np.ndarray:
        return np.array(data)

    def sum(self, data: Any) -> float:
        return float(np.asarray(data, dtype=np.float64).sum())

    def produce(self, arrays: List[np.ndarray]) -> List[Any]:
        """ray.put inside the actor; this process never called register()."""
        return [ray.put(a, _tensor_transport=T) for a in arrays]

    def consume(self, refs: List[Any]) -> float:
        return float(sum(np.asarray(ray.get(r), dtype=np.float64).sum() for r in refs))

    def consume_with_object_store(self, refs: List[Any]) -> float:
        return float(sum(np.asarray(ray.get(r, _use_object_store=True), dtype=np.float64).sum() for r in refs))

    @ray.method(tensor_transport=T)
    def send_dict1(self) -> Dict[str, np.ndarray]:
        return {"a": self.a1, "b": self.a2}

    @ray.method(tensor_transport=T)
    def send_dict2(self) -> Dict[str, np.ndarray]:
        return {"a": self.a1, "c": self.a3}

    def sum_dict(self, d: Dict[str, np.ndarray]) -> float:
        return float(sum(np.asarray(v, dtype=np.float64).sum() for v in d.values()))

    def num_rdt_objects(self) -> int:
        return ray._private.worker.global_worker.rdt_manager.rdt_store.get_num_objects()

    def num_published(self) -> int:
        return tlr.runtime().stats()["objects"]

    def put_shared_lists(self) -> List[Any]:
        t1, t2, t3 = arange(1 << 16, 10), arange(1 << 16, 20), arange(1 << 16, 30)
        return [ray.put([t1, t2], _tensor_transport=T), ray.put([t2, t3], _tensor_transport=T)]

    def borrow_and_sum(self, refs: List[Any]) -> float:
        return float(np.asarray(ray.get(refs[0]), dtype=np.float64).sum())

    @ray.method(concurrency_group="_ray_system")
    def block_background_thread(self, signal: Any) -> None:
        ray.get(signal.wait.remote())

    def block_main_thread(self, signal: Any) -> None:
        ray.get(signal.wait.remote())

    def get_ref(self) -> Any:
        return ray.put([self.a1, self.a2], _tensor_transport=T)

    def get_with_buffers(self, refs: List[Any]) -> bool:
        from ray.experimental import set_target_for_ref

        bufs = [np.zeros_like(self.a1).view(Target), np.zeros_like(self.a2).view(Target)]
        set_target_for_ref(refs[0], bufs)
        got = ray.get(refs[0])
        return (all(g is b for g, b in zip(got, bufs))
                and np.array_equal(bufs[0], self.a1) and np.array_equal(bufs[1], self.a2))

    def get_with_wrong_buffers(self, refs: List[Any]) -> str:
        from ray.experimental import set_target_for_ref

        # Held here: Ray keeps only weak references to target buffers.
        wrong = [np.zeros(2, np.float32).view(Target), np.zeros(2, np.float32).view(Target)]
        set_target_for_ref(refs[0], wrong)
        try:
            ray.get(refs[0])
        except ValueError as e:
            return str(e)
        return ""


class Target(np.ndarray):
    """A numpy target buffer for set_target_for_ref. Ray 2.60's buffer check
    (rdt_store.validate_tensor_buffers) calls ``is_contiguous()``, which
    torch tensors have and numpy arrays do not: without it Ray refuses any
    numpy target with an AttributeError, before the transport is asked."""

    def is_contiguous(self) -> bool:
        return bool(self.flags.c_contiguous)


def total(a: np.ndarray) -> float:
    return float(a.astype(np.float64).sum())


def test_setup_hook_starts_the_runtime():
    """The setup hook starts each worker's runtime in the background as the
    worker starts, not on its first receive."""
    a = Actor.remote()
    deadline = time.monotonic() + GUARD_S
    while not ray.get(a.runtime_started.remote(), timeout=GUARD_S):
        assert time.monotonic() < deadline, "no runtime without a transfer"
        time.sleep(0.05)
    ray.kill(a)


def test_actor_to_actor(pair):
    src, dst = pair
    data = arange(1 << 18)
    assert ray.get(dst.sum.remote(src.echo.remote(data)), timeout=GUARD_S) == total(data)
    small = np.array([1, 2, 3], np.float32)  # inline
    assert ray.get(dst.sum.remote(src.echo.remote(small)), timeout=GUARD_S) == 6


def test_driver_gets_an_rdt_ref(pair):
    a = pair[0]
    data = arange(1 << 18, 5)
    refs = [a.echo.remote(data) for _ in range(3)]
    np.testing.assert_array_equal(ray.get(refs[0], timeout=GUARD_S), data)
    np.testing.assert_array_equal(ray.get(refs[1], timeout=GUARD_S), data)
    np.testing.assert_array_equal(ray.get(refs[2], _use_object_store=True, timeout=GUARD_S), data)


def test_same_actor(pair):
    a = pair[1]
    data = arange(1 << 18, 7)
    assert ray.get(a.sum.remote(a.echo.remote(data)), timeout=GUARD_S) == total(data)


def test_put_inside_actor_without_register(pair):
    src, dst = pair
    arrays = [arange(1 << 16, i) for i in (1, 2, 3)]
    refs = src.produce.remote(arrays)  # a list of RDT refs made by ray.put in the actor
    assert ray.get(dst.consume.remote(refs), timeout=GUARD_S) == sum(total(a) for a in arrays)


def test_put_inside_actor_read_through_object_store(pair):
    src, dst = pair
    arrays = [arange(1 << 16, i) for i in (4, 5)]
    refs = src.produce.remote(arrays)
    assert ray.get(dst.consume_with_object_store.remote(refs), timeout=GUARD_S) == sum(total(a) for a in arrays)


def wait_for(cond, what: str, timeout: float = GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


def test_duplicate_tensors_and_gc(pair):
    src, dst = pair
    a1, a2, a3 = arange(1 << 16, 1), arange(1 << 16, 2), arange(1 << 16, 3)
    ref1 = src.send_dict1.remote()
    assert ray.get(dst.sum_dict.remote(ref1), timeout=GUARD_S) == total(a1) + total(a2)
    ref2 = src.send_dict2.remote()  # a1 again, in a second object
    assert ray.get(dst.sum_dict.remote(ref2), timeout=GUARD_S) == total(a1) + total(a3)
    ref3 = src.send_dict1.remote()
    assert ray.get(dst.sum_dict.remote(ref3), timeout=GUARD_S) == total(a1) + total(a2)
    del ref1, ref2, ref3
    wait_for(lambda: ray.get(src.num_rdt_objects.remote()) == 0, "Ray's RDT store on the sender empties")
    wait_for(lambda: ray.get(src.num_published.remote()) == 0, "tensorlane frees every published object")


def chain(e: BaseException) -> List[str]:
    out = []
    while e is not None and len(out) < 10:
        out.append(type(e).__name__)
        e = getattr(e, "cause", None) or e.__cause__
    return out


def test_sender_killed_before_creating(pair):
    from ray._common.test_utils import SignalActor

    dst = pair[1]
    src = Actor.remote()
    signal = SignalActor.remote()
    src.block_main_thread.remote(signal)
    ref = src.echo.remote(arange(1 << 16))
    result = dst.sum.remote(ref)
    ray.kill(src)
    with pytest.raises(ray.exceptions.ActorDiedError):
        ray.get(result, timeout=GUARD_S)
    # The receiver still works, with another sender.
    assert ray.get(dst.sum.remote(pair[0].echo.remote(np.array([4, 5, 6], np.float32))), timeout=GUARD_S) == 15


def test_sender_killed_before_sending(pair):
    from ray._common.test_utils import SignalActor

    dst = pair[1]
    src = Actor.remote()
    ray.get(src.ready.remote(), timeout=GUARD_S)
    signal = SignalActor.remote()
    dst.block_background_thread.remote(signal)  # the receive waits
    ref = src.echo.remote(arange(1 << 16))
    result = dst.sum.remote(ref)
    ray.wait([ref], timeout=GUARD_S)  # published
    ray.kill(src)
    signal.send.remote()
    with pytest.raises(ray.exceptions.RayError) as info:
        ray.get(result, timeout=GUARD_S)
    kinds = chain(info.value)
    # The receiver's read failed as the owner's death, typed.
    assert any(k in str(info.value) for k in ("OwnerDied", "PeerClosed", "PeerUnreachable")), (kinds, str(info.value)[-2000:])
    data = arange(1 << 16, 9)
    assert ray.get(dst.sum.remote(pair[0].echo.remote(data)), timeout=GUARD_S) == total(data)


def test_del_before_creating(pair):
    from ray._common.test_utils import SignalActor

    a = pair[0]
    signal = SignalActor.remote()
    a.block_main_thread.remote(signal)
    ref = a.echo.remote(arange(1 << 16))
    obj_id = ref.hex()
    del ref
    ray.get(signal.send.remote(), timeout=GUARD_S)
    manager = ray._private.worker.global_worker.rdt_manager
    wait_for(lambda: manager.get_rdt_metadata(obj_id) is None, "the driver forgets the object")
    wait_for(lambda: ray.get(a.num_rdt_objects.remote()) == 0, "the actor's RDT store empties")
    wait_for(lambda: ray.get(a.num_published.remote()) == 0, "tensorlane frees the object")


@ray.remote(num_cpus=0, max_concurrency=10, enable_tensor_transport=True)
class AsyncActor:
    def __init__(self):
        self.data = arange(1 << 16, 4)

    @ray.method(tensor_transport=T)
    async def get_tensor(self) -> np.ndarray:
        return self.data

    async def sum(self, data: np.ndarray) -> float:
        return float(np.asarray(data, dtype=np.float64).sum())


def test_async_actors_interleaved_transfers():
    src, dst = AsyncActor.remote(), AsyncActor.remote()
    results = [dst.sum.remote(src.get_tensor.remote()) for _ in range(100)]
    want = total(arange(1 << 16, 4))
    assert ray.get(results, timeout=GUARD_S) == [want] * 100


def test_shared_tensors_in_two_puts(pair):
    src, dst = pair
    refs = ray.get(src.put_shared_lists.remote(), timeout=GUARD_S)
    t1, t2, t3 = arange(1 << 16, 10), arange(1 << 16, 20), arange(1 << 16, 30)
    assert ray.get(dst.consume.remote(refs), timeout=GUARD_S) == total(t1) + 2 * total(t2) + total(t3)


def test_borrowed_ref(pair):
    src, dst = pair
    data = arange(1 << 16, 11)
    # The ref is owned by src (its ray.put) and borrowed by the driver, then
    # by dst inside a list (no out-of-band trigger: dst's ray.get fetches).
    # Ray 2.60 borrows only refs made by ray.put (an actor task's return is
    # refused as "not created on the owner", for Ray's own transports too).
    refs = ray.get(src.produce.remote([data]), timeout=GUARD_S)
    assert ray.get(dst.borrow_and_sum.remote(refs), timeout=GUARD_S) == total(data)


def test_many_consumers(pair):
    src, dst = pair
    consumers = [dst, src] + [Actor.remote() for _ in range(2)]  # the sender reads its own too
    data = arange(1 << 18, 13)
    ref = src.echo.remote(data)
    assert ray.get([c.sum.remote(ref) for c in consumers], timeout=GUARD_S) == [total(data)] * 4
    for c in consumers[2:]:
        ray.kill(c)


def test_set_target_for_ref(pair):
    src, dst = pair
    ref = ray.get(src.get_ref.remote(), timeout=GUARD_S)
    assert ray.get(dst.get_with_buffers.remote([ref]), timeout=GUARD_S) is True
    ref = ray.get(src.get_ref.remote(), timeout=GUARD_S)
    msg = ray.get(dst.get_with_wrong_buffers.remote([ref]), timeout=GUARD_S)
    assert "Shape of tensor_buffer at index 0" in msg
