package demo

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunBroadcast(t *testing.T) {
	res, err := RunBroadcast(context.Background(), Config{Hosts: 3, Readers: 5, Tensors: 3, Steps: 3, Size: 256 << 10})
	require.NoError(t, err)
	assert.True(t, res.OK)
	assert.True(t, res.Simulated)
	require.Len(t, res.Steps, 3)
	for _, s := range res.Steps {
		assert.True(t, s.Verified)
		assert.Equal(t, 5, s.OK)
		assert.Equal(t, int64(3*256<<10), s.Bytes)
	}
	assert.Contains(t, res.Tree, "host leader")
}
