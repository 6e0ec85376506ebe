package rdt

import (
	"github.com/tensorlane/tensorlane/rdt/internal/claims"
	"github.com/tensorlane/tensorlane/tensor/backend"
)

// The devices a runtime claims (rdt/internal/devset) get their memory
// from tensor/backend's registry: on a discovered host, each device's vendor back-end (CUDA,
// HIP) whenever its driver is usable, simulated memory otherwise (logged
// as a warning, with why); on a preset host, simulated memory. Config's
// DeviceBackend (else $TENSORLANE_DEVICE_BACKEND) asks for "sim", "real"
// or one back-end ("cuda", "hip") for every device. What each device got
// is in the log, in MemoryStats (MemStats.Backend), and so in `tensorlane
// env`, the dashboard and the memory metrics.

// EnvDeviceBackend is read when Config.DeviceBackend is empty (unless
// IgnoreEnv): auto, sim, real, cuda, hip.
const EnvDeviceBackend = backend.EnvMode

// visibleFromDriverEnv returns the first driver visibility variable that is
// set (CUDA's, HIP's, ROCm's), parsed like CUDA_VISIBLE_DEVICES.
var visibleFromDriverEnv = claims.DriverVisible
