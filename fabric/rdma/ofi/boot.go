package ofi

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/tensorlane/tensorlane/fabric"
)

// The bootstrap connection, after the peerauth handshake:
//
//	server -> client: endpoint address (peerauth field, at most MaxAddr bytes)
//	then frames both ways: kind (1) | id (8) | length (4) | payload
//
// A ping is answered with an empty reply by the connection's reader. A call frame carries a control message to the server's handler; the
// reply frame with the same id carries its answer, an error frame a
// peerauth status code (1 byte) and message. This is where rdma's control
// exchange (resolve, done) travels; the data never does.
const (
	kindCall  = 1
	kindReply = 2
	kindError = 3
	kindPing  = 4 // answered at once with an empty reply: is the owner alive?

	frameHeader = 13
	// MaxMessage is the largest control message or answer.
	MaxMessage = 64 << 10
	// MaxAddr is the longest endpoint address accepted (fi_getname).
	MaxAddr = 256
)

type bootFrame struct {
	kind    byte
	id      uint64
	payload []byte
}

func appendFrame(b []byte, f bootFrame) []byte {
	var h [frameHeader]byte
	h[0] = f.kind
	binary.BigEndian.PutUint64(h[1:9], f.id)
	binary.BigEndian.PutUint32(h[9:13], uint32(len(f.payload)))
	return append(append(b, h[:]...), f.payload...)
}

// readFrame reads one frame; a bad kind or length is an ErrBadRequest
// (the connection is then dropped), a short read the reader's error.
func readFrame(r io.Reader) (bootFrame, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return bootFrame{}, err
	}
	f := bootFrame{kind: h[0], id: binary.BigEndian.Uint64(h[1:9])}
	if f.kind < kindCall || f.kind > kindPing {
		return bootFrame{}, fmt.Errorf("%w: ofi bootstrap: frame kind %d", fabric.ErrBadRequest, f.kind)
	}
	n := binary.BigEndian.Uint32(h[9:13])
	if n > MaxMessage {
		return bootFrame{}, fmt.Errorf("%w: ofi bootstrap: frame of %d bytes (max %d)", fabric.ErrBadRequest, n, MaxMessage)
	}
	f.payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.payload); err != nil {
		return bootFrame{}, err
	}
	return f, nil
}
