package sched

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
)

// randomCluster builds one of a few small mixed clusters.
func randomCluster(t testing.TB, rng *rand.Rand) *topology.Cluster {
	var specs []topology.ClusterSpec
	switch rng.IntN(4) {
	case 0:
		specs = []topology.ClusterSpec{{Preset: "gb200-nvl72", Hosts: 2 + rng.IntN(8), HostsPerRack: 2 + rng.IntN(3)}}
	case 1:
		specs = []topology.ClusterSpec{{Preset: "dgx-h100", Hosts: 1 + rng.IntN(4), HostsPerRack: 2}, {Preset: "dgx-b200", Hosts: 1 + rng.IntN(3)}}
	case 2:
		specs = []topology.ClusterSpec{{Preset: "tpu-v5p", Hosts: 4 + rng.IntN(8), HostsPerRack: 8}}
	default:
		specs = []topology.ClusterSpec{{Preset: "mi355x", Hosts: 1 + rng.IntN(3), Zone: "z1"}, {Preset: "trn2", Hosts: 1 + rng.IntN(2), Zone: "z2"}}
	}
	c := &topology.Cluster{Name: "random"}
	for i, sp := range specs {
		pc, err := topology.NewCluster(sp)
		require.NoError(t, err)
		for _, h := range pc.Hosts {
			h.ID = fmt.Sprintf("p%d-%s", i, h.ID)
			for _, k := range []string{topology.LabelRack, topology.LabelNVLinkDomain, topology.LabelSlice} {
				if v := h.Labels[k]; v != "" {
					h.Labels[k] = fmt.Sprintf("p%d-%s", i, v)
				}
			}
		}
		c.Hosts = append(c.Hosts, pc.Hosts...)
	}
	require.NoError(t, c.Validate())
	return c
}

var (
	allStrategies = []Strategy{"", Pack, Spread, StrictPack, StrictSpread}
	allLevels     = []Level{"", LevelNUMA, LevelHost, LevelNVLinkDomain, LevelSlice, LevelRack, LevelZone}
	allKinds      = []topology.DeviceKind{"", topology.KindGPU, topology.KindGPU, topology.KindTPU, topology.KindNeuron, KindCPU}
)

func randomRequest(rng *rand.Rand, c *topology.Cluster) Request {
	n := 1 + rng.IntN(6)
	req := Request{Strategy: allStrategies[rng.IntN(len(allStrategies))], NICAffinity: rng.IntN(6) == 0}
	kind := allKinds[rng.IntN(len(allKinds))]
	if rng.IntN(4) != 0 {
		kind = c.Hosts[rng.IntN(len(c.Hosts))].Devices[0].Kind
	}
	for i := 0; i < n; i++ {
		b := Bundle{Kind: kind, Devices: 1 + rng.IntN(4), CPUs: float64(rng.IntN(3) * 4)}
		if kind == KindCPU {
			b.Devices = 0
			b.MemoryGiB = float64(rng.IntN(64))
		} else if rng.IntN(4) == 0 {
			b.MemoryGiB = float64(40 + rng.IntN(160))
		}
		if rng.IntN(5) == 0 {
			b.Selector = map[string]string{"accelerator": []string{"in(H100,B200)", "!in(H100)", "GB200", "tpu-v5p"}[rng.IntN(4)]}
		}
		req.Bundles = append(req.Bundles, b)
	}
	r := rng.IntN(len(allLevels))
	req.Topology.Required = allLevels[r]
	if rng.IntN(2) == 0 {
		p := rng.IntN(len(allLevels))
		rr, _ := allLevels[r].rank()
		pr, _ := allLevels[p].rank()
		if pr <= rr && allLevels[p] != "" {
			req.Topology.Preferred = allLevels[p]
		}
	}
	for i := 0; i < n*rng.IntN(3); i++ {
		a, b := rng.IntN(n), rng.IntN(n)
		if a != b {
			req.Traffic = append(req.Traffic, Flow{From: a, To: b, Gbps: float64(1 + rng.IntN(1600))})
		}
	}
	return req
}

