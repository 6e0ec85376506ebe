package rdt

import (
	"context"
	"encoding/binary"
	"errors"
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

// The lifecycle protocol: heartbeats and leases, one request and one reply
// per libp2p stream, each a 4-byte length and a message:
//
//	version (1) | kind (1) | sender incarnation (8) | body
//
//	ping:    (empty)                     -> pong: (empty)
//	lease:   count | claims              -> leased: ttl ms | count | status per claim
//	release: count | claims              -> leased: 0 | count | status per claim
//	claim:   object (16) | incarnation (8) | token (len-prefixed, <= 64) | layout (16)
//
// Every reply carries the responder's incarnation, so a restarted peer is
// recognised on its first answer. A claim's layout is a digest of the desc
// the reader's ref carries (layoutOf): the owner grants the lease only if it
// is the desc it published, so a reader learns of a forged shape before it
// allocates for it.
const (
	lifeProtocol = protocol.ID("/tensorlane/life/2.0.0")
	lifeVersion  = 2
	maxClaims    = 4096
	minClaimLen  = 16 + 8 + 1 + len(objstore.LayoutSum{})
	maxLifeMsg   = 16 + maxClaims*(minClaimLen+ctlwire.MaxToken+2)
)

const (
	kindPing byte = iota + 1
	kindPong
	kindLease
	kindRelease
	kindLeased
)

type lifeMsg struct {
	kind        byte
	incarnation uint64
	claims      []fabric.Claim
	layouts     []objstore.LayoutSum // one per claim (lease, release)
	statuses    []byte
	ttl         time.Duration
}

func (m lifeMsg) marshal() []byte {
	e := wire.Encoder{Buf: make([]byte, 0, 16+len(m.claims)*48+len(m.statuses))}
	e.Byte(lifeVersion)
	e.Byte(m.kind)
	e.Uint64(m.incarnation)
	switch m.kind {
	case kindLease, kindRelease:
		e.Uvarint(uint64(len(m.claims)))
		for i, c := range m.claims {
			e.Fixed(c.Object[:])
			e.Uint64(c.Incarnation)
			e.Bytes(c.Token)
			var l objstore.LayoutSum
			if i < len(m.layouts) {
				l = m.layouts[i]
			}
			e.Fixed(l[:])
		}
	case kindLeased:
		e.Uvarint(uint64(m.ttl / time.Millisecond))
		e.Bytes(m.statuses)
	}
	return e.Buf
}

// parseLifeMsg decodes a lifecycle message; malformed input is an error
// matching wire.ErrMalformed, never a panic.
func parseLifeMsg(p []byte) (lifeMsg, error) {
	d := wire.NewDecoder(p)
	if v := d.Byte(); v != lifeVersion && d.Err() == nil {
		return lifeMsg{}, fmt.Errorf("%w: lifecycle message version %d", wire.ErrMalformed, v)
	}
	m := lifeMsg{kind: d.Byte(), incarnation: d.Uint64()}
	switch m.kind {
	case kindPing, kindPong:
	case kindLease, kindRelease:
		n := d.Count(maxClaims)
		// A claim takes at least minClaimLen bytes: never allocate for
		// more claims than the message can hold.
		m.claims = make([]fabric.Claim, 0, min(n, d.Remaining()/minClaimLen))
		m.layouts = make([]objstore.LayoutSum, 0, cap(m.claims))
		for ; n > 0 && d.Err() == nil; n-- {
			var c fabric.Claim
			var l objstore.LayoutSum
			d.Fixed(c.Object[:])
			c.Incarnation = d.Uint64()
			c.Token = d.Bytes(ctlwire.MaxToken)
			d.Fixed(l[:])
			m.claims = append(m.claims, c)
			m.layouts = append(m.layouts, l)
		}
	case kindLeased:
		m.ttl = time.Duration(min(d.Uvarint(), uint64(24*time.Hour/time.Millisecond))) * time.Millisecond
		m.statuses = d.Bytes(maxClaims)
	default:
		if d.Err() == nil {
			return lifeMsg{}, fmt.Errorf("%w: lifecycle message kind %d", wire.ErrMalformed, m.kind)
		}
	}
	if err := d.Finish(); err != nil {
		return lifeMsg{}, err
	}
	return m, nil
}

func writeMsg(w io.Writer, p []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(p)))
	_, err := w.Write(append(n[:], p...))
	return err
}

func readMsg(r io.Reader, limit int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if int64(size) > int64(limit) {
		return nil, fmt.Errorf("%w: message of %d bytes (limit %d)", wire.ErrMalformed, size, limit)
	}
	p := make([]byte, size)
	_, err := io.ReadFull(r, p)
	return p, err
}

