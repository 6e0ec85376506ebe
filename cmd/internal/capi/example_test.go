package capi_test

import (
	"bytes"
	"context"
	"fmt"
	"unsafe"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
)

// Two runtimes on one simulated host, as two Ray actors of a node are: a
// caller's own (foreign) memory is published, read over shm, and the owner
// says it copied it once into shareable memory for that reader.
func Example() {
	ctx := context.Background()
	lib := capi.New()
	defer lib.CloseAll(ctx)
	// In one process the local path would serve; allow only shm, the path
	// two processes take.
	ha, _ := lib.NewRuntime(ctx, []byte(`{"allow":["shm"]}`))
	hb, _ := lib.NewRuntime(ctx, []byte(`{"allow":["shm"]}`))
	owner, _ := lib.Runtime(ha)
	reader, _ := lib.Runtime(hb)

	src := bytes.Repeat([]byte{1, 2, 3, 4}, 1024)
	ref, err := owner.Put(ctx, capi.Region{Mem: src, DType: "float32", Shape: []int64{1024}})
	if err != nil {
		panic(err)
	}
	dst := make([]byte, len(src))
	x, err := reader.GetInto(ctx, ref, dst, 0, 0)
	if err != nil {
		panic(err)
	}
	e, _ := owner.Explain(ref)
	fmt.Println(x.Stats.Transport, bytes.Equal(src, dst), e.Memory)
	fmt.Println(owner.Free(ctx, ref, 0))
	// Output:
	// shm true foreign, copied once into shareable memory
	// <nil>
}

// A zero-copy read on one host: the reader maps the owner's object
// read-only instead of copying it, and the mapping outlives the object.
func ExampleRuntime_View() {
	ctx := context.Background()
	lib := capi.New()
	defer lib.CloseAll(ctx)
	ha, _ := lib.NewRuntime(ctx, []byte(`{"allow":["shm"]}`))
	hb, _ := lib.NewRuntime(ctx, []byte(`{"allow":["shm"]}`))
	owner, _ := lib.Runtime(ha)
	reader, _ := lib.Runtime(hb)

	src := bytes.Repeat([]byte("tensorlane"), 400)
	ref, _ := owner.Put(ctx, capi.Region{Mem: src, DType: "uint8", Shape: []int64{int64(len(src))}})
	h, p, n, x, err := reader.View(ctx, ref, capi.ViewConfig{Populate: true}, 0, 0)
	if err != nil {
		panic(err)
	}
	reader.Release(ctx, ref)
	owner.Free(ctx, ref, 0)
	view := unsafe.Slice((*byte)(p), n)
	fmt.Println(x.Stats.Transport, x.Stats.ZeroCopy, bytes.Equal(view, src), reader.Stats().HostMemory.Used)
	fmt.Println(reader.ReleaseView(h))
	// Output:
	// shm true true 0
	// <nil>
}
