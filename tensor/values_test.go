package tensor

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValuesAliasesMemory(t *testing.T) {
	ctx := context.Background()
	gpu, err := NewSimMemory(GPUDevice(0), 1<<20)
	require.NoError(t, err)
	defer gpu.Close()
	x, err := Alloc(ctx, gpu, Float32, 4, 3)
	require.NoError(t, err)
	defer x.Release()
	v, err := Values[float32](x)
	require.NoError(t, err)
	require.Len(t, v, 12)
	v[5] = 2.5
	p, _ := x.SpanBytes()
	assert.Equal(t, float32(2.5), math.Float32frombits(binary.NativeEndian.Uint32(p[20:])), "no copy: writes reach the tensor")

	row, err := x.Slice(0, 1, 3) // rows 1..2: contiguous, offset 3 elements
	require.NoError(t, err)
	rv, err := Values[float32](row)
	require.NoError(t, err)
	assert.Len(t, rv, 6)
	assert.Equal(t, float32(2.5), rv[2])

	col, err := x.Slice(1, 0, 1) // a column: strided
	require.NoError(t, err)
	_, err = Values[float32](col)
	assert.ErrorIs(t, err, ErrBadDesc)
	_, err = Values[int32](x)
	assert.ErrorIs(t, err, ErrBadDesc, "dtype must match")
	_, err = Values[float32](Tensor{})
	assert.ErrorIs(t, err, ErrBadDesc)
}

func TestValuesEveryDType(t *testing.T) {
	ctx := context.Background()
	host := NewHostMemory(0)
	defer host.Close()
	check := func(dt DType, view func(Tensor) (int, error)) {
		x, err := Alloc(ctx, host, dt, 7)
		require.NoError(t, err)
		defer x.Release()
		n, err := view(x)
		require.NoError(t, err, "%v", dt)
		assert.Equal(t, 7, n, "%v", dt)
	}
	n := func(s int, err error) (int, error) { return s, err }
	check(Bool, func(x Tensor) (int, error) { v, err := Values[bool](x); return n(len(v), err) })
	check(Int8, func(x Tensor) (int, error) { v, err := Values[int8](x); return n(len(v), err) })
	check(Int16, func(x Tensor) (int, error) { v, err := Values[int16](x); return n(len(v), err) })
	check(Int32, func(x Tensor) (int, error) { v, err := Values[int32](x); return n(len(v), err) })
	check(Int64, func(x Tensor) (int, error) { v, err := Values[int64](x); return n(len(v), err) })
	check(Uint8, func(x Tensor) (int, error) { v, err := Values[uint8](x); return n(len(v), err) })
	check(Float16, func(x Tensor) (int, error) { v, err := Values[F16](x); return n(len(v), err) })
	check(BFloat16, func(x Tensor) (int, error) { v, err := Values[BF16](x); return n(len(v), err) })
	check(Float32, func(x Tensor) (int, error) { v, err := Values[float32](x); return n(len(v), err) })
	check(Float64, func(x Tensor) (int, error) { v, err := Values[float64](x); return n(len(v), err) })
}

func TestHalfConversions(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		h    F16
		back float32
	}{
		{0, 0, 0}, {1, 0x3c00, 1}, {-2, 0xc000, -2}, {65504, 0x7bff, 65504}, {1e6, 0x7c00, float32(math.Inf(1))},
		{5.960464477539063e-08, 0x0001, 5.960464477539063e-08}, // smallest subnormal
		{1.0009765625, 0x3c01, 1.0009765625},
		{1.00048828125, 0x3c00, 1}, // a tie rounds to even
	} {
		assert.Equal(t, tc.h, ToF16(tc.f), "ToF16(%v)", tc.f)
		assert.Equal(t, tc.back, tc.h.Float32(), "%#x", uint16(tc.h))
	}
	assert.True(t, math.IsNaN(float64(ToF16(float32(math.NaN())).Float32())))
	for _, tc := range []struct {
		f    float32
		b    BF16
		back float32
	}{
		{1, 0x3f80, 1}, {-3.5, 0xc060, -3.5}, {1.00390625, 0x3f80, 1} /* tie to even */, {3.4e38, 0x7f80, float32(math.Inf(1))},
	} {
		assert.Equal(t, tc.b, ToBF16(tc.f), "ToBF16(%v)", tc.f)
		assert.Equal(t, tc.back, tc.b.Float32())
	}
	assert.True(t, math.IsNaN(float64(ToBF16(float32(math.NaN())).Float32())))
	// Every half value survives float32 and back.
	for h := range 1 << 16 {
		x := F16(h)
		if f := x.Float32(); !math.IsNaN(float64(f)) {
			require.Equal(t, x, ToF16(f), "%#x", h)
		}
	}
}

// Reading and writing a tensor's elements as Go values, without a copy.
func ExampleValues() {
	host := NewHostMemory(0)
	defer host.Close()
	w, _ := Alloc(context.Background(), host, BFloat16, 2, 3)
	defer w.Release()
	vals, _ := Values[BF16](w)
	for i := range vals {
		vals[i] = ToBF16(float32(i) / 2)
	}
	fmt.Println(vals[5].Float32(), DTypeOf[BF16]())
	_, err := Values[float32](w)
	fmt.Println(err)
	// Output:
	// 2.5 bfloat16
	// tensor: invalid descriptor: tensor is bfloat16, asked for float32
}
