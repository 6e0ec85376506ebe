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
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

// fake is the fake HIP runtime every helper here drives.
var fake = &cudatest.Fake{Name: "HIP runtime", Prefix: "fakehip", Build: Build, Default: map[string]int64{"devices": 2, "memory": 1 << 30}}

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
	return fake.Library(t)
}

// Set changes a knob of the fake runtime for the rest of the test (the
// knobs of tensor/cuda/cudatest: devices, memory, novmm, notready, noinit,
// release, noreadonly, failcreate). Tests that set knobs must not run in
// parallel.
func Set(t *testing.T, key string, v int64) {
	t.Helper()
	fake.Set(t, key, v)
}

// NoLeaks checks, when the test ends, that the fake runtime holds no more
// allocations, pinned host buffers, streams or events than when it was
// called.
func NoLeaks(t *testing.T) {
	t.Helper()
	fake.NoLeaks(t)
}
