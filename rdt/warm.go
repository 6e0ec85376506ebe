package rdt

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Warm readies a later Get of ref into dst, for a reader that learns of a
// ref before it needs the bytes (a message carrying refs, a Ray object ref
// handed to a task): the transport the plan chooses opens and
// authenticates its connections to the owner now, so the Get does not pay
// the dial and handshake (a first 64 MiB read over tcp on new connections
// takes about 1.3x a warm one on loopback, a first 1 MiB read 2-3x). Only
// transports that keep connections do anything (tcp); the others connect
// per grant or are warm already.
//
// Warm moves no bytes, allocates nothing and takes no lease: the ref may
// be freed before the Get, which then fails as it would have. Calling it is
// never required, and its error only says the preparation failed (the Get
// tries on its own). It is bounded like a Get (Config.TransferTimeout when
// ctx has no deadline).
func (a *Actor) Warm(ctx context.Context, ref Ref, dst tensor.DeviceID) error {
	if a.rt.isClosed() {
		return ErrClosed
	}
	if err := a.mayUse(dst); err != nil {
		return err
	}
	if err := ref.Desc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	remote := a.rt.remoteFor(ref)
	plan := a.rt.planner.PlanRead(remote, a.rt.endpoint(dst))
	if plan.Err != nil {
		return plan.Err
	}
	for _, t := range a.rt.planner.Transports(plan.Chosen) {
		if p, ok := t.(preconnector); ok {
			return p.Preconnect(ctx, remote)
		}
	}
	return nil
}

// preconnector is a transport that can open its connections to an owner
// ahead of a read (fabric/tcp).
type preconnector interface {
	Preconnect(ctx context.Context, r fabric.Remote) error
}
