package rdt

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Hostile refs (issue 13, items 3 and 5): a ref's desc is the owner's word
// only once the owner confirmed it, and a claim grants the published view's
// bytes, never its parent buffer's.

// recordingMemory wraps a device memory and records every allocation asked
// of it. Requests over refuseOver are refused without touching the arena:
// on code that allocates for a forged shape the test then fails on the
// record, without the machine paying the gigabytes.
type recordingMemory struct {
	tensor.Memory
	refuseOver int64

	mu   sync.Mutex
	asks []int64
}

func (m *recordingMemory) Alloc(ctx context.Context, n int64) (tensor.Buffer, error) {
	m.mu.Lock()
	m.asks = append(m.asks, n)
	m.mu.Unlock()
	if n > m.refuseOver {
		return nil, &tensor.OutOfMemoryError{Device: m.Device(), Requested: n}
	}
	return m.Memory.Alloc(ctx, n)
}

func (m *recordingMemory) requests() []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int64(nil), m.asks...)
}

// rssBytes is this process's resident set size.
func rssBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestForgedShapeAllocatesNothing: an attacker Puts 8 bytes and inflates the
// shape in its own ref to 4 GiB. The reader (whose device could hold it)
// asks the owner to confirm the layout before it allocates, gets a typed
// error, and neither its device memory nor its RSS grows.
func TestForgedShapeAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	sim, err := tensor.NewSimMemory(tensor.GPUDevice(0), 16<<30) // sparse: costs nothing until used
	require.NoError(t, err)
	t.Cleanup(func() { sim.Close() })
	dev := &recordingMemory{Memory: sim, refuseOver: 64 << 20}
	reader := sameHostRuntime(t, p, func(c *Config) { c.Host = "h1"; c.Devices = []tensor.Memory{dev} })
	same := sameHostRuntime(t, p, nil) // the attacker's host: shm/p2p paths

	attacker, _ := p.a.Spawn("attacker")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Float32, 2) // 8 bytes
	ref, err := attacker.Put(ctx, x)
	require.NoError(t, err)
	forged := ref
	forged.Desc = tensor.NewDesc(tensor.Float32, 1<<30) // 4 GiB

	victims := []struct {
		name string
		a    *Actor
		dst  tensor.DeviceID
	}{
		{"other host", must(reader.Spawn("victim")), tensor.GPUDevice(0)},
		{"same host, other runtime", must(same.Spawn("victim")), tensor.GPUDevice(1)},
		{"owner's own runtime", must(p.a.Spawn("victim")), tensor.GPUDevice(1)},
	}
	rss := rssBytes(t)
	for _, v := range victims {
		t.Run(v.name, func(t *testing.T) {
			mem, err := v.a.rt.Memory(v.dst)
			require.NoError(t, err)
			before := mem.Stats()
			_, err = v.a.Get(ctx, forged, v.dst)
			require.ErrorIs(t, err, ErrLayoutMismatch)
			assert.ErrorIs(t, err, ErrMalformedRef)
			after := mem.Stats()
			assert.Equal(t, before.Used, after.Used, "device memory in use")
			assert.Equal(t, before.Peak, after.Peak, "device memory peak")
		})
	}
	assert.Empty(t, dev.requests(), "the reader allocated for a layout its owner never confirmed")
	grew := rssBytes(t) - rss
	t.Logf("forged 4 GiB shape on an 8-byte object, three readers: %d allocations asked, RSS %+d KiB", len(dev.requests()), grew>>10)
	assert.Less(t, grew, int64(256<<20), "reader RSS grew")

	// The honest ref still reads, and the forged one stays refused once the
	// reader holds a lease on the object (the hold cache checks the layout
	// too).
	v := victims[0].a
	got, err := v.Get(ctx, ref, tensor.GPUDevice(0))
	require.NoError(t, err)
	sameBytes(t, x, got)
	require.NoError(t, got.Release())
	require.NoError(t, v.Hold(ctx, ref))
	_, err = v.Get(ctx, forged, tensor.GPUDevice(0))
	require.ErrorIs(t, err, ErrLayoutMismatch)
	for _, n := range dev.requests() {
		assert.LessOrEqual(t, n, int64(8), "only the honest 8 bytes were ever allocated")
	}
}

// TestRefusedGetReturnsWhatItReserved: a Get the owner refuses after the
// reader allocated (the object was freed while the reader's hold was
// cached) gives every byte back.
func TestRefusedGetReturnsWhatItReserved(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Float32, 1<<18) // 1 MiB
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	require.NoError(t, far.Hold(ctx, ref))
	require.NoError(t, owner.Free(ctx, ref))
	mem, _ := p.b.Memory(tensor.GPUDevice(2))
	before := mem.Stats()
	_, err = far.Get(ctx, ref, tensor.GPUDevice(2))
	require.ErrorIs(t, err, ErrObjectFreed)
	after := mem.Stats()
	assert.Equal(t, before.Used, after.Used)
	assert.Equal(t, before.Allocs, after.Allocs)
}

