package cuda

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m)
}

func fakeLib(t testing.TB) string { return cudatest.FakeLibrary(t) }

func knob(t *testing.T, key string, v int64) { cudatest.Set(t, key, v) }

func noLeaks(t *testing.T) { cudatest.NoLeaks(t) }

func newFake(t *testing.T, cfg Config) *Memory {
	t.Helper()
	cfg.Library = fakeLib(t)
	m, err := NewMemory(cfg)
	if err != nil {
		t.Fatalf("NewMemory: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

func pattern(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

func TestLoadRefusesMissingLibrary(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "libcuda.so.1"))
	var ue *UnavailableError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &ue) {
		t.Fatalf("got %v, want an UnavailableError", err)
	}
	if !strings.Contains(ue.Reason, "dlopen") || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("the error does not say what failed: %v", err)
	}
	if _, err := NewMemory(Config{Library: "/nonexistent/libcuda.so.1"}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("NewMemory: %v, want ErrUnavailable", err)
	}
}

func TestLoadRefusesNonCUDALibrary(t *testing.T) {
	// A real shared library that is not a CUDA driver: every machine has
	// libc. (The one the test binary uses, found the way dlopen finds it.)
	_, err := Load("libc.so.6")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "entry point cuInit missing") {
		t.Fatalf("got %v, want a missing entry point", err)
	}
}

// On this machine (no NVIDIA driver) the default library is absent; where
// there is one, it loads.
func TestLoadDefault(t *testing.T) {
	d, err := Load("")
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
		t.Logf("as expected without a GPU: %v", err)
		return
	}
	t.Logf("driver %s, CUDA %d", d.Path(), d.Version())
}

func TestLoadDriverWithoutDevice(t *testing.T) {
	p := fakeLib(t)
	// A copy of the library under another name (its own globals): Load
	// caches drivers by path, and this one must run cuInit afresh.
	q := filepath.Join(t.TempDir(), "libcuda-nodev.so.1")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(q, b, 0o755); err != nil {
		t.Fatal(err)
	}
	lib, err := purego.Dlopen(q, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	defer purego.Dlclose(lib)
	var set func(string, int64) int32
	purego.RegisterLibFunc(&set, lib, "fakecuda_set")
	set("noinit", 1)
	_, err = Load(q)
	var e *Error
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &e) || e.Code != ErrorNoDevice {
		t.Fatalf("got %v, want ErrUnavailable wrapping CUDA_ERROR_NO_DEVICE", err)
	}
}

