package capi

import (
	"context"
	"encoding/json"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testhelp.Isolated(m),
		goleak.IgnoreAnyFunction("github.com/libp2p/go-libp2p/p2p/transport/tcpreuse.(*ConnMgr).run"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/net/nat.DiscoverNAT"),
		goleak.IgnoreTopFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
	)
}

// pair starts two runtimes on one simulated host (as two Ray actors on a
// node are) from the same JSON config.
func pair(t testing.TB, config string) (*Library, *Runtime, *Runtime) {
	t.Helper()
	t.Setenv(fabric.EnvTransports, "")
	t.Setenv(EnvClusterKey, "")
	t.Setenv(EnvSlabs, "")
	t.Setenv(EnvPoolBytes, "")
	ctx := context.Background()
	lib := New()
	ha, err := lib.NewRuntime(ctx, []byte(config))
	require.NoError(t, err)
	hb, err := lib.NewRuntime(ctx, []byte(config))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, lib.CloseAll(context.Background())) })
	a, err := lib.Runtime(ha)
	require.NoError(t, err)
	b, err := lib.Runtime(hb)
	require.NoError(t, err)
	return lib, a, b
}

func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>8)
	}
	return p
}

func TestForeignPutEveryPath(t *testing.T) {
	for _, tc := range []struct {
		name, config, transport, memory string
	}{
		{"same host, another process: one staged copy", `{"allow":["shm"],"lazy_staging":true}`, "shm", "foreign, copied once into shareable memory"},
		{"tcp: read in place", `{"allow":["tcp"]}`, "tcp", "foreign, not copied"},
		{"rdma: read in place", `{"preset":"dgx-h100","hosts":2,"allow":["rdma"]}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := tc.config
			_, a, b := pair(t, config)
			ctx := context.Background()
			src := pattern(3 << 20)
			ref, err := a.Put(ctx, Region{Mem: src, DType: "float32", Shape: []int64{3 << 18}})
			require.NoError(t, err)
			e, err := a.Explain(ref)
			require.NoError(t, err)
			assert.Equal(t, "foreign, not copied", e.Memory)

			dst := make([]byte, len(src))
			x, err := b.GetInto(ctx, ref, dst, 0, 0)
			if tc.transport == "" {
				// Two runtimes claiming the same host of a 2-host cluster
				// and only rdma allowed: rdma needs different hosts.
				require.Error(t, err)
				assert.Equal(t, "no_path", Kinds[Code(err)], "%v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, src, dst)
			assert.Equal(t, tc.transport, x.Stats.Transport)
			e, err = a.Explain(ref)
			require.NoError(t, err)
			assert.Equal(t, tc.memory, e.Memory)
			eb, err := b.Explain(ref) // the reader's view of the path
			require.NoError(t, err)
			assert.Equal(t, tc.transport, eb.Plan.Chosen)
			assert.Empty(t, eb.Memory, "only the owner knows how its memory is held")
			assertExplainJSON(t, eb)

			require.NoError(t, b.Release(ctx, ref))
			require.NoError(t, a.Free(ctx, ref, 5*time.Second))
			require.NoError(t, a.Free(ctx, ref, 5*time.Second), "twice is fine")
			s := a.Stats()
			assert.Equal(t, int64(1), s.ForeignPuts)
			if tc.transport == "shm" {
				assert.Equal(t, int64(1), s.StagedCopies)
			} else {
				assert.Equal(t, int64(0), s.StagedCopies)
			}
			assert.Equal(t, 0, s.Objects)
			// Free's promise is about the caller's memory (no read uses it
			// any more); the staged copy is ours and goes back when the
			// reader's grant of it is done, which may land just after.
			assert.Eventually(t, func() bool { return a.Stats().HostMemory.Used == 0 }, 5*time.Second, time.Millisecond,
				"the staged copy went back (%d bytes held)", a.Stats().HostMemory.Used)
			assert.Equal(t, int64(1), b.Stats().ByTransport[tc.transport])
		})
	}
}

// By default the owner stages a foreign Put for same-host readers in the
// background, before any reader asks; a reader then reuses that copy.
func TestForeignStagedAtPut(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"]}`)
	ctx := context.Background()
	src := pattern(2 << 20)
	ref, err := a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{int64(len(src))}})
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		e, err := a.Explain(ref)
		require.NoError(t, err)
		if e.Memory == "foreign, copied once into shareable memory" {
			break
		}
		require.True(t, time.Now().Before(deadline), "never staged: %s", e.Memory)
		time.Sleep(time.Millisecond)
	}
	a.pool.fills.Wait()
	assert.Equal(t, int64(len(src)), a.Stats().HostMemory.Used, "one copy, made without a reader")
	h, p, n, _, err := b.View(ctx, ref, ViewConfig{}, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, src, unsafe.Slice((*byte)(p), n))
	assert.Equal(t, int64(len(src)), a.Stats().HostMemory.Used, "the reader used the early copy")
	require.NoError(t, b.ReleaseView(h))
	require.NoError(t, b.Release(ctx, ref))
	require.NoError(t, a.Free(ctx, ref, 0))
	assert.Equal(t, int64(0), a.Stats().HostMemory.Used)

	// The staging pool refilled itself with an allocation of that size,
	// populated ahead: the next Put of the same size stages into it.
	a.pool.fills.Wait()
	assert.Equal(t, int64(len(src)), a.Stats().StagePool.Ready)
	assert.Equal(t, int64(1), a.Stats().StagePool.Misses)
	ref, err = a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{int64(len(src))}})
	require.NoError(t, err)
	h, p, n, _, err = b.View(ctx, ref, ViewConfig{}, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, src, unsafe.Slice((*byte)(p), n))
	assert.Equal(t, int64(1), a.Stats().StagePool.Hits)
	require.NoError(t, b.ReleaseView(h))
	require.NoError(t, b.Release(ctx, ref))
	require.NoError(t, a.Free(ctx, ref, 0))
	a.pool.fills.Wait()
	assert.Equal(t, int64(0), a.Stats().HostMemory.Used)

	// A Free racing the background copy waits for it, and a runtime that
	// serves no shm does not stage at all.
	ref, err = a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{int64(len(src))}})
	require.NoError(t, err)
	require.NoError(t, a.Free(ctx, ref, 0))
	assert.Equal(t, int64(0), a.Stats().HostMemory.Used)
	_, c, _ := pair(t, `{"allow":["tcp"]}`)
	ref, err = c.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{int64(len(src))}})
	require.NoError(t, err)
	e, err := c.Explain(ref)
	require.NoError(t, err)
	assert.Equal(t, "foreign, not copied", e.Memory)
	require.NoError(t, c.Free(ctx, ref, 0))
}

