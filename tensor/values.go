package tensor

import (
	"fmt"
	"math"
	"unsafe"
)

// Typed element access without a copy: Values returns a tensor's elements
// as a Go slice that aliases its host-visible memory, so reading float32
// weights needs neither SpanBytes nor encoding/binary. Elements are in the
// machine's byte order, as DLPack and every accelerator runtime keep them.

// F16 is an IEEE 754 half-precision value (dtype float16), as stored.
type F16 uint16

// BF16 is a bfloat16 value (dtype bfloat16), as stored: the top half of a
// float32.
type BF16 uint16

// Element is a Go type that Values can view a dtype as.
type Element interface {
	bool | int8 | int16 | int32 | int64 | uint8 | float32 | float64 | F16 | BF16
}

// DTypeOf is the dtype a Go element type views.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case bool:
		return Bool
	case int8:
		return Int8
	case int16:
		return Int16
	case int32:
		return Int32
	case int64:
		return Int64
	case uint8:
		return Uint8
	case float32:
		return Float32
	case float64:
		return Float64
	case F16:
		return Float16
	case BF16:
		return BFloat16
	}
	return Invalid // unreachable: Element lists exactly the types above
}

// Values returns t's elements as a []T sharing t's memory (writes go to the
// tensor), in row-major order. T must match t's dtype exactly (float32 for
// Float32, BF16 for BFloat16, ...); the tensor must be contiguous and in
// host-visible memory. The slice is valid until t is released.
func Values[T Element](t Tensor) ([]T, error) {
	want := DTypeOf[T]()
	if want == Invalid {
		var z T
		return nil, fmt.Errorf("%w: no dtype for Go type %T", ErrBadDesc, z)
	}
	if t.desc.DType != want {
		return nil, fmt.Errorf("%w: tensor is %v, asked for %v", ErrBadDesc, t.desc.DType, want)
	}
	if !t.desc.Contiguous() {
		return nil, fmt.Errorf("%w: tensor %v is not contiguous; Values views contiguous tensors only", ErrBadDesc, t.desc)
	}
	p, err := t.SpanBytes()
	if err != nil {
		return nil, err
	}
	n := t.desc.NumElements()
	if n == 0 {
		return []T{}, nil
	}
	size := int64(unsafe.Sizeof(*new(T)))
	if int64(len(p)) < n*size {
		return nil, fmt.Errorf("%w: %d bytes for %d elements of %d", ErrBadDesc, len(p), n, size)
	}
	ptr := unsafe.Pointer(unsafe.SliceData(p))
	if uintptr(ptr)%uintptr(size) != 0 {
		return nil, fmt.Errorf("%w: tensor data at offset %d is not aligned for %v", ErrBadDesc, t.desc.Offset, want)
	}
	return unsafe.Slice((*T)(ptr), n), nil
}

// Float32 converts a bfloat16 to float32 (exact).
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// ToBF16 rounds a float32 to the nearest bfloat16 (ties to even; NaN stays
// NaN).
func ToBF16(f float32) BF16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and NaN
		return BF16(u>>16 | 0x40)
	}
	u += 0x7fff + (u>>16)&1
	return BF16(u >> 16)
}

// Float32 converts a half-precision value to float32 (exact).
func (h F16) Float32() float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf, NaN
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 15 + 1)
		for frac&0x400 == 0 {
			frac <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (frac&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | frac<<13)
}

// ToF16 rounds a float32 to the nearest half-precision value (ties to
// even; overflow gives infinity).
func ToF16(f float32) F16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23&0xff) - 127 + 15
	frac := u & 0x7fffff
	switch {
	case u&0x7fffffff > 0x7f800000: // NaN
		return F16(sign | 0x7e00)
	case u&0x7fffffff == 0x7f800000 || exp >= 0x1f: // inf, overflow
		return F16(sign | 0x7c00)
	case exp <= 0: // subnormal or zero
		if exp < -10 {
			return F16(sign)
		}
		frac |= 0x800000
		shift := uint32(14 - exp)
		h := frac >> shift
		rem := frac & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return F16(sign | uint16(h))
	}
	h := uint32(exp)<<10 | frac>>13
	rem := frac & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, up to infinity: correct
	}
	return F16(sign | uint16(h))
}
