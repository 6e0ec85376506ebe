package rdt

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
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
// around: the owner feeds the orphans itself. The result says, per reader,
// whether it has the data, the generation it holds, and otherwise why not.

// BroadcastConfig tunes a broadcast; the zero value means the defaults.
type BroadcastConfig struct {
	// ChunkSize is the pipelining unit. Default 4 MiB; at least 64 KiB
	// (each chunk costs a notice round trip per edge).
	ChunkSize int64
	// BusyWait is how long a flow-controlled slot whose reader has not said
	// Done with its generation is waited for before it is skipped with
	// ErrSlotBusy. Default 10 s.
	BusyWait time.Duration
}

func (c BroadcastConfig) withDefaults() BroadcastConfig {
	if c.ChunkSize <= 0 {
		c.ChunkSize = 4 << 20
	}
	if c.BusyWait <= 0 {
		c.BusyWait = 10 * time.Second
	}
	return c
}

// ReaderResult is one reader's outcome of a broadcast.
type ReaderResult struct {
	Slot       Ref
	Parent     int    // index of the reader it was fed by at first, -1 for the owner
	Fed        string // who fed it in the end: "owner" or "reader N"
	Generation uint64 // the slot's generation now holding the data (0 if Err)
	Err        error  // nil: the slot holds the whole object, verified by its transports
}

