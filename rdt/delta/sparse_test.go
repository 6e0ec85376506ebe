package delta

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSparseRoundTrip: at lengths around words and chunks (a trailing
// partial word, a partial last chunk), every element size and densities of
// change from none to all, the sparse delta decodes to the new version,
// counts the changed elements as a plain loop does, and stays within
// Bound.
func TestSparseRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	lengths := []int{0, 1, 7, 8, 9, 63, 64, 1001, 8*chunkWords - 1, 8 * chunkWords, 8*chunkWords + 13, 3*8*chunkWords + 5}
	for _, elem := range []int{1, 2, 4, 8} {
		for _, n := range lengths {
			for _, p := range []float64{0, 0.001, 0.05, 0.5, 1} {
				prev, cur := randomVersions(r, n, p)
				d, st, err := Encode(nil, prev, cur, elem)
				require.NoError(t, err)
				assert.LessOrEqual(t, int64(len(d)), Bound(int64(n)), "elem %d n %d p %g", elem, n, p)
				assert.Equal(t, xorPlanesRef(make([]byte, n), prev, cur, elem), st.Changed, "elem %d n %d p %g", elem, n, p)
				base := bytes.Clone(prev)
				require.NoError(t, Decode(base, d), "elem %d n %d p %g", elem, n, p)
				require.Equal(t, cur, base, "elem %d n %d p %g", elem, n, p)
			}
		}
	}
}

// TestSparseSkipsUnchangedChunks: a tensor whose changes sit in one chunk
// costs that chunk's word map and words, not a pass over the rest: the
// delta of a 64 MiB tensor with one changed word is a few hundred bytes.
func TestSparseSkipsUnchangedChunks(t *testing.T) {
	prev := make([]byte, 8<<20) // 256 chunks
	cur := bytes.Clone(prev)
	cur[5<<20] = 1
	d, st, err := Encode(nil, prev, cur, 2)
	require.NoError(t, err)
	assert.EqualValues(t, 1, st.Changed)
	assert.Less(t, len(d), 8<<20/8/chunkWords/8+headerV2+2*chunkMap+200)
	base := bytes.Clone(prev)
	require.NoError(t, Decode(base, d))
	assert.Equal(t, cur, base)
}

// TestSparseRefusesDamage: any single damaged byte of a sparse delta that
// would change the result, and every truncation, is refused with
// ErrCorrupt and the base is left as it was; nothing panics. The base's
// checksum is the one field the result does not depend on: Decode checks
// the result, and hashes the base only to name a failure, so damage there
// still decodes to exactly the sender's version (Check, which hashes the
// base, refuses it).
func TestSparseRefusesDamage(t *testing.T) {
	prev, cur := adam(3*chunkWords+9, 1e-5, 3, 2) // partial word and chunk at the end
	d, _, err := Encode(nil, prev, cur, 2)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range d {
		bad := bytes.Clone(d)
		bad[i] ^= byte(r.Uint32()) | 1
		base := bytes.Clone(prev)
		err := Decode(base, bad)
		if i >= sumBase && i < sumBase+8 {
			require.NoError(t, err, "byte %d", i)
			require.Equal(t, cur, base, "byte %d", i)
			assert.ErrorIs(t, Check(prev, bad), ErrBaseMismatch, "byte %d", i)
			continue
		}
		assert.ErrorIs(t, err, ErrCorrupt, "byte %d", i)
		require.Equal(t, prev, base, "byte %d", i)
	}
	for n := range len(d) {
		base := bytes.Clone(prev)
		assert.ErrorIs(t, Decode(base, d[:n]), ErrCorrupt, "first %d bytes", n)
		require.Equal(t, prev, base, "first %d bytes", n)
	}
}

// TestV1StillDecodes: a delta in the v1 format (what earlier releases
// sent) still decodes and is still checked.
func TestV1StillDecodes(t *testing.T) {
	prev, cur := adam(1<<16, 1e-5, 3, 5)
	d, _, err := encodeV1(nil, prev, cur, 2)
	require.NoError(t, err)
	assert.Equal(t, magic, string(d[:4]))
	require.NoError(t, Check(prev, d))
	base := bytes.Clone(prev)
	require.NoError(t, Decode(base, d))
	assert.Equal(t, cur, base)
	assert.ErrorIs(t, Decode(base, d), ErrBaseMismatch, "applied twice")
}

