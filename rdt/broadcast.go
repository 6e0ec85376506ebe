package rdt

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/tensor"
)

// Broadcast publishes one object to many readers' slots at once (RL weight
// sync: a trainer, a fleet of inference workers). The bytes flow along a
// tree the owner plans from the topology: the owner feeds one reader per
// host (the host's leader) along a chain of hosts, nearest first (same
// NVLink domain, then same rack), and each leader feeds the other readers
// of its host (shm/p2p) in a chain. The object moves in chunks, and a reader
// forwards each chunk as soon as it has it (relay.go), so the chain is
// pipelined and the owner's egress carries each byte about once whatever
// the number of readers.
//
// A reader that dies, or that its parent cannot write to, is routed
// around: each orphan (with its subtree behind it) is re-parented to the
// nearest live ancestor in the planned tree, which has the chunks or is
// getting them, else to the owner. The result says, per reader, whether it
// has the data, the generation it holds, who fed it in the end, and
// otherwise why not; BroadcastResult.String draws the tree followed.
// BroadcastBatch (bcastbatch.go) sends a set of objects along one tree.

// BroadcastConfig tunes a broadcast; the zero value means the defaults
// (ChunkSize, BusyWait and Window are documented on bcast.Config).
type BroadcastConfig = bcast.Config

// MaxBroadcastWindow bounds BroadcastConfig.Window: past a few chunks the
// edge is full, and each chunk in flight holds a notice stream and a
// transport connection.
const MaxBroadcastWindow = bcast.MaxWindow

// ReaderResult is one reader's outcome of a broadcast.
type ReaderResult struct {
	Slot       Ref
	Parent     int    // index of the reader it was fed by at first, -1 for the owner
	FedBy      int    // the reader feeding it in the end, -1 for the owner; not Parent when it was re-parented
	Fed        string // FedBy in words: "owner" or "reader N"
	Path       string // the transport from FedBy
	Generation uint64 // the slot's generation now holding the data (0 if Err)
	Err        error  // nil: the slot holds the whole object, verified by its transports

	// A batch (BroadcastBatch): the reader's slot and its generation per
	// object, in the batch's order; an object left out of the batch has
	// generation 0. Slot and Generation are the first object's.
	Slots       []Ref
	Generations []uint64
}

// Reparented says whether the reader was fed by another node than the plan
// said, because its parent died or could not write to it.
func (r ReaderResult) Reparented() bool { return r.FedBy != r.Parent }

// BroadcastResult is a broadcast's outcome, reader by reader.
type BroadcastResult struct {
	Readers  []ReaderResult
	Bytes    int64
	Duration time.Duration
	Plan     BroadcastPlan

	rt *Runtime
}

// String draws the tree the broadcast followed in the end: re-parented
// edges say where the plan had put the reader, failed readers say why.
func (b *BroadcastResult) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "owner %s: %d of %d readers have the data (%d bytes in %v)\n", b.Plan.Owner, b.OK(), len(b.Readers), b.Bytes, b.Duration.Round(time.Microsecond))
	seen := make([]bool, len(b.Readers))
	var walk func(parent, depth int)
	walk = func(parent, depth int) {
		for i, rr := range b.Readers {
			if rr.FedBy != parent || seen[i] {
				continue
			}
			seen[i] = true
			note := ""
			if rr.Reparented() {
				was := "the owner"
				if rr.Parent >= 0 {
					was = fmt.Sprintf("reader %d", rr.Parent)
				}
				note = " (re-parented; planned under " + was + ")"
			}
			outcome := fmt.Sprintf("ok, generation %d", rr.Generation)
			if rr.Err != nil {
				outcome = "FAILED: " + rr.Err.Error()
			}
			fmt.Fprintf(&s, "%s└─ reader %d %s/%s via %s%s: %s\n", strings.Repeat("   ", depth), i, rr.Slot.Host, rr.Slot.Device, rr.Path, note, outcome)
			walk(i, depth+1)
		}
	}
	walk(-1, 0)
	return s.String()
}

