package pushrun

import (
	"context"

	"github.com/tensorlane/tensorlane/fabric"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// One pushes src into dst's slot (rdt's Push): it opens src against the
// slot, writes it over the best path that can push, then tells the slot's
// runtime that the push completed (one push notice). With runs (rdt's
// PushRuns) it pushes the concatenation of those runs of src's bytes.
func One(ctx context.Context, env Env, src, dst refwire.Ref, runs []fabric.Run) (Result, error) {
	pin, win, remote, err := env.Open(ctx, src, dst, runs)
	if err != nil {
		return Result{}, err
	}
	defer pin.Release()
	var st fabric.Stats
	var plan fabric.Plan
	n := win.Len()
	if runs != nil {
		n = fabric.RunsBytes(runs)
		st, plan, err = env.WriteRuns(ctx, env.Endpoint(src.Device), win, runs, remote)
	} else {
		st, plan, err = env.Write(ctx, env.Endpoint(src.Device), win, remote)
	}
	x := Result{Plan: plan, Stats: st}
	if err != nil {
		return x, err
	}
	return x, env.Notify(ctx, dst, ctlwire.PushNotice{Slot: dst.Object, Incarnation: dst.Incarnation, Token: dst.Token, Bytes: n})
}
