package shm

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

// The batch exchange (fabric.BatchReader and fabric.BatchWriter, wire
// version 5): many read claims, or many push sinks, of one owner granted
// in one round trip. All integers are big endian; every message is one
// packet, as in wire.go.
//
//	batch:       op (1) | count (2) | count x (object (16) | incarnation (8) |
//	             offset (8) | length (8) | have (8) | token length (1) | token)
//
// op is opBatch (every item a read) or opBatchPush (every item a push:
// the push flag). Each item is a request of that direction without its op
// byte (wire.go): have is the mapping id the client already maps for that
// claim (read-only for reads, writable for pushes), or 0. The owner opens
// (pins) every item, its Source's object for a read and its Sink's slot
// for a push, and answers with one packet:
//
//	refused:     status (1, not StatusOK) | message           (the whole batch)
//	granted:     status (1, StatusOK) | version (1) = 5 | count (2) | descriptors (2) |
//	             count x item | crc32c of everything before it (4)
//	item:        status (1, StatusOK) | flags (1) | mapping id (8) | file size (8) |
//	             offset in file (8) | length (8) | view start (8)
//	          or status (1, not StatusOK) | message length (1) | message
//
// A granted item means what a single grant (wire.go) means; it carries no
// hold id, since a batch reads or pushes (views go one by one). A push
// item's descriptor reaches exactly its sink's pages, writable, as a
// single push grant's does. A refused item
// fails alone. descriptors counts the items whose flags have flagFD: their
// descriptors, in item order, ride with the reply, at most maxFDsPerPacket
// of them (the kernel's SCM_MAX_FD), and the rest in as few packets after
// it as that allows:
//
//	descriptors: opFDs (1) | count (2)   with count descriptors attached
//
// The owner keeps every granted item pinned until the client's one done
// (wire.go) for the whole batch, or closes the connection first, so a
// client whose connection is still open after its copies knows every pin
// held for all of them. A version 4 owner does not know opBatch: it
// refuses the request (fabric.ErrBadRequest) and closes the connection,
// and the client then reads the items one by one. An owner that knows
// reads only refuses opBatchPush the same way, and the client then pushes
// the items one by one.
const (
	opBatch     byte = 6
	opFDs       byte = 7
	opBatchPush byte = 9

	batchVersion byte = 5

	// maxBatch bounds the items of one batch, as rdma's batches.
	maxBatch = 256
	// maxFDsPerPacket is the kernel's SCM_MAX_FD: the most descriptors
	// one message may carry.
	maxFDsPerPacket = 253
	// maxItemText bounds a refused item's message.
	maxItemText = 120

	batchHead     = 1 + 2
	batchItemMin  = requestFixed - 1 // an item is a request without its op
	maxBatchReq   = batchHead + maxBatch*(batchItemMin+maxToken)
	replyHead     = 1 + 1 + 2 + 2
	itemGrantLen  = 1 + 1 + 8 + 8 + 8 + 8 + 8
	maxBatchReply = replyHead + maxBatch*max(itemGrantLen, 2+maxItemText) + 4
	fdsLen        = 1 + 2
)

// batchItem is one item of a batch reply: a grant, or the owner's refusal.
type batchItem struct {
	g    grant
	code byte // peerauth.StatusOK or the refusal's status
	text string
}

// err returns the item's refusal as a typed error, or nil.
func (b batchItem) err() error { return peerauth.ItemError(b.code, b.text) }

// refusedItem encodes err as an item's refusal.
func refusedItem(err error) batchItem {
	text := err.Error()
	if len(text) > maxItemText {
		text = text[:maxItemText]
	}
	return batchItem{code: peerauth.StatusFor(err), text: text}
}

// appendBatch appends the encoded batch request of reqs to b: all reads,
// or all pushes (the first item's op says which).
func appendBatch(b []byte, reqs []request) []byte {
	op := opBatch
	if len(reqs) > 0 && reqs[0].op == opPush {
		op = opBatchPush
	}
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(reqs)))
	for _, r := range reqs {
		b = r.appendItem(b)
	}
	return b
}

// parseBatch decodes a batch request. A count beyond maxBatch, or beyond
// what the packet can hold, is refused before anything is allocated for
// it; malformed input yields fabric.ErrBadRequest and never a panic.
func parseBatch(p []byte) ([]request, error) {
	if len(p) < batchHead || (p[0] != opBatch && p[0] != opBatchPush) {
		return nil, fmt.Errorf("%w: batch of %d bytes", fabric.ErrBadRequest, len(p))
	}
	op := opRead
	if p[0] == opBatchPush {
		op = opPush
	}
	n := int(binary.BigEndian.Uint16(p[1:3]))
	if n == 0 || n > maxBatch || n > (len(p)-batchHead)/batchItemMin {
		return nil, fmt.Errorf("%w: batch of %d items in %d bytes", fabric.ErrBadRequest, n, len(p))
	}
	out := make([]request, n)
	p = p[batchHead:]
	for i := range out {
		if len(p) < batchItemMin {
			return nil, fmt.Errorf("%w: batch item %d cut short", fabric.ErrBadRequest, i)
		}
		tl := int(p[batchItemMin-1])
		if tl > maxToken || len(p) < batchItemMin+tl {
			return nil, fmt.Errorf("%w: batch item %d: token of %d bytes in %d", fabric.ErrBadRequest, i, tl, len(p))
		}
		item := make([]byte, 0, requestFixed+tl) // parseRequest checks the rest
		item = append(append(item, op), p[:batchItemMin+tl]...)
		r, err := parseRequest(item)
		if err != nil {
			return nil, fmt.Errorf("batch item %d: %w", i, err)
		}
		out[i] = r
		p = p[batchItemMin+tl:]
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the batch's items", fabric.ErrBadRequest, len(p))
	}
	return out, nil
}

