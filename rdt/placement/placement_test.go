package placement

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// placementFixture is a 2-host dgx-h100 cluster with a real runtime per
// host and a scheduler over the same topology.
type placementFixture struct {
	p        pair
	runtimes map[string]*rdt.Runtime
	s        *sched.Scheduler
}

type pair struct {
	cluster *topology.Cluster
	a, b    *rdt.Runtime
}

func newRuntime(t *testing.T, cl *topology.Cluster, host string) *rdt.Runtime {
	t.Helper()
	ctx := context.Background()
	r, err := rdt.New(ctx, rdt.Config{Cluster: cl, Host: host, IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 256 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { r.Shutdown(ctx) })
	return r
}

func newPlacementFixture(t *testing.T) placementFixture {
	t.Helper()
	cl, err := topology.Preset("dgx-h100", 2)
	require.NoError(t, err)
	p := pair{cluster: cl, a: newRuntime(t, cl, "h0"), b: newRuntime(t, cl, "h1")}
	s, err := sched.New(p.cluster, sched.Config{})
	require.NoError(t, err)
	return placementFixture{p: p, runtimes: map[string]*rdt.Runtime{"h0": p.a, "h1": p.b}, s: s}
}

// threeBundles needs both hosts: 4 + 4 + 2 GPUs with pipeline traffic.
func threeBundles() sched.Request {
	return sched.Request{
		Bundles: []sched.Bundle{{Kind: topology.KindGPU, Devices: 4}, {Kind: topology.KindGPU, Devices: 4}, {Kind: topology.KindGPU, Devices: 2}},
		Traffic: []sched.Flow{{From: 0, To: 1, Gbps: 800}, {From: 1, To: 2, Gbps: 800}},
	}
}

func actorNames(r *rdt.Runtime) []string { return r.Actors() }

func TestSpawn(t *testing.T) {
	ctx := context.Background()
	f := newPlacementFixture(t)
	pl, err := f.s.Place(threeBundles())
	require.NoError(t, err)
	actors, err := Spawn(ctx, pl, f.runtimes, func(b int) string { return fmt.Sprintf("stage%d", b) })
	require.NoError(t, err)
	require.Len(t, actors, 3)
	hosts := map[string]bool{}
	for _, as := range pl.Assignments {
		a := actors[as.Bundle]
		assert.Equal(t, fmt.Sprintf("stage%d", as.Bundle), a.Name())
		assert.Equal(t, as.Host, a.Runtime().HostID(), "bundle %d runs on the runtime that claims its host", as.Bundle)
		want := []tensor.DeviceID{tensor.HostDevice}
		for _, d := range as.Devices {
			want = append(want, tensor.GPUDevice(d))
		}
		assert.Equal(t, want, a.Devices(), "bundle %d is limited to its devices", as.Bundle)
		hosts[as.Host] = true
	}
	require.Len(t, hosts, 2, "10 GPUs need both hosts")

	// The actors work where they were put: stage0 publishes on its first
	// device, stage1 and stage2 read onto theirs, over the path the
	// topology gives (p2p on one host, tcp across hosts).
	dev := func(b, i int) tensor.DeviceID { return tensor.GPUDevice(pl.Assignments[b].Devices[i]) }
	x := testhelp.Fill(t, actors[0].Runtime(), dev(0, 0), tensor.BFloat16, 512, 1024)
	ref, err := actors[0].Put(ctx, x)
	require.NoError(t, err)
	for _, b := range []int{1, 2} {
		got, xfer, err := actors[b].Fetch(ctx, ref, dev(b, 0))
		require.NoError(t, err)
		testhelp.SameBytes(t, x, got)
		wantPath := fabric.RDMA
		if pl.Assignments[b].Host == pl.Assignments[0].Host {
			wantPath = fabric.P2P
		}
		assert.Equal(t, wantPath, xfer.Stats.Transport, "bundle %d", b)
		require.NoError(t, got.Release())
	}
	// A device the scheduler did not give the actor is refused.
	var other tensor.DeviceID
	for i := 0; i < 8; i++ {
		if d := tensor.GPUDevice(i); !containsDev(actors[1].Devices(), d) {
			other = d
			break
		}
	}
	_, err = actors[1].Get(ctx, ref, other)
	require.ErrorIs(t, err, rdt.ErrUnknownDevice)
	require.NoError(t, actors[0].Free(ctx, ref))
}

func containsDev(ds []tensor.DeviceID, d tensor.DeviceID) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}

