package tcp

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/tensorlane/tensorlane/fabric"
)

// A read request, client to server:
//
//	op (1) = opRead | object (16) | incarnation (8) | token length (1) | token | offset (8) | length (8)
//
// The reply is a status byte; on StatusOK the data follows as chunks of
// header (length (4) | crc32c (4)) and bytes, until length bytes are sent.
// On any other status a length-prefixed message follows.
const (
	opRead      byte = 1
	maxToken         = 64
	chunkHeader      = 8
)

type readRequest struct {
	claim          fabric.Claim
	offset, length int64
}

func (r readRequest) marshal() []byte {
	b := make([]byte, 0, 1+16+8+1+len(r.claim.Token)+16)
	b = append(b, opRead)
	b = append(b, r.claim.Object[:]...)
	b = binary.BigEndian.AppendUint64(b, r.claim.Incarnation)
	b = append(b, byte(len(r.claim.Token)))
	b = append(b, r.claim.Token...)
	b = binary.BigEndian.AppendUint64(b, uint64(r.offset))
	return binary.BigEndian.AppendUint64(b, uint64(r.length))
}

func readRequestFrom(r io.Reader) (readRequest, error) {
	var head [1 + 16 + 8 + 1]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return readRequest{}, err
	}
	if head[0] != opRead {
		return readRequest{}, fmt.Errorf("%w: unknown op %d", fabric.ErrBadRequest, head[0])
	}
	var req readRequest
	copy(req.claim.Object[:], head[1:17])
	req.claim.Incarnation = binary.BigEndian.Uint64(head[17:25])
	n := int(head[25])
	if n > maxToken {
		return readRequest{}, fmt.Errorf("%w: token of %d bytes", fabric.ErrBadRequest, n)
	}
	rest := make([]byte, n+16)
	if _, err := io.ReadFull(r, rest); err != nil {
		return readRequest{}, err
	}
	req.claim.Token = rest[:n]
	off, length := binary.BigEndian.Uint64(rest[n:]), binary.BigEndian.Uint64(rest[n+8:])
	if off > 1<<62 || length > 1<<62 {
		return readRequest{}, fmt.Errorf("%w: range [%d,+%d)", fabric.ErrBadRequest, off, length)
	}
	req.offset, req.length = int64(off), int64(length)
	return req, nil
}
