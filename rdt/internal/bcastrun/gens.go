package bcastrun

import (
	"context"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Gens is the writer side of flow control: the generation each reader
// said it is done with (a Consumed notice), per slot. The zero value is
// ready.
type Gens struct {
	mu      sync.Mutex
	done    map[Key]uint64
	changed chan struct{} // closed and replaced on every change
}

// Key names a slot: its runtime and its object.
type Key struct {
	Peer peer.ID
	Slot fabric.ObjectID
}

// Consumed records that from's reader of slot is done with gen.
func (t *Gens) Consumed(from peer.ID, slot fabric.ObjectID, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		t.done = map[Key]uint64{}
	}
	k := Key{from, slot}
	if gen <= t.done[k] {
		return
	}
	t.done[k] = gen
	if t.changed != nil {
		close(t.changed)
		t.changed = nil
	}
}

// State returns the generation the reader of slot is done with and a
// channel closed at the next change.
func (t *Gens) State(k Key) (uint64, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	return t.done[k], t.changed
}

// Wait blocks until the reader of k is done with generation gen (or a
// later one), or ctx is done, or death is closed (the reader's runtime
// died: errs.ReaderDied, a step never waits on a reader that left), or
// closed is (this runtime shut down: errs.Closed).
func (t *Gens) Wait(ctx context.Context, k Key, gen uint64, death, closed <-chan struct{}) error {
	for {
		got, ch := t.State(k)
		if got >= gen {
			return nil
		}
		select {
		case <-ch:
		case <-death:
			return fmt.Errorf("%w: slot %v's reader %s, done with generation %d of %d", errs.ReaderDied, k.Slot, refwire.ShortID(k.Peer), got, gen)
		case <-ctx.Done():
			return fmt.Errorf("rdt: waiting for slot %v to be done with generation %d (done: %d): %w", k.Slot, gen, got, ctx.Err())
		case <-closed:
			return errs.Closed
		}
	}
}

// Forget drops what is known about slots of a peer that died.
func (t *Gens) Forget(id peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.done {
		if k.Peer == id {
			delete(t.done, k)
		}
	}
}
