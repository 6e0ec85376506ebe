package notices

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// Tell sends note (a push or broadcast notice) and returns the condition
// its status byte carries (ctlwire's table): nil when the slot's runtime
// took it, errs.PeerUnreachable when it could not be told.
func (p *Pool) Tell(ctx context.Context, to peer.ID, note []byte) error {
	status, err := p.Send(ctx, to, note)
	if err != nil {
		return fmt.Errorf("%w: %w", errs.PeerUnreachable, err)
	}
	return ctlwire.ErrOf(status)
}

// TellBatch sends a push batch notice and returns each item's condition.
func (p *Pool) TellBatch(ctx context.Context, to peer.ID, n ctlwire.PushBatchNotice) []error {
	out := make([]error, len(n.Items))
	fail := func(err error) []error {
		for i := range out {
			out[i] = err
		}
		return out
	}
	status, items, err := p.SendItems(ctx, to, n.Marshal(), len(n.Items))
	switch {
	case err != nil:
		return fail(fmt.Errorf("%w: %w", errs.PeerUnreachable, err))
	case status == 0:
		return out
	case status != ctlwire.StatusItems:
		return fail(ctlwire.ErrOf(status))
	}
	for i, s := range items {
		if s == ctlwire.StatusItems { // not an item's status: the answer is garbled
			out[i] = fmt.Errorf("%w: push batch answer with status %d for an item", errs.MalformedRef, s)
			continue
		}
		out[i] = ctlwire.ErrOf(s)
	}
	return out
}
