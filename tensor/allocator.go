package tensor

import (
	"sort"
)

// Alignment is the granularity of device allocations, as CUDA's allocator
// guarantees 256-byte alignment.
const Alignment = 256

// rangeAllocator hands out aligned ranges of [0, capacity) first-fit and
// merges freed ranges with their neighbours. It is not safe for concurrent
// use; the owning memory locks around it.
type rangeAllocator struct {
	capacity int64
	free     []span // sorted by off, never adjacent
	used     int64
	allocs   int
	peak     int64
}

type span struct{ off, n int64 }

func newRangeAllocator(capacity int64) *rangeAllocator {
	a := &rangeAllocator{capacity: capacity}
	if capacity > 0 {
		a.free = []span{{0, capacity}}
	}
	return a
}

func alignUp(n int64) int64 { return (n + Alignment - 1) &^ (Alignment - 1) }

// alloc returns the offset of a block of size n (already aligned), or false.
func (a *rangeAllocator) alloc(n int64) (int64, bool) {
	for i, s := range a.free {
		if s.n < n {
			continue
		}
		off := s.off
		if s.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + n, s.n - n}
		}
		a.used += n
		a.allocs++
		if a.used > a.peak {
			a.peak = a.used
		}
		return off, true
	}
	return 0, false
}

// release returns [off, off+n) to the free list.
func (a *rangeAllocator) release(off, n int64) {
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	s := span{off, n}
	// Merge with the previous and next blocks when they touch.
	if i > 0 && a.free[i-1].off+a.free[i-1].n == off {
		i--
		a.free[i].n += n
		s = a.free[i]
	} else {
		a.free = append(a.free, span{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = s
	}
	if i+1 < len(a.free) && s.off+s.n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	a.used -= n
	a.allocs--
}

func (a *rangeAllocator) largestFree() int64 {
	var m int64
	for _, s := range a.free {
		if s.n > m {
			m = s.n
		}
	}
	return m
}
