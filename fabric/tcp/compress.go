package tcp

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/internal/tcodec"
)

// Compression says when transfers are compressed.
type Compression uint8

const (
	// CompressAuto compresses only when it pays: when the measured
	// throughput of the link to the peer is below the codec's measured
	// throughput, so a fast link is never slowed down. The default.
	CompressAuto Compression = iota
	// CompressOff never compresses.
	CompressOff
	// CompressAlways compresses every transfer (tests, known-slow links).
	CompressAlways
)

func (c Compression) String() string {
	switch c {
	case CompressAuto:
		return "auto"
	case CompressOff:
		return "off"
	case CompressAlways:
		return "always"
	}
	return fmt.Sprintf("Compression(%d)", uint8(c))
}

const (
	// minCompress: smaller transfers are latency-bound; compressing them
	// saves nothing worth the CPU.
	minCompress = 1 << 20
	// minEstimate: smaller transfers say more about latency than about
	// the link's throughput, so they do not update the estimate.
	minEstimate = 1 << 20
	// probeEvery: one auto transfer in this many that would be compressed
	// goes raw instead, so the link estimate cannot go stale while the
	// codec hides the link.
	probeEvery = 16
	// retryCompressed: after compression lost to raw (a busy CPU, a noisy
	// sample), every this-many-th transfer tries it again; sooner than
	// probeEvery, because CPU contention comes and goes and a retry costs at
	// most one slower transfer.
	retryCompressed = 4
	// incompressible: a peer whose recent data shrank less than this gets
	// raw transfers (with the same occasional probe).
	incompressible = 0.95
	ewma           = 0.3
)

// linkEstimate is what the transport knows about the link to one peer.
type linkEstimate struct {
	bps        float64 // wire bytes per second of raw transfers, EWMA; 0 = not measured
	compBps    float64 // raw bytes per second achieved by compressed transfers, EWMA; 0 = unknown
	ratio      float64 // wire/raw of recent compressed transfers, EWMA; 0 = unknown
	compressed int     // auto transfers compressed since the last raw one
	skipped    int     // auto transfers sent raw (incompressible, codec slower) since the last compressed one
}

// decide is the compression decision: a pure function of the mode, the
// transfer size, what is known of the link, and the codec's throughput
// (bytes per second, all streams together). It returns the decision and a
// short reason (a metric label).
//
// In auto mode a transfer is compressed when the link is slower than the
// codec, unless compressed transfers to this peer turned out slower than
// raw ones (the CPU is busy, or the data does not shrink). Every
// probeEvery-th transfer tries the other way, so neither estimate goes
// stale.
func decide(mode Compression, n int64, est linkEstimate, codecBps float64) (bool, string) {
	switch {
	case n == 0:
		return false, "empty"
	case mode == CompressOff:
		return false, "off"
	case mode == CompressAlways:
		return true, "always"
	case n < minCompress:
		return false, "small"
	case est.bps == 0:
		return false, "link-unmeasured"
	case est.bps >= codecBps:
		return false, "link-faster"
	case est.compressed+1 >= probeEvery:
		return false, "probe-raw"
	}
	incomp := est.ratio >= incompressible
	slower := est.compBps > 0 && est.compBps < est.bps
	switch {
	case incomp && est.skipped+1 >= probeEvery, !incomp && slower && est.skipped+1 >= retryCompressed:
		return true, "probe-compressed"
	case incomp:
		return false, "incompressible"
	case slower:
		return false, "compressed-slower"
	}
	return true, "link-slower"
}

// links holds the per-peer estimates.
type links struct {
	mu sync.Mutex
	m  map[connKey]*linkEstimate
}

func (l *links) get(k connKey) linkEstimate {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.m[k]; e != nil {
		return *e
	}
	return linkEstimate{}
}

func (l *links) entry(k connKey) *linkEstimate {
	if l.m == nil {
		l.m = map[connKey]*linkEstimate{}
	}
	e := l.m[k]
	if e == nil {
		e = &linkEstimate{}
		l.m[k] = e
	}
	return e
}

// set injects an estimate (tests).
func (l *links) set(k connKey, bps, ratio float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(k)
	e.bps, e.ratio = bps, ratio
}

func mix(old, v float64) float64 {
	if old == 0 {
		return v
	}
	return (1-ewma)*old + ewma*v
}

