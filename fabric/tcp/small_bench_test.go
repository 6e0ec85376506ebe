package tcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// smallRaw is the baseline of BenchmarkSmall: plain TCP connections, one
// per worker, on which a request is an op byte and an 8-byte length. A
// pull is answered with that many bytes written in one call; a push sends
// the bytes after the request and is answered with one byte once they all
// arrived. It is what the tcp transport does minus authentication,
// framing, checksums and pooling.
type smallRaw struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newSmallRaw(tb testing.TB, data []byte) *smallRaw {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	s := &smallRaw{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				c.(*net.TCPConn).SetNoDelay(true)
				var req [9]byte
				sink := make([]byte, len(data))
				for {
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					n := binary.BigEndian.Uint64(req[1:])
					if req[0] == opRead {
						_, err = c.Write(data[:n])
					} else if _, err = io.ReadFull(c, sink[:n]); err == nil {
						_, err = c.Write(req[:1])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *smallRaw) dial(tb testing.TB) net.Conn {
	c, err := net.Dial("tcp", s.ln.Addr().String())
	require.NoError(tb, err)
	c.(*net.TCPConn).SetNoDelay(true)
	tb.Cleanup(func() { c.Close() })
	return c
}

// smallRawOp runs one pull (into p) or push (of p) on c.
func smallRawOp(c net.Conn, op byte, p []byte) error {
	var req [9]byte
	req[0] = op
	binary.BigEndian.PutUint64(req[1:], uint64(len(p)))
	if op == opRead {
		if _, err := c.Write(req[:]); err != nil {
			return err
		}
		_, err := io.ReadFull(c, p)
		return err
	}
	bufs := net.Buffers{req[:], p}
	if _, err := bufs.WriteTo(c); err != nil {
		return err
	}
	_, err := io.ReadFull(c, req[:1])
	return err
}

// heapAllocs counts the heap allocations so far. runtime/metrics would
// not stop the world, but its counts lag behind (per-P caches flush
// lazily), which hides a few allocations per transfer.
func heapAllocs() (objects, bytes uint64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs, ms.TotalAlloc
}

// BenchmarkSmall measures the fixed cost of small and concurrent
// transfers: pulls (Read) and pushes (Write) of 4 KiB, 64 KiB and 1 MiB
// with 1, 8 and 64 in flight through one transport (as a runtime's reader
// has), against the same number of raw TCP connections moving the same
// bytes (smallRaw), interleaved round by round so machine load hits both
// alike. A round runs k transfers on each of c workers, k such that a
// round moves about 1 MiB a side.
//
// ratio is the median over rounds of raw time / tcp time (1 = as fast as
// raw TCP); tcp-µs/xfer and raw-µs/xfer are median round times per
// transfer; allocs/xfer and B/xfer count what the tcp transfers alone
// allocated (both ends: owner and reader share the process), and conns
// how many connections the tcp reader opened in all (warm-up included).
func BenchmarkSmall(b *testing.B) {
	for _, op := range []byte{opRead, opWrite} {
		name := "pull"
		if op == opWrite {
			name = "push"
		}
		for _, n := range []int64{4 << 10, 64 << 10, 1 << 20} {
			for _, c := range []int{1, 8, 64} {
				b.Run(fmt.Sprintf("%s/%s/c%d", name, sizeName(n), c), func(b *testing.B) {
					benchSmall(b, op, n, c)
				})
			}
		}
	}
}

func benchSmall(b *testing.B, op byte, n int64, c int) {
	sinkBuf, err := tensor.NewHostMemory(0).Alloc(context.Background(), n*int64(c))
	require.NoError(b, err)
	b.Cleanup(func() { sinkBuf.Release() })
	f := newFixture(b, n, func(sc *ServerConfig) {
		sc.Sink = sinkFunc(func(ctx context.Context, cl fabric.Claim) (tensor.Buffer, error) {
			return nopRelease{sinkBuf}, nil
		})
	})
	var dials atomic.Int64
	tr := f.transport(b, Config{Compression: CompressOff, StripeMin: 8 << 20, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	raw := newSmallRaw(b, f.data)
	rawConns := make([]net.Conn, c)
	bufs := make([]tensor.Buffer, c)
	for w := range c {
		rawConns[w] = raw.dial(b)
		bufs[w] = f.dst(b, n)
	}
	// Callers' contexts can be cancelled (rdt's carry deadlines), which
	// costs the transport a watcher per transfer: measure with one.
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	r := f.remote(n)
	tcpOp := func(w int) error {
		if op == opRead {
			_, err := tr.Read(ctx, r, bufs[w])
			return err
		}
		t := r
		t.Claim.Object, t.Offset = fabric.ObjectID{2}, int64(w)*n
		_, err := tr.Write(ctx, bufs[w], t)
		return err
	}
	rawOp := func(w int) error {
		p, _ := tensor.BytesOf(bufs[w])
		return smallRawOp(rawConns[w], op, p)
	}
	k := int(max(1, (1<<20)/(n*int64(c))))
	round := func(f func(int) error) time.Duration {
		var wg sync.WaitGroup
		errs := make([]error, c)
		start := time.Now()
		for w := range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range k {
					if err := f(w); err != nil {
						errs[w] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		d := time.Since(start)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		return d
	}
	round(tcpOp) // warm up: connections, page faults
	round(rawOp)
	var tcps, raws []time.Duration
	var objs, bytes uint64
	b.ReportAllocs()
	b.SetBytes(2 * n * int64(c*k))
	for b.Loop() {
		runTCP := func() {
			o0, b0 := heapAllocs()
			tcps = append(tcps, round(tcpOp))
			o1, b1 := heapAllocs()
			objs, bytes = objs+o1-o0, bytes+b1-b0
		}
		if len(tcps)%2 == 0 {
			runTCP()
			raws = append(raws, round(rawOp))
		} else {
			raws = append(raws, round(rawOp))
			runTCP()
		}
	}
	xfers := float64(len(tcps) * c * k)
	b.ReportMetric(float64(testhelp.Median(tcps).Nanoseconds())/1e3/float64(c*k), "tcp-µs/xfer")
	b.ReportMetric(float64(testhelp.Median(raws).Nanoseconds())/1e3/float64(c*k), "raw-µs/xfer")
	b.ReportMetric(medianRatio(raws, tcps), "ratio")
	b.ReportMetric(float64(objs)/xfers, "allocs/xfer")
	b.ReportMetric(float64(bytes)/xfers, "B/xfer")
	b.ReportMetric(float64(dials.Load()), "conns")
}
