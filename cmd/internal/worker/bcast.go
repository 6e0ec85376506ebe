package worker

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/internal/workerproto"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// The worker's broadcast operations: reserve (a slot of size bytes on a
// device; replies its ref), wait (until slot ref's generation passes after,
// then check every byte against the seed's pattern), broadcast (the object
// ref to the slots refs; replies one outcome per reader) and close-slot.

// workerSlots are the slots a worker reserved, by object id.
type workerSlots struct {
	mu sync.Mutex
	m  map[string]*rdt.Slot
}

func (w *worker) slots() *workerSlots {
	w.bslots.mu.Lock()
	defer w.bslots.mu.Unlock()
	if w.bslots.m == nil {
		w.bslots.m = map[string]*rdt.Slot{}
	}
	return &w.bslots
}

func (w *worker) handleBroadcast(ctx context.Context, req workerRequest) (workerReply, bool) {
	var r workerReply
	var err error
	switch req.Op {
	case "reserve":
		r, err = w.reserve(ctx, req)
	case "wait":
		r, err = w.waitSlot(ctx, req)
	case "broadcast":
		r, err = w.broadcast(ctx, req)
	case "close-slot":
		err = w.closeSlot(req)
	default:
		return r, false
	}
	return w.result(req.ID, r, err), true
}

func (w *worker) reserve(ctx context.Context, req workerRequest) (workerReply, error) {
	dev, err := w.device(req.Device)
	if err != nil {
		return workerReply{}, err
	}
	if req.Size <= 0 {
		return workerReply{}, fmt.Errorf("%w: size must be positive, got %d", errBadWorkerRequest, req.Size)
	}
	desc := tensor.Desc{DType: tensor.Uint8, Shape: []int64{req.Size}, Strides: []int64{1}}
	s, err := w.actor.Reserve(ctx, desc, dev)
	if err != nil {
		return workerReply{}, err
	}
	ref := s.Ref()
	b, err := ref.MarshalBinary()
	if err != nil {
		s.Close()
		return workerReply{}, err
	}
	t := w.slots()
	t.mu.Lock()
	t.m[ref.Object.String()] = s
	t.mu.Unlock()
	return workerReply{Ref: base64.StdEncoding.EncodeToString(b), Object: ref.Object.String(), Bytes: req.Size}, nil
}

func (w *worker) slotOf(ref string) (*rdt.Slot, error) {
	r, err := decodeRef(ref)
	if err != nil {
		return nil, err
	}
	t := w.slots()
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.m[r.Object.String()]
	if !ok {
		return nil, fmt.Errorf("%w: no slot %v here", rdt.ErrObjectNotFound, r.Object)
	}
	return s, nil
}

func (w *worker) waitSlot(ctx context.Context, req workerRequest) (workerReply, error) {
	s, err := w.slotOf(req.Ref)
	if err != nil {
		return workerReply{}, err
	}
	start := time.Now()
	gen, x, err := s.Wait(ctx, req.After)
	r := workerReply{Seconds: time.Since(start).Seconds(), Generation: gen}
	if err != nil {
		return r, err
	}
	p, err := x.SpanBytes()
	if err != nil {
		return r, err
	}
	if i := CheckPattern(p, req.Seed); i >= 0 {
		return r, fmt.Errorf("%w: slot byte %d differs", errVerify, i)
	}
	r.Verified, r.Bytes = true, int64(len(p))
	return r, nil
}

func (w *worker) broadcast(ctx context.Context, req workerRequest) (workerReply, error) {
	src, err := decodeRef(req.Ref)
	if err != nil {
		return workerReply{}, err
	}
	var slots []rdt.Ref
	for _, s := range req.Refs {
		ref, err := decodeRef(s)
		if err != nil {
			return workerReply{}, err
		}
		slots = append(slots, ref)
	}
	start := time.Now()
	res, err := w.actor.Broadcast(ctx, src, slots, rdt.BroadcastConfig{ChunkSize: req.ChunkSize, Window: req.Window})
	r := workerReply{Seconds: time.Since(start).Seconds()}
	if err != nil {
		return r, err
	}
	for _, rr := range res.Readers {
		o := workerproto.ReaderOutcome{OK: rr.Err == nil, Fed: rr.Fed, Generation: rr.Generation}
		if rr.Err != nil {
			o.Code, o.Error = ErrorCode(rr.Err), rr.Err.Error()
		}
		r.Readers = append(r.Readers, o)
	}
	r.Bytes = res.Bytes * int64(res.OK())
	r.Tree = res.Plan.String() + "followed:\n" + res.String()
	return r, nil
}

func (w *worker) closeSlot(req workerRequest) error {
	s, err := w.slotOf(req.Ref)
	if err != nil {
		return err
	}
	t := w.slots()
	t.mu.Lock()
	for k, v := range t.m {
		if v == s {
			delete(t.m, k)
		}
	}
	t.mu.Unlock()
	return s.Close()
}
