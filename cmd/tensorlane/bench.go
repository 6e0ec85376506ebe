package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/bench/harness"
)

type benchOptions struct {
	quick          bool
	json           bool
	out            string
	check          string
	tolerance      float64
	writeBaseline  string
	noLatency      bool
	noUCX          bool
	sizes          []string
	concurrency    []int
	minTime        time.Duration
	minRounds      int
	latencySamples int
	retries        int
	baselineRuns   int
	paths, push    []string
	bcast          broadcastOptions // bench_broadcast.go
	ab             abOptions        // bench_ab.go
}

func init() { rootCmd.AddCommand(newBenchCmd()) }

// newBenchCmd builds the bench command with its own flag values, so tests
// can run it repeatedly.
func newBenchCmd() *cobra.Command {
	o := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure every transfer path (pull and push) against memcpy, raw TCP, libp2p and object-store baselines",
		Long: `bench runs the benchmark matrix on a simulated cluster of two dgx-h100 hosts built in
this process: sizes 4 KiB to 1 GiB; paths local (zero-copy view), p2p (NVLink copy between
simulated GPUs of one runtime), p2p-ipc (NVLink copy into a second runtime claiming the same
host, through shared memory), shm (into that runtime's host memory), rdma (software verbs
provider to the other host), tcp (the other host with rdma off) and tcp-z (tcp with compression
always, on bf16 weights); pull for every path and push for p2p, p2p-ipc, shm, rdma and tcp; 1, 8
and 64 transfers in flight. Each cell is interleaved round by round with its baseline
(single-thread memcpy for on-host paths; a raw loopback TCP socket, and a libp2p stream at 1 in
flight, for rdma, tcp and tcp-z; and on every path the object-store way, "serialize": the tensor
serialized into 5 MiB protobuf chunk messages and deserialized into the destination, across a
socket for the network paths), and fails loudly if a transfer took another path than the cell
names. Latency mode: p50/p99 of small tcp Gets against a raw TCP ping-pong. Ratios, not
absolute rates, are what carry between machines.

--quick measures 1 MiB (1 and 8 in flight) and 64 MiB (1 in flight), pull for every path and
push for p2p-ipc and rdma. --check compares this run's ratios with a stored baseline and exits
non-zero listing every ratio that fell more than its tolerance (the larger of --tolerance and
the cell's own, stored in the baseline) below it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.quick, "quick", false, "small matrix (1MiB x1,x8 and 64MiB x1; pull on every path, push on p2p-ipc and rdma): well under a minute on 2 cores")
	f.StringSliceVar(&o.paths, "paths", nil, "override the paths pulled (local,p2p,p2p-ipc,shm,rdma,tcp,tcp-z; none: \"\"; broadcast: one owner to --readers readers on --hosts simulated hosts; statedict: a 1B-parameter bf16 state dict as one GetBatch vs one tensor; zerocopy: on-host View vs cold and warm Get vs memcpy; device: CUDA device memory, d2d/IPC Gets vs cuMemcpyDtoD and device->tcp->device vs raw TCP, on the GPU the driver (TENSORLANE_LIBCUDA) gives)")
	f.StringSliceVar(&o.push, "push", nil, "override the paths pushed (p2p,p2p-ipc,shm,rdma,tcp; none: \"\")")
	f.BoolVar(&o.json, "json", false, "print one JSON object per record instead of a table")
	f.StringVar(&o.out, "out", "", "write results.json, report.md and throughput-<path>.png plots into this directory")
	f.StringVar(&o.check, "check", "", "compare ratios with this baseline file; fail on regressions")
	f.Float64Var(&o.tolerance, "tolerance", harness.DefaultTolerance, "with --check: the fraction a ratio may fall below the baseline's")
	f.IntVar(&o.retries, "retries", 2, "with --check: re-measure a regressed cell up to this many times and keep its best ratio")
	f.StringVar(&o.writeBaseline, "write-baseline", "", "write this run as a baseline file for --check")
	f.IntVar(&o.baselineRuns, "baseline-runs", 3, "with --write-baseline: run the matrix this many times and store each cell's median ratio")
	f.BoolVar(&o.noLatency, "no-latency", false, "skip the latency mode")
	f.BoolVar(&o.noUCX, "no-ucx", false, "leave out UCX's baselines (ucx_perftest beside tcp and shm at 1MiB and up, when installed)")
	f.StringSliceVar(&o.sizes, "sizes", nil, "override the sizes (e.g. 4KiB,1MiB)")
	f.IntSliceVar(&o.concurrency, "concurrency", nil, "override the in-flight counts (e.g. 1,8)")
	f.DurationVar(&o.minTime, "min-time", 0, "override the least time per cell (default 1s, 150ms with --quick)")
	f.IntVar(&o.minRounds, "min-rounds", 0, "override the least interleaved rounds per cell (default 9, 5 with --quick)")
	f.IntVar(&o.latencySamples, "latency-samples", 0, "override the samples per latency size (default 2000, 500 with --quick)")
	o.bcast.flags(f)
	o.ab.flags(f)
	return cmd
}

func runBench(cmd *cobra.Command, o benchOptions) error {
	out := cmd.OutOrStdout()
	if o.tolerance <= 0 || o.tolerance >= 1 {
		return fmt.Errorf("--tolerance must be in (0, 1), got %g", o.tolerance)
	}
	if o.ab.serve != "" {
		return runABServe(cmd, o)
	}
	if o.ab.base != "" || o.ab.head != "" {
		return runAB(cmd, o)
	}
	var base harness.File
	if o.check != "" { // fail on a bad baseline before spending a minute measuring
		var err error
		if base, err = harness.ReadFile(o.check); err != nil {
			return err
		}
	}
	if takePath(&o, pathDevice) {
		// A harness of its own (bench_device.go); other paths run only
		// when named beside it.
		if err := runDeviceBench(cmd, o); err != nil {
			return err
		}
		if len(o.paths) == 0 {
			return nil
		}
	}
	if bc, sd, zc := takePath(&o, harness.PathBroadcast), takePath(&o, harness.PathStateDict), takePath(&o, harness.PathZeroCopy); bc || sd || zc {
		// These paths have harnesses of their own (bench_broadcast.go);
		// other paths run only when named beside them.
		if bc {
			if err := runBroadcastBench(cmd, o); err != nil {
				return err
			}
		}
		if sd {
			if err := runStateDictBench(cmd, o); err != nil {
				return err
			}
		}
		if zc {
			if err := runZeroCopyBench(cmd, o); err != nil {
				return err
			}
		}
		if len(o.paths) == 0 {
			return nil
		}
	}
	cfg := harness.Config{Quick: o.quick, NoLatency: o.noLatency, NoUCX: o.noUCX, Concurrency: o.concurrency,
		MinTime: o.minTime, MinRounds: o.minRounds, LatencySamples: o.latencySamples}
	if cmd.Flags().Changed("paths") {
		cfg.Paths = nonEmpty(o.paths)
	}
	if cmd.Flags().Changed("push") {
		cfg.Push = nonEmpty(o.push)
	}
	for _, s := range o.sizes {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	if f, ok := cmd.ErrOrStderr().(*os.File); ok && !o.json {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			cfg.Progress = progress(f)
		}
	}
	res, err := harness.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	file := res.File()
	if o.json {
		if err := harness.WriteJSONLines(out, res.Records); err != nil {
			return err
		}
	} else {
		if err := harness.WriteTable(out, res.Records); err != nil {
			return err
		}
		fmt.Fprintf(out, "\npeak RSS %.1f MiB; took %.1f s\n", float64(res.PeakRSS)/(1<<20), res.Elapsed.Seconds())
	}
	if o.out != "" {
		files, err := harness.WriteReport(o.out, file, res.Records)
		if err != nil {
			return err
		}
		if !o.json {
			fmt.Fprintf(out, "wrote %s\n", strings.Join(files, ", "))
		}
	}
	if o.writeBaseline != "" {
		bf := file
		if o.baselineRuns > 1 {
			runs := [][]harness.Record{res.Records}
			for i := 1; i < o.baselineRuns; i++ {
				if !o.json {
					fmt.Fprintf(out, "baseline: run %d of %d\n", i+1, o.baselineRuns)
				}
				again, err := harness.Run(cmd.Context(), cfg)
				if err != nil {
					return err
				}
				runs = append(runs, again.Records)
				bf.Elapsed += again.Elapsed.Seconds()
				bf.PeakRSS = max(bf.PeakRSS, again.PeakRSS)
			}
			bf.Records = harness.Median(runs...)
		}
		if err := harness.WriteFile(o.writeBaseline, bf); err != nil {
			return err
		}
		if !o.json {
			fmt.Fprintf(out, "wrote baseline %s\n", o.writeBaseline)
		}
	}
	if o.check != "" {
		cr := harness.Check(base.Records, res.Records, o.tolerance)
		if !cr.OK() && o.retries > 0 {
			if !o.json {
				fmt.Fprintf(out, "check: %d cell(s) below tolerance; re-measuring each up to %d times\n", len(cr.Regressions), o.retries)
			}
			cfg.Progress = nil
			before := cr
			var err error
			if _, cr, err = harness.Recheck(cmd.Context(), cfg, base.Records, res.Records, cr, o.retries); err != nil {
				return err
			}
			if !o.json {
				still := map[string]bool{}
				for _, r := range cr.Regressions {
					still[r.Key] = true
				}
				for _, r := range before.Regressions {
					if !still[r.Key] {
						fmt.Fprintf(out, "  %s: passed on re-measure (first run %.3g, baseline %.3g)\n", r.Key, r.Current, r.Baseline)
					}
				}
			}
		}
		if err := cr.Error(); err != nil {
			fmt.Fprintf(out, "FAIL: %d of %d ratios against %s fell below tolerance (%.0f%%, or the cell's own where wider)\n",
				len(cr.Regressions), cr.Compared, o.check, 100*o.tolerance)
			return err
		}
		if !o.json {
			fmt.Fprintf(out, "PASS: %d ratios (each path against its same-run baseline) within tolerance (%.0f%%, or the cell's own where wider) of %s\n",
				cr.Compared, 100*o.tolerance, o.check)
		}
	}
	return nil
}

// progress draws a one-line progress bar on w (a terminal's stderr).
func progress(w io.Writer) func(done, total int, recs []harness.Record) {
	return func(done, total int, recs []harness.Record) {
		const width = 30
		n := done * width / max(total, 1)
		label := ""
		if len(recs) > 0 {
			r := recs[0]
			label = fmt.Sprintf("%s %s x%d", r.Path, harness.SizeString(r.Size), r.Concurrency)
		}
		fmt.Fprintf(w, "\r[%-*s] %d/%d %-24s", width, string(repeat('#', n)), done, total, label)
		if done == total {
			fmt.Fprint(w, "\r\033[K")
		}
	}
}

// nonEmpty drops empty names and returns a non-nil slice: a flag given as
// "" selects nothing rather than the defaults.
func nonEmpty(names []string) []string {
	out := []string{}
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func repeat(c byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return b
}
