package rdt

import (
	"context"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// The broadcast's control messages ride the push-notice streams
// (notices.go); their kinds and status bytes are in ctlwire's table, their
// codec is bcast.Msg. They are small (a few refs at most) and answered
// with one status byte like push notices.

// bcastMsg is every broadcast notice, its children named by their Refs.
type bcastMsg = bcast.Msg[Ref]

// parseBcastMsg decodes a broadcast notice; a malformed one is
// ErrMalformedRef.
func parseBcastMsg(p []byte) (bcastMsg, error) {
	m, err := bcast.ParseMsg(p, ParseRef)
	if errors.Is(err, bcast.ErrMalformed) {
		err = fmt.Errorf("%w: %w", ErrMalformedRef, err)
	}
	return m, err
}

// sendBcast delivers a broadcast notice to runtime to (this one included)
// and returns the condition it was answered with.
func (r *Runtime) sendBcast(ctx context.Context, to peer.ID, m bcastMsg) error {
	if to == r.host.ID() {
		return r.onBcast(to, m)
	}
	p, err := m.Marshal()
	if err != nil {
		return err
	}
	status, err := r.sendNotice(ctx, to, p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPeerUnreachable, err)
	}
	return ctlwire.ErrOf(status)
}

// onBcast handles a broadcast notice from peer from.
func (r *Runtime) onBcast(from peer.ID, m bcastMsg) error {
	switch m.Kind {
	case ctlwire.Prepare:
		return r.relayPrepare(from, m)
	case ctlwire.Children:
		return r.relayChildren(from, m)
	case ctlwire.Chunk:
		return r.relayChunk(m)
	case ctlwire.Probe:
		return r.relayProbe(m)
	case ctlwire.Abort:
		return r.relayAbort(from, m)
	case ctlwire.Report:
		return r.bcastReport(from, m)
	case ctlwire.Consumed:
		r.gens.consumed(from, m.Slot, m.Gen)
		return nil
	}
	return fmt.Errorf("%w: broadcast notice kind %d", ErrMalformedRef, m.Kind)
}
