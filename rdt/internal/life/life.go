// Package life is the transport of rdt's lifecycle protocol
// (/tensorlane/life/2.0.0, codec ctlwire.LifeMsg): one libp2p stream per
// request, a heartbeat or a lease or release of many claims, answered by
// one reply. Call is the asking end; Serve the answering end, which hands
// each request to the runtime (rdt/life.go says what a ping and a lease
// are answered with). Metrics are the lifecycle's counters (heartbeats,
// peer deaths, leases, frees).
package life

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Protocol carries heartbeats and leases.
const Protocol = protocol.ID("/tensorlane/life/2.0.0")

// replyKind is the reply kind each request kind is answered with.
var replyKind = map[byte]byte{ctlwire.LifePing: ctlwire.LifePong, ctlwire.LifeLease: ctlwire.LifeLeased, ctlwire.LifeRelease: ctlwire.LifeLeased}

// Call sends m, stamped with incarnation, to id over h and returns the
// reply, checked to answer m. A peer that cannot be reached or drops the
// stream is errs.PeerUnreachable; a ctx done first, ctx's error.
func Call(ctx context.Context, h host.Host, incarnation uint64, id peer.ID, m ctlwire.LifeMsg) (ctlwire.LifeMsg, error) {
	m.Incarnation = incarnation
	s, err := h.NewStream(network.WithAllowLimitedConn(ctx, "lifecycle"), id, Protocol)
	if err != nil {
		return ctlwire.LifeMsg{}, unreachable(ctx, id, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if err := ctlwire.WriteMsg(s, m.Marshal()); err != nil {
		return ctlwire.LifeMsg{}, unreachable(ctx, id, err)
	}
	s.CloseWrite()
	body, err := ctlwire.ReadMsg(s, ctlwire.MaxLifeMsg)
	if err != nil {
		return ctlwire.LifeMsg{}, unreachable(ctx, id, err)
	}
	reply, err := ctlwire.ParseLifeMsg(body)
	if err != nil {
		return ctlwire.LifeMsg{}, err
	}
	want := replyKind[m.Kind]
	if reply.Kind != want || (want == ctlwire.LifeLeased && len(reply.Statuses) != len(m.Claims)) {
		return ctlwire.LifeMsg{}, fmt.Errorf("%w: reply kind %d to request kind %d", wire.ErrMalformed, reply.Kind, m.Kind)
	}
	return reply, nil
}

func unreachable(ctx context.Context, id peer.ID, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %v", errs.PeerUnreachable, refwire.ShortID(id), err)
}

// Serve answers the one request on s within timeout: answer returns the
// reply to a request from who, or false to refuse it (the stream is
// reset). hung simulates a hung runtime (faults.Sim.Hung): nothing is read
// or answered until the caller gives up.
func Serve(s network.Stream, timeout time.Duration, hung bool, log *slog.Logger, answer func(who peer.ID, m ctlwire.LifeMsg) (ctlwire.LifeMsg, bool)) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(timeout))
	if hung {
		io.Copy(io.Discard, s)
		return
	}
	body, err := ctlwire.ReadMsg(s, ctlwire.MaxLifeMsg)
	if err != nil {
		s.Reset()
		return
	}
	who := s.Conn().RemotePeer()
	m, err := ctlwire.ParseLifeMsg(body)
	if err != nil {
		log.Warn("malformed lifecycle message", "from", refwire.ShortID(who), "err", err)
		s.Reset()
		return
	}
	reply, ok := answer(who, m)
	if !ok {
		s.Reset()
		return
	}
	ctlwire.WriteMsg(s, reply.Marshal())
}
