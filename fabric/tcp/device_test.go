package tcp

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
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
