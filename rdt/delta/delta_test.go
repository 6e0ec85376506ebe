package delta

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// adam simulates RL post-training: fp32 master weights (std 0.02), Adam
// (beta 0.9, 0.999, eps 1e-8) with noisy gradients, bf16 copies for the
// readers. It returns the bf16 bytes before and after step `steps` at lr.
func adam(n int, lr float64, steps int, seed uint64) (prev, cur []byte) {
	r := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	w := make([]float32, n)
	m := make([]float64, n)
	v := make([]float64, n)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.02)
	}
	toBF16 := func() []byte {
		out := make([]byte, 2*n)
		for i, f := range w {
			b := math.Float32bits(f)
			binary.LittleEndian.PutUint16(out[2*i:], uint16((b+0x7fff+(b>>16)&1)>>16))
		}
		return out
	}
	for s := 1; s <= steps; s++ {
		if s == steps {
			prev = toBF16()
		}
		c1, c2 := 1-math.Pow(0.9, float64(s)), 1-math.Pow(0.999, float64(s))
		for i := range w {
			g := r.NormFloat64()*1e-3 + 1e-4*float64(i%7-3) // noise around a small signal
			m[i] = 0.9*m[i] + 0.1*g
			v[i] = 0.999*v[i] + 0.001*g*g
			w[i] -= float32(lr * (m[i] / c1) / (math.Sqrt(v[i]/c2) + 1e-8))
		}
	}
	return prev, toBF16()
}

// TestDeltaAfterAdamStep: at RL learning rates the delta of a bf16 state
// after one Adam step is many times smaller than the tensor, and decoding
// it into the previous version gives the new one byte for byte. The
// ratios are logged (bench figures come from BenchmarkDelta).
func TestDeltaAfterAdamStep(t *testing.T) {
	for _, lr := range []float64{1e-6, 3e-6, 1e-5} {
		prev, cur := adam(1<<18, lr, 10, 7)
		d, st, err := Encode(nil, prev, cur, 2)
		require.NoError(t, err)
		base := bytes.Clone(prev)
		require.NoError(t, Decode(base, d))
		assert.True(t, bytes.Equal(cur, base), "lr %g: the delta gives the full transfer's bytes", lr)
		t.Logf("lr %g: %.2f%% of bf16 weights changed; delta %d of %d bytes: %.1fx fewer", lr, 100*float64(st.Changed)/float64(len(cur)/2), st.Encoded, st.Raw, st.Ratio())
		assert.Greater(t, st.Ratio(), 2.0, "lr %g", lr) // a floor, not the goal: the benchmark reports the figure
	}
}

// TestDecodeRefusesAndRestores: a delta applied to the wrong base, a
// damaged delta, or a delta of another size leaves the base as it was.
func TestDecodeRefusesAndRestores(t *testing.T) {
	prev, cur := adam(4096, 1e-5, 3, 1)
	d, _, err := Encode(nil, prev, cur, 2)
	require.NoError(t, err)

	require.NoError(t, Check(prev, d))
	other := bytes.Clone(prev)
	other[10] ^= 1
	assert.ErrorIs(t, Check(other, d), ErrBaseMismatch)
	assert.ErrorIs(t, Check(other[:5], d), ErrCorrupt)
	assert.ErrorIs(t, Check(other, d[:5]), ErrCorrupt)
	keep := bytes.Clone(other)
	assert.ErrorIs(t, Decode(other, d), ErrBaseMismatch)
	assert.Equal(t, keep, other)

	// A forged result checksum: decoded, checked, refused, restored.
	bad := bytes.Clone(d)
	bad[21] ^= 0xff
	base := bytes.Clone(prev)
	assert.ErrorIs(t, Decode(base, bad), ErrCorrupt)
	assert.Equal(t, prev, base)

	for name, junk := range map[string][]byte{
		"empty": nil, "short": d[:10], "magic": append([]byte("XXXX"), d[4:]...), "truncated": d[:len(d)-3],
	} {
		base := bytes.Clone(prev)
		assert.ErrorIs(t, Decode(base, junk), ErrCorrupt, name)
		assert.Equal(t, prev, base, name)
	}
	assert.ErrorIs(t, Decode(make([]byte, 10), d), ErrCorrupt, "another size")
	_, _, err = Encode(nil, prev, cur[:10], 2)
	assert.Error(t, err)
	_, _, err = Encode(nil, prev, cur, 3)
	assert.Error(t, err)

	// Odd lengths and every element size round-trip.
	for _, elem := range []int{1, 2, 4, 8} {
		a, b := bytes.Clone(prev[:1001]), bytes.Clone(cur[:1001])
		d, _, err := Encode(nil, a, b, elem)
		require.NoError(t, err)
		require.NoError(t, Decode(a, d))
		assert.Equal(t, b, a, "elem %d", elem)
	}
}

// TestWorth: a delta pays on slow links, not on links faster than the
// codec.
func TestWorth(t *testing.T) {
	const gib = 1 << 30
	assert.True(t, Worth(gib, gib/8, 125e6, 1e9), "1 Gbit/s, 8x smaller, codec 1 GB/s")
	assert.False(t, Worth(gib, gib/8, 25e9, 1e9), "NVLink-class link")
	assert.False(t, Worth(gib, gib, 125e6, 1e9), "no gain")
	assert.False(t, Worth(gib, gib/8, 0, 1e9))
}

