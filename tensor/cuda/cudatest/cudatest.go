// Package cudatest builds and drives a fake CUDA driver for tests on
// machines without a GPU. FakeLibrary compiles tensor/cuda/testdata/fakecuda.c
// with gcc into a libcuda.so.1 whose "device memory" is host memory (each
// allocation its own memfd, access rights enforced with mprotect, copies
// done with memcpy), so tensor/cuda's real purego call path, its VMM and
// legacy IPC code, its staging and its fd export/import run for real. It
// says nothing about performance and nothing about a real GPU; the GPU
// check (scripts/gpu-check.sh) covers that.
package cudatest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
)

var (
	once    sync.Once
	libPath string
	libErr  error
	set     func(key string, v int64) int32
	live    func(what string) int64
)

// Source returns the path of the fake driver's C source.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "fakecuda.c")
}

// FakeLibrary returns the path of the fake driver, building it on first
// use (once per test binary). It skips the test, saying why, when gcc is
// not installed.
func FakeLibrary(t testing.TB) string {
	t.Helper()
	once.Do(build)
	if libErr != nil {
		if errors.Is(libErr, exec.ErrNotFound) {
			t.Skip("gcc not found: cannot build the fake CUDA driver (scripts/gpu-check.sh covers the real one)")
		}
		t.Fatalf("build the fake libcuda: %v", libErr)
	}
	return libPath
}

func build() {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		libErr = err
		return
	}
	// The directory outlives the test (helper processes load the library
	// from it); it is a few KiB in the temp directory.
	dir, err := os.MkdirTemp("", "tensorlane-fakecuda")
	if err != nil {
		libErr = err
		return
	}
	p := filepath.Join(dir, "libcuda.so.1")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall", "-o", p, Source()).CombinedOutput(); err != nil {
		libErr = errors.New(string(out) + err.Error())
		return
	}
	lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		libErr = err
		return
	}
	purego.RegisterLibFunc(&set, lib, "fakecuda_set")
	purego.RegisterLibFunc(&live, lib, "fakecuda_live")
	libPath = p
}

// Defaults of the knobs Set changes.
var defaults = map[string]int64{"devices": 2, "memory": 1 << 30}

// Set changes a knob of the fake driver for the rest of the test (the
// knobs are process-wide: tests that set them must not run in parallel):
// devices (2), memory per device (1 GiB), novmm, nofabric, notready (how
// many times an event reports CUDA_ERROR_NOT_READY first), failcreate,
// noinit, release (events report done at once, whatever notready said),
// noreadonly (cuMemSetAccess refuses read-only access).
func Set(t *testing.T, key string, v int64) {
	t.Helper()
	FakeLibrary(t)
	if set(key, v) != 0 {
		t.Fatalf("fake driver has no knob %q", key)
	}
	t.Cleanup(func() { set(key, defaults[key]) })
}

// NoLeaks checks, when the test ends (after the cleanups it registers
// later), that the fake driver holds no more allocations, pinned host
// buffers, streams or events than when it was called.
func NoLeaks(t *testing.T) {
	t.Helper()
	FakeLibrary(t)
	base := map[string]int64{}
	for _, w := range []string{"allocs", "host", "streams", "events"} {
		base[w] = live(w)
	}
	t.Cleanup(func() {
		for w, n := range base {
			if got := live(w); got != n {
				t.Errorf("fake CUDA driver: %d live %s after the test, %d before", got, w, n)
			}
		}
	})
}

// SetNow changes a knob at once, from any goroutine, with no cleanup (pair
// it with a Set of the same knob, whose cleanup restores the default): a
// test's stand-in for the device finishing ("release") while a copy waits.
func SetNow(key string, v int64) {
	if set != nil {
		set(key, v)
	}
}

// Live returns one of the fake driver's counters: allocs, host, streams,
// events (live objects), busy (CUDA_ERROR_NOT_READY answers so far).
func Live(what string) int64 {
	if live == nil {
		return -1
	}
	return live(what)
}
