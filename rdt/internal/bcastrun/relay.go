package bcastrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// RelayDeps is what Relays are built from.
type RelayDeps struct {
	Env     Env
	Sinks   *objstore.Sinks // the slots broadcasts fill
	Metrics *bcast.Metrics
	Log     *slog.Logger
	// TransferTimeout bounds a broadcast into a slot; ReportWait each
	// report to the owner.
	TransferTimeout, ReportWait time.Duration
	// The faults tests simulate (rdt/internal/faults.Sim, which the
	// runtime holds): DropChunks says whether this runtime's slots drop
	// every chunk but a broadcast's first; HoldChunk waits while tests
	// hold chunk notices back. nil: healthy.
	DropChunks func() bool
	HoldChunk  func()
}

// Relays is a runtime's reader side of broadcasts: each relay fills some
// of its slots and forwards what lands to the children the owner names.
type Relays struct {
	d   RelayDeps
	env Env

	// Prepares counts the prepare notices this runtime's slots took (one
	// per reader per broadcast).
	Prepares atomic.Int64
}

// NewRelays returns a runtime's reader side.
func NewRelays(d RelayDeps) *Relays {
	if d.DropChunks == nil {
		d.DropChunks = func() bool { return false }
	}
	if d.HoldChunk == nil {
		d.HoldChunk = func() {}
	}
	return &Relays{d: d, env: d.Env}
}

// The reader side of a broadcast. The owner prepares each reader's slot for
// the broadcast (a relay: which chunks have landed), tells the readers that
// forward which slots to forward to, then writes chunks. Each chunk that
// lands is queued to every child at once, so a reader forwards chunk i while
// chunk i+1 still arrives: the broadcast is pipelined down the tree, and
// the owner's egress carries each byte about once. A child that fails is
// reported to the owner, which routes around it.

// relay is one broadcast into a reader's slots: one slot, or one per
// object of a batch (a state dict), whose chunks are numbered in one space
// (bcast.Chunks) so that the whole batch flows down the tree as one stream.
type relay struct {
	rs        *Relays
	items     []relayItem
	byID      map[fabric.ObjectID]int
	id        bcast.ID
	origin    peer.ID
	originInc uint64
	chunks    *bcast.Chunks
	nchunks   int // chunks.Len(), once every slot is added
	window    int // chunks in flight per forward
	ctx       context.Context
	cancel    context.CancelCauseFunc

	mu         sync.Mutex
	have       []bool
	got        int
	fwd        []*forwarder
	finishing  bool          // forwarders may no longer be added
	ownerEnded atomic.Bool   // the owner aborted it: no reports
	complete   chan struct{} // closed when every chunk landed
	wg         sync.WaitGroup
}

// relayItem is one slot of a relay.
type relayItem struct {
	s      *objstore.Slot
	n      int // its chunks
	got    int
	gen    uint64 // the slot's generation once every chunk landed
	pinned bool
}

// forwarder sends the chunks a relay has to one child, in order of arrival.
type forwarder struct {
	child Ref      // its first slot (where reports point)
	items []Ref    // its slot per item
	q     chan int // chunk indexes; capacity nchunks, so queueing never blocks
	probe bool     // the child was re-parented: ask before each write whether it lacks the chunk
}