func TestRDMABetweenHosts(t *testing.T) {
	t.Setenv(fabric.EnvTransports, "")
	ctx := context.Background()
	lib := New()
	defer lib.CloseAll(ctx)
	ha, err := lib.NewRuntime(ctx, []byte(`{"hosts":2,"host":"h0","lazy_staging":true}`))
	require.NoError(t, err)
	hb, err := lib.NewRuntime(ctx, []byte(`{"hosts":2,"host":"h1"}`))
	require.NoError(t, err)
	a, _ := lib.Runtime(ha)
	b, _ := lib.Runtime(hb)
	src := pattern(1 << 20)
	ref, err := a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{1 << 20}})
	require.NoError(t, err)
	addr, n, x, err := b.Get(ctx, ref, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, "rdma", x.Stats.Transport)
	got := unsafe.Slice((*byte)(addr), n)
	assert.Equal(t, src, got)
	e, _ := a.Explain(ref)
	assert.Equal(t, "foreign, not copied", e.Memory, "network paths read the caller's memory in place")
	require.NoError(t, b.FreeMemory(addr))
}

func TestSharePutZeroCopy(t *testing.T) {
	_, a, b := pair(t, `{"allow":["shm"]}`) // in one process local would serve; force the cross-process path
	ctx := context.Background()
	addr, err := a.Alloc(ctx, 1<<20)
	require.NoError(t, err)
	mem := unsafe.Slice((*byte)(addr), 1<<20)
	copy(mem, pattern(1<<20))
	// A slice of the array (its second half) is published with no copy.
	ref, err := a.Put(ctx, Region{Mem: mem[1<<19:], DType: "int32", Shape: []int64{1 << 17}})
	require.NoError(t, err)
	require.NoError(t, a.FreeMemory(addr), "the caller lets go first; the object keeps its window")
	got, n, x, err := b.Get(ctx, ref, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, "shm", x.Stats.Transport)
	assert.Equal(t, pattern(1 << 20)[1<<19:], unsafe.Slice((*byte)(got), n))
	e, _ := a.Explain(ref)
	assert.Equal(t, "shareable", e.Memory)
	assert.Equal(t, int64(1), a.Stats().ZeroCopyPuts)
	require.NoError(t, a.Free(ctx, ref, time.Second))
	assert.Equal(t, int64(0), a.Stats().HostMemory.Used)
	require.NoError(t, b.FreeMemory(got))
	assert.Equal(t, "invalid_argument", Kinds[Code(b.FreeMemory(got))])
}

