package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// ObjectChunk is the size of one message of the serialize baseline: Ray's
// object manager moves objects in 5 MiB chunks (object_manager_default_chunk_size).
const ObjectChunk = 5 << 20

// ErrBadMessage is a serialize-baseline message that does not parse, or
// that names bytes outside the object being moved.
var ErrBadMessage = errors.New("bench: malformed object message")

// Fields of the chunk message, in protobuf wire format: what an object
// store's push request carries (Ray's PushRequest: object id, chunk index
// and offset, total size, data).
const (
	fieldObject = 1
	fieldOffset = 2
	fieldTotal  = 3
	fieldData   = 4
)

// gRPC frames every message with one flag byte and a 4-byte big-endian
// length; the baseline frames its messages the same way.
const frameHeader = 5

// objectID is the id every baseline message carries (its value does not
// matter, its bytes on the wire do).
var objectID = [16]byte{'t', 'e', 'n', 's', 'o', 'r', 'l', 'a', 'n', 'e', '-', 'b', 'e', 'n', 'c', 'h'}

// appendChunk serializes one chunk of an object (copying data, as a
// serializer does) into a framed message appended to msg.
func appendChunk(msg []byte, off, total int64, data []byte) []byte {
	start := len(msg)
	msg = append(msg, make([]byte, frameHeader)...)
	msg = protowire.AppendTag(msg, fieldObject, protowire.BytesType)
	msg = protowire.AppendBytes(msg, objectID[:])
	msg = protowire.AppendTag(msg, fieldOffset, protowire.VarintType)
	msg = protowire.AppendVarint(msg, uint64(off))
	msg = protowire.AppendTag(msg, fieldTotal, protowire.VarintType)
	msg = protowire.AppendVarint(msg, uint64(total))
	msg = protowire.AppendTag(msg, fieldData, protowire.BytesType)
	msg = protowire.AppendBytes(msg, data)
	binary.BigEndian.PutUint32(msg[start+1:], uint32(len(msg)-start-frameHeader))
	return msg
}

// maxMessage bounds a message's body: one chunk and its fields.
const maxMessage = ObjectChunk + 64

// applyChunk deserializes one message body into dst (the object being
// rebuilt) and returns the number of bytes it placed.
func applyChunk(dst []byte, body []byte) (int, error) {
	var off, total uint64
	var data []byte
	var haveOff, haveTotal, haveData bool
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 {
			return 0, fmt.Errorf("%w: tag: %v", ErrBadMessage, protowire.ParseError(n))
		}
		body = body[n:]
		switch {
		case num == fieldOffset && typ == protowire.VarintType:
			off, n = protowire.ConsumeVarint(body)
			haveOff = true
		case num == fieldTotal && typ == protowire.VarintType:
			total, n = protowire.ConsumeVarint(body)
			haveTotal = true
		case num == fieldData && typ == protowire.BytesType:
			data, n = protowire.ConsumeBytes(body)
			haveData = true
		default:
			n = protowire.ConsumeFieldValue(num, typ, body)
		}
		if n < 0 {
			return 0, fmt.Errorf("%w: field %d: %v", ErrBadMessage, num, protowire.ParseError(n))
		}
		body = body[n:]
	}
	switch {
	case !haveOff || !haveTotal || !haveData:
		return 0, fmt.Errorf("%w: a chunk needs an offset, a total and data", ErrBadMessage)
	case total != uint64(len(dst)):
		return 0, fmt.Errorf("%w: object of %d bytes, reader expects %d", ErrBadMessage, total, len(dst))
	case off > total || uint64(len(data)) > total-off:
		return 0, fmt.Errorf("%w: chunk [%d,+%d) outside an object of %d bytes", ErrBadMessage, off, len(data), total)
	}
	return copy(dst[off:], data), nil
}

// Serializer is the object-store baseline on one host: every transfer
// serializes the object into chunk messages (a copy) and deserializes them
// into the destination (a second copy), as putting a tensor into a
// same-host object store and getting it back out does. Its buffer is
// reused, like a store's pre-mapped arena, so the baseline is the generous
// one: two copies and the framing, no allocation or page faults.
type Serializer struct {
	src []byte
	msg []byte
}

// NewSerializer returns the same-host serialize baseline for src.
func NewSerializer(src []byte) *Serializer {
	return &Serializer{src: src, msg: make([]byte, 0, frameHeader+maxMessage)}
}

// Read moves len(dst) bytes of src into dst through serialized messages.
func (s *Serializer) Read(dst []byte) (time.Duration, error) {
	start := time.Now()
	n := int64(len(dst))
	if n > int64(len(s.src)) {
		return 0, fmt.Errorf("bench: %d bytes asked of a %d-byte source", n, len(s.src))
	}
	for off := int64(0); off < n; off += ObjectChunk {
		end := min(off+ObjectChunk, n)
		s.msg = appendChunk(s.msg[:0], off, n, s.src[off:end])
		if _, err := applyChunk(dst, s.msg[frameHeader:]); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// SerializePair is the object-store baseline between hosts: the sender
// serializes each chunk into a framed protobuf message (a copy), writes it
// to a loopback TCP socket, and the receiver reads the whole message and
// deserializes its data into the destination (a second copy), the way an
// object store moves an object through an RPC channel. Buffers are reused
// on both sides, as in Serializer.
type SerializePair struct {
	*loopback
	body []byte
}

// NewSerializePair connects a loopback socket pair whose server side sends
// src as serialized chunk messages.
func NewSerializePair(src []byte) (*SerializePair, error) {
	msg := make([]byte, 0, frameHeader+maxMessage)
	l, err := newLoopback(func(c net.Conn, n int) error {
		total := int64(n)
		for off := int64(0); off < total; off += ObjectChunk {
			end := min(off+ObjectChunk, total)
			msg = appendChunk(msg[:0], off, total, src[off:end])
			if _, err := c.Write(msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &SerializePair{loopback: l, body: make([]byte, maxMessage)}, nil
}

// Read moves len(dst) bytes from the server side into dst.
func (p *SerializePair) Read(dst []byte) (time.Duration, error) {
	start := time.Now()
	if err := p.request(len(dst)); err != nil {
		return 0, err
	}
	var hdr [frameHeader]byte
	for got := 0; got < len(dst); {
		if _, err := io.ReadFull(p.client, hdr[:]); err != nil {
			return 0, err
		}
		size := binary.BigEndian.Uint32(hdr[1:])
		if hdr[0] != 0 || size > maxMessage {
			return 0, fmt.Errorf("%w: frame flag %d, length %d (limit %d)", ErrBadMessage, hdr[0], size, maxMessage)
		}
		body := p.body[:size]
		if _, err := io.ReadFull(p.client, body); err != nil {
			return 0, err
		}
		n, err := applyChunk(dst, body)
		if err != nil {
			return 0, err
		}
		got += n
	}
	return time.Since(start), nil
}
