package bcastrun

import (
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
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
