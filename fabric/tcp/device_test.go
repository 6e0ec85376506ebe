package tcp

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

// devPin lends CUDA memory as a pin: not host visible, Unwrap to reach it.
type devPin struct{ b tensor.Buffer }

func (p devPin) Device() tensor.DeviceID        { return p.b.Device() }
func (p devPin) Len() int64                     { return p.b.Len() }
func (p devPin) Release() error                 { return nil }
func (p devPin) Unwrap() (tensor.Buffer, int64) { return p.b, 0 }

type sinkOf fabric.SourceFunc

func (f sinkOf) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	return f(ctx, c)
}

// Device memory on both ends of tcp, on the fake CUDA driver: the owner
// stages its device bytes into pinned memory and sends them, the reader
// receives into pinned memory and the device takes them in; a push goes
// the other way. Both compression modes run, since the compressed path
// encodes from and decodes into the staging.
func TestDeviceMemory(t *testing.T) {
	cudatest.NoLeaks(t)
	lib := cudatest.FakeLibrary(t)
	ctx := context.Background()
	owner, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0})
	require.NoError(t, err)
	defer owner.Close()
	reader, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 1, Mode: cuda.ModeLegacy})
	require.NoError(t, err)
	defer reader.Close()

	const n = fabric.StageSegment + 6<<20 + 5 // two segments on the reader
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + i>>13)
	}
	obj, err := owner.Alloc(ctx, n)
	require.NoError(t, err)
	defer obj.Release()
	require.NoError(t, obj.(*cuda.Buffer).CopyIn(ctx, 0, want))
	sink, err := owner.Alloc(ctx, n)
	require.NoError(t, err)
	defer sink.Release()
	claim := fabric.Claim{Object: fabric.ObjectID{4}, Incarnation: 1}
	open := func(b tensor.Buffer) fabric.SourceFunc {
		return func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) { return devPin{b}, nil }
	}
	ownerKey, ownerID := testhelp.Key(t)
	srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: open(obj), Sink: sinkOf(open(sink))})
	require.NoError(t, err)
	defer srv.Close()
	remote := fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer:     ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
		Claim: claim, Length: n, DType: tensor.BFloat16,
	}
	for _, mode := range []Compression{CompressOff, CompressAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			readerKey, _ := testhelp.Key(t)
			tr, err := New(Config{Security: fabric.Security{Identity: readerKey}, Compression: mode})
			require.NoError(t, err)
			defer tr.Close()
			dst, err := reader.Alloc(ctx, n)
			require.NoError(t, err)
			defer dst.Release()
			st, err := tr.Read(ctx, remote, dst)
			require.NoError(t, err)
			require.Equal(t, int64(n), st.Bytes)
			got := make([]byte, n)
			require.NoError(t, dst.(*cuda.Buffer).CopyOut(ctx, 0, got))
			require.True(t, bytes.Equal(got, want), "device read over tcp differs")

			_, err = tr.Write(ctx, dst, remote)
			require.NoError(t, err)
			clear(got)
			require.NoError(t, sink.(*cuda.Buffer).CopyOut(ctx, 0, got))
			require.True(t, bytes.Equal(got, want), "device push over tcp differs")
			require.NoError(t, sink.(*cuda.Buffer).CopyIn(ctx, 0, make([]byte, n)))
		})
	}
}

// deviceOwner serves one CUDA buffer of n bytes (on the fake driver) over
// tcp and returns a Remote for it, the bytes it holds and the server.
func deviceOwner(t *testing.T, n int64) (fabric.Remote, []byte, *Server) {
	t.Helper()
	lib := cudatest.FakeLibrary(t)
	ctx := context.Background()
	owner, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0})
	require.NoError(t, err)
	t.Cleanup(func() { owner.Close() })
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*13 + i>>11)
	}
	obj, err := owner.Alloc(ctx, n)
	require.NoError(t, err)
	t.Cleanup(func() { obj.Release() })
	require.NoError(t, obj.(*cuda.Buffer).CopyIn(ctx, 0, want))
	ownerKey, ownerID := testhelp.Key(t)
	srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) { return devPin{obj}, nil })})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer:     ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
		Claim: fabric.Claim{Object: fabric.ObjectID{5}, Incarnation: 1}, Length: n, DType: tensor.Uint8,
	}, want, srv
}

