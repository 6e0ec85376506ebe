package rdt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Broadcast publishes one object to many readers' slots at once (RL weight
// sync: a trainer, a fleet of inference workers). The bytes flow along a
// tree the owner plans from the topology: the owner feeds one reader per
// host (the host's leader) along a chain of hosts, nearest first (same
// NVLink domain, then same rack), and each leader feeds the other readers
// of its host (shm/p2p) in a chain. The object moves in chunks, and a reader
// forwards each chunk as soon as it has it (bcastrun.Relays), so the chain is
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

// planBroadcast is the tree a broadcast of src to slots would follow
// (bcastrun.Owner.Plan).
func (r *Runtime) planBroadcast(src Ref, slots []Ref) BroadcastPlan {
	return r.bcast.Plan(refwire.Ref(src), wireRefs(slots))
}

// wireRefs converts refs to the engines' form (the same fields).
func wireRefs(refs []Ref) []refwire.Ref {
	out := make([]refwire.Ref, len(refs))
	for i, r := range refs {
		out[i] = refwire.Ref(r)
	}
	return out
}

// apiRefs converts refs back.
func apiRefs(refs []refwire.Ref) []Ref {
	if refs == nil {
		return nil
	}
	out := make([]Ref, len(refs))
	for i, r := range refs {
		out[i] = Ref(r)
	}
	return out
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

func (a *Actor) broadcast(ctx context.Context, src Ref, slots []Ref, cfg BroadcastConfig, progress func(*bcastrun.Run)) (*BroadcastResult, error) {
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
// being reader j's slot for srcs[k], along one tree (bcastrun.Owner). An
// object that cannot be sent (not owned, freed) is left out, its error in
// itemErrs; err is non-nil when nothing could start.
func (a *Actor) broadcastSet(ctx context.Context, srcs []Ref, readers [][]Ref, cfg BroadcastConfig, progress func(*bcastrun.Run)) (*BroadcastResult, []error, error) {
	r := a.rt
	if r.isClosed() {
		return nil, nil, ErrClosed
	}
	ctx, cancel := r.bounded(ctx) // and Shutdown ends it (bcastrun.Owner.Broadcast)
	defer cancel()
	wr := make([][]refwire.Ref, len(readers))
	for j, rs := range readers {
		wr[j] = wireRefs(rs)
	}
	// Each reader is a live transfer to observers (the dashboard) while
	// the broadcast runs.
	var observed []func(fabric.Plan, fabric.Stats, error)
	out, err := r.bcast.Broadcast(ctx, wireRefs(srcs), wr, cfg, func(b *bcastrun.Run) {
		for _, n := range b.Readers() {
			observed = append(observed, r.observeRead(a.name+" (broadcast)", Ref(b.Source()), fabric.Endpoint{Host: n.Host, Device: n.Device}))
		}
		if progress != nil {
			progress(b)
		}
	})
	if err != nil {
		var items []error
		if out != nil {
			items = out.Items
		}
		return nil, items, err
	}
	res := &BroadcastResult{Bytes: out.Bytes, Duration: out.Duration, Plan: out.Plan, rt: r}
	for i, n := range out.Readers {
		rr := ReaderResult{Slot: Ref(n.Slot), Parent: n.Parent, FedBy: n.FedBy, Fed: n.Fed, Path: n.Path, Generation: n.Generation, Err: n.Err,
			Slots: apiRefs(n.Slots), Generations: n.Generations}
		res.Readers = append(res.Readers, rr)
		observed[i](fabric.Plan{}, fabric.Stats{Transport: out.Plan.Nodes[i].Path, Bytes: out.Bytes, Duration: res.Duration}, rr.Err)
	}
	r.bcastMetrics(res)
	return res, out.Items, nil
}
