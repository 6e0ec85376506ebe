// Package wire holds the small binary encoding shared by tensorlane's
// references and control messages: unsigned varints, length-prefixed bytes
// and fixed-size fields, with a decoder that checks every bound and never
// panics on hostile input.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed is returned for truncated or inconsistent input.
var ErrMalformed = errors.New("wire: malformed input")

// Encoder appends fields to a byte slice.
type Encoder struct{ Buf []byte }

func (e *Encoder) Byte(b byte)      { e.Buf = append(e.Buf, b) }
func (e *Encoder) Uvarint(v uint64) { e.Buf = binary.AppendUvarint(e.Buf, v) }
func (e *Encoder) Varint(v int64)   { e.Buf = binary.AppendVarint(e.Buf, v) }
func (e *Encoder) Uint64(v uint64)  { e.Buf = binary.BigEndian.AppendUint64(e.Buf, v) }
func (e *Encoder) Fixed(p []byte)   { e.Buf = append(e.Buf, p...) }

// Bytes writes a length-prefixed byte string.
func (e *Encoder) Bytes(p []byte) {
	e.Uvarint(uint64(len(p)))
	e.Buf = append(e.Buf, p...)
}

// String writes a length-prefixed string.
func (e *Encoder) String(s string) {
	e.Uvarint(uint64(len(s)))
	e.Buf = append(e.Buf, s...)
}

// Decoder reads fields; the first failure sticks and later reads return
// zero values, so callers check Err once at the end.
type Decoder struct {
	buf []byte
	err error
}

// NewDecoder decodes p.
func NewDecoder(p []byte) *Decoder { return &Decoder{buf: p} }

// Err returns the first decoding error.
func (d *Decoder) Err() error { return d.err }

// Remaining is the number of unread bytes.
func (d *Decoder) Remaining() int { return len(d.buf) }

func (d *Decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
}

func (d *Decoder) Byte() byte {
	if d.err != nil || len(d.buf) < 1 {
		d.fail("truncated byte")
		return 0
	}
	b := d.buf[0]
	d.buf = d.buf[1:]
	return b
}

func (d *Decoder) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *Decoder) Varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *Decoder) Uint64() uint64 {
	if d.err != nil || len(d.buf) < 8 {
		d.fail("truncated uint64")
		return 0
	}
	v := binary.BigEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v
}

// Fixed reads exactly len(p) bytes into p.
func (d *Decoder) Fixed(p []byte) {
	if d.err != nil || len(d.buf) < len(p) {
		d.fail("truncated field")
		return
	}
	copy(p, d.buf)
	d.buf = d.buf[len(p):]
}

// Bytes reads a length-prefixed byte string of at most max bytes. The result
// is a copy.
func (d *Decoder) Bytes(max int) []byte {
	n := d.Uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(max) || n > uint64(len(d.buf)) {
		d.fail(fmt.Sprintf("byte string of %d bytes (max %d, have %d)", n, max, len(d.buf)))
		return nil
	}
	p := append([]byte(nil), d.buf[:n]...)
	d.buf = d.buf[n:]
	return p
}

// String reads a length-prefixed string of at most max bytes.
func (d *Decoder) String(max int) string { return string(d.Bytes(max)) }

// Count reads a varint element count and checks it against max.
func (d *Decoder) Count(max int) int {
	n := d.Uvarint()
	if d.err == nil && n > uint64(max) {
		d.fail(fmt.Sprintf("count %d over limit %d", n, max))
		return 0
	}
	return int(n)
}

// Finish fails if unread bytes remain.
func (d *Decoder) Finish() error {
	if d.err == nil && len(d.buf) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.buf)))
	}
	return d.err
}