// marshalBatchReply encodes a granted batch reply; fds is how many
// descriptors its items carry.
func marshalBatchReply(items []batchItem, fds int) []byte {
	b := make([]byte, 0, replyHead+len(items)*itemGrantLen+4)
	b = append(b, peerauth.StatusOK, batchVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(len(items)))
	b = binary.BigEndian.AppendUint16(b, uint16(fds))
	for _, it := range items {
		if it.code != peerauth.StatusOK {
			text := it.text
			if len(text) > maxItemText {
				text = text[:maxItemText]
			}
			b = append(b, it.code, byte(len(text)))
			b = append(b, text...)
			continue
		}
		g := it.g
		b = append(b, peerauth.StatusOK, g.flags)
		b = binary.BigEndian.AppendUint64(b, g.mapID)
		b = binary.BigEndian.AppendUint64(b, uint64(g.fileSize))
		b = binary.BigEndian.AppendUint64(b, uint64(g.objOff))
		b = binary.BigEndian.AppendUint64(b, uint64(g.objLen))
		b = binary.BigEndian.AppendUint64(b, uint64(g.viewOff))
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseBatchReply decodes the owner's answer to a batch of want items:
// the items and how many descriptors they carry, or the error the owner
// refused the whole batch with. A damaged reply yields fabric.ErrCorrupt:
// its offsets say which memory the client copies.
func parseBatchReply(p []byte, want int) ([]batchItem, int, error) {
	if len(p) == 0 {
		return nil, 0, fmt.Errorf("%w: empty batch reply", fabric.ErrCorrupt)
	}
	if p[0] != peerauth.StatusOK {
		_, err := parseReply(p) // a refusal of the whole batch reads as one of a request
		return nil, 0, err
	}
	if len(p) < replyHead+4 {
		return nil, 0, fmt.Errorf("%w: batch reply of %d bytes", fabric.ErrCorrupt, len(p))
	}
	body := p[:len(p)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(p[len(p)-4:]) {
		return nil, 0, fmt.Errorf("%w: batch reply checksum mismatch", fabric.ErrCorrupt)
	}
	if body[1] != batchVersion {
		return nil, 0, fmt.Errorf("%w: batch reply version %d, want %d", fabric.ErrBadRequest, body[1], batchVersion)
	}
	n, fds := int(binary.BigEndian.Uint16(body[2:4])), int(binary.BigEndian.Uint16(body[4:6]))
	if n != want || n > maxBatch || n > (len(body)-replyHead)/2 || fds > n {
		return nil, 0, fmt.Errorf("%w: batch reply of %d items (%d descriptors) for %d claims in %d bytes", fabric.ErrCorrupt, n, fds, want, len(body))
	}
	out := make([]batchItem, n)
	body = body[replyHead:]
	withFD := 0
	for i := range out {
		it := &out[i]
		if len(body) < 2 {
			return nil, 0, fmt.Errorf("%w: batch reply item %d cut short", fabric.ErrCorrupt, i)
		}
		it.code = body[0]
		if it.code != peerauth.StatusOK {
			tl := int(body[1])
			if tl > maxItemText || len(body) < 2+tl {
				return nil, 0, fmt.Errorf("%w: batch reply item %d: message of %d bytes", fabric.ErrCorrupt, i, tl)
			}
			it.text = string(body[2 : 2+tl])
			body = body[2+tl:]
			continue
		}
		if len(body) < itemGrantLen {
			return nil, 0, fmt.Errorf("%w: batch reply item %d cut short", fabric.ErrCorrupt, i)
		}
		g, err := checkGrant(body[1], body[2:itemGrantLen], 0)
		if err != nil {
			return nil, 0, fmt.Errorf("batch reply item %d: %w", i, err)
		}
		if g.flags&flagFD != 0 {
			withFD++
		}
		it.g = g
		body = body[itemGrantLen:]
	}
	if len(body) != 0 || withFD != fds {
		return nil, 0, fmt.Errorf("%w: batch reply: %d bytes after the items, %d items with a descriptor of %d announced", fabric.ErrCorrupt, len(body), withFD, fds)
	}
	return out, fds, nil
}

// fdsPacket is the body of a descriptor packet carrying n descriptors.
func fdsPacket(n int) []byte {
	return binary.BigEndian.AppendUint16([]byte{opFDs}, uint16(n))
}

// parseFDs decodes a descriptor packet's body: how many it says it carries.
func parseFDs(p []byte) (int, error) {
	if len(p) != fdsLen || p[0] != opFDs {
		return 0, fmt.Errorf("%w: descriptor packet of %d bytes", fabric.ErrCorrupt, len(p))
	}
	n := int(binary.BigEndian.Uint16(p[1:]))
	if n == 0 || n > maxFDsPerPacket {
		return 0, fmt.Errorf("%w: descriptor packet of %d descriptors", fabric.ErrCorrupt, n)
	}
	return n, nil
}