func TestBadInput(t *testing.T) {
	lib, a, _ := pair(t, `{}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(64), DType: "float32", Shape: []int64{16}})
	require.NoError(t, err)
	bad := append([]byte(nil), ref...)
	bad[0] ^= 0xff
	for _, tc := range []struct {
		name string
		err  error
		kind string
	}{
		{"unknown dtype", func() error {
			_, err := a.Put(ctx, Region{Mem: pattern(64), DType: "complex64", Shape: []int64{8}})
			return err
		}(), "invalid_argument"},
		{"region too small", func() error {
			_, err := a.Put(ctx, Region{Mem: pattern(60), DType: "float32", Shape: []int64{16}})
			return err
		}(), "invalid_argument"},
		{"empty region", func() error {
			_, err := a.Put(ctx, Region{DType: "float32", Shape: []int64{0}})
			return err
		}(), "invalid_argument"},
		{"negative dim", func() error {
			_, err := a.Put(ctx, Region{Mem: pattern(64), DType: "float32", Shape: []int64{-1}})
			return err
		}(), "invalid_argument"},
		{"corrupted ref", func() error { _, err := a.GetInto(ctx, bad, make([]byte, 64), 0, 0); return err }(), "malformed_ref"},
		{"truncated ref", func() error { _, err := a.GetInto(ctx, ref[:20], make([]byte, 64), 0, 0); return err }(), "malformed_ref"},
		{"destination too small", func() error { _, err := a.GetInto(ctx, ref, make([]byte, 8), 0, 0); return err }(), "too_small"},
		{"unknown config field", func() error { _, err := lib.NewRuntime(ctx, []byte(`{"presett":"x"}`)); return err }(), "invalid_argument"},
		{"unknown preset", func() error { _, err := lib.NewRuntime(ctx, []byte(`{"preset":"nope"}`)); return err }(), "invalid_argument"},
		{"bad cluster key", func() error { _, err := lib.NewRuntime(ctx, []byte(`{"cluster_key":"abc"}`)); return err }(), "invalid_argument"},
		{"unknown host", func() error { _, err := lib.NewRuntime(ctx, []byte(`{"host":"h9"}`)); return err }(), "invalid_argument"},
		{"unknown handle", func() error { _, err := lib.Runtime(999); return err }(), "invalid_argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Error(t, tc.err)
			assert.Equal(t, tc.kind, Kinds[Code(tc.err)], "%v", tc.err)
		})
	}
}

func TestFreedRefAndCancel(t *testing.T) {
	_, a, b := pair(t, `{}`)
	ctx := context.Background()
	ref, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	require.NoError(t, a.Free(ctx, ref, time.Second))
	_, err = b.GetInto(ctx, ref, make([]byte, 4096), 0, 0)
	assert.Equal(t, "object_freed", Kinds[Code(err)], "%v", err)

	// A cancelled operation reports canceled; cancelling an unknown one
	// reports false.
	assert.False(t, b.Cancel(42))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	ref2, err := a.Put(ctx, Region{Mem: pattern(4096), DType: "uint8", Shape: []int64{4096}})
	require.NoError(t, err)
	_, err = b.GetInto(cctx, ref2, make([]byte, 4096), 7, 0)
	assert.Equal(t, "canceled", Kinds[Code(err)], "%v", err)
}

func TestDescribeRefAndKinds(t *testing.T) {
	_, a, _ := pair(t, `{}`)
	ref, err := a.Put(context.Background(), Region{Mem: pattern(24), DType: "float16", Shape: []int64{3, 4}})
	require.NoError(t, err)
	info, err := DescribeRef(ref)
	require.NoError(t, err)
	assert.Equal(t, "float16", info.DType)
	assert.Equal(t, []int64{3, 4}, info.Shape)
	assert.Equal(t, []int64{4, 1}, info.Strides)
	assert.Equal(t, int64(24), info.NBytes)
	assert.Equal(t, "cpu:0", info.Device)
	_, err = DescribeRef([]byte("not a ref"))
	assert.Equal(t, "malformed_ref", Kinds[Code(err)])

	// Every kind rdt names has a code here.
	for _, err := range []error{rdt.ErrOwnerDied, rdt.ErrObjectFreed, rdt.ErrMalformedRef, rdt.ErrTooSmall, rdt.ErrClosed,
		rdt.ErrOwnerClosed, rdt.ErrLayoutMismatch, rdt.ErrNoZeroCopy, context.DeadlineExceeded} {
		assert.Equal(t, rdt.ErrorKind(err), Kinds[Code(err)])
	}
	assert.Equal(t, 0, Code(nil))
	st, err := json.Marshal(a.Stats())
	require.NoError(t, err)
	assert.Contains(t, string(st), `"puts":1`)
}

// Cancel (Ray's abort_transport) stops a read in flight: the caller gets
// canceled, and the runtime stays usable.
func TestCancelInFlight(t *testing.T) {
	_, a, b := pair(t, `{"allow":["tcp"]}`)
	ctx := context.Background()
	src := pattern(64 << 20)
	ref, err := a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{int64(len(src))}})
	require.NoError(t, err)
	dst := make([]byte, len(src))
	done := make(chan error, 1)
	go func() {
		_, err := b.GetInto(ctx, ref, dst, 7, 0)
		done <- err
	}()
	cancelled := false
	var getErr error
wait:
	for {
		select {
		case getErr = <-done:
			break wait
		default:
			if !cancelled {
				cancelled = b.Cancel(7)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	if !cancelled {
		t.Skip("the read finished before it could be cancelled (nothing to check)")
	}
	assert.Equal(t, "canceled", Kinds[Code(getErr)], "%v", getErr)
	assert.False(t, b.Cancel(7), "the op is gone once the read returned")
	_, err = b.GetInto(ctx, ref, dst, 8, 0)
	require.NoError(t, err)
	assert.Equal(t, src, dst)
}

// assertExplainJSON: tl_explain's JSON keeps every field it had before
// rdt owned the plan (path as text, gbps as a number), with the new ones
// beside them.
func assertExplainJSON(t *testing.T, e Explanation) {
	t.Helper()
	b, err := json.Marshal(e)
	require.NoError(t, err)
	var got struct {
		Plan map[string]any `json:"plan"`
	}
	require.NoError(t, json.Unmarshal(b, &got))
	for _, k := range []string{"path", "best", "chosen", "degraded", "candidates", "src", "dst"} {
		assert.Contains(t, got.Plan, k, "%s", b)
	}
	assert.IsType(t, "", got.Plan["path"], "the path is text")
	cands, _ := got.Plan["candidates"].([]any)
	require.NotEmpty(t, cands)
	for _, c := range cands {
		c := c.(map[string]any)
		for _, k := range []string{"transport", "usable", "gbps", "reason"} {
			assert.Contains(t, c, k, "%s", b)
		}
		assert.IsType(t, 0.0, c["gbps"], "gbps is a number, even unbounded")
	}
}

// TestTCPCompressionStats: every read over tcp between hosts is counted as
// compressed or plain in Stats.TCPCompression (on loopback the codec is
// slower than the link, so plain), and bytes are counted only for
// compressed reads.
func TestTCPCompressionStats(t *testing.T) {
	t.Setenv(fabric.EnvTransports, "tcp")
	ctx := context.Background()
	lib := New()
	defer lib.CloseAll(ctx)
	ha, err := lib.NewRuntime(ctx, []byte(`{"hosts":2,"host":"h0"}`))
	require.NoError(t, err)
	hb, err := lib.NewRuntime(ctx, []byte(`{"hosts":2,"host":"h1"}`))
	require.NoError(t, err)
	a, _ := lib.Runtime(ha)
	b, _ := lib.Runtime(hb)
	assert.Equal(t, TCPCompression{}, b.Stats().TCPCompression)
	src := pattern(4 << 20)
	ref, err := a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{4 << 20}})
	require.NoError(t, err)
	for range 2 {
		addr, _, x, err := b.Get(ctx, ref, 0, 0)
		require.NoError(t, err)
		assert.Equal(t, "tcp", x.Stats.Transport)
		require.NoError(t, b.FreeMemory(addr))
	}
	c := b.Stats().TCPCompression
	assert.EqualValues(t, 2, c.Compressed+c.Plain, "each read decided once")
	if c.Compressed == 0 {
		assert.Zero(t, c.RawBytes+c.WireBytes)
	} else {
		assert.Positive(t, c.RawBytes)
		assert.Positive(t, c.WireBytes)
	}
}
