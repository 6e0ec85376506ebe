"""GPU tensors for the Ray transport (``TENSORLANE_TORCH``), without Ray:
what tensorlane.ray calls for a torch tensor on a CUDA (or ROCm) device,
kept apart so it can be tested and run where Ray is not installed (the GPU
check calls these functions directly).

- :func:`devices` is the device list the transport registers: ``["cpu",
  "cuda"]`` when torch sees a GPU, ``["cpu"]`` otherwise.
- :func:`put` publishes a CUDA tensor: one device copy into shareable
  device memory the object owns (on one node a reader imports that
  allocation's handle read-only: no host copy; across nodes the bytes go
  through pinned host memory on each side).
- :func:`recv` reads an entry into a new tensor on the device asked for
  (``set_target_device_for_ref``), whatever device the sender used.

Nothing here imports torch or Ray at import time.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import device as _device
from . import errors
from ._runtime import Ref, Runtime


def devices() -> List[str]:
    """The devices the TENSORLANE_TORCH transport registers with Ray:
    ``cpu``, and ``cuda`` when torch is importable and sees a GPU (ROCm
    builds of torch also call theirs ``cuda``)."""
    try:
        import torch
    except ImportError:
        return ["cpu"]
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def is_device_tensor(t: Any) -> bool:
    """Whether t is a torch tensor on a GPU."""
    return type(t).__module__.startswith("torch") and bool(getattr(t, "is_cuda", False))


def put(rt: Runtime, t: Any) -> Tuple[bytes, Dict[str, Any]]:
    """Publishes a torch GPU tensor; returns its Ref and the entry's
    metadata (shape, dtype, sender's device) for the receiver."""
    if not is_device_tensor(t):
        raise errors.InvalidArgument(f"not a torch GPU tensor: {type(t).__name__} on {getattr(t, 'device', '?')}")
    x = t if t.is_contiguous() else t.contiguous()
    ref = _device.put(x, runtime=rt)
    return bytes(ref), {"shape": tuple(x.shape), "dtype": str(x.dtype).removeprefix("torch."), "device": str(x.device)}


def recv(rt: Runtime, ref: bytes, meta: Dict[str, Any], target: Optional[str] = None, *,
         timeout: Optional[float] = None, op: Optional[int] = None) -> Any:
    """Reads an entry from :func:`put` into a new torch tensor on target
    (default: the sender's device name, e.g. ``cuda:0`` of this process;
    ``cpu`` reads into host memory)."""
    import torch

    dev = torch.device(target or meta.get("device", "cuda:0"))
    dtype = getattr(torch, meta["dtype"])
    out = torch.empty(tuple(meta["shape"]), dtype=dtype, device=dev)
    if dev.type == "cpu":
        view = out.view(torch.uint8).numpy() if out.numel() else None
        if view is not None:
            rt.get(Ref(ref), out=view.reshape(-1), timeout=timeout, op=op)
        return out
    if out.numel():
        # The tensor was just allocated on torch's current stream: make sure
        # the allocation is usable before tensorlane's streams write it.
        torch.cuda.current_stream(dev).synchronize()
        _device.get_into(Ref(ref), out, runtime=rt, timeout=timeout, op=op)
    return out


__all__ = ["devices", "is_device_tensor", "put", "recv"]
