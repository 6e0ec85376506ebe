package reshard

import (
	"context"
	"testing"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkReshard compares a resharded step (FSDP rows on three trainers
// to tensor-parallel columns on two readers, every trainer pushing to every
// reader at once, packing and scattering included) with the unsharded sync
// of the same bytes (one trainer pushing each reader its half, contiguous,
// as one push each) over tcp between two simulated hosts. The goal
// is resharded within 1.2x of unsharded; compare the two lines' ns/op.
func BenchmarkReshard(b *testing.B) {
	ctx := context.Background()
	shape, elem := []int64{4096, 4096}, int64(2) // 32 MiB of bf16
	from, _ := Split(shape, elem, 0, 3)
	to, _ := Split(shape, elem, 1, 2)
	p, err := NewPlan(from, to)
	if err != nil {
		b.Fatal(err)
	}
	rts := runtimesTB(b, "h0", "h0", "h0", "h1", "h1")
	src := make([][]byte, 3)
	for i := range src {
		src[i] = make([]byte, from.Bytes(i))
	}
	dst := make([][]byte, 2)
	for j := range dst {
		dst[j] = make([]byte, to.Bytes(j))
	}

	// Set up once: a sub-benchmark's function runs more than once.
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
	slots := map[Key]rdt.Ref{}
	var receivers []*Receiver
	for j := range 2 {
		a, err := rts[3+j].Spawn("r")
		if err != nil {
			b.Fatal(err)
		}
		r, err := NewReceiver(ctx, a, p, j)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		for k, v := range r.Slots() {
			slots[k] = v
		}
		receivers = append(receivers, r)
	}
	b.Run("resharded", func(b *testing.B) {
		b.SetBytes(p.Bytes())
		for b.Loop() {
			errs := make(chan error, 3)
			for i, s := range senders {
				go func() { _, err := s.Send(ctx, src[i], slots); errs <- err }()
			}
			for range senders {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			for j, r := range receivers {
				if err := r.Receive(ctx, dst[j]); err != nil {
					b.Fatal(err)
				}
			}
		}
	})

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
		s, err := ra.Reserve(ctx, ref.Desc, tensor.HostDevice, rdt.WithGenerations())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		srcs, dsts, whole = append(srcs, ref), append(dsts, s.Ref()), append(whole, s)
	}
	var gen uint64
	b.Run("unsharded", func(b *testing.B) {
		b.SetBytes(p.Bytes())
		for b.Loop() {
			if _, errs := a.PushBatch(ctx, srcs, dsts, rdt.BatchConfig{}); errs[0] != nil || errs[1] != nil {
				b.Fatal(errs)
			}
			gen++
			for _, s := range whole {
				if _, _, err := s.Wait(ctx, gen-1); err != nil {
					b.Fatal(err)
				}
				s.Done(ctx, gen)
			}
		}
	})
}

func runtimesTB(b *testing.B, hosts ...string) []*rdt.Runtime {
	b.Helper()
	ctx := context.Background()
	var out []*rdt.Runtime
	for _, h := range hosts {
		r, err := newRuntime(ctx, h)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Shutdown(ctx) })
		out = append(out, r)
	}
	return out
}
