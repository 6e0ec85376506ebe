package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDemoJSON(t *testing.T) {
	var out bytes.Buffer
	err := runDemo(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 2, readers: 4, tensors: 3, steps: 2, size: "1MiB", json: true})
	require.NoError(t, err)
	var res demoResult
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	assert.True(t, res.OK)
	assert.True(t, res.Simulated)
	require.Len(t, res.Transfers, 8)
	paths := map[string]int{}
	for _, tr := range res.Transfers {
		assert.True(t, tr.Verified)
		assert.Equal(t, int64(3<<20), tr.Bytes)
		paths[tr.Path]++
	}
	assert.Equal(t, map[string]int{"p2p": 4, "rdma": 4}, paths, "same-host readers use the NVLink path, others rdma (simulated NICs)")
}

func TestDemoTable(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runDemo(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 1, readers: 2, tensors: 1, steps: 1, size: "64KiB"}))
	assert.Contains(t, out.String(), "verified")
	assert.Contains(t, out.String(), "simulated")
}

func TestDemoBadFlags(t *testing.T) {
	var out bytes.Buffer
	assert.Error(t, runDemo(context.Background(), &out, demoOptions{preset: "nope", hosts: 1, readers: 1, tensors: 1, steps: 1, size: "1MiB"}))
	assert.Error(t, runDemo(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 1, readers: 1, tensors: 1, steps: 1, size: "lots"}))
	assert.Error(t, runDemo(context.Background(), &out, demoOptions{preset: "dgx-h100", hosts: 0, readers: 1, tensors: 1, steps: 1, size: "1MiB"}))
}
