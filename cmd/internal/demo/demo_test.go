package demo

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	rows := 0
	var baseline float64
	res, err := Run(context.Background(), Config{Hosts: 2, Readers: 4, Tensors: 3, Steps: 2, Size: 1 << 20},
		func(gbps float64) { baseline = gbps }, func(Transfer) { rows++ })
	require.NoError(t, err)
	assert.True(t, res.OK)
	assert.True(t, res.Simulated)
	assert.Equal(t, "dgx-h100", res.Preset, "the default preset")
	assert.Positive(t, baseline)
	assert.Equal(t, baseline, res.MemcpyGBps)
	require.Len(t, res.Transfers, 8)
	assert.Equal(t, 8, rows, "every transfer is reported as it completes")
	paths := map[string]int{}
	for _, tr := range res.Transfers {
		assert.True(t, tr.Verified)
		assert.Equal(t, int64(3<<20), tr.Bytes)
		assert.Positive(t, tr.VsMemcpy)
		paths[tr.Path]++
	}
	assert.Equal(t, map[string]int{"p2p": 4, "rdma": 4}, paths, "same-host readers use the NVLink path, others rdma (simulated NICs)")
}

func TestBadConfig(t *testing.T) {
	_, err := Run(context.Background(), Config{Preset: "nope"}, nil, nil)
	assert.Error(t, err)
	for _, c := range []Config{
		{Hosts: -1},
		{Readers: -1},
		{Size: 7},
	} {
		_, err := Run(context.Background(), c, nil, nil)
		assert.ErrorIs(t, err, ErrBadConfig, "%+v", c)
		_, err = RunBroadcast(context.Background(), c)
		assert.ErrorIs(t, err, ErrBadConfig, "%+v", c)
	}
}
