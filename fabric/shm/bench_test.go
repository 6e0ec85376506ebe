package shm

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkCrossProcess moves bytes between this process and a real second
// process (the re-executed test binary owning a simulated device) over p2p
// and shm, pulling (Read) and pushing (Write into the other process's
// buffer, as a weight-sync broadcast pushes into a reserved slot over and
// over), and interleaves each transfer with a single-thread copy() of the
// same size between two arenas of this process: the baseline, measured in
// the same run. ns/op and MB/s are the transfer's alone; ratio is the
// median over iterations of the transfer's throughput over the adjacent
// memcpy's (1.0 = as fast as a local memcpy; the median keeps one
// preemption on a loaded machine from deciding it). The first transfer to
// an object maps it (MAP_POPULATE); it is reported apart as cold-ms, and
// the loop measures the cached mapping that repeated transfers use.
func BenchmarkCrossProcess(b *testing.B) {
	sizes := []int64{1 << 20, 64 << 20, 1 << 30}
	h := startHelper(b, sizes...)
	k, _ := key(b)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	var total int64
	for _, n := range sizes {
		total += n
	}
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(1), 2*(1<<30)+128<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	for i, n := range sizes {
		dst, err := mem.Alloc(context.Background(), n)
		if err != nil {
			b.Fatal(err)
		}
		base, err := mem.Alloc(context.Background(), n)
		if err != nil {
			b.Fatal(err)
		}
		to, _ := tensor.BytesOf(dst)
		from, _ := tensor.BytesOf(base)
		seed := h.info.Objects[i].Seed
		// The baseline's source holds the object's own pattern, so pushing
		// it leaves the owner's object as the reads expect it.
		fillWords(from, seed)
		for _, push := range []bool{false, true} {
			for _, tr := range []*Transport{cli.P2P(), cli.SHM()} {
				mode := "pull"
				xfer := func(r fabric.Remote) error {
					_, err := tr.Read(context.Background(), r, dst)
					return err
				}
				if push {
					mode = "push"
					xfer = func(r fabric.Remote) error {
						_, err := tr.Write(context.Background(), base, r)
						return err
					}
				}
				b.Run(fmt.Sprintf("%s/%s/%dMiB", mode, tr.Name(), n>>20), func(b *testing.B) {
					r := h.remote(i, 0, n)
					start := time.Now()
					if err := xfer(r); err != nil {
						b.Fatal(err)
					}
					cold := time.Since(start)
					if !push {
						if bad := checkWords(to[:min(n, 1<<20)], seed, 0, n); bad >= 0 {
							b.Fatalf("wrong byte at %d", bad)
						}
					}
					b.SetBytes(n)
					b.ReportAllocs()
					b.ResetTimer()
					var memcpy time.Duration
					ratios := make([]float64, 0, b.N)
					for range b.N {
						t0 := time.Now()
						if err := xfer(r); err != nil {
							b.Fatal(err)
						}
						t1 := time.Now()
						b.StopTimer()
						copy(to, from)
						m := time.Since(t1)
						b.StartTimer()
						memcpy += m
						ratios = append(ratios, m.Seconds()/t1.Sub(t0).Seconds())
					}
					b.ReportMetric(median(ratios), "ratio")
					b.ReportMetric(float64(n)*float64(b.N)/memcpy.Seconds()/1e9, "memcpy-GB/s")
					b.ReportMetric(float64(cold.Microseconds())/1000, "cold-ms")
				})
			}
		}
		// Read the pushed object back: the pushes must have left it whole.
		clear(to)
		if _, err := cli.SHM().Read(context.Background(), h.remote(i, 0, n), dst); err != nil {
			b.Fatal(err)
		}
		if bad := checkWords(to, seed, 0, n); bad >= 0 {
			b.Fatalf("after the pushes, wrong byte at %d", bad)
		}
		dst.Release()
		base.Release()
	}
}

// BenchmarkCrossProcessLatency measures small reads from a real second
// process, interleaved with the baseline: one packet ping-pong with the
// same process over a Unix seqpacket socket (one round trip, two wake-ups).
// rtts is the median of a read's time in such round trips; a read costs one round trip
// (claim, grant) plus the mapping lookup, a copy and the done.
func BenchmarkCrossProcessLatency(b *testing.B) {
	const n = 4096
	h := startHelper(b, n)
	k, _ := key(b)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	echo, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: h.info.Echo, Net: "unixpacket"})
	if err != nil {
		b.Fatal(err)
	}
	defer echo.Close()
	dst, err := tensor.NewHostMemory(0).Alloc(context.Background(), n)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Release()
	ping, pong := make([]byte, 64), make([]byte, 64)
	tr := cli.SHM()
	r := h.remote(0, 0, n)
	if _, err := tr.Read(context.Background(), r, dst); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n)
	b.ReportAllocs()
	b.ResetTimer()
	var rtt time.Duration
	rtts := make([]float64, 0, b.N)
	for range b.N {
		t0 := time.Now()
		if _, err := tr.Read(context.Background(), r, dst); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		b.StopTimer()
		if _, err := echo.Write(ping); err != nil {
			b.Fatal(err)
		}
		if _, err := echo.Read(pong); err != nil {
			b.Fatal(err)
		}
		one := time.Since(t1)
		b.StartTimer()
		rtt += one
		rtts = append(rtts, t1.Sub(t0).Seconds()/one.Seconds())
	}
	b.ReportMetric(median(rtts), "rtts")
	b.ReportMetric(float64(rtt.Microseconds())/float64(b.N), "rtt-us")
}

