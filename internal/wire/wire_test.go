package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	var e Encoder
	e.Byte(7)
	e.Uvarint(300)
	e.Varint(-5)
	e.Uint64(1 << 40)
	e.Bytes([]byte("abc"))
	e.String("hello")
	e.Fixed([]byte{1, 2})
	e.Uvarint(3)
	d := NewDecoder(e.Buf)
	assert.Equal(t, byte(7), d.Byte())
	assert.Equal(t, uint64(300), d.Uvarint())
	assert.Equal(t, int64(-5), d.Varint())
	assert.Equal(t, uint64(1<<40), d.Uint64())
	assert.Equal(t, []byte("abc"), d.Bytes(10))
	assert.Equal(t, "hello", d.String(10))
	var f [2]byte
	d.Fixed(f[:])
	assert.Equal(t, [2]byte{1, 2}, f)
	assert.Equal(t, 3, d.Count(3))
	require.NoError(t, d.Finish())
}

func TestLimitsAndTruncation(t *testing.T) {
	var e Encoder
	e.Bytes(make([]byte, 100))
	assert.ErrorIs(t, func() error { d := NewDecoder(e.Buf); d.Bytes(99); return d.Err() }(), ErrMalformed)
	assert.ErrorIs(t, func() error { d := NewDecoder(e.Buf[:50]); d.Bytes(100); return d.Err() }(), ErrMalformed)
	assert.ErrorIs(t, func() error { d := NewDecoder([]byte{5}); d.Count(4); return d.Err() }(), ErrMalformed)
	assert.ErrorIs(t, func() error { d := NewDecoder([]byte{1, 2}); d.Byte(); return d.Finish() }(), ErrMalformed)
	d := NewDecoder(nil)
	d.Byte()
	d.Uint64()
	assert.Equal(t, uint64(0), d.Uvarint(), "reads after a failure return zero")
	assert.ErrorIs(t, d.Err(), ErrMalformed)
}

func FuzzDecoder(f *testing.F) {
	f.Add([]byte{1, 3, 'a', 'b', 'c'})
	f.Fuzz(func(t *testing.T, p []byte) {
		d := NewDecoder(p)
		d.Byte()
		d.Bytes(64)
		d.Count(8)
		d.Varint()
		d.Uint64()
		_ = d.Finish()
	})
}