func TestDiscovery(t *testing.T) {
	d, err := Load(fakeLib(t))
	if err != nil {
		t.Fatal(err)
	}
	devs, err := d.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 {
		t.Fatalf("%d devices, want 2", len(devs))
	}
	got := devs[1]
	want := DeviceInfo{Ordinal: 1, Name: "Fake H200 1 (tensorlane test double)", UUID: "GPU-a1a2a3a4-a5a6-a7a8-a9aa-abacadaeafb0",
		PCIBusID: "0000:19:00.0", TotalMemory: 1 << 30, Compute: [2]int{9, 0}, SMs: 132, NUMANode: 0,
		VMM: true, PosixFD: true, Fabric: true, GPUDirectRDMA: true, Peers: []int{0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("device 1:\n got %+v\nwant %+v", got, want)
	}
	if d.Version() != 12080 {
		t.Errorf("version %d", d.Version())
	}
}

// Put/Get through device memory: bytes go in through the staging chunks
// and come back out, in both allocation modes, over several chunks, with
// events that are not ready at once (so waits poll).
func TestCopyInOut(t *testing.T) {
	for _, mode := range []Mode{ModeVMM, ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			noLeaks(t)
			knob(t, "notready", 3)
			m := newFake(t, Config{Mode: mode, StagingChunk: 64 << 10})
			if m.Mode() != mode {
				t.Fatalf("mode %v, want %v", m.Mode(), mode)
			}
			ctx := context.Background()
			const n = 300<<10 + 17 // several chunks and a ragged end
			buf, err := m.Alloc(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Release()
			if _, ok := buf.(tensor.HostVisible); ok {
				t.Fatal("device memory claims to be host visible")
			}
			src := pattern(n, 1)
			host := tensor.NewHostMemory(0)
			defer host.Close()
			hb, _ := host.Alloc(ctx, n)
			defer hb.Release()
			hp, _ := tensor.BytesOf(hb)
			copy(hp, src)
			if err := tensor.Copy(ctx, buf, 0, hb, 0, n); err != nil {
				t.Fatal(err)
			}
			clear(hp)
			if err := tensor.Copy(ctx, hb, 0, buf, 0, n); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(hp, src) {
				t.Fatal("bytes differ after a round trip through device memory")
			}
			// A window in the middle.
			part := make([]byte, 1000)
			if err := buf.(*Buffer).CopyOut(ctx, 70000, part); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(part, src[70000:71000]) {
				t.Fatal("window differs")
			}
			st := m.Stats()
			if st.Allocs != 1 || st.Used < n || st.Capacity != 1<<30 || st.Simulated {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestDeviceToDevice(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	m0 := newFake(t, Config{Device: 0})
	m1 := newFake(t, Config{Device: 1})
	if err := m0.EnablePeerAccess(m1); err != nil {
		t.Fatal(err)
	}
	if err := m0.EnablePeerAccess(m1); err != nil {
		t.Fatalf("enabling twice: %v", err)
	}
	const n = 5 << 20
	src := pattern(n, 2)
	a, _ := m0.Alloc(ctx, n)
	b, _ := m0.Alloc(ctx, n)
	c, _ := m1.Alloc(ctx, n)
	for _, x := range []tensor.Buffer{a, b, c} {
		defer x.Release()
	}
	if err := a.(*Buffer).CopyIn(ctx, 0, src); err != nil {
		t.Fatal(err)
	}
	if err := tensor.Copy(ctx, b, 0, a, 0, n); err != nil { // same device
		t.Fatal(err)
	}
	if err := tensor.Copy(ctx, c, 0, b, 0, n); err != nil { // peer
		t.Fatal(err)
	}
	if err := MemcpyBaseline(b.(*Buffer), c.(*Buffer), n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := c.(*Buffer).CopyOut(ctx, 0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("bytes differ after device-to-device and peer copies")
	}
	// Simulated memory on the other side: through the host.
	sim, err := tensor.NewSimMemory(tensor.GPUDevice(5), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	s, _ := sim.Alloc(ctx, n)
	defer s.Release()
	if err := tensor.Copy(ctx, s, 0, c, 0, n); err != nil {
		t.Fatal(err)
	}
	sp, _ := tensor.BytesOf(s)
	if !bytes.Equal(sp, src) {
		t.Fatal("bytes differ in simulated memory")
	}
}

func TestOutOfMemory(t *testing.T) {
	noLeaks(t)
	knob(t, "memory", 8<<20)
	for _, mode := range []Mode{ModeVMM, ModeLegacy} {
		m := newFake(t, Config{Mode: mode})
		ctx := context.Background()
		a, err := m.Alloc(ctx, 6<<20)
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.Alloc(ctx, 6<<20)
		var oom *tensor.OutOfMemoryError
		if !errors.Is(err, tensor.ErrOutOfMemory) || !errors.As(err, &oom) || oom.Requested != 6<<20 || oom.Device != tensor.GPUDevice(0) {
			t.Fatalf("%v: got %v, want an OutOfMemoryError", mode, err)
		}
		a.Release()
	}
}

func TestBadInput(t *testing.T) {
	noLeaks(t)
	m := newFake(t, Config{})
	ctx := context.Background()
	if _, err := m.Alloc(ctx, -1); err == nil {
		t.Error("negative allocation accepted")
	}
	z, err := m.Alloc(ctx, 0)
	if err != nil || z.Len() != 0 {
		t.Fatalf("empty allocation: %v", err)
	}
	if _, err := z.(*Buffer).Export(tensor.ReadOnly); !errors.Is(err, tensor.ErrNotExportable) {
		t.Errorf("export of an empty buffer: %v", err)
	}
	z.Release()
	b, _ := m.Alloc(ctx, 1000)
	cb := b.(*Buffer)
	if err := cb.CopyIn(ctx, 999, []byte{1, 2}); !errors.Is(err, tensor.ErrTooSmall) {
		t.Errorf("copy past the end: %v", err)
	}
	if err := cb.CopyOut(ctx, -1, make([]byte, 2)); !errors.Is(err, tensor.ErrTooSmall) {
		t.Errorf("copy before the start: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := cb.CopyIn(cctx, 0, make([]byte, 10)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled copy: %v", err)
	}
	if _, err := m.Alloc(cctx, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled alloc: %v", err)
	}
	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if err := cb.CopyIn(ctx, 0, []byte{1}); !errors.Is(err, tensor.ErrReleased) {
		t.Errorf("copy into a released buffer: %v", err)
	}
	if _, err := cb.Export(tensor.ReadOnly); !errors.Is(err, tensor.ErrReleased) {
		t.Errorf("export of a released buffer: %v", err)
	}
	if _, err := m.Import(ctx, tensor.Handle{FD: -1, Kind: tensor.HandleCUDAFD, Size: 10, Length: 20, Access: tensor.ReadOnly}); !errors.Is(err, tensor.ErrNotExportable) {
		t.Errorf("import of a bad handle: %v", err)
	}
	if _, err := m.Import(ctx, tensor.Handle{FD: 0, Kind: tensor.HandleMemfd, Size: 10, Length: 10, Access: tensor.ReadOnly}); !errors.Is(err, tensor.ErrNotExportable) {
		t.Errorf("import of a memfd handle: %v", err)
	}
}

func TestCloseFreesLanes(t *testing.T) {
	noLeaks(t)
	cfg := Config{Library: fakeLib(t), Lanes: 2}
	m, err := NewMemory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Alloc(context.Background(), 100)
	if err := b.(*Buffer).CopyIn(context.Background(), 0, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := m.Alloc(context.Background(), 1); !errors.Is(err, tensor.ErrClosed) {
		t.Errorf("alloc after Close: %v", err)
	}
	if err := b.(*Buffer).CopyIn(context.Background(), 0, make([]byte, 1)); !errors.Is(err, tensor.ErrClosed) {
		t.Errorf("copy after Close: %v", err)
	}
	if err := b.Release(); err != nil {
		t.Errorf("Release after Close: %v", err)
	}
}

// Copies that end while Close runs give their lanes back either before the
// drain (and Close frees them) or after (and they free themselves): none is
// left holding a stream or pinned buffers.
func TestCloseDuringCopiesLeaksNoLane(t *testing.T) {
	noLeaks(t)
	for round := range 20 {
		m, err := NewMemory(Config{Library: fakeLib(t), Lanes: 2})
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.Alloc(context.Background(), 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for {
					if err := b.(*Buffer).CopyIn(context.Background(), 0, make([]byte, 1<<16)); err != nil {
						if !errors.Is(err, tensor.ErrClosed) {
							t.Errorf("round %d: copy: %v", round, err)
						}
						return
					}
				}
			})
		}
		runtime.Gosched()
		if err := m.Close(); err != nil {
			t.Errorf("round %d: Close: %v", round, err)
		}
		wg.Wait()
		if err := b.Release(); err != nil {
			t.Errorf("round %d: Release: %v", round, err)
		}
	}
}

// Without VMM on the device, ModeAuto falls back to legacy allocations and
// says so; ModeVMM refuses.
func TestVMMFallback(t *testing.T) {
	noLeaks(t)
	knob(t, "novmm", 1)
	if _, err := NewMemory(Config{Library: fakeLib(t), Mode: ModeVMM}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("ModeVMM without VMM: %v", err)
	}
	m := newFake(t, Config{})
	if m.Mode() != ModeLegacy {
		t.Fatalf("mode %v, want legacy", m.Mode())
	}
}

// A device that advertises fabric handles but refuses them at cuMemCreate
// keeps POSIX fds.
func TestFabricRefused(t *testing.T) {
	noLeaks(t)
	m := newFake(t, Config{})
	if m.Info().Fabric != true {
		t.Fatal("fake device 0 should advertise fabric handles")
	}
	knob(t, "nofabric", 1)
	b, err := m.Alloc(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if _, err := b.(*Buffer).ExportFabric(); !errors.Is(err, ErrNotSupported) {
		t.Errorf("fabric export after refusal: %v", err)
	}
	h, err := b.(*Buffer).Export(tensor.Writable)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(h.FD)
}

// Pinned staging (tensor.StageFor): a transport fills pinned host memory
// and the device takes it in one DMA; released buffers are cached and
// freed at Close.
func TestPinnedStaging(t *testing.T) {
	noLeaks(t)
	m := newFake(t, Config{StagingChunk: 64 << 10})
	ctx := context.Background()
	const n = 1<<20 + 9
	b, _ := m.Alloc(ctx, n)
	defer b.Release()
	st, err := tensor.StageFor(ctx, b, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.(*PinnedBuffer); !ok || st.Device() != tensor.HostDevice {
		t.Fatalf("staging is %T on %v, want pinned host memory", st, st.Device())
	}
	p, _ := tensor.BytesOf(st)
	copy(p, pattern(n, 11))
	if !m.isPinned(p[5:100]) || m.isPinned(make([]byte, 10)) {
		t.Fatal("isPinned")
	}
	if err := tensor.Copy(ctx, b, 0, st, 0, n); err != nil {
		t.Fatal(err)
	}
	clear(p)
	if err := tensor.Copy(ctx, st, 0, b, 0, n); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, pattern(n, 11)) {
		t.Fatal("bytes differ through pinned staging")
	}
	st.Release()
	if st.(*PinnedBuffer).Bytes() != nil || st.Release() != nil {
		t.Error("released pinned buffer")
	}
	again, _ := m.Pinned(ctx, n)
	if again.p != st.(*PinnedBuffer).p {
		t.Error("a released pinned buffer of the same size was not reused")
	}
	again.Release()
	// Host memory elsewhere stages through the lanes' chunks.
	if h, _ := tensor.StageFor(ctx, tensor.Buffer(fakeHost{}), 10); h == nil {
		t.Error("no staging for a buffer without a Stager")
	} else {
		h.Release()
	}
}

type fakeHost struct{}

func (fakeHost) Device() tensor.DeviceID { return tensor.GPUDevice(9) }
func (fakeHost) Len() int64              { return 10 }
func (fakeHost) Release() error          { return nil }

// A copy whose context ends while the device is still copying returns the
// context's error, but only once the device is done with the memory (a
// DMA cannot be aborted, and the caller may reuse its buffer at once).
func TestCancelWaitsForDevice(t *testing.T) {
	noLeaks(t)
	m := newFake(t, Config{})
	b, _ := m.Alloc(context.Background(), 1000)
	defer b.Release()
	knob(t, "notready", 1<<30) // the device is busy until "release"
	knob(t, "release", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	released := make(chan struct{})
	var finishing atomic.Bool
	go func() {
		defer close(released)
		// Cancel once the copy is waiting on the device, then let the
		// device finish a while later.
		for base := cudatest.Live("busy"); cudatest.Live("busy") == base; {
			runtime.Gosched()
		}
		cancel()
		time.Sleep(20 * time.Millisecond)
		finishing.Store(true) // before the device finishes, never after
		cudatest.SetNow("release", 1)
	}()
	err := b.(*Buffer).CopyIn(ctx, 0, make([]byte, 1000))
	if !finishing.Load() {
		t.Fatalf("the copy returned (%v) while the device was still copying", err)
	}
	<-released
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the context's error", err)
	}
	knob(t, "notready", 0)
	if err := b.(*Buffer).CopyIn(context.Background(), 0, make([]byte, 1000)); err != nil {
		t.Fatalf("the lane is unusable after a cancelled copy: %v", err)
	}
}

// A device that never finishes a copy: ErrCopyTimeout within CopyTimeout,
// and the lane is abandoned (its staging may still be written), not
// reused; the memory keeps working on its other lanes.
func TestCopyTimeout(t *testing.T) {
	lib := fakeLib(t)
	m, err := NewMemory(Config{Library: lib, CopyTimeout: 30 * time.Millisecond, Lanes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, _ := m.Alloc(context.Background(), 1000)
	defer b.Release()
	knob(t, "notready", 1<<30)
	start := time.Now()
	err = b.(*Buffer).CopyIn(context.Background(), 0, make([]byte, 1000))
	if !errors.Is(err, ErrCopyTimeout) {
		t.Fatalf("got %v, want ErrCopyTimeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %v", d)
	}
	knob(t, "notready", 0)
	if err := b.(*Buffer).CopyIn(context.Background(), 0, make([]byte, 1000)); err != nil {
		t.Fatalf("the other lane: %v", err)
	}
}

// StartCopyOut/In (tensor.AsyncCopier): with pinned host memory the copy is
// queued with an event of its own, the lane given back at once, the event
// kept for the next copy after Wait (a second Wait returns the first's
// result); pageable memory runs the synchronous copy on the side; a copy
// that fails to queue returns its error at once and holds nothing; and
// tensor.StartCopy picks the right one through wrappers. NoLeaks checks
// that Close destroys the kept events.
func TestStartCopy(t *testing.T) {
	noLeaks(t)
	knob(t, "notready", 2)
	ctx := context.Background()
	m := newFake(t, Config{Device: 0, Lanes: 1})
	const n = 3<<20 + 17
	want := pattern(n, 3)
	b, err := m.Alloc(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	dev := b.(*Buffer)
	pin, err := m.Pinned(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Release()
	copy(pin.Bytes(), want)
	events := cudatest.Live("events")
	p, err := dev.StartCopyIn(ctx, 0, pin.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if got := len(m.lanes); got != 1 {
		t.Fatalf("%d lanes free while the copy is pending, want 1: a pending copy holds its own event, not a lane", got)
	}
	if got := cudatest.Live("events"); got != events+1 {
		t.Fatalf("%d events while the copy is pending, want %d", got, events+1)
	}
	if err := p.Wait(ctx); err != nil || p.Wait(ctx) != nil {
		t.Fatalf("Wait: %v", err)
	}
	// The event is kept for the next copy, not made again.
	p, err = dev.StartCopyIn(ctx, 0, pin.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil || cudatest.Live("events") != events+1 {
		t.Fatalf("second copy: %v, %d events (want %d)", err, cudatest.Live("events"), events+1)
	}
	clear(pin.Bytes())
	if err := tensor.StartCopy(ctx, pin, 0, b, 0, n).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pin.Bytes(), want) {
		t.Fatal("pinned round trip differs")
	}
	host := make([]byte, n) // pageable: CopyOut on a goroutine
	p, err = dev.StartCopyOut(ctx, 0, host)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil || !bytes.Equal(host, want) {
		t.Fatalf("pageable copy out: %v", err)
	}
	knob(t, "faildtoh", 1)
	if _, err := dev.StartCopyOut(ctx, 0, pin.Bytes()); err == nil || !strings.Contains(err.Error(), "cuMemcpyDtoHAsync") {
		t.Fatalf("failed queue: %v", err)
	}
	if got := len(m.lanes); got != 1 || len(m.events) != 1 {
		t.Fatalf("%d lanes and %d events free after a failed start, want 1 and 1", got, len(m.events))
	}
	if err := tensor.StartCopy(ctx, pin, 0, b, 0, n).Wait(ctx); err == nil {
		t.Fatal("StartCopy hid the driver's error")
	}
	if _, err := dev.StartCopyOut(ctx, n, pin.Bytes()[:1]); !errors.Is(err, tensor.ErrTooSmall) {
		t.Fatalf("out of range: %v", err)
	}
}
