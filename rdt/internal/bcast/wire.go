package bcast

import (
	"encoding"
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// The broadcast's control messages ride the push-notice streams; their
// kinds and status bytes are in ctlwire's table. They are small (a few
// refs at most) and answered with one status byte like push notices.

// MaxChildren bounds the children one reader forwards to.
const MaxChildren = 8

// MaxItems bounds the objects of one batch broadcast: a prepare or
// children notice carries one item per object and must fit a notice.
const MaxItems = 1024

// ErrMalformed is a broadcast notice that does not decode; rdt reports it
// as ErrMalformedRef too.
var ErrMalformed = errors.New("broadcast notice")

// ID names one broadcast on its owner.
type ID [16]byte

// Msg is every broadcast notice; fields a kind does not use are zero. R is
// the ref a children notice names each child by (rdt.Ref): the codec
// carries it as its own marshalled bytes and leaves its meaning to rdt.
type Msg[R encoding.BinaryMarshaler] struct {
	Kind      byte
	ID        ID
	Slot      fabric.ObjectID // the slot the message is about (the sender's, for reports)
	Inc       uint64          // slot runtime's incarnation
	Token     []byte          // slot capability (messages to the slot's runtime)
	Off, N    int64           // chunk: the range; prepare: N = total bytes, Off = chunk size
	Gen       uint64          // report, consumed: the slot's generation; prepare: chunks in flight per forward (0: 1); children: 1 when re-parented (probe before each write)
	OriginInc uint64          // prepare: the owner's incarnation (watched for death)
	Failed    fabric.ObjectID // report: the child slot a forward to failed (zero: complete)
	Text      string          // report: why
	Children  []R             // children
	Items     []Item          // prepare: the reader's slot per object of a batch; children: the child's (one child a message); empty: the one slot named above
	Gens      []uint64        // report: each item's generation (a batch)
}

// Item is one slot of a batch broadcast on the wire.
type Item struct {
	Slot  fabric.ObjectID
	Token []byte
	N     int64        // prepare: the object's bytes
	DType tensor.DType // children: what the forwarder writes (its codec choice)
}

// Marshal encodes m; it fails only when a child does not marshal.
func (m Msg[R]) Marshal() ([]byte, error) {
	e := wire.Encoder{Buf: make([]byte, 0, 96+len(m.Text))}
	e.Byte(m.Kind)
	e.Fixed(m.ID[:])
	e.Fixed(m.Slot[:])
	e.Uvarint(m.Inc)
	e.Bytes(m.Token)
	e.Uvarint(uint64(m.Off))
	e.Uvarint(uint64(m.N))
	e.Uvarint(m.Gen)
	e.Uvarint(m.OriginInc)
	e.Fixed(m.Failed[:])
	e.String(m.Text)
	e.Uvarint(uint64(len(m.Children)))
	for _, c := range m.Children {
		b, err := c.MarshalBinary()
		if err != nil {
			return nil, err
		}
		e.Bytes(b)
	}
	e.Uvarint(uint64(len(m.Items)))
	for _, it := range m.Items {
		e.Fixed(it.Slot[:])
		e.Bytes(it.Token)
		e.Uvarint(uint64(it.N))
		e.Byte(byte(it.DType))
	}
	e.Uvarint(uint64(len(m.Gens)))
	for _, g := range m.Gens {
		e.Uvarint(g)
	}
	return e.Buf, nil
}

// ParseMsg decodes a broadcast notice, each child with parseRef (whose
// error it returns as it is). Every other failure wraps ErrMalformed.
func ParseMsg[R encoding.BinaryMarshaler](p []byte, parseRef func([]byte) (R, error)) (Msg[R], error) {
	d := wire.NewDecoder(p)
	var m Msg[R]
	m.Kind = d.Byte()
	if d.Err() == nil && (m.Kind < ctlwire.Chunk || m.Kind > ctlwire.Probe) {
		return m, fmt.Errorf("%w kind %d", ErrMalformed, m.Kind)
	}
	d.Fixed(m.ID[:])
	d.Fixed(m.Slot[:])
	m.Inc = d.Uvarint()
	m.Token = d.Bytes(ctlwire.MaxToken)
	off, n := d.Uvarint(), d.Uvarint()
	m.Gen = d.Uvarint()
	m.OriginInc = d.Uvarint()
	d.Fixed(m.Failed[:])
	m.Text = d.String(ctlwire.MaxString)
	for c := d.Count(MaxChildren); c > 0 && d.Err() == nil; c-- {
		ref, err := parseRef(d.Bytes(ctlwire.MaxRef))
		if err != nil && d.Err() == nil {
			return m, err
		}
		m.Children = append(m.Children, ref)
	}
	for c := d.Count(MaxItems); c > 0 && d.Err() == nil; c-- {
		var it Item
		d.Fixed(it.Slot[:])
		it.Token = d.Bytes(ctlwire.MaxToken)
		n := d.Uvarint()
		it.DType = tensor.DType(d.Byte())
		if n > 1<<62 {
			return m, fmt.Errorf("%w: item of %d bytes", ErrMalformed, n)
		}
		it.N = int64(n)
		m.Items = append(m.Items, it)
	}
	for c := d.Count(MaxItems); c > 0 && d.Err() == nil; c-- {
		m.Gens = append(m.Gens, d.Uvarint())
	}
	if err := d.Finish(); err != nil {
		return m, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if off > 1<<62 || n > 1<<62 {
		return m, fmt.Errorf("%w range %d+%d", ErrMalformed, off, n)
	}
	m.Off, m.N = int64(off), int64(n)
	return m, nil
}
