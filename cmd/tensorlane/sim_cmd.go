package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/tensorlane/tensorlane/fabricsim"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/topology"
)

// simOptions are the flags of tensorlane sim.
type simOptions struct {
	preset       string
	hosts        int
	hostsPerLeaf int
	oversub      float64
	workloads    string
	size         string
	trainers     int
	inference    int
	replicaGPUs  int
	readers      string
	chunk        string
	window       int
	bundles      int
	down         []string
	railGbps     float64
	rdmaEff      float64
	cut          string
	railTimeout  float64
	jsonOut      bool
	plotFile     string
}

func newSimCmd() *cobra.Command {
	o := simOptions{}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate tensorlane's plans on a fleet-sized fabric (weight sync, broadcast, many-to-one, placement)",
		Long: `sim runs tensorlane's own plans (the planner's path choice, rdt's broadcast
tree with its chunks and window, GetBatch reads striped over every rail,
the placement scheduler) against a flow-level simulation of a cluster built
from a topology preset: device links, PCIe, each NIC rail, leaf switches
per rail with their oversubscription. Every result comes with the
line-rate bound (the bytes that must cross the narrowest cut over its
aggregate line rate) and the ratio to it. docs/sim.md says what the model
holds and how it compares with measured runs.

  # Kimi-K2-sized weight sync: 1 TB from 256 H100s to 128 (replicas of 16)
  tensorlane sim --preset dgx-h100 --hosts 48 --workload weight-sync \
      --size 1TB --trainers 256 --inference 128 --replica-gpus 16
  # broadcast of 64 GiB to 1..64 readers, JSON and a plot
  tensorlane sim --workload broadcast --size 64GiB --readers 1,8,64 --json --plot sim.png
  # placement of 1,000 chained 4-GPU bundles on 100,008 GPUs
  tensorlane sim --preset gb200-nvl72 --hosts 25002 --workload placement
  # one 64 GiB Get between two hosts with a rail cut 10 ms in
  tensorlane sim --workload transfer --size 64GiB --cut h1/ibp25s0@0.01`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSim(cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.preset, "preset", "dgx-h100", "topology preset of every host")
	f.IntVar(&o.hosts, "hosts", 48, "number of hosts")
	f.IntVar(&o.hostsPerLeaf, "hosts-per-leaf", 0, "hosts per leaf switch and rail (default 32)")
	f.Float64Var(&o.oversub, "oversubscription", 0, "leaf downlink over uplink bandwidth (default 1, non-blocking)")
	f.StringVar(&o.workloads, "workload", "weight-sync", "comma list of: weight-sync, broadcast, many-to-one, transfer, placement")
	f.StringVar(&o.size, "size", "1TB", "bytes moved: the model for weight-sync, the object otherwise (e.g. 1TB, 64GiB)")
	f.IntVar(&o.trainers, "trainers", 256, "weight-sync: trainer GPUs (the first hosts)")
	f.IntVar(&o.inference, "inference", 128, "weight-sync: inference GPUs (the hosts after the trainers)")
	f.IntVar(&o.replicaGPUs, "replica-gpus", 16, "weight-sync: GPUs per inference replica (each holds the whole model, sharded evenly)")
	f.StringVar(&o.readers, "readers", "1,8,64", "broadcast, many-to-one: comma list of reader counts (GPU 0 of each other host first)")
	f.StringVar(&o.chunk, "chunk", "", "broadcast: chunk size (default rdt's)")
	f.IntVar(&o.window, "window", 0, "broadcast: chunks in flight per edge (default rdt's)")
	f.IntVar(&o.bundles, "bundles", 1000, "placement: chained 4-GPU bundles to place")
	f.StringSliceVar(&o.down, "down", nil, "NICs that are cut, host/nic (e.g. h3/ibp25s0)")
	f.Float64Var(&o.railGbps, "rail-gbps", 0, "what if every NIC ran at this line rate, Gb/s (default the preset's)")
	f.Float64Var(&o.rdmaEff, "rdma-efficiency", 0, "share of line rate rdma payload gets (default 0.97)")
	f.StringVar(&o.cut, "cut", "", "transfer: a NIC that goes down during the Get, host/nic@seconds (e.g. h1/ibp25s0@0.01)")
	f.Float64Var(&o.railTimeout, "rail-timeout", 10, "transfer: seconds a cut rail's slices stall before they move (fabric/rdma's QPTimeout)")
	f.BoolVar(&o.jsonOut, "json", false, "print JSON")
	f.StringVar(&o.plotFile, "plot", "", "write a PNG plot of every result against its line-rate bound")
	cmd.AddCommand(newSimCalibrateCmd())
	return cmd
}

