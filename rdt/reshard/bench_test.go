package reshard

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkReshard compares a resharded step (FSDP rows on three trainers
// to tensor-parallel columns on two readers, every trainer pushing to every
// reader at once, packing and scattering included) with the unsharded sync
// of the same bytes (one trainer pushing each reader its half, contiguous,
// as one push each) over the network between two simulated hosts; each
// reader waits for its step as the trainers send, as separate processes
// would. The goal is resharded within 1.2x of unsharded.
//
// Sub-benchmarks: "resharded" (readers made with NewReceiverOver: the
// moves land in the readers' shards, no scatter), "resharded-scatter"
// (NewReceiver: a slot per move, scattered at Receive), "unsharded", and
// "interleaved", which runs a resharded step (in place), an unsharded one,
// a resharded one with scattering readers and a gathered one (trainers
// made with NewSenderOver: each move's runs pushed from the shard, no
// pack) in turn and reports the times and the ratios to unsharded (ratio,
// scatter-ratio, gather-ratio), so drift on a shared machine hits them
// alike: read that line for the goal. These run on the default path
// between hosts, rdma (softrdma over loopback here), whose gathered write
// sends the runs as WRITEs with scatter-gather lists, no pack copy.
// "interleaved-tcp" is "interleaved" with rdma off and tcp compression off:
// every step over tcp, whose gathered write sends the runs with no pack
// copy. The weights are random bf16 (tcodec.FillNormal).
func BenchmarkReshard(b *testing.B) {
	b.Run("resharded", func(b *testing.B) {
		e := newReshardBench(b, nil, "h1")
		b.SetBytes(e.p.Bytes())
		for b.Loop() {
			e.reshardStep(b, e.packers, e.inPlace)
		}
	})
	b.Run("resharded-scatter", func(b *testing.B) {
		e := newReshardBench(b, nil, "h1")
		b.SetBytes(e.p.Bytes())
		for b.Loop() {
			e.reshardStep(b, e.packers, e.scatter)
		}
	})
	b.Run("unsharded", func(b *testing.B) {
		e := newReshardBench(b, nil, "h1")
		b.SetBytes(e.p.Bytes())
		for b.Loop() {
			e.unshardedStep(b)
		}
	})
	interleaved := func(b *testing.B, mutate func(*rdt.Config), readers string) {
		e := newReshardBench(b, mutate, readers)
		var re, sc, un, ga []float64
		for b.Loop() {
			t0 := time.Now()
			e.reshardStep(b, e.packers, e.inPlace)
			t1 := time.Now()
			e.unshardedStep(b)
			t2 := time.Now()
			e.reshardStep(b, e.packers, e.scatter)
			t3 := time.Now()
			e.reshardStep(b, e.gatherers, e.inPlace)
			re, un, sc = append(re, float64(t1.Sub(t0))), append(un, float64(t2.Sub(t1))), append(sc, float64(t3.Sub(t2)))
			ga = append(ga, float64(time.Since(t3)))
		}
		// Medians, and the median of each round's ratios: a load spike on
		// a shared machine lands on one step, not on the figure.
		ratios, scatters, gathers := make([]float64, len(re)), make([]float64, len(re)), make([]float64, len(re))
		for i := range re {
			ratios[i], scatters[i], gathers[i] = re[i]/un[i], sc[i]/un[i], ga[i]/un[i]
		}
		b.ReportMetric(median(re)/1e6, "resharded-ms/step")
		b.ReportMetric(median(ga)/1e6, "gathered-ms/step")
		b.ReportMetric(median(un)/1e6, "unsharded-ms/step")
		b.ReportMetric(median(ratios), "ratio")
		b.ReportMetric(median(scatters), "scatter-ratio")
		b.ReportMetric(median(gathers), "gather-ratio")
	}
	b.Run("interleaved", func(b *testing.B) { interleaved(b, nil, "h1") })
	b.Run("interleaved-tcp", func(b *testing.B) {
		interleaved(b, func(c *rdt.Config) {
			c.DisableRDMA = true
			// The copies are measured, not a codec on loopback.
			c.Transports.Compression = tcp.CompressOff
		}, "h1")
	})
	// Trainers and readers on one host: every step over shm, whose
	// gathered write copies the runs into the readers' slots.
	b.Run("interleaved-shm", func(b *testing.B) { interleaved(b, nil, "h0") })
}

// reshardBench is BenchmarkReshard's set-up: three trainers (host h0)
// with their shards as plain memory (packers) and as rdt objects
// (gatherers), two sets of readers (host readers: in place and
// scattering), and the unsharded trainer and readers.
type reshardBench struct {
	p                  *Plan
	src                [][]byte
	packers, gatherers []*Sender
	inPlace, scatter   benchReaders

	u     *rdt.Actor
	srcs  []rdt.Ref
	dsts  []rdt.Ref
	whole []*rdt.Slot
	gen   uint64
}

type benchReaders struct {
	slots map[Key]rdt.Ref
	rcv   []*Receiver
	dst   [][]byte
}

func newReshardBench(b *testing.B, mutate func(*rdt.Config), readers string) *reshardBench {
	ctx := context.Background()
	shape, elem := []int64{4096, 4096}, int64(2) // 32 MiB of bf16
	from, _ := Split(shape, elem, 0, 3)
	to, _ := Split(shape, elem, 1, 2)
	p, err := NewPlan(from, to)
	if err != nil {
		b.Fatal(err)
	}
	e := &reshardBench{p: p}
	rts := runtimesTB(b, mutate, "h0", "h0", "h0", readers, readers)
	for i := range 3 {
		e.src = append(e.src, make([]byte, from.Bytes(i)))
		tcodec.FillNormal(e.src[i], 2, 0.02, uint64(i))
		a, err := rts[i].Spawn("t")
		if err != nil {
			b.Fatal(err)
		}
		s, err := NewSender(ctx, a, p, i)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close(ctx) })
		e.packers = append(e.packers, s)
		ref := e.put(b, rts[i], a, from.Bytes(i))
		if s, err = NewSenderOver(ctx, a, p, i, ref); err != nil {
			b.Fatal(err)
		}
		e.gatherers = append(e.gatherers, s)
	}
	// Two sets of readers on the same runtimes: in place and scattering.
	mk := func(over bool) benchReaders {
		rs := benchReaders{slots: map[Key]rdt.Ref{}}
		for j := range 2 {
			name := "r"
			if !over {
				name = "rs"
			}
			a, err := rts[3+j].Spawn(name)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, to.Bytes(j))
			var r *Receiver
			if over {
				r, err = NewReceiverOver(ctx, a, p, j, dst)
			} else {
				r, err = NewReceiver(ctx, a, p, j)
			}
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { r.Close() })
			for k, v := range r.Slots() {
				rs.slots[k] = v
			}
			rs.rcv, rs.dst = append(rs.rcv, r), append(rs.dst, dst)
		}
		return rs
	}
	e.inPlace, e.scatter = mk(true), mk(false)

	if e.u, err = rts[0].Spawn("u"); err != nil {
		b.Fatal(err)
	}
	for j := range 2 {
		ref := e.put(b, rts[0], e.u, to.Bytes(j))
		ra, err := rts[3+j].Spawn("u")
		if err != nil {
			b.Fatal(err)
		}
		// The unsharded readers' shards are their own memory too (in place).
		s, err := ra.ReserveOver(ctx, tensor.NewForeign(make([]byte, to.Bytes(j)), tensor.ForeignConfig{}),
			ref.Desc, rdt.WithGenerations())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		e.srcs, e.dsts, e.whole = append(e.srcs, ref), append(e.dsts, s.Ref()), append(e.whole, s)
	}
	return e
}

