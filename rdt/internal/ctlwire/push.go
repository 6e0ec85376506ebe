package ctlwire

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// PushNotice is the message an owner sends after a push completed.
type PushNotice struct {
	Slot        fabric.ObjectID
	Incarnation uint64
	Token       []byte
	Bytes       int64
}

// Marshal encodes n.
func (n PushNotice) Marshal() []byte {
	e := wire.Encoder{Buf: make([]byte, 0, 64)}
	e.Byte(Push)
	e.Fixed(n.Slot[:])
	e.Uvarint(n.Incarnation)
	e.Bytes(n.Token)
	e.Uvarint(uint64(n.Bytes))
	return e.Buf
}

// ParsePushNotice decodes a push notice; a malformed one is
// errs.MalformedRef.
func ParsePushNotice(p []byte) (PushNotice, error) {
	d := wire.NewDecoder(p)
	var n PushNotice
	if v := d.Byte(); v != Push && d.Err() == nil {
		return n, fmt.Errorf("%w: push notice version %d", errs.MalformedRef, v)
	}
	d.Fixed(n.Slot[:])
	n.Incarnation = d.Uvarint()
	n.Token = d.Bytes(MaxToken)
	b := d.Uvarint()
	if err := d.Finish(); err != nil {
		return n, fmt.Errorf("%w: push notice: %v", errs.MalformedRef, err)
	}
	if b > 1<<62 {
		return n, fmt.Errorf("%w: push notice of %d bytes", errs.MalformedRef, b)
	}
	n.Bytes = int64(b)
	return n, nil
}

// PushBatch is the push notice for many slots of one runtime. Kinds
// 2..15 are left to the broadcast notices (package bcast).
//
//	kind (1) = 16 | incarnation (uvarint) | count (uvarint) |
//	count x (slot (16) | token (bytes) | bytes (uvarint))
//
// The answer is one status byte: 0 when every item was taken, StatusItems
// followed by count status bytes (one per item, in order) when some were
// not, or another status when the notice as a whole was refused (nothing
// taken).
//
// MaxPushBatch bounds the items of one push batch notice; MinPushItem is
// the fewest bytes an item takes, so a count the notice cannot hold is
// refused before anything is allocated for it.
const (
	MaxPushBatch = 1024
	MinPushItem  = 16 + 1 + 1
	// PushBatchBudget bounds an encoded notice below MaxNotice.
	PushBatchBudget = MaxNotice - 1024
)

// PushBatchNotice is the decoded notice.
type PushBatchNotice struct {
	Incarnation uint64
	Items       []PushBatchItem
}

// PushBatchItem is one push a batch notice reports.
type PushBatchItem struct {
	Slot  fabric.ObjectID
	Token []byte
	Bytes int64
}

// Marshal encodes n.
func (n PushBatchNotice) Marshal() []byte {
	e := wire.Encoder{Buf: make([]byte, 0, 16+len(n.Items)*48)}
	e.Byte(PushBatch)
	e.Uvarint(n.Incarnation)
	e.Uvarint(uint64(len(n.Items)))
	for _, it := range n.Items {
		e.Fixed(it.Slot[:])
		e.Bytes(it.Token)
		e.Uvarint(uint64(it.Bytes))
	}
	return e.Buf
}

// Size is an upper bound of one item's encoded bytes.
func (it PushBatchItem) Size() int { return 16 + 10 + len(it.Token) + 10 }

// ParsePushBatchNotice decodes a push batch notice; a malformed one is
// errs.MalformedRef.
func ParsePushBatchNotice(p []byte) (PushBatchNotice, error) {
	d := wire.NewDecoder(p)
	var n PushBatchNotice
	if k := d.Byte(); k != PushBatch && d.Err() == nil {
		return n, fmt.Errorf("%w: push batch notice kind %d", errs.MalformedRef, k)
	}
	n.Incarnation = d.Uvarint()
	c := d.Count(MaxPushBatch)
	if err := d.Err(); err != nil {
		return n, fmt.Errorf("%w: push batch notice: %v", errs.MalformedRef, err)
	}
	if c == 0 || c > d.Remaining()/MinPushItem {
		return n, fmt.Errorf("%w: push batch notice of %d items in %d bytes", errs.MalformedRef, c, d.Remaining())
	}
	n.Items = make([]PushBatchItem, c)
	for i := range n.Items {
		it := &n.Items[i]
		d.Fixed(it.Slot[:])
		it.Token = d.Bytes(MaxToken)
		b := d.Uvarint()
		if b > 1<<62 {
			return n, fmt.Errorf("%w: push batch notice item of %d bytes", errs.MalformedRef, b)
		}
		it.Bytes = int64(b)
	}
	if err := d.Finish(); err != nil {
		return n, fmt.Errorf("%w: push batch notice: %v", errs.MalformedRef, err)
	}
	return n, nil
}

// AnswerPushBatch is the reply to a push batch notice.
func AnswerPushBatch(errs []error) []byte {
	out := make([]byte, 1, 1+len(errs))
	for _, err := range errs {
		if err != nil {
			out[0] = StatusItems
		}
	}
	if out[0] == StatusOK {
		return out
	}
	for _, err := range errs {
		out = append(out, StatusOf(err))
	}
	return out
}
