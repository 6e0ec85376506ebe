package tensor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func inode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	return st.Ino
}

// TestSlabShares: allocations of one SlabMemory share a slab, exported
// read-only as the whole slab with each allocation's place in it; a
// writable handle is refused; a released range is reused without a new
// slab; an allocation larger than a slab gets one of its own.
func TestSlabShares(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	m, err := NewSlabMemory(SlabConfig{SlabSize: 1 << 20, Reserve: 2 << 20})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.WaitPopulated(context.Background()))
	require.EqualValues(t, 1, m.Slabs(), "the reserve is one slab")

	a, err := m.Alloc(ctx, 100)
	require.NoError(t, err)
	b, err := m.Alloc(ctx, 5000)
	require.NoError(t, err)
	pa, _ := BytesOf(a)
	pb, _ := BytesOf(b)
	copy(pa, "object a")
	copy(pb, "object b")

	ha, err := ExportOf(a, ReadOnly)
	require.NoError(t, err)
	defer unix.Close(ha.FD)
	hb, err := ExportOf(b, ReadOnly)
	require.NoError(t, err)
	defer unix.Close(hb.FD)
	assert.True(t, ha.Slab && hb.Slab)
	assert.Equal(t, inode(t, ha.FD), inode(t, hb.FD), "one slab for both")
	assert.EqualValues(t, 2<<20, ha.Size)
	assert.EqualValues(t, 100, ha.Length)
	assert.Zero(t, ha.Offset%pageSize)
	assert.Zero(t, hb.Offset%pageSize)
	assert.NotEqual(t, ha.Offset, hb.Offset)
	got := make([]byte, 8)
	_, err = unix.Pread(hb.FD, got, hb.Offset)
	require.NoError(t, err)
	assert.Equal(t, "object b", string(got))

	_, err = ExportOf(a, Writable)
	assert.ErrorIs(t, err, ErrExportAccess)
	_, err = unix.Mmap(ha.FD, 0, int(ha.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	assert.Error(t, err, "a slab handle maps writable")

	// The released range goes to the next allocation that fits, with
	// its bytes (reuse within the scope), and no slab is created.
	off := ha.Offset
	require.NoError(t, a.Release())
	require.NoError(t, a.Release(), "idempotent")
	c, err := m.Alloc(ctx, 200)
	require.NoError(t, err)
	hc, err := ExportOf(c, ReadOnly)
	require.NoError(t, err)
	unix.Close(hc.FD)
	assert.Equal(t, off, hc.Offset)
	assert.EqualValues(t, 1, m.Slabs())

	big, err := m.Alloc(ctx, 3<<20)
	require.NoError(t, err)
	hbig, err := ExportOf(big, ReadOnly)
	require.NoError(t, err)
	unix.Close(hbig.FD)
	assert.EqualValues(t, 3<<20, hbig.Size)
	assert.EqualValues(t, 2, m.Slabs())
	s := m.Stats()
	assert.Equal(t, 3, s.Allocs)
	require.NoError(t, big.Release())
	require.NoError(t, b.Release())
	require.NoError(t, c.Release())
	assert.Zero(t, m.Stats().Used)
	require.NoError(t, m.Close())
	_, err = m.Alloc(ctx, 1)
	assert.ErrorIs(t, err, ErrClosed)
}

// TestSlabCapacity: a bounded SlabMemory refuses what does not fit with an
// OutOfMemoryError, and makes room from wholly free slabs.
func TestSlabCapacity(t *testing.T) {
	ctx := context.Background()
	m, err := NewSlabMemory(SlabConfig{SlabSize: 1 << 20, Capacity: 2 << 20})
	require.NoError(t, err)
	defer m.Close()
	a, err := m.Alloc(ctx, 1<<20)
	require.NoError(t, err)
	b, err := m.Alloc(ctx, 1<<20)
	require.NoError(t, err)
	_, err = m.Alloc(ctx, 1)
	assert.ErrorIs(t, err, ErrOutOfMemory)
	require.NoError(t, a.Release())
	require.NoError(t, b.Release())
	c, err := m.Alloc(ctx, 2<<20)
	require.NoError(t, err, "free slabs make room")
	require.NoError(t, c.Release())
	_, err = NewSlabMemory(SlabConfig{Reserve: 4 << 20, Capacity: 2 << 20})
	assert.Error(t, err)
}

// TestSlabViewShare: a whole view of a slab buffer (through Shared.Window,
// as the C ABI publishes tensorlane.empty arrays) is exported in place, no
// private copy.
func TestSlabViewShare(t *testing.T) {
	m, err := NewSlabMemory(SlabConfig{SlabSize: 1 << 20})
	require.NoError(t, err)
	defer m.Close()
	buf, err := m.Alloc(context.Background(), 4096)
	require.NoError(t, err)
	sh := NewShared(buf)
	w, err := sh.Window(0, 4096)
	require.NoError(t, err)
	v := NewViewShare(m, w, 0, 4096)
	h, staged, err := v.Export(ReadOnly)
	require.NoError(t, err)
	unix.Close(h.FD)
	assert.Zero(t, staged)
	assert.True(t, h.Slab)
	assert.False(t, h.Copy)
	assert.EqualValues(t, 4096, h.Length)
	v.Release()
	w.Release()
	sh.Release()
	assert.Zero(t, m.Stats().Used)
}

// TestSlabKeep: a range a reader's view holds is not reused after its
// buffer is released, until the hold goes.
func TestSlabKeep(t *testing.T) {
	ctx := context.Background()
	m, err := NewSlabMemory(SlabConfig{SlabSize: 1 << 20})
	require.NoError(t, err)
	defer m.Close()
	a, err := m.Alloc(ctx, 4096)
	require.NoError(t, err)
	h, err := ExportOf(a, ReadOnly)
	require.NoError(t, err)
	unix.Close(h.FD)
	require.NotNil(t, h.Keep)
	release := h.Keep()
	assert.EqualValues(t, 4096, m.Held())
	require.NoError(t, a.Release())
	assert.Zero(t, m.Stats().Used, "the allocation is gone")
	b, err := m.Alloc(ctx, 4096)
	require.NoError(t, err)
	hb, err := ExportOf(b, ReadOnly)
	require.NoError(t, err)
	unix.Close(hb.FD)
	assert.NotEqual(t, h.Offset, hb.Offset, "a held range was reused")
	release()
	release() // once
	assert.Zero(t, m.Held())
	c, err := m.Alloc(ctx, 4096)
	require.NoError(t, err)
	hc, err := ExportOf(c, ReadOnly)
	require.NoError(t, err)
	unix.Close(hc.FD)
	assert.Equal(t, h.Offset, hc.Offset, "the range is free again")
	b.Release()
	c.Release()
}

// TestSlabToPopulate: each chunk is populated once for the slab's life.
func TestSlabToPopulate(t *testing.T) {
	s := &slab{seg: &segment{data: make([]byte, 9*popChunk)}, populated: make([]uint64, 1)}
	for _, c := range []struct{ off, n, start, end int64 }{
		{0, 1, 0, popChunk},
		{100, popChunk, popChunk, 2 * popChunk}, // chunk 0 done already
		{0, 2 * popChunk, 0, 0},
		{8*popChunk + 5, 10, 8 * popChunk, 9 * popChunk},
		{3 * popChunk, 3 * popChunk, 3 * popChunk, 6 * popChunk},
	} {
		start, end := s.toPopulate(c.off, c.n)
		assert.Equal(t, [2]int64{c.start, c.end}, [2]int64{start, end}, "[%d,+%d)", c.off, c.n)
	}
}
