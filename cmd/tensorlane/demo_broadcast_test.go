package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDemoBroadcast(t *testing.T) {
	var out bytes.Buffer
	err := runDemoBroadcast(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 3, readers: 5, tensors: 3, steps: 3, size: "256KiB", json: true})
	require.NoError(t, err)
	var res demoBroadcastResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	assert.True(t, res.OK)
	assert.True(t, res.Simulated)
	require.Len(t, res.Steps, 3)
	for _, s := range res.Steps {
		assert.True(t, s.Verified)
		assert.Equal(t, 5, s.OK)
	}
	assert.Contains(t, res.Tree, "host leader")

	out.Reset()
	require.NoError(t, runDemoBroadcast(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 2, readers: 2, tensors: 1, steps: 1, size: "64KiB"}))
	assert.Contains(t, out.String(), "broadcast tree")
}
