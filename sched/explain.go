package sched

import (
	"fmt"

	"github.com/tensorlane/tensorlane/topology"
)

// diagnose lists every reason a request cannot be placed, checked one
// constraint at a time against the current state, in a fixed order:
// per bundle, cluster totals, the required level, STRICT_SPREAD.
func (s *Scheduler) diagnose(sv *solver) []string {
	cr := sv.cr
	ix, u := s.ix, s.u
	var reasons []string
	// Per bundle class.
	for cl, rep := range cr.classes {
		var members []int
		for b := range cr.bundles {
			if cr.bundles[b].class == cl && sv.pinned[b].host < 0 {
				members = append(members, b)
			}
		}
		if len(members) == 0 {
			continue
		}
		who := bundleList(members)
		bd := &cr.bundles[rep]
		matching, maxCap, maxFree, maxCPU, maxMem, slots := 0, 0, 0, int64(-1), int64(-1), 0
		for h := range ix.hosts {
			if u.failedHost[h] || !sv.selectorOK(rep, h) {
				continue
			}
			matching++
			c, f := 0, 0
			for d := range ix.hosts[h].devs {
				if sv.devOK(rep, h, d, -1) {
					c++
					if u.available(h, d) {
						f++
					}
				}
			}
			maxCap, maxFree = max(maxCap, c), max(maxFree, f)
			if bd.devices > 0 {
				slots += f / bd.devices
			}
			if hc := ix.hosts[h].cpuMilli; hc > 0 {
				maxCPU = max(maxCPU, hc-u.cpuUsed[h])
			} else {
				maxCPU = 1 << 62
			}
			if hm := ix.hosts[h].memBytes; hm > 0 {
				maxMem = max(maxMem, hm-u.memUsed[h])
			} else {
				maxMem = 1 << 62
			}
		}
		switch {
		case matching == 0 && len(bd.sel) > 0:
			reasons = append(reasons, fmt.Sprintf("%s: selector %s matches no live host", who, selectorText(bd.sel)))
			continue
		case matching == 0:
			reasons = append(reasons, fmt.Sprintf("%s: no live host", who))
			continue
		}
		if bd.devices > 0 {
			what := fmt.Sprintf("%d %s%s", bd.devices, kindNoun(bd.kind, bd.devices), deviceQual(bd, cr.NICAffinity))
			if maxCap < bd.devices {
				reasons = append(reasons, fmt.Sprintf("%s: need%s %s on one host; the largest matching host has %d", who, verbS(members), what, maxCap))
			} else if maxFree < bd.devices {
				reasons = append(reasons, fmt.Sprintf("%s: need%s %s free on one host; the most free on a matching host is %d", who, verbS(members), what, maxFree))
			} else if slots < len(members) {
				reasons = append(reasons, fmt.Sprintf("%s: need room for %d bundles of %s; the matching hosts have room for %d", who, len(members), what, slots))
			}
		}
		if bd.cpuMilli > 0 && maxCPU < bd.cpuMilli {
			reasons = append(reasons, fmt.Sprintf("%s: need%s %s CPUs on one host; the most free is %s", who, verbS(members), milli(bd.cpuMilli), milli(max(maxCPU, 0))))
		}
		if m := bundleHostMem(bd); m > 0 && maxMem < m {
			reasons = append(reasons, fmt.Sprintf("%s: need%s %.1f GiB of host memory; the most free is %.1f GiB", who, verbS(members), float64(m)/(1<<30), float64(max(maxMem, 0))/(1<<30)))
		}
	}
	// Cluster totals per kind.
	freeBy := func(hosts []int, numa int) map[topology.DeviceKind]int {
		m := map[topology.DeviceKind]int{}
		for _, h := range hosts {
			if u.failedHost[h] {
				continue
			}
			for d, dv := range ix.hosts[h].devs {
				if (numa < 0 || dv.numa == numa) && u.available(h, d) {
					m[dv.kind]++
					m[""]++
				}
			}
		}
		return m
	}
	need := map[topology.DeviceKind]int{}
	for b, bd := range cr.bundles {
		if bd.devices > 0 && sv.pinned[b].host < 0 {
			need[bd.kind] += bd.devices
		}
	}
	all := allBundles(len(ix.hosts))
	total := freeBy(all, -1)
	for _, k := range cr.kinds {
		if need[k] > total[k] {
			reasons = append(reasons, fmt.Sprintf("needs %d %s; %d are free in the cluster", need[k], kindNoun(k, need[k]), total[k]))
		}
	}
	// The required level.
	req := sv.effectiveRequired()
	if req < rankCluster {
		prefix := ""
		if cr.strategy == StrictPack && cr.required > rankHost {
			prefix = "STRICT_PACK "
		}
		largest := map[topology.DeviceKind]int{}
		for _, sc := range s.allGroups(req) {
			m := freeBy(sc.hosts, sc.numa)
			for _, k := range cr.kinds {
				largest[k] = max(largest[k], m[k])
			}
		}
		for _, k := range cr.kinds {
			if cr.totalDev[k] > largest[k] {
				reasons = append(reasons, fmt.Sprintf("%sneeds %d %s %s; the largest free has %d", prefix, cr.totalDev[k], kindNoun(k, cr.totalDev[k]), inLevel(req), largest[k]))
			}
		}
	}
	// STRICT_SPREAD: hosts that can hold some bundle, within one group.
	if cr.strategy == StrictSpread {
		best := 0
		for _, sc := range s.allGroups(req) {
			n := 0
			for _, h := range sc.hosts {
				if s.hostCanHoldSome(sv, h) {
					n++
				}
			}
			best = max(best, n)
		}
		if best < len(cr.bundles) {
			where := ""
			if req < rankCluster {
				where = " " + inLevel(req)
			}
			reasons = append(reasons, fmt.Sprintf("STRICT_SPREAD needs %d distinct hosts%s; at most %d can hold a bundle", len(cr.bundles), where, best))
		}
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "no combination of hosts satisfies every constraint at once (the free devices are fragmented)")
	}
	return reasons
}