// BroadcastResult is a broadcast's outcome, reader by reader.
type BroadcastResult struct {
	Readers  []ReaderResult
	Bytes    int64
	Duration time.Duration
	Plan     BroadcastPlan

	rt *Runtime
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.WaitConsumed(ctx, r.Slot, r.Generation); err != nil {
				errs[i] = fmt.Errorf("reader %d (%s): %w", i, r.Slot.Host, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// BroadcastPlan is the tree a broadcast follows.
type BroadcastPlan struct {
	Owner string // the owner's endpoint
	Nodes []PlanNode
}

// PlanNode is one reader in the tree.
type PlanNode struct {
	Endpoint string // host/device of the slot
	Parent   int    // -1: the owner
	Path     string // the transport from its parent
	Leader   bool   // the first reader of its host, fed across hosts
}

// String draws the tree, one reader a line, children indented under their
// parent.
func (p BroadcastPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "owner %s\n", p.Owner)
	var walk func(parent, depth int)
	walk = func(parent, depth int) {
		for i, n := range p.Nodes {
			if n.Parent != parent {
				continue
			}
			role := ""
			if n.Leader {
				role = " (host leader)"
			}
			fmt.Fprintf(&b, "%s└─ reader %d %s via %s%s\n", strings.Repeat("   ", depth), i, n.Endpoint, n.Path, role)
			walk(i, depth+1)
		}
	}
	walk(-1, 0)
	return b.String()
}

// ExplainBroadcast says which tree a broadcast of src to slots would
// follow and which path each edge would take.
func (a *Actor) ExplainBroadcast(src Ref, slots []Ref) BroadcastPlan {
	return a.rt.planBroadcast(src, slots)
}

// planBroadcast orders the readers: hosts nearest the owner first, one
// leader per host fed along the chain of hosts, the others chained behind
// their leader.
func (r *Runtime) planBroadcast(src Ref, slots []Ref) BroadcastPlan {
	plan := BroadcastPlan{Owner: src.Host + "/" + src.Device.String(), Nodes: make([]PlanNode, len(slots))}
	byHost := map[string][]int{}
	var hosts []string
	for i, s := range slots {
		if _, ok := byHost[s.Host]; !ok {
			hosts = append(hosts, s.Host)
		}
		byHost[s.Host] = append(byHost[s.Host], i)
	}
	rank := func(h string) int {
		if h == src.Host {
			return 0
		}
		return 1 + r.hostDistance(src.Host, h)
	}
	sort.SliceStable(hosts, func(i, j int) bool {
		ri, rj := rank(hosts[i]), rank(hosts[j])
		if ri != rj {
			return ri < rj
		}
		return hosts[i] < hosts[j]
	})
	prevLeader := -1
	for _, h := range hosts {
		members := byHost[h]
		// Within a host, a reader on the owner's own device, then by device.
		sort.SliceStable(members, func(i, j int) bool {
			return slots[members[i]].Device.String() < slots[members[j]].Device.String()
		})
		from := prevLeader
		for k, m := range members {
			plan.Nodes[m] = PlanNode{Endpoint: h + "/" + slots[m].Device.String(), Parent: from, Leader: k == 0}
			if k == 0 && h != src.Host {
				prevLeader = m
			}
			from = m
		}
		if h == src.Host {
			plan.Nodes[members[0]].Leader = false
		}
	}
	for i := range plan.Nodes {
		n := &plan.Nodes[i]
		parentEp := r.remoteFor(src).Endpoint
		if n.Parent >= 0 {
			parentEp = r.remoteFor(slots[n.Parent]).Endpoint
		}
		child := r.remoteFor(slots[i])
		if parentEp.Process == child.Endpoint.Process {
			// Both in one other runtime: ask as that runtime would (the
			// local transports serve only their own runtime's pairs).
			parentEp.Process, child.Endpoint.Process = r.process, r.process
		}
		n.Path = r.planner.PlanWrite(parentEp, child).Chosen // what the relay's push runs
		if n.Path == "" {
			n.Path = "none"
		}
	}
	return plan
}

// hostDistance ranks how far host b is from a: 0 in one NVLink domain,
// 1 in one rack, 2 otherwise.
func (r *Runtime) hostDistance(a, b string) int {
	ha, ok1 := r.cfg.Cluster.Host(a)
	hb, ok2 := r.cfg.Cluster.Host(b)
	if !ok1 || !ok2 {
		return 3
	}
	same := func(k string) bool { v := ha.Labels[k]; return v != "" && v == hb.Labels[k] }
	switch {
	case same(topology.LabelNVLinkDomain):
		return 0
	case same(topology.LabelRack):
		return 1
	}
	return 2
}

// minChunk is the smallest ChunkSize a broadcast accepts.
const minChunk = 64 << 10

// bcastState is the owner's table of broadcasts in flight, for reports.
type bcastState struct {
	mu   sync.Mutex
	runs map[bcastID]*bcastRun
}

// Node states.
const (
	nodePending = iota
	nodeComplete
	nodeFailed
)

type bnode struct {
	ref      Ref
	parent   int // current feeder: -1 the owner
	first    int // the parent planned at first
	children []int
	state    int
	gen      uint64
	err      error
	direct   bool // the owner feeds it now
}

type bcastEvent struct {
	node   int
	kind   byte // noteReport: gen/failedChild; 0: owner edge failed; 1: node died
	failed int  // child that failed, -1 when the node completed
	gen    uint64
	err    error
	from   peer.ID
}

type bcastRun struct {
	r      *Runtime
	id     bcastID
	src    Ref
	cfg    BroadcastConfig
	pin    tensor.Buffer
	start  int64 // the object's first byte in its buffer
	total  int64
	nodes  []*bnode
	plan   BroadcastPlan
	bySlot map[fabric.ObjectID]int

	mu     sync.Mutex
	events []bcastEvent
	kick   chan struct{}

	done  atomic.Int64 // bytes delivered, for progress
	edges sync.WaitGroup
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
	b, ok := r.bcasts.runs[m.id]
	r.bcasts.mu.Unlock()
	if !ok {
		return nil // over already
	}
	i, ok := b.bySlot[m.slot]
	if !ok || b.nodes[i].ref.Owner != from {
		return fmt.Errorf("%w: report for a slot of another runtime", ErrUnauthorized)
	}
	ev := bcastEvent{node: i, kind: noteReport, failed: -1, gen: m.gen, from: from}
	if m.failed != (fabric.ObjectID{}) {
		c, ok := b.bySlot[m.failed]
		if !ok {
			return fmt.Errorf("%w: report names an unknown child", ErrMalformedRef)
		}
		ev.failed, ev.err = c, fmt.Errorf("forwarded by reader %d: %s", i, m.text)
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
	r := a.rt
	if r.isClosed() {
		return nil, ErrClosed
	}
	if src.Owner != r.host.ID() || src.Incarnation != r.incarnation {
		return nil, fmt.Errorf("%w: broadcast source %v is not owned by this runtime", ErrNotOwner, src)
	}
	if len(slots) == 0 {
		return nil, fmt.Errorf("%w: broadcast to no readers", ErrMalformedRef)
	}
	cfg = cfg.withDefaults()
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
	pin, err := r.objects.Open(ctx, fabric.Claim{Object: src.Object, Incarnation: src.Incarnation, Token: src.Token})
	if err != nil {
		return nil, err
	}
	defer pin.Release()
	start, end := src.Desc.Span()
	if end > pin.Len() {
		return nil, fmt.Errorf("%w: object of %d bytes, ref spans %d", tensor.ErrTooSmall, pin.Len(), end)
	}
	if cfg.ChunkSize < minChunk || (end-start+cfg.ChunkSize-1)/cfg.ChunkSize > maxChunks {
		return nil, fmt.Errorf("%w: chunks of %d bytes for %d (at least %d, at most %d chunks)", ErrMalformedRef, cfg.ChunkSize, end-start, minChunk, maxChunks)
	}
	b := &bcastRun{r: r, src: src, cfg: cfg, pin: pin, start: start, total: end - start, kick: make(chan struct{}, 1),
		bySlot: map[fabric.ObjectID]int{}}
	rand.Read(b.id[:])
	for i, s := range slots {
		if _, dup := b.bySlot[s.Object]; dup {
			return nil, fmt.Errorf("%w: slot %v given twice", ErrMalformedRef, s.Object)
		}
		b.bySlot[s.Object] = i
		b.nodes = append(b.nodes, &bnode{ref: s, parent: -1, first: -1})
	}
	if progress != nil {
		progress(b)
	}
	r.bcasts.mu.Lock()
	if r.bcasts.runs == nil {
		r.bcasts.runs = map[bcastID]*bcastRun{}
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
		observed[i] = r.obs.begin(a.name+" (broadcast)", src, fabric.Endpoint{Host: n.ref.Host, Device: n.ref.Device})
	}
	began := time.Now()
	b.run(ctx)
	res := &BroadcastResult{Bytes: b.total, Duration: time.Since(began), Plan: b.plan, rt: r}
	for i, n := range b.nodes {
		rr := ReaderResult{Slot: n.ref, Parent: n.first, Generation: n.gen, Err: n.err, Fed: "owner"}
		if n.parent >= 0 {
			rr.Fed = fmt.Sprintf("reader %d", n.parent)
		}
		if n.state == nodePending {
			rr.Err = fmt.Errorf("rdt: reader %d did not complete: %w", i, context.Cause(ctx))
		}
		res.Readers = append(res.Readers, rr)
		observed[i](Transfer{Stats: fabric.Stats{Transport: b.plan.Nodes[i].Path, Bytes: b.total, Duration: res.Duration}}, rr.Err)
	}
	r.bcastMetrics(res)
	return res, nil
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
			n.state = nodeFailed
		}
	})
	// 2. Plan the tree among the readers that are ready.
	var live []int
	var liveRefs []Ref
	for i, n := range b.nodes {
		if n.state == nodePending {
			live = append(live, i)
			liveRefs = append(liveRefs, n.ref)
		}
	}
	sub := r.planBroadcast(b.src, liveRefs)
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
		b.nodes[i].parent, b.nodes[i].first = pn.Parent, pn.Parent
		if pn.Parent >= 0 {
			b.nodes[pn.Parent].children = append(b.nodes[pn.Parent].children, i)
		}
	}
	// 3. Tell the forwarding readers their children.
	b.parallel(func(i int, n *bnode) {
		if n.state != nodePending || len(n.children) == 0 {
			return
		}
		refs := make([]Ref, len(n.children))
		for k, c := range n.children {
			refs[k] = b.nodes[c].ref
		}
		if err := r.sendBcast(ectx, n.ref.Owner, bcastMsg{kind: noteChildren, id: b.id, slot: n.ref.Object, inc: n.ref.Incarnation, token: n.ref.Token, children: refs}); err != nil {
			b.post(bcastEvent{node: i, kind: 0, err: err})
		}
	})
	// Readers are watched: a dead one is routed around.
	watched := map[peer.ID]bool{}
	for i, n := range b.nodes {
		if n.state != nodePending || n.ref.Owner == r.host.ID() || watched[n.ref.Owner] {
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
						b.post(bcastEvent{node: j, kind: 1, err: fmt.Errorf("%w: %s", ErrReaderDied, shortID(id))})
					}
				}
			case <-ectx.Done():
			}
		}(n.ref.Owner, i)
	}
	// 4. Feed the owner's children.
	for i, n := range b.nodes {
		if n.state == nodePending && n.parent == -1 {
			b.feed(ectx, i)
		}
	}
	// 5. Follow reports until every reader is done or failed.
	for {
		for _, ev := range b.take() {
			b.handle(ectx, ev)
		}
		if b.finished() {
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

// prepare readies a reader's slot, waiting up to BusyWait for a
// flow-controlled one whose reader is still consuming.
func (b *bcastRun) prepare(ctx context.Context, n *bnode) error {
	r := b.r
	if n.ref.Owner != r.host.ID() {
		r.learnAddrs(n.ref)
	}
	if err := n.ref.Desc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	if spanBytes(n.ref.Desc) != b.total {
		return fmt.Errorf("%w: slot of %d bytes for an object of %d", tensor.ErrTooSmall, spanBytes(n.ref.Desc), b.total)
	}
	wait := time.NewTimer(b.cfg.BusyWait)
	defer wait.Stop()
	for {
		_, changed := r.gens.state(genKey{n.ref.Owner, n.ref.Object})
		err := r.sendBcast(ctx, n.ref.Owner, bcastMsg{kind: notePrepare, id: b.id, slot: n.ref.Object, inc: n.ref.Incarnation, token: n.ref.Token,
			n: b.total, off: b.cfg.ChunkSize, originInc: r.incarnation})
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

// feed makes the owner write every chunk to reader i.
func (b *bcastRun) feed(ctx context.Context, i int) {
	n := b.nodes[i]
	n.parent, n.direct = -1, true
	b.edges.Add(1)
	go func() {
		defer b.edges.Done()
		src := b.r.endpoint(b.src.Device)
		for off := int64(0); off < b.total || off == 0; off += b.cfg.ChunkSize {
			m := min(b.cfg.ChunkSize, b.total-off)
			if err := b.r.writeChunk(ctx, b.id, &window{Buffer: b.pin, off: b.start + off, n: m}, src, n.ref, off, m); err != nil {
				if ctx.Err() == nil {
					b.post(bcastEvent{node: i, kind: 0, err: err})
				}
				return
			}
			b.done.Add(m)
			if b.total == 0 {
				return
			}
		}
	}()
}

// handle applies one event: completions, failed forwards (the owner feeds
// the child itself), failed owner edges and deaths (the reader failed; the
// owner feeds its pending children).
func (b *bcastRun) handle(ctx context.Context, ev bcastEvent) {
	n := b.nodes[ev.node]
	switch {
	case ev.kind == noteReport && ev.failed < 0:
		if n.state == nodePending {
			n.state, n.gen = nodeComplete, ev.gen
			if !n.direct {
				b.done.Add(b.total)
			}
		}
	case ev.kind == noteReport:
		c := b.nodes[ev.failed]
		if c.state == nodePending && !c.direct && c.parent == ev.node {
			b.r.log.Info("broadcast routes around a failed forward", "reader", ev.failed, "from", ev.node, "err", ev.err)
			b.r.bmet.reroutes.Inc()
			b.feed(ctx, ev.failed)
		}
	default: // the owner's edge to it failed, or it died
		if n.state != nodePending {
			return
		}
		n.state, n.err = nodeFailed, ev.err
		if ev.kind == 1 {
			b.r.gens.forget(n.ref.Owner)
		}
		for _, c := range n.children {
			if cn := b.nodes[c]; cn.state == nodePending && !cn.direct {
				b.r.bmet.reroutes.Inc()
				b.feed(ctx, c)
			}
		}
		// A reader that fed it may no longer need it; nothing to undo.
	}
}

func (b *bcastRun) finished() bool {
	for _, n := range b.nodes {
		if n.state == nodePending {
			return false
		}
	}
	return true
}

// abortPending tells readers still waiting that the broadcast is over, so
// their slots are released now rather than at their timeout.
func (b *bcastRun) abortPending() {
	if b.r.isClosed() {
		return
	}
	var wg sync.WaitGroup
	for _, n := range b.nodes {
		if n.state == nodeComplete || isReaderGone(n.err) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), b.r.cfg.HeartbeatInterval)
			defer cancel()
			b.r.sendBcast(ctx, n.ref.Owner, bcastMsg{kind: noteAbort, id: b.id, slot: n.ref.Object, inc: n.ref.Incarnation, token: n.ref.Token, text: "the owner gave up"})
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
