"""Weight sync on a real local Ray (one node): the example's trainer and
four inference-like actors for three steps with every byte verified, then a
reader killed mid-run is routed around and dropped, and a late joiner gets
the latest version."""

import os
import sys
import time

import pytest

ray = pytest.importorskip("ray")

import tensorlane as tl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "ray_weight_sync")
PKG = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
sys.path.insert(0, EXAMPLE)

import weightsync_demo as demo  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # Workers import tensorlane and the example from this checkout and load
    # the library the test runs with (TENSORLANE_LIB, when set).
    env = {"PYTHONPATH": os.pathsep.join([HERE, EXAMPLE, PKG]), "TENSORLANE_TRANSPORTS": "",
           "TENSORLANE_POOL_BYTES": "16M"}
    if os.environ.get("TENSORLANE_LIB"):
        env["TENSORLANE_LIB"] = os.environ["TENSORLANE_LIB"]
    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()


def test_example_three_steps_four_readers_every_byte():
    lines = []
    s = demo.run(readers=4, steps=3, log=lines.append)
    assert len(s["steps"]) == 3
    for i, st in enumerate(s["steps"], 1):
        assert st["version"] == i
        assert all(r["ok"] for r in st["readers"].values())
        assert set(st["readers"]) == {f"engine{i}" for i in range(4)}
    # Ray workers use slab memory, which same-host writers may not map:
    # the weights are staged and copied in at wait, all together.
    assert s["landing"] == tl.weightsync.LAND_STAGED
    trainer, engines = s["trainer"], s["engines"]

    # A reader dies: the next publish reaches the others and drops it.
    ray.kill(engines[1])
    # ray.kill returns at once: wait until the actor is gone, or the next
    # publish may still reach it.
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(engines[1].node.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            break
        except ray.exceptions.GetTimeoutError:
            pass  # a loaded machine: ask again
        assert time.monotonic() < deadline, "the killed engine still answers"
        time.sleep(0.2)
    ray.get(trainer.train_step.remote())
    alive = [e for i, e in enumerate(engines) if i != 1]
    pending = [e.sync.remote() for e in alive]
    res = ray.get(trainer.publish.remote())
    assert res["version"] == 4
    assert not res["readers"]["engine1"]["ok"] and res["dropped"] == ["engine1"], res
    assert all(res["readers"][f"engine{i}"]["ok"] for i in (0, 2, 3)), res
    assert [v for v, _, _ in ray.get(pending)] == [4, 4, 4]
    assert "engine1" not in ray.get(trainer.readers.remote())

    # A late joiner gets version 4 at once, byte for byte.
    late = ray.remote(num_cpus=0)(demo.Engine).remote("late")
    joined = ray.get(trainer.join.remote(late.handle.remote()))
    assert joined == {"ok": True, "error": None}
    want = ray.get(trainer.train_step.remote(0.0))  # lr 0: the digests of version 4
    version, got, _ = ray.get(late.sync.remote())
    assert version == 4 and got == want
