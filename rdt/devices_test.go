package rdt

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
	"github.com/tensorlane/tensorlane/topology"
)

// syncBuffer is a log destination tests read while runtimes write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A runtime on a real (discovered) host with the driver there opens its
// GPUs as CUDA memory by itself, without Config.Devices: the registry
// picks the back-end, the log and MemoryStats say which, and a Put on one
// GPU reads into the other as a device peer copy.
func TestRuntimeOpensCUDADevices(t *testing.T) {
	cudatest.NoLeaks(t)
	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	cl.Hosts[0].Simulated = false // as topology.Discover builds it
	var logs syncBuffer
	r, err := New(ctx, Config{Cluster: cl, IgnoreEnv: true, RuntimeDir: t.TempDir(), VisibleDevices: []int{0, 1},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer r.Shutdown(ctx)

	var backends []string
	for _, s := range r.MemoryStats() {
		backends = append(backends, s.Device.String()+"="+s.Backend)
	}
	assert.Equal(t, []string{"cpu:0=host", "gpu:0=cuda", "gpu:1=cuda"}, backends)
	assert.Contains(t, logs.String(), `backends="gpu:0=cuda gpu:1=cuda"`)

	owner, err := r.Spawn("owner")
	require.NoError(t, err)
	reader, err := r.Spawn("reader")
	require.NoError(t, err)
	mem, err := r.Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	x, err := tensor.Alloc(ctx, mem, tensor.Float32, 1000, 257)
	require.NoError(t, err)
	want := make([]byte, x.Buffer().Len())
	for i := range want {
		want[i] = byte(i*13 + i>>9)
	}
	require.NoError(t, x.Buffer().(*cuda.Buffer).CopyIn(ctx, 0, want))
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	plan := reader.Explain(ref, tensor.GPUDevice(1))
	assert.Contains(t, plan.String(), "into gpu:1's cuda memory", "Explain says which back-end holds the destination")
	got, xfer, err := reader.Fetch(ctx, ref, tensor.GPUDevice(1))
	require.NoError(t, err)
	defer got.Release()
	assert.Equal(t, fabric.P2P, xfer.Stats.Transport)
	out := make([]byte, len(want))
	require.NoError(t, got.Buffer().(*cuda.Buffer).CopyOut(ctx, 0, out))
	require.True(t, bytes.Equal(out, want), "bytes differ after a GPU-to-GPU Get")
	require.NoError(t, owner.Free(ctx, ref))
}

// Without the driver the same runtime simulates its GPUs and warns, saying
// why; TENSORLANE_DEVICE_BACKEND=real makes it an error instead.
func TestRuntimeWithoutDriverSimulatesLoudly(t *testing.T) {
	t.Setenv(cuda.LibraryEnv, "/nonexistent/libcuda.so.1")
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	cl.Hosts[0].Simulated = false
	var logs syncBuffer
	r, err := New(ctx, Config{Cluster: cl, IgnoreEnv: true, RuntimeDir: t.TempDir(), VisibleDevices: []int{2}, DeviceMemory: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	st := r.MemoryStats()
	require.NoError(t, r.Shutdown(ctx))
	assert.Equal(t, "sim", st[1].Backend)
	assert.Contains(t, logs.String(), "level=WARN msg=\"device memory is simulated\"")
	assert.Contains(t, logs.String(), "cuda driver not usable")

	_, err = New(ctx, Config{Cluster: cl, IgnoreEnv: true, RuntimeDir: t.TempDir(), VisibleDevices: []int{2}, DeviceBackend: "real"})
	require.ErrorIs(t, err, cuda.ErrUnavailable)
	assert.Contains(t, err.Error(), "rdt: host h0 devices: backend cuda")
}

// HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES hand a process its GPUs as
// CUDA_VISIBLE_DEVICES does (consulted after it).
func TestHIPVisibleDevices(t *testing.T) {
	for _, name := range []string{"HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"} {
		t.Run(name, func(t *testing.T) {
			unsetenv(t, EnvDevices)
			unsetenv(t, EnvCUDAVisible)
			unsetenv(t, "HIP_VISIBLE_DEVICES")
			unsetenv(t, "ROCR_VISIBLE_DEVICES")
			t.Setenv(name, "3,1")
			cfg := Config{}
			c, err := cfg.withDefaults()
			require.NoError(t, err)
			assert.Equal(t, []int{3, 1}, c.VisibleDevices)
			t.Setenv(name, "GPU-abc")
			_, err = cfg.withDefaults()
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "rdt: "+name), err.Error())
		})
	}
}

// unsetenv removes a variable for the rest of the test.
func unsetenv(t *testing.T, k string) {
	t.Helper()
	t.Setenv(k, "") // registers the restore
	os.Unsetenv(k)
}
