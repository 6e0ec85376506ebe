package shm

import (
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkColdSourcePages compares ways for a reader to copy 64 MiB out of
// an owner's memory file it has not read before (its pages exist; the
// reader has no page tables for them), each iteration a fresh mapping,
// against a copy from a mapping already populated (warm), into a
// destination whose pages exist. What the shm reader does today: populate
// (MADV_POPULATE_READ, on two cores), then copy on two cores. The others
// were tried for issue 15's cold transfer and not taken (docs/benchmarks.md
// says why): let the copy fault the pages in, touch one byte per 64 KiB
// first (a read fault maps a 64 KiB window: fault_around_bytes), or skip
// the mapping and pread the file on two cores.
//
//	go test -run '^$' -bench ColdSourcePages -benchtime 10x ./fabric/shm/
func BenchmarkColdSourcePages(b *testing.B) {
	const n = 64 << 20
	fd, err := unix.MemfdCreate("tensorlane-bench", unix.MFD_CLOEXEC)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, n); err != nil {
		b.Fatal(err)
	}
	own, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(own)
	fillPattern(own, 1)
	dst := make([]byte, n)
	copy(dst, own)
	warm, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(warm)
	halves := func(f func(off, end int)) {
		var wg sync.WaitGroup
		for off := 0; off < n; off += n / 2 {
			wg.Go(func() { f(off, off+n/2) })
		}
		wg.Wait()
	}
	for _, s := range []struct {
		name string
		read func(m []byte)
	}{
		{"warm", func([]byte) { halves(func(o, e int) { copy(dst[o:e], warm[o:e]) }) }},
		{"populate+copy", func(m []byte) { populateRead(m); halves(func(o, e int) { copy(dst[o:e], m[o:e]) }) }},
		{"fault+copy", func(m []byte) { halves(func(o, e int) { copy(dst[o:e], m[o:e]) }) }},
		{"touch64K+copy", func(m []byte) {
			halves(func(o, e int) { touchEvery(m[o:e], 64<<10); copy(dst[o:e], m[o:e]) })
		}},
		{"pread", func([]byte) {
			halves(func(o, e int) {
				for p := o; p < e; p += 8 << 20 {
					if _, err := unix.Pread(fd, dst[p:min(p+8<<20, e)], int64(p)); err != nil {
						b.Error(err)
					}
				}
			})
		}},
	} {
		b.Run(s.name, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				b.StopTimer()
				m, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				s.read(m)
				b.StopTimer()
				unix.Munmap(m)
				b.StartTimer()
			}
		})
	}
}

var touchSink byte

//go:norace
func touchEvery(p []byte, step int) {
	var s byte
	for i := 0; i < len(p); i += step {
		s += p[i]
	}
	touchSink = s
}
