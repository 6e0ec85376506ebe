package capi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReshardPlanJSON: a plan from splits and from explicit shards, and
// bad requests refused as invalid arguments.
func TestReshardPlanJSON(t *testing.T) {
	p, err := ReshardPlan([]byte(`{"shape":[8,6],"elem_size":2,"from":{"split":[0,2]},"to":{"split":[1,3]}}`))
	require.NoError(t, err)
	assert.Len(t, p.Moves, 6)
	assert.Equal(t, int64(96), p.Bytes)
	assert.Equal(t, []int64{48, 48}, p.SrcBytes)
	assert.Equal(t, int64(4), p.Moves[0].Runs[0].Count)
	assert.Contains(t, p.Explain, "destination 2")
	p, err = ReshardPlan([]byte(`{"shape":[4,4],"elem_size":4,"from":{"shards":[{"start":[0,0],"end":[4,2]},{"start":[0,2],"end":[4,4]}]},"to":{"split":[0,1]}}`))
	require.NoError(t, err)
	assert.Len(t, p.Moves, 2)
	for _, bad := range []string{
		`{"shape":[4,4],"elem_size":4,"from":{"split":[0,9]},"to":{"split":[0,1]}}`,
		`{"shape":[4,4],"elem_size":4,"from":{},"to":{"split":[0,1]}}`,
		`{"shape":[4,4],"elem_size":4,"from":{"shards":[{"start":[0,0],"end":[3,4]}]},"to":{"split":[0,1]}}`,
		`{"shape":[4,4],"elem_size":4,"from":{"split":[0,1]},"to":{"split":[0,1]},"extra":1}`,
		`nope`,
	} {
		_, err := ReshardPlan([]byte(bad))
		assert.Equal(t, "invalid_argument", kindOf(err), bad)
	}
}
