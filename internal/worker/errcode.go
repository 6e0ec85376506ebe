package worker

import (
	"context"
	"errors"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
)

// ErrorCode names the typed condition behind err, for drivers in other
// processes and for the soak's tallies. "other" means the error matched no
// sentinel: a bug in itself, since every failure should be typed.
func ErrorCode(err error) string {
	codes := []struct {
		err  error
		code string
	}{
		{errVerify, "corrupt"},
		{errBadWorkerRequest, "bad_request"},
		{rdt.ErrOwnerDied, "owner_died"},
		{rdt.ErrPeerUnreachable, "peer_unreachable"},
		{rdt.ErrStaleRef, "stale_ref"},
		{rdt.ErrUnauthorized, "unauthorized"},
		{rdt.ErrObjectFreed, "object_freed"},
		{rdt.ErrObjectNotFound, "not_found"},
		{rdt.ErrLayoutMismatch, "layout_mismatch"},
		{rdt.ErrMalformedRef, "malformed_ref"},
		{rdt.ErrOutOfMemory, "out_of_memory"},
		{rdt.ErrNotOwner, "not_owner"},
		{rdt.ErrUnknownDevice, "unknown_device"},
		{rdt.ErrOwnerClosed, "owner_closed"},
		{rdt.ErrClosed, "closed"},
		{rdt.ErrReaderDied, "reader_died"},
		{rdt.ErrSlotBusy, "slot_busy"},
		{rdt.ErrBroadcastAborted, "broadcast_aborted"},
		{rdt.ErrNoZeroCopy, "no_zero_copy"},
		{fabric.ErrCorrupt, "corrupt"},
		{fabric.ErrStalled, "stalled"},
		{fabric.ErrPeerClosed, "peer_closed"},
		{fabric.ErrNoPath, "no_path"},
		{fabric.ErrBadRequest, "bad_request"},
		{fabric.ErrClosed, "closed"},
		{context.DeadlineExceeded, "timeout"},
		{context.Canceled, "canceled"},
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "other"
}
