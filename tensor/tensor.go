package tensor

import (
	"context"
	"errors"
	"fmt"
)

// ErrTooSmall is returned when a buffer cannot hold a tensor's span.
var ErrTooSmall = errors.New("tensor: buffer too small")

// Tensor is a view of device memory: a descriptor over a buffer. Views made
// by Slice share the buffer; Release releases the buffer for all of them.
type Tensor struct {
	desc Desc
	buf  Buffer
}

// New wraps buf in a tensor with layout d, checking that d's span fits.
func New(buf Buffer, d Desc) (Tensor, error) {
	if buf == nil {
		return Tensor{}, fmt.Errorf("%w: nil buffer", ErrBadDesc)
	}
	if err := d.Validate(); err != nil {
		return Tensor{}, err
	}
	if _, end := d.Span(); end > buf.Len() {
		return Tensor{}, fmt.Errorf("%w: %v needs %d bytes, buffer on %v has %d", ErrTooSmall, d, end, buf.Device(), buf.Len())
	}
	return Tensor{desc: d.Clone(), buf: buf}, nil
}

// Alloc allocates a contiguous row-major tensor of the given dtype and
// shape in mem.
func Alloc(ctx context.Context, mem Memory, dt DType, shape ...int64) (Tensor, error) {
	d := NewDesc(dt, shape...)
	if err := d.Validate(); err != nil {
		return Tensor{}, err
	}
	buf, err := mem.Alloc(ctx, d.NBytes())
	if err != nil {
		return Tensor{}, err
	}
	return Tensor{desc: d, buf: buf}, nil
}

// Desc returns the tensor's layout.
func (t Tensor) Desc() Desc { return t.desc.Clone() }

// Buffer returns the memory under the tensor.
func (t Tensor) Buffer() Buffer { return t.buf }

// Device returns the device the tensor lives on.
func (t Tensor) Device() DeviceID {
	if t.buf == nil {
		return DeviceID{}
	}
	return t.buf.Device()
}

// Valid reports whether the tensor has a buffer.
func (t Tensor) Valid() bool { return t.buf != nil }

// SpanBytes returns the host-visible bytes that the tensor's elements touch.
func (t Tensor) SpanBytes() ([]byte, error) {
	if t.buf == nil {
		return nil, fmt.Errorf("%w: empty tensor", ErrBadDesc)
	}
	p, err := BytesOf(t.buf)
	if err != nil {
		return nil, err
	}
	start, end := t.desc.Span()
	return p[start:end:end], nil
}

// Slice narrows dimension dim to [start, end); the result shares memory.
func (t Tensor) Slice(dim int, start, end int64) (Tensor, error) {
	d, err := t.desc.Slice(dim, start, end)
	if err != nil {
		return Tensor{}, err
	}
	return Tensor{desc: d, buf: t.buf}, nil
}

// Release releases the tensor's buffer (and so every view of it).
func (t Tensor) Release() error {
	if t.buf == nil {
		return nil
	}
	return t.buf.Release()
}

func (t Tensor) String() string { return fmt.Sprintf("%v on %v", t.desc, t.Device()) }
