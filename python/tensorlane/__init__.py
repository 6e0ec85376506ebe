"""tensorlane: direct tensor transport between actors, from Python.

Arrays stay where they are; a small :class:`Ref` travels instead, and a
reader's :meth:`Runtime.get` moves the bytes straight from the owner's
memory over the best path the topology allows (shared memory on one host,
rdma or tcp between hosts). ``tensorlane.ray.register()`` makes it a Ray
Direct Transport (``tensor_transport="TENSORLANE"``). :func:`put_batch`,
:func:`get_batch` and :func:`view_batch` move a state dict in one call.

Importing the package does no work: the Go library (libtensorlane.so) loads
on first use.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._batch import get_batch, put_batch, view_batch
from ._config import Config
from ._runtime import Ref, Runtime, as_array, ref_info, runtime
from .errors import (
    BadRequest, Canceled, Closed, Corrupt, Error, InvalidArgument, MalformedRef, NoPath,
    ObjectFreed, ObjectNotFound, Other, OutOfMemory, OwnerDied, PeerClosed, PeerUnreachable,
    Stalled, StaleRef, Timeout, TooSmall, Unauthorized, UnknownDevice, OwnerClosed, LayoutMismatch,
    NoZeroCopy, Mutated,
)

__version__ = "0.1.0"


def empty(shape: Sequence[int] | int, dtype: Any = np.float32, device: Any = None) -> Any:
    """A numpy array over the default runtime's shareable memory: publishing
    it costs no copy, also to readers in other processes on this host. With
    ``device="cuda:0"`` (or ``"rocm:0"``) a :class:`tensorlane.device.DeviceArray`
    of shareable device memory that speaks DLPack on its device."""
    if device is not None and str(device) != "cpu":
        from . import device as _device

        return _device.empty(shape, dtype, device)
    return runtime().empty(shape, dtype)


def copy(src: Any, dst: Any) -> Any:
    """Copies src into dst between host and device arrays (numpy arrays,
    device arrays, torch CUDA tensors: see :func:`tensorlane.device.copy`)."""
    from . import device as _device

    return _device.copy(src, dst)


def from_dlpack(x: Any) -> np.ndarray:
    """A numpy view of any DLPack producer (torch, jax, cupy on CPU...)."""
    return np.from_dlpack(x)


__all__ = [
    "Config", "Ref", "Runtime", "runtime", "empty", "copy", "ref_info", "as_array", "from_dlpack",
    "put_batch", "get_batch", "view_batch", "Mutated",
    "Error", "Other", "InvalidArgument", "OwnerDied", "PeerUnreachable", "ObjectNotFound",
    "ObjectFreed", "StaleRef", "Unauthorized", "MalformedRef", "OutOfMemory", "TooSmall", "NoPath",
    "UnknownDevice", "Corrupt", "Stalled", "PeerClosed", "BadRequest", "Closed", "Timeout", "Canceled",
    "OwnerClosed", "LayoutMismatch", "NoZeroCopy",
]
