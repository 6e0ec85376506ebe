package bcastrun

import (
	"context"
	"errors"

	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
)

// WriteChunk writes the n bytes of src at srcOff into dst's slot at off with
// write (the edge's, Env.Edge) and tells the slot's runtime they landed.
// With probe (dst was re-parented) it first asks whether the slot lacks
// them, and skips them when it does not.
func WriteChunk(ctx context.Context, env Env, write WriteFunc, id bcast.ID, src *objstore.Window, dst Ref, off int64, probe bool) error {
	note := Msg{Kind: ctlwire.Chunk, ID: id, Slot: dst.Object, Inc: dst.Incarnation, Token: dst.Token, Off: off, N: src.N}
	if probe {
		q := note
		q.Kind = ctlwire.Probe
		if err := env.Send(ctx, dst.Owner, q); errors.Is(err, errs.ChunkHeld) {
			return nil
		}
		// Any other answer: write it; the write or its notice says
		// what is wrong, if anything.
	}
	if src.N > 0 {
		if err := write(ctx, src, off); err != nil {
			return err
		}
	}
	return env.Send(ctx, dst.Owner, note)
}