// readHost reads r into fresh host memory with a transport of its own (a
// first connection, never a pooled one, so a failure is not retried).
func readHost(t *testing.T, r fabric.Remote) ([]byte, error) {
	t.Helper()
	readerKey, _ := testhelp.Key(t)
	tr, err := New(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer tr.Close()
	dst, err := tensor.NewHostMemory(0).Alloc(context.Background(), r.Length)
	require.NoError(t, err)
	defer dst.Release()
	if _, err := tr.Read(context.Background(), r, dst); err != nil {
		return nil, err
	}
	b, err := tensor.BytesOf(dst)
	return bytes.Clone(b), err
}

// An owner answers a read of device memory piece by piece through a ring
// of two pinned slots: piece k+1's device copy is issued before piece k
// goes on the wire and waited for after it, one device-to-host copy per
// piece, and the bytes arrive whole. The fake's events answer "not ready"
// a few times first, so each wait really polls.
func TestDeviceReadPipelined(t *testing.T) {
	cudatest.NoLeaks(t)
	cudatest.Set(t, "notready", 3)
	const pieces = 4
	r, want, srv := deviceOwner(t, 3*ownerPiece+5)
	var mu sync.Mutex
	var steps []string
	trace := func(step string, k int64) {
		mu.Lock()
		steps = append(steps, fmt.Sprintf("%s%d", step, k))
		mu.Unlock()
	}
	srv.traceFn.Store(&trace)
	before := cudatest.Live("dtoh")
	got, err := readHost(t, r)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, want), "device read over tcp differs")
	require.Equal(t, int64(pieces), cudatest.Live("dtoh")-before, "one device copy per piece")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{
		"copy0", "copied0",
		"copy1", "send0", "sent0", "copied1",
		"copy2", "send1", "sent1", "copied2",
		"copy3", "send2", "sent2", "copied3",
		"send3", "sent3",
	}, steps)
}

// A device copy that fails before the first byte is sent is refused with
// a status (typed, the driver's error in its message) and the connection
// stays usable; one that fails mid-stream hangs up, and the reader learns
// the owner closed (fabric.ErrPeerClosed). Either way the owner's pinned
// ring, lanes and events are all given back (NoLeaks) and no goroutine is
// left (goleak in TestMain).
func TestDeviceReadFailures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failAt   int64 // the device-to-host copy that fails first (1 = the first)
		n        int64
		remote   bool // refused with a status; else the connection drops
		copiesOK int64
	}{
		{"first piece", 1, 3*ownerPiece + 5, true, 0},
		{"mid-stream", 3, 3*ownerPiece + 5, false, 2},
		{"last piece", 4, 3*ownerPiece + 5, false, 3},
		{"single piece", 1, 1000, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cudatest.NoLeaks(t)
			r, want, srv := deviceOwner(t, tc.n)
			var mu sync.Mutex
			copied := map[int64]bool{}
			trace := func(step string, k int64) {
				mu.Lock()
				defer mu.Unlock()
				if step == "copied" {
					copied[k] = true
				}
			}
			srv.traceFn.Store(&trace)
			cudatest.Set(t, "faildtoh", tc.failAt)
			_, err := readHost(t, r)
			require.Error(t, err)
			var re *peerauth.RemoteError
			if tc.remote {
				require.ErrorAs(t, err, &re)
				require.Equal(t, peerauth.StatusInternal, re.Code)
				require.Contains(t, re.Message, "cuMemcpyDtoHAsync")
			} else {
				require.ErrorIs(t, err, fabric.ErrPeerClosed)
			}
			mu.Lock()
			require.Len(t, copied, int(min(tc.failAt, (tc.n+ownerPiece-1)/ownerPiece)), "every copy started was waited for")
			mu.Unlock()
			// The device recovers: the same owner serves the next read.
			cudatest.SetNow("faildtoh", 0)
			got, err := readHost(t, r)
			require.NoError(t, err)
			require.True(t, bytes.Equal(got, want))
		})
	}
}

// BenchmarkDeviceOwnerStaging reads device memory (the fake CUDA driver)
// into host memory over loopback, alternating the owner's pipelined
// staging (a ring of two 4 MiB pinned pieces, piece k+1 copied while k is
// sent) with staging the whole range before sending (as before), A B A B
// in one run: ratio = whole time / pipelined time. On the fake driver a
// device copy is a memcpy done when issued, so what overlaps is a CPU copy
// with the socket's on the same cores; the figure means little on a CPU.
// scripts/gpu-check.sh measures device paths on a GPU.
func BenchmarkDeviceOwnerStaging(b *testing.B) {
	for _, n := range []int64{64 << 20, 256 << 20} {
		b.Run(sizeName(n), func(b *testing.B) {
			lib := cudatest.FakeLibrary(b)
			ctx := context.Background()
			owner, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0})
			require.NoError(b, err)
			defer owner.Close()
			obj, err := owner.Alloc(ctx, n)
			require.NoError(b, err)
			defer obj.Release()
			ownerKey, ownerID := testhelp.Key(b)
			srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey},
				Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) { return devPin{obj}, nil })})
			require.NoError(b, err)
			defer srv.Close()
			readerKey, _ := testhelp.Key(b)
			tr, err := New(Config{Security: fabric.Security{Identity: readerKey}, Compression: CompressOff})
			require.NoError(b, err)
			defer tr.Close()
			dst, err := tensor.NewHostMemory(0).Alloc(ctx, n)
			require.NoError(b, err)
			defer dst.Release()
			r := fabric.Remote{
				Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
				Peer:     ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
				Claim: fabric.Claim{Object: fabric.ObjectID{6}, Incarnation: 1}, Length: n, DType: tensor.Uint8,
			}
			read := func(whole bool) time.Duration {
				srv.wholeStage.Store(whole)
				t0 := time.Now()
				if _, err := tr.Read(ctx, r, dst); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			read(true) // warm: connection, pinned caches, page faults
			read(false)
			var wholes, pipes []time.Duration
			b.SetBytes(2 * n)
			for b.Loop() {
				if len(wholes)%2 == 0 {
					wholes = append(wholes, read(true))
					pipes = append(pipes, read(false))
				} else {
					pipes = append(pipes, read(false))
					wholes = append(wholes, read(true))
				}
			}
			reportPairs(b, n, "whole", wholes, "pipelined", pipes)
		})
	}
}

