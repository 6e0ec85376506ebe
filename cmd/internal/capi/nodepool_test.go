package capi

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/tensor/nodepool"
)

// TestNodePool: a slab runtime takes its first slab from the node's helper
// (in this process here) and counts it; with node_pool_bytes negative it
// has no pool; with no helper and none to start, it makes its slab
// itself and counts the fallback.
func TestNodePool(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	t.Setenv(EnvNodePool, "")
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = nodepool.Serve(ctx, nodepool.Config{Socket: nodepool.SocketPath(dir), Budget: 32 << 20})
	}()
	// Host h1's helper, in the same directory: a runtime that names its
	// host asks that host's helper (simulated hosts share a kernel).
	servedH1 := make(chan struct{})
	go func() {
		defer close(servedH1)
		_ = nodepool.Serve(ctx, nodepool.Config{Socket: nodepool.HostSocketPath(dir, "h1"), Budget: 16 << 20})
	}()
	t.Cleanup(func() { cancel(); <-served; <-servedH1 })

	cases := []struct {
		name   string
		config string
		want   func(t *testing.T, np *NodePool)
	}{
		{"served", `{"slabs":true,"cluster_key":"` + slabKey + `","runtime_dir":"` + dir + `","slab_bytes":4194304}`, func(t *testing.T, np *NodePool) {
			require.NotNil(t, np)
			assert.True(t, np.Connected)
			assert.EqualValues(t, 1, np.Hits)
			assert.GreaterOrEqual(t, np.Taken, int64(8<<20))
		}},
		{"per host", `{"slabs":true,"cluster_key":"` + slabKey + `","runtime_dir":"` + dir + `","slab_bytes":4194304,"hosts":2,"host":"h1"}`, func(t *testing.T, np *NodePool) {
			require.NotNil(t, np)
			assert.True(t, np.Connected)
			assert.EqualValues(t, 1, np.Hits)
			assert.LessOrEqual(t, np.Ready, int64(16<<20), "h1's helper (16 MiB), not the unnamed host's (32 MiB)")
		}},
		{"off", `{"slabs":true,"cluster_key":"` + slabKey + `","runtime_dir":"` + dir + `","node_pool_bytes":-1}`, func(t *testing.T, np *NodePool) {
			assert.Nil(t, np)
		}},
		{"absent", `{"slabs":true,"cluster_key":"` + slabKey + `","runtime_dir":"` + t.TempDir() + `"}`, func(t *testing.T, np *NodePool) {
			require.NotNil(t, np)
			assert.False(t, np.Connected)
			assert.EqualValues(t, 1, np.Absent)
			assert.Zero(t, np.Hits)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib := New()
			h, err := lib.NewRuntime(context.Background(), []byte(tc.config))
			require.NoError(t, err)
			defer lib.CloseAll(context.Background())
			r, err := lib.Runtime(h)
			require.NoError(t, err)
			if full := map[string]int64{"served": 32 << 20, "per host": 16 << 20}[tc.name]; full > 0 { // the client connects in the background; the pool fills
				deadline := time.Now().Add(20 * time.Second)
				for np := r.Stats().NodePool; (!np.Connected || np.Ready < full) && time.Now().Before(deadline); np = r.Stats().NodePool {
					time.Sleep(10 * time.Millisecond)
				}
			}
			p, err := r.Alloc(context.Background(), 8<<20)
			require.NoError(t, err)
			tc.want(t, r.Stats().NodePool)
			assert.EqualValues(t, 1, r.Stats().HostMemory.SlabCount)
			require.NoError(t, r.FreeMemory(p))
		})
	}
}
