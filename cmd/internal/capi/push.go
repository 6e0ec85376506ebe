package capi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// Weight sync through the C ABI: a reader reserves slots over memory it
// already owns (its model's parameters), a trainer pushes into them one by
// one or as a batch, or broadcasts a batch (a state dict) to many readers
// along rdt's pipelined tree; the reader waits for a generation and says
// when it is done with it. Broadcasts run as asynchronous operations with
// progress, awaited, cancelled and closed by handle.
//
// Where a push lands. A slot over shareable memory of this runtime's (Alloc,
// not slab memory) is written in place by every path. Any other memory (a
// numpy array, slab memory, which is never exported writable) is written in
// place by network paths (tcp, rdma); when shm may serve the runtime, a
// same-host writer cannot map such memory, so the slot lands in a staging
// allocation of its own and SlotWait copies each new generation into the
// caller's memory. That copy happens only inside SlotWait, so the caller's
// memory never holds a half-written generation (SlotInfo.Landing says which
// mode a slot has).

// SlotGenerations makes a slot flow-controlled (rdt.WithGenerations): after
// each completed generation it refuses writes until SlotDone.
const SlotGenerations = 1 << 0

// SlotFlags are the flags Reserve knows.
const SlotFlags = SlotGenerations

// Landing modes of a slot (SlotInfo.Landing).
const (
	LandInPlace = "in place"
	LandStaged  = "staged, copied in at wait"
)

// pushState is a runtime's slots and asynchronous operations.
type pushState struct {
	mu    sync.Mutex
	next  uint64
	slots map[uint64]*slotEntry
	ops   map[uint64]*asyncOp
	stage tensor.Memory // per-allocation memfds: exportable writable, unlike slabs
}

// pushStates maps a *Runtime to its *pushState, made on first use; the
// entry goes when the runtime's rdt runtime shuts down.
var pushStates sync.Map

func (r *Runtime) pushes() *pushState {
	if v, ok := pushStates.Load(r); ok {
		return v.(*pushState)
	}
	st := &pushState{slots: map[uint64]*slotEntry{}, ops: map[uint64]*asyncOp{}}
	v, loaded := pushStates.LoadOrStore(r, st)
	if !loaded {
		// The Library closes runtimes without knowing of slots: this
		// ends with the runtime and lets go of what it holds.
		go func() {
			<-r.rt.Done()
			st.closeAll()
			pushStates.Delete(r)
		}()
	}
	return v.(*pushState)
}

func (st *pushState) closeAll() {
	st.mu.Lock()
	slots, ops := st.slots, st.ops
	st.slots, st.ops = map[uint64]*slotEntry{}, map[uint64]*asyncOp{}
	stage := st.stage
	st.mu.Unlock()
	for _, op := range ops {
		op.cancel()
		<-op.done
	}
	for _, s := range slots {
		s.slot.Close()
	}
	if c, ok := stage.(closer); ok {
		c.Close()
	}
}

// slotEntry is one reserved slot.
type slotEntry struct {
	slot    *rdt.Slot
	ref     []byte
	user    []byte // the caller's memory
	staging []byte // the slot's own memory when staged, else nil

	mu     sync.Mutex // serialises the copy in
	landed uint64     // the generation last copied into user
}

