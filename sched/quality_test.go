package sched

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
)

// firstFit is the baseline placer: bundles in index order, each on the
// first host (cluster order) with enough free devices of its kind, lowest
// device indices first. It ignores traffic and topology levels.
func firstFit(s *Scheduler, req Request) ([]Assignment, bool) {
	cr, err := compile(req)
	if err != nil {
		return nil, false
	}
	u := s.u
	var taken [][2]int
	defer func() {
		for _, x := range taken {
			u.used[x[0]][x[1]] = false
		}
	}()
	var out []Assignment
	for b, bd := range cr.bundles {
		placed := false
		for h, hi := range s.ix.hosts {
			if u.failedHost[h] {
				continue
			}
			var devs []int
			for d, dv := range hi.devs {
				if len(devs) < bd.devices && u.available(h, d) && (bd.kind == "" || dv.kind == bd.kind) && dv.mem >= bd.memBytes {
					devs = append(devs, d)
				}
			}
			if len(devs) < bd.devices {
				continue
			}
			a := Assignment{Bundle: b, Host: hi.id}
			for _, d := range devs {
				u.used[h][d] = true
				taken = append(taken, [2]int{h, d})
				a.Devices = append(a.Devices, hi.devs[d].index)
			}
			out = append(out, a)
			placed = true
			break
		}
		if !placed {
			return nil, false
		}
	}
	return out, true
}

// replicaPipelines is a traffic-heavy request that spans racks: dp
// data-parallel replicas of a pp-stage pipeline, bundle index stage-major
// (bundle = stage*dp + replica) as launchers number them, heavy
// activations between consecutive stages of a replica, light gradient
// all-reduce traffic between replicas of a stage.
func replicaPipelines(pp, dp, devices int) Request {
	req := Request{}
	for i := 0; i < pp*dp; i++ {
		req.Bundles = append(req.Bundles, Bundle{Kind: topology.KindGPU, Devices: devices})
	}
	for st := 0; st+1 < pp; st++ {
		for r := 0; r < dp; r++ {
			req.Traffic = append(req.Traffic, Flow{From: st*dp + r, To: (st+1)*dp + r, Gbps: 3200})
		}
	}
	for st := 0; st < pp; st++ {
		for r := 0; r < dp; r++ {
			req.Traffic = append(req.Traffic, Flow{From: st*dp + r, To: st*dp + (r+1)%dp, Gbps: 100})
		}
	}
	return req
}

// fragment reserves random small gangs so that free devices are spread
// over racks.
func fragment(t testing.TB, s *Scheduler, rng *rand.Rand, n int) {
	hosts := s.ix.hosts
	for i := 0; i < n; i++ {
		h := hosts[rng.IntN(len(hosts))].id
		req := Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: 1 + rng.IntN(4), Selector: map[string]string{"host": h}}}}
		_, _ = s.Reserve("", req)
	}
}

// qualityVsFirstFit returns the mean ratio sched/first-fit of estimated
// transfer times over a few fragmented NVL72 clusters.
func qualityVsFirstFit(t testing.TB, racks, trials int) (mean, worst float64) {
	rng := rand.New(rand.NewPCG(11, 12))
	sum := 0.0
	n := 0
	for trial := 0; trial < trials; trial++ {
		c, err := topology.PresetCluster("gb200-nvl72", 18*racks, 0)
		require.NoError(t, err)
		s, err := New(c, Config{})
		require.NoError(t, err)
		fragment(t, s, rng, 8*racks)
		req := replicaPipelines(4+rng.IntN(3), 4+rng.IntN(4), 2)
		p, err := s.Place(req)
		require.NoError(t, err)
		ff, ok := firstFit(s, req)
		require.True(t, ok)
		ffEst, ok := s.Estimate(req, ff)
		require.True(t, ok)
		ratio := p.EstimatedSeconds / ffEst
		sum += ratio
		n++
		worst = math.Max(worst, ratio)
	}
	return sum / float64(n), worst
}

