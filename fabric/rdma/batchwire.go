package rdma

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/wire"
)

// The batch control exchange (fabric.BatchReader): many claims of one
// owner resolved, pinned and registered in one round trip, and released in
// one message.
//
//	resolve batch: kind (1) = 3 | count (uvarint) | count x (registration id (uvarint) |
//	               object (16) | incarnation (8) | token (bytes) | offset (uvarint) | length (uvarint))
//	        reply: count (uvarint) | count x (status (1) | status OK: length (uvarint) |
//	               keys (uvarint) | keys x (NIC (string) | rkey (uvarint) | addr (uvarint));
//	               any other status: message (string))
//	done batch:    kind (1) = 4 | count (uvarint) | count x registration id (uvarint); reply empty
//	write batch:   kind (1) = 5 | then as resolve batch; every claim names a sink to push into
//	        reply: as resolve batch
//
// Each item is a registration of its own, as if resolved alone: the done of
// one id, the queue pair going away or Revoke release it. The items of a
// reply answer the request's in order; a refused item carries the status
// of the fabric error (peerauth codes) and why.
const (
	msgResolveBatch = 3
	msgDoneBatch    = 4
	// msgWriteBatch resolves sinks (fabric.BatchWriter): the items are
	// registered for remote writes, as a resolve with its push flag.
	msgWriteBatch = 5

	// maxBatch bounds the items of one batch message.
	maxBatch = 256
	// maxItemText bounds the message of a refused item.
	maxItemText = 200
	// minBatchItem is the fewest bytes an encoded resolve item takes: a
	// decoder refuses a count that the message cannot hold before it
	// allocates for it.
	minBatchItem = 1 + 16 + 8 + 1 + 1 + 1
	// batchBudget bounds the bytes of a batch request and of its reply, so
	// both fit every provider's control messages (64 KiB).
	batchBudget = 48 << 10
)

// batchItem is one item of a batch reply: keys, or the owner's refusal.
type batchItem struct {
	resp resolveResp
	code byte // peerauth.StatusOK or the refusal's status
	text string
}

// err returns the item's refusal as a typed error, or nil.
func (b batchItem) err() error { return peerauth.ItemError(b.code, b.text) }

// marshalResolveBatch encodes a resolve batch, or a write batch when the
// items are pushes (a batch goes one way: the first item's push says
// which).
func marshalResolveBatch(reqs []resolveReq) []byte {
	e := wire.Encoder{}
	kind := byte(msgResolveBatch)
	if len(reqs) > 0 && reqs[0].push {
		kind = msgWriteBatch
	}
	e.Byte(kind)
	e.Uvarint(uint64(len(reqs)))
	for _, r := range reqs {
		e.Uvarint(r.id)
		r.encodeClaim(&e)
	}
	return e.Buf
}

// batchRequestSize is an upper bound of one item's bytes in a resolve
// batch request.
func batchRequestSize(r resolveReq) int { return 10 + 16 + 8 + 10 + len(r.claim.Token) + 20 }

// batchReplySize is an upper bound of one item's bytes in a reply from an
// owner that registers on the given NICs.
func batchReplySize(nics []Rail) int {
	ok := 1 + 10 + 10
	for _, n := range nics {
		ok += 10 + len(n.NIC) + 10 + 10
	}
	return max(ok, 1+10+maxItemText)
}

// decodeResolveBatch decodes a resolve or write batch request (msg[0] is
// its kind; a write batch's items have push set). A count beyond
// maxBatch, or beyond what the message can hold, is refused before
// anything is allocated for it.
func decodeResolveBatch(p []byte) ([]resolveReq, error) {
	d := wire.NewDecoder(p)
	kind := d.Byte()
	if kind != msgResolveBatch && kind != msgWriteBatch {
		return nil, fmt.Errorf("%w: rdma control: not a resolve batch (kind %d)", fabric.ErrBadRequest, kind)
	}
	n := d.Count(maxBatch)
	if err := d.Err(); err != nil {
		return nil, fmt.Errorf("%w: rdma control batch: %v", fabric.ErrBadRequest, err)
	}
	if n == 0 || n > d.Remaining()/minBatchItem {
		return nil, fmt.Errorf("%w: rdma control batch: %d items in %d bytes", fabric.ErrBadRequest, n, d.Remaining())
	}
	out := make([]resolveReq, n)
	for i := range out {
		r := &out[i]
		r.push = kind == msgWriteBatch
		r.id = d.Uvarint()
		off, length := r.decodeClaim(d)
		if d.Err() == nil && (off > 1<<62 || length > 1<<62) {
			return nil, fmt.Errorf("%w: rdma control batch: item %d range [%d,+%d)", fabric.ErrBadRequest, i, off, length)
		}
		r.offset, r.length = int64(off), int64(length)
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: rdma control batch: %v", fabric.ErrBadRequest, err)
	}
	return out, nil
}

