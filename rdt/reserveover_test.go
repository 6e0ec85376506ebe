package rdt

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestReserveOverLandsInPlace: a reader reserves slots over memory it owns
// (plain Go bytes, as a numpy array would be); a push from another host and
// a broadcast batch to two readers land in those bytes, with generations,
// and Close gives the buffer back. A buffer that does not fit the layout is
// refused, typed.
func TestReserveOverLandsInPlace(t *testing.T) {
	ctx := context.Background()
	only := func(c *Config) { c.Transports.Allow = []string{fabric.TCP} }
	rts := cluster(t, only, only, only)
	owner, _ := rts[0].Spawn("trainer")
	x := fill(t, rts[0], tensor.HostDevice, tensor.BFloat16, 64, 1024)
	y := fill(t, rts[0], tensor.HostDevice, tensor.Float32, 3, 333)
	xr, err := owner.Put(ctx, x)
	require.NoError(t, err)
	yr, err := owner.Put(ctx, y)
	require.NoError(t, err)

	type reader struct {
		mem   [][]byte
		slots []*Slot
	}
	var readers []reader
	var slotRefs [][]Ref
	for i := 1; i < 3; i++ {
		a, _ := rts[i].Spawn("engine")
		var rd reader
		var refs []Ref
		for _, src := range []Ref{xr, yr} {
			mem := make([]byte, spanBytes(src.Desc))
			s, err := a.ReserveOver(ctx, tensor.NewForeign(mem, tensor.ForeignConfig{}), src.Desc, WithGenerations())
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			rd.mem, rd.slots, refs = append(rd.mem, mem), append(rd.slots, s), append(refs, s.Ref())
		}
		readers, slotRefs = append(readers, rd), append(slotRefs, refs)
	}
	wantX, _ := tensor.BytesOf(x.Buffer())
	wantY, _ := tensor.BytesOf(y.Buffer())

	// A push into reader 0's first slot.
	_, err = owner.Push(ctx, xr, slotRefs[0][0])
	require.NoError(t, err)
	gen, _, err := readers[0].slots[0].Wait(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), gen)
	assert.True(t, bytes.Equal(wantX, readers[0].mem[0]), "the push landed in the reader's own bytes")
	require.NoError(t, readers[0].slots[0].Done(ctx, 1))

	// A broadcast batch of both objects to both readers.
	res, err := owner.BroadcastBatch(ctx, []Ref{xr, yr}, slotRefs, BroadcastConfig{ChunkSize: 64 << 10})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	for j, rd := range readers {
		for k, want := range [][]byte{wantX, wantY} {
			_, _, err := rd.slots[k].Wait(ctx, 0)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, rd.mem[k]), "reader %d object %d", j, k)
		}
	}

	// A buffer of the wrong size is refused.
	a, _ := rts[1].Spawn("wrong")
	_, err = a.ReserveOver(ctx, tensor.NewForeign(make([]byte, 10), tensor.ForeignConfig{}), xr.Desc)
	assert.ErrorIs(t, err, tensor.ErrTooSmall)
	_, err = a.ReserveOver(ctx, nil, xr.Desc)
	assert.ErrorIs(t, err, tensor.ErrBadDesc)
	// Close releases the buffer once (idempotent).
	f := tensor.NewForeign(make([]byte, spanBytes(yr.Desc)), tensor.ForeignConfig{})
	s, err := a.ReserveOver(ctx, f, yr.Desc)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err = owner.Push(ctx, yr, s.Ref())
	assert.ErrorIs(t, err, ErrObjectNotFound)
}
