package tcp

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// packed is what the sink must hold after a gathered push of runs of src.
func packed(src []byte, runs []fabric.Run) []byte {
	var out []byte
	for _, r := range runs {
		out = append(out, src[r.Off:r.Off+r.Len]...)
	}
	return out
}

// strided is count runs of n bytes, stride apart, from off.
func strided(off, n, stride, count int64) []fabric.Run {
	var out []fabric.Run
	for k := range count {
		out = append(out, fabric.Run{Off: off + k*stride, Len: n})
	}
	return out
}

// randomRuns covers up to total bytes of a source of size bytes with runs
// of random offsets and lengths (1 byte to a few blocks, some one byte).
func randomRuns(rng *rand.Rand, size, total int64) []fabric.Run {
	var out []fabric.Run
	for left := total; left > 0; {
		var n int64
		switch rng.IntN(4) {
		case 0:
			n = 1
		case 1:
			n = 1 + rng.Int64N(4096)
		default:
			n = 1 + rng.Int64N(3*DefaultChunkSize)
		}
		n = min(n, left, size)
		out = append(out, fabric.Run{Off: rng.Int64N(size - n + 1), Len: n})
		left -= n
	}
	return out
}

// TestWriteRuns: a gathered push lands exactly the packed bytes of its
// runs in the sink, whether the runs are larger or smaller than a block
// (block boundaries inside runs, runs across blocks), a byte long, in
// random order and size, striped over several connections or not,
// compressed or raw, checksummed or sealed (encrypted), eager or not; a
// list of one run is the plain write of that range.
func TestWriteRuns(t *testing.T) {
	const size = 6<<20 + 321
	rng := rand.New(rand.NewPCG(7, 24))
	cases := []struct {
		name string
		runs []fabric.Run
	}{
		{"one run = the plain write", []fabric.Run{{Off: 0, Len: size}}},
		{"one run inside", []fabric.Run{{Off: 4099, Len: 3<<20 + 1}}},
		{"rows of 4 KiB, stride 8 KiB (reshard's)", strided(4096, 4096, 8192, 700)},
		{"runs across blocks", strided(13, 300<<10, 301<<10, 12)},
		{"block boundaries inside runs", strided(0, 100<<10, 100<<10+2, 40)},
		{"one-byte runs", strided(5, 1, 3, 5000)},
		{"a one-byte run among large", []fabric.Run{{Off: 0, Len: DefaultChunkSize - 1}, {Off: size - 1, Len: 1}, {Off: 1, Len: DefaultChunkSize + 5}}},
		{"small (eager)", []fabric.Run{{Off: 9, Len: 10}, {Off: 100, Len: 1000}, {Off: 2, Len: 3}}},
		{"random, striped", randomRuns(rng, size, 5<<20+77)},
		{"random, small", randomRuns(rng, size, 700<<10)},
	}
	type mode struct {
		name    string
		cfg     Config
		encrypt bool
	}
	modes := []mode{
		{"raw", Config{Compression: CompressOff}, false},
		{"compressed", Config{Compression: CompressAlways}, false},
		{"sealed", Config{Compression: CompressOff, Security: fabric.Security{EncryptData: true}}, true},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			pf := newPushFixtureWith(t, size, func(c *ServerConfig) { c.EncryptData = m.encrypt })
			src, _ := tensor.BytesOf(pf.src)
			tr := pf.transport(t, m.cfg)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					want := packed(src, tc.runs)
					n := int64(len(want))
					for _, off := range []int64{0, 3} {
						if off+n > size {
							continue
						}
						clear(pf.sink)
						st, err := tr.WriteRuns(context.Background(), pf.src, tc.runs, pf.target(off, n))
						require.NoError(t, err)
						assert.Equal(t, n, st.Bytes)
						require.True(t, bytes.Equal(want, pf.sink[off:off+n]), "sink differs from the packed runs")
						assert.False(t, bytes.ContainsFunc(pf.sink[:off], func(r rune) bool { return r != 0 }), "bytes before the range written")
						if n >= 2<<20 {
							assert.Greater(t, st.Streams, 1, "large gathered pushes are striped")
						}
					}
				})
			}
			if m.encrypt {
				assert.Positive(t, tr.sealedN.Load(), "sealed: raw blocks unsummed")
			}
		})
	}
}

