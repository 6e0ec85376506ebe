package tensor

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// MaxDims bounds the rank of a tensor; it keeps decoded descriptors small.
const MaxDims = 16

// ErrBadDesc is returned for descriptors that do not describe a valid tensor.
var ErrBadDesc = errors.New("tensor: invalid descriptor")

// Desc describes a tensor's layout: element type, shape, strides and offset,
// both counted in elements as DLPack does. Strides must be non-negative.
type Desc struct {
	DType   DType
	Shape   []int64
	Strides []int64 // nil means contiguous row-major
	Offset  int64   // in elements, from the start of the buffer
}

// NewDesc returns a contiguous row-major descriptor.
func NewDesc(dt DType, shape ...int64) Desc {
	return Desc{DType: dt, Shape: append([]int64(nil), shape...), Strides: ContiguousStrides(shape)}
}

// ContiguousStrides returns row-major strides for shape.
func ContiguousStrides(shape []int64) []int64 {
	s := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// Validate checks dtype, rank, non-negative dims and strides, and that the
// byte span fits in int64.
func (d Desc) Validate() error {
	if !d.DType.Valid() {
		return fmt.Errorf("%w: dtype %v", ErrBadDesc, d.DType)
	}
	if len(d.Shape) > MaxDims {
		return fmt.Errorf("%w: rank %d > %d", ErrBadDesc, len(d.Shape), MaxDims)
	}
	if d.Strides != nil && len(d.Strides) != len(d.Shape) {
		return fmt.Errorf("%w: %d strides for %d dims", ErrBadDesc, len(d.Strides), len(d.Shape))
	}
	if d.Offset < 0 {
		return fmt.Errorf("%w: negative offset %d", ErrBadDesc, d.Offset)
	}
	n := uint64(1)
	for i, s := range d.Shape {
		if s < 0 {
			return fmt.Errorf("%w: negative dim %d", ErrBadDesc, s)
		}
		hi, lo := bits.Mul64(n, uint64(s))
		if hi != 0 || lo > math.MaxInt64 {
			return fmt.Errorf("%w: element count overflows", ErrBadDesc)
		}
		n = lo
		if d.Strides != nil && d.Strides[i] < 0 {
			return fmt.Errorf("%w: negative stride %d", ErrBadDesc, d.Strides[i])
		}
	}
	// The last element's index must fit, in bytes.
	last := uint64(d.Offset)
	if n > 0 {
		st := d.strides()
		for i, s := range d.Shape {
			hi, lo := bits.Mul64(uint64(s-1), uint64(st[i]))
			if hi != 0 {
				return fmt.Errorf("%w: extent overflows", ErrBadDesc)
			}
			var c uint64
			last, c = bits.Add64(last, lo, 0)
			if c != 0 || last > math.MaxInt64/16 {
				return fmt.Errorf("%w: extent overflows", ErrBadDesc)
			}
		}
	}
	return nil
}

func (d Desc) strides() []int64 {
	if d.Strides != nil {
		return d.Strides
	}
	return ContiguousStrides(d.Shape)
}

// NumElements is the product of the shape (1 for a scalar).
func (d Desc) NumElements() int64 {
	n := int64(1)
	for _, s := range d.Shape {
		n *= s
	}
	return n
}

// NBytes is the size of the tensor's elements in bytes, as if contiguous.
func (d Desc) NBytes() int64 { return d.NumElements() * d.DType.Size() }

// Contiguous reports whether the elements are dense and row-major.
func (d Desc) Contiguous() bool {
	if d.Strides == nil {
		return true
	}
	want := int64(1)
	for i := len(d.Shape) - 1; i >= 0; i-- {
		if d.Shape[i] != 1 && d.Strides[i] != want {
			return false
		}
		want *= d.Shape[i]
	}
	return true
}

// Span returns the byte range [start, end) of the buffer that the tensor's
// elements touch. An empty tensor has an empty span at its offset.
func (d Desc) Span() (start, end int64) {
	es := d.DType.Size()
	start = d.Offset * es
	if d.NumElements() == 0 {
		return start, start
	}
	last := d.Offset
	st := d.strides()
	for i, s := range d.Shape {
		last += (s - 1) * st[i]
	}
	return start, (last + 1) * es
}

// Rebased returns the descriptor moved so that its span starts at byte 0:
// the layout a reader gets when only the span is transferred.
func (d Desc) Rebased() Desc {
	out := d.Clone()
	out.Strides = d.strides()
	out.Offset = 0
	return out
}

// Clone returns a deep copy.
func (d Desc) Clone() Desc {
	out := d
	out.Shape = append([]int64(nil), d.Shape...)
	if d.Strides != nil {
		out.Strides = append([]int64(nil), d.Strides...)
	}
	return out
}

// Equal reports whether two descriptors describe the same layout.
func (d Desc) Equal(o Desc) bool {
	if d.DType != o.DType || d.Offset != o.Offset || len(d.Shape) != len(o.Shape) {
		return false
	}
	ds, os := d.strides(), o.strides()
	for i := range d.Shape {
		if d.Shape[i] != o.Shape[i] || ds[i] != os[i] {
			return false
		}
	}
	return true
}

// Slice narrows dimension dim to [start, end); the result shares memory.
func (d Desc) Slice(dim int, start, end int64) (Desc, error) {
	if dim < 0 || dim >= len(d.Shape) {
		return Desc{}, fmt.Errorf("%w: slice dim %d of rank %d", ErrBadDesc, dim, len(d.Shape))
	}
	if start < 0 || end < start || end > d.Shape[dim] {
		return Desc{}, fmt.Errorf("%w: slice [%d,%d) of dim size %d", ErrBadDesc, start, end, d.Shape[dim])
	}
	out := d.Clone()
	out.Strides = d.strides()
	out.Offset += start * out.Strides[dim]
	out.Shape[dim] = end - start
	return out, nil
}

func (d Desc) String() string {
	return fmt.Sprintf("%v%v", d.DType, d.Shape)
}
