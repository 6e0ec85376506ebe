package fabric

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/tensor"
)

// StageSegment is the unit StagedRead moves: large enough that the extra
// request per segment is noise, small enough that two fit in pinned memory
// comfortably.
const StageSegment = 32 << 20

// StagedRead fills the first n bytes of dst, device memory the CPU cannot
// address, through host staging for a transport that needs host bytes
// (tcp, rdma): fetch(ctx, off, p) must fill p with bytes [off, off+len(p))
// of the source. Transfers longer than one StageSegment alternate between
// two staging halves, so the device copies segment i in while segment
// i+1 crosses the wire. It returns once every byte is in dst, or the
// first error (after the device copies it started have ended).
func StagedRead(ctx context.Context, dst tensor.Buffer, n int64, fetch func(ctx context.Context, off int64, p []byte) error) error {
	if n <= 0 {
		return fetch(ctx, 0, nil) // still asks the owner: the claim is checked
	}
	seg := min(n, StageSegment)
	halves := int64(1)
	if n > seg {
		halves = 2
	}
	stage, err := tensor.StageFor(ctx, dst, max(seg*halves, 1))
	if err != nil {
		return err
	}
	defer stage.Release()
	buf, err := tensor.BytesOf(stage)
	if err != nil {
		return err
	}
	// copied[h] carries the result of the device copy out of half h.
	var copied [2]chan error
	wait := func(h int) error {
		if copied[h] == nil {
			return nil
		}
		err := <-copied[h]
		copied[h] = nil
		return err
	}
	var first error
	for i, off := 0, int64(0); off < n && first == nil; i, off = i+1, off+seg {
		h := i % int(halves)
		if err := wait(h); err != nil {
			first = err
			break
		}
		k := min(seg, n-off)
		at := int64(h) * seg
		if err := fetch(ctx, off, buf[at:at+k]); err != nil {
			first = err
			break
		}
		done := make(chan error, 1)
		copied[h] = done
		go func(off, at, k int64) {
			done <- tensor.Copy(ctx, dst, off, stage, at, k)
		}(off, at, k)
	}
	for h := range copied {
		if err := wait(h); err != nil && first == nil {
			first = fmt.Errorf("copy staged bytes into %v: %w", dst.Device(), err)
		}
	}
	return first
}
