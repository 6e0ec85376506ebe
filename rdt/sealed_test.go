package rdt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/tensor"
)

// ownerSums reads the owner's tcp checksum counters by source.
func ownerSums(t *testing.T, r *Runtime) (cached, stored, computed float64) {
	return sumsIn(t, r, "tensorlane_tcp_owner_checksums_total")
}

// sumsIn reads one of the tcp checksum counters by source.
func sumsIn(t *testing.T, r *Runtime, name string) (cached, stored, computed float64) {
	t.Helper()
	mfs, err := r.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			switch m.GetLabel()[0].GetValue() {
			case "cached":
				cached = v
			case "stored":
				stored = v
			case "computed":
				computed = v
			}
		}
	}
	return
}

// TestSealedPutCachesChecksums: a sealed object's tcp checksums are
// computed by its first read (or by the copy that made it, SealedWith)
// and served from the cache to every later reader; an object put without
// the seal is checksummed at every read.
func TestSealedPutCachesChecksums(t *testing.T) {
	ctx := context.Background()
	// Compression off: once the first read measured the link, auto may
	// compress the rest (the encoder's own checksums, not these counters).
	p := newPair(t, func(c *Config) { c.Transports.DisableRDMA, c.Transports.Compression = true, tcp.CompressOff })
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	far, err := p.b.Spawn("far")
	require.NoError(t, err)
	const size = 2<<20 + 4096 // nine blocks, the last short
	const blocks = 9
	read := func(ref Ref) {
		t.Helper()
		got, xfer, err := far.Fetch(ctx, ref, tensor.HostDevice)
		require.NoError(t, err)
		defer got.Release()
		require.Equal(t, fabric.TCP, xfer.Stats.Transport)
	}

	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, size)
	ref, err := owner.Put(ctx, x, Sealed())
	require.NoError(t, err)
	read(ref)
	cached, stored, computed := ownerSums(t, p.a)
	assert.Equal(t, [3]float64{0, blocks, 0}, [3]float64{cached, stored, computed}, "the first read computes and stores")
	read(ref)
	cached, stored, computed = ownerSums(t, p.a)
	assert.Equal(t, [3]float64{blocks, blocks, 0}, [3]float64{cached, stored, computed}, "the second is served from the cache")

	// Made by a copy that checksummed as it went: no read computes.
	y, sums := copySummed(t, p.a, size)
	yref, err := owner.Put(ctx, y, SealedWith(sums))
	require.NoError(t, err)
	read(yref)
	cached, stored, computed = ownerSums(t, p.a)
	assert.Equal(t, [3]float64{2 * blocks, blocks, 0}, [3]float64{cached, stored, computed})

	// Not sealed: computed at every read.
	z := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, size)
	zref, err := owner.Put(ctx, z)
	require.NoError(t, err)
	read(zref)
	read(zref)
	cached, stored, computed = ownerSums(t, p.a)
	assert.Equal(t, [3]float64{2 * blocks, blocks, 2 * blocks}, [3]float64{cached, stored, computed})

	// Checksums of other bytes than the tensor's are refused.
	w := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, size)
	defer w.Release()
	_, err = owner.Put(ctx, w, SealedWith(tensor.NewChunkSums(0, size-1)))
	assert.ErrorIs(t, err, tensor.ErrBadDesc)
}

// TestSealedPushSendsCachedChecksums: pushing a sealed object to a slot on
// another host sends its cached checksums; the slot gets the bytes.
func TestSealedPushSendsCachedChecksums(t *testing.T) {
	ctx := context.Background()
	// Compression off: once the first read measured the link, auto may
	// compress the rest (the encoder's own checksums, not these counters).
	p := newPair(t, func(c *Config) { c.Transports.DisableRDMA, c.Transports.Compression = true, tcp.CompressOff })
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	far, err := p.b.Spawn("far")
	require.NoError(t, err)
	const size = 2<<20 + 4096
	x, sums := copySummed(t, p.a, size)
	ref, err := owner.Put(ctx, x, SealedWith(sums))
	require.NoError(t, err)
	slot, err := far.Reserve(ctx, x.Desc(), tensor.HostDevice)
	require.NoError(t, err)
	defer slot.Close()
	xfer, err := owner.Push(ctx, ref, slot.Ref())
	require.NoError(t, err)
	require.Equal(t, fabric.TCP, xfer.Stats.Transport)
	_, got, err := slot.Wait(ctx, 0)
	require.NoError(t, err)
	sameBytes(t, x, got) // x holds what was copied from the filled source
	cached, stored, computed := sumsIn(t, p.a, "tensorlane_tcp_push_checksums_total")
	assert.Equal(t, [3]float64{9, 0, 0}, [3]float64{cached, stored, computed})
}

// copySummed makes a tensor of size filled bytes on rt's GPU 0 by a copy
// that checksums each block as it goes (tensor.ChunkSums.Copy), as a
// publisher that seals what it copied would.
func copySummed(t *testing.T, rt *Runtime, size int64) (tensor.Tensor, *tensor.ChunkSums) {
	t.Helper()
	src := fill(t, rt, tensor.GPUDevice(0), tensor.Uint8, size)
	defer src.Release()
	mem, err := rt.Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	x, err := tensor.Alloc(context.Background(), mem, tensor.Uint8, size)
	require.NoError(t, err)
	sb, _ := src.SpanBytes()
	xb, _ := x.SpanBytes()
	sums := tensor.NewChunkSums(x.Desc().Span())
	sums.Copy(xb, sb)
	return x, sums
}
