"""tensorlane through a real two-node Ray cluster (raycluster.py: two
network namespaces, two host names, a bridge), default configuration.

One cluster for the module. Test bodies run in the cluster's driver (on the
head node) through :meth:`raycluster.Cluster.call`: the functions named
``_drv_*`` below; actors are placed with the nodes' custom resources
(senders on the worker node, receivers on the head). Errors are reported
back as the chain of exception type names, so the tests assert types, never
times.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Dict, List

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.multinode

import raycluster  # noqa: E402
import tensorlane  # noqa: E402
import tensorlane.ray as tlr  # noqa: E402

tlr.register()  # before the classes below name the transport

MiB = 1 << 20
HEAD = {raycluster.RESOURCE % "head": 1}
WORKER = {raycluster.RESOURCE % "worker": 1}
#: A guard on every wait in the driver, far above the failure bounds under
#: test (heartbeats, about 5 s): it only turns a hang into a failure.
GUARD_S = 120


@pytest.fixture(scope="module")
def cluster():
    with raycluster.start() as c:
        yield c


def expected(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


@ray.remote(enable_tensor_transport=True, num_cpus=0)
class Sender:
    """Lives on the worker node."""

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    @ray.method(tensor_transport="TENSORLANE")
    def produce(self, n: int, seed: int = 0) -> np.ndarray:
        return expected(n, seed)

    @ray.method(tensor_transport="TENSORLANE")
    def weights(self, n: int) -> Dict[str, np.ndarray]:
        self.w = {f"layer{i}": np.full(n, float(i), np.float32) for i in range(4)}
        return self.w

    def train_step(self) -> None:
        for a in self.w.values():
            a += 100.0  # in place, as an optimizer step does

    @ray.method(tensor_transport="TENSORLANE")
    def bf16(self, n: int) -> np.ndarray:
        import ml_dtypes

        return (np.arange(n, dtype=np.float32) % 251).astype(ml_dtypes.bfloat16)

    @ray.method(tensor_transport="TENSORLANE")
    def strided(self) -> Dict[str, np.ndarray]:
        a = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)
        return {"cols": a[:, ::2], "fortran": np.asfortranarray(a), "t": a.T}

    def put_plain(self, n: int) -> bytes:
        """A ref made by the runtime directly (no Ray transport)."""
        self.kept = expected(n, 3)
        return bytes(tlr.runtime().put(self.kept))

    def put_wildcard(self, n: int) -> bytes:
        """A ref from a runtime whose tcp data listener is on the wildcard."""
        from tensorlane import _raynode

        self.wild = tensorlane.Runtime(_raynode.apply({"discover": True, "data_addr": "0.0.0.0:0", "allow_transports": ["tcp"]}))
        self.kept_wild = expected(n, 3)
        return bytes(self.wild.put(self.kept_wild))

    def runtime_stats(self) -> Dict[str, Any]:
        return tlr.runtime().stats()

    def plain(self, n: int) -> np.ndarray:
        """A return that names no transport: Ray's own path."""
        return np.arange(n, dtype=np.float32)


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Receiver:
    """Lives on the head node (or the worker, for a same-node pair)."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def check(self, a: np.ndarray, n: int, seed: int = 0) -> bool:
        return bool(np.array_equal(a, expected(n, seed)))

    def sum(self, a: np.ndarray) -> float:
        return float(np.asarray(a, dtype=np.float64).sum())

    def values(self, d: Dict[str, np.ndarray]) -> Dict[str, List[float]]:
        return {k: sorted(set(np.asarray(v, np.float32).ravel().tolist())) for k, v in d.items()}

    def bf16_ok(self, a: np.ndarray, n: int) -> bool:
        import ml_dtypes

        want = (np.arange(n, dtype=np.float32) % 251).astype(ml_dtypes.bfloat16)
        return a.dtype == want.dtype and a.shape == want.shape and bool(np.array_equal(a.view(np.uint16), want.view(np.uint16)))

    def strided_ok(self, d: Dict[str, np.ndarray]) -> bool:
        a = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)
        return (np.array_equal(d["cols"], a[:, ::2]) and np.array_equal(d["fortran"], a)
                and np.array_equal(d["t"], a.T))

    def flags(self, a: np.ndarray) -> tuple:
        return bool(a.flags.writeable), a.dtype.str, a.shape, bool(np.array_equal(a, np.arange(a.size, dtype=np.float32)))

    def get_plain(self, ref: bytes) -> Dict[str, Any]:
        rt = tlr.runtime()
        x = rt.get(ref)
        return {"ok": bool(np.array_equal(x, expected(x.size, 3))), "explain": rt.explain(ref),
                "info": tensorlane.ref_info(ref), "host": rt.stats()["host"]}


def _error_chain(e: BaseException) -> List[str]:
    """Type names of e, its causes, and Ray's wrapped cause."""
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(type(e).__name__)
        nxt = getattr(e, "cause", None) or e.__cause__ or e.__context__
        if nxt is None and hasattr(e, "as_instanceof_cause"):
            try:
                c = e.as_instanceof_cause()
                nxt = c if c is not e else None
            except Exception:
                nxt = None
        e = nxt
    return out


