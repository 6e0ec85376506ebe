package cuda

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/tensor"
)

func closeFD(fd int) { unix.Close(fd) }

// helperEnv makes the test binary act as the importing process: it maps
// the handle passed as fd 3, checks the bytes, writes its own where
// allowed, and exits 0 only when all went as the parent asked.
const helperEnv = "TENSORLANE_CUDA_TEST_HELPER"

func helperMain() int {
	fail := func(f string, a ...any) int { fmt.Fprintf(os.Stderr, "helper: "+f+"\n", a...); return 1 }
	atoi := func(k string) int64 { n, _ := strconv.ParseInt(os.Getenv(k), 10, 64); return n }
	m, err := NewMemory(Config{Library: os.Getenv("FAKE_LIB"), Device: int(atoi("DEVICE"))})
	if err != nil {
		return fail("NewMemory: %v", err)
	}
	defer m.Close()
	ctx := context.Background()
	n := atoi("LEN")
	var b *Buffer
	if fh := os.Getenv("FABRIC"); fh != "" {
		var h FabricHandle
		hex.Decode(h.Data[:], []byte(fh))
		b, err = m.ImportFabric(ctx, h, atoi("SIZE"), os.Getenv("RO") == "1")
	} else {
		h := tensor.Handle{FD: 3, Kind: tensor.HandleKind(atoi("KIND")), Size: atoi("SIZE"), Offset: atoi("OFF"), Length: n, Access: tensor.Writable}
		if os.Getenv("RO") == "1" {
			h.Access = tensor.ReadOnly
		}
		var tb tensor.Buffer
		tb, err = tensor.Import(ctx, h, nil) // through the registered importer
		if err == nil {
			b = tb.(*Buffer)
		}
	}
	if err != nil {
		return fail("import: %v", err)
	}
	defer b.Release()
	got := make([]byte, n)
	if err := b.CopyOut(ctx, 0, got); err != nil {
		return fail("CopyOut: %v", err)
	}
	if !bytes.Equal(got, pattern(int(n), 3)) {
		return fail("imported bytes differ")
	}
	werr := b.CopyIn(ctx, 0, pattern(int(n), 4))
	if os.Getenv("RO") == "1" {
		if !errors.Is(werr, ErrReadOnly) {
			return fail("write into a read-only import: %v", werr)
		}
	} else if werr != nil {
		return fail("write into a read-write import: %v", werr)
	}
	return 0
}

// Export in this process, import in another: the per-allocation POSIX fd
// of a VMM allocation travels as a descriptor (as over the shm socket),
// the legacy IPC handle in its sealed memfd, and the fabric handle as
// bytes. A read-only import reads and cannot write; a read-write one
// writes into the exporter's memory.
func TestExportImportAcrossProcesses(t *testing.T) {
	for _, c := range []struct {
		name   string
		mode   Mode
		fabric bool
		ro     bool
	}{
		{"vmm-fd-readonly", ModeVMM, false, true},
		{"vmm-fd-readwrite", ModeVMM, false, false},
		{"vmm-fabric", ModeVMM, true, false},
		{"legacy-ipc", ModeLegacy, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			m := newFake(t, Config{Mode: c.mode})
			ctx := context.Background()
			const n = 3<<20 + 5
			b, err := m.Alloc(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release()
			cb := b.(*Buffer)
			if err := cb.CopyIn(ctx, 0, pattern(n, 3)); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=1", "FAKE_LIB="+fakeLib(t), "DEVICE=1", "LEN="+strconv.Itoa(n))
			if c.ro {
				cmd.Env = append(cmd.Env, "RO=1")
			}
			if c.fabric {
				fh, err := cb.ExportFabric()
				if err != nil {
					t.Fatal(err)
				}
				cmd.Env = append(cmd.Env, "FABRIC="+hex.EncodeToString(fh.Data[:]), "SIZE="+strconv.FormatInt(cb.size, 10))
			} else {
				access := tensor.Writable
				if c.ro {
					access = tensor.ReadOnly
				}
				h, err := cb.Export(access)
				if err != nil {
					t.Fatal(err)
				}
				defer closeFD(h.FD)
				want := map[Mode]tensor.HandleKind{ModeVMM: tensor.HandleCUDAFD, ModeLegacy: tensor.HandleCUDAIPC}[c.mode]
				if h.Kind != want || h.Length != n || h.Size < n || h.Access != access || h.Device != tensor.GPUDevice(0) {
					t.Fatalf("handle %+v", h)
				}
				cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(h.FD), "handle")}
				cmd.Env = append(cmd.Env, "KIND="+strconv.Itoa(int(h.Kind)), "SIZE="+strconv.FormatInt(h.Size, 10), "OFF="+strconv.FormatInt(h.Offset, 10))
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("importing process: %v\n%s", err, out)
			}
			got := make([]byte, n)
			if err := cb.CopyOut(ctx, 0, got); err != nil {
				t.Fatal(err)
			}
			want := pattern(n, 4)
			if c.ro {
				want = pattern(n, 3)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("the exporter's memory does not hold what the importer was allowed to write")
			}
		})
	}
}

// Legacy IPC handles cannot be opened by the process that made them (as in
// CUDA); the error says so in the library's terms.
func TestImportIPCInSameProcess(t *testing.T) {
	noLeaks(t)
	m := newFake(t, Config{Mode: ModeLegacy})
	b, _ := m.Alloc(context.Background(), 100)
	defer b.Release()
	h, err := b.(*Buffer).Export(tensor.Writable)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(h.FD)
	// The handle file is sealed: nobody rewrites it.
	if _, err := unix.Pwrite(h.FD, []byte{1}, 0); err == nil {
		t.Error("the IPC handle file is writable")
	}
	if _, err := m.Import(context.Background(), h); !errors.Is(err, tensor.ErrNotExportable) {
		t.Errorf("same-process IPC import: %v", err)
	}
}

