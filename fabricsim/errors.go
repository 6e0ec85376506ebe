package fabricsim

import "errors"

// Errors a simulation returns; match them with errors.Is.
var (
	// ErrBadSpec: a Spec, cluster or workload the simulator cannot run
	// (no hosts, negative sizes, more GPUs than the cluster has).
	ErrBadSpec = errors.New("fabricsim: bad spec")
	// ErrUnknownEndpoint: a host or device the cluster does not have.
	ErrUnknownEndpoint = errors.New("fabricsim: unknown endpoint")
	// ErrNoRoute: no link carries a transfer (every NIC of a host down).
	ErrNoRoute = errors.New("fabricsim: no route")
	// ErrStuck: flows are left that no link moves and nothing is
	// scheduled: a plan that waits forever.
	ErrStuck = errors.New("fabricsim: flows left with nothing to move them")
	// ErrRunaway: the run passed its bound on events.
	ErrRunaway = errors.New("fabricsim: too many events")
)
