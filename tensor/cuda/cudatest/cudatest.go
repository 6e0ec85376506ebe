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
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// driver is the fake CUDA driver every helper here drives.
var driver = &Fake{Name: "CUDA driver", Prefix: "fakecuda", Build: Build, Default: map[string]int64{"devices": 2, "memory": 1 << 30}}

// Source returns the path of the fake driver's C source.
func Source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "fakecuda.c")
}

// Build compiles the fake driver into dir/libcuda.so.1 with gcc and
// returns its path.
func Build(dir string) (string, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "libcuda.so.1")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall", "-o", p, Source()).CombinedOutput(); err != nil {
		return "", errors.New(string(out) + err.Error())
	}
	return p, nil
}

// FakeLibrary returns the path of the fake driver, building it on first
// use (once per test binary). It skips the test, saying why, when gcc is
// not installed.
func FakeLibrary(t testing.TB) string {
	t.Helper()
	return driver.Library(t)
}

// Set changes a knob of the fake driver for the rest of the test (the
// knobs are process-wide: tests that set them must not run in parallel):
// devices (2), memory per device (1 GiB), novmm, nofabric, notready (how
// many times an event reports CUDA_ERROR_NOT_READY first), failcreate,
// noinit, release (events report done at once, whatever notready said),
// noreadonly (cuMemSetAccess refuses read-only access), faildtoh (N > 0:
// the Nth device-to-host copy from now, and every one after it, fails with
// CUDA_ERROR_INVALID_VALUE), failhtod (the same for host-to-device copies).
func Set(t *testing.T, key string, v int64) {
	t.Helper()
	driver.Set(t, key, v)
}

// NoLeaks checks, when the test ends (after the cleanups it registers
// later), that the fake driver holds no more allocations, pinned host
// buffers, streams or events than when it was called.
func NoLeaks(t *testing.T) {
	t.Helper()
	driver.NoLeaks(t)
}

// SetNow changes a knob at once, from any goroutine, with no cleanup (pair
// it with a Set of the same knob, whose cleanup restores the default): a
// test's stand-in for the device finishing ("release") while a copy waits.
func SetNow(key string, v int64) { driver.SetNow(key, v) }

// Live returns one of the fake driver's counters: allocs, host, streams,
// events (live objects), busy (CUDA_ERROR_NOT_READY answers so far), dtoh
// and htod (device-to-host and host-to-device copies issued so far).
func Live(what string) int64 { return driver.Live(what) }
