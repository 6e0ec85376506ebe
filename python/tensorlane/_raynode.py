"""Where a runtime in a Ray process listens, and which host it claims.

A runtime's default listeners (control, tcp data, every rdma rail) are on
loopback, which a reader on another Ray node cannot reach. In a Ray process
(worker or connected driver), :func:`apply` fills in what the configuration
left open:

- ``listen_addrs`` and ``data_addr`` on the node's own address as Ray knows it
  (the node IP Ray registered, ``ray.util.get_node_ip_address()``), so
  everything that reaches the node over Ray's network reaches the runtime;
  or, with ``TENSORLANE_IFACE=eth1`` set, on that interface's IPv4 address
  (a dedicated NIC for bulk data). Addresses the configuration names are
  kept. The rdma rails of simulated NICs listen where ``data_addr`` does.
- ``data_addr`` on a wildcard (``0.0.0.0:0``, ``[::]:0``) is kept as a
  listener but never advertised as such: the Go side puts the host's
  outbound address into refs (fabric/stack advertise), and the control
  listener gets the node address, since a wildcard there would advertise
  every interface.
- ``host`` (with ``discover``): ``ray-`` and the first 16 hex digits of
  Ray's node id, so the runtimes of one Ray node share a topology host
  (and take shm between them) and runtimes of different nodes never do,
  also when the nodes share a host name (containers, network namespaces).
- ``cluster_key``, when neither the configuration nor
  TENSORLANE_CLUSTER_KEY gives one: the cluster's secret key
  (tensorlane.ray.slab_key), the one workers in slab mode use, so the
  driver's runtime and the workers' agree.

Nothing here runs at import; every function is pure given its inputs
except the lookups of Ray's node and of an interface's address.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
from typing import Any, Dict, Optional

from . import errors

#: An interface to listen on instead of Ray's node address (e.g. ``eth1``).
ENV_IFACE = "TENSORLANE_IFACE"

_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


def iface_addr(name: str) -> str:
    """The IPv4 address of interface ``name``; InvalidArgument when it has
    none or does not exist (a misspelt TENSORLANE_IFACE must not fall back
    silently to another network)."""
    if not name or len(name) > 15 or "/" in name or "\0" in name:
        raise errors.InvalidArgument(f"{ENV_IFACE}={name!r}: not an interface name")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux
        raise errors.InvalidArgument(f"{ENV_IFACE}: interface lookup needs Linux") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError as e:
            raise errors.InvalidArgument(f"{ENV_IFACE}={name!r}: no IPv4 address on that interface ({e.strerror})") from None
    return socket.inet_ntoa(res[20:24])


def _ray_node() -> Optional[tuple]:
    """(node IP, node id hex) of the Ray node this process belongs to, or
    None outside a connected Ray process."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():
            return None
        from ray._private import worker

        node = worker._global_node
        ip = node.node_ip_address if node is not None else worker.global_worker.node_ip_address
        node_id = ray.get_runtime_context().get_node_id()
        return (str(ip), str(node_id))
    except Exception:
        return None


def _multiaddr(ip: str) -> str:
    v = ipaddress.ip_address(ip)
    return f"/ip{v.version}/{ip}/tcp/0"


def _hostport(ip: str) -> str:
    return f"[{ip}]:0" if ipaddress.ip_address(ip).version == 6 else f"{ip}:0"


def host_id(node_id: str) -> str:
    """The topology host a runtime on Ray node ``node_id`` claims."""
    return "ray-" + node_id[:16]


def node_config(config: Dict[str, Any], node_ip: str, node_id: str, iface: Optional[str] = None) -> Dict[str, Any]:
    """config with the listeners and host filled for a Ray node (see the
    module doc); a new dict, config is not changed."""
    out = dict(config)
    ip = iface_addr(iface) if iface else node_ip
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise errors.InvalidArgument(f"Ray node address {ip!r} is not an IP address") from None
    if not out.get("listen_addrs") and not out.get("listen"):  # listen: the old name
        out["listen_addrs"] = [_multiaddr(ip)]
    if not out.get("data_addr"):
        out["data_addr"] = _hostport(ip)
    if out.get("discover") and not out.get("host") and node_id:
        out["host"] = host_id(node_id)
    return out


def _scope_key(config: Dict[str, Any]) -> Dict[str, Any]:
    """config with the Ray cluster's secret key when it names none (and
    TENSORLANE_CLUSTER_KEY is unset): every runtime of one Ray cluster, the
    driver's too, must agree on the key, or their control channels cannot
    even negotiate (a driver without the key could not read an actor's
    tensors). Slab mode in workers sets the same key already."""
    if config.get("cluster_key") or config.get("cluster_key_file") or os.environ.get("TENSORLANE_CLUSTER_KEY"):
        return config
    from . import _runtime

    try:
        return {**config, "cluster_key": _runtime._ray_scope_key()}
    except Exception:
        return config  # no Ray session to scope by


def apply(config: Dict[str, Any]) -> Dict[str, Any]:
    """config for this process's runtime: :func:`node_config` with Ray's
    node and TENSORLANE_IFACE when this process is part of a Ray cluster,
    config as it is otherwise."""
    node = _ray_node()
    iface = (os.environ.get(ENV_IFACE) or "").strip() or None
    if node is None:
        if iface:  # an interface alone is enough to listen on
            return node_config(config, "", "", iface)
        return config
    return _scope_key(node_config(config, node[0], node[1], iface))


__all__ = ["ENV_IFACE", "apply", "node_config", "host_id", "iface_addr"]
