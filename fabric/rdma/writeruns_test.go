package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// pushFixture is an owner with a sink of size bytes on two loopback
// softrdma rails ("a", "b") and a pusher, both with softrdma providers
// made from cfg (NICs set here; whatever newTestProvider makes), whose
// transport counts into metrics.
type pushFixture struct {
	tr      *rdma.Transport
	metrics *rdma.Metrics
	sink    []byte
	src     tensor.Buffer
	srcP    []byte
	dst     fabric.Remote
}

func newPushFixture(t testing.TB, size int64, cfg softrdma.Config, mutate func(*rdma.Config)) *pushFixture {
	return newPushFixtureOver(t, size, func(t testing.TB, names ...string) rdma.Provider {
		c := cfg
		c.NICs = loopbackNICs(names...)
		c.NICs[1].Dial = dialB // nil: the default
		p, err := softrdma.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}, mutate)
}

// newPushFixtureOver is newPushFixture over the providers prov makes (the
// owner's, then the pusher's).
func newPushFixtureOver(t testing.TB, size int64, prov func(t testing.TB, names ...string) rdma.Provider, mutate func(*rdma.Config)) *pushFixture {
	t.Helper()
	ctx := context.Background()
	ownerKey, ownerID := key(t)
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(0), 3*size+(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	sinkBuf, _ := mem.Alloc(ctx, size)
	f := &pushFixture{}
	f.sink, _ = tensor.BytesOf(sinkBuf)
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: prov(t, "a", "b"), Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound }),
		Sink:   sinkFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) { return nopRelease{sinkBuf}, nil })})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	rk, _ := key(t)
	f.metrics = rdma.NewMetrics(prometheus.NewRegistry())
	rc := rdma.Config{Provider: prov(t, "a", "b"), Security: fabric.Security{Identity: rk}, AllowLoopback: true, Metrics: f.metrics}
	if mutate != nil {
		mutate(&rc)
	}
	f.tr, err = rdma.New(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.tr.Close() })
	f.src, _ = mem.Alloc(ctx, 2*size)
	f.srcP, _ = tensor.BytesOf(f.src)
	for i := range f.srcP {
		f.srcP[i] = byte(i*7 + i>>12)
	}
	f.dst = fabric.Remote{Peer: ownerID.String(), Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Length: size}
	return f
}

// dialB, when set, dials rail "b" of the next push fixture.
var dialB func(ctx context.Context, network, laddr, raddr string) (net.Conn, error)

// rows are runs of 4 KiB every 8 KiB (a resharded move's), n bytes in all.
func rows(n int64) []fabric.Run {
	var out []fabric.Run
	for off := int64(0); off < 2*n; off += 8 << 10 {
		out = append(out, fabric.Run{Off: off + 4<<10, Len: 4 << 10})
	}
	return out
}

// longRows are runs of 128 KiB every 256 KiB, n bytes in all.
func longRows(n int64) []fabric.Run {
	var out []fabric.Run
	for off := int64(0); off < 2*n; off += 256 << 10 {
		out = append(out, fabric.Run{Off: off + 128<<10, Len: 128 << 10})
	}
	return out
}

func (f *pushFixture) check(t *testing.T, runs []fabric.Run) {
	t.Helper()
	var want []byte
	for _, r := range runs {
		want = append(want, f.srcP[r.Off:r.Off+r.Len]...)
	}
	if !bytes.Equal(f.sink, want) {
		t.Fatal("the sink does not hold the runs' bytes in order")
	}
}

// TestWriteRunsGathers: over softrdma a gathered push sends the runs with
// no pack (nothing counted), striped over both rails.
func TestWriteRunsGathers(t *testing.T) {
	const size = 8 << 20
	f := newPushFixture(t, size, softrdma.Config{}, nil)
	runs := rows(size)
	var st fabric.Stats
	for try := 0; try < 50 && st.Streams != 2; try++ { // until the second rail is up
		clear(f.sink)
		var err error
		if st, err = f.tr.WriteRuns(context.Background(), f.src, runs, f.dst); err != nil {
			t.Fatal(err)
		}
		if st.Bytes != size {
			t.Fatalf("Stats.Bytes %d, want %d", st.Bytes, size)
		}
		f.check(t, runs)
	}
	if st.Streams != 2 {
		t.Errorf("streams %d, want 2", st.Streams)
	}
	if n := testutil.ToFloat64(f.metrics.GatherPacked); n != 0 {
		t.Errorf("gathered pushes packed: %v, want 0", n)
	}
	// Runs that do not fill the sink are refused before anything moves.
	if _, err := f.tr.WriteRuns(context.Background(), f.src, runs[1:], f.dst); !errors.Is(err, fabric.ErrBadRuns) {
		t.Errorf("short runs: %v, want fabric.ErrBadRuns", err)
	}
}