// handleLife answers heartbeats and lease requests.
func (r *Runtime) handleLife(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(controlTimeout))
	if r.blackholed.Load() {
		// Simulated hang (tests): read nothing, answer nothing, until the
		// caller gives up and resets the stream.
		io.Copy(io.Discard, s)
		return
	}
	body, err := readMsg(s, maxLifeMsg)
	if err != nil {
		s.Reset()
		return
	}
	who := s.Conn().RemotePeer()
	m, err := parseLifeMsg(body)
	if err != nil {
		r.log.Warn("malformed lifecycle message", "from", shortID(who), "err", err)
		s.Reset()
		return
	}
	reply := lifeMsg{incarnation: r.incarnation}
	switch m.kind {
	case kindPing:
		reply.kind = kindPong
	case kindLease, kindRelease:
		reply.kind = kindLeased
		reply.statuses = r.leaseClaims(who, m.kind, m.claims, m.layouts)
		if m.kind == kindLease {
			reply.ttl = r.cfg.LeaseExpiry
		}
	default:
		s.Reset()
		return
	}
	writeMsg(s, reply.marshal())
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
		if kind == kindLease {
			var l objstore.LayoutSum
			if i < len(layouts) {
				l = layouts[i]
			}
			err = r.objects.Lease(who, c, l, expires)
		} else {
			err = r.objects.Unlease(who, c)
		}
		if err != nil {
			out[i] = leaseStatus(err)
			continue
		}
		out[i] = leaseOK
	}
	r.lifeMetrics.leaseRequests.WithLabelValues(lifeKindName(kind)).Add(float64(len(claims)))
	r.lifeMetrics.leaseMessages.WithLabelValues(lifeKindName(kind)).Inc()
	return out
}

func lifeKindName(k byte) string {
	if k == kindRelease {
		return "release"
	}
	return "lease"
}

// call sends one lifecycle request to id and returns its reply.
func (r *Runtime) call(ctx context.Context, id peer.ID, m lifeMsg) (lifeMsg, error) {
	m.incarnation = r.incarnation
	s, err := r.host.NewStream(network.WithAllowLimitedConn(ctx, "lifecycle"), id, lifeProtocol)
	if err != nil {
		if ctx.Err() != nil {
			return lifeMsg{}, ctx.Err()
		}
		return lifeMsg{}, fmt.Errorf("%w: %s: %v", ErrPeerUnreachable, shortID(id), err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if err := writeMsg(s, m.marshal()); err != nil {
		return lifeMsg{}, r.callError(ctx, id, err)
	}
	s.CloseWrite()
	body, err := readMsg(s, maxLifeMsg)
	if err != nil {
		return lifeMsg{}, r.callError(ctx, id, err)
	}
	reply, err := parseLifeMsg(body)
	if err != nil {
		return lifeMsg{}, err
	}
	want := map[byte]byte{kindPing: kindPong, kindLease: kindLeased, kindRelease: kindLeased}[m.kind]
	if reply.kind != want || (want == kindLeased && len(reply.statuses) != len(m.claims)) {
		return lifeMsg{}, fmt.Errorf("%w: reply kind %d to request kind %d", wire.ErrMalformed, reply.kind, m.kind)
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
	reply, err := r.call(ctx, owner, lifeMsg{kind: kind, claims: claims, layouts: layouts})
	if err != nil {
		return 0, nil, err
	}
	r.peers.sawAlive(owner, reply.incarnation)
	return reply.incarnation, statusErrors(reply.statuses), nil
}

func statusErrors(st []byte) []error {
	out := make([]error, len(st))
	for i, s := range st {
		if s != leaseOK {
			out[i] = leaseError(s)
		}
	}
	return out
}

// Lease status codes, one per claim in a leased reply.
const (
	leaseOK byte = iota
	leaseNotFound
	leaseFreed
	leaseStale
	leaseUnauthorized
	leaseFailed
	leaseLayout  // the claim's layout is not the published one
	leaseClosing // the owner is shutting down
)

var leaseErrs = map[byte]error{leaseNotFound: ErrObjectNotFound, leaseFreed: ErrObjectFreed, leaseStale: ErrStaleRef, leaseUnauthorized: ErrUnauthorized,
	leaseLayout: ErrLayoutMismatch, leaseClosing: ErrOwnerClosed}

func leaseStatus(err error) byte {
	for code, e := range leaseErrs {
		if errors.Is(err, e) {
			return code
		}
	}
	return leaseFailed
}

func leaseError(code byte) error {
	if e, ok := leaseErrs[code]; ok {
		return fmt.Errorf("owner refused the lease: %w", e)
	}
	return fmt.Errorf("owner refused the lease (status %d)", code)
}

// isGone reports whether a lease error means the object will never be
// readable again.
func isGone(err error) bool {
	return errors.Is(err, ErrObjectFreed) || errors.Is(err, ErrObjectNotFound) || errors.Is(err, ErrStaleRef) || errors.Is(err, ErrUnauthorized) ||
		errors.Is(err, ErrOwnerClosed)
}
