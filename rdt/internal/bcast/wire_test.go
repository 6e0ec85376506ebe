package bcast

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// raw stands for rdt.Ref: a child is its marshalled bytes.
type raw []byte

func (r raw) MarshalBinary() ([]byte, error) {
	if string(r) == "bad" {
		return nil, errors.New("does not marshal")
	}
	return r, nil
}

func parseRaw(p []byte) (raw, error) {
	if len(p) == 0 {
		return nil, errors.New("empty ref")
	}
	return raw(bytes.Clone(p)), nil
}

// The bytes of a children notice, as rdt encoded them before the codec
// moved here (rdt's bcastMsg.marshal at b1b05d1; the child is an rdt.Ref's
// MarshalBinary of that version): the wire is unchanged.
const (
	goldenRef = "5452010102030000000000000000000000000004706565720700000268310367707502080000000003746f6b"
	goldenMsg = "0409080700000000000000000000000000050000000000000000000000000000000302746b808040b96001630600000000000000000000000000000003776879012c5452010102030000000000000000000000000004706565720700000268310367707502080000000003746f6b0204000000000000000000000000000000016105080000000000000000000000000000000000808080808020000201ac02"
)

func golden(t *testing.T) Msg[raw] {
	ref, err := hex.DecodeString(goldenRef)
	require.NoError(t, err)
	return Msg[raw]{Kind: ctlwire.Children, ID: ID{9, 8, 7}, Slot: fabric.ObjectID{5}, Inc: 3, Token: []byte("tk"), Off: 1 << 20, N: 12345, Gen: 1,
		OriginInc: 99, Failed: fabric.ObjectID{6}, Text: "why", Children: []raw{ref},
		Items: []Item{{Slot: fabric.ObjectID{4}, Token: []byte("a"), N: 5, DType: tensor.BFloat16}, {N: 1 << 40}}, Gens: []uint64{1, 300}}
}

func TestMsgWireUnchanged(t *testing.T) {
	m := golden(t)
	p, err := m.Marshal()
	require.NoError(t, err)
	assert.Equal(t, goldenMsg, hex.EncodeToString(p))
	got, err := ParseMsg(p, parseRaw)
	require.NoError(t, err)
	assert.Equal(t, m, got)
}

func TestMsgMalformed(t *testing.T) {
	p, err := golden(t).Marshal()
	require.NoError(t, err)
	for _, bad := range [][]byte{nil, {0}, {9}, {ctlwire.PushBatch}, p[:len(p)-1], append(bytes.Clone(p), 0)} {
		_, err := ParseMsg(bad, parseRaw)
		assert.ErrorIs(t, err, ErrMalformed, "%x", bad)
	}
	// A child that does not parse is the ref parser's error, as it is.
	empty := golden(t)
	empty.Children = []raw{{}}
	q, err := empty.Marshal()
	require.NoError(t, err)
	_, err = ParseMsg(q, parseRaw)
	assert.EqualError(t, err, "empty ref")
	// Bounds: more children than a reader forwards to, a range past 2^62.
	many := golden(t)
	many.Children = make([]raw, MaxChildren+1)
	for i := range many.Children {
		many.Children[i] = raw{1}
	}
	q, err = many.Marshal()
	require.NoError(t, err)
	_, err = ParseMsg(q, parseRaw)
	assert.ErrorIs(t, err, ErrMalformed)
	huge := Msg[raw]{Kind: ctlwire.Chunk, Off: 1<<62 + 1}
	q, err = huge.Marshal()
	require.NoError(t, err)
	_, err = ParseMsg(q, parseRaw)
	assert.ErrorIs(t, err, ErrMalformed)

	bad := golden(t)
	bad.Children = []raw{raw("bad")}
	_, err = bad.Marshal()
	assert.EqualError(t, err, "does not marshal")
}

func FuzzMsg(f *testing.F) {
	p, _ := Msg[raw]{Kind: ctlwire.Chunk, Off: 1 << 20, N: 1 << 20, Token: []byte("t")}.Marshal()
	f.Add(p)
	f.Add([]byte{ctlwire.Report})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := ParseMsg(p, parseRaw)
		if err != nil {
			return
		}
		q, err := m.Marshal()
		require.NoError(t, err)
		m2, err := ParseMsg(q, parseRaw)
		require.NoError(t, err)
		assert.Equal(t, m, m2)
	})
}
