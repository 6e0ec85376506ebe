package rdt

import (
	"fmt"
	"slices"

	"github.com/tensorlane/tensorlane/tensor"
)

// Actors lists the names of the actors spawned on this runtime, sorted.
func (r *Runtime) Actors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.actors))
	for n := range r.actors {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Actor returns the actor of that name, if one is spawned here.
func (r *Runtime) Actor(name string) (*Actor, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.actors[name]
	return a, ok
}

// TopologyDevice returns the ID this runtime serves the topology host's
// device index under (a scheduler's placements name devices by index).
func (r *Runtime) TopologyDevice(index int) (tensor.DeviceID, error) {
	if r.topoHost != nil {
		for _, d := range r.topoHost.Devices {
			if d.Index != index {
				continue
			}
			id := tensor.DeviceID{Kind: d.Kind, Index: d.Index}
			if _, ok := r.devs.Memory(id); !ok {
				return tensor.DeviceID{}, fmt.Errorf("%w: %v is not served by the runtime on %s", ErrUnknownDevice, id, r.cfg.Host)
			}
			return id, nil
		}
	}
	return tensor.DeviceID{}, fmt.Errorf("%w: host %s has no device %d", ErrUnknownDevice, r.cfg.Host, index)
}

// Stop removes the actor from its runtime: its name is free again and
// messages to it get ErrUnknownActor. Objects it put stay until freed or
// released. Stop is idempotent.
func (a *Actor) Stop() {
	r := a.rt
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.actors[a.name] == a {
		delete(r.actors, a.name)
	}
}
