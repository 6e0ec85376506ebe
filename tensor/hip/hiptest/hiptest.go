// Package hiptest builds and drives a fake HIP runtime for tests on
// machines without an AMD GPU. FakeLibrary compiles
// tensor/hip/testdata/fakehip.c (the fake CUDA driver of tensor/cuda under
// HIP's entry point names, with HIP's own error names, attribute numbers
// and peer copy) with gcc into a libamdhip64.so whose "device memory" is
// host memory, so tensor/hip's real purego call path runs. It says nothing
// about an AMD GPU.
package hiptest

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

// Source returns the path of the fake runtime's C source.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "fakehip.c")
}

// Build compiles the fake runtime into dir/libamdhip64.so with gcc and
// returns its path (scripts and CI use it through FakeLibrary's tests, or
// `go run` of a helper; the C source includes the fake CUDA driver).
func Build(dir string) (string, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", err
	}
	src := Source()
	inc := filepath.Join(filepath.Dir(src), "..", "..", "cuda", "testdata")
	p := filepath.Join(dir, "libamdhip64.so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall", "-I", inc, "-o", p, src).CombinedOutput(); err != nil {
		return "", errors.New(string(out) + err.Error())
	}
	return p, nil
}

// FakeLibrary returns the path of the fake runtime, building it on first
// use (once per test binary). It skips the test, saying why, when gcc is
// not installed.
func FakeLibrary(t testing.TB) string {
	t.Helper()
	once.Do(build)
	if libErr != nil {
		if errors.Is(libErr, exec.ErrNotFound) {
			t.Skip("gcc not found: cannot build the fake HIP runtime")
		}
		t.Fatalf("build the fake libamdhip64: %v", libErr)
	}
	return libPath
}

func build() {
	// The directory outlives the test (helper processes load the library
	// from it); it is a few KiB in the temp directory.
	dir, err := os.MkdirTemp("", "tensorlane-fakehip")
	if err != nil {
		libErr = err
		return
	}
	p, err := Build(dir)
	if err != nil {
		libErr = err
		return
	}
	lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		libErr = err
		return
	}
	purego.RegisterLibFunc(&set, lib, "fakehip_set")
	purego.RegisterLibFunc(&live, lib, "fakehip_live")
	libPath = p
}

// Defaults of the knobs Set changes.
var defaults = map[string]int64{"devices": 2, "memory": 1 << 30}

// Set changes a knob of the fake runtime for the rest of the test (the
// knobs of tensor/cuda/cudatest: devices, memory, novmm, notready, noinit,
// release, noreadonly, failcreate). Tests that set knobs must not run in
// parallel.
func Set(t *testing.T, key string, v int64) {
	t.Helper()
	FakeLibrary(t)
	if set(key, v) != 0 {
		t.Fatalf("fake HIP runtime has no knob %q", key)
	}
	t.Cleanup(func() { set(key, defaults[key]) })
}

// NoLeaks checks, when the test ends, that the fake runtime holds no more
// allocations, pinned host buffers, streams or events than when it was
// called.
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
				t.Errorf("fake HIP runtime: %d live %s after the test, %d before", got, w, n)
			}
		}
	})
}
