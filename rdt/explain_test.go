package rdt

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
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

// On a PCIe-only server the planner takes PCIe P2P under a switch and
// stages through host memory across the host bridge (issue 19.11).
func TestExplainPCIeOnlyServer(t *testing.T) {
	ctx := context.Background()
	cl, err := topology.Preset("rtx-pro-6000", 1)
	require.NoError(t, err)
	mk := func() *Runtime {
		r, err := New(ctx, Config{Cluster: cl, Host: "h0", IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 16 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { r.Shutdown(ctx) })
		return r
	}
	a, b := mk(), mk() // two processes of one host, as far as the planner knows
	owner, _ := a.Spawn("owner")
	other, _ := b.Spawn("other")
	x := fill(t, a, tensor.GPUDevice(0), tensor.Uint8, 1<<16)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	for _, tc := range []struct {
		actor  *Actor
		dst    int
		chosen string
		why    string
	}{
		{other, 1, "p2p", "PCIe peer-to-peer PIX"},
		{other, 2, "shm", ""},
		{other, 7, "shm", ""},
		{owner, 1, "p2p", "PCIe peer-to-peer PIX"},
		{owner, 4, "local", ""},
	} {
		plan := tc.actor.Explain(ref, tensor.GPUDevice(tc.dst))
		assert.Equal(t, tc.chosen, plan.Chosen, "gpu:0 -> gpu:%d\n%v", tc.dst, plan)
		assert.False(t, plan.Degraded, "%v", plan)
		assert.Contains(t, plan.String(), tc.why)
		got, xfer, err := tc.actor.Fetch(ctx, ref, tensor.GPUDevice(tc.dst))
		require.NoError(t, err)
		assert.Equal(t, tc.chosen, xfer.Stats.Transport)
		got.Release()
	}
}

// What Explain prints is the plan Get runs (issue 16.3): an owner that
// publishes no rdma address is ruled out of rdma in both, and a Get on the
// owner's own device is a zero-copy view in both.
func TestExplainIsWhatGetRuns(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 1<<16)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	require.Equal(t, "rdma", far.Explain(ref, tensor.GPUDevice(0)).Chosen)

	noRDMA := ref
	noRDMA.DataAddrs = map[string]string{"tcp": ref.DataAddrs["tcp"]}
	plan := far.Explain(noRDMA, tensor.GPUDevice(0))
	assert.Equal(t, "tcp", plan.Chosen, "%v", plan)
	assert.Contains(t, plan.String(), "publishes no rdma address")
	got, x2, err := far.Fetch(ctx, noRDMA, tensor.GPUDevice(0))
	require.NoError(t, err)
	defer got.Release()
	assert.Equal(t, plan.Chosen, x2.Plan.Chosen)
	assert.Equal(t, plan.Chosen, x2.Stats.Transport)
	assert.Equal(t, plan.Candidates, x2.Plan.Candidates)

	self := owner.Explain(ref, tensor.GPUDevice(0))
	assert.True(t, self.ZeroCopy, "%v", self)
	assert.Contains(t, self.String(), "zero-copy view")
	view, x3, err := owner.Fetch(ctx, ref, tensor.GPUDevice(0))
	require.NoError(t, err)
	defer view.Release()
	assert.True(t, x3.Stats.ZeroCopy)
	assert.Equal(t, self.Chosen, x3.Plan.Chosen)
	assert.False(t, owner.Explain(ref, tensor.GPUDevice(1)).ZeroCopy, "another device is a copy")
}
