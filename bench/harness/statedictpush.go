package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// runStateDictPush measures the trainer pushing the state dict refs into
// slots the reader reserved, as one PushBatch (coalesced per path, one
// push notice) and as the same batch pushed item by item
// (BatchConfig.Separate), against one Push of a tensor of the same total
// size, interleaved round by round; then every slot's bytes are checked.
// The slots are on the reader's dev (its GPU 0 on the second host; on the
// owner's host, a GPU NVLink-linked to the owner's for p2p, host memory
// for shm).
func runStateDictPush(ctx context.Context, rec StateDictRecord, cfg StateDictConfig, owner, reader *rdt.Actor, refs []rdt.Ref, one rdt.Ref, dev tensor.DeviceID) (StateDictRecord, error) {
	var slots []*rdt.Slot
	defer func() {
		for _, s := range slots {
			s.Close()
		}
	}()
	reserve := func(ref rdt.Ref) (rdt.Ref, error) {
		s, err := reader.Reserve(ctx, ref.Desc, dev)
		if err != nil {
			return rdt.Ref{}, err
		}
		slots = append(slots, s)
		return s.Ref(), nil
	}
	dsts := make([]rdt.Ref, len(refs))
	for i, ref := range refs {
		var err error
		if dsts[i], err = reserve(ref); err != nil {
			return rec, err
		}
	}
	oneSlot, err := reserve(one)
	if err != nil {
		return rec, err
	}
	batch := func(separate bool) (float64, error) {
		start := time.Now()
		_, errs := owner.PushBatch(ctx, refs, dsts, rdt.BatchConfig{Parallel: cfg.Parallel, Separate: separate})
		d := time.Since(start).Seconds()
		for i, err := range errs {
			if err != nil {
				return 0, fmt.Errorf("harness: statedict push of tensor %d: %w", i, err)
			}
		}
		return d, nil
	}
	single := func() (float64, error) {
		start := time.Now()
		if _, err := owner.Push(ctx, one, oneSlot); err != nil {
			return 0, err
		}
		return time.Since(start).Seconds(), nil
	}
	if err := rec.measure(cfg.Rounds, batch, single); err != nil {
		return rec, err
	}
	// Every slot holds what was pushed (the pattern put filled in).
	want := map[int64][]byte{}
	all := append(dsts, oneSlot)
	for i := range slots {
		n := all[i].Desc.NBytes()
		if want[n] == nil {
			want[n] = make([]byte, n)
			fillPattern(want[n])
		}
		if err := verifySlots(ctx, slots[i:i+1], want[n]); err != nil {
			return rec, fmt.Errorf("harness: statedict push, slot %d: %w", i, err)
		}
	}
	return rec, nil
}
