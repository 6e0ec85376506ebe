package sched

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
)

// TestShapesChangeNothing: sharing the tables of hosts of one shape and
// skipping clean hosts a scan has already two of (the fleet-size speed-up
// of issue 28) give the very placements, reasons and states that a
// scheduler without shapes gives, on mixed clusters with reservations and
// failures, and on a gang that fills several NVL72 racks.
func TestShapesChangeNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 7))
	for iter := 0; iter < 200; iter++ {
		c := randomCluster(t, rng)
		s, err := New(c, Config{})
		require.NoError(t, err)
		s0, err := New(c, Config{noShapes: true})
		require.NoError(t, err)
		require.Less(t, s.ix.shapes, len(c.Hosts)+1)
		require.Equal(t, len(c.Hosts), s0.ix.shapes)
		for k := 0; k < rng.IntN(6); k++ {
			req := randomRequest(rng, c)
			p, err := s.Reserve("", req)
			p0, err0 := s0.Reserve("", req)
			require.Equal(t, err0, err)
			require.Equal(t, p0, p)
		}
		if rng.IntN(3) == 0 {
			h := c.Hosts[rng.IntN(len(c.Hosts))]
			d := h.Devices[rng.IntN(len(h.Devices))].Index
			_, err := s.FailDevice(h.ID, d)
			require.NoError(t, err)
			_, err = s0.FailDevice(h.ID, d)
			require.NoError(t, err)
		}
		require.Equal(t, s0.State(), s.State())
		req := randomRequest(rng, c)
		p, err := s.Place(req)
		p0, err0 := s0.Place(req)
		require.Equal(t, err0, err)
		require.Equal(t, p0, p)
	}
	// A chained gang over 64 GB200 trays with a failed tray in the way.
	c, err := topology.PresetCluster("gb200-nvl72", 64, 0)
	require.NoError(t, err)
	req := Request{}
	for i := 0; i < 40; i++ {
		req.Bundles = append(req.Bundles, Bundle{Kind: topology.KindGPU, Devices: 1 + i%4})
		if i > 0 {
			req.Traffic = append(req.Traffic, Flow{From: i - 1, To: i, Gbps: 800})
		}
	}
	var got [2]Placement
	for i, cfg := range []Config{{}, {noShapes: true}} {
		s, err := New(c, cfg)
		require.NoError(t, err)
		_, err = s.FailHost(c.Hosts[3].ID)
		require.NoError(t, err)
		_, err = s.Reserve("", Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: 2}}})
		require.NoError(t, err)
		got[i], err = s.Place(req)
		require.NoError(t, err)
	}
	require.Equal(t, got[1], got[0])
	// Held devices late in the cluster and a request without traffic:
	// the scan itself must find the busy tray and rack after two clean
	// trays of the same shape.
	st := State{Reservations: []Reservation{{ID: "late", Request: Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: 1}}},
		Assignments: []Assignment{{Bundle: 0, Host: c.Hosts[50].ID, Devices: []int{0}}}}}}
	for _, n := range []int{1, 3, 4} {
		one := Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: n}}}
		for i, cfg := range []Config{{}, {noShapes: true}} {
			s, err := New(c, cfg)
			require.NoError(t, err)
			require.NoError(t, s.Restore(st))
			got[i], err = s.Place(one)
			require.NoError(t, err)
		}
		require.Equal(t, got[1], got[0], "%d devices", n)
		require.NotEqual(t, c.Hosts[0].ID, got[0].Assignments[0].Host, "%d devices", n)
	}
}
