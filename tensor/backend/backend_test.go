package backend_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/backend"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
	"github.com/tensorlane/tensorlane/tensor/hip"
	"github.com/tensorlane/tensorlane/tensor/hip/hiptest"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// host returns a copy of a preset's first host as if discovered (a real
// machine: not Simulated).
func host(t *testing.T, preset string, discovered bool) *topology.Host {
	t.Helper()
	c, err := topology.Preset(preset, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := c.Hosts[0]
	h.Simulated = !discovered
	return h
}

func open(t *testing.T, cfg backend.Config) []backend.Device {
	t.Helper()
	devs, err := backend.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range devs {
			if c, ok := d.Memory.(interface{ Close() error }); ok {
				if err := c.Close(); err != nil {
					t.Errorf("close %v: %v", d.ID, err)
				}
			}
		}
	})
	return devs
}

func backends(devs []backend.Device) string { return backend.Summary(devs) }

func TestRegistry(t *testing.T) {
	if got := strings.Join(backend.Names(), ","); got != "sim,cuda,hip" {
		t.Errorf("built-in back-ends %q", got)
	}
	if _, err := backend.Open(context.Background(), backend.Config{Host: host(t, "dgx-h100", false), Mode: "tpu-magic"}); !errors.Is(err, backend.ErrUnknownBackend) {
		t.Errorf("unknown mode: %v", err)
	}
}

// A preset's devices are simulated, and say so.
func TestPresetIsSimulated(t *testing.T) {
	devs := open(t, backend.Config{Host: host(t, "dgx-h100", false), Visible: []int{3, 1}, Capacity: 1 << 20})
	if got := backends(devs); got != "gpu:3=sim gpu:1=sim" {
		t.Fatalf("got %q", got)
	}
	if !strings.Contains(devs[0].Note, "preset") || devs[0].Memory.Stats().Backend != "sim" || !devs[0].Memory.Stats().Simulated {
		t.Errorf("note %q, stats %+v", devs[0].Note, devs[0].Memory.Stats())
	}
}

// On a discovered NVIDIA host with a usable driver the GPUs are CUDA
// memory, found by PCI bus ID (gpu:0 is the fake's 0000:18:00.0) or, when
// the bus IDs do not match, by rank; the memory answers to the host's
// index, not the driver's ordinal.
func TestDiscoveredNVIDIAHostUsesCUDA(t *testing.T) {
	cudatest.NoLeaks(t)
	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	devs := open(t, backend.Config{Host: host(t, "dgx-h100", true), Visible: []int{0, 5}})
	if got := backends(devs); got != "gpu:0=cuda gpu:5=cuda" {
		t.Fatalf("got %q (notes %q, %q)", got, devs[0].Note, devs[1].Note)
	}
	m5 := devs[1].Memory.(*cuda.Memory)
	if m5.Device() != tensor.GPUDevice(5) || m5.Info().Ordinal != 1 || m5.Stats().Backend != "cuda" || m5.Stats().Simulated {
		t.Errorf("gpu:5 is %v on ordinal %d, stats %+v", m5.Device(), m5.Info().Ordinal, m5.Stats())
	}
	if o := devs[0].Memory.(*cuda.Memory).Info().Ordinal; o != 0 {
		t.Errorf("gpu:0 (bus 0000:18:00.0) on ordinal %d", o)
	}
	// Bytes really go through the back-end.
	ctx := context.Background()
	b, err := devs[1].Memory.Alloc(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if !tensor.IsDevice(b) {
		t.Error("CUDA memory is not device memory")
	}
}

// No driver: auto simulates, loudly (the note says why); real refuses.
func TestMissingDriver(t *testing.T) {
	t.Setenv(cuda.LibraryEnv, "/nonexistent/libcuda.so.1")
	h := host(t, "dgx-h100", true)
	devs := open(t, backend.Config{Host: h, Visible: []int{0}, Capacity: 1 << 20})
	if devs[0].Backend != "sim" || !strings.Contains(devs[0].Note, "cuda driver not usable") || !strings.Contains(devs[0].Note, "/nonexistent/libcuda.so.1") {
		t.Errorf("got %s, note %q", devs[0].Backend, devs[0].Note)
	}
	_, err := backend.Open(context.Background(), backend.Config{Host: h, Visible: []int{0}, Mode: backend.ModeReal})
	if !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, cuda.ErrUnavailable) {
		t.Errorf("real without a driver: %v", err)
	}
}

// The driver sees fewer GPUs than the process claims (it was handed one):
// in auto the rest are simulated, saying so; in real it is an error, and
// what was opened is closed again.
func TestDriverSeesFewerDevices(t *testing.T) {
	cudatest.NoLeaks(t)
	cudatest.Set(t, "devices", 1)
	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	h := host(t, "dgx-h100", true)
	devs := open(t, backend.Config{Host: h, Visible: []int{0, 1}, Capacity: 1 << 20})
	if got := backends(devs); got != "gpu:0=cuda gpu:1=sim" || !strings.Contains(devs[1].Note, "sees no such device") {
		t.Errorf("got %q, note %q", got, devs[1].Note)
	}
	if _, err := backend.Open(context.Background(), backend.Config{Host: h, Visible: []int{0, 1}, Mode: backend.ModeReal}); !errors.Is(err, backend.ErrNoOrdinal) {
		t.Errorf("real: %v", err)
	}
}

// AMD GPUs go to HIP; "sim" simulates them even with the runtime there;
// forcing "hip" opens a preset's devices on the driver's GPUs by rank.
func TestAMD(t *testing.T) {
	hiptest.NoLeaks(t)
	t.Setenv(hip.LibraryEnv, hiptest.FakeLibrary(t))
	devs := open(t, backend.Config{Host: host(t, "mi355x", true), Visible: []int{0, 1}})
	if got := backends(devs); got != "gpu:0=hip gpu:1=hip" || devs[1].Memory.Stats().Backend != "hip" {
		t.Fatalf("got %q", got)
	}
	sim := open(t, backend.Config{Host: host(t, "mi355x", true), Visible: []int{0}, Mode: backend.ModeSim, Capacity: 1 << 20})
	if sim[0].Backend != "sim" || !strings.Contains(sim[0].Note, "as asked") {
		t.Errorf("sim mode: %s %q", sim[0].Backend, sim[0].Note)
	}
	forced := open(t, backend.Config{Host: host(t, "dgx-h100", false), Visible: []int{7, 2, 4}, Mode: "hip", Capacity: 1 << 20})
	if forced[0].Backend != "hip" || forced[0].ID != tensor.GPUDevice(7) || forced[0].Memory.(*hip.Memory).Info().Ordinal != 0 {
		t.Errorf("forced hip: %+v", forced[0])
	}
	// The fake has two GPUs: the third device stays a model, saying so.
	if got := backends(forced); got != "gpu:7=hip gpu:2=hip gpu:4=sim" || !strings.Contains(forced[2].Note, "no device for it") {
		t.Errorf("forced hip beyond the driver's devices: %q, note %q", got, forced[2].Note)
	}
}

// real on a device kind nothing drives is an error naming it.
func TestRealWithoutBackend(t *testing.T) {
	_, err := backend.Open(context.Background(), backend.Config{Host: host(t, "tpu-v5p", true), Visible: []int{0}, Mode: backend.ModeReal})
	if err == nil || !strings.Contains(err.Error(), "no back-end drives google tpu devices") {
		t.Errorf("got %v", err)
	}
}
