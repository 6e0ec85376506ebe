package rdma

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
)

// The control exchange, carried by QueuePair.Call on the first rail:
//
//	resolve: kind (1) = 1 | registration id (uvarint) | push (1) |
//	         object (16) | incarnation (8) | token (bytes) | offset (uvarint) | length (uvarint)
//	  reply: length (uvarint) | count (uvarint) | count x (NIC (string) | rkey (uvarint) | addr (uvarint))
//	done:    kind (1) = 2 | registration id (uvarint); reply empty
//
// The registration id is chosen by the reader, so it can release a
// registration whose reply it never saw (a cancelled resolve).
const (
	msgResolve = 1
	msgDone    = 2
	maxToken   = 256
)

type resolveReq struct {
	id             uint64
	push           bool
	claim          fabric.Claim
	offset, length int64
}

type regKey struct {
	NIC  string
	RKey uint32
	Addr uint64
}

type resolveResp struct {
	length int64
	keys   []regKey
}

func (r resolveReq) marshal() []byte {
	e := wire.Encoder{}
	e.Byte(msgResolve)
	e.Uvarint(r.id)
	b := byte(0)
	if r.push {
		b = 1
	}
	e.Byte(b)
	r.encodeClaim(&e)
	return e.Buf
}

// encodeClaim writes the claim and byte range of a resolve request, as a
// single resolve and every item of a resolve batch carry them.
func (r *resolveReq) encodeClaim(e *wire.Encoder) {
	e.Fixed(r.claim.Object[:])
	e.Uint64(r.claim.Incarnation)
	e.Bytes(r.claim.Token)
	e.Uvarint(uint64(r.offset))
	e.Uvarint(uint64(r.length))
}

// decodeClaim reads what encodeClaim wrote; the caller checks d.Err and
// the range (off, n) before using them.
func (r *resolveReq) decodeClaim(d *wire.Decoder) (off, n uint64) {
	d.Fixed(r.claim.Object[:])
	r.claim.Incarnation = d.Uint64()
	r.claim.Token = d.Bytes(maxToken)
	return d.Uvarint(), d.Uvarint()
}

// decodeControl decodes a control request: exactly one of the results is
// set, or the error (ErrBadRequest) is.
func decodeControl(p []byte) (res *resolveReq, done uint64, err error) {
	d := wire.NewDecoder(p)
	switch kind := d.Byte(); kind {
	case msgResolve:
		r := &resolveReq{id: d.Uvarint()}
		switch d.Byte() {
		case 0:
		case 1:
			r.push = true
		default:
			return nil, 0, fmt.Errorf("%w: rdma control: bad push flag", fabric.ErrBadRequest)
		}
		off, n := r.decodeClaim(d)
		if err := d.Finish(); err != nil {
			return nil, 0, fmt.Errorf("%w: rdma control: %v", fabric.ErrBadRequest, err)
		}
		if off > 1<<62 || n > 1<<62 {
			return nil, 0, fmt.Errorf("%w: rdma control: range [%d,+%d)", fabric.ErrBadRequest, off, n)
		}
		r.offset, r.length = int64(off), int64(n)
		return r, 0, nil
	case msgDone:
		id := d.Uvarint()
		if err := d.Finish(); err != nil {
			return nil, 0, fmt.Errorf("%w: rdma control: %v", fabric.ErrBadRequest, err)
		}
		return nil, id, nil
	default:
		return nil, 0, fmt.Errorf("%w: rdma control: unknown message kind %d", fabric.ErrBadRequest, kind)
	}
}

func doneMsg(id uint64) []byte {
	e := wire.Encoder{}
	e.Byte(msgDone)
	e.Uvarint(id)
	return e.Buf
}

func (r resolveResp) marshal() []byte {
	e := wire.Encoder{}
	e.Uvarint(uint64(r.length))
	e.Uvarint(uint64(len(r.keys)))
	for _, k := range r.keys {
		e.String(k.NIC)
		e.Uvarint(uint64(k.RKey))
		e.Uvarint(k.Addr)
	}
	return e.Buf
}

func decodeResolveResp(p []byte) (resolveResp, error) {
	d := wire.NewDecoder(p)
	var r resolveResp
	n := d.Uvarint()
	count := d.Count(MaxRails)
	for range count {
		k := regKey{NIC: d.String(64)}
		rk := d.Uvarint()
		k.Addr = d.Uvarint()
		if rk > 1<<32-1 {
			return resolveResp{}, fmt.Errorf("%w: rdma control: rkey %d", fabric.ErrCorrupt, rk)
		}
		k.RKey = uint32(rk)
		r.keys = append(r.keys, k)
	}
	if err := d.Finish(); err != nil {
		return resolveResp{}, fmt.Errorf("%w: rdma control reply: %v", fabric.ErrCorrupt, err)
	}
	if n > 1<<62 {
		return resolveResp{}, fmt.Errorf("%w: rdma control reply: length %d", fabric.ErrCorrupt, n)
	}
	r.length = int64(n)
	return r, nil
}
