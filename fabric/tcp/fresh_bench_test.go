package tcp

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/internal/netns"
	"github.com/tensorlane/tensorlane/internal/netns/netnstest"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkFreshDestination reads 256 MiB into shared memory that was
// never touched (a new memfd each time, as a reader's first Get into new
// slab memory), three ways interleaved: the pages populated first
// (MADV_POPULATE_WRITE on two cores, what slab memory does for every
// allocation), the receive faulting them in itself (lazy: tried for Gets
// from other hosts and taken out, docs/benchmarks.md, fourth look), and a
// populated destination (warm, the floor). Reported: each way's median milliseconds and
// the median of populate-first over lazy per round (above 1, lazy is
// faster).
//
//	go test -run '^$' -bench FreshDestination -benchtime 5x ./fabric/tcp/
func BenchmarkFreshDestination(b *testing.B) {
	f := newFixture(b, freshSize, nil)
	freshDestination(b, f, nil)
}

// BenchmarkFreshDestinationShaped is BenchmarkFreshDestination over a veth
// pair between two network namespaces shaped to 10 Gbit/s with tbf (as
// bench/ray's two-node mode): the receive waits on the link, so faulting
// pages inside it costs less than over loopback, where it is CPU-bound.
//
//	go test -run '^$' -bench FreshDestinationShaped -benchtime 5x ./fabric/tcp/
func BenchmarkFreshDestinationShaped(b *testing.B) {
	netnstest.Require(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, reader := netnstest.New(b, "fdown"), netnstest.New(b, "fdrd")
	if err := netns.Veth(ctx, owner, "to", "10.78.0.1/24", reader, "tr", "10.78.0.2/24"); err != nil {
		b.Fatal(err)
	}
	for _, e := range []struct {
		ns  *netns.NS
		dev string
	}{{owner, "to"}, {reader, "tr"}} {
		if err := e.ns.Shape(ctx, e.dev, netns.Shape{Rate: "10gbit"}); err != nil {
			b.Fatal(err)
		}
	}
	ln, err := owner.Listen(ctx, "tcp", "10.78.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	f := newFixture(b, freshSize, func(c *ServerConfig) { c.Listener = ln })
	freshDestination(b, f, reader.DialFunc())
}

const freshSize = 256 << 20

func freshDestination(b *testing.B, f *fixture, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	const n = freshSize
	tr := f.transport(b, Config{Compression: CompressOff, Dial: dial})
	r := f.remote(n)
	ctx := context.Background()
	fresh := func() []byte {
		fd, err := unix.MemfdCreate("tensorlane-bench", unix.MFD_CLOEXEC)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Ftruncate(fd, n); err != nil {
			b.Fatal(err)
		}
		d, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	populate := func(p []byte) {
		var wg sync.WaitGroup
		for h := range 2 {
			wg.Go(func() { _ = unix.Madvise(p[h*n/2:(h+1)*n/2], unix.MADV_POPULATE_WRITE) })
		}
		wg.Wait()
	}
	read := func(d []byte) {
		if _, err := tr.Read(ctx, r, tensor.NewForeign(d, tensor.ForeignConfig{})); err != nil {
			b.Fatal(err)
		}
	}
	warm := fresh()
	defer unix.Munmap(warm)
	populate(warm)
	read(warm) // connections
	ways := []struct {
		name string
		run  func() time.Duration
	}{
		{"populate-first", func() time.Duration {
			d := fresh()
			defer unix.Munmap(d)
			t0 := time.Now()
			populate(d)
			read(d)
			return time.Since(t0)
		}},
		{"lazy", func() time.Duration {
			d := fresh()
			defer unix.Munmap(d)
			t0 := time.Now()
			read(d)
			return time.Since(t0)
		}},
		{"warm", func() time.Duration {
			t0 := time.Now()
			read(warm)
			return time.Since(t0)
		}},
	}
	took := make([][]time.Duration, len(ways))
	b.SetBytes(n * int64(len(ways)))
	for i := 0; b.Loop(); i++ {
		for k := range ways {
			j := (k + i) % len(ways) // rotate the order: drift hits all alike
			took[j] = append(took[j], ways[j].run())
		}
	}
	for j, w := range ways {
		b.ReportMetric(float64(testhelp.Median(took[j]).Microseconds())/1000, w.name+"-ms")
	}
	b.ReportMetric(medianRatio(took[0], took[1]), "populate-first/lazy")
}
