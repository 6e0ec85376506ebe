"""Bench-only Ray tensor transports that measure the floor of Ray's plug-in
machinery, so bench.py can say how much of a small transfer is Ray's and how
much is the transport's.

NULL: a trivial one-sided transport. Its metadata carries the array's bytes
(so it moves real data) and the receiver rebuilds the array from them; it
publishes nothing, frees nothing, and says yes to Ray's "does the actor have
the transport" without asking the actor. What a NULL transfer costs is what
any plug-in transport pays Ray: the sender's metadata hook, the metadata's
trip to the owner, the owner's extra ``__ray_recv__`` task on the receiver,
and the receiver's RDT store hand-off.

TENSORLANE_ASK: tensorlane exactly as registered, except that Ray's
per-call "does the actor have the transport" check asks the actor every
time (a synchronous round trip from the caller), as the plug-in did before
it kept the answer per actor and as Ray's own NIXL transport still does
(ray/experimental/rdt/nixl_tensor_transport.py, actor_has_tensor_transport).

Not for production use: NULL pushes the bytes through Ray's control plane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    TensorTransportManager,
    TensorTransportMetadata,
)

import tensorlane.ray as tlr

NULL = "NULL"
ASK = "TENSORLANE_ASK"


@dataclass
class NullMetadata(TensorTransportMetadata):
    payload: Optional[List[bytes]] = None


class NullTransport(TensorTransportManager):
    def tensor_transport_backend(self) -> str:
        return NULL

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor) -> bool:
        return True

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> NullMetadata:
        arrays = [np.ascontiguousarray(a) for a in rdt_object]
        return NullMetadata(tensor_meta=[(a.shape, a.dtype) for a in arrays], tensor_device="cpu",
                            payload=[a.tobytes() for a in arrays])

    def get_communicator_metadata(self, src_actor=None, dst_actor=None, backend=None) -> CommunicatorMetadata:
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata, target_buffers=None):
        m = tensor_transport_metadata
        return [np.frombuffer(raw, dtype=dt).reshape(shape) for raw, (shape, dt) in zip(m.payload, m.tensor_meta)]

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("one-sided")

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors) -> None:
        pass

    def abort_transport(self, obj_id, communicator_metadata) -> None:
        pass


class AskEveryTime(tlr.TensorlaneTransport):
    def tensor_transport_backend(self) -> str:
        return ASK

    def actor_has_tensor_transport(self, actor) -> bool:
        import ray

        return ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(tlr._available))


def register() -> None:
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt import util

    if NULL not in util.transport_manager_info:
        register_tensor_transport(NULL, ["cpu"], NullTransport, np.ndarray)
    if ASK not in util.transport_manager_info:
        register_tensor_transport(ASK, ["cpu"], AskEveryTime, np.ndarray)
