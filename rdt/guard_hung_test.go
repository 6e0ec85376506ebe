package rdt

import (
	"context"
	"errors"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// TestHungOwnerNewRefIsOwnerDied: the reader is connected to an owner that
// then hangs (a frozen process: connections open, nothing answers), and
// asks for an object it never leased. The lease request itself waits on
// the owner, so the heartbeats' verdict must end it: OwnerDied after a few
// missed heartbeats, not Timeout at the end of the transfer timeout (the
// Ray reader of a frozen trainer waited its whole 30 s read bound). In one
// process the simulated hang also ends the lease request once the peer is
// declared dead, so this passes without the guard's fix too; the case that
// fails without it is python/tests/test_ray_weights.py::
// test_frozen_sender_is_a_typed_failure[by-ref-connected] (real processes,
// SIGSTOP). It stays as the in-process statement of the behaviour.
func TestHungOwnerNewRefIsOwnerDied(t *testing.T) {
	for _, how := range []string{"get", "view"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			clk := clockwork.NewFakeClock()
			p := newPair(t, fakeLife(clk))
			owner, _ := p.a.Spawn("owner")
			reader, _ := p.b.Spawn("reader")
			first, _ := owner.Put(ctx, fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 1<<16))
			second, _ := owner.Put(ctx, fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 1<<16))
			got, err := reader.Get(ctx, first, tensor.GPUDevice(0)) // connected, owner alive
			require.NoError(t, err)
			got.Release()
			events := reader.Watch(ctx, p.a.ID())
			nextEvent(t, events, PeerAlive)

			p.a.faults.Hung.Store(true)
			res := make(chan error, 1)
			go func() {
				if how == "view" {
					v, err := reader.View(ctx, second)
					if err == nil {
						v.Release()
					}
					res <- err
					return
				}
				x, err := reader.Get(ctx, second, tensor.GPUDevice(1))
				if err == nil {
					x.Release()
				}
				res <- err
			}()
			err = advanceUntil(t, clk, p.b.cfg.HeartbeatInterval, res)
			if how == "view" && errors.Is(err, ErrNoZeroCopy) {
				return // no path maps here: the view never leased (nothing to wait on)
			}
			require.ErrorIs(t, err, ErrOwnerDied)
		})
	}
}