// BenchmarkDelta reports the codec's rate and the bytes ratio after an
// Adam step at lr 1e-5 (bf16, 64 MiB: more than the caches hold, as a
// model's shard is).
func BenchmarkDelta(b *testing.B) {
	prev, cur := adam(32<<20, 1e-5, 5, 3)
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(len(cur)))
		b.ReportAllocs()
		var st Stats
		for b.Loop() {
			_, st, _ = Encode(nil, prev, cur, 2)
		}
		b.ReportMetric(st.Ratio(), "x-fewer-bytes")
	})
	d, _, _ := Encode(nil, prev, cur, 2)
	back, _, _ := Encode(nil, cur, prev, 2)
	// Forth and back, two decodes an iteration: no copy to restore the
	// base between them, which would be a third of the time.
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(2 * int64(len(cur)))
		base := bytes.Clone(prev)
		for b.Loop() {
			if err := Decode(base, d); err != nil {
				b.Fatal(err)
			}
			if err := Decode(base, back); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// xorPlanesRef and applyPlanesRef are the plain loops the word-skipping
// ones replaced: the reference for TestPlanesMatchReference and the
// baseline of BenchmarkPlanes.
func xorPlanesRef(dst, prev, cur []byte, elem int) int64 {
	m := len(cur) / elem
	var changed int64
	for i := range m {
		var any byte
		for k := range elem {
			x := cur[i*elem+k] ^ prev[i*elem+k]
			dst[k*m+i] = x
			any |= x
		}
		if any != 0 {
			changed++
		}
	}
	for i := m * elem; i < len(cur); i++ {
		dst[i] = cur[i] ^ prev[i]
	}
	return changed
}

func applyPlanesRef(base, planes []byte, elem int) {
	m := len(base) / elem
	for i := range m {
		for k := range elem {
			base[i*elem+k] ^= planes[k*m+i]
		}
	}
	for i := m * elem; i < len(base); i++ {
		base[i] ^= planes[i]
	}
}

// TestPlanesMatchReference: at every length around the four-element words
// (partial words, a trailing partial element) and at several densities of
// change, the planes and the count equal the plain loop's, and applying
// them gives the new version.
func TestPlanesMatchReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, elem := range []int{1, 2, 4, 8} {
		for n := 0; n <= 40; n++ {
			for _, p := range []float64{0, 0.05, 0.5, 1} {
				prev, cur := randomVersions(r, n, p)
				got, want := make([]byte, n), make([]byte, n)
				assert.Equal(t, xorPlanesRef(want, prev, cur, elem), xorPlanes(got, prev, cur, elem), "elem %d n %d p %g", elem, n, p)
				require.Equal(t, want, got, "elem %d n %d p %g", elem, n, p)
				base := bytes.Clone(prev)
				applyPlanes(base, got, elem)
				require.Equal(t, cur, base, "elem %d n %d p %g", elem, n, p)
			}
		}
	}
}

// BenchmarkPlanes: the XOR into planes and back, word-skipping against the
// plain loops, interleaved in each iteration (bf16 after an Adam step at
// lr 1e-6, 16 MiB); read the ratio metrics.
func BenchmarkPlanes(b *testing.B) {
	prev, cur := adam(8<<20, 1e-6, 5, 3)
	planes := make([]byte, len(cur))
	base := bytes.Clone(prev)
	var xNew, xRef, aNew, aRef time.Duration
	b.SetBytes(int64(len(cur)))
	for b.Loop() {
		clear(planes)
		t0 := time.Now()
		xorPlanesRef(planes, prev, cur, 2)
		t1 := time.Now()
		applyPlanesRef(base, planes, 2)
		t2 := time.Now()
		clear(planes)
		t3 := time.Now()
		xorPlanes(planes, prev, cur, 2)
		t4 := time.Now()
		applyPlanes(base, planes, 2)
		t5 := time.Now()
		xRef, aRef, xNew, aNew = xRef+t1.Sub(t0), aRef+t2.Sub(t1), xNew+t4.Sub(t3), aNew+t5.Sub(t4)
	}
	b.ReportMetric(float64(xRef)/float64(xNew), "xor-speedup")
	b.ReportMetric(float64(aRef)/float64(aNew), "apply-speedup")
}

// TestCodecRate: the measured rate is positive, stands for rateRefresh,
// and is measured again after it (a reading taken under load does not
// hold for good).
func TestCodecRate(t *testing.T) {
	r := CodecRate()
	t.Logf("codec rate, one core: %.2f GB/s per side", r/1e9)
	assert.Greater(t, r, 1e6, "at least a MB/s")
	rateMu.Lock()
	at := rateAt
	rateMu.Unlock()
	assert.Equal(t, r, CodecRate(), "within rateRefresh: the same reading")
	rateMu.Lock()
	assert.Equal(t, at, rateAt)
	rateAt = time.Now().Add(-2 * rateRefresh)
	rateMu.Unlock()
	assert.Greater(t, CodecRate(), 1e6)
	rateMu.Lock()
	assert.True(t, rateAt.After(at), "measured again once stale")
	rateMu.Unlock()
}

// randomVersions returns n random bytes and a next version of them in
// which each byte changed with probability p.
func randomVersions(r *rand.Rand, n int, p float64) (prev, cur []byte) {
	prev = make([]byte, n)
	for i := range prev {
		prev[i] = byte(r.Uint32())
	}
	cur = bytes.Clone(prev)
	for i := range cur {
		if r.Float64() < p {
			cur[i] ^= byte(r.Uint32()) | 1
		}
	}
	return prev, cur
}
