// Package peerauth authenticates tensorlane data connections (tcp, shm, the
// software rdma provider) against the libp2p identities of both ends, and
// carries the status codes every data protocol answers with. It is shared so
// that every path admits exactly the same peers in exactly the same way.
package peerauth

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
)

// The handshake (options.go) binds a data connection to the libp2p
// identities of both ends: each side signs both nonces, the other side's
// public key and the handshake options with its identity key, so neither can
// be impersonated and a recorded handshake cannot be replayed.
const (
	nonceLen   = 32
	maxKeyLen  = 1024
	maxSigLen  = 1024
	MaxMessage = 1024 // longest status message
)

// WriteField writes p with a two-byte length prefix.
func WriteField(w io.Writer, p []byte) error {
	var n [2]byte
	binary.BigEndian.PutUint16(n[:], uint16(len(p)))
	if _, err := w.Write(append(n[:], p...)); err != nil {
		return err
	}
	return nil
}

// ReadField reads a length-prefixed field of at most max bytes.
func ReadField(r io.Reader, max int) ([]byte, error) {
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	l := int(binary.BigEndian.Uint16(n[:]))
	if l > max {
		return nil, fmt.Errorf("%w: handshake field of %d bytes (max %d)", fabric.ErrBadRequest, l, max)
	}
	p := make([]byte, l)
	_, err := io.ReadFull(r, p)
	return p, err
}

func publicKeyOf(raw []byte) (crypto.PubKey, peer.ID, error) {
	pub, err := crypto.UnmarshalPublicKey(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%w: bad public key: %v", fabric.ErrUnauthorized, err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", fabric.ErrUnauthorized, err)
	}
	return pub, id, nil
}

// Client authenticates the server as want (when not empty) and
// proves our identity to it.
func Client(rw io.ReadWriter, key crypto.PrivKey, want peer.ID) (peer.ID, error) {
	res, err := ClientWith(rw, key, want, Options{})
	return res.Peer, err
}

// Server authenticates the client and asks authorize whether it may
// use the data service.
func Server(rw io.ReadWriter, key crypto.PrivKey, authorize func(peer.ID) error) (peer.ID, error) {
	res, err := ServerWith(rw, key, authorize, Options{})
	return res.Peer, err
}

// WriteStatus writes a status code and its message.
func WriteStatus(w io.Writer, code byte, msg string) error {
	if _, err := w.Write([]byte{code}); err != nil {
		return err
	}
	return WriteField(w, []byte(msg))
}

// Wire status codes.
const (
	StatusOK byte = iota
	StatusNotFound
	StatusFreed
	StatusStale
	StatusUnauthorized
	StatusBadRequest
	StatusInternal
	StatusClosing // the owner is shutting down (fabric.ErrOwnerClosed)
	StatusBusy    // the sink takes no writes yet (fabric.ErrSinkBusy)
)

// StatusFor maps an error to the status code that carries it over the wire.
func StatusFor(err error) byte {
	switch {
	case errors.Is(err, fabric.ErrObjectNotFound):
		return StatusNotFound
	case errors.Is(err, fabric.ErrObjectFreed):
		return StatusFreed
	case errors.Is(err, fabric.ErrStaleRef):
		return StatusStale
	case errors.Is(err, fabric.ErrUnauthorized):
		return StatusUnauthorized
	case errors.Is(err, fabric.ErrBadRequest):
		return StatusBadRequest
	case errors.Is(err, fabric.ErrOwnerClosed), errors.Is(err, fabric.ErrClosed):
		// A transport of the owner that is closed is the owner shutting
		// down; the reader must learn that, not an internal error.
		return StatusClosing
	case errors.Is(err, fabric.ErrSinkBusy):
		return StatusBusy
	}
	return StatusInternal
}

// ItemError is the typed error of one item of a batch answer: nil for
// StatusOK, else StatusError(code, msg). Each item of a batch fails on its
// own, with the status its owner gave it.
func ItemError(code byte, msg string) error {
	if code == StatusOK {
		return nil
	}
	return StatusError(code, msg)
}

// RemoteError is an error the owner reported for a request.
type RemoteError struct {
	Code    byte
	Message string
	kind    error
}

func (e *RemoteError) Error() string { return "owner: " + e.Message }
func (e *RemoteError) Unwrap() error { return e.kind }

// StatusError turns a status code and message from the owner back into an
// error that matches the fabric sentinel it stands for.
func StatusError(code byte, msg string) error {
	kind := map[byte]error{
		StatusNotFound: fabric.ErrObjectNotFound, StatusFreed: fabric.ErrObjectFreed,
		StatusStale: fabric.ErrStaleRef, StatusUnauthorized: fabric.ErrUnauthorized,
		StatusBadRequest: fabric.ErrBadRequest, StatusClosing: fabric.ErrOwnerClosed,
		StatusBusy: fabric.ErrSinkBusy,
	}[code]
	if kind == nil {
		kind = errors.New("fabric: owner internal error")
	}
	return &RemoteError{Code: code, Message: msg, kind: kind}
}
