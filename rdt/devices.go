package rdt

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt/internal/claims"
	"github.com/tensorlane/tensorlane/tensor/backend"
)

// The devices a runtime claims get their memory from tensor/backend's
// registry: on a discovered host, each device's vendor back-end (CUDA,
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

// openDevices opens the visible devices of the runtime's host through the
// back-end registry.
func (r *Runtime) openDevices() error {
	if _, err := r.visible(); err != nil { // checks the indices against the host
		return err
	}
	mode := r.cfg.DeviceBackend
	if mode == "" && !r.cfg.IgnoreEnv {
		mode = backend.ModeFromEnv()
	}
	log := r.cfg.Logger
	devs, err := backend.Open(context.Background(), backend.Config{Mode: mode, Host: r.topoHost,
		Visible: r.cfg.VisibleDevices, Capacity: r.cfg.DeviceMemory, Logger: log})
	if err != nil {
		return fmt.Errorf("rdt: host %s devices: %w", r.cfg.Host, err)
	}
	real := 0
	for _, d := range devs {
		if c, ok := d.Memory.(interface{ Close() error }); ok {
			r.owned = append(r.owned, c)
		}
		r.devices[d.ID] = d.Memory
		if d.Backend != "sim" {
			real++
		}
	}
	for _, d := range devs {
		// Simulating a device of a real host is a fallback, and fallbacks
		// are loud; simulating a preset's device is what a preset is for.
		if d.Note != "" && !r.topoHost.Simulated {
			log.Warn("device memory is simulated", "host", r.cfg.Host, "device", d.ID, "why", d.Note)
		}
	}
	if len(devs) > 0 {
		log.Info("device memory", "host", r.cfg.Host, "backends", backend.Summary(devs), "real", real, "simulated", len(devs)-real)
	}
	return nil
}
