package capi

import (
	"context"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
)

// Connect opens the control channel to the runtime at address (another
// runtime's Stats().Address) ahead of a transfer, so that the first read
// from it skips the dial and the handshake: for a reader that learns its
// sender's address before the ref (a weight-sync fleet at start-up, say).
// The Ray plug-in does not call it: Ray hands a receiver the sender's
// metadata only once the sender's copy is done. A timeout of 0 means the
// runtime's transfer timeout. A malformed address is InvalidArgument, an
// unreachable runtime PeerUnreachable.
func (r *Runtime) Connect(ctx context.Context, address string, timeout time.Duration) error {
	info, err := rdt.ParseAddrInfo(address)
	if err != nil {
		return invalid("%v", err)
	}
	if info.ID == r.rt.ID() {
		return nil // itself: nothing to open
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return r.rt.Connect(ctx, info)
}
