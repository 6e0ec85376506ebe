package harness

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the records as an aligned terminal table: throughput,
// then latency, then what is not built or was skipped.
func WriteTable(w io.Writer, recs []Record) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tmode\tsize\tin-flight\tGB/s\tbaseline\tbase GB/s\tratio\tCPU ms/GB\tbase CPU ms/GB\tCPU ratio\theap/GiB\twire/raw\t")
	for _, r := range recs {
		if r.Kind == KindThroughput && r.Measured() {
			wire := "-"
			if r.WireRatio > 0 {
				wire = fmt.Sprintf("%.2f", r.WireRatio)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.2f\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Path, r.Mode, SizeString(r.Size), r.Concurrency,
				r.GBps, r.Baseline, r.BaselineGBps, ratioString(r.Ratio), cpuMs(r.CPUGBps), cpuMs(r.BaselineCPUGBps), cpuRatioString(r),
				bytesString(int64(r.AllocPerGiB)), wire)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if hasKind(recs, KindLatency) {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "latency\tsize\tp50 µs\tp99 µs\tbaseline\tbase p50 µs\tbase p99 µs\tratio (p50)\t")
		for _, r := range recs {
			if r.Kind == KindLatency && r.Measured() {
				fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%s\t%.1f\t%.1f\t%s\t\n", r.Path, SizeString(r.Size), r.P50us, r.P99us,
					r.Baseline, r.BaselineP50us, r.BaselineP99us, ratioString(r.Ratio))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if goals := CheckGoals(recs); len(goals) > 0 {
		fmt.Fprintln(w, "\nfabric goals (targets, one in flight, bandwidth-bound sizes; informational: --check compares with a baseline instead):")
		for _, g := range goals {
			fmt.Fprintf(w, "  %s\n", g)
		}
	}
	var other []string
	for _, r := range recs {
		if !r.Measured() {
			other = append(other, "  "+describe(r))
		}
	}
	if len(other) > 0 {
		fmt.Fprintf(w, "\nnot measured:\n%s\n", strings.Join(other, "\n"))
	}
	return nil
}

// WriteMarkdown writes a report of f: where it ran, the tables, memory,
// links to plots (paths relative to the report) and what is not built.
func WriteMarkdown(w io.Writer, f File, plots ...string) error {
	var b strings.Builder
	mode := "full"
	if f.Quick {
		mode = "quick"
	}
	fmt.Fprintf(&b, "# tensorlane bench (%s)\n\n", mode)
	fmt.Fprintf(&b, "%s, %s/%s, %d CPUs, %s; took %.1f s; peak RSS %s.\n\n", f.Created.Format("2006-01-02 15:04 UTC"),
		f.GOOS, f.GOARCH, f.CPUs, f.GoVersion, f.Elapsed, bytesString(f.PeakRSS))
	b.WriteString("Simulated cluster: two dgx-h100 hosts in one process (memfd-backed device arenas, real copies, loopback). ")
	b.WriteString("Paths: local (view), p2p (NVLink copy, one runtime), p2p-ipc (NVLink copy into a second runtime on the host, via shared memory), shm (into that runtime's host memory), ")
	b.WriteString("rdma (software verbs over TCP to the other host), tcp (rdma off), tcp-z (tcp, compression always, bf16 weights). Every cell checks that its transfers took the path it names.\n")
	b.WriteString("Each path is interleaved round by round with its baseline; ratio = median over rounds of baseline time / path time (higher is better). ")
	b.WriteString("CPU ms/GB is user and system CPU time per GB moved, both ends together (the baseline's: this process's, or both ucx_perftest processes', estimated); CPU ratio = baseline's CPU per byte / path's (higher is better), which load moves far less than the ratio.\n\n")
	b.WriteString("## Throughput\n\n| path | mode | size | in flight | GB/s | baseline | baseline GB/s | ratio | CPU ms/GB | baseline CPU ms/GB | CPU ratio | heap bytes / GiB | note |\n|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range f.Records {
		if r.Kind == KindThroughput && r.Measured() {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %.2f | %s | %.2f | %s | %s | %s | %s | %s | %s |\n", r.Path, r.Mode, SizeString(r.Size), r.Concurrency, r.GBps,
				r.Baseline, r.BaselineGBps, ratioString(r.Ratio), cpuMs(r.CPUGBps), cpuMs(r.BaselineCPUGBps), cpuRatioString(r),
				bytesString(int64(r.AllocPerGiB)), r.Note)
		}
	}
	if hasKind(f.Records, KindLatency) {
		b.WriteString("\n## Latency (single Gets against a raw TCP ping-pong of the same bytes)\n\n| path | size | p50 µs | p99 µs | baseline | baseline p50 µs | baseline p99 µs | ratio (p50) |\n|---|---:|---:|---:|---|---:|---:|---:|\n")
		for _, r := range f.Records {
			if r.Kind == KindLatency && r.Measured() {
				fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %s |\n", r.Path, SizeString(r.Size), r.P50us, r.P99us,
					r.Baseline, r.BaselineP50us, r.BaselineP99us, ratioString(r.Ratio))
			}
		}
	}
	if goals := CheckGoals(f.Records); len(goals) > 0 {
		b.WriteString("\n## Fabric goals\n\nOne transfer in flight, at sizes where the path is bandwidth-bound.\n\n| path | mode | size | baseline | goal | ratio | |\n|---|---|---:|---|---:|---:|---|\n")
		for _, g := range goals {
			verdict := "met"
			if !g.Met {
				verdict = "**not met**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | >= %.2f | %.2f | %s |\n", g.Path, g.Mode, SizeString(g.Size), g.Baseline, g.Min, g.Ratio, verdict)
		}
	}
	if len(plots) > 0 {
		b.WriteString("\n## Plots\n\n")
		for _, p := range plots {
			fmt.Fprintf(&b, "![%s](%s)\n", p, p)
		}
	}
	b.WriteString("\n## Not measured\n\n")
	for _, r := range f.Records {
		if !r.Measured() {
			fmt.Fprintf(&b, "- %s\n", describe(r))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cpuMs prints a rate in bytes per CPU second as CPU milliseconds per GB
// ("-" when there is none).
func cpuMs(gbps float64) string {
	if gbps <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", 1e3/gbps)
}

// cpuRatioString is the baseline's CPU per byte over the path's ("-" when
// either is missing).
func cpuRatioString(r Record) string {
	if r.CPUGBps <= 0 || r.BaselineCPUGBps <= 0 {
		return "-"
	}
	return ratioString(r.CPUGBps / r.BaselineCPUGBps)
}

func describe(r Record) string {
	s := r.Path + " " + r.Mode
	if r.Size > 0 {
		s += fmt.Sprintf(" %s x%d", SizeString(r.Size), r.Concurrency)
	}
	if r.Baseline != "" {
		s += " vs " + r.Baseline
	}
	s += ": " + r.Status
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

func hasKind(recs []Record, kind string) bool {
	for _, r := range recs {
		if r.Kind == kind && r.Measured() {
			return true
		}
	}
	return false
}

func ratioString(r float64) string {
	if r >= 100 {
		return fmt.Sprintf("%.0fx", r)
	}
	return fmt.Sprintf("%.2fx", r)
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