// checkPlacement verifies the invariants of a feasible placement against
// the state it was made in.
func checkPlacement(t *testing.T, c *topology.Cluster, st State, req Request, p Placement) {
	t.Helper()
	cr, err := compile(req)
	require.NoError(t, err)
	require.Len(t, p.Assignments, len(req.Bundles), "all-or-nothing: one assignment per bundle")
	held := map[topology.Endpoint]string{}
	for _, r := range st.Reservations {
		for _, a := range r.Assignments {
			for _, d := range a.Devices {
				held[topology.Endpoint{Host: a.Host, Device: d}] = r.ID
			}
		}
	}
	failedHost := map[string]bool{}
	for _, h := range st.FailedHosts {
		failedHost[h] = true
	}
	failedDev := map[topology.Endpoint]bool{}
	for _, e := range st.FailedDevices {
		failedDev[e] = true
	}
	mine := map[topology.Endpoint]int{}
	hostsUsed := map[string]bool{}
	groupOf := func(h *topology.Host, l Level) string {
		r, _ := l.rank()
		switch {
		case r == rankHost:
			return h.ID
		case r == rankCluster:
			return "cluster"
		}
		if v := h.Labels[levelLabel[r]]; v != "" {
			return "label:" + v
		}
		return "host:" + h.ID
	}
	groups := map[string]bool{}
	numas := map[string]bool{}
	for i, a := range p.Assignments {
		require.Equal(t, i, a.Bundle)
		h, ok := c.Host(a.Host)
		require.True(t, ok, "unknown host %s", a.Host)
		require.False(t, failedHost[a.Host], "placed on failed host %s", a.Host)
		bd := cr.bundles[i]
		require.Len(t, a.Devices, bd.devices)
		for _, sel := range bd.sel {
			require.True(t, sel.match(h), "selector %s on %s", sel.src, h.ID)
		}
		for _, di := range a.Devices {
			e := topology.Endpoint{Host: a.Host, Device: di}
			d, ok := h.Device(di)
			require.True(t, ok)
			_, taken := held[e]
			require.False(t, taken, "device %v over-committed (held by %s)", e, held[e])
			require.False(t, failedDev[e], "failed device %v used", e)
			require.NotContains(t, mine, e, "device %v given twice", e)
			mine[e] = i
			if bd.kind != "" {
				require.Equal(t, bd.kind, d.Kind)
			}
			require.GreaterOrEqual(t, d.MemoryBytes, bd.memBytes)
			if req.NICAffinity {
				found := false
				for _, n := range h.NICs {
					found = found || (n.RDMA() && n.PCIeSwitch == d.PCIeSwitch)
				}
				require.True(t, found, "device %v without NIC affinity", e)
			}
			numas[fmt.Sprintf("%s/%d", a.Host, d.NUMA)] = true
		}
		if cr.required != rankCluster && cr.required != rankNUMA {
			groups[groupOf(h, req.Topology.Required)] = true
		}
		if cr.strategy == StrictSpread {
			require.False(t, hostsUsed[a.Host], "STRICT_SPREAD reuses host %s", a.Host)
		}
		hostsUsed[a.Host] = true
	}
	if cr.required != rankCluster && cr.required != rankNUMA {
		require.Len(t, groups, 1, "required %s spans %v", req.Topology.Required, groups)
	}
	if cr.required == rankNUMA {
		require.Len(t, hostsUsed, 1)
		require.LessOrEqual(t, len(numas), 1)
	}
	if cr.strategy == StrictPack {
		require.Len(t, hostsUsed, 1, "STRICT_PACK uses %d hosts", len(hostsUsed))
	}
}

func TestPropertiesRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	feasible, infeasible := 0, 0
	for iter := 0; iter < 300; iter++ {
		c := randomCluster(t, rng)
		s, err := New(c, Config{})
		require.NoError(t, err)
		// Some prior reservations and failures.
		for k := 0; k < rng.IntN(6); k++ {
			_, _ = s.Reserve("", randomRequest(rng, c))
		}
		if rng.IntN(3) == 0 {
			_, err := s.FailHost(c.Hosts[rng.IntN(len(c.Hosts))].ID)
			require.NoError(t, err)
		}
		if rng.IntN(3) == 0 {
			h := c.Hosts[rng.IntN(len(c.Hosts))]
			_, err := s.FailDevice(h.ID, h.Devices[rng.IntN(len(h.Devices))].Index)
			require.NoError(t, err)
		}
		st := s.State()
		checkState(t, c, st)
		req := randomRequest(rng, c)
		p, err := s.Place(req)
		if err != nil {
			require.ErrorIs(t, err, ErrInfeasible)
			var ie *InfeasibleError
			require.True(t, errors.As(err, &ie))
			require.NotEmpty(t, ie.Reasons)
			require.False(t, p.Feasible)
			require.Empty(t, p.Assignments)
			s0, err := New(c, Config{noPartition: true})
			require.NoError(t, err)
			require.NoError(t, s0.Restore(st))
			_, err = s0.Place(req)
			require.ErrorIs(t, err, ErrInfeasible, "feasible without the partition start only")
			infeasible++
			// All-or-nothing: a failed reservation changes nothing.
			_, err = s.Reserve("", req)
			require.Error(t, err)
			require.Equal(t, st, s.State())
			continue
		}
		feasible++
		require.True(t, p.Feasible)
		checkPlacement(t, c, st, req, p)
		// The partition start only adds a candidate: without it the
		// placement is never cheaper (SPREAD ranks host sharing first).
		s0, err := New(c, Config{noPartition: true})
		require.NoError(t, err)
		require.NoError(t, s0.Restore(st))
		if p0, err := s0.Place(req); err == nil && req.Strategy != Spread {
			require.LessOrEqual(t, p.EstimatedSeconds, p0.EstimatedSeconds*(1+1e-9), "the partition start made it worse")
		}
		est, ok := s.Estimate(req, p.Assignments)
		require.True(t, ok)
		require.InDelta(t, est, p.EstimatedSeconds, 1e-9*(1+est))
		// Deterministic: a fresh scheduler restored from the same state
		// gives the same answer.
		s2, err := New(c, Config{})
		require.NoError(t, err)
		require.NoError(t, s2.Restore(st))
		p2, err := s2.Place(req)
		require.NoError(t, err)
		require.Equal(t, p, p2)
		// Reserving holds exactly the placement.
		p3, err := s.Reserve("x", req)
		require.NoError(t, err)
		require.Equal(t, p, p3)
		checkState(t, c, s.State())
	}
	t.Logf("feasible %d, infeasible %d", feasible, infeasible)
	require.Greater(t, feasible, 30)
	require.Greater(t, infeasible, 10)
}

