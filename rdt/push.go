package rdt

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/tensor"
)

// Push is the owner-driven direction: a reader reserves a Slot (memory on
// its own device), hands the slot's Ref to the owner, and the owner writes
// its tensor straight into it (rdma WRITE, a copy into the reader's mapped
// arena, or a tcp push), then tells the reader the push completed. This is
// broadcast-style weight sync: a trainer pushes each step's weights into
// every reader's slot without waiting for each reader to ask.
//
// The slot is filled in place: a push that is in progress overwrites what
// the previous one left. Readers that must read one version while the next
// arrives keep two slots and alternate.

const pushProtocol = protocol.ID("/tensorlane/push/1.0.0")

// Slot is reader-allocated memory that owners push tensors into.
type Slot struct {
	rt    *Runtime
	actor *Actor
	id    fabric.ObjectID
	buf   tensor.Buffer
	desc  tensor.Desc
	token []byte

	mu      sync.Mutex
	pushes  uint64        // completed pushes: the slot's generation
	changed chan struct{} // closed and replaced on each completed push and on Close
	pins    int
	closed  bool

	// Generations and broadcasts (generation.go, relay.go).
	flow     bool    // refuse writes while a completed generation is not Done
	consumed uint64  // the last generation the reader said it is done with
	writer   peer.ID // who wrote the last generation: told when it is done
	relay    *relay  // the broadcast filling the slot, if any
	lastErr  error   // why the last broadcast into the slot failed
}

// sinkTable is the runtime's fabric.Sink: it resolves push claims to slots.
type sinkTable struct {
	incarnation uint64
	mu          sync.Mutex
	slots       map[fabric.ObjectID]*Slot
	closing     bool // Shutdown began: no new pushes
	// notices counts the push notices taken from other runtimes (single
	// and batch) and noticed the pushes they reported (pushbatch.go's
	// metrics).
	notices, noticed atomic.Int64
}

// close refuses new pushes from now on (Shutdown); those writing finish.
func (t *sinkTable) close() {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
}

var _ fabric.Sink = (*sinkTable)(nil)

func newSinkTable(incarnation uint64) *sinkTable {
	return &sinkTable{incarnation: incarnation, slots: map[fabric.ObjectID]*Slot{}}
}

// OpenSink checks a push claim and pins the slot for the write.
func (t *sinkTable) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A push that began writing finishes (its notice is still taken);
	// none begins once Shutdown has.
	t.mu.Lock()
	closing := t.closing
	t.mu.Unlock()
	if closing {
		return nil, ErrOwnerClosed
	}
	s, err := t.lookup(c.Object, c.Incarnation, c.Token)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrObjectFreed
	}
	if s.flow && s.pushes > s.consumed {
		return nil, fmt.Errorf("%w: generation %d not done yet", ErrSlotBusy, s.pushes)
	}
	s.pins++
	return &slotPin{slot: s}, nil
}

func (t *sinkTable) lookup(id fabric.ObjectID, incarnation uint64, token []byte) (*Slot, error) {
	if incarnation != t.incarnation {
		return nil, ErrStaleRef
	}
	t.mu.Lock()
	s, ok := t.slots[id]
	t.mu.Unlock()
	if !ok {
		return nil, ErrObjectNotFound
	}
	if subtle.ConstantTimeCompare(s.token, token) != 1 {
		return nil, ErrUnauthorized
	}
	return s, nil
}

// slotPin is the slot's memory as a transport writes into it: host visible
// and, for the shared-memory paths, exportable to the writer's process.
type slotPin struct {
	slot     *Slot
	released sync.Once
}

func (p *slotPin) Device() tensor.DeviceID { return p.slot.buf.Device() }
func (p *slotPin) Len() int64              { return p.slot.buf.Len() }
func (p *slotPin) Bytes() []byte {
	b, _ := tensor.BytesOf(p.slot.buf)
	return b
}
func (p *slotPin) Export(a tensor.Access) (tensor.Handle, error) {
	return tensor.ExportOf(p.slot.buf, a)
}
func (p *slotPin) Unwrap() (tensor.Buffer, int64) { return p.slot.buf, 0 }
func (p *slotPin) Release() error {
	var err error
	p.released.Do(func() { err = p.slot.unpin() })
	return err
}

// unpin drops a pin; the last one of a closed slot returns its memory.
func (s *Slot) unpin() error {
	s.mu.Lock()
	s.pins--
	last := s.closed && s.pins == 0
	s.mu.Unlock()
	if last {
		return s.buf.Release()
	}
	return nil
}

