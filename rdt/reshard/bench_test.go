package reshard

import (
	"context"
	"slices"
	"testing"
	"time"

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
// "interleaved", which runs a resharded step (in place), an unsharded one
// and a resharded one with scattering readers in turn and reports the
// times and the ratios to unsharded (ratio, scatter-ratio), so drift on a
// shared machine hits them alike: read that line for the goal.
func BenchmarkReshard(b *testing.B) {
	ctx := context.Background()
	shape, elem := []int64{4096, 4096}, int64(2) // 32 MiB of bf16
	from, _ := Split(shape, elem, 0, 3)
	to, _ := Split(shape, elem, 1, 2)
	p, err := NewPlan(from, to)
	if err != nil {
		b.Fatal(err)
	}
	rts := runtimesTB(b, nil, "h0", "h0", "h0", "h1", "h1")
	src := make([][]byte, 3)
	for i := range src {
		src[i] = make([]byte, from.Bytes(i))
	}

	var senders []*Sender
	for i := range 3 {
		a, err := rts[i].Spawn("t")
		if err != nil {
			b.Fatal(err)
		}
		s, err := NewSender(ctx, a, p, i)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close(ctx) })
		senders = append(senders, s)
	}
	// Two sets of readers on the same runtimes: in place and scattering.
	type readers struct {
		slots map[Key]rdt.Ref
		rcv   []*Receiver
		dst   [][]byte
	}
	mk := func(over bool) readers {
		rs := readers{slots: map[Key]rdt.Ref{}}
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
	inPlace, scatter := mk(true), mk(false)
	reshardStep := func(b *testing.B, rs readers) {
		errs := make(chan error, len(senders)+len(rs.rcv))
		for j, r := range rs.rcv {
			go func() { errs <- r.Receive(ctx, rs.dst[j]) }()
		}
		for i, s := range senders {
			go func() { _, err := s.Send(ctx, src[i], rs.slots); errs <- err }()
		}
		for range len(senders) + len(rs.rcv) {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}

	a, err := rts[0].Spawn("u")
	if err != nil {
		b.Fatal(err)
	}
	mem, _ := rts[0].Memory(tensor.HostDevice)
	var srcs, dsts []rdt.Ref
	var whole []*rdt.Slot
	for j := range 2 {
		buf, err := mem.Alloc(ctx, to.Bytes(j))
		if err != nil {
			b.Fatal(err)
		}
		t, _ := tensor.New(buf, tensor.NewDesc(tensor.Uint8, to.Bytes(j)))
		ref, err := a.Put(ctx, t)
		if err != nil {
			b.Fatal(err)
		}
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
		srcs, dsts, whole = append(srcs, ref), append(dsts, s.Ref()), append(whole, s)
	}
	var gen uint64
	unshardedStep := func(b *testing.B) {
		errs := make(chan error, len(whole)+1)
		for _, s := range whole {
			go func() {
				g, _, err := s.Wait(ctx, gen)
				if err == nil {
					err = s.Done(ctx, g)
				}
				errs <- err
			}()
		}
		go func() {
			_, es := a.PushBatch(ctx, srcs, dsts, rdt.BatchConfig{})
			errs <- es[0]
			if es[1] != nil {
				b.Error(es[1])
			}
		}()
		for range len(whole) + 1 {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		gen++
	}

	b.Run("resharded", func(b *testing.B) {
		b.SetBytes(p.Bytes())
		for b.Loop() {
			reshardStep(b, inPlace)
		}
	})
	b.Run("resharded-scatter", func(b *testing.B) {
		b.SetBytes(p.Bytes())
		for b.Loop() {
			reshardStep(b, scatter)
		}
	})
	b.Run("unsharded", func(b *testing.B) {
		b.SetBytes(p.Bytes())
		for b.Loop() {
			unshardedStep(b)
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		var re, sc, un []float64
		for b.Loop() {
			t0 := time.Now()
			reshardStep(b, inPlace)
			t1 := time.Now()
			unshardedStep(b)
			t2 := time.Now()
			reshardStep(b, scatter)
			re, un, sc = append(re, float64(t1.Sub(t0))), append(un, float64(t2.Sub(t1))), append(sc, float64(time.Since(t2)))
		}
		// Medians, and the median of each triple's ratios: a load spike on
		// a shared machine lands on one step, not on the figure.
		ratios, scatters := make([]float64, len(re)), make([]float64, len(re))
		for i := range re {
			ratios[i], scatters[i] = re[i]/un[i], sc[i]/un[i]
		}
		b.ReportMetric(median(re)/1e6, "resharded-ms/step")
		b.ReportMetric(median(un)/1e6, "unsharded-ms/step")
		b.ReportMetric(median(ratios), "ratio")
		b.ReportMetric(median(scatters), "scatter-ratio")
	})
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
