package shm

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

// CUDA memory over the p2p path, on the fake driver (real purego calls,
// real fd passing over the authenticated socket; "device memory" is host
// memory there): the owner's buffer exports its per-allocation fd, the
// reader imports it read-only and copies device to device, into host
// memory, and pushes the other way through a writable import. Between two
// processes on a real GPU scripts/gpu-check.sh runs the same path.
func TestCUDAMemory(t *testing.T) {
	for _, mode := range []cuda.Mode{cuda.ModeVMM} {
		t.Run(mode.String(), func(t *testing.T) {
			cudatest.NoLeaks(t)
			lib := cudatest.FakeLibrary(t)
			ctx := context.Background()
			owner, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0, Mode: mode})
			require.NoError(t, err)
			defer owner.Close()
			reader, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 1, Mode: mode})
			require.NoError(t, err)
			defer reader.Close()

			const n = 3<<20 + 3
			want := make([]byte, n)
			fillPattern(want, 5)
			obj, err := owner.Alloc(ctx, n)
			require.NoError(t, err)
			defer obj.Release()
			require.NoError(t, obj.(*cuda.Buffer).CopyIn(ctx, 0, want))
			sink, err := owner.Alloc(ctx, n)
			require.NoError(t, err)
			defer sink.Release()

			claim := fabric.Claim{Object: fabric.ObjectID{9}, Incarnation: 1}
			open := func(b tensor.Buffer) fabric.SourceFunc {
				return func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
					if c.Object != claim.Object {
						return nil, fabric.ErrObjectNotFound
					}
					return pinOf{b}, nil
				}
			}
			ownerKey, ownerID := key(t)
			srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: open(obj), Sink: sinkFunc(open(sink))})
			require.NoError(t, err)
			defer srv.Close()
			readerKey, _ := key(t)
			tr, err := NewP2P(Config{Security: fabric.Security{Identity: readerKey}, Topology: dgx(t)})
			require.NoError(t, err)
			defer tr.Close()
			remote := fabric.Remote{
				Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
				Peer:     ownerID.String(), Addrs: map[string]string{fabric.SHM: srv.Addr()},
				Claim: claim, Length: n,
			}

			// Device to device (the owner's GPU 0 to the reader's GPU 1).
			dst, err := reader.Alloc(ctx, n)
			require.NoError(t, err)
			defer dst.Release()
			_, err = tr.Read(ctx, remote, dst)
			require.NoError(t, err)
			got := make([]byte, n)
			require.NoError(t, dst.(*cuda.Buffer).CopyOut(ctx, 0, got))
			require.True(t, bytes.Equal(got, want), "device-to-device read differs")

			// Into host memory, a window of the object.
			hb, hp := hostDst(t, 1000)
			win := remote
			win.Offset, win.Length = 12345, 1000
			_, err = tr.Read(ctx, win, hb)
			require.NoError(t, err)
			require.True(t, bytes.Equal(hp, want[12345:13345]), "device-to-host read differs")

			// Push from the reader's device into the owner's sink.
			_, err = tr.Write(ctx, dst, remote)
			require.NoError(t, err)
			clear(got)
			require.NoError(t, sink.(*cuda.Buffer).CopyOut(ctx, 0, got))
			require.True(t, bytes.Equal(got, want), "pushed bytes differ")

			// A simulated owner's memory file into device memory.
			f := newFixture(t, 1<<20, nil)
			d2, err := reader.Alloc(ctx, 1<<20)
			require.NoError(t, err)
			defer d2.Release()
			_, err = f.cli.SHM().Read(ctx, f.remote(1<<20), d2)
			require.NoError(t, err)
			got = make([]byte, 1<<20)
			require.NoError(t, d2.(*cuda.Buffer).CopyOut(ctx, 0, got))
			require.True(t, bytes.Equal(got, f.data), "memory file to device differs")
		})
	}
}

// pinOf lends a device buffer as a pin: no Bytes (it is not host visible),
// its own Export, and Unwrap so copies reach it.
type pinOf struct{ b tensor.Buffer }

func (p pinOf) Device() tensor.DeviceID                       { return p.b.Device() }
func (p pinOf) Len() int64                                    { return p.b.Len() }
func (p pinOf) Release() error                                { return nil }
func (p pinOf) Export(a tensor.Access) (tensor.Handle, error) { return tensor.ExportOf(p.b, a) }
func (p pinOf) Unwrap() (tensor.Buffer, int64)                { return p.b, 0 }

// helperCUDAEnv ("library,mode") makes the owner process keep its objects
// in CUDA memory of that driver.
const helperCUDAEnv = "TENSORLANE_SHM_HELPER_CUDA"

