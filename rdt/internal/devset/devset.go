// Package devset is a runtime's devices: the memories it serves, each
// under its device ID. They are the memories the caller gave, or else the
// visible devices of its topology host opened through tensor/backend's
// registry (a device simulated on a real host is a fallback, logged as a
// warning); host memory is always among them. Set lists them in a stable
// order and closes, with the runtime, the memories it opened itself.
package devset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/backend"
	"github.com/tensorlane/tensorlane/topology"
)

// Config says which devices to serve (rdt.Config's device fields).
type Config struct {
	// Given are memories to serve as they are; when set, nothing is opened
	// but host memory.
	Given []tensor.Memory
	// Host is the topology host whose devices are opened; Mode, Visible
	// and Capacity are backend.Config's.
	Host     *topology.Host
	Mode     string
	Visible  []int
	Capacity int64
	// HostMemory caps host memory allocations (bytes; 0: unbounded).
	HostMemory int64
	Log        *slog.Logger
}

// Set is a runtime's devices.
type Set struct {
	m     map[tensor.DeviceID]tensor.Memory
	owned []interface{ Close() error } // memories opened here, closed by Close
}

// Open makes the set cfg says; on an error nothing stays open.
func Open(cfg Config) (*Set, error) {
	s := &Set{m: map[tensor.DeviceID]tensor.Memory{}}
	if len(cfg.Given) > 0 {
		for _, m := range cfg.Given {
			if _, dup := s.m[m.Device()]; dup {
				return nil, fmt.Errorf("rdt: device %v given twice", m.Device())
			}
			s.m[m.Device()] = m
		}
	} else if err := s.open(cfg); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	if _, ok := s.m[tensor.HostDevice]; !ok {
		m := tensor.NewHostMemory(cfg.HostMemory)
		s.owned = append(s.owned, m)
		s.m[tensor.HostDevice] = m
	}
	return s, nil
}

// open opens the visible devices of cfg.Host through the back-end
// registry.
func (s *Set) open(cfg Config) error {
	have := map[int]bool{}
	for _, d := range cfg.Host.Devices {
		have[d.Index] = true
	}
	for _, i := range cfg.Visible {
		if !have[i] {
			return fmt.Errorf("%w: visible device %d: host %s has %d accelerators", errs.UnknownDevice, i, cfg.Host.ID, len(cfg.Host.Devices))
		}
	}
	devs, err := backend.Open(context.Background(), backend.Config{Mode: cfg.Mode, Host: cfg.Host,
		Visible: cfg.Visible, Capacity: cfg.Capacity, Logger: cfg.Log})
	if err != nil {
		return fmt.Errorf("rdt: host %s devices: %w", cfg.Host.ID, err)
	}
	real := 0
	for _, d := range devs {
		if c, ok := d.Memory.(interface{ Close() error }); ok {
			s.owned = append(s.owned, c)
		}
		s.m[d.ID] = d.Memory
		if d.Backend != "sim" {
			real++
		}
	}
	for _, d := range devs {
		// Simulating a device of a real host is a fallback, and fallbacks
		// are loud; simulating a preset's device is what a preset is for.
		if d.Note != "" && !cfg.Host.Simulated {
			cfg.Log.Warn("device memory is simulated", "host", cfg.Host.ID, "device", d.ID, "why", d.Note)
		}
	}
	if len(devs) > 0 {
		cfg.Log.Info("device memory", "host", cfg.Host.ID, "backends", backend.Summary(devs), "real", real, "simulated", len(devs)-real)
	}
	return nil
}

// Memory is device dev's memory.
func (s *Set) Memory(dev tensor.DeviceID) (tensor.Memory, bool) {
	m, ok := s.m[dev]
	return m, ok
}

// IDs lists the devices, host memory first, then by kind and index.
func (s *Set) IDs() []tensor.DeviceID {
	out := make([]tensor.DeviceID, 0, len(s.m))
	for id := range s.m {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].IsHost() != out[j].IsHost() {
			return out[i].IsHost()
		}
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Index < out[j].Index
	})
	return out
}

// Close closes the memories the set opened (not the given ones).
// Idempotent.
func (s *Set) Close() error {
	var out []error
	for _, m := range s.owned {
		out = append(out, m.Close())
	}
	s.owned = nil
	return errors.Join(out...)
}