// observe folds a finished transfer into the peer's estimate. Raw
// transfers measure the link; compressed ones measure what compression
// achieves (ratio, and raw bytes per second), never the link, whose speed
// they hide behind the codec's.
func (l *links) observe(k connKey, compressed bool, reason string, raw, wire int64, d time.Duration) {
	if d <= 0 || raw < minEstimate {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(k)
	sec := d.Seconds()
	auto := reason != "always" && reason != "off"
	if compressed {
		e.ratio = mix(e.ratio, float64(wire)/float64(raw))
		e.compBps = mix(e.compBps, float64(raw)/sec)
		if auto {
			e.compressed++
			e.skipped = 0
		}
		return
	}
	e.bps = mix(e.bps, float64(wire)/sec)
	if auto {
		e.compressed = 0
		if reason == "incompressible" || reason == "compressed-slower" {
			e.skipped++
		}
	}
}

// The codec's measured rate. Deciding transfers read it without a lock;
// one of them at a time (codecMu) measures it again when it is stale, and
// the others decide by the last figure meanwhile instead of waiting the
// millisecond or two a measurement takes. Only the first measurement is
// waited for: there is no figure before it.
var (
	codecMu   sync.Mutex
	codecCore atomic.Uint64 // float64 bits: bytes per second of one core, encode or decode, the slower; 0: never measured
	codecAt   atomic.Int64  // when it was measured, Unix nanoseconds
)

// codecRefresh: how long a measurement of the codec stands. Once per process
// was too little: a measurement taken while the host was loaded held for
// good, and with it "link-faster" (never compress) on a link the codec
// beats; the load comes and goes, and a measurement costs a millisecond.
const codecRefresh = 30 * time.Second

// codecThroughput measures, at most every codecRefresh, how fast one core
// encodes and decodes bf16 weights (the codec's slowest common case), and
// scales it by the streams that run codecs in parallel.
func codecThroughput(streams int) float64 {
	core := math.Float64frombits(codecCore.Load())
	stale := time.Since(time.Unix(0, codecAt.Load())) > codecRefresh
	switch {
	case core == 0:
		codecMu.Lock() // the first figure: wait for whoever measures it
		core = measureCodecLocked()
		codecMu.Unlock()
	case stale && codecMu.TryLock():
		core = measureCodecLocked()
		codecMu.Unlock()
	}
	return core * float64(min(streams, runtime.GOMAXPROCS(0)))
}

// measureCodecLocked measures the codec unless another caller did while
// this one waited for codecMu, and returns the current figure.
func measureCodecLocked() float64 {
	if core := math.Float64frombits(codecCore.Load()); core != 0 && time.Since(time.Unix(0, codecAt.Load())) <= codecRefresh {
		return core
	}
	// Small enough to cost a millisecond or two on the transfer that
	// measures (it runs on that transfer's path; 1 MiB cost 8 ms).
	const n = 64 << 10
	src := make([]byte, 2*n)
	tcodec.FillNormal(src, 2, 0.02, 7)
	enc, dec := tcodec.NewEncoder(), tcodec.NewDecoder()
	hint := tcodec.Hint{Elem: 2, Float: true}
	var blocks [][]byte
	// One untimed block first: table set-up is not throughput.
	warm, _ := enc.AppendBlock(nil, src[:n], hint)
	dec.DecodeBlock(make([]byte, 0, n), warm)
	t0 := time.Now()
	for off := 0; off < len(src); off += n {
		b, _ := enc.AppendBlock(nil, src[off:off+n], hint)
		blocks = append(blocks, b)
	}
	te := time.Since(t0)
	out := make([]byte, 0, n)
	t0 = time.Now()
	for _, b := range blocks {
		dec.DecodeBlock(out[:0], b)
	}
	td := time.Since(t0)
	core := float64(len(src)) / max(te, td, time.Microsecond).Seconds()
	codecCore.Store(math.Float64bits(core))
	codecAt.Store(time.Now().UnixNano()) // after the figure: a reader that sees it fresh sees the figure
	return core
}

// reasons are the reasons decide gives, with the decision each implies.
var reasons = map[string]bool{
	"empty": false, "off": false, "always": true, "small": false, "link-unmeasured": false,
	"link-faster": false, "probe-raw": false, "probe-compressed": true, "incompressible": false,
	"compressed-slower": false, "link-slower": true,
}

// decided returns the counter of a decision.
func (m *metrics) decided(compress bool, reason string) prometheus.Counter {
	if c, ok := m.byReason[reason]; ok && reasons[reason] == compress {
		return c
	}
	return m.decisions.WithLabelValues(strconv.FormatBool(compress), reason)
}

// metrics counts compression decisions and what compression saved.
type metrics struct {
	decisions *prometheus.CounterVec // tensorlane_tcp_compression_decisions_total{compress,reason}
	raw       prometheus.Counter     // tensorlane_tcp_compressed_raw_bytes_total
	wire      prometheus.Counter     // tensorlane_tcp_compressed_wire_bytes_total
	// byReason caches decisions' counters: every reason decide gives
	// implies whether it compresses, and looking a counter up by its
	// labels costs a hash and a lock per transfer.
	byReason map[string]prometheus.Counter
	dials    prometheus.Counter     // tensorlane_tcp_dials_total
	waits    prometheus.Counter     // tensorlane_tcp_conn_waits_total
	pushSums *prometheus.CounterVec // tensorlane_tcp_push_checksums_total{source}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_tcp_compression_decisions_total",
			Help: "Compression decisions of the tcp transport, by outcome and reason.",
		}, []string{"compress", "reason"}),
		raw: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_tcp_compressed_raw_bytes_total",
			Help: "Bytes of tensors moved compressed, before compression.",
		}),
		wire: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_tcp_compressed_wire_bytes_total",
			Help: "Bytes on the wire for tensors moved compressed (block headers included).",
		}),
		dials: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_tcp_dials_total",
			Help: "Data connections the tcp transport opened (and authenticated).",
		}),
		waits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_tcp_conn_waits_total",
			Help: "Transfers that found MaxConns connections to their owner busy and waited for one.",
		}),
		pushSums: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_tcp_push_checksums_total",
			Help: "Raw blocks the tcp transport pushed with a checksum, by its source: cached (a sealed object's, computed once), stored (computed and cached), computed (at send).",
		}, []string{"source"}),
	}
	m.byReason = map[string]prometheus.Counter{}
	for reason, compress := range reasons {
		m.byReason[reason] = m.decisions.WithLabelValues(strconv.FormatBool(compress), reason)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.raw, m.wire, m.dials, m.waits, m.pushSums} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("tcp: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