// Reserve allocates a slot for a tensor of layout desc on dev, one of the
// actor's devices, for owners to push into. Send slot.Ref() to the owner.
func (a *Actor) Reserve(ctx context.Context, desc tensor.Desc, dev tensor.DeviceID, opts ...SlotOption) (*Slot, error) {
	if a.rt.isClosed() {
		return nil, ErrClosed
	}
	if err := a.mayUse(dev); err != nil {
		return nil, err
	}
	if err := desc.Validate(); err != nil {
		return nil, err
	}
	mem, err := a.rt.Memory(dev)
	if err != nil {
		return nil, err
	}
	buf, err := mem.Alloc(ctx, spanBytes(desc))
	if err != nil {
		return nil, err
	}
	return a.addSlot(buf, desc, opts), nil
}

// addSlot makes buf, holding a tensor of layout desc, a slot of this
// actor with a fresh id and token, and publishes it in the sink table.
func (a *Actor) addSlot(buf tensor.Buffer, desc tensor.Desc, opts []SlotOption) *Slot {
	s := &Slot{rt: a.rt, actor: a, buf: buf, desc: desc.Rebased(), token: make([]byte, 16), changed: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	rand.Read(s.id[:])
	rand.Read(s.token)
	t := a.rt.sinks
	t.mu.Lock()
	t.slots[s.id] = s
	t.mu.Unlock()
	return s
}

// Ref is what the pushing owner needs: where the slot lives and the
// capability to write it.
func (s *Slot) Ref() Ref {
	r := s.rt
	addrs := make([]string, 0, 2)
	for _, m := range r.host.Addrs() {
		addrs = append(addrs, m.String())
	}
	return Ref{
		Object: s.id, Owner: r.host.ID(), Incarnation: r.incarnation, Addrs: addrs,
		DataAddrs: r.dataAddrs(), Host: r.cfg.Host, Device: s.buf.Device(), Desc: s.desc,
		Transports: r.servedTransports(), Token: s.token,
	}
}

// Pushes is the number of pushes completed so far.
func (s *Slot) Pushes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushes
}

// Wait blocks until more than after pushes have completed and returns the
// count and a view of the slot (valid until Close; the next push overwrites
// it in place).
func (s *Slot) Wait(ctx context.Context, after uint64) (uint64, tensor.Tensor, error) {
	ctx, cancel := s.rt.bounded(ctx)
	defer cancel()
	for {
		s.mu.Lock()
		n, ch, closed, lastErr := s.pushes, s.changed, s.closed, s.lastErr
		s.mu.Unlock()
		if closed {
			return n, tensor.Tensor{}, ErrObjectFreed
		}
		if lastErr != nil && n <= after {
			return n, tensor.Tensor{}, lastErr // the broadcast filling it failed
		}
		if n > after {
			t, err := tensor.New(nopRelease{s.buf}, s.desc)
			return n, t, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return n, tensor.Tensor{}, ctx.Err()
		case <-s.rt.done:
			return n, tensor.Tensor{}, ErrClosed
		}
	}
}

// completedBy records a finished push or broadcast by writer, wakes
// waiters and returns the slot's new generation.
func (s *Slot) completedBy(writer peer.ID) uint64 {
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

// Close unregisters the slot: later pushes get ErrObjectFreed, and its
// memory returns to the device once no push in progress holds it.
// Idempotent.
func (s *Slot) Close() error {
	t := s.rt.sinks
	t.mu.Lock()
	delete(t.slots, s.id)
	t.mu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.changed)
	last := s.pins == 0
	rl := s.relay
	s.mu.Unlock()
	if rl != nil { // a broadcast filling it stops forwarding and lets go
		rl.cancel(fmt.Errorf("%w: the slot was closed", ErrObjectFreed))
	}
	if last {
		return s.buf.Release()
	}
	return nil
}

// nopRelease lends a buffer to a view without giving up ownership.
type nopRelease struct{ tensor.Buffer }

func (nopRelease) Release() error { return nil }

// Unwrap names the lent buffer (tensor.Copy reaches device memory so).
func (n nopRelease) Unwrap() (tensor.Buffer, int64) { return n.Buffer, 0 }

// Bytes exposes the lent buffer's memory.
func (n nopRelease) Bytes() []byte {
	b, _ := tensor.BytesOf(n.Buffer)
	return b
}

