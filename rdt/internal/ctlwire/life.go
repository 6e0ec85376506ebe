package ctlwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// Layout is a digest of a tensor layout (objstore.LayoutOf), which a
// lease's claim carries.
type Layout [16]byte

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
// the reader's ref carries (objstore.LayoutOf in rdt): the owner grants the lease only if it
// is the desc it published, so a reader learns of a forged shape before it
// allocates for it.
const (
	LifeVersion = 2
	MaxClaims   = 4096
	minClaimLen = 16 + 8 + 1 + len(Layout{})
	MaxLifeMsg  = 16 + MaxClaims*(minClaimLen+MaxToken+2)
)

// Lifecycle message kinds.
const (
	LifePing byte = iota + 1
	LifePong
	LifeLease
	LifeRelease
	LifeLeased
)

// LifeMsg is one message of the lifecycle protocol; fields its kind does
// not use are zero.
type LifeMsg struct {
	Kind        byte
	Incarnation uint64
	Claims      []fabric.Claim
	Layouts     []Layout // one per claim (lease, release)
	Statuses    []byte   // one per claim (leased)
	TTL         time.Duration
}

// Marshal encodes m.
func (m LifeMsg) Marshal() []byte {
	e := wire.Encoder{Buf: make([]byte, 0, 16+len(m.Claims)*48+len(m.Statuses))}
	e.Byte(LifeVersion)
	e.Byte(m.Kind)
	e.Uint64(m.Incarnation)
	switch m.Kind {
	case LifeLease, LifeRelease:
		e.Uvarint(uint64(len(m.Claims)))
		for i, c := range m.Claims {
			e.Fixed(c.Object[:])
			e.Uint64(c.Incarnation)
			e.Bytes(c.Token)
			var l Layout
			if i < len(m.Layouts) {
				l = m.Layouts[i]
			}
			e.Fixed(l[:])
		}
	case LifeLeased:
		e.Uvarint(uint64(m.TTL / time.Millisecond))
		e.Bytes(m.Statuses)
	}
	return e.Buf
}

// ParseLifeMsg decodes a lifecycle message; malformed input is an error
// matching wire.ErrMalformed, never a panic.
func ParseLifeMsg(p []byte) (LifeMsg, error) {
	d := wire.NewDecoder(p)
	if v := d.Byte(); v != LifeVersion && d.Err() == nil {
		return LifeMsg{}, fmt.Errorf("%w: lifecycle message version %d", wire.ErrMalformed, v)
	}
	m := LifeMsg{Kind: d.Byte(), Incarnation: d.Uint64()}
	switch m.Kind {
	case LifePing, LifePong:
	case LifeLease, LifeRelease:
		n := d.Count(MaxClaims)
		// A claim takes at least minClaimLen bytes: never allocate for
		// more claims than the message can hold.
		m.Claims = make([]fabric.Claim, 0, min(n, d.Remaining()/minClaimLen))
		m.Layouts = make([]Layout, 0, cap(m.Claims))
		for ; n > 0 && d.Err() == nil; n-- {
			var c fabric.Claim
			var l Layout
			d.Fixed(c.Object[:])
			c.Incarnation = d.Uint64()
			c.Token = d.Bytes(MaxToken)
			d.Fixed(l[:])
			m.Claims = append(m.Claims, c)
			m.Layouts = append(m.Layouts, l)
		}
	case LifeLeased:
		m.TTL = time.Duration(min(d.Uvarint(), uint64(24*time.Hour/time.Millisecond))) * time.Millisecond
		m.Statuses = d.Bytes(MaxClaims)
	default:
		if d.Err() == nil {
			return LifeMsg{}, fmt.Errorf("%w: lifecycle message kind %d", wire.ErrMalformed, m.Kind)
		}
	}
	if err := d.Finish(); err != nil {
		return LifeMsg{}, err
	}
	return m, nil
}

// WriteMsg writes p with its 4-byte length.
func WriteMsg(w io.Writer, p []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(p)))
	_, err := w.Write(append(n[:], p...))
	return err
}

// ReadMsg reads one length-prefixed message of at most limit bytes.
func ReadMsg(r io.Reader, limit int) ([]byte, error) {
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

// Lease status codes, one per claim in a leased reply.
const (
	LeaseOK byte = iota
	LeaseNotFound
	LeaseFreed
	LeaseStale
	LeaseUnauthorized
	LeaseFailed
	LeaseLayout  // the claim's layout is not the published one
	LeaseClosing // the owner is shutting down
)

var leaseErrs = map[byte]error{LeaseNotFound: errs.ObjectNotFound, LeaseFreed: errs.ObjectFreed, LeaseStale: errs.StaleRef, LeaseUnauthorized: errs.Unauthorized,
	LeaseLayout: errs.LayoutMismatch, LeaseClosing: errs.OwnerClosed}

// LeaseStatusOf is the status a claim refused with err is answered with.
func LeaseStatusOf(err error) byte {
	for code, e := range leaseErrs {
		if errors.Is(err, e) {
			return code
		}
	}
	return LeaseFailed
}

// LeaseErrOf is the condition a claim's status reports.
func LeaseErrOf(code byte) error {
	if e, ok := leaseErrs[code]; ok {
		return fmt.Errorf("owner refused the lease: %w", e)
	}
	return fmt.Errorf("owner refused the lease (status %d)", code)
}

// LeaseErrs is the condition of each claim's status (nil for LeaseOK).
func LeaseErrs(st []byte) []error {
	out := make([]error, len(st))
	for i, s := range st {
		if s != LeaseOK {
			out[i] = LeaseErrOf(s)
		}
	}
	return out
}
