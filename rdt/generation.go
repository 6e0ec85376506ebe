package rdt

import (
	"context"

	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// Flow control for pushes and broadcasts. A slot's generation is the count
// of pushes and broadcasts completed into it. A slot reserved
// WithGenerations refuses every write (ErrSlotBusy) from the moment a
// generation completes until its reader says Done with it, so a writer can
// never overwrite a generation a reader is still consuming; Done tells the
// writer, and the writer can wait until every reader of a step is done
// (WaitConsumed, BroadcastResult.WaitConsumed) before it writes the next.

// SlotOption configures Reserve.
type SlotOption func(*Slot)

// WithGenerations makes the slot flow-controlled: after each completed push
// or broadcast it takes no more writes until Done is called for that
// generation.
func WithGenerations() SlotOption { return func(s *Slot) { s.s.Flow = true } }

// Generation is the slot's current generation (completed pushes and
// broadcasts) and the last one its reader said it is done with.
func (s *Slot) Generation() (current, done uint64) { return s.s.Generation() }

// Done says the reader has finished with generation gen of the slot (and
// every earlier one): a flow-controlled slot takes writes again, and the
// writer of that generation is told. Telling the writer is bounded by ctx
// and the control timeout; the slot is released even if that fails.
func (s *Slot) Done(ctx context.Context, gen uint64) error {
	writer, err := s.s.Consume(gen)
	if err != nil || writer == "" {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	return s.rt.sendBcast(ctx, writer, bcastrun.Msg{Kind: ctlwire.Consumed, Slot: s.s.ID, Inc: s.rt.incarnation, Gen: gen})
}

// WaitConsumed blocks until the reader of slot has said it is done with
// generation gen (or a later one), or ctx is done (without a deadline, at
// most Config.TransferTimeout), or the reader's runtime is declared dead
// (ErrReaderDied: a step never waits on a reader that left).
func (a *Actor) WaitConsumed(ctx context.Context, slot Ref, gen uint64) error {
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	var death <-chan struct{}
	if slot.Owner != a.rt.host.ID() {
		defer a.rt.peers.Use(slot.Owner)()
		death = a.rt.peers.DeathOf(slot.Owner, slot.Incarnation)
	}
	return a.rt.bcast.Gens.Wait(ctx, bcastrun.Key{Peer: slot.Owner, Slot: slot.Object}, gen, death, a.rt.done)
}
