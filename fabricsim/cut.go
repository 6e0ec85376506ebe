package fabricsim

import (
	"fmt"
	"slices"

	"github.com/tensorlane/tensorlane/fabric"
)

// Cut is a NIC ("host/nic") that goes down At seconds after a transfer
// started: both its directions carry nothing from then on.
type Cut struct {
	NIC string
	At  float64
}

// The rdma transport's slicing (fabric/rdma's Config defaults): a transfer
// is cut into slices of n/(4 x rails), in whole 64 KiB, between 512 KiB
// and 8 MiB; a rail has at most 4 slices posted.
const (
	rdmaSliceMin    = 512 << 10
	rdmaSliceMax    = 8 << 20
	rdmaMaxInFlight = 4
)

func rdmaSliceSize(n int64, rails int) int64 {
	s := n / int64(rdmaMaxInFlight*rails)
	s = (s + 64<<10 - 1) &^ (64<<10 - 1)
	return max(rdmaSliceMin, min(s, rdmaSliceMax))
}

// TransferCut simulates one rdma Get of n bytes from src into dst, striped
// over the rails slice by slice as fabric/rdma posts them, with cut.NIC
// going down cut.At seconds after the Get began. The slices outstanding on
// the cut rail stall; RailTimeout later the transport declares the rail
// broken and posts them again, whole, on the rails left. Without a cut
// (an empty NIC) it is the same Get at slice level.
func (f *Fabric) TransferCut(src, dst Endpoint, n int64, cut Cut) (Result, error) {
	if n <= 0 {
		return Result{}, fmt.Errorf("%w: size %d", ErrBadSpec, n)
	}
	rt, err := f.Route(src, dst)
	if err != nil {
		return Result{}, err
	}
	if rt.Transport != fabric.RDMA {
		return Result{}, fmt.Errorf("%w: a rail cut is simulated for rdma, and %v -> %v takes %s", ErrBadSpec, src, dst, rt.Transport)
	}
	var cutLinks []int
	if cut.NIC != "" {
		host, nic, ok := splitNIC(cut.NIC)
		h := f.hosts[host]
		if !ok || h == nil {
			return Result{}, fmt.Errorf("%w: cut NIC %q", ErrBadSpec, cut.NIC)
		}
		for _, nl := range h.nics {
			if nl.nic.Name == nic {
				cutLinks = append(cutLinks, nl.out, nl.in)
			}
		}
		if len(cutLinks) == 0 {
			return Result{}, fmt.Errorf("%w: host %s has no NIC %q", ErrBadSpec, host, nic)
		}
	}
	r := f.newRun()
	s := f.sim
	type rail struct {
		path   []int
		posted map[*transfer]int64 // slices in flight on it
		cut    bool                // its path crosses the cut NIC
		broken bool
	}
	var rails []*rail
	for _, p := range rt.flows {
		rl := &rail{path: p, posted: map[*transfer]int64{}}
		for _, l := range p {
			if slices.Contains(cutLinks, l) {
				rl.cut = true
			}
		}
		rails = append(rails, rl)
	}
	size := rdmaSliceSize(n, len(rails))
	var queue []int64
	for off := int64(0); off < n; off += size {
		queue = append(queue, min(size, n-off))
	}
	r.transfers[fabric.RDMA]++
	r.flows += len(rails)
	if src.Host != dst.Host {
		r.egress[src.Host] += float64(n)
		r.ingress[dst.Host] += float64(n)
	}
	done := int64(0)
	var end float64
	// dispatch posts queued slices on the rails with the fewest posted
	// (equal rails: fabric/rdma's rate-proportional score), up to the
	// limit per rail, never on a broken rail. A rail's posted slices
	// share its connection: the owner serves them side by side, so they
	// land together rather than one after the other (measured: a cut
	// early in a 64 MiB Get over two rails finds none of rail 1's four
	// slices landed).
	var dispatch func()
	dispatch = func() {
		for len(queue) > 0 {
			var best *rail
			for _, rl := range rails {
				if rl.broken || len(rl.posted) >= rdmaMaxInFlight {
					continue
				}
				if best == nil || len(rl.posted) < len(best.posted) {
					best = rl
				}
			}
			if best == nil {
				return
			}
			k := queue[0]
			queue = queue[1:]
			rl := best
			var t *transfer
			t = s.start(float64(k)/rt.Efficiency, [][]int{rl.path}, func(*transfer) {
				delete(rl.posted, t)
				if done += k; done == n {
					end = s.now
				}
				dispatch()
			})
			rl.posted[t] = k
		}
	}
	s.after(rt.Setup+f.spec.Latency, dispatch)
	if cut.NIC != "" {
		s.after(cut.At, func() {
			for _, l := range cutLinks {
				s.setCap(l, 0)
			}
			s.after(f.spec.RailTimeout, func() {
				for _, rl := range rails {
					if !rl.cut || len(rl.posted) == 0 {
						continue
					}
					// No progress for the timeout: the rail is broken and
					// its slices go back whole, in the order they were cut.
					rl.broken = true
					var back []*transfer
					for t := range rl.posted {
						back = append(back, t)
					}
					slices.SortFunc(back, func(a, b *transfer) int { return cmpFloat(a.Start, b.Start) })
					for _, t := range back {
						s.cancel(t)
						queue = append(queue, rl.posted[t])
					}
					clear(rl.posted)
				}
				dispatch()
			})
		})
	}
	res, err := r.finish("transfer", float64(n), nil)
	if err != nil {
		return res, err
	}
	if done != n {
		return res, fmt.Errorf("%w: %d of %d bytes landed (every rail cut?)", ErrStuck, done, n)
	}
	res.Seconds, res.Finish = end, []float64{end}
	if res.BoundSeconds > 0 {
		res.RatioToBound = res.Seconds / res.BoundSeconds
	}
	return res, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func splitNIC(s string) (host, nic string, ok bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], i > 0 && i < len(s)-1
		}
	}
	return "", "", false
}
