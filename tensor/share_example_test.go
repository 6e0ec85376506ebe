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
