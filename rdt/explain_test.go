package rdt

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// Explain names every candidate distinctly, stars exactly one, and refuses
// a destination Get would refuse (issue 19.5).
func TestExplainReadable(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	c := sameHostRuntime(t, p, nil)
	owner, _ := p.a.Spawn("owner")
	neighbour, _ := c.Spawn("neighbour")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)

	plan := neighbour.Explain(ref, tensor.GPUDevice(1))
	require.NoError(t, plan.Err)
	s := plan.String()
	t.Log("\n" + s)
	assert.Equal(t, 1, strings.Count(s, "\n  * "), "one chosen line")
	assert.Contains(t, s, "chosen p2p (cross-process)")
	assert.Contains(t, s, "p2p (in-process)")
	labels := map[string]bool{}
	for _, cand := range plan.Candidates {
		assert.False(t, labels[cand.Label()], "duplicate candidate %s", cand.Label())
		labels[cand.Label()] = true
	}

	bad := neighbour.Explain(ref, tensor.GPUDevice(9))
	assert.ErrorIs(t, bad.Err, ErrUnknownDevice)
	assert.Equal(t, "", bad.Chosen)
	assert.Contains(t, bad.String(), "chosen none")
	assert.NotContains(t, bad.String(), "\n  * ")
	_, err = neighbour.Get(ctx, ref, tensor.GPUDevice(9))
	assert.ErrorIs(t, err, ErrUnknownDevice, "Get and Explain agree")
}
