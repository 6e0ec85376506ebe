package soak

import (
	"context"
	"math/rand/v2"
	"sync"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// broadcast is the soak's other operation: a random owner broadcasts a
// random tensor to slots two to four random readers reserved, while faults
// (kills included) hit them; each reader the result says has the data is
// verified byte for byte, every failure must be typed, and every slot is
// closed whatever happened.
func (s *soak) broadcast(ctx context.Context, rng *rand.Rand) {
	owner := s.slots[rng.IntN(len(s.slots))]
	size := int64(8) << rng.IntN(64-clz(s.maxSize/8))
	size = min(s.maxSize, size+8*rng.Int64N(size/8+1))
	seed := rng.Uint64()
	var ref rdt.Ref
	var putErr error
	s.bounded("put", func() {
		owner.mu.RLock()
		defer owner.mu.RUnlock()
		ref, putErr = soakPut(ctx, owner, tensor.GPUDevice(rng.IntN(4)), size, seed)
	})
	if putErr != nil {
		if ctx.Err() == nil {
			s.surface("put", putErr)
		}
		return
	}
	defer s.free(owner, ref)

	type reserved struct {
		sl    *soakSlot
		actor *rdt.Actor
		slot  *rdt.Slot
	}
	var readers []reserved
	defer func() {
		for _, r := range readers {
			r.sl.mu.RLock()
			r.slot.Close()
			r.sl.mu.RUnlock()
		}
	}()
	for range 2 + rng.IntN(3) {
		sl := s.slots[rng.IntN(len(s.slots))]
		var slot *rdt.Slot
		var err error
		sl.mu.RLock()
		actor := sl.actor
		s.bounded("reserve", func() { slot, err = actor.Reserve(ctx, ref.Desc, tensor.GPUDevice(4+len(readers))) })
		sl.mu.RUnlock()
		if err != nil {
			if ctx.Err() == nil {
				s.surface("reserve", err)
			}
			continue
		}
		readers = append(readers, reserved{sl, actor, slot})
	}
	if len(readers) == 0 {
		return
	}
	refs := make([]rdt.Ref, len(readers))
	for i, r := range readers {
		refs[i] = r.slot.Ref()
	}
	s.attempts.Add(int64(len(readers))) // one verified transfer per reader
	// Each reader's attempt ends in exactly one outcome (see transfer).
	once := make([]sync.Once, len(readers))
	outcome := func(i int, o string) { once[i].Do(func() { s.count(&s.outcomes, o) }) }
	failed := func(i int, op string, err error) {
		switch {
		case ctx.Err() != nil:
			outcome(i, "skipped:soak_ended")
		case s.surface(op, err):
			outcome(i, "error")
		default:
			outcome(i, "error_untyped")
		}
	}
	defer func() {
		for i := range readers {
			outcome(i, "hung") // only those whose call never came back
		}
	}()
	s.bounded("broadcast", func() {
		owner.mu.RLock()
		actor := owner.actor
		owner.mu.RUnlock()
		bctx, cancel := context.WithTimeout(ctx, s.o.Bound)
		defer cancel()
		res, err := actor.Broadcast(bctx, ref, refs, rdt.BroadcastConfig{ChunkSize: 256 << 10})
		if err != nil {
			if ctx.Err() == nil {
				s.surface("broadcast", err)
			}
			for i := range readers {
				if ctx.Err() != nil {
					outcome(i, "skipped:soak_ended")
				} else {
					outcome(i, "error")
				}
			}
			return
		}
		for i, rr := range res.Readers {
			if rr.Err != nil {
				failed(i, "broadcast_reader", rr.Err)
				continue
			}
			r := readers[i]
			r.sl.mu.RLock()
			if r.sl.actor != r.actor { // killed since: its memory is gone
				r.sl.mu.RUnlock()
				s.count(&s.errCodes, "broadcast:reader_killed_after_success")
				outcome(i, "skipped:reader_killed_after_success")
				continue
			}
			wctx, wcancel := context.WithTimeout(ctx, s.o.Bound)
			_, x, err := r.slot.Wait(wctx, 0)
			wcancel()
			if err == nil {
				var p []byte
				if p, err = x.SpanBytes(); err == nil {
					if bad := countMismatches(p, seed); bad > 0 {
						outcome(i, "corrupted")
						s.corrupted.Add(bad)
						s.log.Error("broadcast delivered wrong bytes", "ref", ref, "bad", bad)
					} else {
						outcome(i, "transferred")
						s.transfers.Add(1)
						s.moved.Add(int64(len(p)))
						s.count(&s.paths, "broadcast")
					}
				}
			}
			r.sl.mu.RUnlock()
			if err != nil {
				failed(i, "broadcast_wait", err)
			}
		}
	})
}