// put publishes n bytes of host memory of rt on a.
func (e *reshardBench) put(b *testing.B, rt *rdt.Runtime, a *rdt.Actor, n int64) rdt.Ref {
	ctx := context.Background()
	mem, _ := rt.Memory(tensor.HostDevice)
	buf, err := mem.Alloc(ctx, n)
	if err != nil {
		b.Fatal(err)
	}
	t, _ := tensor.New(buf, tensor.NewDesc(tensor.Uint8, n))
	p, _ := tensor.BytesOf(buf)
	tcodec.FillNormal(p, 2, 0.02, uint64(n))
	ref, err := a.Put(ctx, t)
	if err != nil {
		b.Fatal(err)
	}
	return ref
}

func (e *reshardBench) reshardStep(b *testing.B, senders []*Sender, rs benchReaders) {
	ctx := context.Background()
	errs := make(chan error, len(senders)+len(rs.rcv))
	for j, r := range rs.rcv {
		go func() { errs <- r.Receive(ctx, rs.dst[j]) }()
	}
	for i, s := range senders {
		var src []byte
		if s.over == nil {
			src = e.src[i]
		}
		go func() { _, err := s.Send(ctx, src, rs.slots); errs <- err }()
	}
	for range len(senders) + len(rs.rcv) {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}

func (e *reshardBench) unshardedStep(b *testing.B) {
	ctx := context.Background()
	errs := make(chan error, len(e.whole)+1)
	for _, s := range e.whole {
		go func() {
			g, _, err := s.Wait(ctx, e.gen)
			if err == nil {
				err = s.Done(ctx, g)
			}
			errs <- err
		}()
	}
	go func() {
		_, es := e.u.PushBatch(ctx, e.srcs, e.dsts, rdt.BatchConfig{})
		errs <- es[0]
		if es[1] != nil {
			b.Error(es[1])
		}
	}()
	for range len(e.whole) + 1 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	e.gen++
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func runtimesTB(b *testing.B, mutate func(*rdt.Config), hosts ...string) []*rdt.Runtime {
	b.Helper()
	ctx := context.Background()
	var out []*rdt.Runtime
	dir := b.TempDir()
	for _, h := range hosts {
		r, err := newRuntimeWith(ctx, dir, h, mutate)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Shutdown(ctx) })
		out = append(out, r)
	}
	return out
}
