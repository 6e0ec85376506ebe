"""What the Ray benchmarks of this folder share (bench.py, weightsync.py):
sizes as people write them, which optional packages this Python has (torch
for Ray's GLOO and NIXL rows, nixl), and the per-method transport decorator
that tolerates a missing transport. Importing it registers nothing."""

from __future__ import annotations

from typing import Any, Callable

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

try:
    import torch

    TORCH = True
except ImportError:
    torch = None
    TORCH = False
try:
    import nixl  # noqa: F401

    NIXL = True
except ImportError:
    NIXL = False


def parse_size(s: str) -> int:
    """"64M", "1GiB", "4096" -> bytes."""
    s = s.strip().upper().rstrip("IB")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def human(n: int) -> str:
    """Bytes in the largest binary unit that divides them whole-ish."""
    for u, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n // v} {u}"
    return f"{n} B"


def rdt_ready() -> bool:
    """Ray's own transports registered in this process (GLOO, NIXL)."""
    from ray.experimental.rdt.util import _ensure_default_transports_registered

    _ensure_default_transports_registered()
    return True


def nixl_agent() -> None:
    """NIXL's agent made now, outside the timed transfer."""
    from ray.experimental.rdt.util import get_tensor_transport_manager

    get_tensor_transport_manager("NIXL").get_nixl_agent()


def via(name: str) -> Callable[[Any], Any]:
    """@ray.method(tensor_transport=name), or a plain method where this
    Python lacks the transport (TENSORLANE_TORCH, GLOO and NIXL need torch):
    Ray refuses an unknown name at class definition, and the benchmarks skip
    those rows anyway."""
    import ray
    from ray.experimental.rdt import util

    util._ensure_default_transports_registered()
    if name.upper() in util.transport_manager_info:
        return ray.method(tensor_transport=name)
    return lambda f: f