// TestViewGrantsOnlyItsBytes: a ref to a 16-byte view of a 16 KiB buffer,
// forged to offset 0 and the parent's shape (or to run past the view),
// reads nothing on any path: the owner checks every claim's range against
// the published view. The data paths are driven directly with the forged
// range, under the lease check, to show the owner's own fence; a forged ref
// through Get stops at the lease.
func TestViewGrantsOnlyItsBytes(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	c := sameHostRuntime(t, p, nil)
	owner, _ := p.a.Spawn("owner")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Float32, 64, 64)
	row, err := x.Slice(0, 10, 11)
	require.NoError(t, err)
	view, err := row.Slice(1, 4, 8) // 16 bytes at byte 2576
	require.NoError(t, err)
	ref, err := owner.Put(ctx, view)
	require.NoError(t, err)
	start, end := view.Desc().Span()
	require.Equal(t, int64(16), end-start)

	forged := []struct {
		name     string
		off, len int64
	}{
		{"offset 0, the parent's length", 0, 64 * 64 * 4},
		{"the view's start, past its end", start, end - start + 16},
		{"before the view's start", start - 16, end - start},
		{"after the view's end", end, 16},
	}
	paths := []struct {
		name   string
		reader *Runtime
		dst    tensor.DeviceID
		path   string
	}{
		{"local", p.a, tensor.GPUDevice(0), fabric.Local},
		{"p2p, same runtime", p.a, tensor.GPUDevice(1), fabric.P2P},
		{"p2p, other runtime", c, tensor.GPUDevice(1), fabric.P2P},
		{"shm", c, tensor.HostDevice, fabric.SHM},
		{"rdma", p.b, tensor.GPUDevice(0), fabric.RDMA},
		{"tcp", p.b, tensor.GPUDevice(0), fabric.TCP},
	}
	for _, pc := range paths {
		t.Run(pc.name, func(t *testing.T) {
			if pc.reader != p.a {
				require.NoError(t, must(pc.reader.Spawn("lessee-"+pc.name)).Hold(ctx, ref)) // pass the lease honestly
			}
			honest := pc.reader.remoteFor(ref)
			dstEp := pc.reader.endpoint(pc.dst)
			tr := transportFor(t, pc.reader, pc.path, honest.Endpoint, dstEp)
			mem, _ := pc.reader.Memory(pc.dst)
			buf, err := mem.Alloc(ctx, 64*64*4)
			require.NoError(t, err)
			defer buf.Release()
			dst, _ := tensor.BytesOf(buf)

			// The honest range reads on this very transport.
			if v, ok := tr.(fabric.Viewer); ok {
				b, err := v.View(ctx, honest)
				require.NoError(t, err)
				require.NoError(t, b.Release())
			} else {
				_, err = tr.Read(ctx, honest, buf)
				require.NoError(t, err)
			}
			for _, f := range forged {
				t.Run(f.name, func(t *testing.T) {
					clear(dst)
					r := honest
					r.Offset, r.Length = f.off, f.len
					if v, ok := tr.(fabric.Viewer); ok {
						b, err := v.View(ctx, r)
						if err == nil {
							b.Release()
						}
						require.ErrorIs(t, err, ErrUnauthorized)
						return
					}
					_, err := tr.Read(ctx, r, buf)
					require.ErrorIs(t, err, ErrUnauthorized)
					assert.Equal(t, make([]byte, len(dst)), dst, "no byte of the parent arrived")
				})
			}
		})
	}

	// Through Get, a forged view is refused before anything moves, with the
	// layout error, on every path.
	bad := ref
	bad.Desc = x.Desc()
	for _, pc := range paths {
		_, err := must(pc.reader.Spawn("getter-"+pc.name)).Get(ctx, bad, pc.dst)
		assert.ErrorIs(t, err, ErrLayoutMismatch, pc.name)
	}
}

// transportFor returns the reader's transport of the given name that reaches
// src from dst.
func transportFor(t *testing.T, r *Runtime, name string, src, dst fabric.Endpoint) fabric.Transport {
	t.Helper()
	for _, tr := range r.planner.Transports(name) {
		if _, ok := tr.Reach(src, dst); ok {
			return tr
		}
	}
	t.Fatalf("no %s transport reaches %v from %v", name, src, dst)
	return nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprint("must: ", err))
	}
	return v
}