func (s *Scheduler) allGroups(r int) []*scope {
	ix := s.ix
	var out []*scope
	if r == rankNUMA {
		for h := range ix.hosts {
			for _, nu := range ix.hosts[h].numas {
				out = append(out, &scope{numa: nu, hosts: []int{h}})
			}
		}
		return out
	}
	for _, g := range ix.groups[r] {
		out = append(out, &scope{numa: -1, hosts: g.hosts})
	}
	return out
}

func (s *Scheduler) hostCanHoldSome(sv *solver, h int) bool {
	if s.u.failedHost[h] {
		return false
	}
	for _, rep := range sv.cr.classes {
		if !sv.selectorOK(rep, h) {
			continue
		}
		bd := &sv.cr.bundles[rep]
		f := 0
		for d := range s.ix.hosts[h].devs {
			if s.u.available(h, d) && sv.devOK(rep, h, d, -1) {
				f++
			}
		}
		if f >= bd.devices {
			return true
		}
	}
	return false
}

func inLevel(r int) string {
	if r == rankHost {
		return "on one host"
	}
	return "in " + levelPhrase[r]
}

func kindNoun(k topology.DeviceKind, n int) string {
	var one, many string
	switch k {
	case topology.KindGPU:
		one, many = "GPU", "GPUs"
	case topology.KindTPU:
		one, many = "TPU chip", "TPU chips"
	case topology.KindNeuron:
		one, many = "Neuron device", "Neuron devices"
	case topology.KindHPU:
		one, many = "HPU", "HPUs"
	default:
		one, many = "device", "devices"
	}
	if n == 1 {
		return one
	}
	return many
}

func deviceQual(bd *cbundle, nic bool) string {
	q := ""
	if bd.memBytes > 0 {
		q += fmt.Sprintf(" with >= %g GiB", bd.MemoryGiB)
	}
	if nic {
		q += " with an RDMA NIC on the same PCIe switch"
	}
	return q
}

func verbS(members []int) string {
	if len(members) == 1 {
		return "s"
	}
	return ""
}

func milli(v int64) string {
	if v%1000 == 0 {
		return itoa(int(v / 1000))
	}
	return fmt.Sprintf("%.3g", float64(v)/1000)
}

// bundleList renders bundle indices as "bundle 3" or "bundles 0-3,7".
func bundleList(b []int) string {
	if len(b) == 1 {
		return "bundle " + itoa(b[0])
	}
	out := "bundles "
	for i := 0; i < len(b); {
		j := i
		for j+1 < len(b) && b[j+1] == b[j]+1 {
			j++
		}
		if i > 0 {
			out += ","
		}
		out += itoa(b[i])
		if j > i {
			out += "-" + itoa(b[j])
		}
		i = j + 1
	}
	return out
}

func selectorText(sel []selTerm) string {
	out := ""
	for i, t := range sel {
		if i > 0 {
			out += " "
		}
		out += t.src
	}
	return out
}
