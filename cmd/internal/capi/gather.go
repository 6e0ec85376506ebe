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
// (Alloc), on up to workers goroutines, checksumming each 256 KiB of the
// block as its bytes land (tensor.ChunkSums.Gather), and publishes the
// block as one sealed uint8 object carrying those checksums: a state dict
// copied once on publish (the Ray plug-in's default), whose network reads
// then never read its memory for checksums. The block is the caller's
// copy and must not change after this call: a reader over the network
// would see a changed block as corrupt. Bad parts are refused before
// anything is copied or published.
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
	sums := tensor.NewChunkSums(0, n)
	if err := sums.Gather(block, parts, workers); err != nil {
		return nil, err
	}
	buf, err := a.shared.Window(int64(addr-a.base), n)
	if err != nil {
		return nil, err
	}
	d := tensor.Desc{DType: tensor.Uint8, Shape: []int64{n}, Strides: []int64{1}}
	_, p, err := r.publish(ctx, buf, d, nil, true, rdt.SealedWith(sums))
	if err != nil {
		return nil, err
	}
	r.stats.gatheredPuts.Add(1)
	return p, nil
}