// TestWriteRunsChecksums: the owner verifies a gathered block's checksum
// (computed over the runs it spans) like any other: a damaged one is
// refused as ErrCorrupt, and the transport stays usable. Each block's sum
// is computed (a gathered block is off any object's grid of cached sums).
func TestWriteRunsChecksums(t *testing.T) {
	const size = 2 << 20
	pf := newPushFixture(t, size)
	src, _ := tensor.BytesOf(pf.src)
	tr := pf.transport(t, Config{Compression: CompressOff})
	ctx := context.Background()
	runs := strided(0, 4096, 8192, 200)
	n := fabric.RunsBytes(runs)

	tr.corruptNext.Store(true)
	_, err := tr.WriteRuns(ctx, pf.src, runs, pf.target(0, n))
	require.ErrorIs(t, err, fabric.ErrCorrupt)

	before := tr.SendSums().Computed
	clear(pf.sink)
	_, err = tr.WriteRuns(ctx, pf.src, runs, pf.target(0, n))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(packed(src, runs), pf.sink[:n]))
	assert.Equal(t, (n+DefaultChunkSize-1)/DefaultChunkSize, tr.SendSums().Computed-before, "one computed sum per block")
}

// TestWriteRunsRefused: runs that do not describe the push are refused
// before anything is sent, as fabric.ErrBadRuns (a bad request).
func TestWriteRunsRefused(t *testing.T) {
	pf := newPushFixture(t, 1<<20)
	tr := pf.transport(t, Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		runs []fabric.Run
		n    int64
	}{
		{"none", nil, 10},
		{"outside the source", []fabric.Run{{Off: 1<<20 - 5, Len: 10}}, 10},
		{"negative offset", []fabric.Run{{Off: -1, Len: 10}}, 10},
		{"empty run", []fabric.Run{{Off: 0, Len: 0}, {Off: 0, Len: 10}}, 10},
		{"short of the destination", []fabric.Run{{Off: 0, Len: 9}}, 10},
		{"past the destination", []fabric.Run{{Off: 0, Len: 6}, {Off: 0, Len: 6}}, 10},
		{"overflowing", []fabric.Run{{Off: 1, Len: 1<<63 - 1}}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opens := pf.opens.Load()
			_, err := tr.WriteRuns(ctx, pf.src, tc.runs, pf.target(0, tc.n))
			require.ErrorIs(t, err, fabric.ErrBadRuns)
			require.ErrorIs(t, err, fabric.ErrBadRequest)
			assert.Equal(t, opens, pf.opens.Load(), "nothing reached the owner")
		})
	}
}

func TestGatherSlice(t *testing.T) {
	g := &gather{runs: []fabric.Run{{Off: 100, Len: 10}, {Off: 0, Len: 5}, {Off: 50, Len: 20}}, n: 35}
	for _, tc := range []struct {
		a, b int64
		want []fabric.Run
	}{
		{0, 35, g.runs},
		{0, 10, []fabric.Run{{Off: 100, Len: 10}}},
		{5, 12, []fabric.Run{{Off: 105, Len: 5}, {Off: 0, Len: 2}}},
		{12, 35, []fabric.Run{{Off: 2, Len: 3}, {Off: 50, Len: 20}}},
		{16, 17, []fabric.Run{{Off: 51, Len: 1}}},
	} {
		t.Run(fmt.Sprintf("%d-%d", tc.a, tc.b), func(t *testing.T) {
			s := g.slice(tc.a, tc.b)
			assert.Equal(t, tc.want, s.runs)
			assert.Equal(t, tc.b-tc.a, s.n)
		})
	}
}
