package capi

import (
	"context"
	"unsafe"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// GatherPart is one source of PutGathered: Src's bytes go to the block at
// offset At.
type GatherPart = tensor.GatherPart

// PutGathered copies parts into block, memory this runtime allocated
// (Alloc), on up to workers goroutines, and publishes the block as one
// sealed uint8 object: a state dict copied once on publish (the Ray
// plug-in's default). Sealed, its 256 KiB blocks' checksums are computed
// at most once, never at every network read. Once this runtime has served
// a network (tcp) read, the copy computes them as each block lands, in
// cache (tensor.Gather), so not even the first read of this block reads its
// memory for them; before that they are left to the first such read, so a
// runtime whose readers all share its host (shm: no checksums) pays
// nothing for them. The block is the caller's copy and must not change
// after this call: a reader over the network would see a changed block as
// corrupt. Bad parts are refused before anything is copied or published.
func (r *Runtime) PutGathered(ctx context.Context, block []byte, parts []GatherPart, workers int) ([]byte, error) {
	if len(block) == 0 {
		return nil, invalid("empty block: nothing to publish")
	}
	n := int64(len(block))
	addr := uintptr(unsafe.Pointer(&block[0]))
	a := r.owning(addr, n)
	if a == nil {
		// Sealing memory the caller keeps would promise what the caller
		// may break; the block must be the runtime's.
		return nil, invalid("the block (%d bytes at %#x) is not memory this runtime allocated", n, addr)
	}
	var sums *tensor.ChunkSums
	if r.rt.TCPBlocksServed() > 0 {
		sums = tensor.NewChunkSums(0, n)
	}
	if err := tensor.Gather(block, parts, workers, sums); err != nil {
		return nil, err
	}
	buf, err := a.shared.Window(int64(addr-a.base), n)
	if err != nil {
		return nil, err
	}
	d := tensor.Desc{DType: tensor.Uint8, Shape: []int64{n}, Strides: []int64{1}}
	seal := rdt.Sealed()
	if sums != nil {
		seal = rdt.SealedWith(sums)
	}
	_, p, err := r.publish(ctx, buf, d, nil, true, seal)
	if err != nil {
		return nil, err
	}
	r.stats.gatheredPuts.Add(1)
	if sums != nil {
		r.stats.gatheredSummed.Add(1)
	}
	return p, nil
}