// median is the shared helper under the short name this package's benchmarks use.
var median = testhelp.Median[float64]

// BenchmarkBatch reads a state dict of a real second process as one
// ReadBatch (coalesced: one request, one reply and one done per 256
// objects) and one Read at a time (a round trip each), and one object of
// the same total size, all in the same run and into destinations
// allocated once, so all three run warm (the objects' mappings cached and
// the destination pages populated after the first pass, as for weights
// synced step after step). coalescing is the one-by-one time over the
// batch's, vs-one the batch's throughput over the one object's.
func BenchmarkBatch(b *testing.B) {
	for _, c := range []struct {
		name  string
		sizes []int64
	}{
		{"1000x4KiB", repeat(1000, 4<<10)},
		{"1000x64KiB", repeat(1000, 64<<10)},
		{"1b-scale4", stateDict1B(4)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var total int64
			for _, n := range c.sizes {
				total += n
			}
			h := startHelper(b, append(slices.Clone(c.sizes), total)...)
			k, _ := key(b)
			cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(b), MaxMappings: 2 * len(c.sizes)})
			if err != nil {
				b.Fatal(err)
			}
			defer cli.Close()
			mem, err := tensor.NewSimMemory(tensor.GPUDevice(1), 2*total+int64(len(c.sizes))<<12+64<<20)
			if err != nil {
				b.Fatal(err)
			}
			defer mem.Close()
			var srcs []fabric.Remote
			var dsts []tensor.Buffer
			for i, n := range c.sizes {
				d, err := mem.Alloc(context.Background(), n)
				if err != nil {
					b.Fatal(err)
				}
				defer d.Release()
				srcs, dsts = append(srcs, h.remote(i, 0, n)), append(dsts, d)
			}
			oneDst, err := mem.Alloc(context.Background(), total)
			if err != nil {
				b.Fatal(err)
			}
			defer oneDst.Release()
			oneSrc := h.remote(len(c.sizes), 0, total)
			tr := cli.SHM()
			batch := func() time.Duration {
				start := time.Now()
				_, errs := tr.ReadBatch(context.Background(), srcs, dsts)
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			single := func() time.Duration {
				start := time.Now()
				for i := range srcs {
					if _, err := tr.Read(context.Background(), srcs[i], dsts[i]); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			one := func() time.Duration {
				start := time.Now()
				if _, err := tr.Read(context.Background(), oneSrc, oneDst); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			batch() // map every object and touch every destination once
			one()
			var bt, st, ot []float64
			b.ResetTimer()
			for range b.N {
				bt = append(bt, batch().Seconds())
				st = append(st, single().Seconds())
				ot = append(ot, one().Seconds())
			}
			b.StopTimer()
			mb, ms, mo := median(bt), median(st), median(ot)
			b.ReportMetric(mb*1e3, "batch-ms")
			b.ReportMetric(ms*1e3, "one-by-one-ms")
			b.ReportMetric(mo*1e3, "one-object-ms")
			b.ReportMetric(ms/mb, "coalescing")
			b.ReportMetric(mo/mb, "vs-one")
			b.SetBytes(total)
		})
	}
}

func repeat(n int, size int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = size
	}
	return out
}

// stateDict1B is bench/harness.StateDictShape in bytes (bf16; that
// package cannot be imported here): a 1B-parameter transformer's 200
// tensors, every size divided by scale.
func stateDict1B(scale int64) []int64 {
	const hidden, inter, kv, layers, vocab = 2048, 5632, 256, 22, 64000
	elems := []int64{vocab * hidden}
	for range layers {
		elems = append(elems, hidden*hidden, kv*hidden, kv*hidden, hidden*hidden, inter*hidden, inter*hidden, hidden*inter, hidden, hidden)
	}
	elems = append(elems, hidden)
	for i := range elems {
		elems[i] = 2 * max(4, elems[i]/scale/4*4)
	}
	return elems
}
