package rdt

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/tensorlane/tensorlane/rdt/internal/claims"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Device claims. Several processes may share a host, each with some of its
// devices (the way a scheduler hands out CUDA_VISIBLE_DEVICES): a runtime
// claims the devices it serves with one lock file per (cluster, host,
// device) under Config.RuntimeDir, held with flock(2) for its life. The
// kernel drops a dead process's locks, so a crashed runtime never blocks
// its successor. Runtimes of one process share its claims: several
// runtimes claiming one host in one process is how tests and benchmarks
// simulate processes, and they know what they are doing.

// EnvDevices narrows the accelerators a runtime claims, like
// CUDA_VISIBLE_DEVICES: "0,2" (indices of the host's accelerators), or
// "none" (host memory only). Honoured unless Config.IgnoreEnv is set.
const EnvDevices = "TENSORLANE_DEVICES"

// EnvRuntimeDir overrides the directory of device claim locks (default
// $XDG_RUNTIME_DIR/tensorlane, else <tmp>/tensorlane-<uid>, else, when another
// user holds that one, <user cache>/tensorlane/run). Honoured unless
// Config.IgnoreEnv is set.
const EnvRuntimeDir = "TENSORLANE_RUNTIME_DIR"

// ErrDeviceClaimed: another live process's runtime claims a device this
// runtime asked for. The error is a *DeviceClaimError.
var ErrDeviceClaimed = errs.DeviceClaimed

// DeviceClaimError says which device is taken and by whom.
type DeviceClaimError struct {
	Host   string
	Device tensor.DeviceID
	PID    int    // the holder's process ID as it wrote it; 0 if unknown
	Lock   string // the lock file
}

func (e *DeviceClaimError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "process " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("rdt: %v on host %s is claimed by %s (lock %s); give each process its own devices with Config.VisibleDevices or %s",
		e.Device, e.Host, who, e.Lock, EnvDevices)
}

func (e *DeviceClaimError) Unwrap() error { return ErrDeviceClaimed }

// EnvCUDAVisible is read when EnvDevices is not set: the accelerators a
// scheduler gave this process, as host indices ("0,2"; "" or "-1": none).
// Device UUIDs and MIG names are refused with a clear error, since the
// simulated and discovered topologies number devices by index.
const EnvCUDAVisible = "CUDA_VISIBLE_DEVICES"

// ProcessRuntimeDir is a claims directory private to this process, for a
// program that simulates a whole cluster in one process (a demo, a
// benchmark): its runtimes claim nothing another process could want, and
// two such programs on one machine must not refuse each other. Set it as
// Config.RuntimeDir. It is removed when its last claim goes.
func ProcessRuntimeDir() string { return claims.ProcessDir() }

// The device lists of TENSORLANE_DEVICES and CUDA_VISIBLE_DEVICES
// (config.go, devices.go); package claims parses them.
var (
	parseVisible     = claims.ParseVisible
	parseCUDAVisible = claims.ParseCUDAVisible
)

// defaultRuntimeDir is where claims live when neither Config nor the
// environment says: the user's directory, whoever runs. Tests choose their
// own (internal/testhelp.Isolated, or Config.RuntimeDir), so that parallel
// test processes simulating the same hosts do not refuse each other.
func defaultRuntimeDir(log *slog.Logger) string { return claims.UserDir(log) }

// claimDevices claims devs on host for this runtime (package claims), as
// a *DeviceClaimError when another process holds one.
func claimDevices(dir, cluster, host string, devs []tensor.DeviceID) (release func(), err error) {
	release, err = claims.Claim(dir, cluster, host, devs)
	if held, ok := errors.AsType[*claims.HeldError](err); ok {
		return nil, &DeviceClaimError{Host: host, Device: held.Device, PID: held.PID, Lock: held.Lock}
	}
	return release, err
}
