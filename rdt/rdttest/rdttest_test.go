package rdttest

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestForge(t *testing.T) {
	_, owner := testhelp.Key(t)
	orig := rdt.Ref{Object: [16]byte{1}, Owner: owner, Incarnation: 7, Host: "h0", Device: tensor.GPUDevice(2),
		Desc: tensor.NewDesc(tensor.Float32, 4, 4), Token: []byte("0123456789abcdef")}
	b, err := orig.MarshalBinary()
	require.NoError(t, err)
	enc := base64.StdEncoding.EncodeToString(b)

	forged := Forge(t, enc, func(r *rdt.Ref) { r.Token[0] ^= 1; r.Incarnation++ })
	raw, err := base64.StdEncoding.DecodeString(forged)
	require.NoError(t, err)
	got, err := rdt.ParseRef(raw)
	require.NoError(t, err)
	assert.Equal(t, byte('0'^1), got.Token[0])
	assert.Equal(t, uint64(8), got.Incarnation)
	assert.Equal(t, orig.Object, got.Object)
	assert.Equal(t, orig.Desc, got.Desc)
}
