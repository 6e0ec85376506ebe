// Package harness runs tensorlane's benchmark matrix: every measured path
// (local, p2p, tcp) over a range of sizes and in-flight counts, each
// interleaved round by round with its baseline from package bench
// (single-thread memcpy for on-host paths, a raw loopback TCP socket and a
// libp2p stream for tcp) so that drift on a shared machine cancels out; a
// latency mode comparing small Gets with a raw TCP ping-pong; memory
// figures; and Check, the regression guard that compares ratios (never
// absolute times) with a stored baseline.
//
// It is a separate package from bench because it drives rdt, and rdt's own
// Go benchmarks import bench for the baselines.
package harness

import (
	"fmt"
	"slices"
	"time"
)

// Paths the harness can measure today.
const (
	PathLocal = "local"
	PathP2P   = "p2p"
	PathTCP   = "tcp"
)

// Baseline names as they appear in records.
const (
	BaseMemcpy   = "memcpy"
	BaseRawTCP   = "tcp-raw"
	BaseLibp2p   = "libp2p"
	BasePingPong = "tcp-pingpong"
)

// ModePull is the only mode built: the reader pulls (Get). Push is listed
// as not built.
const ModePull = "pull"

// Config selects the matrix. The zero value is the full run: sizes 4 KiB to
// 1 GiB, paths local, p2p and tcp, 1, 8 and 64 in flight, the latency mode
// at 4 KiB and 64 KiB with 2000 samples, at least 9 interleaved rounds and
// 1 s per cell, and at most 2 GiB in flight per cell (larger cells are
// recorded as skipped). Quick narrows the defaults to 4 KiB, 1 MiB and
// 64 MiB, 1 and 8 in flight, 500 latency samples, 7 rounds and 200 ms per
// cell; explicit fields override either.
type Config struct {
	Quick bool
	// Sizes in bytes; each must be a positive multiple of 8.
	Sizes []int64
	// Paths, a subset of local, p2p, tcp.
	Paths []string
	// Concurrency lists the numbers of Gets in flight at once.
	Concurrency []int
	// LatencySizes are the sizes of the latency mode.
	LatencySizes []int64
	// NoLatency turns the latency mode off.
	NoLatency bool
	// LatencySamples is the number of timed Gets (and as many ping-pongs)
	// per latency size.
	LatencySamples int
	// MinRounds and MinTime bound each cell from below: it runs
	// interleaved (path, baseline) rounds until both are reached.
	MinRounds int
	MinTime   time.Duration
	// MaxRounds bounds each cell from above. Default 10000.
	MaxRounds int
	// MaxInFlight caps size*concurrency per cell, in bytes.
	MaxInFlight int64
	// Progress, when set, is called after each cell with the count done,
	// the total and the cell's records.
	Progress func(done, total int, recs []Record)
}

func (c Config) withDefaults() (Config, error) {
	out := c
	if out.Sizes == nil {
		out.Sizes = []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30}
		if c.Quick {
			out.Sizes = []int64{4 << 10, 1 << 20, 64 << 20}
		}
	}
	if out.Paths == nil {
		out.Paths = []string{PathLocal, PathP2P, PathTCP}
	}
	if out.Concurrency == nil {
		out.Concurrency = []int{1, 8, 64}
		if c.Quick {
			out.Concurrency = []int{1, 8}
		}
	}
	if out.LatencySizes == nil {
		out.LatencySizes = []int64{4 << 10, 64 << 10}
	}
	if out.LatencySamples <= 0 {
		out.LatencySamples = 2000
		if c.Quick {
			out.LatencySamples = 500
		}
	}
	if out.MinRounds <= 0 {
		out.MinRounds = 9
		if c.Quick {
			out.MinRounds = 7
		}
	}
	if out.MinTime <= 0 {
		out.MinTime = time.Second
		if c.Quick {
			out.MinTime = 200 * time.Millisecond
		}
	}
	if out.MaxRounds <= 0 {
		out.MaxRounds = 10000
	}
	if out.MaxRounds < out.MinRounds {
		out.MaxRounds = out.MinRounds
	}
	if out.MaxInFlight <= 0 {
		out.MaxInFlight = 2 << 30
	}
	for _, s := range append(slices.Clone(out.Sizes), out.LatencySizes...) {
		if s <= 0 || s%8 != 0 {
			return out, fmt.Errorf("harness: size %d must be a positive multiple of 8", s)
		}
	}
	for _, p := range out.Paths {
		switch p {
		case PathLocal, PathP2P, PathTCP:
		default:
			return out, fmt.Errorf("harness: path %q is not built (measurable: local, p2p, tcp)", p)
		}
	}
	for _, n := range out.Concurrency {
		if n <= 0 {
			return out, fmt.Errorf("harness: concurrency %d must be positive", n)
		}
	}
	return out, nil
}

// NotBuilt lists the parts of the matrix in issue 7 that have no
// implementation yet, as records with Status "not built".
func NotBuilt() []Record {
	return []Record{
		{Kind: KindThroughput, Path: "shm", Mode: ModePull, Status: StatusNotBuilt, Note: "no shm transport yet"},
		{Kind: KindThroughput, Path: "rdma", Mode: ModePull, Status: StatusNotBuilt, Note: "no rdma transport (or software provider) yet"},
		{Kind: KindThroughput, Path: "tcp+compression", Mode: ModePull, Status: StatusNotBuilt, Note: "no tensor codec on tcp yet"},
		{Kind: KindThroughput, Path: "*", Mode: "push", Status: StatusNotBuilt, Note: "no Writer (push) transports yet"},
		{Kind: KindThroughput, Path: "*", Mode: ModePull, Baseline: "serialize", Status: StatusNotBuilt, Note: "serialize-into-a-message baseline not built"},
	}
}
