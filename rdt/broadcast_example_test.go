package rdt_test

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// RL weight sync to a fleet: readers on three simulated hosts reserve
// flow-controlled slots; the trainer broadcasts the weights to all of them
// at once along a pipelined tree (the owner sends each byte once, readers
// forward), each reader consumes its generation and says Done, and the
// trainer waits for the whole step before the next.
func ExampleActor_Broadcast() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 3)
	var rts []*rdt.Runtime
	for _, h := range []string{"h0", "h1", "h2"} {
		r, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: h, IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
		defer r.Shutdown(ctx)
		rts = append(rts, r)
	}
	trainer, _ := rts[0].Spawn("trainer")
	gpu0, _ := rts[0].Memory(tensor.GPUDevice(0))
	w, _ := tensor.Alloc(ctx, gpu0, tensor.BFloat16, 1024, 1024)
	src, _ := trainer.Put(ctx, w)

	var slots []*rdt.Slot
	for _, r := range rts[1:] {
		_ = r.Connect(ctx, rts[0].AddrInfo())
		worker, _ := r.Spawn("worker")
		for gpu := range 2 {
			s, _ := worker.Reserve(ctx, src.Desc, tensor.GPUDevice(gpu), rdt.WithGenerations())
			defer s.Close()
			slots = append(slots, s)
		}
	}
	refs := make([]rdt.Ref, len(slots))
	for i, s := range slots {
		refs[i] = s.Ref() // in practice sent to the trainer in a message
	}
	fmt.Print(trainer.ExplainBroadcast(src, refs))

	res, err := trainer.Broadcast(ctx, src, refs, rdt.BroadcastConfig{})
	if err != nil || res.Err() != nil {
		fmt.Println(err, res.Err())
		return
	}
	for _, s := range slots {
		gen, weights, _ := s.Wait(ctx, 0) // generation 1 has landed
		_ = weights                       // ... load it into the inference engine ...
		_ = s.Done(ctx, gen)
	}
	fmt.Println("readers with step 1:", res.OK(), "of", len(res.Readers), "consumed:", res.WaitConsumed(ctx) == nil)
	// Output:
	// owner h0/gpu:0
	// └─ reader 0 h1/gpu:0 via rdma (host leader)
	//    └─ reader 1 h1/gpu:1 via p2p
	//    └─ reader 2 h2/gpu:0 via rdma (host leader)
	//       └─ reader 3 h2/gpu:1 via p2p
	// readers with step 1: 4 of 4 consumed: true
}

// A state dict to a fleet along one tree: each reader reserves a slot per
// tensor and sends their refs; the trainer sends the whole set at once,
// one setup round per reader, the tensors as one pipelined stream. A
// tensor freed meanwhile is left out and named; the rest arrive.
func ExampleActor_BroadcastBatch() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 3)
	var rts []*rdt.Runtime
	for _, h := range []string{"h0", "h1", "h2"} {
		r, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: h, IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
		defer r.Shutdown(ctx)
		rts = append(rts, r)
	}
	trainer, _ := rts[0].Spawn("trainer")
	gpu0, _ := rts[0].Memory(tensor.GPUDevice(0))
	var stateDict []rdt.Ref
	for _, shape := range [][]int64{{512, 512}, {512}, {1024, 256}} {
		w, _ := tensor.Alloc(ctx, gpu0, tensor.BFloat16, shape...)
		ref, _ := trainer.Put(ctx, w)
		stateDict = append(stateDict, ref)
	}
	var readers [][]rdt.Ref // per reader, its slot per tensor
	for _, r := range rts[1:] {
		_ = r.Connect(ctx, rts[0].AddrInfo())
		worker, _ := r.Spawn("worker")
		var refs []rdt.Ref
		for _, ref := range stateDict {
			s, _ := worker.Reserve(ctx, ref.Desc, tensor.GPUDevice(0))
			defer s.Close()
			refs = append(refs, s.Ref())
		}
		readers = append(readers, refs)
	}
	_ = trainer.Free(ctx, stateDict[1]) // the bias went away meanwhile

	res, err := trainer.BroadcastBatch(ctx, stateDict, readers, rdt.BroadcastConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for k, err := range res.Items {
		fmt.Printf("tensor %d sent: %v\n", k, err == nil)
	}
	for i, rr := range res.Readers {
		fmt.Printf("reader %d (%s) fed by %s, generations %v, err %v\n", i, rr.Slot.Host, rr.Fed, rr.Generations, rr.Err)
	}
	// Output:
	// tensor 0 sent: true
	// tensor 1 sent: false
	// tensor 2 sent: true
	// reader 0 (h1) fed by owner, generations [1 0 1], err <nil>
	// reader 1 (h2) fed by reader 0, generations [1 0 1], err <nil>
}
