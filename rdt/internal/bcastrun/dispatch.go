package bcastrun

import (
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// ParseMsg decodes a broadcast notice; a malformed one is
// errs.MalformedRef.
func ParseMsg(p []byte) (Msg, error) {
	m, err := bcast.ParseMsg(p, refwire.Unmarshal)
	if errors.Is(err, bcast.ErrMalformed) {
		err = fmt.Errorf("%w: %w", errs.MalformedRef, err)
	}
	return m, err
}

// Handle takes a broadcast notice from peer from: the readers' kinds go to
// the runtime's relays, a reader's report and its Consumed to the owner's
// side. Its error is the notice's answer.
func Handle(o *Owner, rs *Relays, from peer.ID, m Msg) error {
	switch m.Kind {
	case ctlwire.Prepare:
		return rs.Prepare(from, m)
	case ctlwire.Children:
		return rs.Children(from, m)
	case ctlwire.Chunk:
		return rs.Chunk(m)
	case ctlwire.Probe:
		return rs.Probe(m)
	case ctlwire.Abort:
		return rs.Abort(from, m)
	case ctlwire.Report:
		return o.Report(from, m)
	case ctlwire.Consumed:
		o.Gens.Consumed(from, m.Slot, m.Gen)
		return nil
	}
	return fmt.Errorf("%w: broadcast notice kind %d", errs.MalformedRef, m.Kind)
}
