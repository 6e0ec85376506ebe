package pushrun

import (
	"context"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// One pushes src into dst's slot (rdt's Push): it opens src against the
// slot, writes it over the best path that can push, then tells the slot's
// runtime that the push completed (one push notice).
func One(ctx context.Context, env Env, src, dst refwire.Ref) (Result, error) {
	pin, win, remote, err := env.Open(ctx, src, dst)
	if err != nil {
		return Result{}, err
	}
	defer pin.Release()
	st, plan, err := env.Write(ctx, env.Endpoint(src.Device), win, remote)
	x := Result{Plan: plan, Stats: st}
	if err != nil {
		return x, err
	}
	return x, env.Notify(ctx, dst, ctlwire.PushNotice{Slot: dst.Object, Incarnation: dst.Incarnation, Token: dst.Token, Bytes: win.Len()})
}
