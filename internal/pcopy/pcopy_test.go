package pcopy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCopySizes(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 1 << 20, 8<<20 + 3, 33<<20 + 4097} {
		for _, w := range []int{1, 2, 3, 8} {
			t.Run(fmt.Sprintf("%d/w%d", n, w), func(t *testing.T) {
				from := make([]byte, n)
				rand.Read(from)
				to := make([]byte, n+5)
				require.NoError(t, Copy(context.Background(), to, from, Options{Workers: w, MinParallel: 1 << 20, Chunk: 256 << 10}))
				assert.True(t, bytes.Equal(to[:n], from))
			})
		}
	}
}

func TestCopyStops(t *testing.T) {
	from := make([]byte, 16<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, Copy(ctx, make([]byte, len(from)), from, Options{Workers: 2}), context.Canceled)
	boom := errors.New("peer gone")
	assert.ErrorIs(t, Copy(context.Background(), make([]byte, len(from)), from, Options{Workers: 2, Check: func() error { return boom }}), boom)
	assert.Error(t, Copy(context.Background(), make([]byte, 1), from, Options{}))
}

// A shared file that shrinks under its mapping faults every worker; each
// fault becomes a FaultError, not a crash.
func TestCopyFault(t *testing.T) {
	fd, err := unix.MemfdCreate("pcopy-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	const n = 16 << 20
	require.NoError(t, unix.Ftruncate(fd, n))
	data, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(data)
	require.NoError(t, unix.Ftruncate(fd, 0))
	var fe *FaultError
	err = Copy(context.Background(), make([]byte, n), data, Options{Workers: 4, GuardFaults: true})
	require.ErrorAs(t, err, &fe)
}

// BenchmarkCopy compares one worker with several on 256 MiB (a ratio on
// one machine, in one run: go test -bench Copy ./internal/pcopy/).
func BenchmarkCopy(b *testing.B) {
	const n = 256 << 20
	from, to := make([]byte, n), make([]byte, n)
	rand.Read(from[:1<<20])
	copy(to, from) // touch every page first
	for _, w := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				if err := Copy(context.Background(), to, from, Options{Workers: w}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCopyVsMemcpy answers "does a copy on two cores beat one?" on the
// machine it runs on: each iteration copies 1 GiB with a plain copy() (one
// goroutine, the memcpy baseline), then with Copy on one worker and on
// two, interleaved so drift hits all three alike, and reports each Copy's
// median throughput over the adjacent copy()'s. On a machine whose memory
// bandwidth one core cannot fill, workers-2/memcpy exceeds 1 (issue 15's
// goal: 1.5); where one core already fills it (a small VM), it stays
// about 1.
//
//	go test -run '^$' -bench CopyVsMemcpy -benchtime 5x ./internal/pcopy/
func BenchmarkCopyVsMemcpy(b *testing.B) {
	const n = 1 << 30
	from, to := make([]byte, n), make([]byte, n)
	rand.Read(from[:1<<20])
	copy(to, from) // touch every page first
	ctx := context.Background()
	var r1, r2 []float64
	var plain, w1, w2 time.Duration
	for b.Loop() { // ns/op is the three copies together
		t0 := time.Now()
		copy(to, from)
		t1 := time.Now()
		if err := Copy(ctx, to, from, Options{Workers: 1}); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := Copy(ctx, to, from, Options{Workers: 2}); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		plain, w1, w2 = plain+t1.Sub(t0), w1+t2.Sub(t1), w2+t3.Sub(t2)
		r1 = append(r1, float64(t1.Sub(t0))/float64(t2.Sub(t1)))
		r2 = append(r2, float64(t1.Sub(t0))/float64(t3.Sub(t2)))
	}
	k := float64(len(r1))
	b.ReportMetric(float64(plain.Microseconds())/1000/k, "memcpy-ms")
	b.ReportMetric(float64(w1.Microseconds())/1000/k, "workers1-ms")
	b.ReportMetric(float64(w2.Microseconds())/1000/k, "workers2-ms")
	b.ReportMetric(medianOf(r1), "workers1/memcpy")
	b.ReportMetric(medianOf(r2), "workers2/memcpy")
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestGather: the runs' concatenation lands in to, on one worker and on
// several (runs across stripes and chunks), checks run about every chunk,
// a cancelled context or a failing check stops it, and a run outside the
// source is an error before anything is copied.
func TestGather(t *testing.T) {
	from := make([]byte, 1<<20)
	for i := range from {
		from[i] = byte(i * 7)
	}
	rowRuns := func(n, stride, length int64) []Run {
		var rs []Run
		for off := int64(0); off+length <= int64(len(from)) && int64(len(rs)) < n; off += stride {
			rs = append(rs, Run{Off: off, Len: length})
		}
		return rs
	}
	cases := []struct {
		name string
		runs []Run
		o    Options
	}{
		{"one run", []Run{{Off: 5, Len: 1000}}, Options{}},
		{"rows, one worker", rowRuns(100, 8192, 4096), Options{}},
		{"rows, four workers, small chunks", rowRuns(128, 8192, 4096), Options{Workers: 4, MinParallel: 64 << 10, Chunk: 3000}},
		{"overlapping and unordered", []Run{{Off: 900, Len: 300}, {Off: 0, Len: 1000}, {Off: 950, Len: 10}}, Options{Workers: 3, MinParallel: 512, Chunk: 100}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want []byte
			for _, r := range tc.runs {
				want = append(want, from[r.Off:r.Off+r.Len]...)
			}
			checks := 0
			var mu sync.Mutex
			tc.o.Check = func() error { mu.Lock(); checks++; mu.Unlock(); return nil }
			to := make([]byte, len(want)+7)
			require.NoError(t, Gather(context.Background(), to, from, tc.runs, tc.o))
			assert.Equal(t, want, to[:len(want)])
			assert.Equal(t, make([]byte, 7), to[len(want):], "nothing past the runs")
			assert.Positive(t, checks)
		})
	}
	to := make([]byte, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, Gather(ctx, to, from, rowRuns(64, 8192, 4096), Options{}), context.Canceled)
	stop := errors.New("peer gone")
	assert.ErrorIs(t, Gather(context.Background(), to, from, rowRuns(64, 8192, 4096), Options{Check: func() error { return stop }}), stop)
	assert.Error(t, Gather(context.Background(), to, from, []Run{{Off: 1 << 20, Len: 1}}, Options{}))
	assert.Error(t, Gather(context.Background(), to[:10], from, []Run{{Off: 0, Len: 11}}, Options{}))
}
