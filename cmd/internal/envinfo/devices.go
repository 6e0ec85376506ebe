package envinfo

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/tensorlane/tensorlane/tensor/backend"
	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/render"
)

// DeviceReport is the device section of `tensorlane env`: what each
// device memory back-end (tensor/backend: sim, cuda, hip, ...) finds on
// this machine, and which one a runtime claiming this host would give each
// device ($TENSORLANE_DEVICE_BACKEND, default auto).
type DeviceReport struct {
	Mode     string          `json:"mode"` // the mode a runtime would use here
	Backends []BackendStatus `json:"backends"`
	// Devices maps "gpu:0" to the back-end a runtime would give it, and
	// when simulated, why: "cuda", "sim (cuda driver not usable: ...)".
	Devices map[string]string `json:"devices,omitempty"`
}

// BackendStatus is one back-end's driver on this machine.
type BackendStatus struct {
	Name        string   `json:"name"`
	Library     string   `json:"library,omitempty"`
	Devices     []string `json:"devices,omitempty"` // "0: NVIDIA H200 (0000:18:00.0), 141 GiB, shareable, peers [1]"
	Unavailable string   `json:"unavailable,omitempty"`
}

// ProbeDevices asks every registered back-end that can say (a
// backend.Prober) whether its driver is usable, and, when host is not nil
// (the discovered host), which back-end each of its devices would get.
func ProbeDevices(ctx context.Context, host *topology.Host) DeviceReport {
	r := DeviceReport{Mode: backend.ModeFromEnv()}
	if r.Mode == "" {
		r.Mode = backend.ModeAuto
	}
	usable := map[string]error{}
	for _, b := range backend.Backends() {
		p, ok := b.(backend.Prober)
		if !ok {
			continue
		}
		rep, err := p.Probe(ctx)
		usable[b.Name()] = err
		st := BackendStatus{Name: b.Name(), Library: rep.Library}
		if err != nil {
			st.Unavailable = err.Error()
		}
		for _, d := range rep.Devices {
			share := "legacy IPC"
			if d.Shareable {
				share = "shareable fd"
			}
			st.Devices = append(st.Devices, fmt.Sprintf("%d: %s (%s), %s, %s, peers %v", d.Ordinal, d.Name, d.BusID, render.MemorySize(d.Memory), share, d.Peers))
		}
		r.Backends = append(r.Backends, st)
	}
	if host == nil {
		return r
	}
	choice, err := backend.Choose(ctx, host, r.Mode, usable)
	if err != nil {
		r.Devices = map[string]string{"error": err.Error()}
		return r
	}
	r.Devices = map[string]string{}
	for _, d := range host.Devices {
		c := choice[d.Index]
		v := c[0]
		if c[1] != "" {
			v += " (" + c[1] + ")"
		}
		r.Devices[fmt.Sprintf("%s:%d", d.Kind, d.Index)] = v
	}
	return r
}

// WriteDevices prints the device section in Write's style.
func WriteDevices(w io.Writer, r DeviceReport) {
	line := func(k, v string) { fmt.Fprintf(w, "%-22s %s\n", k+":", v) }
	line("device backend mode", r.Mode)
	for _, b := range r.Backends {
		switch {
		case b.Unavailable != "":
			line("backend "+b.Name, "not usable: "+b.Unavailable)
		case len(b.Devices) == 0:
			line("backend "+b.Name, b.Library+": no devices")
		default:
			for _, d := range b.Devices {
				line("backend "+b.Name, d)
			}
		}
	}
	keys := make([]string, 0, len(r.Devices))
	for k := range r.Devices {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		line("device memory "+k, r.Devices[k])
	}
}
