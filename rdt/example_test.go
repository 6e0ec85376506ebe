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
	a, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h0", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
	defer a.Shutdown(ctx)
	b, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h1", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
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
	a, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h0", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
	defer a.Shutdown(ctx)
	b, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h1", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir()})
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

// Push instead of pull (broadcast-style weight sync): the reader reserves a
// slot on its GPU and sends its ref; the owner pushes into it each step;
// the reader waits for the next completed push.
func ExampleActor_Push() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 2)
	a, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h0", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 64 << 20})
	defer a.Shutdown(ctx)
	b, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h1", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 64 << 20})
	defer b.Shutdown(ctx)
	trainer, _ := a.Spawn("trainer")
	reader, _ := b.Spawn("reader")
	_ = a.Connect(ctx, b.AddrInfo())

	gpu0, _ := a.Memory(tensor.GPUDevice(0))
	w, _ := tensor.Alloc(ctx, gpu0, tensor.Float32, 4, 4)
	vals, _ := tensor.Values[float32](w)
	ref, _ := trainer.Put(ctx, w)

	slot, _ := reader.Reserve(ctx, w.Desc(), tensor.GPUDevice(3))
	defer slot.Close()
	_ = reader.Send(ctx, trainer.Addr(), rdt.Message{Refs: []rdt.Ref{slot.Ref()}})
	msg, _ := trainer.Receive(ctx)

	var seen uint64
	for step := 1; step <= 2; step++ {
		vals[0] = float32(step) // the trainer updates its weights...
		if _, err := trainer.Push(ctx, ref, msg.Refs[0]); err != nil {
			fmt.Println(err)
			return
		}
		n, got, _ := slot.Wait(ctx, seen) // ...and the reader sees each push
		seen = n
		v, _ := tensor.Values[float32](got)
		fmt.Println("push", n, "weights[0] =", v[0], "on", got.Device())
	}
	// Output:
	// push 1 weights[0] = 1 on gpu:3
	// push 2 weights[0] = 2 on gpu:3
}

// A Ref crosses process boundaries as bytes: marshal it in the owner's
// process, hand the bytes over any channel (a file, a pipe, a Ray actor
// call), parse them in the reader's. See examples/twoprocess for two real
// processes.
func ExampleParseRef() {
	ctx := context.Background()
	cluster, _ := topology.Preset("dgx-h100", 2)
	owner, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h0", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 64 << 20})
	defer owner.Shutdown(ctx)
	trainer, _ := owner.Spawn("trainer")
	gpu0, _ := owner.Memory(tensor.GPUDevice(0))
	w, _ := tensor.Alloc(ctx, gpu0, tensor.BFloat16, 1024, 1024)
	ref, _ := trainer.Put(ctx, w)
	wire, _ := ref.MarshalBinary()          // the owner's process writes these bytes...
	addr, _ := trainer.Addr().MarshalText() // ...and where to find it

	other, _ := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: "h1", IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 64 << 20})
	defer other.Shutdown(ctx)
	got, err := rdt.ParseRef(wire) // the reader's process parses them
	if err != nil {
		fmt.Println(err)
		return
	}
	to, _ := rdt.ParseActorAddr(string(addr))
	_ = other.Connect(ctx, to.AddrInfo())
	reader, _ := other.Spawn("reader")
	t, xfer, err := reader.Fetch(ctx, got, tensor.GPUDevice(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer t.Release()
	fmt.Println(got.Desc, "owned by", to.Name, "on", got.Host, got.Device, "->", t.Device(), "over", xfer.Stats.Transport)
	_, err = rdt.ParseRef(wire[:10])
	fmt.Println(errors.Is(err, rdt.ErrMalformedRef))
	// Output:
	// bfloat16[1024 1024] owned by trainer on h0 gpu:0 -> gpu:2 over rdma
	// true
}