// Prepare readies this runtime's slots for broadcast m from its owner.
func (rs *Relays) Prepare(from peer.ID, m Msg) error {
	rs.Prepares.Add(1)
	items := m.Items
	if len(items) == 0 {
		items = []bcast.Item{{Slot: m.Slot, Token: m.Token, N: m.N}}
	}
	chunks, cerr := bcast.NewChunks(m.Off)
	if cerr != nil {
		return fmt.Errorf("%w: %w", errs.MalformedRef, cerr)
	}
	if m.Gen > bcast.MaxWindow {
		return fmt.Errorf("%w: broadcast window of %d chunks (at most %d)", errs.MalformedRef, m.Gen, bcast.MaxWindow)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	rl := &relay{rs: rs, id: m.ID, origin: from, originInc: m.OriginInc, chunks: chunks, window: max(1, int(m.Gen)), ctx: ctx, cancel: cancel,
		byID: map[fabric.ObjectID]int{}, complete: make(chan struct{})}
	for k, it := range items {
		s, err := rs.d.Sinks.Lookup(it.Slot, m.Inc, it.Token)
		if err != nil {
			cancel(nil)
			return fmt.Errorf("slot %d of %d: %w", k+1, len(items), err)
		}
		if _, dup := rl.byID[it.Slot]; dup {
			cancel(nil)
			return fmt.Errorf("%w: slot %v twice in one broadcast", errs.MalformedRef, it.Slot)
		}
		if it.N != s.Buf.Len() {
			cancel(nil)
			return fmt.Errorf("%w: broadcast of %d bytes into a slot of %d", errs.MalformedRef, it.N, s.Buf.Len())
		}
		if err := chunks.Add(it.N); err != nil {
			cancel(nil)
			return fmt.Errorf("%w: %w", errs.MalformedRef, err)
		}
		rl.byID[it.Slot] = k
		rl.items = append(rl.items, relayItem{s: s, n: chunks.Count(k)})
	}
	rl.nchunks = chunks.Len()
	rl.have = make([]bool, rl.nchunks)
	// A closed or busy slot refuses the whole broadcast before any is
	// taken (the owner retries a busy one), ...
	for _, it := range rl.items {
		if err := it.s.Writable(); err != nil {
			cancel(nil)
			return err
		}
	}
	// ... then they are taken one by one; a slot that is closed or busy fails the
	// reader's whole broadcast (run releases those taken already).
	var err error
	var old []objstore.Filler
	for k := range rl.items {
		it := &rl.items[k]
		o, ferr := it.s.Fill(rl) // the relay reads the slot to forward it
		if ferr != nil {
			err = ferr
			break
		}
		it.pinned = true
		if o != nil && !slices.Contains(old, o) {
			old = append(old, o)
		}
	}
	for _, o := range old {
		o.Abort(fmt.Errorf("%w: replaced by a newer broadcast", errs.BroadcastAborted))
	}
	if err != nil {
		rl.ownerEnded.Store(true) // the owner learns it from the answer
		rl.cancel(err)
	}
	go rl.run()
	return err
}

// run ends the relay: when every chunk landed and was forwarded, or when it
// is aborted (the owner died or said so, Shutdown, the transfer timeout).
func (rl *relay) run() {
	rs := rl.rs
	var death <-chan struct{} // nil: the owner is this runtime, which cannot outlive itself
	if self, _ := rs.env.Self(); rl.origin != self {
		d, unwatch := rs.env.Watch(rl.origin, rl.originInc)
		defer unwatch()
		death = d
	}
	tctx, tcancel := context.WithTimeout(rl.ctx, rs.d.TransferTimeout)
	defer tcancel()
	watch := func() {
		select {
		case <-death:
			rl.cancel(fmt.Errorf("%w: %s (incarnation %x) died during a broadcast", errs.OwnerDied, refwire.ShortID(rl.origin), rl.originInc))
		case <-rs.env.Done():
			rl.cancel(errs.Closed)
		case <-tctx.Done():
			if rl.ctx.Err() == nil {
				rl.cancel(fmt.Errorf("rdt: broadcast into slot %v: %w", rl.items[0].s.ID, context.DeadlineExceeded))
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

	for k := range rl.items {
		it := &rl.items[k]
		if !it.pinned {
			continue
		}
		rl.mu.Lock()
		done := it.got == it.n
		rl.mu.Unlock()
		it.s.Unfill(rl, aborted, done)
	}
	if aborted != nil && !rl.isComplete() {
		rs.d.Log.Info("broadcast into slot aborted", "slot", rl.items[0].s.ID, "slots", len(rl.items), "err", aborted)
	}
}

// Abort ends the relay with cause (objstore.Filler: the slot closed, or a
// newer broadcast replaced it).
func (rl *relay) Abort(cause error) { rl.cancel(cause) }

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

// relayOf finds the relay a notice names, checking the slot's capability,
// and the slot's item in it.
func (rs *Relays) relayOf(m Msg) (*relay, int, error) {
	s, err := rs.d.Sinks.Lookup(m.Slot, m.Inc, m.Token)
	if err != nil {
		return nil, 0, err
	}
	rl, _ := s.Filler().(*relay)
	if rl == nil || rl.id != m.ID {
		return nil, 0, fmt.Errorf("%w: no broadcast %x into slot %v", errs.ObjectNotFound, m.ID[:4], m.Slot)
	}
	return rl, rl.byID[m.Slot], nil
}

// Children makes this runtime's slot forward what lands to m's children.
func (rs *Relays) Children(from peer.ID, m Msg) error {
	rl, _, err := rs.relayOf(m)
	if err != nil {
		return err
	}
	if from != rl.origin {
		return fmt.Errorf("%w: only the broadcast's owner names children", errs.Unauthorized)
	}
	// A batch names one child a notice, with its slot per item.
	if (len(m.Items) > 0 || len(rl.items) > 1) && (len(m.Children) != 1 || len(m.Items) != len(rl.items)) {
		return fmt.Errorf("%w: %d children with %d slots for a broadcast of %d objects", errs.MalformedRef, len(m.Children), len(m.Items), len(rl.items))
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.finishing || rl.ctx.Err() != nil {
		return fmt.Errorf("%w: broadcast into slot %v has ended", errs.ObjectNotFound, m.Slot)
	}
	for _, c := range m.Children {
		rs.env.Learn(c)
		f := &forwarder{child: c, items: []Ref{c}, q: make(chan int, rl.nchunks), probe: m.Gen == 1}
		if len(m.Items) > 0 {
			f.items = make([]Ref, len(m.Items))
			for k, it := range m.Items {
				x := c
				x.Object, x.Token, x.Desc = it.Slot, it.Token, tensor.Desc{DType: it.DType}
				f.items[k] = x
			}
		}
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

// chunkOf is the relay's chunk number for the range a chunk or probe
// notice names in item k.
func (rl *relay) chunkOf(k int, m Msg) (int, error) {
	g, err := rl.chunks.Index(k, m.Off, m.N)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errs.MalformedRef, err)
	}
	return g, nil
}

// Probe answers a re-parented slot's new feeder: errs.ChunkHeld when
// the slot has the chunk already, so that only the chunks it lacks cross
// the new edge (and a flow-controlled slot whose object has landed is not
// written again).
func (rs *Relays) Probe(m Msg) error {
	rl, k, err := rs.relayOf(m)
	if err != nil {
		return err
	}
	g, err := rl.chunkOf(k, m)
	if err != nil {
		return err
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.have[g] {
		rs.d.Metrics.Skipped.Inc()
		return errs.ChunkHeld
	}
	return nil
}

// Chunk takes a chunk that landed in this runtime's slot: forwarded to
// every child at once, the slot complete once every chunk landed.
func (rs *Relays) Chunk(m Msg) error {
	rl, k, err := rs.relayOf(m)
	if err != nil {
		return err
	}
	it := &rl.items[k]
	g, err := rl.chunkOf(k, m)
	if err != nil {
		return err
	}
	if g > 0 && rs.d.DropChunks() {
		return nil
	}
	rs.d.HoldChunk()
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.have[g] || rl.ctx.Err() != nil {
		return nil // a repeat (the owner re-feeding after a failed parent)
	}
	rl.have[g] = true
	rl.got++
	it.got++
	for _, f := range rl.fwd {
		f.q <- g
	}
	if it.got == it.n {
		// Each object of a batch is the reader's as soon as it landed.
		it.gen = it.s.CompletedBy(rl.origin)
	}
	if rl.got == rl.nchunks {
		close(rl.complete)
		rep := Msg{Kind: ctlwire.Report, Gen: rl.items[0].gen}
		if len(rl.items) > 1 {
			for _, x := range rl.items {
				rep.Gens = append(rep.Gens, x.gen)
			}
		}
		rl.wg.Add(1)
		go func() {
			defer rl.wg.Done()
			rl.report(rep)
		}()
	}
	return nil
}

// Abort ends broadcast m into this runtime's slot, at its owner's word.
func (rs *Relays) Abort(from peer.ID, m Msg) error {
	rl, _, err := rs.relayOf(m)
	if err != nil {
		return nil // already over
	}
	if from != rl.origin {
		return errs.Unauthorized
	}
	rl.ownerEnded.Store(true)
	rl.cancel(fmt.Errorf("%w: %s", errs.BroadcastAborted, m.Text))
	return nil
}

// report tells the owner about this slot; an owner that cannot be told is
// gone or has given up on the broadcast, which then says so itself.
func (rl *relay) report(m Msg) {
	_, inc := rl.rs.env.Self()
	m.ID, m.Slot, m.Inc = rl.id, rl.items[0].s.ID, inc
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rl.ctx), rl.rs.d.ReportWait)
	defer cancel()
	go func() { // not past Shutdown
		select {
		case <-rl.rs.env.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := rl.rs.env.Send(ctx, rl.origin, m); err != nil {
		rl.rs.d.Log.Debug("broadcast report not delivered", "slot", rl.items[0].s.ID, "err", err)
	}
}

// forward writes each chunk queued to f into its child's slot, then tells
// the child it landed, rl.window chunks in flight. The first failure is
// reported and ends f.
func (rl *relay) forward(f *forwarder) {
	defer rl.wg.Done()
	w := bcast.NewWindow(rl.ctx, rl.window)
	writers := make([]WriteFunc, len(f.items)) // per item, made when its first chunk goes
chunks:
	for sent := 0; sent < rl.nchunks; sent++ {
		var i int
		select {
		case i = <-f.q:
		case <-w.Done():
			break chunks
		}
		k, off, n := rl.chunks.Locate(i)
		buf := rl.items[k].s.Buf
		if writers[k] == nil {
			writers[k] = rl.rs.env.Edge(buf.Device(), f.items[k])
		}
		write := writers[k]
		started := w.Send(func(ctx context.Context) error {
			return WriteChunk(ctx, rl.rs.env, write, rl.id, &objstore.Window{Buffer: buf, Off: off, N: n}, f.items[k], off, f.probe)
		})
		if !started {
			break chunks
		}
	}
	// The writes in flight read the slot, pinned until the forwarders end.
	ok, err := w.Wait()
	switch {
	case ok == rl.nchunks:
	case err != nil && rl.ctx.Err() == nil:
		rl.report(Msg{Kind: ctlwire.Report, Failed: f.child.Object, Text: err.Error()})
	case rl.ctx.Err() != nil:
		// Stopped before the child had everything: unless the owner
		// ended it (or died, or this runtime is shutting down), the
		// owner must feed the child itself.
		if c := context.Cause(rl.ctx); !rl.ownerEnded.Load() && !errors.Is(c, errs.OwnerDied) && !errors.Is(c, errs.Closed) {
			// Told from a goroutine of its own, so the slot's pin
			// (held until the forwarders end) does not wait on it.
			go rl.report(Msg{Kind: ctlwire.Report, Failed: f.child.Object, Text: "its parent stopped forwarding: " + c.Error()})
		}
	}
}

// Landed is how many chunks of the broadcast filling s have landed in its
// relay so far (0 when no broadcast fills it): its progress as a reader.
func Landed(s *objstore.Slot) int {
	rl, _ := s.Filler().(*relay)
	if rl == nil {
		return 0
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return rl.got
}
