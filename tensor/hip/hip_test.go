package hip_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
	"github.com/tensorlane/tensorlane/tensor/hip"
	"github.com/tensorlane/tensorlane/tensor/hip/hiptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newFake(t *testing.T, cfg hip.Config) *hip.Memory {
	t.Helper()
	cfg.Library = hiptest.FakeLibrary(t)
	m, err := hip.NewMemory(cfg)
	if err != nil {
		t.Fatalf("NewMemory: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7) ^ seed
	}
	return p
}

func TestLoadRefusesMissingLibrary(t *testing.T) {
	_, err := hip.Load(filepath.Join(t.TempDir(), "libamdhip64.so"))
	var ue *hip.UnavailableError
	if !errors.Is(err, hip.ErrUnavailable) || !errors.Is(err, cuda.ErrUnavailable) || !errors.As(err, &ue) {
		t.Fatalf("got %v, want an UnavailableError matching hip.ErrUnavailable", err)
	}
	if !strings.HasPrefix(err.Error(), "hip: unavailable") || !strings.Contains(ue.Reason, "dlopen") {
		t.Errorf("the error does not say what failed: %v", err)
	}
	if _, err := hip.NewMemory(hip.Config{Library: "/nonexistent/libamdhip64.so"}); !errors.Is(err, hip.ErrUnavailable) {
		t.Errorf("NewMemory: %v, want ErrUnavailable", err)
	}
}

func TestLoadRefusesOtherLibraries(t *testing.T) {
	_, err := hip.Load("libc.so.6")
	if !errors.Is(err, hip.ErrUnavailable) || !strings.Contains(err.Error(), "entry point hipInit missing") {
		t.Fatalf("got %v, want a missing hipInit", err)
	}
	// Nor is a CUDA driver a HIP runtime, though its entry points have the
	// same shapes.
	if _, err := hip.Load(cudatest.FakeLibrary(t)); !errors.Is(err, hip.ErrUnavailable) {
		t.Errorf("the fake libcuda loaded as HIP: %v", err)
	}
}

func TestNoDevice(t *testing.T) {
	// A runtime of its own, built afresh: drivers are cached per library,
	// and this one must run hipInit with the knob set.
	p, err := hiptest.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	defer purego.Dlclose(lib)
	var set func(string, int64) int32
	purego.RegisterLibFunc(&set, lib, "fakehip_set")
	set("noinit", 1)
	_, err = hip.Load(p)
	var e *cuda.Error
	if !errors.Is(err, hip.ErrUnavailable) || !errors.As(err, &e) || e.Code != cuda.ErrorNoDevice {
		t.Fatalf("got %v, want ErrUnavailable wrapping hipErrorNoDevice", err)
	}
	if e.Op != "hipInit" || e.Name != "hipErrorNoDevice" || !strings.HasPrefix(e.Error(), "hip: hipInit: hipErrorNoDevice") {
		t.Errorf("the error names CUDA's call, not HIP's: %v (op %q, name %q)", e, e.Op, e.Name)
	}
}

