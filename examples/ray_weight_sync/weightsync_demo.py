"""Weight sync on Ray: a trainer and four inference-like actors, a toy
training loop, every byte verified at every step.

The trainer keeps its parameters in tensorlane memory and publishes them
after each optimizer step with one call (``WeightPublisher.publish``): the
state dict flows along a pipelined broadcast tree into the readers' own
parameter arrays. Each reader waits for the whole new version (never a mix
of two), checks it, runs a forward pass, and says it is done, which lets the
next version land.

Run it on one machine::

    python examples/ray_weight_sync/weightsync_demo.py --readers 4 --steps 3

or on a running cluster (``--address auto``; readers are spread over the
nodes). Python's tests run it on one node (python/tests/test_weightsync_ray.py)
and on two Ray nodes of the multi-node fixture, trainer on one and engines on
both (python/tests/test_weightsync_multinode.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import tensorlane as tl
from tensorlane import weightsync as ws

#: The toy model: (name, shape) of each parameter, float32.
SHAPES: List[Tuple[str, Tuple[int, ...]]] = [
    ("embed.weight", (1024, 256)),
    ("layer0.weight", (256, 256)),
    ("layer0.bias", (256,)),
    ("layer1.weight", (256, 256)),
    ("layer1.bias", (256,)),
    ("head.weight", (256, 64)),
]


def digests(params: Dict[str, np.ndarray]) -> Dict[str, str]:
    """A sha256 per parameter: what "every byte verified" compares."""
    return {k: hashlib.sha256(np.ascontiguousarray(v).view(np.uint8)).hexdigest() for k, v in params.items()}


def forward(params: Dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """A tiny MLP over embeddings: the "inference" a reader runs."""
    h = params["embed.weight"][tokens]
    h = np.tanh(h @ params["layer0.weight"] + params["layer0.bias"])
    h = np.tanh(h @ params["layer1.weight"] + params["layer1.bias"])
    return h @ params["head.weight"]


def _remote(cls: Any) -> Any:
    import ray

    return ray.remote(num_cpus=0)(cls)


class Trainer:
    """Holds the parameters (tensorlane memory: sent with no copy) and the
    publisher."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.params: Dict[str, np.ndarray] = {}
        for name, shape in SHAPES:
            a = tl.empty(shape, np.float32)
            a[:] = rng.standard_normal(shape, dtype=np.float32) * 0.05
            self.params[name] = a
        self.rng = rng
        self.pub = ws.WeightPublisher(busy_wait=60.0, timeout=120.0)

    def join(self, handle: ws.ReaderHandle) -> Optional[Dict[str, Any]]:
        r = self.pub.join(handle)
        return None if r is None else {"ok": r.ok, "error": None if r.ok else str(r.error)}

    def train_step(self, lr: float = 1e-3) -> Dict[str, str]:
        """A toy optimizer step, in place (the publisher reuses its refs)."""
        for v in self.params.values():
            v -= lr * self.rng.standard_normal(v.shape, dtype=np.float32)
        return digests(self.params)

    def publish(self) -> Dict[str, Any]:
        res = self.pub.publish(self.params)
        return {"version": res.version, "ok": res.ok, "seconds": res.seconds, "bytes": res.bytes, "tree": res.tree,
                "dropped": res.dropped,
                "readers": {k: {"ok": r.ok, "fed": r.fed, "path": r.path, "reparented": r.reparented,
                                "error": None if r.ok else f"{type(r.error).__name__}: {r.error}"}
                            for k, r in res.readers.items()}}

    def readers(self) -> List[str]:
        return self.pub.readers()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class Engine:
    """An inference-like reader: its own parameters, weights land in them."""

    def __init__(self, name: str):
        self.params = {n: np.zeros(s, np.float32) for n, s in SHAPES}
        self.rx = ws.WeightReceiver(self.params, name=name)

    def handle(self) -> ws.ReaderHandle:
        return self.rx.handle()

    def landing(self) -> str:
        return self.rx.landing()

    def sync(self, timeout: float = 120.0) -> Tuple[int, Dict[str, str], float]:
        """Waits for the next version, checks it, runs a forward pass, and
        lets the following version land."""
        version = self.rx.wait(timeout=timeout)
        d = digests(self.params)
        out = forward(self.params, np.arange(8) % 1024)
        self.rx.done()
        return version, d, float(np.abs(out).sum())

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def run(readers: int = 4, steps: int = 3, spread: bool = False, log=print,
        nodes: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Runs the loop on the connected Ray cluster and returns a summary;
    raises AssertionError if any reader's bytes differ from the trainer's.
    ``nodes``: actor options per node (e.g. custom resources); the trainer
    goes to the first, engine i to nodes[(i + 1) % len(nodes)], so with two
    nodes the engines alternate between the other node and the trainer's."""
    import ray

    opts: Dict[str, Any] = {"scheduling_strategy": "SPREAD"} if spread else {}
    if nodes:
        trainer = _remote(Trainer).options(**nodes[0]).remote()
        engines = [_remote(Engine).options(**nodes[(i + 1) % len(nodes)]).remote(f"engine{i}") for i in range(readers)]
    else:
        trainer = _remote(Trainer).options(**opts).remote()
        engines = [_remote(Engine).options(**opts).remote(f"engine{i}") for i in range(readers)]
    handles = ray.get([e.handle.remote() for e in engines])
    assert all(j is None for j in ray.get([trainer.join.remote(h) for h in handles]))
    summary: Dict[str, Any] = {"steps": [], "landing": ray.get(engines[0].landing.remote()),
                               "nodes": len(set(ray.get([e.node.remote() for e in engines] + [trainer.node.remote()])))}
    for step in range(1, steps + 1):
        want = ray.get(trainer.train_step.remote())
        pending = [e.sync.remote() for e in engines]  # readers wait while the trainer publishes
        res = ray.get(trainer.publish.remote())
        got = ray.get(pending)
        assert res["ok"], res
        for i, (version, d, _) in enumerate(got):
            assert version == step, (i, version, step)
            bad = [k for k in want if d[k] != want[k]]
            assert not bad, f"step {step}: engine{i} differs in {bad}"
        log(f"step {step}: version {res['version']} to {len(got)} readers in {res['seconds'] * 1e3:.1f} ms, "
            f"every byte verified\n{res['tree']}")
        summary["steps"].append({"version": res["version"], "seconds": res["seconds"], "bytes": res["bytes"],
                                 "readers": res["readers"]})
    summary["trainer"], summary["engines"] = trainer, engines
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--address", default=None, help="a running cluster's address (auto), else a local one")
    args = p.parse_args(argv)
    import ray

    here = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
    env = {"PYTHONPATH": os.pathsep.join([here, pkg, os.environ.get("PYTHONPATH", "")])}
    if os.environ.get("TENSORLANE_LIB"):
        env["TENSORLANE_LIB"] = os.environ["TENSORLANE_LIB"]
    ray.init(address=args.address, runtime_env={"env_vars": env}, include_dashboard=False)
    try:
        s = run(args.readers, args.steps, spread=args.address is not None)
        print(json.dumps({k: v for k, v in s.items() if k not in ("trainer", "engines")}, indent=1, default=str))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