// Push writes the object behind src, which this actor's runtime owns, into
// the slot that dst names, over the best path that can push, and then tells
// the slot's runtime that the push completed. src and dst must have the
// same size.
func (a *Actor) Push(ctx context.Context, src Ref, dst Ref) (Transfer, error) {
	r := a.rt
	if r.isClosed() {
		return Transfer{}, ErrClosed
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	pin, win, remote, err := r.openPush(ctx, src, dst)
	if err != nil {
		return Transfer{}, err
	}
	defer pin.Release()
	st, plan, err := r.planner.Write(ctx, r.endpoint(src.Device), win, remote)
	tr := Transfer{Plan: plan, Stats: st}
	if err != nil {
		return tr, err
	}
	return tr, r.notifyPush(ctx, dst, win.N)
}

// openPush checks that this runtime owns src and that its bytes fit dst's
// slot exactly, pins them and returns them (the window of pin that moves)
// with the slot's Remote. The caller releases pin.
func (r *Runtime) openPush(ctx context.Context, src, dst Ref) (pin tensor.Buffer, win *objstore.Window, remote fabric.Remote, err error) {
	if src.Owner != r.host.ID() || src.Incarnation != r.incarnation {
		return nil, nil, remote, fmt.Errorf("%w: push source %v is not owned by this runtime", ErrNotOwner, src)
	}
	start, end := src.Desc.Span()
	pin, err = r.objects.Open(ctx, fabric.Claim{Object: src.Object, Incarnation: src.Incarnation, Token: src.Token}.For(start, end-start))
	if err != nil {
		return nil, nil, remote, err
	}
	if end-start != spanBytes(dst.Desc) || end > pin.Len() {
		pin.Release()
		return nil, nil, remote, fmt.Errorf("%w: pushing %d bytes into a slot of %d", tensor.ErrTooSmall, end-start, spanBytes(dst.Desc))
	}
	remote = r.remoteFor(dst)
	remote.Offset, remote.Length = 0, end-start
	return pin, &objstore.Window{Buffer: pin, Off: start, N: end - start}, remote, nil
}

func spanBytes(d tensor.Desc) int64 {
	start, end := d.Span()
	return end - start
}

// notifyPush tells the slot's runtime that a push completed.
func (r *Runtime) notifyPush(ctx context.Context, dst Ref, n int64) error {
	note := ctlwire.PushNotice{Slot: dst.Object, Incarnation: dst.Incarnation, Token: dst.Token, Bytes: n}
	if dst.Owner == r.host.ID() {
		return r.pushed(r.host.ID(), note)
	}
	r.learnAddrs(dst)
	status, err := r.sendNotice(ctx, dst.Owner, note.Marshal())
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPeerUnreachable, err) // as sendBcast's
	}
	return ctlwire.ErrOf(status) // ctlwire: one table of notice answers
}

func (r *Runtime) pushed(from peer.ID, n ctlwire.PushNotice) error {
	s, err := r.sinks.lookup(n.Slot, n.Incarnation, n.Token)
	if err != nil {
		return err
	}
	if n.Bytes != s.buf.Len() {
		return fmt.Errorf("%w: push of %d bytes into a slot of %d", ErrMalformedRef, n.Bytes, s.buf.Len())
	}
	s.completedBy(from)
	return nil
}

// handlePush answers the push notices of one stream, one at a time, until
// the pusher closes it or it has been quiet for noticeIdle.
func (r *Runtime) handlePush(s network.Stream) {
	defer s.Close()
	for {
		s.SetDeadline(time.Now().Add(noticeIdle))
		p, err := ctlwire.ReadMsg(s, ctlwire.MaxNotice)
		if err != nil {
			if errors.Is(err, wire.ErrMalformed) {
				s.Write([]byte{ctlwire.StatusRefused}) // the framing is lost: answer and hang up
			}
			return // closed, reset, quiet for noticeIdle, or malformed
		}
		from := s.Conn().RemotePeer()
		if len(p) > 0 && p[0] == ctlwire.PushBatch { // many pushes (pushbatch.go)
			r.sinks.notices.Add(1)
			answer := []byte{ctlwire.StatusRefused}
			if n, err := ctlwire.ParsePushBatchNotice(p); err == nil {
				r.sinks.noticed.Add(int64(len(n.Items)))
				answer = ctlwire.AnswerPushBatch(r.pushedBatch(from, n))
			} else {
				r.log.Debug("push batch notice refused", "peer", shortID(from), "err", err)
			}
			if _, err := s.Write(answer); err != nil {
				return
			}
			continue
		}
		if len(p) > 0 && p[0] != ctlwire.Push { // a broadcast notice (bcastwire.go)
			var m bcastMsg
			if m, err = parseBcastMsg(p); err == nil {
				err = r.onBcast(from, m)
			}
		} else {
			var n ctlwire.PushNotice
			r.sinks.notices.Add(1)
			r.sinks.noticed.Add(1)
			if n, err = ctlwire.ParsePushNotice(p); err == nil {
				err = r.pushed(from, n)
			}
		}
		status := ctlwire.StatusOf(err)
		if err != nil {
			r.log.Debug("push notice refused", "peer", shortID(s.Conn().RemotePeer()), "err", err)
		}
		if _, err := s.Write([]byte{status}); err != nil {
			return
		}
	}
}
