package rdt_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// PlanBroadcastTree, from the topology alone, gives the tree a running
// owner's ExplainBroadcast gives for the same slots: same parents, same
// leaders, same endpoints (the paths are left to the caller).
func TestPlanBroadcastTreeIsExplainBroadcast(t *testing.T) {
	ctx := context.Background()
	cluster, err := topology.Preset("dgx-h100", 3)
	require.NoError(t, err)
	var rts []*rdt.Runtime
	for _, h := range []string{"h0", "h1", "h2"} {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: h, IgnoreEnv: true, RuntimeDir: t.TempDir()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = r.Shutdown(ctx) })
		rts = append(rts, r)
	}
	owner, err := rts[0].Spawn("owner")
	require.NoError(t, err)
	gpu0, err := rts[0].Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	w, err := tensor.Alloc(ctx, gpu0, tensor.BFloat16, 64, 64)
	require.NoError(t, err)
	src, err := owner.Put(ctx, w)
	require.NoError(t, err)
	var refs []rdt.Ref
	var eps []topology.Endpoint
	// Out of order on purpose: h2's GPUs first, then the owner's own host
	// and h1, each host's devices unsorted.
	for _, p := range []struct{ rt, gpu int }{{2, 3}, {2, 0}, {0, 5}, {1, 2}, {1, 1}, {0, 1}} {
		r := rts[p.rt]
		if p.rt != 0 {
			require.NoError(t, r.Connect(ctx, rts[0].AddrInfo()))
		}
		a, err := r.Spawn(fmt.Sprintf("reader-%d-%d", p.rt, p.gpu))
		require.NoError(t, err)
		s, err := a.Reserve(ctx, src.Desc, tensor.GPUDevice(p.gpu))
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		refs = append(refs, s.Ref())
		eps = append(eps, topology.Endpoint{Host: fmt.Sprintf("h%d", p.rt), Device: p.gpu})
	}
	want := owner.ExplainBroadcast(src, refs)
	got, err := rdt.PlanBroadcastTree(cluster, topology.Endpoint{Host: "h0", Device: 0}, eps)
	require.NoError(t, err)
	require.Equal(t, want.Owner, got.Owner)
	require.Len(t, got.Nodes, len(want.Nodes))
	for i := range want.Nodes {
		w, g := want.Nodes[i], got.Nodes[i]
		require.Equal(t, w.Endpoint, g.Endpoint, "reader %d", i)
		require.Equal(t, w.Parent, g.Parent, "reader %d", i)
		require.Equal(t, w.Leader, g.Leader, "reader %d", i)
		require.Equal(t, "none", g.Path, "reader %d: no transport runs", i)
	}

	_, err = rdt.PlanBroadcastTree(cluster, topology.Endpoint{Host: "h9"}, eps)
	require.ErrorIs(t, err, rdt.ErrUnknownDevice)
	_, err = rdt.PlanBroadcastTree(cluster, topology.Endpoint{Host: "h0"}, []topology.Endpoint{{Host: "h1", Device: 99}})
	require.ErrorIs(t, err, rdt.ErrUnknownDevice)
	require.Equal(t, 4, rdt.BroadcastConfig{}.Defaults().Window)
	require.Equal(t, int64(4<<20), rdt.BroadcastConfig{}.Defaults().ChunkSize)
}
