package rdt

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/tensor"
)

// The broadcast's control messages ride the push-notice streams
// (notices.go); their kinds and status bytes are in noticewire.go's table.
// They are small (a few refs at most) and answered with one status byte
// like push notices.

// maxNotice bounds a notice: a children message carries a few refs.
const maxNotice = 64 << 10

// maxChildren bounds the children one reader forwards to.
const maxChildren = 8

// bcastID names one broadcast on its owner.
type bcastID [16]byte

// bcastMsg is every broadcast notice; fields a kind does not use are zero.
type bcastMsg struct {
	kind      byte
	id        bcastID
	slot      fabric.ObjectID // the slot the message is about (the sender's, for reports)
	inc       uint64          // slot runtime's incarnation
	token     []byte          // slot capability (messages to the slot's runtime)
	off, n    int64           // chunk: the range; prepare: n = total bytes, off = chunk size
	gen       uint64          // report, consumed: the slot's generation; prepare: chunks in flight per forward (0: 1); children: 1 when re-parented (probe before each write)
	originInc uint64          // prepare: the owner's incarnation (watched for death)
	failed    fabric.ObjectID // report: the child slot a forward to failed (zero: complete)
	text      string          // report: why
	children  []Ref           // children
	items     []bcastItem     // prepare: the reader's slot per object of a batch; children: the child's (one child a message); empty: the one slot named above
	gens      []uint64        // report: each item's generation (a batch)
}

// bcastItem is one slot of a batch broadcast on the wire.
type bcastItem struct {
	slot  fabric.ObjectID
	token []byte
	n     int64        // prepare: the object's bytes
	dtype tensor.DType // children: what the forwarder writes (its codec choice)
}

// maxBatchItems bounds the objects of one batch broadcast: a prepare or
// children notice carries one item per object and must fit a notice.
const maxBatchItems = 1024

func (m bcastMsg) marshal() ([]byte, error) {
	e := wire.Encoder{Buf: make([]byte, 0, 96+len(m.text))}
	e.Byte(m.kind)
	e.Fixed(m.id[:])
	e.Fixed(m.slot[:])
	e.Uvarint(m.inc)
	e.Bytes(m.token)
	e.Uvarint(uint64(m.off))
	e.Uvarint(uint64(m.n))
	e.Uvarint(m.gen)
	e.Uvarint(m.originInc)
	e.Fixed(m.failed[:])
	e.String(m.text)
	e.Uvarint(uint64(len(m.children)))
	for _, c := range m.children {
		b, err := c.MarshalBinary()
		if err != nil {
			return nil, err
		}
		e.Bytes(b)
	}
	e.Uvarint(uint64(len(m.items)))
	for _, it := range m.items {
		e.Fixed(it.slot[:])
		e.Bytes(it.token)
		e.Uvarint(uint64(it.n))
		e.Byte(byte(it.dtype))
	}
	e.Uvarint(uint64(len(m.gens)))
	for _, g := range m.gens {
		e.Uvarint(g)
	}
	return e.Buf, nil
}

func parseBcastMsg(p []byte) (bcastMsg, error) {
	d := wire.NewDecoder(p)
	var m bcastMsg
	m.kind = d.Byte()
	if d.Err() == nil && (m.kind < noteChunk || m.kind > noteProbe) {
		return m, fmt.Errorf("%w: broadcast notice kind %d", ErrMalformedRef, m.kind)
	}
	d.Fixed(m.id[:])
	d.Fixed(m.slot[:])
	m.inc = d.Uvarint()
	m.token = d.Bytes(maxTokenLen)
	off, n := d.Uvarint(), d.Uvarint()
	m.gen = d.Uvarint()
	m.originInc = d.Uvarint()
	d.Fixed(m.failed[:])
	m.text = d.String(maxRefString)
	for c := d.Count(maxChildren); c > 0 && d.Err() == nil; c-- {
		ref, err := ParseRef(d.Bytes(maxRefBytes))
		if err != nil && d.Err() == nil {
			return m, err
		}
		m.children = append(m.children, ref)
	}
	for c := d.Count(maxBatchItems); c > 0 && d.Err() == nil; c-- {
		var it bcastItem
		d.Fixed(it.slot[:])
		it.token = d.Bytes(maxTokenLen)
		n := d.Uvarint()
		it.dtype = tensor.DType(d.Byte())
		if n > 1<<62 {
			return m, fmt.Errorf("%w: broadcast item of %d bytes", ErrMalformedRef, n)
		}
		it.n = int64(n)
		m.items = append(m.items, it)
	}
	for c := d.Count(maxBatchItems); c > 0 && d.Err() == nil; c-- {
		m.gens = append(m.gens, d.Uvarint())
	}
	if err := d.Finish(); err != nil {
		return m, fmt.Errorf("%w: broadcast notice: %v", ErrMalformedRef, err)
	}
	if off > 1<<62 || n > 1<<62 {
		return m, fmt.Errorf("%w: broadcast notice range %d+%d", ErrMalformedRef, off, n)
	}
	m.off, m.n = int64(off), int64(n)
	return m, nil
}

// sendBcast delivers a broadcast notice to runtime to (this one included)
// and returns the condition it was answered with.
func (r *Runtime) sendBcast(ctx context.Context, to peer.ID, m bcastMsg) error {
	if to == r.host.ID() {
		return r.onBcast(to, m)
	}
	p, err := m.marshal()
	if err != nil {
		return err
	}
	status, err := r.sendNotice(ctx, to, p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPeerUnreachable, err)
	}
	return noticeError(status)
}

// onBcast handles a broadcast notice from peer from.
func (r *Runtime) onBcast(from peer.ID, m bcastMsg) error {
	switch m.kind {
	case notePrepare:
		return r.relayPrepare(from, m)
	case noteChildren:
		return r.relayChildren(from, m)
	case noteChunk:
		return r.relayChunk(m)
	case noteProbe:
		return r.relayProbe(m)
	case noteAbort:
		return r.relayAbort(from, m)
	case noteReport:
		return r.bcastReport(from, m)
	case noteConsumed:
		r.gens.consumed(from, m.slot, m.gen)
		return nil
	}
	return fmt.Errorf("%w: broadcast notice kind %d", ErrMalformedRef, m.kind)
}
