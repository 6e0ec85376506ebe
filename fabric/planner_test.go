package fabric_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// fake is a transport that reaches everything and fails with err.
type fake struct {
	name  string
	err   error
	reads int
}

func (f *fake) Name() string { return f.name }
func (f *fake) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	return fabric.Cost{GBps: 1, Reason: "fake"}, true
}
func (f *fake) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	f.reads++
	return fabric.Stats{Transport: f.name, Bytes: src.Length}, f.err
}
func (f *fake) Close() error { return nil }

func TestParseSelection(t *testing.T) {
	tests := []struct {
		in          string
		allow, deny []string
		bad         bool
	}{
		{"", nil, nil, false},
		{"tcp,rdma", []string{"tcp", "rdma"}, nil, false},
		{"^shm", nil, []string{"shm"}, false},
		{" ^p2p, shm ", nil, []string{"p2p", "shm"}, false},
		{"TCP", []string{"tcp"}, nil, false},
		{"tcp,pigeon", nil, nil, true},
	}
	for _, tc := range tests {
		allow, deny, err := fabric.ParseSelection(tc.in)
		if tc.bad {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.allow, allow, tc.in)
		assert.Equal(t, tc.deny, deny, tc.in)
	}
}

func cluster(t *testing.T) *topology.Cluster {
	c, err := topology.Preset("dgx-h100", 2)
	require.NoError(t, err)
	return c
}

func TestPlanRanksAndExplains(t *testing.T) {
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Deny: []string{fabric.SHM}},
		&fake{name: fabric.TCP}, &fake{name: fabric.SHM}, &fake{name: fabric.P2P})
	require.NoError(t, err)
	src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	plan := p.Plan(src, fabric.Endpoint{Process: "b", Host: "h0", Device: tensor.GPUDevice(1)})
	assert.Equal(t, fabric.P2P, plan.Chosen)
	assert.Equal(t, fabric.P2P, plan.Best)
	assert.False(t, plan.Degraded)
	require.Len(t, plan.Candidates, 3)
	assert.Equal(t, []string{"p2p", "shm", "tcp"}, []string{plan.Candidates[0].Transport, plan.Candidates[1].Transport, plan.Candidates[2].Transport})
	assert.Equal(t, "denied by configuration", plan.Candidates[1].Reason)

	far := p.Plan(src, fabric.Endpoint{Process: "c", Host: "h1", Device: tensor.GPUDevice(0)})
	assert.Equal(t, topology.PathNET, far.Path.Class)
	assert.Equal(t, fabric.RDMA, far.Best)
	assert.Equal(t, fabric.P2P, far.Chosen, "the fake p2p reaches everything; the planner trusts Reach")

	_, err = fabric.NewPlanner(fabric.PlannerConfig{Allow: []string{"pigeon"}})
	assert.Error(t, err)
	none, _ := fabric.NewPlanner(fabric.PlannerConfig{Allow: []string{fabric.RDMA}}, &fake{name: fabric.TCP})
	plan = none.Plan(src, src)
	assert.Empty(t, plan.Chosen)
	_, _, err = none.Read(context.Background(), fabric.Remote{Endpoint: src}, src, nil)
	assert.ErrorIs(t, err, fabric.ErrNoPath)
}

func TestReadFallsBackAndCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := fabric.NewMetrics(reg)
	broken := &fake{name: fabric.P2P, err: fabric.ErrPeerClosed}
	good := &fake{name: fabric.TCP}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Metrics: m}, broken, good)
	require.NoError(t, err)
	src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	dst := fabric.Endpoint{Process: "b", Host: "h0", Device: tensor.GPUDevice(1)}
	st, plan, err := p.Read(context.Background(), fabric.Remote{Endpoint: src, Length: 10}, dst, nil)
	require.NoError(t, err)
	assert.Equal(t, fabric.TCP, st.Transport)
	assert.Equal(t, fabric.TCP, plan.Chosen)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Fallbacks.WithLabelValues("p2p", "tcp")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Degraded.WithLabelValues("p2p", "tcp")))
	assert.Equal(t, 2.0, testutil.ToFloat64(m.Transfers.WithLabelValues("p2p", "error")), "tried twice, then fell back")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Retries.WithLabelValues("p2p")))
	assert.Equal(t, 2, broken.reads)
	assert.Equal(t, 10.0, testutil.ToFloat64(m.Bytes.WithLabelValues("tcp")))
}

// flaky fails its first n reads.
type flaky struct {
	fake
	failures int
}

func (f *flaky) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	f.reads++
	if f.reads <= f.failures {
		return fabric.Stats{}, fabric.ErrStalled
	}
	return fabric.Stats{Transport: f.name, Bytes: src.Length}, nil
}

