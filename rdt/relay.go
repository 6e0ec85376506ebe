package rdt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
)

// The reader side of a broadcast. The owner prepares each reader's slot for
// the broadcast (a relay: which chunks have landed), tells the readers that
// forward which slots to forward to, then writes chunks. Each chunk that
// lands is queued to every child at once, so a reader forwards chunk i while
// chunk i+1 still arrives: the broadcast is pipelined down the tree, and
// the owner's egress carries each byte about once. A child that fails is
// reported to the owner, which routes around it.

// relay is one broadcast into one slot.
type relay struct {
	r            *Runtime
	s            *Slot
	id           bcastID
	origin       peer.ID
	originInc    uint64
	total, chunk int64
	nchunks      int
	ctx          context.Context
	cancel       context.CancelCauseFunc

	mu         sync.Mutex
	have       []bool
	got        int
	fwd        []*forwarder
	finishing  bool          // forwarders may no longer be added
	ownerEnded atomic.Bool   // the owner aborted it: no reports
	complete   chan struct{} // closed when every chunk landed
	wg         sync.WaitGroup
}

// forwarder sends the chunks a relay has to one child, in order of arrival.
type forwarder struct {
	child Ref
	q     chan int // chunk indexes; capacity nchunks, so queueing never blocks
}

// maxChunks bounds a broadcast's chunk count (its bookkeeping per slot).
const maxChunks = 1 << 20

func (r *Runtime) relayPrepare(from peer.ID, m bcastMsg) error {
	s, err := r.sinks.lookup(m.slot, m.inc, m.token)
	if err != nil {
		return err
	}
	total, chunk := m.n, m.off
	if total != s.buf.Len() {
		return fmt.Errorf("%w: broadcast of %d bytes into a slot of %d", ErrMalformedRef, total, s.buf.Len())
	}
	if chunk <= 0 || (chunk < minChunk && total > chunk) || (total+chunk-1)/chunk > maxChunks {
		return fmt.Errorf("%w: broadcast chunk size %d for %d bytes", ErrMalformedRef, chunk, total)
	}
	n := int((total + chunk - 1) / chunk)
	if n == 0 {
		n = 1 // an empty tensor: one empty chunk says it landed
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	rl := &relay{r: r, s: s, id: m.id, origin: from, originInc: m.originInc, total: total, chunk: chunk, nchunks: n,
		ctx: ctx, cancel: cancel, have: make([]bool, n), complete: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel(nil)
		return ErrObjectFreed
	}
	if s.flow && s.pushes > s.consumed {
		s.mu.Unlock()
		cancel(nil)
		return fmt.Errorf("%w: generation %d not done yet", ErrSlotBusy, s.pushes)
	}
	old := s.relay
	s.relay, s.lastErr = rl, nil
	s.pins++ // the relay reads the slot to forward it
	s.mu.Unlock()
	if old != nil {
		old.cancel(fmt.Errorf("%w: replaced by a newer broadcast", ErrBroadcastAborted))
	}
	go rl.run()
	return nil
}

// run ends the relay: when every chunk landed and was forwarded, or when it
// is aborted (the owner died or said so, Shutdown, the transfer timeout).
func (rl *relay) run() {
	r := rl.r
	var death <-chan struct{} // nil: the owner is this runtime, which cannot outlive itself
	if rl.origin != r.host.ID() {
		unuse := r.peers.use(rl.origin)
		defer unuse()
		death = r.peers.deathOf(rl.origin, rl.originInc)
	}
	tctx, tcancel := context.WithTimeout(rl.ctx, r.cfg.TransferTimeout)
	defer tcancel()
	watch := func() {
		select {
		case <-death:
			rl.cancel(fmt.Errorf("%w: %s (incarnation %x) died during a broadcast", ErrOwnerDied, shortID(rl.origin), rl.originInc))
		case <-r.done:
			rl.cancel(ErrClosed)
		case <-tctx.Done():
			if rl.ctx.Err() == nil {
				rl.cancel(fmt.Errorf("rdt: broadcast into slot %v: %w", rl.s.id, context.DeadlineExceeded))
			}
		}
	}
	stopped := make(chan struct{})
	go func() { watch(); close(stopped) }()

	select {
	case <-rl.complete:
	case <-rl.ctx.Done():
	}
	if rl.forwards() {
		// A relay that forwards stays open after it completes, until the
		// owner ends the broadcast (or dies, or the slot closes, or the
		// transfer timeout): the owner may re-parent an orphan to it, and
		// it has every chunk to give.
		<-rl.ctx.Done()
	}
	rl.mu.Lock()
	rl.finishing = true
	rl.mu.Unlock()
	rl.wg.Wait() // forwarders and the report
	aborted := context.Cause(rl.ctx)
	tcancel()
	<-stopped
	rl.cancel(nil)

	s := rl.s
	s.mu.Lock()
	if s.relay == rl {
		s.relay = nil
		if aborted != nil && !rl.isComplete() && !s.closed { // Close closed changed for good
			s.lastErr = aborted
			close(s.changed)
			s.changed = make(chan struct{})
		}
	}
	s.mu.Unlock()
	if aborted != nil && !rl.isComplete() {
		r.log.Info("broadcast into slot aborted", "slot", s.id, "err", aborted)
	}
	s.unpin()
}

func (rl *relay) forwards() bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return len(rl.fwd) > 0
}

func (rl *relay) isComplete() bool {
	select {
	case <-rl.complete:
		return true
	default:
		return false
	}
}

