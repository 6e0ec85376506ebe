"""The weight-sync example across two Ray nodes (raycluster.py: two network
namespaces, two host names, a bridge, default configuration): the trainer
on the head, four inference-like engines alternating between the worker
node and the head, three steps of the toy training loop with every byte
verified at every step; one copy crosses the nodes' link per publish (the
worker node's leader relays to the other engine there). Then the leader
dies: the next publish re-parents the worker node's other engine onto the
trainer and drops the dead one.

The body runs in the cluster's driver (:meth:`raycluster.Cluster.call`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.multinode

import raycluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.normpath(os.path.join(HERE, "..", "..", "examples", "ray_weight_sync"))
sys.path.insert(0, EXAMPLE)

HEAD = {"resources": {raycluster.RESOURCE % "head": 1}}
WORKER = {"resources": {raycluster.RESOURCE % "worker": 1}}


@pytest.fixture(scope="module")
def cluster():
    # The workers import the example (its actor classes) from its folder.
    env = {"PYTHONPATH": os.pathsep.join([raycluster.PYTHON_DIR, HERE, EXAMPLE])}
    with raycluster.start(env=env) as c:
        yield c


def _drv_example() -> Dict[str, Any]:
    import weightsync_demo as demo

    lines = []
    # Trainer on the head; engine0 and engine2 on the worker, 1 and 3 on the head.
    s = demo.run(readers=4, steps=3, log=lines.append, nodes=[HEAD, WORKER])
    steps = [{"version": st["version"],
              "paths": {k: r["path"] for k, r in st["readers"].items()},
              "fed": {k: r["fed"] for k, r in st["readers"].items()},
              "ok": {k: r["ok"] for k, r in st["readers"].items()}} for st in s["steps"]]
    trainer, engines = s["trainer"], s["engines"]

    # The worker node's leader (the one the trainer feeds over the link) dies.
    leader = next(k for k, p in steps[-1]["paths"].items() if p not in ("shm", "local"))
    dead = engines[int(leader.removeprefix("engine"))]
    ray.kill(dead)
    # ray.kill returns at once: wait until the actor is gone, or the next
    # publish may still reach it.
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(dead.node.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            break
        except ray.exceptions.GetTimeoutError:
            pass  # a loaded machine: ask again
        assert time.monotonic() < deadline, "the killed engine still answers"
        time.sleep(0.2)
    alive = [e for i, e in enumerate(engines) if f"engine{i}" != leader]
    want = ray.get(trainer.train_step.remote())
    pending = [e.sync.remote() for e in alive]
    res = ray.get(trainer.publish.remote())
    got = ray.get(pending)
    after = {"version": res["version"], "dropped": res["dropped"],
             "ok": {k: r["ok"] for k, r in res["readers"].items()},
             "paths": {k: r["path"] for k, r in res["readers"].items()},
             "versions": [v for v, _, _ in got], "verified": all(d == want for _, d, _ in got)}
    return {"nodes": s["nodes"], "steps": steps, "leader": leader, "after": after, "log": lines}


def test_example_two_nodes_three_steps_every_byte(cluster):
    r = cluster.call(_drv_example, timeout=300)
    assert r["nodes"] == 2, r
    assert [st["version"] for st in r["steps"]] == [1, 2, 3]
    for st in r["steps"]:
        assert all(st["ok"].values()), st
        # One copy crosses the link: one engine is fed over the network, the
        # worker node's other engine from it.
        cross = [k for k, p in st["paths"].items() if p not in ("shm", "local")]
        assert len(cross) == 1 and cross[0] in ("engine0", "engine2"), st
        other = "engine2" if cross[0] == "engine0" else "engine0"
        assert st["paths"][other] == "shm" and st["fed"][other] != "owner", st
        # The head's engines are fed within the head (the trainer, or one
        # relaying to the other): never over the link.
        assert st["paths"]["engine1"] == st["paths"]["engine3"] == "shm", st
    a = r["after"]
    assert a["version"] == 4 and a["dropped"] == [r["leader"]], a
    assert not a["ok"][r["leader"]] and all(v for k, v in a["ok"].items() if k != r["leader"]), a
    other = "engine2" if r["leader"] == "engine0" else "engine0"
    assert a["paths"][other] not in ("shm", "local"), a  # now fed over the link
    assert a["versions"] == [4, 4, 4] and a["verified"], a
