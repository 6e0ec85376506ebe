package rdma_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/bench"
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// dgxRails are the RDMA NIC names of a dgx-h100 host: rdt gives the
// software provider one loopback listener per NIC, so a same-machine
// transfer stripes over eight rails.
var dgxRails = []string{"nic0", "nic1", "nic2", "nic3", "nic4", "nic5", "nic6", "nic7"}

func benchSize(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%dGiB", n>>30)
	}
	return fmt.Sprintf("%dMiB", n>>20)
}

// BenchmarkReadVsRawTCP pulls (and pushes) over the eight loopback rails
// a dgx-h100 host gets from rdt, interleaved with the same bytes over one
// raw Go TCP socket (bench.TCPPair) in the same loop, and reports the
// ratio rdma/raw (> 1: rdma is faster). The push's baseline is the same
// raw read: loopback is symmetric.
func BenchmarkReadVsRawTCP(b *testing.B) {
	for _, op := range []string{"pull", "push"} {
		for _, n := range []int64{1 << 20, 64 << 20, 256 << 20} {
			b.Run(op+"/"+benchSize(n), func(b *testing.B) {
				f := newFixtureNamed(b, n, dgxRails, nil)
				ctx := context.Background()
				// The push writes into the owner's second buffer, through
				// the fixture's own transport pair (its Server takes no
				// sink): a sink server beside it.
				var push *pushPair
				if op == "push" {
					push = newPushPair(b, f, n)
				}
				var dst tensor.Buffer
				if push == nil {
					var err error
					if dst, err = f.mem.Alloc(ctx, n); err != nil {
						b.Fatal(err)
					}
					defer dst.Release()
				}
				raw, err := bench.NewTCPPair(f.data)
				if err != nil {
					b.Fatal(err)
				}
				defer raw.Close()
				rawDst := make([]byte, n)
				copy(rawDst, f.data) // fault the pages in, as the arena's are
				once := func() time.Duration {
					start := time.Now()
					var err error
					if push != nil {
						_, err = push.tr.Write(ctx, f.obj, push.remote)
					} else {
						_, err = f.tr.Read(ctx, f.remote(0, n), dst)
					}
					if err != nil {
						b.Fatal(err)
					}
					return time.Since(start)
				}
				once() // connect the rails
				b.SetBytes(n)
				b.ReportAllocs()
				var path, base time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					path += once()
					d, err := raw.Read(rawDst)
					if err != nil {
						b.Fatal(err)
					}
					base += d
				}
				gb := float64(b.N) * float64(n) / 1e9
				b.ReportMetric(gb/path.Seconds(), "GB/s")
				b.ReportMetric(gb/base.Seconds(), "rawtcp-GB/s")
				b.ReportMetric(base.Seconds()/path.Seconds(), "ratio-vs-rawtcp")
			})
		}
	}
}

// pushPair is a reader transport pushing into an owner whose Sink hands
// out one buffer.
type pushPair struct {
	tr     *rdma.Transport
	remote fabric.Remote
}

func newPushPair(b *testing.B, f *fixture, n int64) *pushPair {
	ctx := context.Background()
	sink, err := f.mem.Alloc(ctx, n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sink.Release() })
	ownerKey, ownerID := key(b)
	prov, _ := softrdma.New(softrdma.Config{NICs: loopbackNICs(dgxRails...)})
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: prov, Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound }),
		Sink:   sinkFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nopRelease{sink}, nil })})
	if err != nil {
		b.Fatal(err)
	}
	rk, _ := key(b)
	rp, _ := softrdma.New(softrdma.Config{NICs: loopbackNICs(dgxRails...)})
	tr, err := rdma.New(ctx, rdma.Config{Provider: rp, Security: fabric.Security{Identity: rk}, AllowLoopback: true})
	if err != nil {
		srv.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		tr.Close()
		srv.Close()
	})
	return &pushPair{tr: tr, remote: fabric.Remote{Endpoint: fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)},
		Peer: ownerID.String(), Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Length: n}}
}