func TestDiscovery(t *testing.T) {
	d, err := hip.Load(hiptest.FakeLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	if d.API() != hip.API {
		t.Fatal("driver is not HIP's")
	}
	devs, err := d.Devices()
	if err != nil || len(devs) != 2 {
		t.Fatalf("%d devices, %v", len(devs), err)
	}
	got := devs[1]
	// HIP numbers attributes its own way: the fake answers only HIP's
	// numbers, so right values here mean the mapping was used. HIP has no
	// fabric or GPUDirect attributes; POSIX fd handles come with VMM.
	if got.PCIBusID != "0000:19:00.0" || got.Compute != [2]int{9, 0} || got.SMs != 132 || !got.VMM || !got.PosixFD ||
		got.Fabric || got.GPUDirectRDMA || len(got.Peers) != 1 {
		t.Errorf("device 1: %+v", got)
	}
}

func TestCopiesAndPeers(t *testing.T) {
	for _, mode := range []hip.Mode{hip.ModeVMM, hip.ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			hiptest.NoLeaks(t)
			hiptest.Set(t, "notready", 2)
			ctx := context.Background()
			m0 := newFake(t, hip.Config{Device: 0, Mode: mode, StagingChunk: 64 << 10})
			m1 := newFake(t, hip.Config{Device: 1, Mode: mode, ID: tensor.GPUDevice(5)})
			if m1.Device() != tensor.GPUDevice(5) {
				t.Errorf("Config.ID ignored: %v", m1.Device())
			}
			if err := m0.EnablePeerAccess(m1); err != nil {
				t.Fatal(err)
			}
			const n = 300<<10 + 17
			src := pattern(n, 3)
			host := tensor.NewHostMemory(0)
			defer host.Close()
			hb, _ := host.Alloc(ctx, n)
			defer hb.Release()
			hp, _ := tensor.BytesOf(hb)
			copy(hp, src)
			a, err := m0.Alloc(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Release()
			b, _ := m0.Alloc(ctx, n)
			defer b.Release()
			c, _ := m1.Alloc(ctx, n)
			defer c.Release()
			for _, step := range []struct {
				dst, src tensor.Buffer
				what     string
			}{{a, hb, "host to device"}, {b, a, "device to device"}, {c, b, "peer (hipMemcpyPeerAsync by ordinal)"}} {
				if err := tensor.Copy(ctx, step.dst, 0, step.src, 0, n); err != nil {
					t.Fatalf("%s: %v", step.what, err)
				}
			}
			clear(hp)
			if err := tensor.Copy(ctx, hb, 0, c, 0, n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(hp, src) {
				t.Fatal("bytes differ after host -> device -> device -> peer -> host")
			}
			if _, err := m0.Alloc(ctx, 2<<30); !errors.Is(err, tensor.ErrOutOfMemory) {
				t.Errorf("2 GiB on a 1 GiB device: %v, want ErrOutOfMemory", err)
			}
		})
	}
}

// A VMM allocation travels as a HIP fd handle, opens through tensor.Import
// (the process's HIP importer), read-only when asked; a CUDA importer
// never takes it.
func TestExportImport(t *testing.T) {
	hiptest.NoLeaks(t)
	ctx := context.Background()
	m := newFake(t, hip.Config{Mode: hip.ModeVMM})
	const n = 3 << 20
	src := pattern(n, 9)
	b, _ := m.Alloc(ctx, n)
	defer b.Release()
	if err := b.(*hip.Buffer).CopyIn(ctx, 0, src); err != nil {
		t.Fatal(err)
	}
	h, err := b.(*hip.Buffer).Export(tensor.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(h.FD)
	if h.Kind != tensor.HandleHIPFD || h.Kind.String() != "hip-fd" {
		t.Fatalf("handle kind %v, want hip-fd", h.Kind)
	}
	ib, err := tensor.Import(ctx, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ib.Release()
	got := make([]byte, n)
	if err := ib.(*hip.Buffer).CopyOut(ctx, 0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("imported bytes differ")
	}
	if err := ib.(*hip.Buffer).CopyIn(ctx, 0, got[:10]); !errors.Is(err, hip.ErrReadOnly) {
		t.Errorf("write into a read-only import: %v, want ErrReadOnly", err)
	}
	// The same handle presented as a CUDA one: no CUDA device is open.
	h.Kind = tensor.HandleCUDAFD
	if _, err := tensor.Import(ctx, h, nil); !errors.Is(err, tensor.ErrNoImporter) {
		t.Errorf("a CUDA import without a CUDA device: %v, want ErrNoImporter", err)
	}
	// And a HIP memory refuses a CUDA kind outright.
	if _, err := m.Import(ctx, h); !errors.Is(err, tensor.ErrNotExportable) || !strings.Contains(err.Error(), "not a hip handle") {
		t.Errorf("HIP import of a CUDA handle: %v", err)
	}
}
