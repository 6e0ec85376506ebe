"""Exceptions: one class per error kind of the C ABI (the kinds of Go's
rdt.ErrorKind, plus invalid_argument), all subclasses of :class:`Error`."""

from __future__ import annotations

from typing import Dict, List, Type

from . import _kinds


class Error(Exception):
    """Base class of every tensorlane error. ``kind`` names the condition."""

    kind: str = "other"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Other(Error):
    """An error with no more specific kind."""

    kind = "other"


class InvalidArgument(Error, ValueError):
    """The caller's mistake: an unsupported dtype, a non-contiguous array, a
    region too small for its shape, a closed runtime handle, bad config."""

    kind = "invalid_argument"


class OwnerDied(Error):
    """The object's owner stopped answering while it was needed."""

    kind = "owner_died"


class PeerUnreachable(Error, ConnectionError):
    """The owner could not be reached on the control channel."""

    kind = "peer_unreachable"


class ObjectNotFound(Error, LookupError):
    """The owner has no such object (or no such operation to cancel)."""

    kind = "object_not_found"


class ObjectFreed(Error):
    """The object was freed by its owner."""

    kind = "object_freed"


class StaleRef(Error):
    """The ref names an earlier life of a restarted owner."""

    kind = "stale_ref"


class Unauthorized(Error, PermissionError):
    """The peer is not admitted (cluster key or allow list)."""

    kind = "unauthorized"


class MalformedRef(Error, ValueError):
    """The bytes are not a tensorlane ref (corrupted or truncated)."""

    kind = "malformed_ref"


class OutOfMemory(Error, MemoryError):
    """The destination device cannot hold the tensor."""

    kind = "out_of_memory"


class TooSmall(Error, ValueError):
    """A destination buffer is smaller than the tensor."""

    kind = "too_small"


class NoPath(Error):
    """No allowed transport connects the owner and the reader."""

    kind = "no_path"


class UnknownDevice(Error):
    """The device is not one this runtime has."""

    kind = "unknown_device"


class Corrupt(Error):
    """The bytes arrived damaged (checksum mismatch)."""

    kind = "corrupt"


class Stalled(Error, TimeoutError):
    """A transfer made no progress for the stall timeout."""

    kind = "stalled"


class PeerClosed(Error, ConnectionError):
    """The owner closed the data connection part way."""

    kind = "peer_closed"


class BadRequest(Error):
    """The owner refused a request it could not parse."""

    kind = "bad_request"


class Closed(Error):
    """The runtime was shut down."""

    kind = "closed"


class Timeout(Error, TimeoutError):
    """The operation ran past its timeout."""

    kind = "timeout"


class Canceled(Error):
    """The operation was cancelled (:meth:`tensorlane.Runtime.cancel`, or Ray's abort)."""

    kind = "canceled"


class OwnerClosed(Error):
    """The owner is shutting down and refuses new reads."""

    kind = "owner_closed"


class LayoutMismatch(MalformedRef):
    """The ref's layout (dtype, shape, strides) is not the one its owner
    published: a forged or corrupted ref. A kind of MalformedRef."""

    kind = "layout_mismatch"


class NoZeroCopy(Error):
    """No path maps the object into this process (another host, or shm not
    allowed): read it with a copying get instead."""

    kind = "no_zero_copy"


class ReaderDied(Error):
    """A reader of a push or broadcast died (its runtime was declared dead)
    before it got, or said done with, its generation."""

    kind = "reader_died"


class SlotBusy(Error):
    """The slot's reader has not said done with its last generation, so it
    takes no new one yet (flow-controlled slots)."""

    kind = "slot_busy"


class BroadcastAborted(Error):
    """The broadcast filling a slot ended without completing it."""

    kind = "broadcast_aborted"


class NotOwner(Error, PermissionError):
    """Only the object's owner may do this (free, push into it)."""

    kind = "not_owner"


class UnknownActor(Error, LookupError):
    """No actor of that name."""

    kind = "unknown_actor"


class Mutated(Corrupt):
    """A tensor published without a copy (``tensorlane.ray.borrow``, arrays
    from :func:`tensorlane.empty`) changed between publish and read, which the
    borrow promised it would not: the verification mode's checksums
    (TENSORLANE_VERIFY=1) caught it. A kind of Corrupt; raised by Python
    only (the C ABI never moves borrowed bytes on its own)."""

    kind = "mutated"


#: The C ABI's kind codes, in order (tensorlane.h, TL_E_*); 0 is success.
#: Generated from Go's one table of error kinds (see _kinds.py).
KINDS = list(_kinds.KINDS)

#: The exception class of each C ABI kind. Python-only kinds (Mutated) have
#: no code and are not here.
def _classes(base: Type[Error]) -> List[Type[Error]]:
    """base's subclasses at every depth."""
    out: List[Type[Error]] = []
    for c in base.__subclasses__():
        out += [c, *_classes(c)]
    return out


BY_KIND: Dict[str, Type[Error]] = {c.kind: c for c in _classes(Error) if c.kind in KINDS}


def from_code(code: int, message: str) -> Error:
    """The exception for a C ABI return code and message."""
    kind = KINDS[code] if 0 < code < len(KINDS) else "other"
    return BY_KIND.get(kind, Other)(message or kind)