func init() { rootCmd.AddCommand(newSimCmd()) }

// simRecord is one line of the output: a workload's result, or a
// placement's cost.
type simRecord struct {
	Case string `json:"case"`
	fabricsim.Result
	// Placement only.
	PlacementCPUSeconds float64 `json:"placement_cpu_seconds,omitempty"`
	PlacementHeapMB     float64 `json:"placement_heap_mb,omitempty"`
}

// parseSimSize reads "1TB", "64GiB", "1.5e9"; unlike parseSize it takes
// TB and TiB and keeps every byte.
func parseSimSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	mult := 1.0
	num := strings.TrimSpace(s)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || v*mult > 1<<62 {
		return 0, fmt.Errorf("sim: bad size %q (use e.g. 1TB, 64GiB)", s)
	}
	return int64(v * mult), nil
}

// parseCut reads --cut, host/nic@seconds; empty is no cut.
func parseCut(s string) (fabricsim.Cut, error) {
	if s == "" {
		return fabricsim.Cut{}, nil
	}
	nic, at, ok := strings.Cut(s, "@")
	secs, err := strconv.ParseFloat(at, 64)
	if !ok || err != nil || secs < 0 || !strings.Contains(nic, "/") {
		return fabricsim.Cut{}, fmt.Errorf("%w: --cut %q (want host/nic@seconds, e.g. h1/ibp25s0@0.01)", fabricsim.ErrBadSpec, s)
	}
	return fabricsim.Cut{NIC: nic, At: secs}, nil
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("sim: bad count %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func runSim(w io.Writer, o simOptions) error {
	if o.hosts < 1 || o.hosts > topology.MaxPresetHosts {
		return fmt.Errorf("sim: --hosts must be 1..%d", topology.MaxPresetHosts)
	}
	size, err := parseSimSize(o.size)
	if err != nil {
		return err
	}
	c, err := topology.PresetCluster(o.preset, o.hosts, 0)
	if err != nil {
		return err
	}
	if o.railGbps < 0 || o.rdmaEff < 0 || o.rdmaEff > 1 {
		return fmt.Errorf("%w: --rail-gbps must not be negative, --rdma-efficiency must be in (0, 1]", fabricsim.ErrBadSpec)
	}
	if o.railGbps > 0 {
		for _, h := range c.Hosts {
			for i := range h.NICs {
				h.NICs[i].SpeedGbps = o.railGbps
			}
		}
	}
	if o.railTimeout < 0 {
		return fmt.Errorf("%w: --rail-timeout must not be negative", fabricsim.ErrBadSpec)
	}
	spec := fabricsim.Spec{HostsPerLeaf: o.hostsPerLeaf, Oversubscription: o.oversub, Down: o.down, RDMAEfficiency: o.rdmaEff, RailTimeout: o.railTimeout}
	var recs []simRecord
	for _, wl := range strings.Split(o.workloads, ",") {
		wl = strings.TrimSpace(wl)
		switch wl {
		case "placement":
			r, err := simPlacement(c, o.bundles)
			if err != nil {
				return err
			}
			recs = append(recs, r)
			continue
		case "weight-sync", "broadcast", "many-to-one", "transfer":
		default:
			return fmt.Errorf("sim: unknown workload %q (weight-sync, broadcast, many-to-one, transfer, placement)", wl)
		}
		f, err := fabricsim.New(c, spec)
		if err != nil {
			return err
		}
		hosts := f.Hosts()
		switch wl {
		case "transfer":
			// One Get from GPU 0 of the first host into GPU 0 of the
			// second, at slice level; --cut takes a NIC down during it.
			if len(hosts) < 2 {
				return fmt.Errorf("%w: a transfer needs two hosts", fabricsim.ErrBadSpec)
			}
			cut, err := parseCut(o.cut)
			if err != nil {
				return err
			}
			src, dst := topology.Endpoint{Host: hosts[0], Device: 0}, topology.Endpoint{Host: hosts[1], Device: 0}
			res, err := f.TransferCut(src, dst, size, cut)
			if err != nil {
				return err
			}
			name := fmt.Sprintf("transfer %s %s/0 -> %s/0", o.size, hosts[0], hosts[1])
			if cut.NIC != "" {
				name += fmt.Sprintf(" (%s cut at %g s, rail timeout %g s)", cut.NIC, cut.At, o.railTimeout)
			}
			recs = append(recs, simRecord{Case: name, Result: res})
		case "weight-sync":
			gpus := f.GPUs(hosts)
			if o.trainers+o.inference > len(gpus) {
				return fmt.Errorf("%w: %d trainers and %d inference GPUs, the cluster has %d GPUs", fabricsim.ErrBadSpec, o.trainers, o.inference, len(gpus))
			}
			ws := fabricsim.WeightSync{Bytes: size, Trainers: gpus[:o.trainers], Inference: gpus[o.trainers : o.trainers+o.inference], ReplicaGPUs: o.replicaGPUs}
			res, err := f.WeightSync(ws)
			if err != nil {
				return err
			}
			recs = append(recs, simRecord{Case: fmt.Sprintf("weight-sync %s %d->%d (replicas of %d)", o.size, o.trainers, o.inference, o.replicaGPUs), Result: res})
		default:
			counts, err := parseCounts(o.readers)
			if err != nil {
				return err
			}
			var cfg rdt.BroadcastConfig
			if o.chunk != "" {
				if cfg.ChunkSize, err = parseSimSize(o.chunk); err != nil {
					return err
				}
			}
			cfg.Window = o.window
			owner := topology.Endpoint{Host: hosts[0], Device: 0}
			others := spreadReaders(f, hosts[1:])
			for _, n := range counts {
				if n > len(others) {
					return fmt.Errorf("%w: %d readers, the other hosts have %d devices", fabricsim.ErrBadSpec, n, len(others))
				}
				var res fabricsim.Result
				if wl == "broadcast" {
					res, err = f.Broadcast(owner, others[:n], size, cfg)
				} else {
					res, err = f.ManyToOne(owner, others[:n], size)
				}
				if err != nil {
					return err
				}
				recs = append(recs, simRecord{Case: fmt.Sprintf("%s %s to %d readers", wl, o.size, n), Result: res})
			}
		}
	}
	if o.plotFile != "" {
		files, err := plotSim(o.plotFile, recs)
		if err != nil {
			return err
		}
		if !o.jsonOut {
			defer fmt.Fprintf(w, "plot: %s\n", strings.Join(files, ", "))
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(recs)
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "case\tsimulated s\tline-rate bound s\tratio\tnarrowest cut\tbusiest link\ttransfers")
	var notes []string
	for _, r := range recs {
		if r.Workload == "placement" {
			fmt.Fprintf(tw, "%s\t%.3f CPU-s\tgoal < %d CPU-s, < %d MB\t%.2f\t\tallocated %.1f MB\t%s\n", r.Case, r.PlacementCPUSeconds,
				placementGoalCPUSeconds, placementGoalMB, r.PlacementCPUSeconds/placementGoalCPUSeconds, r.PlacementHeapMB, countsString(r.Transfers))
			continue
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s\n", r.Case, r.Seconds, r.BoundSeconds, r.RatioToBound, r.BoundCut, r.Binding, countsString(r.Transfers))
		if r.Note != "" && r.RatioToBound > 1.3 {
			notes = append(notes, fmt.Sprintf("%s: %s", r.Case, r.Note))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(w, "note:", n)
	}
	if slices.ContainsFunc(recs, func(r simRecord) bool { return r.RatioToBound > 1.3 && strings.HasPrefix(r.Note, "bound by") }) {
		// rdt's broadcast stripes every edge over the rails (fabric/rdma
		// slices a 4 MiB chunk into eight of 512 KiB), and so does the
		// simulation: what holds it back is the source device's bus.
		fmt.Fprintln(w, "note: every rdma edge stripes over all the host's rails, as fabric/rdma does; a link that is not a NIC binds where one device sends (docs/sim.md)")
	}
	return nil
}

// spreadReaders lists the devices of hosts GPU 0 of each host first, then
// GPU 1..., as the multihost harness spreads its readers.
func spreadReaders(f *fabricsim.Fabric, hosts []string) []topology.Endpoint {
	per := map[string][]topology.Endpoint{}
	most := 0
	for _, h := range hosts {
		per[h] = f.GPUs([]string{h})
		most = max(most, len(per[h]))
	}
	var out []topology.Endpoint
	for k := range most {
		for _, h := range hosts {
			if k < len(per[h]) {
				out = append(out, per[h][k])
			}
		}
	}
	return out
}

// simPlacement places n chained 4-GPU bundles (pipeline traffic between
// neighbours) with the real scheduler and reports its CPU time and the
// heap it allocated.
func simPlacement(c *topology.Cluster, n int) (simRecord, error) {
	if n < 1 {
		return simRecord{}, errors.New("sim: --bundles must be at least 1")
	}
	req := sched.Request{}
	for i := range n {
		req.Bundles = append(req.Bundles, sched.Bundle{Kind: topology.KindGPU, Devices: 4})
		if i > 0 {
			req.Traffic = append(req.Traffic, sched.Flow{From: i - 1, To: i, Gbps: 800})
		}
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	cpu0 := cpuSeconds()
	s, err := sched.New(c, sched.Config{})
	if err != nil {
		return simRecord{}, err
	}
	p, err := s.Place(req)
	if err != nil {
		return simRecord{}, err
	}
	cpu := cpuSeconds() - cpu0
	runtime.ReadMemStats(&m1)
	rec := simRecord{Case: fmt.Sprintf("placement of %d chained 4-GPU bundles on %d hosts", n, len(c.Hosts))}
	rec.Workload = "placement"
	rec.Seconds = time.Since(start).Seconds()
	rec.PlacementCPUSeconds = cpu
	rec.PlacementHeapMB = float64(m1.TotalAlloc-m0.TotalAlloc) / 1e6
	rec.Transfers = map[string]int{"bundles": len(p.Assignments)}
	return rec, nil
}

// Issue 28's bar for a placement at fleet size, printed and plotted
// where a transfer has its line-rate bound.
const (
	placementGoalCPUSeconds = 1
	placementGoalMB         = 64
)

// plotSim draws every result's simulated seconds beside its line-rate
// bound, one pair of bars per case (labelled with the ratio), in file.
// Placements have no line-rate bound: they go beside their goal (CPU
// seconds and MB allocated, as shares of 1 s and 64 MB) in file itself
// when nothing else was simulated, else in file-placement.png.
func plotSim(file string, recs []simRecord) (written []string, err error) {
	var sim, bound, place, goal plotter.Values
	var names, placeNames []string
	for _, r := range recs {
		if r.Workload == "placement" {
			place = append(place, r.PlacementCPUSeconds/placementGoalCPUSeconds, r.PlacementHeapMB/placementGoalMB)
			goal = append(goal, 1, 1)
			placeNames = append(placeNames, fmt.Sprintf("%s: CPU %.2f s", r.Case, r.PlacementCPUSeconds), fmt.Sprintf("allocated %.0f MB", r.PlacementHeapMB))
			continue
		}
		sim = append(sim, r.Seconds)
		bound = append(bound, r.BoundSeconds)
		names = append(names, fmt.Sprintf("%s (%.2fx)", r.Case, r.RatioToBound))
	}
	if len(sim) == 0 && len(place) == 0 {
		return nil, errors.New("sim: nothing to plot")
	}
	if len(sim) > 0 {
		if err := barPlot(file, "tensorlane sim: simulated time and line-rate bound (ratio in brackets)", "seconds", names,
			sim, "simulated", bound, "line-rate bound"); err != nil {
			return nil, err
		}
		written = append(written, file)
	}
	if len(place) > 0 {
		pf := file
		if len(sim) > 0 {
			pf = strings.TrimSuffix(file, filepath.Ext(file)) + "-placement.png"
		}
		if err := barPlot(pf, "tensorlane sim: placement against issue 28's goal (1 CPU-s, 64 MB)", "share of the goal", placeNames,
			place, "placement", goal, "goal"); err != nil {
			return nil, err
		}
		written = append(written, pf)
	}
	return written, nil
}

// barPlot saves pairs of bars, a beside b, one pair per name.
func barPlot(file, title, ylabel string, names []string, a plotter.Values, aName string, b plotter.Values, bName string) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	w := vg.Points(14)
	ba, err := plotter.NewBarChart(a, w)
	if err != nil {
		return err
	}
	ba.Offset = -w / 2
	ba.Color = plotColor(0)
	bb, err := plotter.NewBarChart(b, w)
	if err != nil {
		return err
	}
	bb.Offset = w / 2
	bb.Color = plotColor(1)
	p.Add(ba, bb)
	p.Legend.Add(aName, ba)
	p.Legend.Add(bName, bb)
	p.Legend.Top = true
	p.Legend.Left = true
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign = -1
	return p.Save(vg.Length(max(6, 1.2*float64(len(names))))*vg.Inch, 5*vg.Inch, file)
}

// cpuSeconds is the CPU time this process has used (user and system):
// what a placement costs whatever else loads the machine.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func plotColor(i int) color.Color {
	return []color.Color{color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 255, G: 127, B: 14, A: 255}}[i%2]
}

// countsString prints a count per path ("rdma 2048, tcp 3"), in name order.
func countsString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