// A VMM fd import in the same process works (as in CUDA), read-only.
func TestImportVMMInSameProcess(t *testing.T) {
	noLeaks(t)
	m := newFake(t, Config{})
	ctx := context.Background()
	b, _ := m.Alloc(ctx, 4096)
	defer b.Release()
	b.(*Buffer).CopyIn(ctx, 0, pattern(4096, 9))
	h, err := b.(*Buffer).Export(tensor.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(h.FD)
	imp, err := tensor.Import(ctx, h, b)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Release()
	dst, _ := m.Alloc(ctx, 4096)
	defer dst.Release()
	if err := tensor.Copy(ctx, dst, 0, imp, 0, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	dst.(*Buffer).CopyOut(ctx, 0, got)
	if !bytes.Equal(got, pattern(4096, 9)) {
		t.Fatal("bytes differ through an import")
	}
	if err := tensor.Copy(ctx, imp, 0, dst, 0, 10); !errors.Is(err, ErrReadOnly) {
		t.Errorf("device copy into a read-only import: %v", err)
	}
	if _, err := imp.(*Buffer).Export(tensor.ReadOnly); !errors.Is(err, tensor.ErrNotExportable) {
		t.Errorf("re-export of an import: %v", err)
	}
}

// A driver that refuses read-only mappings: the import is mapped
// read-write and this package's guard keeps it read-only.
func TestReadOnlyRefused(t *testing.T) {
	noLeaks(t)
	knob(t, "noreadonly", 1)
	m := newFake(t, Config{})
	ctx := context.Background()
	b, _ := m.Alloc(ctx, 4096)
	defer b.Release()
	h, err := b.(*Buffer).Export(tensor.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(h.FD)
	imp, err := m.Import(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Release()
	if !imp.ReadOnly() {
		t.Fatal("the import is not read-only")
	}
	if err := imp.CopyIn(ctx, 0, []byte{1}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write into a read-only import: %v", err)
	}
	if err := imp.CopyOut(ctx, 0, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
}

// Memory another library allocated on the device (here a cuMemAlloc made
// behind this package's back) wraps as a Buffer that copies like any other,
// refuses to be exported, and is not freed by Release.
func TestWrapForeignDeviceMemory(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	m := newFake(t, Config{})
	const n = 1 << 20
	var ptr uint64
	err := m.drv.on(m.ctx, func() error { return m.drv.err("cuMemAlloc", m.drv.api.cuMemAlloc(&ptr, n)) })
	if err != nil {
		t.Fatal(err)
	}
	defer m.drv.on(m.ctx, func() error { return m.drv.err("cuMemFree", m.drv.api.cuMemFree(ptr)) })
	w, err := m.Wrap(ptr, n)
	if err != nil {
		t.Fatal(err)
	}
	src := pattern(n, 4)
	own, _ := m.Alloc(ctx, n)
	defer own.Release()
	if err := own.(*Buffer).CopyIn(ctx, 0, src); err != nil {
		t.Fatal(err)
	}
	if err := tensor.Copy(ctx, w, 0, own, 0, n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := w.CopyOut(ctx, 0, got); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("wrapped bytes differ (%v)", err)
	}
	if _, err := w.Export(tensor.ReadOnly); !errors.Is(err, tensor.ErrNotExportable) {
		t.Errorf("export of wrapped memory: %v", err)
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
	// Still allocated: the owner reads it after the wrap is gone.
	if err := m.drv.on(m.ctx, func() error {
		return m.drv.err("cuMemcpyDtoH", m.drv.api.cuMemcpyDtoHAsync(unsafe.Pointer(&got[0]), ptr, 16, 0))
	}); err != nil {
		t.Fatalf("the foreign allocation was freed by Release: %v", err)
	}
	if _, err := m.Wrap(0, 10); !errors.Is(err, ErrBadRange) {
		t.Errorf("wrap of a null pointer: %v", err)
	}
}

// A view of part of a device allocation is shared as a private copy made by
// the device (the CPU cannot read device memory); a view of the whole
// buffer is shared as it is, though the allocation is rounded up.
func TestViewShareOfDeviceMemory(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	m := newFake(t, Config{Mode: ModeVMM})
	const n = 3<<20 + 5
	src := pattern(n, 6)
	b, _ := m.Alloc(ctx, n)
	defer b.Release()
	if err := b.(*Buffer).CopyIn(ctx, 0, src); err != nil {
		t.Fatal(err)
	}
	whole := tensor.NewViewShare(m, b, 0, n)
	defer whole.Release()
	h, staged, err := whole.Export(tensor.ReadOnly)
	if err != nil || staged != 0 || h.Copy {
		t.Fatalf("whole buffer: staged %d, copy %v, %v", staged, h.Copy, err)
	}
	unix.Close(h.FD)
	part := tensor.NewViewShare(m, b, 100, 1<<20)
	defer part.Release()
	h, staged, err = part.Export(tensor.ReadOnly)
	if err != nil || staged != 1<<20-100 || !h.Copy {
		t.Fatalf("part: staged %d, copy %v, %v", staged, h.Copy, err)
	}
	defer unix.Close(h.FD)
	ib, err := m.Import(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	defer ib.Release()
	got := make([]byte, 1<<20-100)
	if err := ib.CopyOut(ctx, 0, got); err != nil || !bytes.Equal(got, src[100:1<<20]) {
		t.Fatalf("the device's private copy differs (%v)", err)
	}
}
