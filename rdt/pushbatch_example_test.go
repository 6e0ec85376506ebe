package rdt_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// A state dict pushed into one reader's slots: the trainer's writes move
// coalesced over the path between the hosts, and the reader's runtime is
// told of all of them in one notice; each slot is at generation 1.
func ExampleActor_PushBatch() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 2)
	var rts []*rdt.Runtime
	for _, h := range []string{"h0", "h1"} {
		r, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: h, IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
		defer r.Shutdown(ctx)
		rts = append(rts, r)
	}
	_ = rts[1].Connect(ctx, rts[0].AddrInfo())
	trainer, _ := rts[0].Spawn("trainer")
	worker, _ := rts[1].Spawn("worker")
	gpu0, _ := rts[0].Memory(tensor.GPUDevice(0))
	var srcs, slots []rdt.Ref
	var held []*rdt.Slot
	for range 8 { // eight layers of 256 KiB
		w, _ := tensor.Alloc(ctx, gpu0, tensor.BFloat16, 512, 256)
		ref, _ := trainer.Put(ctx, w)
		s, _ := worker.Reserve(ctx, ref.Desc, tensor.GPUDevice(0), rdt.WithGenerations())
		defer s.Close()
		srcs, slots, held = append(srcs, ref), append(slots, s.Ref()), append(held, s)
	}
	plan := trainer.ExplainPushBatch(srcs, slots)
	fmt.Println(plan.Groups[0].Refs, "pushes via", plan.Groups[0].Transport, "coalesced:", plan.Groups[0].Coalesced)

	xs, errs := trainer.PushBatch(ctx, srcs, slots, rdt.BatchConfig{})
	for i, err := range errs {
		if err != nil {
			fmt.Println("push", i, err)
			return
		}
	}
	gens := make([]string, len(held))
	for i, s := range held {
		gen, _ := s.Generation()
		gens[i] = fmt.Sprint(gen)
	}
	fmt.Println("moved together:", xs[0].Stats.Coalesced, "sharing one notice:", xs[0].Notified)
	fmt.Println("generations:", strings.Join(gens, " "))
	// Output:
	// 8 pushes via rdma coalesced: true
	// moved together: 8 sharing one notice: 8
	// generations: 1 1 1 1 1 1 1 1
}