func TestReadRetriesAPassingFailureOnTheSamePath(t *testing.T) {
	tests := []struct {
		attempts, failures int
		want               string
	}{
		{attempts: 0, failures: 1, want: fabric.P2P}, // default: two tries
		{attempts: 3, failures: 2, want: fabric.P2P},
		{attempts: 1, failures: 1, want: fabric.TCP},
		{attempts: 2, failures: 5, want: fabric.TCP},
	}
	for _, tc := range tests {
		first := &flaky{fake: fake{name: fabric.P2P}, failures: tc.failures}
		p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Attempts: tc.attempts, RetryBackoff: time.Millisecond}, first, &fake{name: fabric.TCP})
		require.NoError(t, err)
		src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
		st, _, err := p.Read(context.Background(), fabric.Remote{Endpoint: src}, fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(1)}, nil)
		require.NoError(t, err)
		assert.Equal(t, tc.want, st.Transport, "%+v", tc)
	}
}

// pusher is a fake that can also push.
type pusher struct{ fake }

func (p *pusher) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	p.reads++
	return fabric.Stats{Transport: p.name, Bytes: dst.Length}, p.err
}

func TestWriteUsesOnlyTransportsThatPush(t *testing.T) {
	pullOnly := &fake{name: fabric.P2P}
	push := &pusher{fake: fake{name: fabric.TCP}}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t)}, pullOnly, push)
	require.NoError(t, err)
	src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	dst := fabric.Remote{Endpoint: fabric.Endpoint{Process: "b", Host: "h0", Device: tensor.GPUDevice(1)}, Length: 7}
	st, plan, err := p.Write(context.Background(), src, nil, dst)
	require.NoError(t, err)
	assert.Equal(t, fabric.TCP, st.Transport)
	assert.True(t, plan.Degraded)
	assert.Equal(t, 0, pullOnly.reads)
	assert.Contains(t, plan.String(), "cannot push")
}

// A write plan made once runs for many pieces (a broadcast edge's chunks):
// each run moves its own offset and length, falls back as Write does, and
// leaves the plan it was given usable for the next.
func TestRunWriteReusesAPlan(t *testing.T) {
	first := &pusher{fake: fake{name: fabric.P2P, err: errors.New("link reset")}}
	second := &pusher{fake: fake{name: fabric.TCP}}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Attempts: 1}, first, second)
	require.NoError(t, err)
	src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	dst := fabric.Remote{Endpoint: fabric.Endpoint{Process: "b", Host: "h0", Device: tensor.GPUDevice(1)}}
	plan := p.PlanWrite(src, dst)
	require.Equal(t, fabric.P2P, plan.Chosen)
	for i, n := range []int64{64 << 10, 4096} {
		at := dst
		at.Offset, at.Length = int64(i)<<16, n
		run := plan
		st, err := p.RunWrite(context.Background(), &run, nil, at)
		require.NoError(t, err)
		assert.Equal(t, n, st.Bytes)
		assert.Equal(t, fabric.TCP, run.Chosen, "fell back")
	}
	assert.Equal(t, fabric.P2P, plan.Chosen, "the edge's plan is not changed by its runs")
	assert.Equal(t, 2, first.reads)
	assert.Equal(t, 2, second.reads)
}

func TestTerminalErrorsDoNotFallBack(t *testing.T) {
	for _, terminal := range []error{fabric.ErrUnauthorized, fabric.ErrObjectFreed, tensor.ErrOutOfMemory, context.Canceled} {
		first := &fake{name: fabric.P2P, err: terminal}
		second := &fake{name: fabric.TCP}
		p, _ := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t)}, first, second)
		src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
		_, _, err := p.Read(context.Background(), fabric.Remote{Endpoint: src}, fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(1)}, nil)
		assert.ErrorIs(t, err, terminal)
		var pe *fabric.PathError
		assert.True(t, errors.As(err, &pe))
		assert.Equal(t, 0, second.reads, "no fallback after %v", terminal)
	}
}

func TestCheckRange(t *testing.T) {
	assert.NoError(t, fabric.CheckRange(0, 10, 10))
	assert.NoError(t, fabric.CheckRange(10, 0, 10))
	for _, c := range [][3]int64{{-1, 1, 10}, {0, 11, 10}, {11, 0, 10}, {5, -1, 10}, {1 << 62, 1 << 62, 10}} {
		assert.ErrorIs(t, fabric.CheckRange(c[0], c[1], c[2]), fabric.ErrBadRequest, "%v", c)
	}
}

// addressed is a pusher that reaches the other side only through the data
// address the remote publishes under its name.
type addressed struct{ pusher }

func (a *addressed) AddressOf(r fabric.Remote) string { return r.Addrs[a.name] }