// checkState: no device held twice or on a failed host/device, and the
// state survives a JSON round trip.
func checkState(t *testing.T, c *topology.Cluster, st State) {
	t.Helper()
	seen := map[topology.Endpoint]bool{}
	failed := map[string]bool{}
	for _, h := range st.FailedHosts {
		failed[h] = true
	}
	for _, r := range st.Reservations {
		for _, a := range r.Assignments {
			require.False(t, failed[a.Host], "reservation %s on failed host %s", r.ID, a.Host)
			for _, d := range a.Devices {
				e := topology.Endpoint{Host: a.Host, Device: d}
				require.False(t, seen[e], "device %v held twice", e)
				seen[e] = true
			}
		}
	}
	for _, e := range st.FailedDevices {
		require.False(t, seen[e], "failed device %v still held", e)
	}
	raw, err := json.Marshal(st)
	require.NoError(t, err)
	var back State
	require.NoError(t, json.Unmarshal(raw, &back))
	s, err := New(c, Config{})
	require.NoError(t, err)
	require.NoError(t, s.Restore(back))
	require.Equal(t, st, s.State())
}

func TestFailuresNeverOvercommit(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 30; iter++ {
		c := randomCluster(t, rng)
		s, err := New(c, Config{})
		require.NoError(t, err)
		for k := 0; k < 8; k++ {
			_, _ = s.Reserve("", randomRequest(rng, c))
		}
		for k := 0; k < 3; k++ {
			h := c.Hosts[rng.IntN(len(c.Hosts))]
			var rs []Rescheduled
			if rng.IntN(2) == 0 {
				rs, err = s.FailHost(h.ID)
			} else {
				rs, err = s.FailDevice(h.ID, h.Devices[rng.IntN(len(h.Devices))].Index)
			}
			require.NoError(t, err)
			st := s.State()
			checkState(t, c, st)
			for _, r := range rs {
				if r.Evicted {
					require.NotEmpty(t, r.Placement.Reasons)
					for _, x := range st.Reservations {
						require.NotEqual(t, r.ID, x.ID)
					}
				}
			}
		}
	}
}

func TestStateErrors(t *testing.T) {
	c, err := topology.PresetCluster("dgx-h100", 2, 0)
	require.NoError(t, err)
	s, err := New(c, Config{})
	require.NoError(t, err)
	req := Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: 2}}}
	tests := []struct {
		name string
		st   State
	}{
		{"unknown host", State{Reservations: []Reservation{{ID: "a", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "zz", Devices: []int{0, 1}}}}}}},
		{"unknown device", State{Reservations: []Reservation{{ID: "a", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "h0", Devices: []int{0, 9}}}}}}},
		{"held twice", State{Reservations: []Reservation{
			{ID: "a", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "h0", Devices: []int{0, 1}}}},
			{ID: "b", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "h0", Devices: []int{1, 2}}}}}}},
		{"duplicate id", State{Reservations: []Reservation{
			{ID: "a", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "h0", Devices: []int{0, 1}}}},
			{ID: "a", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "h0", Devices: []int{2, 3}}}}}}},
		{"wrong device count", State{Reservations: []Reservation{{ID: "a", Request: req, Assignments: []Assignment{{Bundle: 0, Host: "h0", Devices: []int{0}}}}}}},
		{"missing bundle", State{Reservations: []Reservation{{ID: "a", Request: req}}}},
		{"bad request", State{Reservations: []Reservation{{ID: "a", Request: Request{}}}}},
		{"failed host", State{FailedHosts: []string{"nope"}}},
		{"failed device", State{FailedDevices: []topology.Endpoint{{Host: "h0", Device: 42}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, s.Restore(tt.st), ErrInvalidState)
			require.Equal(t, State{}, s.State(), "a failed Restore leaves the state alone")
		})
	}
	_, err = s.Reserve("a", req)
	require.NoError(t, err)
	_, err = s.Reserve("a", req)
	require.ErrorIs(t, err, ErrDuplicateReservation)
	require.ErrorIs(t, s.Release("b"), ErrUnknownReservation)
	_, err = s.FailHost("nope")
	require.ErrorIs(t, err, ErrUnknownHost)
	_, err = s.FailDevice("h0", 99)
	require.ErrorIs(t, err, ErrUnknownDevice)
	_, err = New(nil, Config{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(c, Config{Cost: CostModel{TCPEfficiency: 2}})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = New(c, Config{Candidates: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
