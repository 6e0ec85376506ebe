package cudatest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
)

// Fake is a fake driver library compiled from C with gcc on first use
// (once per test binary) and driven through its set and live entry points.
// The fake CUDA driver is one; tensor/hip/hiptest's fake HIP runtime, the
// same C under HIP's names, is another.
type Fake struct {
	Name    string                           // for messages: "CUDA driver"
	Prefix  string                           // its entry points: Prefix+"_set", Prefix+"_live"
	Build   func(dir string) (string, error) // compiles it into dir, returns its path
	Default map[string]int64                 // knob values Set's cleanup restores (others: 0)

	once sync.Once
	path string
	err  error
	set  func(key string, v int64) int32
	live func(what string) int64
}

// Library returns the path of the fake library, building it on first use.
// It skips the test, saying why, when gcc is not installed.
func (f *Fake) Library(t testing.TB) string {
	t.Helper()
	f.once.Do(f.build)
	if f.err != nil {
		if errors.Is(f.err, exec.ErrNotFound) {
			t.Skip(fmt.Sprintf("gcc not found: cannot build the fake %s (scripts/gpu-check.sh covers the real one)", f.Name))
		}
		t.Fatalf("build the fake %s: %v", f.Name, f.err)
	}
	return f.path
}

func (f *Fake) build() {
	// The directory outlives the test (helper processes load the library
	// from it); it is a few KiB in the temp directory.
	dir, err := os.MkdirTemp("", "tensorlane-"+f.Prefix)
	if err != nil {
		f.err = err
		return
	}
	p, err := f.Build(dir)
	if err != nil {
		f.err = err
		return
	}
	lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		f.err = err
		return
	}
	purego.RegisterLibFunc(&f.set, lib, f.Prefix+"_set")
	purego.RegisterLibFunc(&f.live, lib, f.Prefix+"_live")
	f.path = p
}

// Set changes a knob of the fake library for the rest of the test (the
// knobs are process-wide: tests that set them must not run in parallel).
func (f *Fake) Set(t *testing.T, key string, v int64) {
	t.Helper()
	f.Library(t)
	if f.set(key, v) != 0 {
		t.Fatalf("fake %s has no knob %q", f.Name, key)
	}
	t.Cleanup(func() { f.set(key, f.Default[key]) })
}

// SetNow changes a knob at once, from any goroutine, with no cleanup.
func (f *Fake) SetNow(key string, v int64) {
	if f.set != nil {
		f.set(key, v)
	}
}

// Live returns one of the fake library's counters, -1 before it is built.
func (f *Fake) Live(what string) int64 {
	if f.live == nil {
		return -1
	}
	return f.live(what)
}

// NoLeaks checks, when the test ends (after the cleanups it registers
// later), that the fake library holds no more allocations, pinned host
// buffers, streams or events than when it was called.
func (f *Fake) NoLeaks(t *testing.T) {
	t.Helper()
	f.Library(t)
	base := map[string]int64{}
	for _, w := range []string{"allocs", "host", "streams", "events"} {
		base[w] = f.live(w)
	}
	t.Cleanup(func() {
		for w, n := range base {
			if got := f.live(w); got != n {
				t.Errorf("fake %s: %d live %s after the test, %d before", f.Name, got, w, n)
			}
		}
	})
}
