package objstore

import (
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// Pushed takes a push notice from writer from: the bytes it names landed
// in the slot, whose generation advances. The notice must name the slot's
// whole buffer.
func (t *Sinks) Pushed(from peer.ID, n ctlwire.PushNotice) error {
	s, err := t.Lookup(n.Slot, n.Incarnation, n.Token)
	if err != nil {
		return err
	}
	if n.Bytes != s.Buf.Len() {
		return fmt.Errorf("%w: push of %d bytes into a slot of %d", errs.MalformedRef, n.Bytes, s.Buf.Len())
	}
	s.CompletedBy(from)
	return nil
}

// PushedBatch takes the pushes a batch notice reports, each slot on its
// own, and returns each item's error. A slot named twice in one notice is
// taken once: its generation advances once per push.
func (t *Sinks) PushedBatch(from peer.ID, n ctlwire.PushBatchNotice) []error {
	out := make([]error, len(n.Items))
	seen := make(map[fabric.ObjectID]struct{}, len(n.Items))
	for i, it := range n.Items {
		if _, dup := seen[it.Slot]; dup {
			out[i] = fmt.Errorf("%w: slot %v named twice in one push batch", errs.MalformedRef, it.Slot)
			continue
		}
		seen[it.Slot] = struct{}{}
		out[i] = t.Pushed(from, ctlwire.PushNotice{Slot: it.Slot, Incarnation: n.Incarnation, Token: it.Token, Bytes: it.Bytes})
	}
	return out
}
