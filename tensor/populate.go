package tensor

import (
	"context"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Populating fresh shared-memory pages (MADV_POPULATE_WRITE) is where a
// cold copy into new memory spends its time: the kernel allocates and
// zeroes every 4 KiB page, about 2 µs a page on a loaded 2-core VM, so
// 256 MiB took 0.2-0.6 s there against 30-70 ms for the copy that follows
// (Ray's tensorlane sender, issue #23). One madvise call runs on one core;
// the pages are independent, so pieces run on the cores there are, as the
// copy after it does (internal/pcopy).

// populateMin is the least a populate worker takes: below it the
// goroutine costs more than the page faults it saves.
const populateMin = 16 << 20

// populateWorkers bounds the workers of one populate, as pcopy bounds a
// copy's (memory bandwidth, not cores, is the limit beyond that).
const populateWorkers = 8

// populateSpans splits n bytes into up to workers page-aligned pieces of at
// least populateMin bytes each (the last takes the rest): the [start, end)
// offsets one worker each populates.
func populateSpans(n, workers int) [][2]int {
	if n <= 0 {
		return nil
	}
	k := max(1, min(workers, n/populateMin))
	ps := int(pageSize)
	step := (n/k + ps - 1) &^ (ps - 1)
	out := make([][2]int, 0, k)
	for off := 0; off < n; off += step {
		out = append(out, [2]int{off, min(off+step, n)})
	}
	return out
}

// populateParallel makes p's pages resident, in pieces on up to
// min(GOMAXPROCS, populateWorkers) cores. Kernels before 5.14 lack
// MADV_POPULATE_WRITE: the first touch then faults the pages, as before.
func populateParallel(p []byte) {
	spans := populateSpans(len(p), min(runtime.GOMAXPROCS(0), populateWorkers))
	if len(spans) <= 1 {
		_ = unix.Madvise(p, unix.MADV_POPULATE_WRITE)
		return
	}
	var wg sync.WaitGroup
	for _, s := range spans[1:] {
		wg.Go(func() { _ = unix.Madvise(p[s[0]:s[1]], unix.MADV_POPULATE_WRITE) })
	}
	_ = unix.Madvise(p[spans[0][0]:spans[0][1]], unix.MADV_POPULATE_WRITE)
	wg.Wait()
}

type lazyPagesKey struct{}

// WithLazyPages marks allocations made with the returned context as filled
// by a writer that takes its pages as it goes, such as a network receive
// (the kernel faults each page in inside its copy, while the next bytes
// are still on the wire). SlabMemory then does not populate the range
// first. Measured on the 2-core VM (256 MiB tcp read into fresh
// shared memory, interleaved, load 10-16): populate then read 612-859 ms
// (median of 5), the read faulting the pages itself 380-419 ms; populating
// first only puts the kernel's page work in front of the transfer. A
// userspace copy gains nothing from it (faulting copy ~ populate, then
// copy), so only readers whose transport fills the memory ask for it.
func WithLazyPages(ctx context.Context) context.Context {
	return context.WithValue(ctx, lazyPagesKey{}, true)
}

// LazyPages reports whether ctx came from WithLazyPages.
func LazyPages(ctx context.Context) bool {
	v, _ := ctx.Value(lazyPagesKey{}).(bool)
	return v
}