// Reserve makes a slot over the caller's region g for owners to push into
// and returns its handle and marshalled Ref (hand the Ref to the trainer).
// flags: SlotGenerations. The caller keeps g's memory alive until
// SlotClose.
func (r *Runtime) Reserve(ctx context.Context, g Region, flags uint32) (uint64, []byte, error) {
	if flags&^SlotFlags != 0 {
		return 0, nil, invalid("unknown slot flags %#x", flags&^SlotFlags)
	}
	d, err := g.desc()
	if err != nil {
		return 0, nil, err
	}
	start, end := d.Span()
	if end-start == 0 {
		return 0, nil, invalid("empty region: nothing to reserve")
	}
	user := g.Mem[start:end]
	st := r.pushes()
	var buf tensor.Buffer
	var staging []byte
	addr := uintptr(unsafe.Pointer(&user[0]))
	switch a := r.owning(addr, end-start); {
	case a != nil && !r.slabs:
		buf, err = a.shared.Window(int64(addr-a.base), end-start)
	case r.lazyStaging:
		// No same-host path will write it: network paths write the
		// caller's bytes where they are.
		buf = tensor.NewForeign(user, tensor.ForeignConfig{})
	default:
		buf, err = st.stageAlloc(ctx, end-start)
		if err == nil {
			staging, err = tensor.BytesOf(buf)
			if err == nil {
				tensor.Populate(staging)
			}
		}
	}
	if err != nil {
		if buf != nil {
			buf.Release()
		}
		return 0, nil, err
	}
	var opts []rdt.SlotOption
	if flags&SlotGenerations != 0 {
		opts = append(opts, rdt.WithGenerations())
	}
	s, err := r.actor.ReserveOver(ctx, buf, d.Rebased(), opts...)
	if err != nil {
		buf.Release()
		return 0, nil, err
	}
	ref, err := s.Ref().MarshalBinary()
	if err != nil {
		s.Close()
		return 0, nil, err
	}
	st.mu.Lock()
	st.next++
	h := st.next
	st.slots[h] = &slotEntry{slot: s, ref: ref, user: user, staging: staging}
	st.mu.Unlock()
	return h, ref, nil
}

func (st *pushState) stageAlloc(ctx context.Context, n int64) (tensor.Buffer, error) {
	st.mu.Lock()
	if st.stage == nil {
		st.stage = tensor.NewHostMemory(0)
	}
	m := st.stage
	st.mu.Unlock()
	return m.Alloc(ctx, n)
}

func (r *Runtime) slot(h uint64) (*slotEntry, error) {
	st := r.pushes()
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.slots[h]
	if !ok {
		return nil, invalid("no slot with handle %d (closed, or never reserved)", h)
	}
	return s, nil
}

