package testhelp

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// Memories is what Fill allocates from: anything that hands out a
// device's memory by ID, such as *rdt.Runtime.
type Memories interface {
	Memory(dev tensor.DeviceID) (tensor.Memory, error)
}

// Fill allocates a tensor of the given type and shape on dev and fills it
// with a pattern that differs from byte to byte and from page to page, so a
// misplaced or missing chunk shows in SameBytes.
func Fill(t testing.TB, m Memories, dev tensor.DeviceID, dt tensor.DType, shape ...int64) tensor.Tensor {
	t.Helper()
	mem, err := m.Memory(dev)
	require.NoError(t, err)
	x, err := tensor.Alloc(context.Background(), mem, dt, shape...)
	require.NoError(t, err)
	p, err := x.SpanBytes()
	require.NoError(t, err)
	pattern(p)
	return x
}

// pattern writes bytes that differ between nearby positions.
// norace: the tensor is fresh and not shared yet, and checking each
// one-byte store made filling a large tensor cost seconds under -race.
//
//go:norace
func pattern(p []byte) {
	for i := range p {
		p[i] = byte(i*31 + i>>11)
	}
}

// SameBytes fails the test unless a and b hold the same bytes.
func SameBytes(t testing.TB, a, b tensor.Tensor) {
	t.Helper()
	pa, err := a.SpanBytes()
	require.NoError(t, err)
	pb, err := b.SpanBytes()
	require.NoError(t, err)
	require.True(t, bytes.Equal(pa, pb), "bytes differ")
}
