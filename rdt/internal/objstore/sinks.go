package objstore

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// The reader's side of pushes and broadcasts: slots, memory a reader
// reserved for owners to write into, and the table that resolves a push
// claim to one. A slot's generation is the count of pushes and broadcasts
// completed into it; a flow-controlled slot refuses writes (errs.SlotBusy)
// from the moment a generation completes until its reader says Done.

// Filler is the broadcast filling a slot (the reader's relay); the slot
// aborts it when it closes.
type Filler interface{ Abort(cause error) }

// Slot is one slot's state; rdt.Slot is its public face.
type Slot struct {
	ID    fabric.ObjectID
	Buf   tensor.Buffer
	Desc  tensor.Desc
	Token []byte
	// Flow makes the slot flow-controlled; set before it is published.
	Flow bool

	mu       sync.Mutex
	pushes   uint64        // completed pushes: the slot's generation
	changed  chan struct{} // closed and replaced on each completed push and on Close
	pins     int
	closed   bool
	consumed uint64  // the last generation the reader said it is done with
	writer   peer.ID // who wrote the last generation: told when it is done
	filler   Filler  // the broadcast filling the slot, if any
	lastErr  error   // why the last broadcast into the slot failed
}

// NewSlot is a slot over buf, which holds a tensor of layout desc, with a
// fresh id and token; Sinks.Add publishes it.
func NewSlot(buf tensor.Buffer, desc tensor.Desc) *Slot {
	s := &Slot{Buf: buf, Desc: desc.Rebased(), Token: make([]byte, 16), changed: make(chan struct{})}
	rand.Read(s.ID[:])
	rand.Read(s.Token)
	return s
}

// Sinks is the runtime's fabric.Sink: it resolves push claims to slots.
type Sinks struct {
	incarnation uint64
	mu          sync.Mutex
	slots       map[fabric.ObjectID]*Slot
	closing     bool // Shutdown began: no new pushes
	// Notices counts the push notices taken from other runtimes (single
	// and batch), Noticed the pushes they reported.
	Notices, Noticed atomic.Int64
}

var _ fabric.Sink = (*Sinks)(nil)

// NewSinks is an empty table of the runtime of incarnation.
func NewSinks(incarnation uint64) *Sinks {
	return &Sinks{incarnation: incarnation, slots: map[fabric.ObjectID]*Slot{}}
}

// Add publishes s.
func (t *Sinks) Add(s *Slot) {
	t.mu.Lock()
	t.slots[s.ID] = s
	t.mu.Unlock()
}

// Close refuses new pushes from now on (Shutdown); those writing finish.
func (t *Sinks) Close() {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
}

// OpenSink checks a push claim and pins the slot for the write.
func (t *Sinks) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A push that began writing finishes (its notice is still taken);
	// none begins once Shutdown has.
	t.mu.Lock()
	closing := t.closing
	t.mu.Unlock()
	if closing {
		return nil, errs.OwnerClosed
	}
	s, err := t.Lookup(c.Object, c.Incarnation, c.Token)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return nil, err
	}
	s.pins++
	return &slotPin{slot: s}, nil
}

// Lookup resolves a slot by its capability.
func (t *Sinks) Lookup(id fabric.ObjectID, incarnation uint64, token []byte) (*Slot, error) {
	if incarnation != t.incarnation {
		return nil, errs.StaleRef
	}
	t.mu.Lock()
	s, ok := t.slots[id]
	t.mu.Unlock()
	if !ok {
		return nil, errs.ObjectNotFound
	}
	if subtle.ConstantTimeCompare(s.Token, token) != 1 {
		return nil, errs.Unauthorized
	}
	return s, nil
}

// writableLocked says why s takes no write now (s.mu held): closed, or a
// generation its reader is not done with.
func (s *Slot) writableLocked() error {
	if s.closed {
		return errs.ObjectFreed
	}
	if s.Flow && s.pushes > s.consumed {
		return fmt.Errorf("%w: generation %d not done yet", errs.SlotBusy, s.pushes)
	}
	return nil
}

// slotPin is the slot's memory as a transport writes into it: host visible
// and, for the shared-memory paths, exportable to the writer's process.
type slotPin struct {
	slot     *Slot
	released sync.Once
}

