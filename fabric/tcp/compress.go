package tcp

import (
	"fmt"
	"runtime"
	"sync"
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
	// incompressible: a peer whose recent data shrank less than this gets
	// raw transfers (with the same occasional probe).
	incompressible = 0.95
	ewma           = 0.3
)

// linkEstimate is what the transport knows about the link to one peer.
type linkEstimate struct {
	bps        float64 // wire bytes per second, EWMA; 0 = not measured
	ratio      float64 // wire/raw of recent compressed transfers, EWMA; 0 = unknown
	compressed int     // auto transfers compressed since the last raw one
	skipped    int     // auto transfers sent raw as incompressible since the last compressed one
}

// decide is the compression decision: a pure function of the mode, the
// transfer size, what is known of the link, and the codec's throughput
// (bytes per second, all streams together). It returns the decision and a
// short reason (a metric label).
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
		return false, "probe"
	case est.ratio >= incompressible && est.skipped+1 < probeEvery:
		return false, "incompressible"
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

// observe folds a finished transfer into the peer's estimate. A raw
// transfer measures the link. A compressed one measures it only when the
// codec was not the bottleneck (raw throughput clearly below the codec's),
// else it would report the codec's speed as the link's.
func (l *links) observe(k connKey, compressed bool, reason string, raw, wire int64, d time.Duration, codecBps float64) {
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
		e.skipped = 0
		if auto {
			e.compressed++
		}
		if float64(raw)/sec < 0.8*codecBps {
			e.bps = mix(e.bps, float64(wire)/sec)
		}
		return
	}
	if auto {
		e.compressed = 0
	}
	if reason == "incompressible" {
		e.skipped++
	}
	e.bps = mix(e.bps, float64(wire)/sec)
}

var (
	codecOnce sync.Once
	codecCore float64 // measured bytes per second of one core, encode or decode, the slower
)

// codecThroughput measures, once per process, how fast one core encodes and
// decodes bf16 weights (the codec's slowest common case), and scales it by
// the streams that run codecs in parallel.
func codecThroughput(streams int) float64 {
	codecOnce.Do(func() {
		const n = 256 << 10
		src := make([]byte, 4*n)
		tcodec.FillNormal(src, 2, 0.02, 7)
		enc, dec := tcodec.NewEncoder(), tcodec.NewDecoder()
		hint := tcodec.Hint{Elem: 2, Float: true}
		var blocks [][]byte
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
		codecCore = float64(len(src)) / max(te, td, time.Microsecond).Seconds()
	})
	return codecCore * float64(min(streams, runtime.GOMAXPROCS(0)))
}

// metrics counts compression decisions and what compression saved.
type metrics struct {
	decisions *prometheus.CounterVec // tensorlane_tcp_compression_decisions_total{compress,reason}
	raw       prometheus.Counter     // tensorlane_tcp_compressed_raw_bytes_total
	wire      prometheus.Counter     // tensorlane_tcp_compressed_wire_bytes_total
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
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.raw, m.wire} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("tcp: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
