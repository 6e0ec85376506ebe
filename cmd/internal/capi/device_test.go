package capi

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor/backend"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
	"github.com/tensorlane/tensorlane/tensor/hip"
	"github.com/tensorlane/tensorlane/tensor/hip/hiptest"
)

func devPtr(p uint64) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), uintptr(p)) }

// Device memory through the C ABI's Go side, on the fake CUDA driver: a
// runtime whose GPUs are CUDA memory (TENSORLANE_DEVICE_BACKEND=cuda on
// the default preset, CUDA_VISIBLE_DEVICES=0,1) allocates device memory,
// copies host bytes in, publishes it in place; another runtime reads it
// into its own device memory on the other GPU and copies it out. A
// foreign device pointer (memory this runtime did not allocate) is
// published through one device copy.
func TestDeviceMemoryAcrossTheABI(t *testing.T) {
	cudatest.NoLeaks(t)
	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	t.Setenv(backend.EnvMode, "cuda")
	t.Setenv("CUDA_VISIBLE_DEVICES", "0,1")
	_, a, b := pair(t, `{"sim_devices":true,"log_level":"warn"}`)
	ctx := context.Background()
	cuda0, cuda1 := Device{Type: DLCUDA, Index: 0}, Device{Type: DLCUDA, Index: 1}
	const n = 3<<20 + 5
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + i>>10)
	}
	src, err := a.DeviceAlloc(ctx, cuda0, n)
	require.NoError(t, err)
	require.NoError(t, a.DeviceCopy(ctx, cuda0, devPtr(src), Device{Type: DLCPU}, unsafe.Pointer(&want[0]), n))
	ref, err := a.PutDevice(ctx, DeviceRegion{Device: cuda0, Ptr: src, DType: "uint8", Shape: []int64{n}})
	require.NoError(t, err)
	assert.EqualValues(t, 1, a.stats.zeroCopyPuts.Load(), "memory from DeviceAlloc is published in place")

	dst, err := b.DeviceAlloc(ctx, cuda1, n)
	require.NoError(t, err)
	x, err := b.GetDevice(ctx, ref, cuda1, dst, n, 0, 10*time.Second)
	require.NoError(t, err)
	// The allocation's own handle, imported on the other GPU: no host copy.
	assert.Equal(t, fabric.P2P, x.Stats.Transport, "plan %+v", x.Plan.Candidates)
	got := make([]byte, n)
	require.NoError(t, b.DeviceCopy(ctx, Device{Type: DLCPU}, unsafe.Pointer(&got[0]), cuda1, devPtr(dst), n))
	require.True(t, bytes.Equal(got, want), "bytes differ after device -> device across runtimes")

	// b's allocation is foreign to a: published through a device copy.
	ref2, err := a.PutDevice(ctx, DeviceRegion{Device: cuda1, Ptr: dst, DType: "float32", Shape: []int64{n / 4}})
	require.NoError(t, err)
	assert.EqualValues(t, 1, a.stats.foreignPuts.Load())
	require.NoError(t, b.DeviceFree(dst)) // the object owns its copy
	clear(got)
	hostDst := got[:n/4*4]
	_, err = b.GetInto(ctx, ref2, hostDst, 0, 10*time.Second)
	require.NoError(t, err)
	require.True(t, bytes.Equal(hostDst, want[:len(hostDst)]), "device -> host Get of a foreign device Put")

	require.NoError(t, a.Free(ctx, ref, time.Second))
	require.NoError(t, a.Free(ctx, ref2, time.Second))
	require.NoError(t, a.DeviceFree(src))
	assert.ErrorIs(t, a.DeviceFree(src), ErrInvalidArgument, "twice")

	// What is not there says so, with a kind.
	_, err = a.DeviceAlloc(ctx, Device{Type: DLROCM, Index: 0}, 10)
	require.ErrorIs(t, err, rdt.ErrUnknownDevice)
	assert.Equal(t, "unknown_device", Kinds[Code(err)])
	_, err = a.DeviceAlloc(ctx, Device{Type: 7, Index: 0}, 10)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = b.GetDevice(ctx, ref, cuda1, 0, n, 0, time.Second)
	assert.Error(t, err)
}

// A runtime on a preset without a back-end asked for has simulated GPUs:
// device pointers are refused, saying why.
func TestDeviceMemoryOnSimulatedRuntime(t *testing.T) {
	t.Setenv(backend.EnvMode, "")
	t.Setenv("CUDA_VISIBLE_DEVICES", "0")
	_, a, _ := pair(t, `{"sim_devices":true}`)
	_, err := a.DeviceAlloc(context.Background(), Device{Type: DLCUDA, Index: 0}, 10)
	require.True(t, errors.Is(err, rdt.ErrUnknownDevice), "%v", err)
	assert.True(t, strings.Contains(err.Error(), "gpu:0=sim") && strings.Contains(err.Error(), "TENSORLANE_DEVICE_BACKEND=cuda"), err.Error())
}

// AMD GPUs cross the ABI the same way, as ROCm devices (DLPack type 10), on
// the HIP back-end (the fake libamdhip64 here).
func TestROCmDeviceMemory(t *testing.T) {
	hiptest.NoLeaks(t)
	t.Setenv(hip.LibraryEnv, hiptest.FakeLibrary(t))
	t.Setenv(backend.EnvMode, "hip")
	t.Setenv("CUDA_VISIBLE_DEVICES", "")
	os.Unsetenv("CUDA_VISIBLE_DEVICES")
	t.Setenv("HIP_VISIBLE_DEVICES", "1")
	_, a, _ := pair(t, `{"sim_devices":true}`)
	ctx := context.Background()
	rocm0 := Device{Type: DLROCM, Index: 0} // the host's gpu:1, HIP's ordinal 0
	want := []byte("xGMI or PCIe, the bytes are the same")
	p, err := a.DeviceAlloc(ctx, rocm0, int64(len(want)))
	require.NoError(t, err)
	require.NoError(t, a.DeviceCopy(ctx, rocm0, devPtr(p), Device{Type: DLCPU}, unsafe.Pointer(&want[0]), int64(len(want))))
	ref, err := a.PutDevice(ctx, DeviceRegion{Device: rocm0, Ptr: p, DType: "uint8", Shape: []int64{int64(len(want))}})
	require.NoError(t, err)
	got := make([]byte, len(want))
	_, err = a.GetInto(ctx, ref, got, 0, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	var backends []string
	for _, s := range a.Rdt().MemoryStats() {
		backends = append(backends, s.Device.String()+"="+s.Backend)
	}
	assert.Equal(t, []string{"cpu:0=host", "gpu:1=hip"}, backends)
	_, err = a.DeviceAlloc(ctx, Device{Type: DLCUDA, Index: 0}, 8)
	assert.ErrorIs(t, err, rdt.ErrUnknownDevice, "a HIP GPU is not a CUDA device")
	require.NoError(t, a.Free(ctx, ref, time.Second))
	require.NoError(t, a.DeviceFree(p))
}
