package soak

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// broadcast is the soak's other operation: a random owner broadcasts a
// random tensor to slots two to four random readers reserved, while faults
// (kills included) hit them; each reader the result says has the data is
// verified byte for byte, every failure must be typed, and every slot is
// closed whatever happened. One broadcast in four also names a reader
// that never reserved (a slot ref nobody holds: it must fail typed, and
// one that "has the data" counts as forged_accepted), and one in four has
// a reader leave mid-step (its slot closed once bytes flow).
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
	// Until one broadcast with both faults below has run, every one has
	// them, so that every run, however short, checks them.
	first := s.bcastFaults.Load() == 0
	ghost := -1 // a reader that never reserved: not an attempt, it must fail typed
	if first || rng.IntN(4) == 0 {
		g := refs[rng.IntN(len(refs))]
		for i := range g.Object {
			g.Object[i] = byte(rng.Uint32())
		}
		ghost = len(refs)
		refs = append(refs, g)
	}
	leaver := -1 // a reader whose slot closes mid-step
	if first || rng.IntN(4) == 0 {
		leaver = rng.IntN(len(readers))
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
		h := actor.StartBroadcast(bctx, ref, refs, rdt.BroadcastConfig{ChunkSize: 256 << 10})
		if leaver >= 0 {
			// Leave once bytes flow (or at once when the tensor is
			// small and already done).
			for h.Progress().Done == 0 {
				select {
				case <-h.Done():
				case <-bctx.Done():
				case <-time.After(time.Millisecond):
					continue
				}
				break
			}
			r := readers[leaver]
			r.sl.mu.RLock()
			r.slot.Close()
			r.sl.mu.RUnlock()
			s.count(&s.errCodes, "broadcast:reader_left_mid_step")
		}
		res, err := h.Await(bctx)
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
		if ghost >= 0 && leaver >= 0 {
			s.bcastFaults.Add(1)
		}
		if ghost >= 0 {
			if err := res.Readers[ghost].Err; err == nil {
				s.forgedOK.Add(1)
				s.log.Error("broadcast says a slot nobody reserved has the data", "ref", refs[ghost])
			} else {
				s.surface("broadcast_ghost", err)
			}
			res.Readers = res.Readers[:ghost]
		}
		for i, rr := range res.Readers {
			if i == leaver && ctx.Err() == nil {
				// It left: whatever the result says, its slot is gone.
				if rr.Err != nil {
					s.surface("broadcast_left", rr.Err)
				}
				outcome(i, "skipped:reader_left")
				continue
			}
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