// OK is the number of readers that have the data.
func (b *BroadcastResult) OK() int {
	n := 0
	for _, r := range b.Readers {
		if r.Err == nil {
			n++
		}
	}
	return n
}

// Err is nil when every reader has the data, else an error naming those
// that do not (each ReaderResult says why).
func (b *BroadcastResult) Err() error {
	var bad []string
	for i, r := range b.Readers {
		if r.Err != nil {
			bad = append(bad, fmt.Sprintf("reader %d (%s): %v", i, r.Slot.Host, r.Err))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("rdt: broadcast reached %d of %d readers; %s", b.OK(), len(b.Readers), strings.Join(bad, "; "))
}

// WaitConsumed waits until every reader that got this broadcast said Done
// with its generation (the end of a step in flow-controlled weight sync).
// A reader that dies meanwhile is not waited for: the error names each
// reader that did not finish, and why (ErrReaderDied, or ctx's error).
func (b *BroadcastResult) WaitConsumed(ctx context.Context) error {
	a := &Actor{rt: b.rt}
	errs := make([]error, len(b.Readers))
	var wg sync.WaitGroup
	for i, r := range b.Readers {
		if r.Err != nil {
			continue
		}
		slots, gens := r.Slots, r.Generations
		if len(slots) == 0 {
			slots, gens = []Ref{r.Slot}, []uint64{r.Generation}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k, s := range slots {
				if gens[k] == 0 {
					continue // an object left out of the batch
				}
				if err := a.WaitConsumed(ctx, s, gens[k]); err != nil {
					errs[i] = fmt.Errorf("reader %d (%s): %w", i, r.Slot.Host, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// BroadcastPlan is the tree a broadcast follows; PlanNode is one reader
// in it. Both are planned in package bcast (PlanTree), a pure function of
// the topology that PlanBroadcastTree runs without a runtime.
type (
	BroadcastPlan = bcast.Plan
	PlanNode      = bcast.Node
)

// ExplainBroadcast says which tree a broadcast of src to slots would
// follow and which path each edge would take.
func (a *Actor) ExplainBroadcast(src Ref, slots []Ref) BroadcastPlan {
	return a.rt.planBroadcast(src, slots)
}

// planBroadcast is bcast.PlanTree over the slots' endpoints, each edge's
// path what the relay's write would run.
func (r *Runtime) planBroadcast(src Ref, slots []Ref) BroadcastPlan {
	eps := make([]fabric.Endpoint, len(slots))
	for i, s := range slots {
		eps[i] = fabric.Endpoint{Host: s.Host, Device: s.Device}
	}
	return bcast.PlanTree(r.cfg.Cluster, fabric.Endpoint{Host: src.Host, Device: src.Device}, eps, func(parent, child int) string {
		from := src
		if parent >= 0 {
			from = slots[parent]
		}
		return r.edgePath(from, slots[child])
	})
}

// edgePath is the transport a broadcast edge from from's memory into
// slot to would take.
func (r *Runtime) edgePath(from, to Ref) string {
	parentEp := r.remoteFor(from).Endpoint
	child := r.remoteFor(to)
	if parentEp.Process == child.Endpoint.Process {
		// Both in one other runtime: ask as that runtime would (the
		// local transports serve only their own runtime's pairs).
		parentEp.Process, child.Endpoint.Process = r.process, r.process
	}
	if p := r.planner.PlanWrite(parentEp, child).Chosen; p != "" { // what the relay's push runs
		return p
	}
	return "none"
}

// bcastState is the owner's table of broadcasts in flight, for reports.
type bcastState struct {
	mu   sync.Mutex
	runs map[bcast.ID]*bcastRun

	// Test hook: slots of this runtime take only the first chunk of a
	// broadcast (the rest are acknowledged and dropped), so a reader is
	// mid-transfer for as long as a test needs.
	dropChunks atomic.Bool
	prepares   atomic.Int64 // prepare notices this runtime's slots took (one per reader per broadcast)
	// Test hook: chunk notices to this runtime's slots wait while hold is
	// set (until it is closed), so a test sees how many chunks a writer
	// keeps in flight: held counts those waiting, heldMax the most at once.
	hold    atomic.Pointer[chan struct{}]
	held    atomic.Int64
	heldMax atomic.Int64
}

// holdChunk waits while the test hook hold is set.
func (s *bcastState) holdChunk() {
	h := s.hold.Load()
	if h == nil {
		return
	}
	n := s.held.Add(1)
	for m := s.heldMax.Load(); n > m && !s.heldMax.CompareAndSwap(m, n); m = s.heldMax.Load() {
	}
	<-*h
	s.held.Add(-1)
}

// bnode is one reader of a broadcast: its place in the tree
// (bcast.Reader, decided by bcastRun.tree), its slots and its outcome.
type bnode struct {
	bcast.Reader
	ref   Ref   // its first slot: the reader's name in notices and reports
	items []Ref // its slot per object (one, or one per object of a batch)
	gens  []uint64
	gen   uint64
	err   error
}

type bcastEvent struct {
	node   int
	kind   byte // ctlwire.Report (gen, or failed: a child it could not feed), or one of ev*
	failed int  // report: the child that failed, -1 when the node completed; evRefused: the refusing node
	gen    uint64
	gens   []uint64
	err    error
	from   peer.ID
}

// Event kinds besides ctlwire.Report.
const (
	evEdgeFailed byte = 0 // the owner could not feed the node, or tell it its children
	evDied       byte = 1 // the node's runtime was declared dead
	evRefused    byte = 2 // the node a orphan was re-parented to did not take it
)

type bcastRun struct {
	r      *Runtime
	id     bcast.ID
	srcs   []bcastSrc
	cfg    BroadcastConfig
	total  int64 // bytes per reader: every object's
	nodes  []*bnode
	tree   bcast.Tree // the nodes' places, in order
	plan   BroadcastPlan
	bySlot map[fabric.ObjectID]int

	mu     sync.Mutex
	events []bcastEvent
	kick   chan struct{}

	done  atomic.Int64 // bytes delivered, for progress
	edges sync.WaitGroup
}

// bcastSrc is one object a broadcast sends, pinned for the broadcast.
type bcastSrc struct {
	ref   Ref
	pin   tensor.Buffer
	start int64 // the object's first byte in its buffer
	total int64
}

func (b *bcastRun) post(ev bcastEvent) {
	b.mu.Lock()
	b.events = append(b.events, ev)
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

func (b *bcastRun) take() []bcastEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev := b.events
	b.events = nil
	return ev
}

// bcastReport takes a reader's report to a broadcast this runtime owns.
func (r *Runtime) bcastReport(from peer.ID, m bcastMsg) error {
	r.bcasts.mu.Lock()
	b, ok := r.bcasts.runs[m.ID]
	r.bcasts.mu.Unlock()
	if !ok {
		return nil // over already
	}
	i, ok := b.bySlot[m.Slot]
	if !ok || b.nodes[i].ref.Owner != from {
		return fmt.Errorf("%w: report for a slot of another runtime", ErrUnauthorized)
	}
	ev := bcastEvent{node: i, kind: ctlwire.Report, failed: -1, gen: m.Gen, gens: m.Gens, from: from}
	if m.Failed != (fabric.ObjectID{}) {
		c, ok := b.bySlot[m.Failed]
		if !ok {
			return fmt.Errorf("%w: report names an unknown child", ErrMalformedRef)
		}
		ev.failed, ev.err = c, fmt.Errorf("forwarded by reader %d: %s", i, m.Text)
	}
	b.post(ev)
	return nil
}

// Broadcast writes the object behind src, which this actor's runtime owns,
// into every slot (each the size of src's tensor), pipelined along the
// tree ExplainBroadcast shows. It returns when every reader has the data or
// has failed; the result says which. The error is non-nil only when the
// broadcast could not start (bad input, src not owned or freed); readers
// that failed are in the result (BroadcastResult.Err sums them up).
func (a *Actor) Broadcast(ctx context.Context, src Ref, slots []Ref, cfg BroadcastConfig) (*BroadcastResult, error) {
	return a.StartBroadcast(ctx, src, slots, cfg).Await(ctx)
}

func (a *Actor) broadcast(ctx context.Context, src Ref, slots []Ref, cfg BroadcastConfig, progress func(*bcastRun)) (*BroadcastResult, error) {
	readers := make([][]Ref, len(slots))
	for i, s := range slots {
		readers[i] = []Ref{s}
	}
	res, itemErrs, err := a.broadcastSet(ctx, []Ref{src}, readers, cfg, progress)
	if err == nil && itemErrs[0] != nil {
		err = itemErrs[0]
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// broadcastSet sends every object of srcs to every reader, readers[j][k]
// being reader j's slot for srcs[k], along one tree. An object that cannot
// be sent (not owned, freed) is left out, its error in itemErrs; err is
// non-nil when nothing could start.
func (a *Actor) broadcastSet(ctx context.Context, srcs []Ref, readers [][]Ref, cfg BroadcastConfig, progress func(*bcastRun)) (*BroadcastResult, []error, error) {
	r := a.rt
	if r.isClosed() {
		return nil, nil, ErrClosed
	}
	if len(readers) == 0 {
		return nil, nil, fmt.Errorf("%w: broadcast to no readers", ErrMalformedRef)
	}
	if len(srcs) == 0 || len(srcs) > bcast.MaxItems {
		return nil, nil, fmt.Errorf("%w: a broadcast of %d objects (1 to %d)", ErrMalformedRef, len(srcs), bcast.MaxItems)
	}
	for j, rs := range readers {
		if len(rs) != len(srcs) {
			return nil, nil, fmt.Errorf("%w: reader %d has %d slots for %d objects", ErrMalformedRef, j, len(rs), len(srcs))
		}
	}
	cfg = cfg.Defaults()
	if cfg.ChunkSize < bcast.MinChunk {
		return nil, nil, fmt.Errorf("%w: chunks of %d bytes (at least %d)", ErrMalformedRef, cfg.ChunkSize, bcast.MinChunk)
	}
	if cfg.Window < 1 || cfg.Window > MaxBroadcastWindow {
		return nil, nil, fmt.Errorf("%w: a window of %d chunks per edge (1 to %d)", ErrMalformedRef, cfg.Window, MaxBroadcastWindow)
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	// Shutdown ends the broadcast; a runtime that is gone tells no reader
	// anything (they learn of its death as they would of a crash).
	go func() {
		select {
		case <-r.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	b := &bcastRun{r: r, cfg: cfg, kick: make(chan struct{}, 1), bySlot: map[fabric.ObjectID]int{}}
	rand.Read(b.id[:])
	// Pin every object; one that cannot be is left out of the batch.
	itemErrs := make([]error, len(srcs))
	var valid []int
	chunks := int64(0)
	for k, src := range srcs {
		bs, err := r.pinSource(ctx, src)
		if err != nil {
			itemErrs[k] = err
			continue
		}
		defer bs.pin.Release()
		chunks += max(1, (bs.total+cfg.ChunkSize-1)/cfg.ChunkSize)
		b.srcs = append(b.srcs, bs)
		b.total += bs.total
		valid = append(valid, k)
	}
	if len(b.srcs) == 0 {
		return nil, itemErrs, errors.Join(itemErrs...)
	}
	if chunks > bcast.MaxChunks {
		return nil, itemErrs, fmt.Errorf("%w: %d chunks of %d bytes (at most %d)", ErrMalformedRef, chunks, cfg.ChunkSize, bcast.MaxChunks)
	}
	seen := map[fabric.ObjectID]bool{}
	for j, rs := range readers {
		n := &bnode{ref: rs[0], Reader: bcast.Reader{Parent: -1, First: -1}}
		for _, k := range valid {
			n.items = append(n.items, rs[k])
		}
		n.ref = n.items[0]
		for _, it := range rs {
			if seen[it.Object] {
				return nil, itemErrs, fmt.Errorf("%w: slot %v given twice", ErrMalformedRef, it.Object)
			}
			seen[it.Object] = true
		}
		b.bySlot[n.ref.Object] = j // reports name the reader's first slot
		b.nodes = append(b.nodes, n)
		b.tree.Nodes = append(b.tree.Nodes, &n.Reader)
	}
	if progress != nil {
		progress(b)
	}
	r.bcasts.mu.Lock()
	if r.bcasts.runs == nil {
		r.bcasts.runs = map[bcast.ID]*bcastRun{}
	}
	r.bcasts.runs[b.id] = b
	r.bcasts.mu.Unlock()
	defer func() {
		r.bcasts.mu.Lock()
		delete(r.bcasts.runs, b.id)
		r.bcasts.mu.Unlock()
	}()
	// Each reader is a live transfer to observers (the dashboard) while
	// the broadcast runs.
	observed := make([]func(Transfer, error), len(b.nodes))
	for i, n := range b.nodes {
		observed[i] = r.obs.begin(a.name+" (broadcast)", b.srcs[0].ref, fabric.Endpoint{Host: n.ref.Host, Device: n.ref.Device})
	}
	began := time.Now()
	b.run(ctx)
	res := &BroadcastResult{Bytes: b.total, Duration: time.Since(began), Plan: b.plan, rt: r}
	for i, n := range b.nodes {
		rr := ReaderResult{Slot: n.ref, Parent: n.First, FedBy: n.Parent, Path: b.plan.Nodes[i].Path, Generation: n.gen, Err: n.err, Fed: "owner"}
		if len(srcs) > 1 {
			rr.Slots = readers[i]
			rr.Generations = make([]uint64, len(srcs))
			for x, k := range valid {
				if x < len(n.gens) {
					rr.Generations[k] = n.gens[x]
				}
			}
		}
		if n.Parent >= 0 {
			rr.Fed = fmt.Sprintf("reader %d", n.Parent)
		}
		if rr.Reparented() {
			from := b.srcs[0].ref
			if n.Parent >= 0 {
				from = b.nodes[n.Parent].ref
			}
			rr.Path = r.edgePath(from, n.ref)
		}
		if n.State == bcast.Pending {
			rr.Err = fmt.Errorf("rdt: reader %d did not complete: %w", i, context.Cause(ctx))
		}
		res.Readers = append(res.Readers, rr)
		observed[i](Transfer{Stats: fabric.Stats{Transport: b.plan.Nodes[i].Path, Bytes: b.total, Duration: res.Duration}}, rr.Err)
	}
	r.bcastMetrics(res)
	return res, itemErrs, nil
}

// pinSource opens an object this runtime owns for a broadcast.
func (r *Runtime) pinSource(ctx context.Context, src Ref) (bcastSrc, error) {
	if src.Owner != r.host.ID() || src.Incarnation != r.incarnation {
		return bcastSrc{}, fmt.Errorf("%w: broadcast source %v is not owned by this runtime", ErrNotOwner, src)
	}
	pin, err := r.objects.Open(ctx, fabric.Claim{Object: src.Object, Incarnation: src.Incarnation, Token: src.Token})
	if err != nil {
		return bcastSrc{}, err
	}
	start, end := src.Desc.Span()
	if end > pin.Len() {
		pin.Release()
		return bcastSrc{}, fmt.Errorf("%w: object of %d bytes, ref spans %d", tensor.ErrTooSmall, pin.Len(), end)
	}
	return bcastSrc{ref: src, pin: pin, start: start, total: end - start}, nil
}

// run drives one broadcast to its end.
func (b *bcastRun) run(ctx context.Context) {
	r := b.r
	ectx, ecancel := context.WithCancelCause(ctx)
	defer func() {
		ecancel(nil)
		b.edges.Wait()
		b.abortPending()
	}()

	// 1. Prepare every slot (one round trip per reader, concurrently).
	b.parallel(func(i int, n *bnode) {
		n.err = b.prepare(ectx, n)
		if n.err != nil {
			n.State = bcast.Failed
		}
	})
	// 2. Plan the tree among the readers that are ready.
	var live []int
	var liveRefs []Ref
	for i, n := range b.nodes {
		if n.State == bcast.Pending {
			live = append(live, i)
			liveRefs = append(liveRefs, n.ref)
		}
	}
	sub := r.planBroadcast(b.srcs[0].ref, liveRefs)
	b.plan = BroadcastPlan{Owner: sub.Owner, Nodes: make([]PlanNode, len(b.nodes))}
	for i := range b.nodes {
		b.plan.Nodes[i] = PlanNode{Endpoint: b.nodes[i].ref.Host + "/" + b.nodes[i].ref.Device.String(), Parent: -1, Path: "none (not ready)"}
	}
	for k, i := range live {
		pn := sub.Nodes[k]
		if pn.Parent >= 0 {
			pn.Parent = live[pn.Parent]
		}
		b.plan.Nodes[i] = pn
		b.tree.Plant(i, pn.Parent)
	}
	// 3. Tell the forwarding readers their children.
	b.parallel(func(i int, n *bnode) {
		if n.State != bcast.Pending || len(n.Children) == 0 {
			return
		}
		for _, m := range b.childrenMsgs(n, n.Children) {
			if err := r.sendBcast(ectx, n.ref.Owner, m); err != nil {
				b.post(bcastEvent{node: i, kind: evEdgeFailed, err: err})
				return
			}
		}
	})
	// Readers are watched: a dead one is routed around.
	watched := map[peer.ID]bool{}
	for i, n := range b.nodes {
		if n.State != bcast.Pending || n.ref.Owner == r.host.ID() || watched[n.ref.Owner] {
			continue
		}
		watched[n.ref.Owner] = true
		unuse := r.peers.use(n.ref.Owner)
		death := r.peers.deathOf(n.ref.Owner, n.ref.Incarnation)
		b.edges.Add(1)
		go func(id peer.ID, i int) {
			defer b.edges.Done()
			defer unuse()
			select {
			case <-death:
				for j, m := range b.nodes {
					if m.ref.Owner == id {
						b.post(bcastEvent{node: j, kind: evDied, err: fmt.Errorf("%w: %s", ErrReaderDied, shortID(id))})
					}
				}
			case <-ectx.Done():
			}
		}(n.ref.Owner, i)
	}
	// 4. Feed the owner's children.
	for i, n := range b.nodes {
		if n.State == bcast.Pending && n.Parent == -1 {
			b.feed(ectx, i, false)
		}
	}
	// 5. Follow reports until every reader is done or failed.
	for {
		for _, ev := range b.take() {
			b.handle(ectx, ev)
		}
		if b.tree.Finished() {
			return
		}
		select {
		case <-b.kick:
		case <-ctx.Done():
			for _, ev := range b.take() {
				b.handle(ectx, ev)
			}
			return
		}
	}
}

func (b *bcastRun) parallel(f func(i int, n *bnode)) {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i, n)
		}()
	}
	wg.Wait()
}

// childrenMsgs tells reader n to forward to children: one notice for all
// of them, or, in a batch, one per child with its slot per object.
func (b *bcastRun) childrenMsgs(n *bnode, children []int) []bcastMsg {
	m := bcastMsg{Kind: ctlwire.Children, ID: b.id, Slot: n.ref.Object, Inc: n.ref.Incarnation, Token: n.ref.Token}
	if len(b.srcs) == 1 {
		for _, c := range children {
			m.Children = append(m.Children, b.nodes[c].ref)
		}
		return []bcastMsg{m}
	}
	var out []bcastMsg
	for _, c := range children {
		cm := m
		cn := b.nodes[c]
		cm.Children = []Ref{cn.ref}
		for k, it := range cn.items {
			cm.Items = append(cm.Items, bcast.Item{Slot: it.Object, Token: it.Token, DType: b.srcs[k].ref.Desc.DType})
		}
		out = append(out, cm)
	}
	return out
}

// prepare readies a reader's slot, waiting up to BusyWait for a
// flow-controlled one whose reader is still consuming.
func (b *bcastRun) prepare(ctx context.Context, n *bnode) error {
	r := b.r
	if n.ref.Owner != r.host.ID() {
		r.learnAddrs(n.ref)
	}
	msg := bcastMsg{Kind: ctlwire.Prepare, ID: b.id, Slot: n.ref.Object, Inc: n.ref.Incarnation, Token: n.ref.Token,
		N: b.srcs[0].total, Off: b.cfg.ChunkSize, Gen: uint64(b.cfg.Window), OriginInc: r.incarnation}
	for k, it := range n.items {
		if err := it.Desc.Validate(); err != nil {
			return fmt.Errorf("%w: slot %d: %v", ErrMalformedRef, k, err)
		}
		if spanBytes(it.Desc) != b.srcs[k].total {
			return fmt.Errorf("%w: slot %d of %d bytes for an object of %d", tensor.ErrTooSmall, k, spanBytes(it.Desc), b.srcs[k].total)
		}
		// The reader's slots are written as one stream to one runtime,
		// addressed as its first slot is.
		if it.Owner != n.ref.Owner || it.Incarnation != n.ref.Incarnation || it.Host != n.ref.Host || it.Device != n.ref.Device {
			return fmt.Errorf("%w: slot %d is on %s/%s, the reader's first on %s/%s (one runtime and device a reader)", ErrMalformedRef, k, it.Host, it.Device, n.ref.Host, n.ref.Device)
		}
		if len(b.srcs) > 1 {
			msg.Items = append(msg.Items, bcast.Item{Slot: it.Object, Token: it.Token, N: b.srcs[k].total})
		}
	}
	wait := time.NewTimer(b.cfg.BusyWait)
	defer wait.Stop()
	for {
		_, changed := r.gens.state(genKey{n.ref.Owner, n.ref.Object})
		err := r.sendBcast(ctx, n.ref.Owner, msg)
		if !errors.Is(err, ErrSlotBusy) {
			return err
		}
		select {
		case <-changed: // a reader said Done: try again
		case <-wait.C:
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// feed makes the owner write every chunk of every object to reader i,
// Window chunks in flight; a re-parented reader is asked before each
// chunk whether it lacks it (probe).
func (b *bcastRun) feed(ctx context.Context, i int, probe bool) {
	n := b.nodes[i]
	b.tree.Feed(i)
	b.edges.Add(1)
	go func() {
		defer b.edges.Done()
		w := bcast.NewWindow(ctx, b.cfg.Window)
	objects:
		for k, src := range b.srcs {
			ep := b.r.endpoint(src.ref.Device)
			for off := int64(0); off < src.total || off == 0; off += b.cfg.ChunkSize {
				off, m := off, min(b.cfg.ChunkSize, src.total-off)
				started := w.Send(func(ctx context.Context) error {
					if err := b.r.writeChunk(ctx, b.id, &objstore.Window{Buffer: src.pin, Off: src.start + off, N: m}, ep, n.items[k], off, m, probe); err != nil {
						return err
					}
					b.done.Add(m)
					return nil
				})
				if !started {
					break objects
				}
				if src.total == 0 {
					break
				}
			}
		}
		if _, err := w.Wait(); err != nil && ctx.Err() == nil {
			b.post(bcastEvent{node: i, kind: evEdgeFailed, err: err})
		}
	}()
}

// handle applies one event: completions, failed forwards and failed or
// dead readers (their orphans are re-parented), refused re-parents.
func (b *bcastRun) handle(ctx context.Context, ev bcastEvent) {
	n := b.nodes[ev.node]
	switch {
	case ev.kind == ctlwire.Report && ev.failed < 0:
		if n.State == bcast.Pending {
			n.State, n.gen, n.gens = bcast.Complete, ev.gen, ev.gens
			if !n.Direct {
				b.done.Add(b.total)
			}
		}
	case ev.kind == ctlwire.Report: // reader ev.node could not feed its child
		if b.tree.Orphaned(ev.failed, ev.node) {
			b.r.log.Info("broadcast routes around a failed forward", "reader", ev.failed, "from", ev.node, "err", ev.err)
			b.reparent(ctx, ev.failed, ev.node)
		}
	case ev.kind == evRefused: // ev.failed did not take orphan ev.node
		if b.tree.Orphaned(ev.node, ev.failed) {
			b.r.log.Info("broadcast re-parent refused", "reader", ev.node, "by", ev.failed, "err", ev.err)
			b.reparent(ctx, ev.node, ev.failed)
		}
	default: // the owner's edge to it failed, or it died
		if n.State != bcast.Pending {
			return
		}
		failed := []int{ev.node}
		// A reader whose runtime refuses the push because it is shutting
		// down has left, whether or not its death notice came first.
		if ev.kind == evEdgeFailed && errors.Is(ev.err, fabric.ErrOwnerClosed) && !b.r.isClosed() {
			ev.kind, ev.err = evDied, fmt.Errorf("%w: %s is shutting down: %w", ErrReaderDied, shortID(n.ref.Owner), ev.err)
		}
		if ev.kind == evDied {
			b.r.gens.forget(n.ref.Owner)
			// Every reader of the dead runtime fails before any orphan is
			// placed, so none is placed under a dead reader.
			for j, m := range b.nodes {
				if j != ev.node && m.State == bcast.Pending && m.ref.Owner == n.ref.Owner {
					m.State, m.err = bcast.Failed, ev.err
					failed = append(failed, j)
				}
			}
		}
		n.State, n.err = bcast.Failed, ev.err
		for _, f := range failed {
			for _, c := range b.nodes[f].Children {
				if b.tree.Orphaned(c, f) {
					b.reparent(ctx, c, f)
				}
			}
		}
	}
}

// reparent finds orphan c (whose feeder from failed it) a new feeder: the
// nearest live planned ancestor of from, which has the chunks or is getting them
// and forwards what it has at once (its relay stays open until the
// broadcast ends), else the owner. Its own subtree follows it unchanged:
// the new feeder asks before each chunk whether the orphan lacks it (a
// probe notice, overlapped by the window), so the chunks it already had
// cross neither the new edge nor, being no news to it, its subtree.
func (b *bcastRun) reparent(ctx context.Context, c, from int) {
	b.r.bmet.Reroutes.Inc()
	p := b.tree.Reparent(c, from)
	if p < 0 {
		b.r.log.Info("broadcast re-parents an orphan to the owner", "reader", c, "was", from)
		b.feed(ctx, c, true)
		return
	}
	pn := b.nodes[p]
	b.r.log.Info("broadcast re-parents an orphan", "reader", c, "was", from, "now", p)
	b.edges.Add(1)
	go func() {
		defer b.edges.Done()
		m := b.childrenMsgs(pn, []int{c})[0]
		m.Gen = 1 // re-parented: its new feeder asks before each chunk
		err := b.r.sendBcast(ctx, pn.ref.Owner, m)
		if err != nil && ctx.Err() == nil {
			b.post(bcastEvent{node: c, kind: evRefused, failed: p, err: err})
		}
	}()
}

// abortPending tells readers still waiting that the broadcast is over, so
// their slots are released now rather than at their timeout, and readers
// that forward that their relays may close.
func (b *bcastRun) abortPending() {
	if b.r.isClosed() {
		return
	}
	var wg sync.WaitGroup
	for _, n := range b.nodes {
		text := "the owner gave up"
		switch {
		case n.State == bcast.Complete && len(n.Children) > 0:
			text = "over" // it forwards: its relay stays open for orphans until now
		case n.State == bcast.Complete || isReaderGone(n.err):
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), b.r.cfg.HeartbeatInterval)
			defer cancel()
			b.r.sendBcast(ctx, n.ref.Owner, bcastMsg{Kind: ctlwire.Abort, ID: b.id, Slot: n.ref.Object, Inc: n.ref.Incarnation, Token: n.ref.Token, Text: text})
		}()
	}
	wg.Wait()
}

func isReaderGone(err error) bool {
	return err != nil && (errors.Is(err, ErrReaderDied) || errors.Is(err, ErrObjectNotFound) || errors.Is(err, ErrStaleRef))
}

// Progress of a broadcast: bytes delivered so far (each reader's bytes
// counted as the owner writes them, or when it completes when another
// reader fed it) out of size × readers.
func (b *bcastRun) progress() (done, total int64) {
	return b.done.Load(), b.total * int64(len(b.nodes))
}
