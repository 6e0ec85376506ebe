// Package placement spawns the actors of a sched placement on the rdt
// runtimes that own the chosen devices. It sits between the two packages
// so that neither imports the other: sched decides where (a pure function
// of topology, request and state), rdt runs actors, and this package turns
// the first into the second, all-or-nothing.
package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/tensor"
)

// Conditions of Spawn, for errors.Is (besides sched.ErrInfeasible,
// rdt.ErrUnknownDevice, rdt.ErrClosed and the context's errors).
// maxName bounds an actor name, as refs and messages carry it.
const maxName = 512

// log is where rollbacks and spawns are reported; slog.Default unless
// replaced with SetLogger.
var log = slog.Default()

// SetLogger sets the logger Spawn reports to.
func SetLogger(l *slog.Logger) {
	if l != nil {
		log = l
	}
}

var (
	// ErrInvalidPlacement: the placement or the arguments do not fit
	// together: a bundle missing or given twice, an empty or repeated
	// actor name on one host, a runtimes entry filed under a host it does
	// not claim.
	ErrInvalidPlacement = errors.New("placement: invalid placement")
	// ErrNoRuntime: no runtime in the map claims a host the placement
	// uses.
	ErrNoRuntime = errors.New("placement: no runtime claims the host")
	// ErrActorExists: an actor of that name already lives on the runtime.
	ErrActorExists = errors.New("placement: actor already exists")
)

// Spawn spawns one actor per bundle of a feasible placement from
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
func Spawn(ctx context.Context, p sched.Placement, runtimes map[string]*rdt.Runtime, name func(bundle int) string, opts ...rdt.ActorOption) ([]*rdt.Actor, error) {
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
		rt   *rdt.Runtime
		name string
		devs []tensor.DeviceID
	}
	plans := make([]*plan, n)
	names := map[*rdt.Runtime]map[string]bool{}
	for _, a := range p.Assignments {
		if a.Bundle < 0 || a.Bundle >= n || plans[a.Bundle] != nil {
			return nil, fmt.Errorf("%w: bundle %d out of range or assigned twice (%d assignments)", ErrInvalidPlacement, a.Bundle, n)
		}
		rt, ok := runtimes[a.Host]
		if !ok {
			return nil, fmt.Errorf("%w: bundle %d is placed on %q (runtimes for %v)", ErrNoRuntime, a.Bundle, a.Host, hostKeys(runtimes))
		}
		devs, err := placedDevices(rt, a.Devices)
		if err != nil {
			return nil, fmt.Errorf("placement: bundle %d: %w", a.Bundle, err)
		}
		nm := name(a.Bundle)
		if nm == "" || len(nm) > maxName {
			return nil, fmt.Errorf("%w: bundle %d: actor name must be 1..%d bytes", ErrInvalidPlacement, a.Bundle, maxName)
		}
		if names[rt] == nil {
			names[rt] = map[string]bool{}
		}
		if names[rt][nm] {
			return nil, fmt.Errorf("%w: actor name %q given to two bundles on host %s", ErrInvalidPlacement, nm, a.Host)
		}
		names[rt][nm] = true
		if _, taken := rt.Actor(nm); taken {
			return nil, fmt.Errorf("%w: %q on host %s (bundle %d)", ErrActorExists, nm, a.Host, a.Bundle)
		}
		plans[a.Bundle] = &plan{rt: rt, name: nm, devs: devs}
	}
	out := make([]*rdt.Actor, n)
	undo := func() {
		for b := n - 1; b >= 0; b-- {
			if out[b] != nil {
				log.Warn("placement spawn rolled back: actor removed", "actor", out[b].Name(), "host", out[b].Runtime().HostID(), "bundle", b)
				out[b].Stop()
			}
		}
	}
	for b, pl := range plans {
		if err := ctx.Err(); err != nil {
			undo()
			return nil, err
		}
		o := append(slices.Clone(opts), rdt.WithDevices(pl.devs...))
		a, err := pl.rt.Spawn(pl.name, o...)
		if err != nil {
			undo()
			return nil, fmt.Errorf("placement: spawn bundle %d (%q on %s): %w", b, pl.name, pl.rt.HostID(), err)
		}
		out[b] = a
	}
	for b, a := range out {
		log.Info("placed actor spawned", "actor", a.Name(), "host", a.Runtime().HostID(), "bundle", b, "devices", a.Devices())
	}
	return out, nil
}

// placedDevices turns a placement's device indices on rt's host into the
// runtime's device IDs, host memory first.
func placedDevices(rt *rdt.Runtime, idx []int) ([]tensor.DeviceID, error) {
	out := []tensor.DeviceID{tensor.HostDevice}
	for _, i := range idx {
		id, err := rt.TopologyDevice(i)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, id) {
			return nil, fmt.Errorf("%w: device %d given twice", ErrInvalidPlacement, i)
		}
		out = append(out, id)
	}
	return out, nil
}

func hostKeys(m map[string]*rdt.Runtime) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
