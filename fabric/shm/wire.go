package shm

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

// The data connection is a SOCK_SEQPACKET Unix socket: every message below
// is one packet, so a message and the descriptor that rides with it
// (SCM_RIGHTS) arrive together and never split. All integers are big endian.
//
// After the peerauth handshake the client (reader or pusher) sends:
//
//	request: op (1) | object (16) | incarnation (8) | offset (8) | length (8) |
//	         have (8) | token length (1) | token
//
// op is opRead (the server opens its Source) or opPush (it opens its Sink);
// have is the mapping id the client already has mapped for this claim, or 0.
// The server answers with one packet:
//
//	refused:  status (1, not StatusOK) | message
//	granted:  status (1, StatusOK) | version (1) | flags (1) | mapping id (8) |
//	          file size (8) | offset in file (8) | length (8) | view start (8) |
//	          hold id (8, 0 unless a view's slab range is held) |
//	          crc32c of everything before it (4)
//
// meaning that the file's bytes [offset, offset+length) hold the object's
// bytes [view start, view start+length): the object's own allocation
// (view start 0), or a private copy of the published view when the object
// is a view of a larger allocation (tensor.ViewShare), so the file holds
// the granted bytes and nothing else of the owner's. The descriptor of that
// file is attached when flags has flagFD (the client
// did not have mapping id mapped). The server keeps the object pinned until
// the client has copied and says so:
//
//	done:     opDone (1) | result (1: 0 copied, 1 abandoned)
//
// The server unpins on done and reads the next request (done has no
// answer: version 1 acknowledged it, which left the client's next request
// waiting for the server to have been scheduled in between), or closes the
// connection first and then unpins (timeout, Close; death closes it too).
// So a client whose connection is still open when its copy ends knows the
// pin was held for all of it: it checks that without blocking (poll for a
// hang-up) and sends done. Reads and pushes end the same way. Reads and pushes alike send have, so a cached
// mapping (read-only for reads, writable for pushes: the client keeps the
// two apart) needs no descriptor.
//
// A zero-copy view asks with opView (a read request otherwise). When the
// object lives in a slab (flagSlab), the owner holds the object's range
// against reuse from the done on, under the hold id the grant carries,
// until the client releases it:
//
//	unview:   opUnview (1) | hold id (8)
//
// on any of its connections (no answer), or until the client has no
// connection to the owner left (slab.go).
//
// Version 5 adds batches of reads and of pushes (opBatch, opBatchPush,
// answered with one reply and descriptor packets, opFDs; batchwire.go). The exchanges above are
// unchanged, and their grants still say version 4.
//
// A reader in the owner's trust scope may ask for the owner's slabs ahead
// of any object (prefetch.go) with opSlabs (a request whose claim is
// empty and whose length is the most slab bytes it will map). The owner
// answers with the slabs it has not sent on this connection yet, largest
// first, as many as fit, each descriptor attached in order:
//
//	announce: status (1, StatusOK) | version (1) | count (1) |
//	          count x (mapping id (8) | file size (8)) | crc32c (4)
//
// or refuses (no trust scope). Later grants of objects in an announced
// slab carry no descriptor, as after a grant that carried one.
const (
	opRead   byte = 1
	opPush   byte = 2
	opDone   byte = 3
	opView   byte = 4
	opUnview byte = 5
	opSlabs  byte = 8 // 6, 7 and 9 are the batch ops (batchwire.go)

	version  byte = 4 // 3: grants carry the view start; 4: and a hold id
	flagFD   byte = 1
	flagCopy byte = 2 // the file is a private copy of the object's view (tensor.Handle.Copy)
	maxToken      = 64

	// flagDevice: the descriptor is a device memory handle (CUDA), not a
	// memory file; the flags' high nibble is its tensor.HandleKind. The
	// reader imports it (tensor.Import) instead of mapping it, and caches
	// the import as it caches mappings (the descriptor is then left off).
	flagDevice byte = 4
	kindShift       = 4

	// flagSlab: the file is a slab of the owner's, shared within its
	// trust scope (slab.go); the mapping id names the slab, and the
	// descriptor rides only on the first grant of it on a connection.
	flagSlab byte = 8

	requestFixed = 1 + 16 + 8 + 8 + 8 + 8 + 1
	grantLen     = 1 + 1 + 1 + 8 + 8 + 8 + 8 + 8 + 8 + 4
	doneLen      = 2
	unviewLen    = 1 + 8

	// maxAnnounce bounds the slabs one announcement carries (and so the
	// descriptors of one packet).
	maxAnnounce = 8
	announceMin = 1 + 1 + 1 + 4
	announceEnt = 8 + 8

	// maxPacket bounds every packet either side reads; the longest is a
	// refusal with a status message.
	maxPacket = 1 + peerauth.MaxMessage + 64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// request is what a client asks of a server.
type request struct {
	op             byte
	claim          fabric.Claim
	offset, length int64
	have           uint64
}

func (r request) marshal() []byte {
	return r.appendTo(make([]byte, 0, requestFixed+len(r.claim.Token)))
}

// appendTo appends the encoded request to b.
func (r request) appendTo(b []byte) []byte { return r.appendItem(append(b, r.op)) }

// appendItem appends the request without its op: a batch item.
func (r request) appendItem(b []byte) []byte {
	b = append(b, r.claim.Object[:]...)
	b = binary.BigEndian.AppendUint64(b, r.claim.Incarnation)
	b = binary.BigEndian.AppendUint64(b, uint64(r.offset))
	b = binary.BigEndian.AppendUint64(b, uint64(r.length))
	b = binary.BigEndian.AppendUint64(b, r.have)
	b = append(b, byte(len(r.claim.Token)))
	return append(b, r.claim.Token...)
}

// parseRequest decodes a request packet. It never panics; malformed input
// yields fabric.ErrBadRequest.
func parseRequest(p []byte) (request, error) {
	if len(p) < requestFixed {
		return request{}, fmt.Errorf("%w: request of %d bytes", fabric.ErrBadRequest, len(p))
	}
	var r request
	r.op = p[0]
	if r.op != opRead && r.op != opPush && r.op != opView && r.op != opSlabs {
		return request{}, fmt.Errorf("%w: unknown op %d", fabric.ErrBadRequest, r.op)
	}
	copy(r.claim.Object[:], p[1:17])
	r.claim.Incarnation = binary.BigEndian.Uint64(p[17:25])
	off, n := binary.BigEndian.Uint64(p[25:33]), binary.BigEndian.Uint64(p[33:41])
	r.have = binary.BigEndian.Uint64(p[41:49])
	tl := int(p[49])
	if tl > maxToken || len(p) != requestFixed+tl {
		return request{}, fmt.Errorf("%w: token of %d bytes in a %d-byte request", fabric.ErrBadRequest, tl, len(p))
	}
	if off > 1<<62 || n > 1<<62 {
		return request{}, fmt.Errorf("%w: range [%d,+%d)", fabric.ErrBadRequest, off, n)
	}
	r.offset, r.length = int64(off), int64(n)
	if tl > 0 {
		r.claim.Token = append([]byte(nil), p[requestFixed:]...)
	}
	return r, nil
}

// grant is the server's answer to an admitted request.
type grant struct {
	flags    byte
	mapID    uint64
	fileSize int64
	objOff   int64  // the first granted byte's offset in the file
	objLen   int64  // how many bytes are granted
	viewOff  int64  // the object byte at objOff: the published view's start when the file is a copy of it
	hold     uint64 // a view's hold on its slab range (opView of a slab object), else 0
}

func (g grant) marshal() []byte {
	b := make([]byte, 0, grantLen)
	b = append(b, peerauth.StatusOK, version, g.flags)
	b = binary.BigEndian.AppendUint64(b, g.mapID)
	b = binary.BigEndian.AppendUint64(b, uint64(g.fileSize))
	b = binary.BigEndian.AppendUint64(b, uint64(g.objOff))
	b = binary.BigEndian.AppendUint64(b, uint64(g.objLen))
	b = binary.BigEndian.AppendUint64(b, uint64(g.viewOff))
	b = binary.BigEndian.AppendUint64(b, g.hold)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseReply decodes the server's answer: a grant, or the error the owner
// reported (matching a fabric sentinel). A damaged grant yields
// fabric.ErrCorrupt: it must never be acted on, since its offsets say
// which memory the client copies.
func parseReply(p []byte) (grant, error) {
	if len(p) == 0 {
		return grant{}, fmt.Errorf("%w: empty reply", fabric.ErrCorrupt)
	}
	if p[0] != peerauth.StatusOK {
		msg := p[1:]
		if len(msg) > peerauth.MaxMessage {
			msg = msg[:peerauth.MaxMessage]
		}
		return grant{}, peerauth.StatusError(p[0], string(msg))
	}
	if len(p) != grantLen {
		return grant{}, fmt.Errorf("%w: grant of %d bytes, want %d", fabric.ErrCorrupt, len(p), grantLen)
	}
	if crc32.Checksum(p[:grantLen-4], castagnoli) != binary.BigEndian.Uint32(p[grantLen-4:]) {
		return grant{}, fmt.Errorf("%w: grant checksum mismatch", fabric.ErrCorrupt)
	}
	if p[1] != version {
		return grant{}, fmt.Errorf("%w: protocol version %d, want %d", fabric.ErrBadRequest, p[1], version)
	}
	return checkGrant(p[2], p[3:43], binary.BigEndian.Uint64(p[43:51]))
}

// checkGrant decodes and checks a grant's fields after its status and
// version: flags, and mapping id | file size | offset | length | view start
// (40 bytes); hold is its hold id. An inconsistent grant yields
// fabric.ErrCorrupt.
func checkGrant(flags byte, f []byte, hold uint64) (grant, error) {
	g := grant{flags: flags, mapID: binary.BigEndian.Uint64(f[0:8]), hold: hold}
	size, off, n := binary.BigEndian.Uint64(f[8:16]), binary.BigEndian.Uint64(f[16:24]), binary.BigEndian.Uint64(f[24:32])
	view := binary.BigEndian.Uint64(f[32:40])
	device := g.flags&flagDevice != 0
	slab := g.flags&flagSlab != 0
	if g.hold != 0 && !slab {
		return grant{}, fmt.Errorf("%w: a hold on a grant that is no slab's", fabric.ErrCorrupt)
	}
	if g.flags&^(flagFD|flagCopy|flagDevice|flagSlab|0xf0) != 0 || device != (g.flags>>kindShift != 0) || (device && g.flags&flagCopy != 0) ||
		(slab && g.flags&(flagCopy|flagDevice) != 0) ||
		size > 1<<62 || off > size || n > size-off || view > 1<<62 {
		return grant{}, fmt.Errorf("%w: grant of [%d,+%d) (view start %d) in a file of %d bytes, flags %#x", fabric.ErrCorrupt, off, n, view, size, g.flags)
	}
	g.fileSize, g.objOff, g.objLen, g.viewOff = int64(size), int64(off), int64(n), int64(view)
	return g, nil
}

// refusal encodes an error as a refused reply.
func refusal(err error) []byte {
	msg := err.Error()
	if len(msg) > peerauth.MaxMessage {
		msg = msg[:peerauth.MaxMessage]
	}
	return append([]byte{peerauth.StatusFor(err)}, msg...)
}

func unviewPacket(id uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{opUnview}, id)
}

// parseUnview decodes an unview packet.
func parseUnview(p []byte) (uint64, error) {
	if len(p) != unviewLen || p[0] != opUnview {
		return 0, fmt.Errorf("%w: unview of %d bytes", fabric.ErrBadRequest, len(p))
	}
	return binary.BigEndian.Uint64(p[1:]), nil
}

// announced is one slab of an announcement: its mapping id (as its
// objects' grants name it) and its file's size.
type announced struct {
	mapID uint64
	size  int64
}

func announcePacket(slabs []announced) []byte {
	b := make([]byte, 0, announceMin+len(slabs)*announceEnt)
	b = append(b, peerauth.StatusOK, version, byte(len(slabs)))
	for _, a := range slabs {
		b = binary.BigEndian.AppendUint64(b, a.mapID)
		b = binary.BigEndian.AppendUint64(b, uint64(a.size))
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// parseAnnounce decodes the owner's answer to opSlabs: the slabs, whose
// descriptors came with it in order (nfds of them), or the owner's
// refusal. It never panics; a damaged announcement yields fabric.ErrCorrupt.
func parseAnnounce(p []byte, nfds int) ([]announced, error) {
	if len(p) == 0 {
		return nil, fmt.Errorf("%w: empty announcement", fabric.ErrCorrupt)
	}
	if p[0] != peerauth.StatusOK {
		msg := p[1:]
		if len(msg) > peerauth.MaxMessage {
			msg = msg[:peerauth.MaxMessage]
		}
		return nil, peerauth.StatusError(p[0], string(msg))
	}
	if len(p) < announceMin {
		return nil, fmt.Errorf("%w: announcement of %d bytes", fabric.ErrCorrupt, len(p))
	}
	n := int(p[2])
	switch {
	case n > maxAnnounce || len(p) != announceMin+n*announceEnt:
		return nil, fmt.Errorf("%w: announcement of %d slabs in %d bytes", fabric.ErrCorrupt, n, len(p))
	case crc32.Checksum(p[:len(p)-4], castagnoli) != binary.BigEndian.Uint32(p[len(p)-4:]):
		return nil, fmt.Errorf("%w: announcement checksum mismatch", fabric.ErrCorrupt)
	case p[1] != version:
		return nil, fmt.Errorf("%w: protocol version %d, want %d", fabric.ErrBadRequest, p[1], version)
	case nfds != n:
		return nil, fmt.Errorf("%w: announcement of %d slabs with %d descriptors", fabric.ErrCorrupt, n, nfds)
	}
	out := make([]announced, n)
	for i := range out {
		e := p[3+i*announceEnt:]
		out[i] = announced{mapID: binary.BigEndian.Uint64(e), size: int64(binary.BigEndian.Uint64(e[8:]))}
		if out[i].mapID == 0 || out[i].size <= 0 || out[i].size > 1<<46 {
			return nil, fmt.Errorf("%w: announced slab %#x of %d bytes", fabric.ErrCorrupt, out[i].mapID, out[i].size)
		}
	}
	return out, nil
}
