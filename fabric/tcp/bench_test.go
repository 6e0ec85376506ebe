package tcp

import (
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

	"github.com/stretchr/testify/require"

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
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(b, err)
			newRawServer(b, ln, f.data)
			raw := dialRaw(b, nil, ln.Addr().String())
			dst := f.dst(b, n)
			to, _ := tensor.BytesOf(dst)
			r := f.remote(n)
			ctx := context.Background()
			// Warm both paths: connections, page faults in dst.
			require.NoError(b, raw.read(to))
			_, err = tr.Read(ctx, r, dst)
			require.NoError(b, err)

			var raws, tcps []time.Duration
			var peak, alloc uint64
			runTCP := func() {
				h := watchHeap()
				t0 := time.Now()
				if _, err := tr.Read(ctx, r, dst); err != nil {
					b.Fatal(err)
				}
				tcps = append(tcps, time.Since(t0))
				p, a := h.done()
				peak, alloc = max(peak, p), max(alloc, a)
			}
			runRaw := func() {
				t0 := time.Now()
				if err := raw.read(to); err != nil {
					b.Fatal(err)
				}
				raws = append(raws, time.Since(t0))
			}
			b.SetBytes(2 * n) // both paths move n bytes per iteration
			b.ReportAllocs()
			for b.Loop() {
				if len(raws)%2 == 0 {
					runRaw()
					runTCP()
				} else {
					runTCP()
					runRaw()
				}
			}
			reportPairs(b, n, "raw", raws, "tcp", tcps)
			if n >= 64<<20 {
				b.ReportMetric(float64(peak), "heap-peak-B")
				b.ReportMetric(float64(alloc), "tcp-alloc-B")
			}
		})
	}
}

// BenchmarkAutoLoopback: on unshaped loopback auto mode must not lose to
// compression off (it should measure the link as faster than the codec and
// send raw). ratio = auto throughput / off throughput.
func BenchmarkAutoLoopback(b *testing.B) {
	const n = 64 << 20
	f := newFixture(b, n, nil)
	f.fillAs(tensor.BFloat16)
	off := f.transport(b, Config{Compression: CompressOff})
	auto := f.transport(b, Config{Compression: CompressAuto})
	benchModes(b, f, n, map[string]*Transport{"off": off, "auto": auto}, "auto", "off")
}

// benchModes reads n bytes through each transport in turn, interleaved,
// and reports each one's throughput and ratio = num/den.
func benchModes(b *testing.B, f *fixture, n int64, trs map[string]*Transport, num, den string) {
	dst := f.dst(b, n)
	r := f.remote(n)
	r.DType = tensor.BFloat16
	ctx := context.Background()
	names := []string{den, num}
	took := map[string][]time.Duration{}
	for _, name := range names { // warm up: connections, link estimate
		for range 2 {
			_, err := trs[name].Read(ctx, r, dst)
			require.NoError(b, err)
		}
	}
	b.SetBytes(int64(len(names)) * n)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		for k := range names {
			name := names[(k+i)%len(names)]
			t0 := time.Now()
			if _, err := trs[name].Read(ctx, r, dst); err != nil {
				b.Fatal(err)
			}
			took[name] = append(took[name], time.Since(t0))
		}
		i++
	}
	reportPairs(b, n, den, took[den], num, took[num])
}

// reportPairs reports the median throughput of each path and the median of
// the per-iteration ratios (base time / other time): each pair ran back to
// back, so a burst of load from other processes skews one pair, not the
// median.
func reportPairs(b *testing.B, n int64, base string, bt []time.Duration, other string, ot []time.Duration) {
	if len(bt) == 0 {
		return
	}
	ratios := make([]float64, len(bt))
	for i := range bt {
		ratios[i] = bt[i].Seconds() / ot[i].Seconds()
	}
	med := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	slices.Sort(ratios)
	unit, scale := "GB/s", 1e9
	if n < 1<<20 {
		b.ReportMetric(float64(med(bt).Nanoseconds())/1e3, base+"-µs")
		b.ReportMetric(float64(med(ot).Nanoseconds())/1e3, other+"-µs")
	} else {
		if n < 1<<30 && base != "raw" {
			unit, scale = "MB/s", 1e6
		}
		b.ReportMetric(float64(n)/med(bt).Seconds()/scale, base+"-"+unit)
		b.ReportMetric(float64(n)/med(ot).Seconds()/scale, other+"-"+unit)
	}
	b.ReportMetric(ratios[len(ratios)/2], "ratio")
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