// BenchmarkFormats: the sparse format (v2) against v1 on bf16 after an Adam
// step (16 MiB), encode and decode interleaved in each iteration; read the
// ratio metrics (v1's time over v2's, and the bytes of each).
func BenchmarkFormats(b *testing.B) {
	for _, lr := range []struct {
		name string
		lr   float64
	}{{"lr1e-6", 1e-6}, {"lr1e-5", 1e-5}} {
		b.Run(lr.name, func(b *testing.B) {
			prev, cur := adam(8<<20, lr.lr, 5, 3)
			var e1, e2, d1, d2 time.Duration
			var b1, b2 []byte
			base := bytes.Clone(prev)
			b.SetBytes(int64(len(cur)))
			for b.Loop() {
				t0 := time.Now()
				b1, _, _ = encodeV1(b1[:0], prev, cur, 2)
				t1 := time.Now()
				b2, _, _ = Encode(b2[:0], prev, cur, 2)
				t2 := time.Now()
				copy(base, prev)
				t3 := time.Now()
				if err := Decode(base, b1); err != nil {
					b.Fatal(err)
				}
				t4 := time.Now()
				copy(base, prev)
				t5 := time.Now()
				if err := Decode(base, b2); err != nil {
					b.Fatal(err)
				}
				t6 := time.Now()
				e1, e2, d1, d2 = e1+t1.Sub(t0), e2+t2.Sub(t1), d1+t4.Sub(t3), d2+t6.Sub(t5)
			}
			b.ReportMetric(float64(e1)/float64(e2), "encode-speedup")
			b.ReportMetric(float64(d1)/float64(d2), "decode-speedup")
			b.ReportMetric(float64(len(cur))/float64(len(b1)), "v1-x-fewer")
			b.ReportMetric(float64(len(cur))/float64(len(b2)), "v2-x-fewer")
		})
	}
}

// TestRevert: Revert undoes Decode in both formats; it refuses a base that
// is not the delta's result and leaves it as it was.
func TestRevert(t *testing.T) {
	prev, cur := adam(1<<15+3, 1e-5, 3, 9)
	for name, enc := range map[string]func(dst, prev, cur []byte, elem int) ([]byte, Stats, error){"v1": encodeV1, "v2": Encode} {
		d, _, err := enc(nil, prev, cur, 2)
		require.NoError(t, err)
		base := bytes.Clone(prev)
		assert.ErrorIs(t, Revert(base, d), ErrBaseMismatch, name+": not the result")
		assert.Equal(t, prev, base, name)
		require.NoError(t, Decode(base, d), name)
		require.NoError(t, Revert(base, d), name)
		assert.Equal(t, prev, base, name+": reverted")
	}
}

// TestSplitLanesMatchesReference: the register-packed split writes what
// the loop it replaced wrote (the format is unchanged), for words of every
// density of changed lanes and every element size.
func TestSplitLanesMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, elem := range []int{1, 2, 4, 8} {
		for _, nw := range []int{0, 1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 1000} {
			xs := make([]byte, 8*nw)
			for k := range nw {
				x := r.Uint64() | 1 // a changed word
				for l := 0; l < 8; l += elem {
					if r.IntN(3) == 0 {
						x &^= (1<<(8*elem) - 1) << (8 * l)
					}
				}
				if x == 0 {
					x = 1
				}
				binary.LittleEndian.PutUint64(xs[8*k:], x)
			}
			lm, es := splitLanes(bytes.Clone(xs), elem)
			wantLM, wantES := splitLanesRef(bytes.Clone(xs), elem)
			assert.Equal(t, wantLM, lm, "elem %d words %d: lane maps", elem, nw)
			assert.Equal(t, wantES, es, "elem %d words %d: elements", elem, nw)
		}
	}
}

// TestEncodeAdvance: EncodeAdvance writes a delta that decodes as
// Encode's does (not byte for byte: the entropy coder's encoders adapt
// from call to call), counts the same changes, and leaves prev equal to
// cur (chunks with changes copied, the tail too), at lengths around words
// and chunks and every element size.
func TestEncodeAdvance(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, elem := range []int{1, 2, 4, 8} {
		for _, n := range []int{1, 7, 8, 9, 1001, 8*chunkWords + 13, 3*8*chunkWords + 5} {
			for _, p := range []float64{0, 0.001, 0.3} {
				prev, cur := randomVersions(r, n, p)
				_, wst, err := Encode(nil, prev, cur, elem)
				require.NoError(t, err)
				kept := bytes.Clone(prev)
				got, st, err := EncodeAdvance(nil, prev, cur, elem)
				require.NoError(t, err)
				assert.Equal(t, wst.Changed, st.Changed, "elem %d n %d p %g", elem, n, p)
				require.Equal(t, cur, prev, "elem %d n %d p %g: prev advanced", elem, n, p)
				require.NoError(t, Decode(kept, got), "elem %d n %d p %g", elem, n, p)
				require.Equal(t, cur, kept, "elem %d n %d p %g", elem, n, p)
			}
		}
	}
	_, _, err := EncodeAdvance(nil, make([]byte, 4), make([]byte, 5), 2)
	assert.Error(t, err)
}