func (p *slotPin) Device() tensor.DeviceID { return p.slot.Buf.Device() }
func (p *slotPin) Len() int64              { return p.slot.Buf.Len() }
func (p *slotPin) Bytes() []byte {
	b, _ := tensor.BytesOf(p.slot.Buf)
	return b
}
func (p *slotPin) Export(a tensor.Access) (tensor.Handle, error) {
	return tensor.ExportOf(p.slot.Buf, a)
}
func (p *slotPin) Unwrap() (tensor.Buffer, int64) { return p.slot.Buf, 0 }
func (p *slotPin) Release() error {
	var err error
	p.released.Do(func() { err = p.slot.Unpin() })
	return err
}

// Unpin drops a pin; the last one of a closed slot returns its memory.
func (s *Slot) Unpin() error {
	s.mu.Lock()
	s.pins--
	last := s.closed && s.pins == 0
	s.mu.Unlock()
	if last {
		return s.Buf.Release()
	}
	return nil
}

// Pinned says whether a write or a relay holds the slot.
func (s *Slot) Pinned() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pins > 0
}

// State is what a waiter needs: the generation, a channel closed at the
// next change, whether the slot closed, and why the last broadcast into
// it failed.
func (s *Slot) State() (gen uint64, changed <-chan struct{}, closed bool, lastErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushes, s.changed, s.closed, s.lastErr
}

// Wait blocks until more than after pushes have completed and returns
// their count, or until the slot closes (errs.ObjectFreed), the broadcast
// filling it fails (its error), ctx is done, or closed is (the runtime
// shut down: errs.Closed).
func (s *Slot) Wait(ctx context.Context, after uint64, closed <-chan struct{}) (uint64, error) {
	for {
		n, ch, gone, lastErr := s.State()
		switch {
		case gone:
			return n, errs.ObjectFreed
		case lastErr != nil && n <= after:
			return n, lastErr
		case n > after:
			return n, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return n, ctx.Err()
		case <-closed:
			return n, errs.Closed
		}
	}
}

// Generation is the slot's current generation and the last one its reader
// said it is done with.
func (s *Slot) Generation() (current, done uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushes, s.consumed
}

// Consume records that the reader is done with generation gen (and every
// earlier one) and returns the writer to tell.
func (s *Slot) Consume(gen uint64) (writer peer.ID, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen > s.pushes {
		return "", fmt.Errorf("%w: done with generation %d, the slot is at %d", errs.MalformedRef, gen, s.pushes)
	}
	if gen > s.consumed {
		s.consumed = gen
	}
	return s.writer, nil
}

// CompletedBy records a finished push or broadcast by writer, wakes
// waiters and returns the slot's new generation.
func (s *Slot) CompletedBy(writer peer.ID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.pushes
	}
	s.pushes++
	s.writer = writer
	close(s.changed)
	s.changed = make(chan struct{})
	return s.pushes
}

// CloseSlot unregisters s from t: later pushes get errs.ObjectFreed,
// and its memory returns to the device once no write in progress holds it;
// a broadcast filling it is aborted. Idempotent.
func (t *Sinks) CloseSlot(s *Slot) error {
	t.mu.Lock()
	delete(t.slots, s.ID)
	t.mu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.changed)
	last := s.pins == 0
	f := s.filler
	s.mu.Unlock()
	if f != nil { // a broadcast filling it stops forwarding and lets go
		f.Abort(fmt.Errorf("%w: the slot was closed", errs.ObjectFreed))
	}
	if last {
		return s.Buf.Release()
	}
	return nil
}

// Writable says why the slot takes no write now, if it does not.
func (s *Slot) Writable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writableLocked()
}

// Fill hands the slot to broadcast f (pinned: f reads it to forward it)
// and returns the broadcast it replaces, if any; a slot that takes no
// write refuses.
func (s *Slot) Fill(f Filler) (old Filler, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return nil, err
	}
	old = s.filler
	s.filler, s.lastErr = f, nil
	s.pins++
	return old, nil
}

// Filler is the broadcast filling the slot, or nil.
func (s *Slot) Filler() Filler {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.filler
}

// Unfill ends broadcast f's hold on the slot: when f still fills it and
// ended with aborted before the slot had its data, waiters learn why.
func (s *Slot) Unfill(f Filler, aborted error, complete bool) {
	s.mu.Lock()
	if s.filler == f {
		s.filler = nil
		if aborted != nil && !complete && !s.closed { // Close closed changed for good
			s.lastErr = aborted
			close(s.changed)
			s.changed = make(chan struct{})
		}
	}
	s.mu.Unlock()
	s.Unpin()
}
