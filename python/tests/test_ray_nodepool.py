"""The node's warm pool through Ray (issue 23, item 7): a helper process
that outlives the actors holds populated memory, the node's runtimes take
new slabs from it, and it ends once the node's runtimes are gone. One real
local Ray with a runtime directory of its own (so the helper is this
test's alone) and a short idle end."""

import glob
import os
import subprocess
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import tensorlane.ray as tlr  # noqa: E402

MiB = 1 << 20
PATH = {"PYTHONPATH": os.pathsep.join(p for p in (os.path.dirname(os.path.abspath(__file__)),
                                                  os.environ.get("PYTHONPATH", "")) if p)}

tlr.register()


@pytest.fixture(scope="module")
def rundir(tmp_path_factory):
    d = tmp_path_factory.mktemp("rt")
    os.chmod(d, 0o700)
    return str(d)


@pytest.fixture(scope="module", autouse=True)
def cluster(rundir):
    ray.init(num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False,
             runtime_env={"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_RUNTIME_DIR=rundir,
                                           TENSORLANE_NODE_POOL_IDLE_S="2", TENSORLANE_NODE_POOL_BYTES="96MiB")})
    yield
    ray.shutdown()


@ray.remote(enable_tensor_transport=True)
class Trainer:
    def __init__(self):
        rng = np.random.default_rng(1)
        self.w = {f"l{i}": rng.standard_normal(2 * MiB // 4, dtype=np.float32) for i in range(16)}  # 32 MiB

    def stats(self):
        return tlr.runtime().stats()

    @ray.method(tensor_transport="TENSORLANE")
    def state(self):
        return self.w

    def sums(self):
        return {k: float(v.astype(np.float64).sum()) for k, v in self.w.items()}


@ray.remote(enable_tensor_transport=True)
class Reader:
    def sums(self, sd):
        return {k: float(np.asarray(v, np.float64).sum()) for k, v in sd.items()}


def helpers(rundir):
    """PIDs of processes serving this test's socket."""
    out = subprocess.run(["pgrep", "-f", "tensorlane._nodepool.*" + rundir], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait(cond, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_state_dict_comes_from_the_node_pool_which_ends_with_the_actors(rundir):
    t, r = Trainer.remote(), Reader.remote()
    # The trainer's runtime starts the node's helper, which fills its budget.
    wait(lambda: (ray.get(t.stats.remote()).get("node_pool") or {}).get("ready_bytes", 0) >= 64 * MiB,
         "the pool helper to fill")
    assert len(helpers(rundir)) == 1, "one helper for the node"
    before = ray.get(t.stats.remote())
    ref = t.state.remote()
    assert ray.get(r.sums.remote(ref)) == ray.get(t.sums.remote())
    st = ray.get(t.stats.remote())
    np_ = st["node_pool"]
    assert np_["connected"] and np_["hits"] - before["node_pool"]["hits"] == 1, np_
    assert np_["taken_bytes"] >= 32 * MiB, np_
    assert st["host_memory"]["slab_count"] == 1, st["host_memory"]
    del ref
    # A second trainer (a fresh actor) shares the same helper.
    t2 = Trainer.remote()
    assert ray.get(t2.stats.remote())["host_memory"]["slabs"]
    wait(lambda: ray.get(t2.stats.remote())["node_pool"]["connected"], "the second runtime to connect")
    assert len(helpers(rundir)) == 1
    # The node's runtimes gone, the helper ends (after its idle time): no orphan.
    for a in (t, t2, r):
        ray.kill(a)
    wait(lambda: not helpers(rundir), "the helper to end with the node's runtimes")
    assert not glob.glob(os.path.join(rundir, "nodepool*.sock"))


def test_without_the_pool_slabs_are_made_here_and_counted(rundir):
    off = {"env_vars": dict(PATH, TENSORLANE_TRANSPORTS="", TENSORLANE_RUNTIME_DIR=rundir, TENSORLANE_NODE_POOL_BYTES="-1")}
    t, r = Trainer.options(runtime_env=off).remote(), Reader.options(runtime_env=off).remote()
    ref = t.state.remote()
    assert ray.get(r.sums.remote(ref)) == ray.get(t.sums.remote())
    st = ray.get(t.stats.remote())
    assert "node_pool" not in st and st["host_memory"]["slab_count"] == 1, st
    assert not helpers(rundir), "node_pool_bytes < 0: no helper"
    for a in (t, r):
        ray.kill(a)