// TestWriteRunsPacksForFewSGE: where a rail's device takes one segment per
// WRITE, or too few for runs that short (4 KiB runs, 4 segments: 16 KiB
// WRITEs), the runs are packed first, and counted; runs long enough for
// the same device go out gathered.
func TestWriteRunsPacksForFewSGE(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name   string
		sge    int
		runs   []fabric.Run
		packed float64
	}{
		{"one segment", 1, rows(size), 1},
		{"4 segments of 4 KiB runs", 4, rows(size), 1},
		{"4 segments of 128 KiB runs", 4, longRows(size), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPushFixture(t, size, softrdma.Config{MaxSGE: tc.sge}, nil)
			if _, err := f.tr.WriteRuns(context.Background(), f.src, tc.runs, f.dst); err != nil {
				t.Fatal(err)
			}
			f.check(t, tc.runs)
			if n := testutil.ToFloat64(f.metrics.GatherPacked); n != tc.packed {
				t.Errorf("gathered pushes packed: %v, want %v", n, tc.packed)
			}
		})
	}
}

// failingConn breaks (closes) its connection once more than after bytes
// were written to it.
type failingConn struct {
	net.Conn
	after   int64
	written atomic.Int64
}

func (c *failingConn) Write(p []byte) (int, error) {
	if c.written.Add(int64(len(p))) > c.after {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

// TestPushRailFailsMidway breaks rail b's connection after 1 MiB of a push
// has gone out on it: its work requests fail, move to rail a, and the push
// (plain, and gathered: each WRITE's SGL built again for its new rail)
// completes with every byte in place.
func TestPushRailFailsMidway(t *testing.T) {
	const size = 16 << 20
	for _, gathered := range []bool{false, true} {
		name := "plain"
		if gathered {
			name = "gathered"
		}
		t.Run(name, func(t *testing.T) {
			var broke atomic.Bool
			dialB = func(ctx context.Context, network, laddr, raddr string) (net.Conn, error) {
				c, err := softrdma.DialFrom(ctx, network, laddr, raddr)
				if err != nil || broke.Swap(true) {
					return c, err // only its first connection breaks
				}
				return &failingConn{Conn: c, after: 1 << 20}, nil
			}
			defer func() { dialB = nil }()
			f := newPushFixture(t, size, softrdma.Config{}, func(c *rdma.Config) { c.PauseAfter = 1 })
			// Both rails up first, so the push stripes over both from its start.
			if _, err := f.tr.Write(context.Background(), f.src, fabric.Remote{Peer: f.dst.Peer, Addrs: f.dst.Addrs, Length: 4096}); err != nil {
				t.Fatal(err)
			}
			runs := rows(size)
			var err error
			if gathered {
				_, err = f.tr.WriteRuns(context.Background(), f.src, runs, f.dst)
			} else {
				runs = []fabric.Run{{Off: 0, Len: size}}
				_, err = f.tr.Write(context.Background(), f.src, f.dst)
			}
			if err != nil {
				t.Fatalf("push with rail b broken midway: %v", err)
			}
			f.check(t, runs)
			if !broke.Load() {
				t.Fatal("rail b was never dialled")
			}
			if n := testutil.ToFloat64(f.metrics.SliceRetry); n < 1 {
				t.Logf("rails: %+v", f.tr.Rails())
				t.Errorf("slices moved: %v, want >= 1", n)
			}
		})
	}
}

// BenchmarkWriteRuns is fabric/tcp's BenchmarkWriteRuns over rdma
// (softrdma on loopback, two rails): 16 MiB in 4 KiB runs 8 KiB apart,
// packed then written, gathered (WriteRuns) and a plain Write of as many
// bytes, in turn, for devices taking MaxSGE segments per WRITE (1: the
// transport packs).
func BenchmarkWriteRuns(b *testing.B) {
	for _, sge := range []int{1, 64, softrdma.DefaultMaxSGE} {
		b.Run(fmt.Sprintf("sge=%d", sge), func(b *testing.B) {
			benchWriteRuns(b, newPushFixture(b, 16<<20, softrdma.Config{MaxSGE: sge}, nil), rows(16<<20))
		})
	}
}

// benchWriteRuns runs BenchmarkWriteRuns's loop over f: runs filling its
// sink.
func benchWriteRuns(b *testing.B, f *pushFixture, runs []fabric.Run) {
	fabrictest.BenchWriteRuns(b, f.tr, f.src, runs, f.dst)
}
