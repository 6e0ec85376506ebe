package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	rtmetrics "runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/netns"
	"github.com/tensorlane/tensorlane/internal/netns/netnstest"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// rawServer is the baseline: one plain TCP connection that answers an
// 8-byte length with that many bytes of data, written in one call.
type rawServer struct {
	ln   net.Listener
	done chan struct{}
}

func newRawServer(tb testing.TB, ln net.Listener, data []byte) *rawServer {
	s := &rawServer{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var n [8]byte
		for {
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			if _, err := c.Write(data[:binary.BigEndian.Uint64(n[:])]); err != nil {
				return
			}
		}
	}()
	tb.Cleanup(func() { ln.Close(); <-s.done })
	return s
}

// rawBeside serves f's bytes over one plain TCP socket on loopback and
// dials it: the baseline the benchmarks interleave with tcp reads.
func rawBeside(tb testing.TB, f *fixture) *rawClient {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	newRawServer(tb, ln, f.data)
	return dialRaw(tb, nil, ln.Addr().String())
}

// rawClient reads from a rawServer over one connection.
type rawClient struct{ c net.Conn }

func dialRaw(tb testing.TB, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string) *rawClient {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	c, err := dial(context.Background(), "tcp", addr)
	require.NoError(tb, err)
	c.(*net.TCPConn).SetNoDelay(true)
	tb.Cleanup(func() { c.Close() })
	return &rawClient{c: c}
}

func (r *rawClient) read(p []byte) error {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(p)))
	if _, err := r.c.Write(n[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(r.c, p)
	return err
}

// heapWatch samples the live heap while a transfer runs, through
// runtime/metrics (no stop-the-world), and reports the peak above the
// level at start, and the bytes allocated meanwhile.
type heapWatch struct {
	stop       chan struct{}
	wg         sync.WaitGroup
	base, peak atomic.Uint64
	alloc0     uint64
}

var heapSample = []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/allocs:bytes"}}

func readHeap() (live, allocs uint64) {
	s := make([]rtmetrics.Sample, len(heapSample))
	copy(s, heapSample)
	rtmetrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

func watchHeap() *heapWatch {
	h := &heapWatch{stop: make(chan struct{})}
	live, allocs := readHeap()
	h.base.Store(live)
	h.peak.Store(live)
	h.alloc0 = allocs
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-tick.C:
				if live, _ := readHeap(); live > h.peak.Load() {
					h.peak.Store(live)
				}
			}
		}
	}()
	return h
}

// done returns the peak live heap above the start and the bytes allocated.
func (h *heapWatch) done() (peak, alloc uint64) {
	close(h.stop)
	h.wg.Wait()
	live, allocs := readHeap()
	if live > h.peak.Load() {
		h.peak.Store(live)
	}
	return h.peak.Load() - h.base.Load(), allocs - h.alloc0
}

// BenchmarkRead compares tcp reads with a raw Go TCP socket (one
// connection, same bytes), interleaved in the same iterations so machine
// load hits both alike. ratio = tcp throughput / raw throughput.
// heap-peak-B is the most the live Go heap grew during a tcp read
// (destination buffers are device arenas, outside the heap); tcp-alloc-B
// what it allocated.
func BenchmarkRead(b *testing.B) {
	for _, n := range []int64{4 << 10, 64 << 20, 1 << 30} {
		b.Run(sizeName(n), func(b *testing.B) {
			f := newFixture(b, n, nil)
			tr := f.transport(b, Config{Compression: CompressOff, StripeMin: 8 << 20})
			raw := rawBeside(b, f)
			dst := f.dst(b, n)
			to, _ := tensor.BytesOf(dst)
			r := f.remote(n)
			ctx := context.Background()
			// Warm both paths: connections, page faults in dst.
			require.NoError(b, raw.read(to))
			_, err := tr.Read(ctx, r, dst)
			require.NoError(b, err)

			var raws, tcps []time.Duration
			var cpuRaw, cpuTCP time.Duration
			var peak, alloc uint64
			runTCP := func() {
				var h *heapWatch
				if n >= 64<<20 {
					h = watchHeap()
				}
				c0, t0 := testhelp.CPUTime(), time.Now()
				if _, err := tr.Read(ctx, r, dst); err != nil {
					b.Fatal(err)
				}
				tcps = append(tcps, time.Since(t0))
				cpuTCP += testhelp.CPUTime() - c0
				if h != nil {
					p, a := h.done()
					peak, alloc = max(peak, p), max(alloc, a)
				}
			}
			runRaw := func() {
				c0, t0 := testhelp.CPUTime(), time.Now()
				if err := raw.read(to); err != nil {
					b.Fatal(err)
				}
				raws = append(raws, time.Since(t0))
				cpuRaw += testhelp.CPUTime() - c0
			}
			b.ReportAllocs()
			// Small reads repeat within an iteration, so a -benchtime that
			// suits 1 GiB still gives small ones enough samples.
			reps := int(max(1, min(100, (16<<20)/n)))
			b.SetBytes(2 * n * int64(reps))
			for b.Loop() {
				for range reps {
					if len(raws)%2 == 0 {
						runRaw()
						runTCP()
					} else {
						runTCP()
						runRaw()
					}
				}
			}
			reportPairs(b, n, "raw", raws, "tcp", tcps)
			// CPU per byte, both ends together (one process): what the
			// path costs when the cores are contended, independent of
			// how the scheduler treated each run.
			b.ReportMetric(cpuTCP.Seconds()/cpuRaw.Seconds(), "cpu-tcp/raw")
			if n >= 64<<20 {
				b.ReportMetric(float64(peak), "heap-peak-B")
				b.ReportMetric(float64(alloc), "tcp-alloc-B")
			}
		})
	}
}

