package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
)

func code(name string) int {
	for i, k := range capi.Kinds {
		if k == name {
			return i
		}
	}
	panic(name)
}

// The Go side of the exports: what each returns for good and bad input,
// the per-thread last error, and that a panic becomes an error.
func TestExportsGoSide(t *testing.T) {
	t.Setenv("TENSORLANE_TRANSPORTS", "")
	a, err := runtimeNew(`{"allow":["shm"]}`)
	require.NoError(t, err)
	b, err := runtimeNew(`{"allow":["shm"]}`)
	require.NoError(t, err)
	defer func() { require.NoError(t, shutdownAll()) }()

	src := make([]float64, 1000)
	for i := range src {
		src[i] = float64(i) / 3
	}
	ref := make([]byte, 1024)
	var n int
	require.Zero(t, protect(func() error {
		return put(a, unsafe.Pointer(&src[0]), 8000, "float64", []int64{10, 100}, nil, ref, &n)
	}))
	ref = ref[:n]
	dst := make([]float64, 1000)
	require.Zero(t, protect(func() error { return getInto(b, ref, unsafe.Pointer(&dst[0]), 8000, 1, 5000) }))
	assert.Equal(t, src, dst)
	out := make([]byte, 4096)
	require.Zero(t, protect(func() error { return explain(a, ref, out, &n) }))
	assert.Contains(t, string(out[:n]), "copied once into shareable memory")
	require.Zero(t, protect(func() error { return stats(b, out, &n) }))
	assert.Contains(t, string(out[:n]), `"gets_by_transport":{"shm":1}`)
	// The zero-copy read of the same object, and its bad input.
	var v uint64
	var p unsafe.Pointer
	var vn int64
	require.Zero(t, protect(func() (err error) { v, p, vn, err = viewOf(b, ref, viewPopulate, 2, 5000); return err }))
	assert.Equal(t, src, unsafe.Slice((*float64)(p), vn/8))
	assert.Equal(t, code("invalid_argument"), protect(func() error { _, _, _, err := viewOf(b, ref, 1<<7, 0, 0); return err }))
	assert.Equal(t, code("malformed_ref"), protect(func() error { _, _, _, err := viewOf(b, []byte{1, 2}, 0, 0, 0); return err }))
	assert.Equal(t, code("invalid_argument"), protect(func() error { _, _, _, err := viewOf(b, ref, 0, 0, -1); return err }))
	require.Zero(t, protect(func() error { return free(a, ref, 5000) }))
	assert.Equal(t, src, unsafe.Slice((*float64)(p), vn/8), "a view outlives the object")
	require.Zero(t, protect(func() error { return viewRelease(b, v) }))
	require.Zero(t, protect(func() error { return viewRelease(b, v) }))

	for _, tc := range []struct {
		name string
		f    func() error
		kind string
	}{
		{"nil pointer", func() error { return put(a, nil, 8, "float32", []int64{2}, nil, make([]byte, 1024), &n) }, "invalid_argument"},
		{"negative length", func() error { return getInto(b, ref, unsafe.Pointer(&dst[0]), -1, 0, 0) }, "invalid_argument"},
		{"negative timeout", func() error { return getInto(b, ref, unsafe.Pointer(&dst[0]), 8000, 0, -5) }, "invalid_argument"},
		{"ref buffer too small", func() error {
			return put(a, unsafe.Pointer(&src[0]), 8000, "float64", []int64{1000}, nil, make([]byte, 10), &n)
		}, "too_small"},
		{"freed object", func() error { return getInto(b, ref, unsafe.Pointer(&dst[0]), 8000, 0, 5000) }, "object_freed"},
		{"closed handle", func() error { _, err := alloc(12345, 10); return err }, "invalid_argument"},
		{"cancel of nothing", func() error { return cancelOp(b, 99) }, "object_not_found"},
		{"corrupt ref info", func() error { return refInfo([]byte{1, 2}, out, &n) }, "malformed_ref"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The last error belongs to the thread that made the call.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			assert.Equal(t, code(tc.kind), protect(tc.f))
			e := lastErrorOfThread()
			assert.Equal(t, code(tc.kind), e.kind)
			assert.NotEmpty(t, e.msg)
		})
	}
	// A panic (a bug) is an error of kind other, with its stack, not a crash.
	e := lastErrorOfThreadLocked(func() int { return protect(func() error { panic("boom") }) })
	assert.Equal(t, code("other"), e.kind)
	assert.Contains(t, e.msg, "internal error")
	assert.Contains(t, e.msg, "boom")
}

func lastErrorOfThreadLocked(f func() int) lastError {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f()
	return lastErrorOfThread()
}

func TestLastErrorPerThread(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			msg := strings.Repeat("x", i+1)
			fail(errors.Join(capi.ErrInvalidArgument, errors.New(msg)))
			assert.True(t, strings.HasSuffix(lastErrorOfThread().msg, msg))
		}()
	}
	wg.Wait()
}

// The real thing: build the shared library, compile C programs against
// tensorlane.h with gcc, and run them: abi_test.c uses the ABI as a caller
// would, abuse_test.c passes hostile lengths, pointers and handles to every
// entry point (issue 29) and must get a kind back from each, never a crash.
func TestCProgram(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the C ABI test needs it (apt-get install gcc)")
	}
	dir := t.TempDir()
	so := filepath.Join(dir, "libtensorlane.so")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", so, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	outp, err := build.CombinedOutput()
	require.NoError(t, err, "%s", outp)
	for _, prog := range []string{"abi_test", "abuse_test"} {
		t.Run(prog, func(t *testing.T) {
			bin := filepath.Join(dir, prog)
			outp, err := exec.Command("gcc", "-Wall", "-Wextra", "-Werror", "-I.", "-o", bin, "testdata/"+prog+".c",
				"-L"+dir, "-ltensorlane", "-lpthread").CombinedOutput()
			require.NoError(t, err, "%s", outp)
			run := exec.Command(bin)
			run.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "TENSORLANE_TRANSPORTS=")
			outp, err = run.CombinedOutput()
			require.NoError(t, err, "%s", outp)
			assert.Contains(t, string(outp), "all checks passed")
		})
	}
}