// cudaAlloc returns an allocator of filled objects in CUDA device 0.
func cudaAlloc(lib, mode string) (func(int64, uint64) (tensor.Buffer, error), error) {
	cfg := cuda.Config{Library: lib, Mode: cuda.ModeVMM}
	if mode == cuda.ModeLegacy.String() {
		cfg.Mode = cuda.ModeLegacy
	}
	m, err := cuda.NewMemory(cfg)
	if err != nil {
		return nil, err
	}
	return func(n int64, seed uint64) (tensor.Buffer, error) {
		b, err := m.Alloc(context.Background(), n)
		if err != nil {
			return nil, err
		}
		p := make([]byte, n)
		fillWords(p, seed)
		return b, b.(*cuda.Buffer).CopyIn(context.Background(), 0, p)
	}, nil
}

// TestCrossProcessCUDA reads from, and pushes into, CUDA memory of a real
// second process over the p2p path: the allocation's handle (a VMM POSIX
// fd, or a legacy IPC handle, which CUDA opens only in another process)
// crosses the authenticated socket and is imported here. On the fake
// driver; scripts/gpu-check.sh runs the same with the real one.
func TestCrossProcessCUDA(t *testing.T) {
	lib := cudatest.FakeLibrary(t)
	for _, mode := range []cuda.Mode{cuda.ModeVMM, cuda.ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			cudatest.NoLeaks(t)
			t.Setenv(helperCUDAEnv, lib+","+mode.String())
			sizes := []int64{4095, 5<<20 + 1}
			h := startHelper(t, sizes...)
			k, _ := key(t)
			cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(t)})
			require.NoError(t, err)
			defer cli.Close()
			mem, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 1, Mode: mode})
			require.NoError(t, err)
			defer mem.Close()
			ctx := context.Background()
			for i, n := range sizes {
				dst, err := mem.Alloc(ctx, n)
				require.NoError(t, err)
				st, err := cli.P2P().Read(ctx, h.remote(i, 0, n), dst)
				require.NoError(t, err)
				require.Equal(t, n, st.Bytes)
				got := make([]byte, n)
				require.NoError(t, dst.(*cuda.Buffer).CopyOut(ctx, 0, got))
				require.Equal(t, -1, checkWords(got, h.info.Objects[i].Seed, 0, n), "first wrong byte")
				// Into host memory, a range that starts mid-word.
				off, m := n/3+3, n/2
				hb, hp := hostDst(t, m)
				_, err = cli.P2P().Read(ctx, h.remote(i, off, m), hb)
				require.NoError(t, err)
				require.Equal(t, -1, checkWords(hp, h.info.Objects[i].Seed, off, n), "first wrong byte of the range")
				// Push our device bytes back into the owner's object, then
				// read them again: the same pattern, so it verifies.
				_, err = cli.P2P().Write(ctx, dst, h.remote(i, 0, n))
				require.NoError(t, err)
				require.NoError(t, dst.Release())
			}
			// One import per object and direction, cached: the range read
			// reused the first read's import (no descriptor crossed).
			st := cli.CacheStats()
			require.EqualValues(t, len(sizes), st.Pull.Mapped, "imports for reads")
			require.EqualValues(t, len(sizes), st.Pull.Hits, "cached imports used")
			require.EqualValues(t, len(sizes), st.Push.Mapped, "imports for pushes")
		})
	}
}

// Device grants on the wire: the kind rides in the flags' high nibble,
// with or without a descriptor; device bits without a kind, or unknown
// bits, are corrupt.
func TestDeviceGrantWire(t *testing.T) {
	for _, c := range []struct {
		flags byte
		ok    bool
	}{
		{flagFD | flagDevice | byte(tensor.HandleCUDAFD)<<kindShift, true},
		{flagDevice | byte(tensor.HandleCUDAIPC)<<kindShift, true}, // cached import: no descriptor
		{flagFD, true},
		{flagFD | flagDevice, false},         // no kind
		{flagFD | byte(1)<<kindShift, false}, // a kind without flagDevice
		{flagFD | 0x04, false},               // unknown bit
	} {
		g := grant{flags: c.flags, mapID: 7, fileSize: 4 << 20, objOff: 0, objLen: 100}
		got, err := parseReply(g.marshal())
		if c.ok {
			require.NoError(t, err, "flags %#x", c.flags)
			require.Equal(t, g, got)
		} else {
			require.ErrorIs(t, err, fabric.ErrCorrupt, "flags %#x", c.flags)
		}
	}
}
