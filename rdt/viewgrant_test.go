package rdt

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestViewGrantIsPrivateCopy (issue 13, item 1, views): a 16 KiB view in
// the middle of a 1 MiB buffer that holds a secret is Put, and read over
// shm and p2p by a runtime of the same host (descriptors passed over the
// real socket). The grant's descriptor (what the shm server passes, read
// whole with pread and mmap) holds the view's bytes alone: the owner staged
// a private copy once, counted it (object table, metrics, device memory)
// and returned it with the object. A whole-allocation object is granted as
// it is, with no copy. Before views were staged, the descriptor was the
// whole parent allocation.
func TestViewGrantIsPrivateCopy(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	c := sameHostRuntime(t, p, nil)
	owner, _ := p.a.Spawn("owner")
	reader, _ := c.Spawn("reader")
	mem, _ := p.a.Memory(tensor.GPUDevice(0))

	const size, start, n = 1 << 20, 512<<10 + 100, 16 << 10 // not page-aligned
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, size)
	parent, _ := x.SpanBytes()
	for i := range parent {
		parent[i] = 0x5E
	}
	for i := start; i < start+n; i++ {
		parent[i] = byte(i*31 + i>>11)
	}
	view, err := x.Slice(0, start, start+n)
	require.NoError(t, err)
	want := append([]byte(nil), parent[start:start+n]...)
	used := mem.Stats().Used
	ref, err := owner.Put(ctx, view)
	require.NoError(t, err)
	require.Zero(t, p.a.ObjectTable()[0].StagedBytes, "nothing is staged before an on-host grant")
	for _, cand := range reader.Explain(ref, tensor.HostDevice).Candidates {
		if cand.Transport == fabric.SHM {
			assert.Contains(t, cand.Reason, "private copy of this view", "Explain says the view is copied")
		}
	}

	for _, path := range []struct {
		name string
		dst  tensor.DeviceID
	}{{fabric.SHM, tensor.HostDevice}, {fabric.P2P, tensor.GPUDevice(1)}} {
		got, tr, err := reader.Fetch(ctx, ref, path.dst)
		require.NoError(t, err)
		assert.Equal(t, path.name, tr.Stats.Transport)
		assert.True(t, tr.Stats.ViewCopy, "the transfer says the owner served a copy of the view")
		assert.True(t, c.RecentTransfers()[0].ViewCopy, "the transfer record says so too")
		b, _ := got.SpanBytes()
		assert.Equal(t, want, b, path.name)
		require.NoError(t, got.Release())
	}
	// A zero-copy View of the same ref maps the private copy: the view's
	// bytes, at the view's offset in the grant.
	v, err := reader.View(ctx, ref)
	require.NoError(t, err)
	vb, _ := v.Tensor.SpanBytes()
	assert.Equal(t, want, vb, "zero-copy view of a partial view")
	require.NoError(t, v.Release())
	assert.Equal(t, int64(n), p.a.ObjectTable()[0].StagedBytes)
	assert.Equal(t, 1.0, testutil.ToFloat64(p.a.obs.ViewCopies), "staged once for both paths")
	assert.Equal(t, float64(n), testutil.ToFloat64(p.a.obs.ViewCopyBytes))
	assert.GreaterOrEqual(t, mem.Stats().Used-used, int64(n), "the copy is accounted on the device")

	// What the shm server passes for this claim: the handle of the pin.
	pn, err := p.a.objects.Open(ctx, fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}.For(start, n))
	require.NoError(t, err)
	h, err := tensor.ExportOf(pn, tensor.ReadOnly)
	require.NoError(t, pn.Release())
	require.NoError(t, err)
	defer unix.Close(h.FD)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(h.FD, &st))
	whole := make([]byte, st.Size)
	k, err := unix.Pread(h.FD, whole, 0)
	require.NoError(t, err)
	mapped, err := unix.Mmap(h.FD, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mapped)
	for how, file := range map[string][]byte{"pread": whole[:k], "mmap": mapped} {
		require.Len(t, file, int(pageUp(n)), how)
		assert.Equal(t, want, file[:n], how)
		assert.Equal(t, make([]byte, len(file)-n), file[n:], "%s: the page tail is zero", how)
		assert.False(t, bytes.Contains(file, bytes.Repeat([]byte{0x5E}, 64)), "%s: the parent's secret is reachable", how)
	}

	// A whole allocation is granted as it is: no copy.
	y := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 64<<10)
	yref, err := owner.Put(ctx, y)
	require.NoError(t, err)
	got, tr, err := reader.Fetch(ctx, yref, tensor.HostDevice)
	require.NoError(t, err)
	assert.Equal(t, fabric.SHM, tr.Stats.Transport)
	assert.False(t, tr.Stats.ViewCopy)
	require.NoError(t, got.Release())
	assert.Equal(t, 1.0, testutil.ToFloat64(p.a.obs.ViewCopies), "no copy of a whole allocation")
	for _, o := range p.a.ObjectTable() {
		if o.ID == yref.Object.String() {
			assert.Zero(t, o.StagedBytes)
		}
	}

	// Freeing the view returns the copy with the parent.
	require.NoError(t, owner.Free(ctx, yref))
	require.NoError(t, owner.Free(ctx, ref))
	for _, id := range []fabric.ObjectID{ref.Object, yref.Object} {
		done, err := p.a.objects.FreedChan(id)
		require.NoError(t, err)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the objects' memory was not released")
		}
	}
	assert.Equal(t, used-size, mem.Stats().Used, "the parent and its view's copy went back to the device")
}

func pageUp(n int64) int64 {
	ps := int64(unix.Getpagesize())
	return (n + ps - 1) &^ (ps - 1)
}

// TestViewCopyOutOfMemoryFallsBack: when the owner's device cannot hold
// the private copy of a view, the on-host grant is refused (counted and
// logged by the owner), nothing of the parent is granted instead, and the
// reader falls back to a path that needs no descriptor and still gets the
// view's bytes.
func TestViewCopyOutOfMemoryFallsBack(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	c := sameHostRuntime(t, p, nil)
	owner, _ := p.a.Spawn("owner")
	reader, _ := c.Spawn("reader")
	mem, _ := p.a.Memory(tensor.GPUDevice(0))

	const size, start, n = 4 << 20, 1<<20 + 8, 2 << 20
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, size)
	view, err := x.Slice(0, start, start+n)
	require.NoError(t, err)
	want, _ := view.SpanBytes()
	want = append([]byte(nil), want...)
	ref, err := owner.Put(ctx, view)
	require.NoError(t, err)
	hog, err := mem.Alloc(ctx, mem.Stats().LargestFree-n/2) // the copy no longer fits
	require.NoError(t, err)
	defer hog.Release()

	got, tr, err := reader.Fetch(ctx, ref, tensor.HostDevice)
	require.NoError(t, err)
	defer got.Release()
	t.Logf("served over %s after the on-host grant was refused", tr.Stats.Transport)
	assert.NotEqual(t, fabric.SHM, tr.Stats.Transport, "served on-host without a copy")
	assert.NotEqual(t, fabric.P2P, tr.Stats.Transport, "served on-host without a copy")
	b, _ := got.SpanBytes()
	assert.Equal(t, want, b)
	assert.GreaterOrEqual(t, testutil.ToFloat64(p.a.obs.ViewCopyFailures), 1.0)
	assert.Zero(t, testutil.ToFloat64(p.a.obs.ViewCopies))
	assert.Zero(t, p.a.ObjectTable()[0].StagedBytes)
}
