package tensor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DeviceKind names the kind of memory a device has. Simulated accelerators
// report the kind they stand in for (gpu) and say so in MemStats.Simulated.
type DeviceKind string

const (
	CPU    DeviceKind = "cpu"
	GPU    DeviceKind = "gpu"
	TPU    DeviceKind = "tpu"
	Neuron DeviceKind = "neuron"
	HPU    DeviceKind = "hpu"
)

// DeviceID names one device of a process's host: its kind and index.
type DeviceID struct {
	Kind  DeviceKind
	Index int
}

// HostDevice is the host's own memory.
var HostDevice = DeviceID{Kind: CPU, Index: 0}

// GPUDevice returns the ID of GPU i.
func GPUDevice(i int) DeviceID { return DeviceID{Kind: GPU, Index: i} }

func (d DeviceID) String() string { return string(d.Kind) + ":" + strconv.Itoa(d.Index) }

// IsHost reports whether the device is host memory.
func (d DeviceID) IsHost() bool { return d.Kind == CPU }

// ParseDeviceID parses "gpu:3", "cpu" or "cpu:0".
func ParseDeviceID(s string) (DeviceID, error) {
	kind, idx, found := strings.Cut(strings.TrimSpace(s), ":")
	id := DeviceID{Kind: DeviceKind(strings.ToLower(kind))}
	switch id.Kind {
	case CPU, GPU, TPU, Neuron, HPU:
	default:
		return DeviceID{}, fmt.Errorf("tensor: unknown device kind in %q", s)
	}
	if found {
		n, err := strconv.Atoi(idx)
		if err != nil || n < 0 || n > 1<<16 {
			return DeviceID{}, fmt.Errorf("tensor: bad device index in %q", s)
		}
		id.Index = n
	}
	return id, nil
}

// DLPackDevice returns the DLPack device type code (kDLCPU = 1, kDLCUDA = 2,
// kDLROCM = 10, kDLExtDev = 12 for simulated and other accelerators).
func (d DeviceID) DLPackDevice(simulated bool) int {
	switch {
	case d.Kind == CPU:
		return 1
	case simulated:
		return 12
	case d.Kind == GPU:
		return 2
	}
	return 12
}

// Memory is one device's memory. Implementations: HostMemory, SimMemory
// (simulated accelerator), and later CUDA/ROCm behind build tags.
type Memory interface {
	Device() DeviceID
	// Alloc returns a buffer of n bytes, or an *OutOfMemoryError (which
	// matches ErrOutOfMemory) when the device cannot hold it.
	Alloc(ctx context.Context, n int64) (Buffer, error)
	Stats() MemStats
}

// Buffer is an allocation in some device's memory. Release returns it to
// its allocator; it is idempotent.
type Buffer interface {
	Device() DeviceID
	Len() int64
	Release() error
}

// HostVisible is the optional capability of memory the CPU can address
// directly (host memory, simulated arenas, later CUDA host-mapped memory).
// Bytes returns nil after Release.
type HostVisible interface {
	Bytes() []byte
}

// MemStats is a snapshot of a device's memory.
type MemStats struct {
	Device    DeviceID
	Simulated bool
	// Backend names the memory's implementation, as tensor/backend's
	// registry and reports name it: "host", "slab", "sim", "cuda", "hip".
	Backend     string
	Capacity    int64 // 0 when unbounded
	Used        int64 // bytes in live allocations (after alignment)
	Free        int64
	LargestFree int64
	Allocs      int // live allocations
	Peak        int64
	Cached      int64 // released bytes kept for reuse, not in Used (host memory)
}

// ErrOutOfMemory matches every *OutOfMemoryError.
var ErrOutOfMemory = errors.New("tensor: out of device memory")

// ErrReleased is returned when a released buffer is used.
var ErrReleased = errors.New("tensor: buffer released")

// OutOfMemoryError reports a failed allocation with what was asked and what
// was left.
type OutOfMemoryError struct {
	Device      DeviceID
	Requested   int64
	Free        int64
	LargestFree int64
}

func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("tensor: out of memory on %v: requested %d bytes, %d free (largest free block %d)",
		e.Device, e.Requested, e.Free, e.LargestFree)
}

// Is makes errors.Is(err, ErrOutOfMemory) true.
func (e *OutOfMemoryError) Is(target error) bool { return target == ErrOutOfMemory }

// BytesOf returns the host-visible bytes of b, or an error if b is not host
// visible or was released.
func BytesOf(b Buffer) ([]byte, error) {
	hv, ok := b.(HostVisible)
	if !ok {
		return nil, fmt.Errorf("tensor: buffer on %v is not host visible", b.Device())
	}
	p := hv.Bytes()
	if p == nil && b.Len() > 0 {
		return nil, ErrReleased
	}
	return p, nil
}
