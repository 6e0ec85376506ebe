package rdt_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Two simulated hosts in one process: a trainer puts a tensor on its GPU and
// sends the reference; a reader on the other host gets the bytes onto its
// own GPU over the rdma path (simulated NICs: the software verbs provider).
func Example() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 2)
	a, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h0", IgnoreEnv: true})
	defer a.Shutdown(ctx)
	b, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h1", IgnoreEnv: true})
	defer b.Shutdown(ctx)

	trainer, _ := a.Spawn("trainer")
	reader, _ := b.Spawn("reader")

	gpu0, _ := a.Memory(tensor.GPUDevice(0))
	w, _ := tensor.Alloc(ctx, gpu0, tensor.Float32, 256, 256)
	p, _ := w.SpanBytes()
	copy(p, "weights")

	ref, _ := trainer.Put(ctx, w) // nothing is copied
	_ = a.Connect(ctx, b.AddrInfo())
	_ = trainer.Send(ctx, reader.Addr(), rdt.Message{Payload: []byte("step 1"), Refs: []rdt.Ref{ref}})

	msg, _ := reader.Receive(ctx)
	got, xfer, err := reader.Fetch(ctx, msg.Refs[0], tensor.GPUDevice(3))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer got.Release()
	q, _ := got.SpanBytes()
	fmt.Println(string(msg.Payload), got, xfer.Stats.Transport, string(q[:7]))
	// Output: step 1 float32[256 256] on gpu:3 rdma weights
}

// Reference counting: the owner releases its tensor while a reader on
// another host still holds it; the memory returns when the reader lets go
// (or, had it died, when its lease expired).
func ExampleActor_Release() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 2)
	a, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h0", IgnoreEnv: true})
	defer a.Shutdown(ctx)
	b, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h1", IgnoreEnv: true})
	defer b.Shutdown(ctx)
	owner, _ := a.Spawn("owner")
	reader, _ := b.Spawn("reader")

	gpu0, _ := a.Memory(tensor.GPUDevice(0))
	w, _ := tensor.Alloc(ctx, gpu0, tensor.BFloat16, 1024, 1024)
	ref, _ := owner.Put(ctx, w)

	_ = reader.Hold(ctx, ref)   // a lease: the object stays until the reader lets go
	_ = owner.Release(ctx, ref) // free once unreferenced
	fmt.Println("objects while the reader holds it:", a.Objects())
	_ = reader.Release(ctx, ref)
	if err := owner.WaitFreed(ctx, ref); err == nil {
		fmt.Println("objects after:", a.Objects(), "device bytes in use:", gpu0.Stats().Used)
	}
	_, err := reader.Get(ctx, ref, tensor.GPUDevice(0))
	fmt.Println(errors.Is(err, rdt.ErrObjectFreed))
	// Output:
	// objects while the reader holds it: 1
	// objects after: 0 device bytes in use: 0
	// true
}
