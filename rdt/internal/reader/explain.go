package reader

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/batchplan"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Explain is the plan a Fetch of ref onto dst for a would run, with notes
// for people on its candidates (a view the owner stages, the memory that
// receives the bytes); a read Fetch would refuse makes a plan with
// nothing chosen and Err saying why.
func (r *Reader) Explain(a Actor, ref Ref, dst tensor.DeviceID) fabric.Plan {
	plan := r.d.Planner.PlanRead(Remote(ref), r.env.Endpoint(dst)) // the value Fetch runs
	noteViewCopy(&plan, ref)
	r.noteMemory(&plan, dst)
	if err := a.MayUse(dst); err != nil {
		plan.Refuse(err)
	} else if err := ref.Desc.Validate(); err != nil {
		plan.Refuse(fmt.Errorf("%w: %v", errs.MalformedRef, err))
	}
	return plan
}

// ExplainBatch groups the plans GetBatch of refs onto dst for a would
// run by owner and chosen path; reads it would refuse count in Refused.
func (r *Reader) ExplainBatch(a Actor, refs []Ref, dst tensor.DeviceID) *batchplan.Grouper {
	g := &batchplan.Grouper{}
	for _, ref := range refs {
		plan := r.Explain(a, ref, dst)
		own := ""
		if r.own(ref) {
			own = "this runtime's own objects: a view or a local copy each"
		} else if plan.Err == nil {
			plan = r.d.Planner.PlanRead(Remote(ref), r.env.Endpoint(dst)) // the plan without Explain's notes
		}
		g.Add(refwire.ShortID(ref.Owner), plan, plan.Coalesces(), own, Bytes(ref.Desc), "reads", "of one owner")
	}
	return g
}

// noteViewCopy says on the on-host candidates that pass a descriptor to
// another process (p2p, shm) that the owner serves a private copy of the
// ref's view, when the ref shows the view is only part of its buffer (it
// starts past the buffer's start; a view that starts at 0 but ends short
// of its buffer is staged too, which the ref does not show).
func noteViewCopy(plan *fabric.Plan, ref Ref) {
	if start, _ := ref.Desc.Span(); start == 0 || plan.Src.Process == plan.Dst.Process {
		return
	}
	for i, c := range plan.Candidates {
		if c.Usable && (c.Transport == fabric.P2P || c.Transport == fabric.SHM) {
			plan.Candidates[i].Reason += "; the owner grants a private copy of this view (part of a larger allocation), staged once at the first on-host grant"
		}
	}
}

// noteMemory says in the usable candidates which back-end holds the
// destination when it is a real device's memory ("into gpu:1's cuda
// memory"): the same plan copies very differently into a GPU than into a
// simulated arena. Simulated and host destinations add nothing (the plan's
// host already says simulated).
func (r *Reader) noteMemory(plan *fabric.Plan, dst tensor.DeviceID) {
	m, err := r.env.Memory(dst)
	if err != nil {
		return
	}
	switch b := m.Stats().Backend; b {
	case "", "sim", "host", "slab":
	default:
		for i, c := range plan.Candidates {
			if c.Usable {
				plan.Candidates[i].Reason += fmt.Sprintf("; into %v's %s memory", dst, b)
			}
		}
	}
}
