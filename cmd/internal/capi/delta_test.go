package capi

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDeltaRoundTripAndKinds: a delta through the C ABI's functions gives
// the new bytes; a wrong base is layout_mismatch, a damaged delta corrupt,
// and either leaves the base as it was.
func TestDeltaRoundTripAndKinds(t *testing.T) {
	prev := pattern(1 << 16)
	cur := bytes.Clone(prev)
	for i := 0; i < len(cur); i += 97 {
		cur[i] ^= 0x3
	}
	out := make([]byte, DeltaBound(int64(len(cur))))
	n, changed, err := DeltaEncode(prev, cur, out, 2)
	require.NoError(t, err)
	assert.Less(t, n, len(cur)/4)
	assert.Positive(t, changed)
	base := bytes.Clone(prev)
	require.NoError(t, DeltaDecode(base, out[:n]))
	assert.Equal(t, cur, base)

	wrong := bytes.Clone(cur)
	err = DeltaDecode(wrong, out[:n])
	assert.Equal(t, "layout_mismatch", kindOf(err), "%v", err)
	assert.Equal(t, cur, wrong)
	base = bytes.Clone(prev)
	err = DeltaDecode(base, out[:n-5])
	assert.Equal(t, "corrupt", kindOf(err), "%v", err)
	assert.Equal(t, prev, base)

	_, _, err = DeltaEncode(prev, cur, out[:10], 2)
	assert.Equal(t, "invalid_argument", kindOf(err))
	_, _, err = DeltaEncode(prev, cur[:5], out, 2)
	assert.Equal(t, "invalid_argument", kindOf(err))
	_, _, err = DeltaEncode(prev, cur, out, 3)
	assert.Equal(t, "invalid_argument", kindOf(err))
}

// TestDeltaRevert: DeltaRevert undoes DeltaDecode, and refuses a base that
// is not the delta's result (layout_mismatch), leaving it as it was.
func TestDeltaRevert(t *testing.T) {
	prev := pattern(1 << 12)
	cur := bytes.Clone(prev)
	cur[100] ^= 0x40
	out := make([]byte, DeltaBound(int64(len(cur))))
	n, _, err := DeltaEncode(prev, cur, out, 2)
	require.NoError(t, err)
	base := bytes.Clone(prev)
	assert.Equal(t, "layout_mismatch", kindOf(DeltaRevert(base, out[:n])))
	assert.Equal(t, prev, base)
	require.NoError(t, DeltaDecode(base, out[:n]))
	require.NoError(t, DeltaRevert(base, out[:n]))
	assert.Equal(t, prev, base)
}

// TestDeltaCodecRate: the host's codec rate as rdt/delta measures it
// (what delta="auto" weighs against the link) is a rate, and one reading
// stands between calls.
func TestDeltaCodecRate(t *testing.T) {
	r := DeltaCodecRate()
	assert.Greater(t, r, 1e6)
	assert.Equal(t, r, DeltaCodecRate())
}

// TestDeltaEncodeAdvance: the delta decodes as DeltaEncode's, and prev
// becomes cur.
func TestDeltaEncodeAdvance(t *testing.T) {
	prev := pattern(1 << 14)
	cur := bytes.Clone(prev)
	cur[100] ^= 0x40
	cur[9000] ^= 0x01
	kept := bytes.Clone(prev)
	out := make([]byte, DeltaBound(int64(len(cur))))
	n, changed, err := DeltaEncodeAdvance(prev, cur, out, 2)
	require.NoError(t, err)
	assert.EqualValues(t, 2, changed)
	assert.Equal(t, cur, prev)
	require.NoError(t, DeltaDecode(kept, out[:n]))
	assert.Equal(t, cur, kept)
	_, _, err = DeltaEncodeAdvance(prev, cur, out[:10], 2)
	assert.Equal(t, "invalid_argument", kindOf(err))
}