// A remote that does not serve a transport (its ref names no address for
// it) rules that transport out up front: no attempt, no retry, no
// fallback warning, in both directions.
func TestTransportsWithoutTheRemotesAddressAreNotTried(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := fabric.NewMetrics(reg)
	rdma := &addressed{pusher{fake{name: fabric.RDMA}}}
	tcp := &addressed{pusher{fake{name: fabric.TCP}}}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Metrics: m}, rdma, tcp)
	require.NoError(t, err)
	h0 := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	h1 := fabric.Endpoint{Process: "b", Host: "h1", Device: tensor.GPUDevice(0)}
	tcpOnly := map[string]string{fabric.TCP: "127.0.0.1:1"}

	st, plan, err := p.Read(context.Background(), fabric.Remote{Endpoint: h0, Addrs: tcpOnly, Length: 3}, h1, nil)
	require.NoError(t, err)
	assert.Equal(t, fabric.TCP, st.Transport)
	assert.Equal(t, fabric.TCP, plan.Chosen)
	assert.True(t, plan.Degraded, "rdma is the best path the topology allows")
	assert.Contains(t, plan.String(), "the owner publishes no rdma address")

	st, plan, err = p.Write(context.Background(), h0, nil, fabric.Remote{Endpoint: h1, Addrs: tcpOnly, Length: 3})
	require.NoError(t, err)
	assert.Equal(t, fabric.TCP, st.Transport)
	assert.Contains(t, plan.String(), "the destination publishes no rdma address")

	assert.Equal(t, 0, rdma.reads, "rdma was never tried")
	assert.Equal(t, 0.0, testutil.ToFloat64(m.Retries.WithLabelValues(fabric.RDMA)))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.Fallbacks.WithLabelValues(fabric.RDMA, fabric.TCP)))

	_, _, err = p.Read(context.Background(), fabric.Remote{Endpoint: h0, Length: 3}, h1, nil)
	assert.ErrorIs(t, err, fabric.ErrNoPath, "a remote that publishes no address at all has no path")
}

// A transport that finds no path (ErrNoPath) is not tried a second time.
func TestNoPathIsNotRetried(t *testing.T) {
	first := &fake{name: fabric.P2P, err: fabric.ErrNoPath}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Attempts: 3}, first, &fake{name: fabric.TCP})
	require.NoError(t, err)
	src := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	st, _, err := p.Read(context.Background(), fabric.Remote{Endpoint: src}, fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(1)}, nil)
	require.NoError(t, err)
	assert.Equal(t, fabric.TCP, st.Transport)
	assert.Equal(t, 1, first.reads)
}

// viewer is a same-process transport that hands out the owner's memory.
type viewer struct {
	fake
	views int
}

func (v *viewer) View(ctx context.Context, src fabric.Remote) (tensor.Buffer, error) {
	v.views++
	return nil, v.err
}

// The plan is one value: PlanRead decides zero-copy, Fetch runs it without
// allocating; a plan that is not zero-copy allocates and reads; PlanView
// keeps only transports that can map.
func TestFetchRunsThePlanItIsGiven(t *testing.T) {
	local := &viewer{fake: fake{name: fabric.Local}}
	tcp := &fake{name: fabric.TCP}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t)}, local, tcp)
	require.NoError(t, err)
	gpu0 := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.GPUDevice(0)}
	gpu1 := gpu0
	gpu1.Device = tensor.GPUDevice(1)
	allocs := 0
	alloc := func(ctx context.Context, n int64) (tensor.Buffer, error) {
		allocs++
		return nil, nil
	}

	plan := p.PlanRead(fabric.Remote{Endpoint: gpu0, Length: 8}, gpu0)
	require.True(t, plan.ZeroCopy, "%v", plan)
	_, st, err := p.Fetch(context.Background(), &plan, fabric.Remote{Endpoint: gpu0, Length: 8}, alloc)
	require.NoError(t, err)
	assert.True(t, st.ZeroCopy)
	assert.Equal(t, []int{1, 0, 0}, []int{local.views, local.reads, allocs})

	plan = p.PlanRead(fabric.Remote{Endpoint: gpu0, Length: 8}, gpu1)
	require.False(t, plan.ZeroCopy, "another device gets a copy")
	_, st, err = p.Fetch(context.Background(), &plan, fabric.Remote{Endpoint: gpu0, Length: 8}, alloc)
	require.NoError(t, err)
	assert.False(t, st.ZeroCopy)
	assert.Equal(t, []int{1, 1, 1}, []int{local.views, local.reads, allocs})

	view := p.PlanView(fabric.Remote{Endpoint: gpu0, Length: 8}, gpu1)
	assert.Equal(t, fabric.Local, view.Chosen)
	assert.Contains(t, view.String(), "copies only")
}
