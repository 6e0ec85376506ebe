package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// Kinds of record.
const (
	KindThroughput = "throughput"
	KindLatency    = "latency"
)

// Statuses of a record. Only measured records have numbers and take part in
// a check.
const (
	StatusOK       = ""
	StatusNotBuilt = "not built"
	StatusSkipped  = "skipped"
)

// Record is one cell of the matrix. Throughput records compare GB/s with a
// baseline measured in the same loop; latency records compare percentiles of
// single small Gets with a raw TCP ping-pong of the same bytes. Ratio is
// always "higher is better": path GB/s over baseline GB/s, or baseline p50
// over path p50.
type Record struct {
	Kind         string  `json:"kind"`
	Path         string  `json:"path"`
	Mode         string  `json:"mode"`
	Size         int64   `json:"size"`
	Concurrency  int     `json:"concurrency"`
	GBps         float64 `json:"gbps"`
	Baseline     string  `json:"baseline"`
	BaselineGBps float64 `json:"baseline_gbps"`
	Ratio        float64 `json:"ratio"`

	P50us         float64 `json:"p50_us,omitempty"`
	P99us         float64 `json:"p99_us,omitempty"`
	BaselineP50us float64 `json:"baseline_p50_us,omitempty"`
	BaselineP99us float64 `json:"baseline_p99_us,omitempty"`

	// MedianGBps and BestGBps are the path's rate in its median and its
	// fastest round: figures a loaded machine moves less than the mean
	// (the A/B guard, bench/ab, compares builds on them).
	MedianGBps float64 `json:"median_gbps,omitempty"`
	BestGBps   float64 `json:"best_gbps,omitempty"`
	// CPUGBps is bytes moved per second of this process's CPU time (user
	// and system, every thread) in the path's rounds: what the path costs,
	// which other processes' load changes far less than its rate.
	CPUGBps float64 `json:"cpu_gbps,omitempty"`
	// BaselineCPUGBps is the same for the baseline: this process's CPU in
	// its rounds, or for UCX both ucx_perftest processes' (an estimate,
	// see bench.UCX.RoundCPU). CPUGBps over it is the path's CPU per byte
	// against the baseline's, below 1 when the path costs more.
	BaselineCPUGBps float64 `json:"baseline_cpu_gbps,omitempty"`
	// Rounds is how many interleaved (path, baseline) pairs were timed.
	Rounds int `json:"rounds,omitempty"`
	// AllocPerGiB is heap bytes allocated by the measured path per GiB moved.
	AllocPerGiB float64 `json:"alloc_per_gib,omitempty"`
	// PeakRSS is the process's peak resident set (VmHWM) after the cell.
	PeakRSS int64 `json:"peak_rss,omitempty"`
	// WireRatio is, for a compressed path, wire bytes over raw bytes of the
	// timed transfers (lower is better).
	WireRatio float64 `json:"wire_ratio,omitempty"`
	// Tolerance, in a baseline file, overrides the check's tolerance for
	// this cell when larger: noisy cells get a wider band of their own
	// instead of being dropped (see docs/benchmarks.md).
	Tolerance float64 `json:"tolerance,omitempty"`

	Status string `json:"status,omitempty"`
	Note   string `json:"note,omitempty"`
}

// Measured reports whether r carries numbers.
func (r Record) Measured() bool { return r.Status == StatusOK }

// Key identifies a cell across runs.
func (r Record) Key() string {
	return fmt.Sprintf("%s/%s/%s/%s/c%d/vs-%s", r.Kind, r.Path, r.Mode, SizeString(r.Size), r.Concurrency, r.Baseline)
}

// File is what --out writes as results.json and --write-baseline writes:
// the records and where they were measured.
type File struct {
	Version   int       `json:"version"`
	Created   time.Time `json:"created"`
	Quick     bool      `json:"quick"`
	GoVersion string    `json:"go"`
	GOOS      string    `json:"goos"`
	GOARCH    string    `json:"goarch"`
	CPUs      int       `json:"cpus"`
	PeakRSS   int64     `json:"peak_rss"`
	Elapsed   float64   `json:"elapsed_s"`
	Records   []Record  `json:"records"`
}

// FileVersion is the version of File this package writes.
const FileVersion = 1

// WriteFile writes f as indented JSON to path.
func WriteFile(path string, f File) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadFile reads a File written by WriteFile.
func ReadFile(path string) (File, error) {
	var f File
	b, err := os.ReadFile(path)
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("harness: %s: %w", path, err)
	}
	if f.Version != FileVersion {
		return f, fmt.Errorf("harness: %s: version %d, want %d", path, f.Version, FileVersion)
	}
	return f, nil
}

// WriteJSONLines writes one JSON object per record.
func WriteJSONLines(w io.Writer, recs []Record) error {
	enc := json.NewEncoder(w)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// SizeString prints n as 4KiB, 64MiB, 1GiB (or bytes when not a whole unit).
func SizeString(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10) + "B"
}
