package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/demo"
	"github.com/tensorlane/tensorlane/topology"
)

type demoOptions struct {
	preset  string
	hosts   int
	readers int
	tensors int
	steps   int
	size    string
	json    bool
	verbose bool
	bcast   bool // --broadcast
}

func init() {
	o := demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "RL-style weight sync on a simulated cluster built in this process",
		Long: `demo builds a simulated cluster (default: two dgx-h100 hosts, one runtime per host,
talking over loopback), puts bf16 weight tensors with a known pattern on the trainer's
simulated GPU, and has reader actors on other GPUs and on the other host Get them.
Devices are simulated: memfd-backed arenas, with real copies. Exits non-zero if any
transfer fails verification.

--broadcast runs the fleet way instead: each reader reserves a flow-controlled slot per
tensor and sends the slot refs to the trainer, which broadcasts every step's weights to all
readers at once along a topology-aware pipelined tree (ExplainBroadcast's tree is printed);
readers verify every byte and say Done, and the trainer waits for all before the next step.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.bcast {
				return runDemoBroadcast(cmd.Context(), cmd.OutOrStdout(), o)
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.preset, "preset", "dgx-h100", "topology preset of every host")
	f.IntVar(&o.hosts, "hosts", 2, "number of simulated hosts (one runtime each)")
	f.IntVar(&o.readers, "readers", 4, "number of reader actors, spread over GPUs and hosts")
	f.IntVar(&o.tensors, "tensors", 8, "number of weight tensors")
	f.IntVar(&o.steps, "steps", 2, "weight-sync steps (step 1 also touches the readers' fresh simulated memory)")
	f.StringVar(&o.size, "size", "64MiB", "size of each tensor (KiB, MiB, GiB suffixes)")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.BoolVar(&o.bcast, "broadcast", false, "RL weight sync by broadcast: readers reserve flow-controlled slots, the trainer broadcasts each step's weights to all of them along a pipelined tree, readers verify and say Done")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log runtime events to stderr")
	rootCmd.AddCommand(cmd)
}

// config turns the flags into demo.Config. A zero count, size or empty
// preset is refused rather than read as demo.Config's default.
func (o demoOptions) config() (demo.Config, error) {
	size, err := parseWordSize(o.size)
	if err != nil {
		return demo.Config{}, err
	}
	if o.hosts < 1 || o.readers < 1 || o.tensors < 1 || o.steps < 1 {
		return demo.Config{}, fmt.Errorf("hosts, readers, tensors and steps must be at least 1")
	}
	if o.preset == "" { // demo.Config would read it as its default: refuse it as the preset does
		_, err := topology.Preset(o.preset, o.hosts)
		return demo.Config{}, err
	}
	// -v logs to stderr; otherwise nowhere.
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return demo.Config{Preset: o.preset, Hosts: o.hosts, Readers: o.readers, Tensors: o.tensors, Steps: o.steps,
		Size: size, Logger: logger}, nil
}

func runDemo(ctx context.Context, out io.Writer, o demoOptions) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	// Rows are printed as they complete: a first step over a slow path
	// must not look like a hang.
	var start func(float64)
	var row func(demo.Transfer)
	if !o.json {
		start = func(memcpyGBps float64) {
			fmt.Fprintf(out, "tensorlane demo: %d simulated %s host(s), %d bf16 tensors of %s, %d readers\n",
				o.hosts, o.preset, o.tensors, o.size, o.readers)
			fmt.Fprintln(out, "(simulated devices: memfd-backed arenas, real copies; hosts talk over loopback)")
			fmt.Fprintf(out, "baseline: memcpy of one tensor in this process, %.2f GB/s\n", memcpyGBps)
			const head = "%4s  %-10s  %-4s  %-6s  %-5s  %10s  %8s  %7s  %9s  %s\n"
			fmt.Fprintf(out, head, "step", "reader", "host", "device", "path", "bytes", "seconds", "GB/s", "vs memcpy", "verified")
		}
		row = func(t demo.Transfer) {
			fmt.Fprintf(out, "%4d  %-10s  %-4s  %-6s  %-5s  %10s  %8.3f  %7.2f  %8.2fx  %v\n",
				t.Step, t.Reader, t.Host, t.Device, t.Path, humanBytes(t.Bytes), t.Seconds, t.GBps, t.VsMemcpy, t.Verified)
		}
	}
	res, err := demo.Run(ctx, cfg, start, row)
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(out)
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else if o.steps > 1 {
		fmt.Fprintln(out, "step 1 includes the first touch of the readers' fresh simulated memory (page population); later steps reuse it")
	}
	if !res.OK {
		return fmt.Errorf("verification failed")
	}
	return nil
}

// runDemoBroadcast is demo --broadcast.
func runDemoBroadcast(ctx context.Context, out io.Writer, o demoOptions) error {
	cfg, err := o.config()
	if err != nil {
		return err
	}
	res, err := demo.RunBroadcast(ctx, cfg)
	if err != nil {
		return err
	}
	if o.json {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "tensorlane demo --broadcast: %d simulated %s hosts, %d bf16 tensors of %s, %d readers\n",
			o.hosts, o.preset, o.tensors, o.size, o.readers)
		fmt.Fprintln(out, "(simulated devices: memfd-backed arenas, real copies; hosts talk over loopback)")
		fmt.Fprintf(out, "broadcast tree (the whole state dict follows it):\n%s", res.Tree)
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "step\treaders\tverified\tbytes/reader\tseconds\t")
		for _, s := range res.Steps {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%.3f\t\n", s.Step, s.Readers, s.OK, s.Bytes, s.Seconds)
		}
		tw.Flush()
	}
	if !res.OK {
		return fmt.Errorf("verification failed")
	}
	return nil
}

// humanBytes writes n in binary units: "512 MiB", "1.5 GiB".
func humanBytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d %ciB", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}
