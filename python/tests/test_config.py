"""The typed config (tensorlane.Config, generated from rdt/schema): every
field reaches the library by its name, old names still work with a warning
once, and a bad key is an InvalidArgument naming it."""

import typing
import warnings

import pytest

import tensorlane as tl
from tensorlane import _config, _runtime


def test_config_keys_are_the_schema_fields():
    assert set(typing.get_type_hints(tl.Config)) == set(_config.FIELDS)
    for old, (new, _) in _config.ALIASES.items():
        assert new in _config.FIELDS and old not in _config.FIELDS


def test_new_names_round_trip():
    cfg: tl.Config = {
        "allow_transports": ["tcp"], "deny_transports": ["rdma"], "listen_addrs": ["/ip4/127.0.0.1/tcp/0"],
        "data_addr": "127.0.0.1:0", "encrypt_data": True, "stall_timeout": "5s", "transfer_timeout": 30,
        "heartbeat_interval": 0.5, "heartbeat_misses": 4, "lease_renew": 2, "lease_expiry": "10s",
        "host_memory": "256MiB", "inbox_size": 64, "device_backend": "sim", "visible_devices": [0],
        "device_memory": "8MiB",
    }
    a, b = tl.Runtime(cfg), tl.Runtime(cfg)
    try:
        import numpy as np

        x = np.arange(1 << 16, dtype=np.float32)
        ref = a.put(x)
        np.testing.assert_array_equal(b.get(ref), x)
        plan = b.explain(ref)["plan"]
        assert plan["chosen"] == "tcp"
        # The fallback said aloud: the best path the topology allows on one
        # host is not tcp, and the plan says why it is not taken.
        best = [c for c in plan["candidates"] if c["transport"] == plan["best"]]
        assert plan["degraded"] and best and plan["fallback"] == best[0]["reason"], plan
        assert isinstance(plan["path"], str) and plan["src"] and plan["dst"], plan
    finally:
        a.close()
        b.close()


def test_old_names_warn_once_and_work():
    _runtime._warned_aliases.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rts = [tl.Runtime({"allow": ["tcp"], "transfer_timeout_ms": 1500}) for _ in range(2)]
    for rt in rts:
        rt.close()
    msgs = [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]
    assert sum("'allow'" in m for m in msgs) == 1, msgs
    assert sum("'transfer_timeout_ms'" in m for m in msgs) == 1, msgs
    assert _runtime.normalize_config({"transfer_timeout_ms": 1500, "listen": []}) == {"transfer_timeout": 1.5, "listen_addrs": []}


@pytest.mark.parametrize("cfg,field,hint", [
    ({"encrypt": True}, "encrypt", "encrypt_data"),
    ({"stall_timout": 1}, "stall_timout", "stall_timeout"),
    ({"ClusterKey": "00"}, "ClusterKey", "cluster_key"),
    ({"stall_timeout": "soon"}, "stall_timeout", "duration"),
    ({"heartbeat_misses": "3"}, "heartbeat_misses", "integer"),
    ({"cluster_key": "abc"}, "cluster_key", "64 hex digits"),
    ({"allow_transports": ["pigeon"]}, "allow_transports", "unknown transport"),
    ({"allow": ["tcp"], "allow_transports": ["tcp"]}, "allow", "given twice"),
])
def test_bad_fields_name_the_field(cfg, field, hint):
    with pytest.raises(tl.InvalidArgument) as e:
        tl.Runtime(cfg)
    assert repr(field) in str(e.value).replace('"', "'") and hint in str(e.value)
