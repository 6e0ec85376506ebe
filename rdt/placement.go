package rdt

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Conditions of SpawnPlacement, for errors.Is (besides sched.ErrInfeasible,
// ErrUnknownDevice, ErrClosed and the context's errors).
var (
	// ErrInvalidPlacement: the placement or the arguments do not fit
	// together: a bundle missing or given twice, an empty or repeated
	// actor name on one host, a runtimes entry filed under a host it does
	// not claim.
	ErrInvalidPlacement = errors.New("rdt: invalid placement")
	// ErrNoRuntime: no runtime in the map claims a host the placement
	// uses.
	ErrNoRuntime = errors.New("rdt: no runtime claims the host")
	// ErrActorExists: an actor of that name already lives on the runtime.
	ErrActorExists = errors.New("rdt: actor already exists")
)

// SpawnPlacement spawns one actor per bundle of a feasible placement from
// sched, on the runtime that claims the bundle's host (runtimes is keyed
// by topology host ID, as Runtime.HostID reports it), limited to the
// bundle's devices plus host memory (which the scheduler does not hand
// out, and without which a device-less bundle could hold nothing). name
// gives each bundle's actor name; nil names them "bundle-<i>". Extra
// options apply to every actor before the device limit.
//
// It is all-or-nothing: everything is checked first (hosts, devices,
// names), and if a spawn still fails (a runtime shut down, ctx ended) the
// actors spawned so far are removed again before the error returns. The
// result is indexed by bundle.
func SpawnPlacement(ctx context.Context, p sched.Placement, runtimes map[string]*Runtime, name func(bundle int) string, opts ...ActorOption) ([]*Actor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !p.Feasible {
		return nil, &sched.InfeasibleError{Reasons: p.Reasons}
	}
	if name == nil {
		name = func(b int) string { return fmt.Sprintf("bundle-%d", b) }
	}
	for host, rt := range runtimes {
		if rt == nil || rt.HostID() != host {
			return nil, fmt.Errorf("%w: runtimes[%q] does not claim host %q", ErrInvalidPlacement, host, host)
		}
	}
	n := len(p.Assignments)
	if n == 0 {
		return nil, fmt.Errorf("%w: no assignments", ErrInvalidPlacement)
	}
	type plan struct {
		rt   *Runtime
		name string
		devs []tensor.DeviceID
	}
	plans := make([]*plan, n)
	names := map[*Runtime]map[string]bool{}
	for _, a := range p.Assignments {
		if a.Bundle < 0 || a.Bundle >= n || plans[a.Bundle] != nil {
			return nil, fmt.Errorf("%w: bundle %d out of range or assigned twice (%d assignments)", ErrInvalidPlacement, a.Bundle, n)
		}
		rt, ok := runtimes[a.Host]
		if !ok {
			return nil, fmt.Errorf("%w: bundle %d is placed on %q (runtimes for %v)", ErrNoRuntime, a.Bundle, a.Host, hostKeys(runtimes))
		}
		devs, err := rt.placedDevices(a.Devices)
		if err != nil {
			return nil, fmt.Errorf("rdt: bundle %d: %w", a.Bundle, err)
		}
		nm := name(a.Bundle)
		if nm == "" || len(nm) > maxRefString {
			return nil, fmt.Errorf("%w: bundle %d: actor name must be 1..%d bytes", ErrInvalidPlacement, a.Bundle, maxRefString)
		}
		if names[rt] == nil {
			names[rt] = map[string]bool{}
		}
		if names[rt][nm] {
			return nil, fmt.Errorf("%w: actor name %q given to two bundles on host %s", ErrInvalidPlacement, nm, a.Host)
		}
		names[rt][nm] = true
		if rt.hasActor(nm) {
			return nil, fmt.Errorf("%w: %q on host %s (bundle %d)", ErrActorExists, nm, a.Host, a.Bundle)
		}
		plans[a.Bundle] = &plan{rt: rt, name: nm, devs: devs}
	}
	out := make([]*Actor, n)
	undo := func() {
		for b := n - 1; b >= 0; b-- {
			if out[b] != nil {
				out[b].rt.log.Warn("placement spawn rolled back: actor removed", "actor", out[b].name, "bundle", b)
				out[b].unspawnPlaced()
			}
		}
	}
	for b, pl := range plans {
		if err := ctx.Err(); err != nil {
			undo()
			return nil, err
		}
		o := append(slices.Clone(opts), WithDevices(pl.devs...))
		a, err := pl.rt.Spawn(pl.name, o...)
		if err != nil {
			undo()
			return nil, fmt.Errorf("rdt: spawn bundle %d (%q on %s): %w", b, pl.name, pl.rt.HostID(), err)
		}
		out[b] = a
	}
	for b, a := range out {
		a.rt.log.Info("placed actor spawned", "actor", a.name, "bundle", b, "devices", a.devices)
	}
	return out, nil
}

// placedDevices turns a placement's device indices on this runtime's host
// into the runtime's device IDs, host memory first.
func (r *Runtime) placedDevices(idx []int) ([]tensor.DeviceID, error) {
	out := []tensor.DeviceID{tensor.HostDevice}
	for _, i := range idx {
		var d *topology.Device
		if r.topoHost != nil {
			for k := range r.topoHost.Devices {
				if r.topoHost.Devices[k].Index == i {
					d = &r.topoHost.Devices[k]
					break
				}
			}
		}
		if d == nil {
			return nil, fmt.Errorf("%w: host %s has no device %d", ErrUnknownDevice, r.cfg.Host, i)
		}
		id := tensor.DeviceID{Kind: deviceKind(d.Kind), Index: d.Index}
		if _, ok := r.devices[id]; !ok {
			return nil, fmt.Errorf("%w: %v is not served by the runtime on %s", ErrUnknownDevice, id, r.cfg.Host)
		}
		if slices.Contains(out, id) {
			return nil, fmt.Errorf("%w: device %d given twice", ErrInvalidPlacement, i)
		}
		out = append(out, id)
	}
	return out, nil
}

func (r *Runtime) hasActor(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.actors[name]
	return ok
}

// unspawnPlaced removes an actor that SpawnPlacement spawned and that never
// ran (rdt has no general actor removal yet): it only unregisters the name.
func (a *Actor) unspawnPlaced() {
	r := a.rt
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.actors[a.name] == a {
		delete(r.actors, a.name)
	}
}

func hostKeys(m map[string]*Runtime) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