// SlotWait blocks until the slot holds a generation after after (up to
// timeout; 0 = the runtime's transfer timeout) and returns it; for a
// staged slot the generation is in the caller's memory when it returns.
func (r *Runtime) SlotWait(ctx context.Context, h, after uint64, timeout time.Duration) (uint64, error) {
	s, err := r.slot(h)
	if err != nil {
		return 0, err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	gen, _, err := s.slot.Wait(ctx, after)
	if err != nil {
		return gen, err
	}
	s.land(gen)
	return gen, nil
}

// SlotsWait waits until every slot hs[i] holds a generation after
// after[i] (up to timeout in all) and only then copies the staged ones
// into the caller's memory, so a set of slots (a state dict) lands all
// together or not at all: on an error no caller memory has changed. It
// returns each slot's generation.
func (r *Runtime) SlotsWait(ctx context.Context, hs, after []uint64, timeout time.Duration) ([]uint64, error) {
	if len(hs) != len(after) || len(hs) == 0 {
		return nil, invalid("waiting for %d slots with %d generations", len(hs), len(after))
	}
	ss := make([]*slotEntry, len(hs))
	for i, h := range hs {
		s, err := r.slot(h)
		if err != nil {
			return nil, err
		}
		ss[i] = s
	}
	ctx, cancel := timed(ctx, timeout)
	defer cancel()
	gens := make([]uint64, len(hs))
	for i, s := range ss {
		g, _, err := s.slot.Wait(ctx, after[i])
		if err != nil {
			return gens, fmt.Errorf("slot %d of %d: %w", i, len(hs), err)
		}
		gens[i] = g
	}
	for i, s := range ss {
		s.land(gens[i])
	}
	return gens, nil
}

// land copies a staged slot's generation gen into the caller's memory,
// once.
func (s *slotEntry) land(gen uint64) {
	if s.staging == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen > s.landed {
		// A flow-controlled slot takes no write until SlotDone, so the
		// staging bytes are whole; without flow control a push may be
		// landing meanwhile (the documented trade).
		copy(s.user, s.staging)
		s.landed = gen
	}
}

// SlotDone says the reader is done with generation gen (a flow-controlled
// slot takes writes again; the writer is told).
func (r *Runtime) SlotDone(ctx context.Context, h, gen uint64) error {
	s, err := r.slot(h)
	if err != nil {
		return err
	}
	return s.slot.Done(ctx, gen)
}

// SlotInfo describes a slot.
type SlotInfo struct {
	Generation uint64 `json:"generation"` // completed pushes and broadcasts
	Done       uint64 `json:"done"`       // the last generation the reader said it is done with
	Landed     uint64 `json:"landed"`     // staged slots: the generation in the caller's memory
	Landing    string `json:"landing"`    // LandInPlace or LandStaged
	NBytes     int64  `json:"nbytes"`
}

// SlotInfo returns a slot's state.
func (r *Runtime) SlotInfo(h uint64) (SlotInfo, error) {
	s, err := r.slot(h)
	if err != nil {
		return SlotInfo{}, err
	}
	cur, done := s.slot.Generation()
	info := SlotInfo{Generation: cur, Done: done, Landing: LandInPlace, NBytes: int64(len(s.user)), Landed: cur}
	if s.staging != nil {
		s.mu.Lock()
		info.Landing, info.Landed = LandStaged, s.landed
		s.mu.Unlock()
	}
	return info, nil
}

// SlotClose unregisters a slot; later pushes into it fail (object not
// found). Closing twice is not an error.
func (r *Runtime) SlotClose(h uint64) error {
	st := r.pushes()
	st.mu.Lock()
	s, ok := st.slots[h]
	delete(st.slots, h)
	st.mu.Unlock()
	if !ok {
		return nil
	}
	return s.slot.Close()
}

// TransferInfo is one push's outcome in JSON.
type TransferInfo struct {
	Transport string  `json:"transport,omitempty"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	Coalesced int     `json:"coalesced,omitempty"`
	Notified  int     `json:"notified,omitempty"`
	Degraded  bool    `json:"degraded,omitempty"`
	ErrorInfo
}

// ErrorInfo is an error in JSON: Kind is capi's (its code in Kinds is
// Code), Message the error's text; both empty for success.
type ErrorInfo struct {
	Kind    string `json:"kind,omitempty"`
	Code    int    `json:"code,omitempty"`
	Message string `json:"error,omitempty"`
}

func errorInfo(err error) ErrorInfo {
	if err == nil {
		return ErrorInfo{}
	}
	c := Code(err)
	msg := err.Error()
	if len(msg) > maxMessage {
		msg = msg[:maxMessage-3] + "..."
	}
	return ErrorInfo{Kind: Kinds[c], Code: c, Message: msg}
}

// maxMessage bounds an item's error text, so a caller can size the output
// of a batch (which must not be run twice to learn its size) up front:
// MaxItemJSON bytes per item.
const maxMessage = 512

// MaxItemJSON bounds one TransferInfo in JSON (with its message).
const MaxItemJSON = maxMessage + 512

func transferInfo(x rdt.Transfer, err error) TransferInfo {
	return TransferInfo{Transport: x.Stats.Transport, Bytes: x.Stats.Bytes, Seconds: x.Stats.Duration.Seconds(),
		Coalesced: x.Stats.Coalesced, Notified: x.Notified, Degraded: x.Plan.Degraded, ErrorInfo: errorInfo(err)}
}

func timed(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return context.WithCancel(ctx)
}

// Push writes the object src (this runtime's) into the slot dst.
func (r *Runtime) Push(ctx context.Context, src, dst []byte, timeout time.Duration) (TransferInfo, error) {
	return r.push(ctx, src, dst, timeout)
}

func (r *Runtime) push(ctx context.Context, src, dst []byte, timeout time.Duration, opts ...rdt.PushOption) (TransferInfo, error) {
	s, err := parseRef(src)
	if err != nil {
		return TransferInfo{}, err
	}
	d, err := parseRef(dst)
	if err != nil {
		return TransferInfo{}, err
	}
	ctx, cancel := timed(ctx, timeout)
	defer cancel()
	x, err := r.actor.Push(ctx, s, d, opts...)
	return transferInfo(x, err), err
}

// PushRuns is Push of the concatenation of runs of the object src, in
// order, which must fill the slot dst exactly (rdt.PushRuns): runs are
// (offset, length) pairs, flat, offsets from the object's first byte.
func (r *Runtime) PushRuns(ctx context.Context, src, dst []byte, runs []int64, timeout time.Duration) (TransferInfo, error) {
	if len(runs) == 0 || len(runs)%2 != 0 {
		return TransferInfo{}, invalid("runs are (offset, length) pairs: %d numbers", len(runs))
	}
	rs := make([]rdt.Run, len(runs)/2)
	for i := range rs {
		rs[i] = rdt.Run{Off: runs[2*i], Len: runs[2*i+1]}
	}
	return r.push(ctx, src, dst, timeout, rdt.PushRuns(rs))
}

// PushBatchRequest is PushBatch's input: Srcs[i] goes into Dsts[i]. Refs
// are bytes (base64 in JSON).
type PushBatchRequest struct {
	Srcs     [][]byte `json:"srcs"`
	Dsts     [][]byte `json:"dsts"`
	Parallel int      `json:"parallel,omitempty"`
}

func parseRefs(ps [][]byte, what string) ([]rdt.Ref, error) {
	out := make([]rdt.Ref, len(ps))
	for i, p := range ps {
		ref, err := parseRef(p)
		if err != nil {
			return nil, fmt.Errorf("%s %d: %w", what, i, err)
		}
		out[i] = ref
	}
	return out, nil
}

// PushBatch pushes every pair at once (coalesced per path and destination,
// one notice per destination runtime) and returns each item's outcome; the
// error is for a request that could not start.
func (r *Runtime) PushBatch(ctx context.Context, reqJSON []byte, timeout time.Duration) ([]TransferInfo, error) {
	var req PushBatchRequest
	if err := strictJSON(reqJSON, &req); err != nil {
		return nil, err
	}
	if len(req.Srcs) != len(req.Dsts) || len(req.Srcs) == 0 {
		return nil, invalid("push batch of %d sources and %d slots", len(req.Srcs), len(req.Dsts))
	}
	srcs, err := parseRefs(req.Srcs, "source")
	if err != nil {
		return nil, err
	}
	dsts, err := parseRefs(req.Dsts, "slot")
	if err != nil {
		return nil, err
	}
	ctx, cancel := timed(ctx, timeout)
	defer cancel()
	xs, errs := r.actor.PushBatch(ctx, srcs, dsts, rdt.BatchConfig{Parallel: req.Parallel})
	out := make([]TransferInfo, len(xs))
	for i := range xs {
		out[i] = transferInfo(xs[i], errs[i])
	}
	return out, nil
}

func strictJSON(p []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("request: %v", err)
	}
	return nil
}

// BroadcastRequest is a broadcast batch: Srcs are this runtime's objects (a
// state dict, in order), Readers[j] reader j's slots, one per source.
type BroadcastRequest struct {
	Srcs    [][]byte   `json:"srcs"`
	Readers [][][]byte `json:"readers"`
	// ChunkSize (bytes), Window (chunks in flight per edge) and BusyWaitMS
	// are rdt.BroadcastConfig's; 0 means its defaults.
	ChunkSize  int64 `json:"chunk_size,omitempty"`
	Window     int   `json:"window,omitempty"`
	BusyWaitMS int64 `json:"busy_wait_ms,omitempty"`
}

func (r *Runtime) parseBroadcast(reqJSON []byte) ([]rdt.Ref, [][]rdt.Ref, rdt.BroadcastConfig, error) {
	var req BroadcastRequest
	var cfg rdt.BroadcastConfig
	if err := strictJSON(reqJSON, &req); err != nil {
		return nil, nil, cfg, err
	}
	if len(req.Srcs) == 0 || len(req.Readers) == 0 {
		return nil, nil, cfg, invalid("broadcast of %d objects to %d readers", len(req.Srcs), len(req.Readers))
	}
	if req.ChunkSize < 0 || req.Window < 0 || req.BusyWaitMS < 0 {
		return nil, nil, cfg, invalid("negative chunk_size, window or busy_wait_ms")
	}
	srcs, err := parseRefs(req.Srcs, "source")
	if err != nil {
		return nil, nil, cfg, err
	}
	readers := make([][]rdt.Ref, len(req.Readers))
	for j, rs := range req.Readers {
		if len(rs) != len(srcs) {
			return nil, nil, cfg, invalid("reader %d has %d slots for %d objects", j, len(rs), len(srcs))
		}
		if readers[j], err = parseRefs(rs, fmt.Sprintf("reader %d slot", j)); err != nil {
			return nil, nil, cfg, err
		}
	}
	cfg = rdt.BroadcastConfig{ChunkSize: req.ChunkSize, Window: req.Window, BusyWait: time.Duration(req.BusyWaitMS) * time.Millisecond}
	return srcs, readers, cfg, nil
}

// asyncOp is an operation in flight behind a handle.
type asyncOp struct {
	done     <-chan struct{}
	cancel   func()
	progress func() rdt.Progress
	result   func() (any, error) // valid once done is closed
	// consumed waits until every reader of a broadcast said done.
	consumed func(ctx context.Context) error
}

// StartBroadcast starts a broadcast batch and returns its operation handle
// (OpProgress, OpWait, OpCancel, OpClose). timeout bounds the whole
// broadcast (0: the runtime's transfer timeout).
func (r *Runtime) StartBroadcast(ctx context.Context, reqJSON []byte, timeout time.Duration) (uint64, error) {
	srcs, readers, cfg, err := r.parseBroadcast(reqJSON)
	if err != nil {
		return 0, err
	}
	// The operation outlives this call: its context is its own.
	opCtx, cancel := timed(context.WithoutCancel(ctx), timeout)
	h := r.actor.StartBroadcastBatch(opCtx, srcs, readers, cfg)
	done := make(chan struct{})
	var res *rdt.BatchBroadcastResult
	var resErr error
	go func() {
		defer close(done)
		defer cancel()
		res, resErr = h.Await(context.Background()) // the operation is bounded by opCtx
	}()
	op := &asyncOp{
		done: done, cancel: h.Cancel, progress: h.Progress,
		result: func() (any, error) {
			if resErr != nil {
				return nil, resErr
			}
			return broadcastInfo(res), nil
		},
		consumed: func(ctx context.Context) error {
			if resErr != nil {
				return resErr
			}
			return res.WaitConsumed(ctx)
		},
	}
	st := r.pushes()
	st.mu.Lock()
	st.next++
	id := st.next
	st.ops[id] = op
	st.mu.Unlock()
	return id, nil
}

func (r *Runtime) op(id uint64) (*asyncOp, error) {
	st := r.pushes()
	st.mu.Lock()
	defer st.mu.Unlock()
	op, ok := st.ops[id]
	if !ok {
		return nil, invalid("no operation with handle %d (closed, or never started)", id)
	}
	return op, nil
}

// OpProgress reports an operation's bytes done and total, and whether it
// has ended.
func (r *Runtime) OpProgress(id uint64) (rdt.Progress, bool, error) {
	op, err := r.op(id)
	if err != nil {
		return rdt.Progress{}, false, err
	}
	select {
	case <-op.done:
		return op.progress(), true, nil
	default:
		return op.progress(), false, nil
	}
}

// OpWait waits up to timeout (0: no bound beyond the operation's own) for
// the operation's result; the operation goes on if the wait times out.
func (r *Runtime) OpWait(ctx context.Context, id uint64, timeout time.Duration) (any, error) {
	op, err := r.op(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := timed(ctx, timeout)
	defer cancel()
	select {
	case <-op.done:
		return op.result()
	case <-ctx.Done():
		return nil, fmt.Errorf("tensorlane: waiting for operation %d: %w", id, ctx.Err())
	}
}

// OpWaitConsumed waits until every reader a finished broadcast reached said
// done with the generation it got (a reader that died is not waited for:
// the error names it).
func (r *Runtime) OpWaitConsumed(ctx context.Context, id uint64, timeout time.Duration) error {
	op, err := r.op(id)
	if err != nil {
		return err
	}
	ctx, cancel := timed(ctx, timeout)
	defer cancel()
	select {
	case <-op.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return op.consumed(ctx)
}

// OpCancel stops an operation (its result then says so, unless it had
// finished). Idempotent.
func (r *Runtime) OpCancel(id uint64) error {
	op, err := r.op(id)
	if err != nil {
		return err
	}
	op.cancel()
	return nil
}

// OpClose forgets an operation, cancelling it if it still runs and waiting
// for it to stop. Closing twice is not an error.
func (r *Runtime) OpClose(id uint64) error {
	st := r.pushes()
	st.mu.Lock()
	op, ok := st.ops[id]
	delete(st.ops, id)
	st.mu.Unlock()
	if !ok {
		return nil
	}
	op.cancel()
	<-op.done
	return nil
}

// WaitConsumed waits until the reader of slot (a marshalled slot Ref) said
// done with generation gen.
func (r *Runtime) WaitConsumed(ctx context.Context, slot []byte, gen uint64, timeout time.Duration) error {
	ref, err := parseRef(slot)
	if err != nil {
		return err
	}
	ctx, cancel := timed(ctx, timeout)
	defer cancel()
	return r.actor.WaitConsumed(ctx, ref, gen)
}

// BroadcastInfo is a broadcast batch's outcome in JSON.
type BroadcastInfo struct {
	OK      int          `json:"ok"`
	Bytes   int64        `json:"bytes"` // per reader
	Seconds float64      `json:"seconds"`
	Tree    string       `json:"tree"` // the tree it followed, drawn
	Readers []ReaderInfo `json:"readers"`
	Items   []ErrorInfo  `json:"items"` // per object: why it was left out, or empty
	Plan    PlanInfo     `json:"plan"`
}

// ReaderInfo is one reader's outcome.
type ReaderInfo struct {
	Parent      int      `json:"parent"` // -1: the owner
	FedBy       int      `json:"fed_by"` // -1: the owner
	Fed         string   `json:"fed"`    // FedBy in words
	Path        string   `json:"path"`   // transport from FedBy
	Reparented  bool     `json:"reparented"`
	Generations []uint64 `json:"generations"` // per object; 0 for one left out
	ErrorInfo
}

// PlanInfo is the broadcast tree as planned.
type PlanInfo struct {
	Owner string     `json:"owner"`
	Nodes []NodeInfo `json:"nodes"`
	Text  string     `json:"text"`
}

// NodeInfo is one reader in the planned tree.
type NodeInfo struct {
	Endpoint string `json:"endpoint"`
	Parent   int    `json:"parent"`
	Path     string `json:"path"`
	Leader   bool   `json:"leader"`
}

func planInfo(p rdt.BroadcastPlan) PlanInfo {
	out := PlanInfo{Owner: p.Owner, Text: p.String(), Nodes: []NodeInfo{}}
	for _, n := range p.Nodes {
		out.Nodes = append(out.Nodes, NodeInfo{Endpoint: n.Endpoint, Parent: n.Parent, Path: n.Path, Leader: n.Leader})
	}
	return out
}

func broadcastInfo(res *rdt.BatchBroadcastResult) BroadcastInfo {
	b := res.BroadcastResult
	out := BroadcastInfo{OK: b.OK(), Bytes: b.Bytes, Seconds: b.Duration.Seconds(), Tree: b.String(), Plan: planInfo(b.Plan)}
	for _, rr := range b.Readers {
		gens := rr.Generations
		if gens == nil {
			gens = []uint64{}
		}
		out.Readers = append(out.Readers, ReaderInfo{Parent: rr.Parent, FedBy: rr.FedBy, Fed: rr.Fed, Path: rr.Path,
			Reparented: rr.Reparented(), Generations: gens, ErrorInfo: errorInfo(rr.Err)})
	}
	for _, err := range res.Items {
		out.Items = append(out.Items, errorInfo(err))
	}
	return out
}

// ExplainBroadcast says which tree a broadcast of the request would follow
// (planned from each reader's first slot: a reader's slots share a runtime
// and device).
func (r *Runtime) ExplainBroadcast(reqJSON []byte) (PlanInfo, error) {
	srcs, readers, _, err := r.parseBroadcast(reqJSON)
	if err != nil {
		return PlanInfo{}, err
	}
	first := make([]rdt.Ref, len(readers))
	for j, rs := range readers {
		first[j] = rs[0]
	}
	return planInfo(r.actor.ExplainBroadcast(srcs[0], first)), nil
}
