package tensor

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// TestPopulateSpans: the pieces cover [0, n) exactly, in order, page
// aligned, each at least populateMin (but a lone piece), at most workers.
func TestPopulateSpans(t *testing.T) {
	ps := int(pageSize)
	for _, c := range []struct {
		name       string
		n, workers int
		want       int // pieces
	}{
		{"empty", 0, 4, 0},
		{"small", 1 << 20, 8, 1},
		{"under two minimums", 2*populateMin - ps, 8, 1},
		{"two minimums", 2 * populateMin, 8, 2},
		{"one worker", 256 << 20, 1, 1},
		{"bounded by workers", 256 << 20, 2, 2},
		{"bounded by size", 48 << 20, 8, 3},
		{"odd size", 100<<20 + 3*ps + 17, 4, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := populateSpans(c.n, c.workers)
			require.Len(t, got, c.want)
			at := 0
			for i, s := range got {
				assert.Equal(t, at, s[0], "piece %d starts where the last ended", i)
				assert.Less(t, s[0], s[1])
				assert.Zero(t, s[0]%ps, "piece %d page aligned", i)
				if len(got) > 1 && i < len(got)-1 {
					assert.GreaterOrEqual(t, s[1]-s[0], populateMin)
				}
				at = s[1]
			}
			assert.Equal(t, c.n, at, "covers all bytes")
		})
	}
}

// TestPopulateParallel: every page of fresh shared memory is resident
// after it (mincore), and nothing is written.
func TestPopulateParallel(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n = 3*populateMin + 5*4096
	seg, err := newSegment("populate-test", n, false)
	require.NoError(t, err)
	defer seg.free()
	populateParallel(seg.data)
	assert.Equal(t, n/int(pageSize), resident(t, seg.data), "every page resident")
	assert.Equal(t, -1, slices.IndexFunc(seg.data, func(b byte) bool { return b != 0 }))
}

// BenchmarkPopulate populates fresh 256 MiB shared-memory segments with one
// madvise call (the old way) and in parallel pieces, interleaved, and
// reports the ratio (one call's time over the parallel time).
func BenchmarkPopulate(b *testing.B) {
	const n = 256 << 20
	var one, par time.Duration
	run := func(f func([]byte)) time.Duration {
		seg, err := newSegment("populate-bench", n, false)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		f(seg.data)
		d := time.Since(t0)
		seg.free()
		return d
	}
	single := func(p []byte) { _ = unix.Madvise(p, unix.MADV_POPULATE_WRITE) }
	b.SetBytes(2 * n)
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			one += run(single)
			par += run(populateParallel)
		} else {
			par += run(populateParallel)
			one += run(single)
		}
	}
	b.ReportMetric(one.Seconds()/par.Seconds(), "ratio-one/parallel")
	b.ReportMetric(float64(b.N)*n/1e9/par.Seconds(), "parallel-GB/s")
	b.ReportMetric(float64(b.N)*n/1e9/one.Seconds(), "one-GB/s")
}