# Actors shared by the module's cases, made once in the driver.
_pair: Dict[str, Any] = {}


def _drv_pair() -> Dict[str, Any]:
    if not _pair:
        _pair["s"] = Sender.options(resources=WORKER).remote()
        _pair["r"] = Receiver.options(resources=HEAD).remote()
        _pair["nodes"] = ray.get([_pair["s"].node.remote(), _pair["r"].node.remote()], timeout=GUARD_S)
    return _pair


def _drv_forget() -> None:
    _pair.clear()


def _drv_cross_node(n: int) -> Dict[str, Any]:
    p = _drv_pair()
    ok = ray.get(p["r"].check.remote(p["s"].produce.remote(n, 7), n, 7), timeout=GUARD_S)
    plain = ray.get(p["r"].get_plain.remote(p["s"].put_plain.remote(1 * MiB // 4)), timeout=GUARD_S)
    return {"ok": ok, "nodes": p["nodes"], "plain": plain, "sender": ray.get(p["s"].runtime_stats.remote())}


def test_cross_node_transfer_bytes_checked(cluster):
    res = cluster.call(_drv_cross_node, 16 * MiB // 4)
    worker_node, head_node = res["nodes"]
    assert worker_node != head_node, "sender and receiver must be on different Ray nodes"
    assert res["ok"], "the bytes read across nodes differ from the bytes sent"
    plain = res["plain"]
    assert plain["ok"]
    # Host identity from Ray's node id: different nodes, different hosts.
    assert plain["info"]["host"] == "ray-" + worker_node[:16]
    assert plain["host"] == "ray-" + head_node[:16]
    assert plain["explain"]["plan"]["chosen"] in ("tcp", "rdma"), plain["explain"]
    assert res["sender"]["host"] == "ray-" + worker_node[:16]


def _drv_driver_gets(n: int) -> bool:
    p = _drv_pair()
    got = ray.get(p["s"].produce.remote(n, 5), timeout=GUARD_S)  # the driver, on the head, reads
    return bool(np.array_equal(got, expected(n, 5)))


def test_driver_gets_across_nodes(cluster):
    # The driver's runtime must listen where the worker node can answer it
    # and share the workers' cluster key (_raynode gives it the session's).
    assert cluster.call(_drv_driver_gets, 4 * MiB // 4) is True


def _drv_wildcard() -> Dict[str, Any]:
    p = _drv_pair()
    return ray.get(p["r"].get_plain.remote(p["s"].put_wildcard.remote(1 * MiB // 4)), timeout=GUARD_S)


def test_wildcard_data_addr_is_reachable_across_nodes(cluster):
    # Issue 29 item 9: the ref carried [::]:port and the reader dialled itself.
    res = cluster.call(_drv_wildcard)
    assert res["ok"]
    assert res["explain"]["plan"]["chosen"] == "tcp", res["explain"]


def _drv_same_node() -> Dict[str, Any]:
    p = _drv_pair()
    r2 = Receiver.options(resources=WORKER).remote()
    out = ray.get(r2.get_plain.remote(p["s"].put_plain.remote(1 * MiB // 4)), timeout=GUARD_S)
    ray.kill(r2)
    return out


def test_same_node_actors_share_a_host(cluster):
    res = cluster.call(_drv_same_node)
    assert res["ok"]
    assert res["host"] == res["info"]["host"], "two actors of one Ray node must claim one topology host"
    assert res["explain"]["plan"]["chosen"] in ("shm", "p2p"), res["explain"]


def _drv_weights_as_returned(n: int) -> Dict[str, List[float]]:
    p = _drv_pair()
    ref = p["s"].weights.remote(n)
    ray.get(p["s"].train_step.remote(), timeout=GUARD_S)  # in place, after the return
    return ray.get(p["r"].values.remote(ref), timeout=GUARD_S)


def _drv_side_effect(n: int) -> Dict[str, tuple]:
    p = _drv_pair()
    fresh = ray.get(p["r"].flags.remote(p["s"].plain.remote(n)), timeout=GUARD_S)
    ray.get(p["r"].check.remote(p["s"].produce.remote(n, 9), n, 9), timeout=GUARD_S)  # a TENSORLANE call
    after = ray.get(p["r"].flags.remote(p["s"].plain.remote(n)), timeout=GUARD_S)
    return {"fresh": fresh, "after": after}


def test_plain_return_unchanged_by_the_transport_across_nodes(cluster):
    # Issue 23 item 3: Ray registers a transport's serializer process-wide for
    # numpy arrays; a method that names no transport must keep Ray's own path
    # (a read-only array from the object store) after TENSORLANE calls.
    res = cluster.call(_drv_side_effect, 1 * MiB // 4)
    assert res["fresh"] == (False, "<f4", (MiB // 4,), True), res
    assert res["after"] == res["fresh"], res


def test_weights_as_returned_across_nodes(cluster):
    got = cluster.call(_drv_weights_as_returned, 4 * MiB // 4)
    assert got == {f"layer{i}": [float(i)] for i in range(4)}, "the reader must get the weights as returned"


def _drv_bf16() -> Dict[str, bool]:
    p = _drv_pair()
    return {n: ray.get(p["r"].bf16_ok.remote(p["s"].bf16.remote(n), n), timeout=GUARD_S) for n in (1024, 4 * MiB)}


def test_bf16_across_nodes(cluster):
    pytest.importorskip("ml_dtypes")
    assert cluster.call(_drv_bf16) == {1024: True, 4 * MiB: True}


def _drv_strided() -> bool:
    p = _drv_pair()
    return ray.get(p["r"].strided_ok.remote(p["s"].strided.remote()), timeout=GUARD_S)


def test_non_contiguous_across_nodes(cluster):
    assert cluster.call(_drv_strided) is True


# Failures. The sender gets a fresh actor (it is frozen or killed).
_doomed: Dict[str, Any] = {}


def _drv_doomed_sender(n: int) -> int:
    s = Sender.options(resources=WORKER).remote()
    _doomed["s"] = s
    _doomed["ref"] = s.produce.remote(n, 1)
    ray.wait([_doomed["ref"]], timeout=GUARD_S)  # published: the sender returned
    return ray.get(s.pid.remote(), timeout=GUARD_S)


def _drv_read_doomed(n: int) -> List[str]:
    p = _drv_pair()
    try:
        ray.get(p["r"].check.remote(_doomed.pop("ref"), n, 1), timeout=GUARD_S)
    except Exception as e:
        # The chain of type names, then the message's last line (what the
        # test prints when the kind is wrong).
        return _error_chain(e) + [" ".join(str(e).split())[-600:]]
    finally:
        s = _doomed.pop("s", None)
        if s is not None:
            ray.kill(s)
    return []


@pytest.mark.parametrize("path", ["by-ref", "inline"])
def test_frozen_sender_is_owner_died(cluster, path):
    # Frozen (SIGSTOP) after its method returned, before the reader ever
    # reached it: by ref, the reader's runtime finds the sender's kernel
    # accepting connections that no process serves (rdt/probe.go) and says
    # OwnerDied once the heartbeats go unanswered; inline, the bytes ride
    # in Ray's metadata and need no sender.
    n = 16 * MiB // 4 if path == "by-ref" else 1024
    pid = cluster.call(_drv_doomed_sender, n)
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        chain = cluster.call(_drv_read_doomed, n)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"frozen sender, {path}: {chain or 'read'} after {time.monotonic() - start:.1f} s (driver round trip included)")
    if path == "inline":
        assert chain == [], chain
        return
    assert chain, "a read from a frozen sender must fail"
    assert any(k in chain for k in ("OwnerDied", "PeerClosed")), chain


def _drv_start_read(n: int) -> None:
    p = _drv_pair()
    _doomed["read"] = p["r"].check.remote(_doomed.pop("ref"), n, 1)


def _drv_finish_read() -> List[str]:
    try:
        ray.get(_doomed.pop("read"), timeout=GUARD_S)
    except Exception as e:
        return _error_chain(e)
    finally:
        _doomed.clear()
    return []


def test_node_killed_mid_transfer_is_typed(cluster):
    n = 256 * MiB // 4
    cluster.call(_drv_doomed_sender, n)
    cluster.shape("400mbit")  # about 5 s for the bytes: the kill lands mid-transfer
    try:
        cluster.call(_drv_start_read, n)
        time.sleep(1.0)
        cluster.kill_worker()
        chain = cluster.call(_drv_finish_read)
    finally:
        cluster.unshape()
        cluster.restart_worker()
        cluster.call(_drv_forget)  # the pair's sender died with the node
    assert chain, "a read from a lost node must fail"
    assert any(k in chain for k in ("OwnerDied", "PeerClosed")), chain


# _raynode on its own (no cluster): the configuration a Ray process gets.

from tensorlane import _raynode  # noqa: E402


def test_node_config_listens_on_the_node_address():
    c = _raynode.node_config({"discover": True}, "10.1.2.3", "ab" * 28)
    assert c["listen_addrs"] == ["/ip4/10.1.2.3/tcp/0"]
    assert c["data_addr"] == "10.1.2.3:0"
    assert c["host"] == "ray-" + "ab" * 8
    v6 = _raynode.node_config({}, "fd00::5", "cd" * 28)
    assert v6["listen_addrs"] == ["/ip6/fd00::5/tcp/0"] and v6["data_addr"] == "[fd00::5]:0"
    assert "host" not in v6, "a preset's host is the config's to name"


def test_node_config_two_nodes_one_host_name_are_two_hosts():
    # Same host name, same everything but Ray's node id: never one host.
    a = _raynode.node_config({"discover": True}, "10.0.0.1", "11" * 28)
    b = _raynode.node_config({"discover": True}, "10.0.0.1", "22" * 28)
    assert a["host"] != b["host"]


def test_node_config_keeps_what_the_config_names():
    cfg = {"discover": True, "host": "mine", "listen": ["/ip4/10.9.9.9/tcp/4001"], "data_addr": "0.0.0.0:5000"}
    assert _raynode.node_config(cfg, "10.1.2.3", "ab" * 28) == cfg
    # A wildcard data_addr alone still gets the control listener on the node.
    c = _raynode.node_config({"data_addr": "0.0.0.0:0"}, "10.1.2.3", "ab" * 28)
    assert c["data_addr"] == "0.0.0.0:0" and c["listen_addrs"] == ["/ip4/10.1.2.3/tcp/0"]


def test_node_config_interface():
    c = _raynode.node_config({}, "10.1.2.3", "ab" * 28, iface="lo")
    assert c["data_addr"] == "127.0.0.1:0"
    with pytest.raises(tensorlane.InvalidArgument, match="TENSORLANE_IFACE"):
        _raynode.node_config({}, "10.1.2.3", "ab" * 28, iface="nosuchif0")
    with pytest.raises(tensorlane.InvalidArgument):
        _raynode.node_config({}, "10.1.2.3", "ab" * 28, iface="../etc")


def test_apply_outside_ray_changes_nothing(monkeypatch):
    monkeypatch.delenv(_raynode.ENV_IFACE, raising=False)
    if ray.is_initialized():
        pytest.skip("a Ray session is open in this process")
    assert _raynode.apply({"discover": True}) == {"discover": True}
    monkeypatch.setenv(_raynode.ENV_IFACE, "lo")
    assert _raynode.apply({})["data_addr"] == "127.0.0.1:0"
