package reader

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Warm readies a later read of ref onto dst (rdt's Warm): the transport
// the plan chooses opens its connections to the owner now, if it keeps
// any (a Preconnector). It moves no bytes and takes no lease.
func (r *Reader) Warm(ctx context.Context, a Actor, ref Ref, dst tensor.DeviceID) error {
	if r.env.Closed() {
		return errs.Closed
	}
	if err := a.MayUse(dst); err != nil {
		return err
	}
	if err := ref.Desc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errs.MalformedRef, err)
	}
	remote := Remote(ref)
	plan := r.d.Planner.PlanRead(remote, r.env.Endpoint(dst))
	if plan.Err != nil {
		return plan.Err
	}
	for _, t := range r.d.Planner.Transports(plan.Chosen) {
		if p, ok := t.(Preconnector); ok {
			return p.Preconnect(ctx, remote)
		}
	}
	return nil
}

// Preconnector is a transport that can open its connections to an owner
// ahead of a read (fabric/tcp).
type Preconnector interface {
	Preconnect(ctx context.Context, r fabric.Remote) error
}
