package tensor

import (
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