// A push into device memory goes into the device a piece at a time while
// the rest arrives (the owner's copies of verified bytes, one in flight),
// bytes whole; a copy that fails is refused with a status once the push is
// received (the connection stays in step), and nothing leaks.
func TestDevicePushCopiedInAsItArrives(t *testing.T) {
	cudatest.NoLeaks(t)
	lib := cudatest.FakeLibrary(t)
	ctx := context.Background()
	owner, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0})
	require.NoError(t, err)
	defer owner.Close()
	const n = 3*ownerPiece + 5
	sink, err := owner.Alloc(ctx, n)
	require.NoError(t, err)
	defer sink.Release()
	ownerKey, ownerID := testhelp.Key(t)
	srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound }),
		Sink:   sinkOf(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return devPin{sink}, nil })})
	require.NoError(t, err)
	defer srv.Close()
	readerKey, _ := testhelp.Key(t)
	tr, err := New(Config{Security: fabric.Security{Identity: readerKey}, Streams: 1})
	require.NoError(t, err)
	defer tr.Close()
	src, err := tensor.NewHostMemory(0).Alloc(ctx, n)
	require.NoError(t, err)
	defer src.Release()
	want, _ := tensor.BytesOf(src)
	for i := range want {
		want[i] = byte(i*3 + i>>10)
	}
	dst := fabric.Remote{Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer: ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
		Claim: fabric.Claim{Object: fabric.ObjectID{8}, Incarnation: 1}, Length: n, DType: tensor.Uint8}
	before := cudatest.Live("htod")
	_, err = tr.Write(ctx, src, dst)
	require.NoError(t, err)
	got := make([]byte, n)
	require.NoError(t, sink.(*cuda.Buffer).CopyOut(ctx, 0, got))
	require.True(t, bytes.Equal(got, want), "device push over tcp differs")
	require.GreaterOrEqual(t, cudatest.Live("htod")-before, int64(3), "copied in as it arrived, not once at the end")

	cudatest.Set(t, "failhtod", 2)
	_, err = tr.Write(ctx, src, dst)
	var re *peerauth.RemoteError
	require.ErrorAs(t, err, &re)
	require.Equal(t, peerauth.StatusInternal, re.Code)
	require.Contains(t, re.Message, "cuMemcpyHtoDAsync")
	cudatest.SetNow("failhtod", 0)
	_, err = tr.Write(ctx, src, dst) // the same pooled connection: still in step
	require.NoError(t, err)
}

// A reader's device copies start while the read is still arriving: a
// 12 MiB read (one segment) into CUDA memory goes into the device in
// pieces, not in one copy once received; the bytes arrive whole.
func TestDeviceReadCopiedInAsItArrives(t *testing.T) {
	cudatest.NoLeaks(t)
	r, want, _ := deviceOwner(t, 3*ownerPiece+5)
	reader, err := cuda.NewMemory(cuda.Config{Library: cudatest.FakeLibrary(t), Device: 1})
	require.NoError(t, err)
	defer reader.Close()
	ctx := context.Background()
	dst, err := reader.Alloc(ctx, r.Length)
	require.NoError(t, err)
	defer dst.Release()
	readerKey, _ := testhelp.Key(t)
	tr, err := New(Config{Security: fabric.Security{Identity: readerKey}, Streams: 1})
	require.NoError(t, err)
	defer tr.Close()
	before := cudatest.Live("htod")
	_, err = tr.Read(ctx, r, dst)
	require.NoError(t, err)
	require.GreaterOrEqual(t, cudatest.Live("htod")-before, int64(3), "copied in as it arrived")
	got := make([]byte, r.Length)
	require.NoError(t, dst.(*cuda.Buffer).CopyOut(ctx, 0, got))
	require.True(t, bytes.Equal(got, want))
}
