package ctlmsg

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// Protocol is the actor-message protocol's libp2p ID.
const Protocol = protocol.ID("/tensorlane/ctl/1.0.0")

// Send delivers an encoded envelope to runtime to over h (at addrs, when
// given, as well as those h knows) and turns the answer into rdt's
// conditions; what names the receiver in errors. A lost answer after the
// whole message went out is errs.DeliveryUnknown: it may have been queued,
// and Send never retries.
func Send(ctx context.Context, h host.Host, to peer.ID, addrs []ma.Multiaddr, what any, body []byte) error {
	if len(addrs) > 0 {
		h.Peerstore().AddAddrs(to, addrs, peerstore.TempAddrTTL)
	}
	s, err := h.NewStream(ctx, to, Protocol)
	if err != nil {
		return fmt.Errorf("rdt: open control stream to %v: %w", what, err)
	}
	defer s.Close()
	status, reason, sent, err := Call(ctx, s, body)
	if err != nil {
		if sent { // the whole message went out: it may have been queued
			return fmt.Errorf("%w: %v: no reply: %w", errs.DeliveryUnknown, what, err)
		}
		return fmt.Errorf("rdt: send to %v: %w", what, err)
	}
	switch status {
	case ReplyOK:
		return nil
	case ReplyUnknownActor:
		return fmt.Errorf("%w: %v", errs.UnknownActor, what)
	default:
		return fmt.Errorf("rdt: %v refused the message: %s", what, reason)
	}
}
