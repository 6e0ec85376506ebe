package bcastrun

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/tensorlane/tensorlane/topology"
)

// Deps is what an Owner is built from.
type Deps struct {
	Env     Env
	Cluster *topology.Cluster // the tree is planned on it
	Objects *objstore.Table   // the sources are pinned in it
	Metrics *bcast.Metrics
	Log     *slog.Logger
	// AbortWait bounds each notice telling a reader the broadcast is over.
	AbortWait time.Duration
}

// Owner is a runtime's side of the broadcasts it owns: the ones in flight
// (for readers' reports) and the generations its readers are done with.
type Owner struct {
	d    Deps
	Gens Gens

	mu   sync.Mutex
	runs map[bcast.ID]*Run
}

// NewOwner returns an Owner with no broadcast in flight.
func NewOwner(d Deps) *Owner { return &Owner{d: d, runs: map[bcast.ID]*Run{}} }

// Metrics are the broadcast metrics the runtime registered.
func (o *Owner) Metrics() *bcast.Metrics { return o.d.Metrics }

// Plan is bcast.PlanTree over the slots' endpoints, each edge's path what
// the relay's write would run.
func (o *Owner) Plan(src Ref, slots []Ref) bcast.Plan {
	eps := make([]fabric.Endpoint, len(slots))
	for i, s := range slots {
		eps[i] = fabric.Endpoint{Host: s.Host, Device: s.Device}
	}
	return bcast.PlanTree(o.d.Cluster, fabric.Endpoint{Host: src.Host, Device: src.Device}, eps, func(parent, child int) string {
		from := src
		if parent >= 0 {
			from = slots[parent]
		}
		return o.d.Env.EdgePath(from, slots[child])
	})
}

// Reader is one reader's outcome of a broadcast (rdt.ReaderResult's
// fields, which it becomes).
type Reader struct {
	Slot        Ref
	Parent      int
	FedBy       int
	Fed         string
	Path        string
	Generation  uint64
	Err         error
	Slots       []Ref
	Generations []uint64
}

// Reparented says whether the reader was fed by another node than planned.
func (r Reader) Reparented() bool { return r.FedBy != r.Parent }

// Outcome is a broadcast's result: per reader, and per object (Items: nil
// when the object was sent, else why it was left out).
type Outcome struct {
	Readers  []Reader
	Bytes    int64 // per reader
	Duration time.Duration
	Plan     bcast.Plan
	Items    []error
}

// node is one reader of a broadcast: its place in the tree (bcast.Reader,
// decided by Run.tree), its slots and its outcome.
type node struct {
	bcast.Reader
	ref   Ref   // its first slot: the reader's name in notices and reports
	items []Ref // its slot per object (one, or one per object of a batch)
	gens  []uint64
	gen   uint64
	err   error
}