func TestQualityVsFirstFit(t *testing.T) {
	mean, worst := qualityVsFirstFit(t, 3, 4)
	t.Logf("estimated transfer time, sched / first-fit: mean %.3f, worst %.3f", mean, worst)
	require.LessOrEqual(t, mean, 0.5, "goal: at most half of first-fit's transfer time on traffic-heavy cross-rack requests")
}

// bruteForce finds the exact optimum of the cost model over host
// assignments on clusters whose devices are interchangeable within a host
// (GB200 trays: every GPU pair NV18, one NIC per GPU), taking the lowest
// free devices on each host; it respects only device capacity (a PACK
// request without levels).
func bruteForce(s *Scheduler, req Request) (float64, bool) {
	cr, err := compile(req)
	if err != nil {
		return 0, false
	}
	nh := len(s.ix.hosts)
	n := len(cr.bundles)
	free := make([][]int, nh)
	for h, hi := range s.ix.hosts {
		for d := range hi.devs {
			if s.u.available(h, d) {
				free[h] = append(free[h], d)
			}
		}
	}
	hosts := make([]int, n)
	devs := make([][]int, n)
	usedN := make([]int, nh)
	best, found := math.Inf(1), false
	var rec func(b int)
	rec = func(b int) {
		if b == n {
			if e := s.ix.estimate(cr, hosts, devs); e < best {
				best, found = e, true
			}
			return
		}
		need := cr.bundles[b].devices
		for h := 0; h < nh; h++ {
			if usedN[h]+need > len(free[h]) {
				continue
			}
			hosts[b] = h
			devs[b] = free[h][usedN[h] : usedN[h]+need]
			usedN[h] += need
			rec(b + 1)
			usedN[h] -= need
		}
	}
	rec(0)
	return best, found
}

func qualityVsOptimum(t testing.TB, trials int) (mean, worst float64) {
	rng := rand.New(rand.NewPCG(21, 22))
	sum := 0.0
	n := 0
	for trial := 0; trial < trials; trial++ {
		c, err := topology.PresetCluster("gb200-nvl72", 4, 2) // 2 racks x 2 hosts x 4 GPUs
		require.NoError(t, err)
		s, err := New(c, Config{})
		require.NoError(t, err)
		if rng.IntN(2) == 0 {
			_, _ = s.Reserve("", Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: 1 + rng.IntN(3)}}})
		}
		req := Request{}
		nb := 4 + rng.IntN(3)
		for i := 0; i < nb; i++ {
			req.Bundles = append(req.Bundles, Bundle{Kind: topology.KindGPU, Devices: 1 + rng.IntN(2)})
		}
		for i := 0; i < nb+rng.IntN(nb); i++ {
			a, b := rng.IntN(nb), rng.IntN(nb)
			if a != b {
				req.Traffic = append(req.Traffic, Flow{From: a, To: b, Gbps: float64(100 * (1 + rng.IntN(40)))})
			}
		}
		if len(req.Traffic) == 0 {
			continue
		}
		opt, ok := bruteForce(s, req)
		p, err := s.Place(req)
		if !ok {
			require.Error(t, err)
			continue
		}
		require.NoError(t, err)
		require.GreaterOrEqual(t, p.EstimatedSeconds, opt*(1-1e-9), "better than the optimum: brute force is wrong")
		ratio := 1.0
		if opt > 0 {
			ratio = p.EstimatedSeconds / opt
		}
		sum += ratio
		n++
		worst = math.Max(worst, ratio)
	}
	return sum / float64(n), worst
}

func TestQualityVsOptimum(t *testing.T) {
	mean, worst := qualityVsOptimum(t, 40)
	t.Logf("estimated transfer time, sched / brute-force optimum: mean %.3f, worst %.3f", mean, worst)
	require.LessOrEqual(t, mean, 1.10, "goal: within 10%% of the optimum on small instances")
}
