package tensor

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync"
)

// GatherPart is one source of a gathered copy: Src's bytes go to the
// destination at offset At.
type GatherPart struct {
	Src []byte
	At  int64
}

// Gather copies parts into dst on up to workers goroutines (default
// GOMAXPROCS, at most 8). With a checksum cache (sums not nil) it also
// computes the checksum of each SumChunk block of dst right after the
// block's bytes were copied, while they are still in the core's cache: one
// pass over the bytes yields the copy and the sums a sealed object's
// senders would otherwise read the memory again for. The cache must cover
// exactly dst's bytes (NewChunkSums(0, len(dst)) for a block published from
// its first byte). Bytes of dst that no part covers (padding between parts)
// are left, and checksummed, as they are. Parts must lie inside dst and must
// not overlap one another (ErrBadDesc otherwise, and nothing is copied);
// their order does not matter.
func Gather(dst []byte, parts []GatherPart, workers int, sums *ChunkSums) error {
	if sums != nil && (sums.base != 0 || sums.end != int64(len(dst))) {
		return fmt.Errorf("%w: checksums of bytes [%d,%d) for a destination of %d bytes", ErrBadDesc, sums.base, sums.end, len(dst))
	}
	sorted := slices.Clone(parts)
	slices.SortFunc(sorted, func(a, b GatherPart) int { return cmp.Compare(a.At, b.At) })
	var prevEnd int64
	for i, p := range sorted {
		end := p.At + int64(len(p.Src))
		if p.At < 0 || end > int64(len(dst)) || end < p.At {
			return fmt.Errorf("%w: part of %d bytes at %d leaves a destination of %d bytes", ErrBadDesc, len(p.Src), p.At, len(dst))
		}
		if i > 0 && p.At < prevEnd {
			return fmt.Errorf("%w: parts overlap at byte %d", ErrBadDesc, p.At)
		}
		prevEnd = end
	}
	blocks := (len(dst) + SumChunk - 1) / SumChunk
	if workers <= 0 {
		workers = min(runtime.GOMAXPROCS(0), 8)
	}
	workers = max(1, min(workers, blocks))
	// Each worker takes a contiguous run of blocks: its sources stream
	// through in order, and no two workers write one cache line.
	var wg sync.WaitGroup
	for w := range workers {
		first, last := blocks*w/workers, blocks*(w+1)/workers
		wg.Go(func() { gatherBlocks(dst, sorted, first, last, sums) })
	}
	wg.Wait()
	return nil
}

// gatherBlocks copies into dst's blocks [first, last) the bytes of the
// sorted parts that fall in them, and checksums each block after its copy
// when there is a cache.
func gatherBlocks(dst []byte, parts []GatherPart, first, last int, sums *ChunkSums) {
	// The first part that may reach block first.
	i, _ := slices.BinarySearchFunc(parts, int64(first)*SumChunk, func(p GatherPart, off int64) int {
		return cmp.Compare(p.At+int64(len(p.Src)), off+1)
	})
	for k := first; k < last; k++ {
		lo, hi := int64(k)*SumChunk, min(int64(k+1)*SumChunk, int64(len(dst)))
		for ; i < len(parts); i++ {
			p := parts[i]
			pEnd := p.At + int64(len(p.Src))
			if p.At >= hi {
				break
			}
			from, to := max(p.At, lo), min(pEnd, hi)
			if from < to {
				copy(dst[from:to], p.Src[from-p.At:to-p.At])
			}
			if pEnd > hi {
				break // the part goes on into the next block
			}
		}
		if sums != nil {
			sums.Set(lo, int(hi-lo), Sum(dst[lo:hi]))
		}
	}
}