type event struct {
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

// Run is one broadcast in flight.
type Run struct {
	o      *Owner
	env    Env
	id     bcast.ID
	srcs   []source
	cfg    bcast.Config
	total  int64 // bytes per reader: every object's
	nodes  []*node
	tree   bcast.Tree // the nodes' places, in order
	plan   bcast.Plan
	bySlot map[fabric.ObjectID]int

	mu     sync.Mutex
	events []event
	kick   chan struct{}

	done  atomic.Int64 // bytes delivered, for progress
	edges sync.WaitGroup
}

// source is one object a broadcast sends, pinned for the broadcast.
type source struct {
	ref   Ref
	pin   tensor.Buffer
	start int64 // the object's first byte in its buffer
	total int64
}

func (b *Run) post(ev event) {
	b.mu.Lock()
	b.events = append(b.events, ev)
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

func (b *Run) take() []event {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev := b.events
	b.events = nil
	return ev
}

// Source is the (first) object the broadcast sends.
func (b *Run) Source() Ref { return b.srcs[0].ref }

// Readers are the readers' first slots, in order.
func (b *Run) Readers() []Ref {
	out := make([]Ref, len(b.nodes))
	for i, n := range b.nodes {
		out[i] = n.ref
	}
	return out
}

// Progress of a broadcast: bytes delivered so far (each reader's bytes
// counted as the owner writes them, or when it completes when another
// reader fed it) out of size × readers.
func (b *Run) Progress() (done, total int64) {
	return b.done.Load(), b.total * int64(len(b.nodes))
}

// Report takes a reader's report to a broadcast this runtime owns.
func (o *Owner) Report(from peer.ID, m Msg) error {
	o.mu.Lock()
	b, ok := o.runs[m.ID]
	o.mu.Unlock()
	if !ok {
		return nil // over already
	}
	i, ok := b.bySlot[m.Slot]
	if !ok || b.nodes[i].ref.Owner != from {
		return fmt.Errorf("%w: report for a slot of another runtime", errs.Unauthorized)
	}
	ev := event{node: i, kind: ctlwire.Report, failed: -1, gen: m.Gen, gens: m.Gens, from: from}
	if m.Failed != (fabric.ObjectID{}) {
		c, ok := b.bySlot[m.Failed]
		if !ok {
			return fmt.Errorf("%w: report names an unknown child", errs.MalformedRef)
		}
		ev.failed, ev.err = c, fmt.Errorf("forwarded by reader %d: %s", i, m.Text)
	}
	b.post(ev)
	return nil
}

// Broadcast sends every object of srcs to every reader, readers[j][k]
// being reader j's slot for srcs[k], along one tree. An object that cannot
// be sent (not owned, freed) is left out, its error in the outcome's
// Items; err is non-nil when nothing could start. started, if not nil,
// sees the run once the input is checked and before anything is sent.
// ctx bounds the broadcast, and the runtime's Shutdown (Env.Done) ends
// it: a runtime that is gone tells no reader anything (they learn of its
// death as they would of a crash).
func (o *Owner) Broadcast(ctx context.Context, srcs []Ref, readers [][]Ref, cfg bcast.Config, started func(*Run)) (*Outcome, error) {
	if len(readers) == 0 {
		return nil, fmt.Errorf("%w: broadcast to no readers", errs.MalformedRef)
	}
	if len(srcs) == 0 || len(srcs) > bcast.MaxItems {
		return nil, fmt.Errorf("%w: a broadcast of %d objects (1 to %d)", errs.MalformedRef, len(srcs), bcast.MaxItems)
	}
	for j, rs := range readers {
		if len(rs) != len(srcs) {
			return nil, fmt.Errorf("%w: reader %d has %d slots for %d objects", errs.MalformedRef, j, len(rs), len(srcs))
		}
	}
	cfg = cfg.Defaults()
	if cfg.ChunkSize < bcast.MinChunk {
		return nil, fmt.Errorf("%w: chunks of %d bytes (at least %d)", errs.MalformedRef, cfg.ChunkSize, bcast.MinChunk)
	}
	if cfg.Window < 1 || cfg.Window > bcast.MaxWindow {
		return nil, fmt.Errorf("%w: a window of %d chunks per edge (1 to %d)", errs.MalformedRef, cfg.Window, bcast.MaxWindow)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-o.d.Env.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	b := &Run{o: o, env: o.d.Env, cfg: cfg, kick: make(chan struct{}, 1), bySlot: map[fabric.ObjectID]int{}}
	rand.Read(b.id[:])
	// Pin every object; one that cannot be is left out of the batch.
	itemErrs := make([]error, len(srcs))
	var valid []int
	chunks := int64(0)
	for k, src := range srcs {
		bs, err := o.pinSource(ctx, src)
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
		return &Outcome{Items: itemErrs}, errors.Join(itemErrs...)
	}
	if chunks > bcast.MaxChunks {
		return &Outcome{Items: itemErrs}, fmt.Errorf("%w: %d chunks of %d bytes (at most %d)", errs.MalformedRef, chunks, cfg.ChunkSize, bcast.MaxChunks)
	}
	seen := map[fabric.ObjectID]bool{}
	for j, rs := range readers {
		n := &node{ref: rs[0], Reader: bcast.Reader{Parent: -1, First: -1}}
		for _, k := range valid {
			n.items = append(n.items, rs[k])
		}
		n.ref = n.items[0]
		for _, it := range rs {
			if seen[it.Object] {
				return &Outcome{Items: itemErrs}, fmt.Errorf("%w: slot %v given twice", errs.MalformedRef, it.Object)
			}
			seen[it.Object] = true
		}
		b.bySlot[n.ref.Object] = j // reports name the reader's first slot
		b.nodes = append(b.nodes, n)
		b.tree.Nodes = append(b.tree.Nodes, &n.Reader)
	}
	if started != nil {
		started(b)
	}
	o.mu.Lock()
	o.runs[b.id] = b
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		delete(o.runs, b.id)
		o.mu.Unlock()
	}()
	began := time.Now()
	b.run(ctx)
	res := &Outcome{Bytes: b.total, Duration: time.Since(began), Plan: b.plan, Items: itemErrs}
	for i, n := range b.nodes {
		rr := Reader{Slot: n.ref, Parent: n.First, FedBy: n.Parent, Path: b.plan.Nodes[i].Path, Generation: n.gen, Err: n.err, Fed: "owner"}
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
			rr.Path = b.env.EdgePath(from, n.ref)
		}
		if n.State == bcast.Pending {
			rr.Err = fmt.Errorf("rdt: reader %d did not complete: %w", i, context.Cause(ctx))
		}
		res.Readers = append(res.Readers, rr)
	}
	return res, nil
}

// pinSource opens an object this runtime owns for a broadcast.
func (o *Owner) pinSource(ctx context.Context, src Ref) (source, error) {
	self, inc := o.d.Env.Self()
	if src.Owner != self || src.Incarnation != inc {
		return source{}, fmt.Errorf("%w: broadcast source %v is not owned by this runtime", errs.NotOwner, refString(src))
	}
	pin, err := o.d.Objects.Open(ctx, fabric.Claim{Object: src.Object, Incarnation: src.Incarnation, Token: src.Token})
	if err != nil {
		return source{}, err
	}
	start, end := src.Desc.Span()
	if end > pin.Len() {
		pin.Release()
		return source{}, fmt.Errorf("%w: object of %d bytes, ref spans %d", tensor.ErrTooSmall, pin.Len(), end)
	}
	return source{ref: src, pin: pin, start: start, total: end - start}, nil
}

// refString is rdt.Ref's String.
func refString(r Ref) string {
	return fmt.Sprintf("ref %s (%v on %s/%v, owner %s)", r.Object, r.Desc, r.Host, r.Device, refwire.ShortID(r.Owner))
}