// TestSpawnAllOrNothing: every failure leaves no actor behind
// (the names are free again) and says why with a typed error.
func TestSpawnAllOrNothing(t *testing.T) {
	ctx := context.Background()
	f := newPlacementFixture(t)
	good, err := f.s.Place(threeBundles())
	require.NoError(t, err)
	name := func(b int) string { return fmt.Sprintf("w%d", b) }
	// The host of the last bundle, so that a failure there comes after
	// earlier bundles were checked (and, for a closed runtime, spawned).
	lastHost := good.Assignments[2].Host
	require.NotEqual(t, lastHost, good.Assignments[0].Host, "bundle 0 must spawn before the last one fails, so the undo is exercised")

	tests := []struct {
		name     string
		mutate   func(p *sched.Placement, rts map[string]*rdt.Runtime) (func(int) string, func())
		ctx      func() context.Context
		want     error
		wantText string
	}{
		{name: "infeasible placement", want: sched.ErrInfeasible,
			mutate: func(p *sched.Placement, _ map[string]*rdt.Runtime) (func(int) string, func()) {
				*p = sched.Placement{Reasons: []string{"needs 16 GPUs in one host; the largest free has 8"}}
				return name, nil
			}},
		{name: "host without a runtime", want: ErrNoRuntime,
			mutate: func(_ *sched.Placement, rts map[string]*rdt.Runtime) (func(int) string, func()) {
				delete(rts, lastHost)
				return name, nil
			}},
		{name: "runtime filed under the wrong host", want: ErrInvalidPlacement,
			mutate: func(_ *sched.Placement, rts map[string]*rdt.Runtime) (func(int) string, func()) {
				rts["h0"], rts["h1"] = rts["h1"], rts["h0"]
				return name, nil
			}},
		{name: "unknown device", want: rdt.ErrUnknownDevice,
			mutate: func(p *sched.Placement, _ map[string]*rdt.Runtime) (func(int) string, func()) {
				p.Assignments[2].Devices = []int{42}
				return name, nil
			}},
		{name: "device twice", want: ErrInvalidPlacement,
			mutate: func(p *sched.Placement, _ map[string]*rdt.Runtime) (func(int) string, func()) {
				d := p.Assignments[2].Devices[0]
				p.Assignments[2].Devices = []int{d, d}
				return name, nil
			}},
		{name: "bundle twice", want: ErrInvalidPlacement,
			mutate: func(p *sched.Placement, _ map[string]*rdt.Runtime) (func(int) string, func()) {
				p.Assignments[2].Bundle = 1
				return name, nil
			}},
		{name: "empty name", want: ErrInvalidPlacement,
			mutate: func(*sched.Placement, map[string]*rdt.Runtime) (func(int) string, func()) {
				return func(b int) string { return map[int]string{0: "a", 1: "b"}[b] }, nil
			}},
		{name: "same name twice on one host", want: ErrInvalidPlacement,
			mutate: func(p *sched.Placement, _ map[string]*rdt.Runtime) (func(int) string, func()) {
				// Put bundle 2 on bundle 0's host with bundle 0's name.
				p.Assignments[2].Host = p.Assignments[0].Host
				return func(b int) string { return name(b % 2) }, nil
			}},
		{name: "name taken on the runtime", want: ErrActorExists,
			mutate: func(_ *sched.Placement, rts map[string]*rdt.Runtime) (func(int) string, func()) {
				a, err := rts[lastHost].Spawn("w2")
				require.NoError(t, err)
				return name, a.Stop
			}},
		{name: "runtime shut down", want: rdt.ErrClosed,
			mutate: func(_ *sched.Placement, rts map[string]*rdt.Runtime) (func(int) string, func()) {
				// A third runtime for the last bundle's host, shut down:
				// the first bundles spawn, the last fails, all are undone.
				cfg := rdt.Config{Cluster: f.p.cluster, Host: lastHost, IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 1 << 20}
				r, err := rdt.New(ctx, cfg)
				require.NoError(t, err)
				require.NoError(t, r.Shutdown(ctx))
				rts[lastHost] = r
				return name, nil
			}},
		{name: "context cancelled", want: context.Canceled,
			ctx: func() context.Context {
				c, cancel := context.WithCancel(ctx)
				cancel()
				return c
			},
			mutate: func(*sched.Placement, map[string]*rdt.Runtime) (func(int) string, func()) { return name, nil }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := good
			p.Assignments = nil
			for _, a := range good.Assignments {
				a.Devices = append([]int(nil), a.Devices...)
				p.Assignments = append(p.Assignments, a)
			}
			rts := map[string]*rdt.Runtime{"h0": f.p.a, "h1": f.p.b}
			nm, cleanup := tc.mutate(&p, rts)
			if cleanup != nil {
				defer cleanup()
			}
			c := ctx
			if tc.ctx != nil {
				c = tc.ctx()
			}
			before := map[*rdt.Runtime][]string{f.p.a: actorNames(f.p.a), f.p.b: actorNames(f.p.b)}
			actors, err := Spawn(c, p, rts, nm)
			require.Error(t, err)
			assert.Nil(t, actors)
			assert.True(t, errors.Is(err, tc.want), "got %v, want %v", err, tc.want)
			for r, names := range before {
				assert.ElementsMatch(t, names, actorNames(r), "no actor stays spawned on %s", r.HostID())
			}
		})
	}
	// After all that, the real thing still works with the same names.
	actors, err := Spawn(ctx, good, f.runtimes, name)
	require.NoError(t, err)
	require.Len(t, actors, 3)
}

// ExampleSpawn places a two-stage pipeline with sched and spawns
// its actors on the runtimes of a two-host cluster.
func ExampleSpawn() {
	ctx := context.Background()
	cl, _ := topology.Preset("dgx-h100", 2)
	runtimes := map[string]*rdt.Runtime{}
	for _, h := range cl.Hosts {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cl, Host: h.ID, IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 1 << 20})
		if err != nil {
			panic(err)
		}
		defer r.Shutdown(ctx)
		runtimes[h.ID] = r
	}
	s, _ := sched.New(cl, sched.Config{})
	p, err := s.Place(sched.Request{
		Bundles: []sched.Bundle{{Kind: topology.KindGPU, Devices: 8}, {Kind: topology.KindGPU, Devices: 2}},
		Traffic: []sched.Flow{{From: 0, To: 1, Gbps: 400}},
	})
	if err != nil {
		panic(err)
	}
	actors, err := Spawn(ctx, p, runtimes, func(b int) string { return fmt.Sprintf("stage%d", b) })
	if err != nil {
		panic(err)
	}
	for _, a := range actors {
		fmt.Println(a.Name(), "on", a.Runtime().HostID(), "with", len(a.Devices())-1, "GPUs")
	}
	// Output:
	// stage0 on h0 with 8 GPUs
	// stage1 on h1 with 2 GPUs
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(testhelp.Isolated(m)) }