// BenchmarkAutoLoopback: on unshaped loopback auto mode must not lose to
// compression off (it should measure the link as faster than the codec and
// send raw). auto-ratio = auto throughput / off throughput.
func BenchmarkAutoLoopback(b *testing.B) {
	const n = 64 << 20
	f := newFixture(b, n, nil)
	f.fillAs(tensor.BFloat16)
	benchModes(b, f, n, nil, CompressOff, CompressAuto)
}

// BenchmarkShapedLink reads bf16 weights (normally distributed) over a
// veth pair between two network namespaces shaped to 1 Gbit/s with tbf:
// always-ratio = compressed throughput / uncompressed, auto-ratio = auto /
// uncompressed (auto has to discover that the link is slow).
func BenchmarkShapedLink(b *testing.B) {
	netnstest.Require(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, reader := netnstest.New(b, "own"), netnstest.New(b, "rd")
	if err := netns.Veth(ctx, owner, "to", "10.77.0.1/24", reader, "tr", "10.77.0.2/24"); err != nil {
		b.Fatal(err)
	}
	for _, e := range []struct {
		ns  *netns.NS
		dev string
	}{{owner, "to"}, {reader, "tr"}} {
		if err := e.ns.Shape(ctx, e.dev, netns.Shape{Rate: "1gbit"}); err != nil {
			b.Fatal(err)
		}
	}
	ln, err := owner.Listen(ctx, "tcp", "10.77.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	const n = 64 << 20
	f := newFixture(b, n, func(c *ServerConfig) { c.Listener = ln })
	f.fillAs(tensor.BFloat16)
	benchModes(b, f, n, reader.DialFunc(), CompressOff, CompressAlways, CompressAuto)
}

// benchModes reads n bytes of bf16 through one transport per mode, in
// turn, and reports each mode's median throughput and, for every mode but
// the first, the median ratio of its throughput to the first's.
func benchModes(b *testing.B, f *fixture, n int64, dial func(context.Context, string, string) (net.Conn, error), modes ...Compression) {
	dst := f.dst(b, n)
	r := f.remote(n)
	r.DType = tensor.BFloat16
	ctx := context.Background()
	trs := make([]*Transport, len(modes))
	took := make([][]time.Duration, len(modes))
	for i, m := range modes {
		trs[i] = f.transport(b, Config{Compression: m, Dial: dial, Streams: 4, StripeMin: 8 << 20})
		for range 2 { // warm up: connections, link estimate
			_, err := trs[i].Read(ctx, r, dst)
			require.NoError(b, err)
		}
	}
	b.SetBytes(int64(len(modes)) * n)
	b.ReportAllocs()
	cpu := make([]time.Duration, len(modes))
	it := 0
	for b.Loop() {
		for k := range modes {
			i := (k + it) % len(modes)
			c0, t0 := testhelp.CPUTime(), time.Now()
			if _, err := trs[i].Read(ctx, r, dst); err != nil {
				b.Fatal(err)
			}
			took[i] = append(took[i], time.Since(t0))
			cpu[i] += testhelp.CPUTime() - c0
		}
		it++
	}
	got, _ := tensor.BytesOf(dst)
	require.True(b, bytes.Equal(got, f.data[:n]), "bytes differ")
	for i, m := range modes {
		b.ReportMetric(float64(n)/testhelp.Median(took[i]).Seconds()/1e6, m.String()+"-MB/s")
		if i > 0 {
			b.ReportMetric(medianRatio(took[0], took[i]), m.String()+"-ratio")
		}
		// CPU both ends spent (they share this process): what compression
		// costs, and why it cannot pay when other processes hold the cores.
		b.ReportMetric(cpu[i].Seconds()*1e3/float64(it), m.String()+"-cpu-ms")
	}
	for i, m := range modes {
		raw, wire := testutil.ToFloat64(trs[i].m.raw), testutil.ToFloat64(trs[i].m.wire)
		if raw > 0 {
			b.ReportMetric(wire/raw, m.String()+"-wire/raw")
		}
	}
}

// medianRatio is the median over iterations of base[i]/other[i]: each pair
// ran back to back, so a burst of load from other processes skews one pair,
// not the median.
func medianRatio(base, other []time.Duration) float64 {
	r := make([]float64, len(base))
	for i := range base {
		r[i] = base[i].Seconds() / other[i].Seconds()
	}
	slices.Sort(r)
	return r[len(r)/2]
}

// reportPairs reports the median latency or throughput of both paths and
// the median of the per-iteration ratios (base time / other time).
func reportPairs(b *testing.B, n int64, base string, bt []time.Duration, other string, ot []time.Duration) {
	if len(bt) == 0 {
		return
	}
	if n < 1<<20 {
		b.ReportMetric(float64(testhelp.Median(bt).Nanoseconds())/1e3, base+"-µs")
		b.ReportMetric(float64(testhelp.Median(ot).Nanoseconds())/1e3, other+"-µs")
	} else {
		b.ReportMetric(float64(n)/testhelp.Median(bt).Seconds()/1e9, base+"-GB/s")
		b.ReportMetric(float64(n)/testhelp.Median(ot).Seconds()/1e9, other+"-GB/s")
	}
	b.ReportMetric(medianRatio(bt, ot), "ratio")
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