func marshalBatchReply(items []batchItem) []byte {
	e := wire.Encoder{}
	e.Uvarint(uint64(len(items)))
	for _, it := range items {
		e.Byte(it.code)
		if it.code != peerauth.StatusOK {
			text := it.text
			if len(text) > maxItemText {
				text = text[:maxItemText]
			}
			e.String(text)
			continue
		}
		e.Uvarint(uint64(it.resp.length))
		e.Uvarint(uint64(len(it.resp.keys)))
		for _, k := range it.resp.keys {
			e.String(k.NIC)
			e.Uvarint(uint64(k.RKey))
			e.Uvarint(k.Addr)
		}
	}
	return e.Buf
}

// decodeBatchReply decodes the reply to a resolve batch of want items.
func decodeBatchReply(p []byte, want int) ([]batchItem, error) {
	d := wire.NewDecoder(p)
	n := d.Count(maxBatch)
	if err := d.Err(); err != nil {
		return nil, fmt.Errorf("%w: rdma control batch reply: %v", fabric.ErrCorrupt, err)
	}
	if n != want || n > d.Remaining()/2 {
		return nil, fmt.Errorf("%w: rdma control batch reply: %d items for %d claims in %d bytes", fabric.ErrCorrupt, n, want, d.Remaining())
	}
	out := make([]batchItem, n)
	for i := range out {
		it := &out[i]
		it.code = d.Byte()
		if it.code != peerauth.StatusOK {
			it.text = d.String(maxItemText)
			continue
		}
		length := d.Uvarint()
		keys := d.Count(MaxRails)
		for range keys {
			k := regKey{NIC: d.String(64)}
			rk := d.Uvarint()
			k.Addr = d.Uvarint()
			if rk > 1<<32-1 {
				return nil, fmt.Errorf("%w: rdma control batch reply: rkey %d", fabric.ErrCorrupt, rk)
			}
			k.RKey = uint32(rk)
			it.resp.keys = append(it.resp.keys, k)
		}
		if length > 1<<62 {
			return nil, fmt.Errorf("%w: rdma control batch reply: length %d", fabric.ErrCorrupt, length)
		}
		it.resp.length = int64(length)
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: rdma control batch reply: %v", fabric.ErrCorrupt, err)
	}
	return out, nil
}

// doneMsgs releases one registration (msgDone) or several (msgDoneBatch).
func doneMsgs(ids []uint64) []byte {
	if len(ids) == 1 {
		return doneMsg(ids[0])
	}
	e := wire.Encoder{}
	e.Byte(msgDoneBatch)
	e.Uvarint(uint64(len(ids)))
	for _, id := range ids {
		e.Uvarint(id)
	}
	return e.Buf
}

// decodeDoneBatch decodes a done batch (msg[0] is its kind).
func decodeDoneBatch(p []byte) ([]uint64, error) {
	d := wire.NewDecoder(p)
	if kind := d.Byte(); kind != msgDoneBatch {
		return nil, fmt.Errorf("%w: rdma control: not a done batch (kind %d)", fabric.ErrBadRequest, kind)
	}
	n := d.Count(maxBatch)
	if d.Err() == nil && n > d.Remaining() {
		return nil, fmt.Errorf("%w: rdma control done batch: %d ids in %d bytes", fabric.ErrBadRequest, n, d.Remaining())
	}
	if err := d.Err(); err != nil {
		return nil, fmt.Errorf("%w: rdma control done batch: %v", fabric.ErrBadRequest, err)
	}
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = d.Uvarint()
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: rdma control done batch: %v", fabric.ErrBadRequest, err)
	}
	return ids, nil
}
