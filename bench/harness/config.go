package harness

import (
	"fmt"
	"slices"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
)

// Paths the harness measures. Each names exactly one transport (see
// Transport): a cell whose transfer reports another transport fails the run
// with ErrWrongPath rather than measure a different path than it says.
const (
	PathLocal  = "local"   // Get on the owner's own GPU: a zero-copy view
	PathP2P    = "p2p"     // NVLink-linked GPU of the same runtime (fabric/local)
	PathP2PIPC = "p2p-ipc" // NVLink-linked GPU of a second runtime on the same host (fabric/shm)
	PathSHM    = "shm"     // host memory of a second runtime on the same host (fabric/shm)
	PathRDMA   = "rdma"    // GPU of a runtime on the other host (software verbs over TCP)
	PathTCP    = "tcp"     // GPU of a runtime on the other host with rdma off, no compression
	PathTCPZ   = "tcp-z"   // as tcp, compression always, on bf16 weights with normal values
	// PathRDMAOFI is rdma through libfabric (fabric/rdma/ofi) between an
	// owner and a reader runtime that both use it: opt-in (a binary built
	// with -tags ofi), never in the defaults.
	PathRDMAOFI = "rdma-ofi"
)

// AllPaths lists every path in matrix order; PushPaths the ones measured in
// push mode too (local is a view, and tcp-z pushes only pull-shaped data).
var (
	AllPaths  = []string{PathLocal, PathP2P, PathP2PIPC, PathSHM, PathRDMA, PathTCP, PathTCPZ}
	PushPaths = []string{PathP2P, PathP2PIPC, PathSHM, PathRDMA, PathTCP}
	// quickPush is the push slice of --quick: the two push paths with
	// their own mechanism (an rdma WRITE and a cross-process copy).
	quickPush = []string{PathP2PIPC, PathRDMA}
	// OptInPaths are measurable when asked for (Config.Paths, Push) only.
	OptInPaths = []string{PathRDMAOFI}
)

// Transport is the fabric transport a transfer of path must report.
func Transport(path string) string {
	switch path {
	case PathLocal:
		return fabric.Local
	case PathP2P, PathP2PIPC:
		return fabric.P2P
	case PathSHM:
		return fabric.SHM
	case PathRDMA, PathRDMAOFI:
		return fabric.RDMA
	case PathTCP, PathTCPZ:
		return fabric.TCP
	}
	return ""
}

// Baseline names as they appear in records.
const (
	BaseMemcpy = "memcpy"
	BaseRawTCP = "tcp-raw"
	BaseLibp2p = "libp2p"
	// BaseSerialize is the object-store way: serialize into chunk messages
	// and deserialize into the destination (bench.Serializer on one host,
	// bench.SerializePair across a socket between hosts).
	BaseSerialize = "serialize"
	BasePingPong  = "tcp-pingpong"
	// BaseUCXTCP and BaseUCXSM are UCX's ucx_perftest over its tcp and
	// shared-memory (sm: posix and cma) transports, measured when it is
	// installed (bench/ucx.go).
	// Their plain rows keep UCX's own window (tag_bw: up to 32 messages
	// in flight, bench.UCXWindow), which hides each message's start and
	// drain; the -o1 rows keep one in flight, like one Get, and are what
	// the goals compare a cell of one Get in flight with. A cell of N Gets
	// in flight gets the plain row only.
	BaseUCXTCP  = "ucx-tcp"
	BaseUCXSM   = "ucx-sm"
	BaseUCXTCP1 = "ucx-tcp-o1"
	BaseUCXSM1  = "ucx-sm-o1"
	// UCXMinSize is the least message size UCX's baselines run at: each
	// of their rounds starts two processes and moves at least 256 MiB, so
	// small messages cost minutes and say nothing about the bulk path the
	// comparison is about.
	UCXMinSize = 1 << 20
)

// Modes: the reader pulls (Get into its buffer), or the owner pushes into
// a slot the reader reserved (Reserve, Push, Wait).
const (
	ModePull = "pull"
	ModePush = "push"
)

// Config selects the matrix. The zero value is the full run: sizes 4 KiB to
// 1 GiB, every path pulled and every push path pushed, 1, 8 and 64 in
// flight, the latency mode at 4 KiB and 64 KiB with 2000 samples, at least
// 9 interleaved rounds and 1 s per cell, and at most 2 GiB in flight per
// cell (larger cells are recorded as skipped). Quick narrows the defaults
// to 1 MiB and 64 MiB, 1 and 8 in flight with at most 64 MiB in flight
// (so 64 MiB runs at 1 only), push for p2p-ipc and rdma only, 500 latency
// samples, 5 rounds and 150 ms per cell; explicit fields override either
// (an empty, non-nil slice selects none).
type Config struct {
	Quick bool
	// Sizes in bytes; each must be a positive multiple of 8.
	Sizes []int64
	// Paths measured in pull mode, a subset of AllPaths.
	Paths []string
	// Push lists the paths measured in push mode, a subset of PushPaths.
	Push []string
	// Concurrency lists the numbers of Gets in flight at once.
	Concurrency []int
	// LatencySizes are the sizes of the latency mode.
	LatencySizes []int64
	// NoLatency turns the latency mode off.
	NoLatency bool
	// NoUCX leaves out UCX's baselines (ucx-tcp, ucx-sm, and at one Get
	// in flight ucx-tcp-o1, ucx-sm-o1), which otherwise run beside tcp
	// and shm pulls of UCXMinSize and up whenever ucx_perftest is
	// installed (outside Quick).
	NoUCX bool
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
			out.Sizes = []int64{1 << 20, 64 << 20}
		}
	}
	if out.Paths == nil {
		out.Paths = slices.Clone(AllPaths)
	}
	if out.Push == nil {
		out.Push = slices.Clone(PushPaths)
		if c.Quick {
			out.Push = slices.Clone(quickPush)
		}
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
			out.MinRounds = 5
		}
	}
	if out.MinTime <= 0 {
		out.MinTime = time.Second
		if c.Quick {
			out.MinTime = 150 * time.Millisecond
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
		if c.Quick {
			// 64 MiB x 8 of tcp-z alone takes half a minute on a loaded
			// 2-core machine; quick measures 8 in flight at 1 MiB.
			out.MaxInFlight = 64 << 20
		}
	}
	for _, s := range append(slices.Clone(out.Sizes), out.LatencySizes...) {
		if s <= 0 || s%8 != 0 {
			return out, fmt.Errorf("harness: size %d must be a positive multiple of 8", s)
		}
	}
	for _, p := range out.Paths {
		if !slices.Contains(AllPaths, p) && !slices.Contains(OptInPaths, p) {
			return out, fmt.Errorf("harness: unknown path %q (measurable: %v, opt-in: %v)", p, AllPaths, OptInPaths)
		}
	}
	for _, p := range out.Push {
		if !slices.Contains(PushPaths, p) && !slices.Contains(OptInPaths, p) {
			return out, fmt.Errorf("harness: path %q has no push mode (push paths: %v)", p, PushPaths)
		}
	}
	for _, n := range out.Concurrency {
		if n <= 0 {
			return out, fmt.Errorf("harness: concurrency %d must be positive", n)
		}
	}
	return out, nil
}
