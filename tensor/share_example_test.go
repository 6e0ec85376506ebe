package tensor_test

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/tensor"
)

// ExampleExportOf shares one allocation with another process, read-only:
// the handle's file holds that allocation alone (page-rounded), it cannot
// be mapped writable, and once shared read-only the allocation refuses a
// writable export. A real receiver gets h.FD over a Unix socket
// (SCM_RIGHTS), as fabric/shm does.
func ExampleExportOf() {
	mem, _ := tensor.NewSimMemory(tensor.GPUDevice(0), 1<<30)
	defer mem.Close()
	secret, _ := mem.Alloc(context.Background(), 1<<20) // never shared
	defer secret.Release()
	obj, _ := mem.Alloc(context.Background(), 100)
	defer obj.Release()
	p, _ := tensor.BytesOf(obj)
	copy(p, "weights")

	h, err := tensor.ExportOf(obj, tensor.ReadOnly)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer unix.Close(h.FD)
	fmt.Println("file size:", h.Size, "object:", h.Offset, h.Length, h.Access)

	view, _ := unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ, unix.MAP_SHARED)
	defer unix.Munmap(view)
	fmt.Printf("mapped: %q\n", view[h.Offset:h.Offset+7])
	_, err = unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	fmt.Println("writable mapping:", err)
	_, err = tensor.ExportOf(obj, tensor.Writable)
	fmt.Println("writable export refused:", errors.Is(err, tensor.ErrExportAccess))
	// Output:
	// file size: 4096 object: 0 100 read-only
	// mapped: "weights"
	// writable mapping: permission denied
	// writable export refused: true
}

// ExampleViewShare shares a 16 KiB slice of a 1 MiB buffer with another
// process without the rest of the buffer: the first export stages a
// private copy of the slice on the same device, and the handle's file is
// that copy (Start says which buffer byte it begins with).
func ExampleViewShare() {
	mem, _ := tensor.NewSimMemory(tensor.GPUDevice(0), 1<<30)
	defer mem.Close()
	buf, _ := mem.Alloc(context.Background(), 1<<20)
	defer buf.Release()
	p, _ := tensor.BytesOf(buf)
	copy(p[512<<10:], "the view")

	share := tensor.NewViewShare(mem, buf, 512<<10, 512<<10+16<<10)
	defer share.Release()
	h, staged, err := share.Export(tensor.ReadOnly)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer unix.Close(h.FD)
	fmt.Println("staged:", staged, "file size:", h.Size, "buffer bytes from:", h.Start, "copy:", h.Copy)
	file := make([]byte, h.Size)
	unix.Pread(h.FD, file, 0)
	fmt.Printf("file starts with %q\n", file[:8])
	again, staged, _ := share.Export(tensor.ReadOnly)
	unix.Close(again.FD)
	fmt.Println("staged again:", staged)
	// Output:
	// staged: 16384 file size: 16384 buffer bytes from: 524288 copy: true
	// file starts with "the view"
	// staged again: 0
}

// ExampleNewSlabMemory is slab memory (opt-in, one trust scope): two
// allocations share one slab file, each export names its place in it, a
// writable export is refused, and a released range is reused.
func ExampleNewSlabMemory() {
	ctx := context.Background()
	mem, _ := tensor.NewSlabMemory(tensor.SlabConfig{Reserve: 8 << 20}) // one pre-faulted 8 MiB slab
	defer mem.Close()
	mem.WaitPopulated(ctx)
	a, _ := mem.Alloc(ctx, 4096)
	b, _ := mem.Alloc(ctx, 4096)
	ha, _ := tensor.ExportOf(a, tensor.ReadOnly)
	hb, _ := tensor.ExportOf(b, tensor.ReadOnly)
	defer unix.Close(ha.FD)
	defer unix.Close(hb.FD)
	fmt.Println(ha.Slab, ha.Size, ha.Offset, hb.Offset)
	_, err := tensor.ExportOf(a, tensor.Writable)
	fmt.Println(errors.Is(err, tensor.ErrExportAccess))
	a.Release()
	c, _ := mem.Alloc(ctx, 100)
	hc, _ := tensor.ExportOf(c, tensor.ReadOnly)
	defer unix.Close(hc.FD)
	fmt.Println(hc.Offset, mem.Slabs())
	// Output:
	// true 8388608 0 4096
	// true
	// 0 1
}
