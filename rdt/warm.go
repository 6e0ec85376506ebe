package rdt

import (
	"context"

	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
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
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	return a.rt.reader.Warm(ctx, a.who(), refwire.Ref(ref), dst)
}