// relayOf finds the relay a notice names, checking the slot's capability.
func (r *Runtime) relayOf(m bcastMsg) (*relay, error) {
	s, err := r.sinks.lookup(m.slot, m.inc, m.token)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	rl := s.relay
	s.mu.Unlock()
	if rl == nil || rl.id != m.id {
		return nil, fmt.Errorf("%w: no broadcast %x into slot %v", ErrObjectNotFound, m.id[:4], m.slot)
	}
	return rl, nil
}

func (r *Runtime) relayChildren(from peer.ID, m bcastMsg) error {
	rl, err := r.relayOf(m)
	if err != nil {
		return err
	}
	if from != rl.origin {
		return fmt.Errorf("%w: only the broadcast's owner names children", ErrUnauthorized)
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.finishing || rl.ctx.Err() != nil {
		return fmt.Errorf("%w: broadcast into slot %v has ended", ErrObjectNotFound, m.slot)
	}
	for _, c := range m.children {
		r.learnAddrs(c)
		f := &forwarder{child: c, q: make(chan int, rl.nchunks)}
		for i, ok := range rl.have {
			if ok {
				f.q <- i
			}
		}
		rl.fwd = append(rl.fwd, f)
		rl.wg.Add(1)
		go rl.forward(f)
	}
	return nil
}

func (r *Runtime) relayChunk(m bcastMsg) error {
	rl, err := r.relayOf(m)
	if err != nil {
		return err
	}
	i := int(m.off / rl.chunk)
	if m.off%rl.chunk != 0 || i >= rl.nchunks || m.n != min(rl.chunk, rl.total-m.off) {
		return fmt.Errorf("%w: chunk %d+%d of a %d-byte broadcast in chunks of %d", ErrMalformedRef, m.off, m.n, rl.total, rl.chunk)
	}
	if i > 0 && r.bcasts.dropChunks.Load() {
		return nil
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.have[i] || rl.ctx.Err() != nil {
		return nil // a repeat (the owner re-feeding after a failed parent)
	}
	rl.have[i] = true
	rl.got++
	for _, f := range rl.fwd {
		f.q <- i
	}
	if rl.got == rl.nchunks {
		gen := rl.s.completedBy(rl.origin)
		close(rl.complete)
		rl.wg.Add(1)
		go func() {
			defer rl.wg.Done()
			rl.report(bcastMsg{kind: noteReport, gen: gen})
		}()
	}
	return nil
}

func (r *Runtime) relayAbort(from peer.ID, m bcastMsg) error {
	rl, err := r.relayOf(m)
	if err != nil {
		return nil // already over
	}
	if from != rl.origin {
		return ErrUnauthorized
	}
	rl.ownerEnded.Store(true)
	rl.cancel(fmt.Errorf("%w: %s", ErrBroadcastAborted, m.text))
	return nil
}

// report tells the owner about this slot; an owner that cannot be told is
// gone or has given up on the broadcast, which then says so itself.
func (rl *relay) report(m bcastMsg) {
	m.id, m.slot, m.inc = rl.id, rl.s.id, rl.r.incarnation
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rl.ctx), controlTimeout)
	defer cancel()
	go func() { // not past Shutdown
		select {
		case <-rl.r.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := rl.r.sendBcast(ctx, rl.origin, m); err != nil {
		rl.r.log.Debug("broadcast report not delivered", "slot", rl.s.id, "err", err)
	}
}

// forward writes each chunk queued to f into its child's slot, then tells
// the child it landed. The first failure is reported and ends f.
func (rl *relay) forward(f *forwarder) {
	defer rl.wg.Done()
	r := rl.r
	src := rl.r.endpoint(rl.s.buf.Device())
	for sent := 0; sent < rl.nchunks; sent++ {
		var i int
		select {
		case i = <-f.q:
		case <-rl.ctx.Done():
			// Stopped before the child had everything: unless the owner
			// ended it (or died, or this runtime is shutting down), the
			// owner must feed the child itself.
			if c := context.Cause(rl.ctx); !rl.ownerEnded.Load() && !errors.Is(c, ErrOwnerDied) && !errors.Is(c, ErrClosed) {
				// Told from a goroutine of its own, so the slot's pin
				// (held until the forwarders end) does not wait on it.
				go rl.report(bcastMsg{kind: noteReport, failed: f.child.Object, text: "its parent stopped forwarding: " + c.Error()})
			}
			return
		}
		off := int64(i) * rl.chunk
		n := min(rl.chunk, rl.total-off)
		err := r.writeChunk(rl.ctx, rl.id, &window{Buffer: rl.s.buf, off: off, n: n}, src, f.child, off, n)
		if err != nil {
			if rl.ctx.Err() == nil {
				rl.report(bcastMsg{kind: noteReport, failed: f.child.Object, text: err.Error()})
			}
			return
		}
	}
}

// writeChunk writes n bytes of src into dst's slot at off and tells the
// slot's runtime they landed.
func (r *Runtime) writeChunk(ctx context.Context, id bcastID, src *window, srcEp fabric.Endpoint, dst Ref, off, n int64) error {
	if n > 0 {
		remote := r.remoteFor(dst)
		remote.Offset, remote.Length = off, n
		if _, _, err := r.planner.Write(ctx, srcEp, src, remote); err != nil {
			return err
		}
	}
	return r.sendBcast(ctx, dst.Owner, bcastMsg{kind: noteChunk, id: id, slot: dst.Object, inc: dst.Incarnation, token: dst.Token, off: off, n: n})
}
