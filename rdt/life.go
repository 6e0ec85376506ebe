package rdt

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
)

// lifeProtocol carries heartbeats and leases (the codec: ctlwire.LifeMsg).
const lifeProtocol = protocol.ID("/tensorlane/life/2.0.0")

// handleLife answers heartbeats and lease requests.
func (r *Runtime) handleLife(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(controlTimeout))
	if r.faults.Hung.Load() {
		// Simulated hang (tests): read nothing, answer nothing, until the
		// caller gives up and resets the stream.
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
		r.log.Warn("malformed lifecycle message", "from", shortID(who), "err", err)
		s.Reset()
		return
	}
	reply := ctlwire.LifeMsg{Incarnation: r.incarnation}
	switch m.Kind {
	case ctlwire.LifePing:
		reply.Kind = ctlwire.LifePong
	case ctlwire.LifeLease, ctlwire.LifeRelease:
		reply.Kind = ctlwire.LifeLeased
		reply.Statuses = r.leaseClaims(who, m.Kind, m.Claims, m.Layouts)
		if m.Kind == ctlwire.LifeLease {
			reply.TTL = r.cfg.LeaseExpiry
		}
	default:
		s.Reset()
		return
	}
	ctlwire.WriteMsg(s, reply.Marshal())
}

// leaseClaims applies a lease or release request from who to this
// runtime's objects and returns a status per claim.
func (r *Runtime) leaseClaims(who peer.ID, kind byte, claims []fabric.Claim, layouts []objstore.LayoutSum) []byte {
	out := make([]byte, len(claims))
	expires := r.cfg.Clock.Now().Add(r.cfg.LeaseExpiry)
	if who == r.host.ID() {
		expires = objstore.NoExpiry
	}
	for i, c := range claims {
		var err error
		if kind == ctlwire.LifeLease {
			var l objstore.LayoutSum
			if i < len(layouts) {
				l = layouts[i]
			}
			err = r.objects.Lease(who, c, l, expires)
		} else {
			err = r.objects.Unlease(who, c)
		}
		if err != nil {
			out[i] = ctlwire.LeaseStatusOf(err)
			continue
		}
		out[i] = ctlwire.LeaseOK
	}
	r.lifeMetrics.leaseRequests.WithLabelValues(lifeKindName(kind)).Add(float64(len(claims)))
	r.lifeMetrics.leaseMessages.WithLabelValues(lifeKindName(kind)).Inc()
	return out
}

func lifeKindName(k byte) string {
	if k == ctlwire.LifeRelease {
		return "release"
	}
	return "lease"
}

// call sends one lifecycle request to id and returns its reply.
func (r *Runtime) call(ctx context.Context, id peer.ID, m ctlwire.LifeMsg) (ctlwire.LifeMsg, error) {
	m.Incarnation = r.incarnation
	s, err := r.host.NewStream(network.WithAllowLimitedConn(ctx, "lifecycle"), id, lifeProtocol)
	if err != nil {
		if ctx.Err() != nil {
			return ctlwire.LifeMsg{}, ctx.Err()
		}
		return ctlwire.LifeMsg{}, fmt.Errorf("%w: %s: %v", ErrPeerUnreachable, shortID(id), err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if err := ctlwire.WriteMsg(s, m.Marshal()); err != nil {
		return ctlwire.LifeMsg{}, r.callError(ctx, id, err)
	}
	s.CloseWrite()
	body, err := ctlwire.ReadMsg(s, ctlwire.MaxLifeMsg)
	if err != nil {
		return ctlwire.LifeMsg{}, r.callError(ctx, id, err)
	}
	reply, err := ctlwire.ParseLifeMsg(body)
	if err != nil {
		return ctlwire.LifeMsg{}, err
	}
	want := map[byte]byte{ctlwire.LifePing: ctlwire.LifePong, ctlwire.LifeLease: ctlwire.LifeLeased, ctlwire.LifeRelease: ctlwire.LifeLeased}[m.Kind]
	if reply.Kind != want || (want == ctlwire.LifeLeased && len(reply.Statuses) != len(m.Claims)) {
		return ctlwire.LifeMsg{}, fmt.Errorf("%w: reply kind %d to request kind %d", wire.ErrMalformed, reply.Kind, m.Kind)
	}
	return reply, nil
}

func (r *Runtime) callError(ctx context.Context, id peer.ID, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %v", ErrPeerUnreachable, shortID(id), err)
}

// leaseRemote sends a lease or release for claims to their owner and turns
// the statuses into errors (nil for granted).
func (r *Runtime) leaseRemote(ctx context.Context, owner peer.ID, kind byte, claims []fabric.Claim, layouts []objstore.LayoutSum) (uint64, []error, error) {
	if owner == r.host.ID() {
		st := r.leaseClaims(owner, kind, claims, layouts)
		return r.incarnation, statusErrors(st), nil
	}
	reply, err := r.call(ctx, owner, ctlwire.LifeMsg{Kind: kind, Claims: claims, Layouts: layouts})
	if err != nil {
		return 0, nil, err
	}
	r.peers.SawAlive(owner, reply.Incarnation)
	return reply.Incarnation, statusErrors(reply.Statuses), nil
}

func statusErrors(st []byte) []error {
	out := make([]error, len(st))
	for i, s := range st {
		if s != ctlwire.LeaseOK {
			out[i] = ctlwire.LeaseErrOf(s)
		}
	}
	return out
}
