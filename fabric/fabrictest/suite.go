package fabrictest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Bounds on how long a call may take before the suite calls it hung. They
// are generous (the suite runs under -race on loaded 2-core machines): they
// catch hangs, they do not measure speed.
const (
	bigBound   = 3 * time.Minute  // a 1 GiB transfer
	faultBound = 45 * time.Second // any fault case
	pinBound   = 15 * time.Second // owner pins released after a transfer ends
)

// DefaultMaxSize is the largest transfer the suite tries by default.
const DefaultMaxSize int64 = 1 << 30

// Run runs the conformance suite against h. Each case gets a fresh Env from
// h.Setup and checks for leaked goroutines after the Env's cleanup.
func Run(t *testing.T, h Harness) {
	if h.Setup == nil {
		t.Fatal("fabrictest: Harness.Setup is required")
	}
	if h.MaxSize <= 0 {
		h.MaxSize = DefaultMaxSize
	}
	name := h.Name
	if name == "" {
		name = "transport"
	}
	owner, err := newStore(h.MaxSize + 128<<20)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := tensor.NewSimMemory(tensor.GPUDevice(1), h.MaxSize+128<<20)
	if err != nil {
		owner.close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		owner.close()
		reader.Close()
	})
	s := &suite{h: h, owner: owner, reader: reader}
	for _, c := range []struct {
		name string
		run  func(*suite, *testing.T, Env)
	}{
		{"Reach", (*suite).reach},
		{"Sizes", (*suite).sizes},
		{"Ranges", (*suite).ranges},
		{"Concurrent64", (*suite).concurrent},
		{"UnknownObject", (*suite).unknown},
		{"ForgedToken", (*suite).forged},
		{"ViewOnly", (*suite).viewOnly},
		{"StaleIncarnation", (*suite).stale},
		{"FreedBetweenReads", (*suite).freedBetweenReads},
		{"CancelMidTransfer", (*suite).cancelMid},
		{"StalledOwner", (*suite).stalledOwner},
		{"OwnerClosesMidTransfer", (*suite).ownerCloses},
		{"CorruptFrame", (*suite).corrupt},
		{"Push", (*suite).push},
		{"PushRuns", (*suite).pushRuns},
		{"BatchMixed", (*suite).batchMixed},
		{"BatchCancelled", (*suite).batchCancel},
		{"BatchOwnerCloses", (*suite).batchOwnerCloses},
		{"BatchStalledOwner", (*suite).batchStalled},
		{"BatchWriteMixed", (*suite).batchWriteMixed},
		{"BatchWriteCancelled", (*suite).batchWriteCancel},
		{"BatchWriteOwnerCloses", (*suite).batchWriteOwnerCloses},
		{"BatchWriteStalledOwner", (*suite).batchWriteStalled},
		{"CloseIdempotent", (*suite).closeTwice},
	} {
		leaks := goleak.IgnoreCurrent()
		ok := t.Run(name+"/"+c.name, func(t *testing.T) {
			env := s.setup(t)
			c.run(s, t, env)
			s.waitPins(t)
		})
		if ok {
			if err := goleak.Find(leaks); err != nil {
				t.Errorf("%s/%s: goroutines left after cleanup: %v", name, c.name, err)
			}
		}
	}
}

type suite struct {
	h      Harness
	owner  *store
	reader *tensor.SimMemory
}

func (s *suite) setup(t *testing.T) Env {
	env := s.h.Setup(t, s.owner, s.owner)
	if env.Reader == nil {
		t.Fatal("fabrictest: Env.Reader is nil")
	}
	if env.Alloc == nil {
		env.Alloc = s.reader.Alloc
	}
	if env.Dst == (fabric.Endpoint{}) {
		env.Dst = fabric.Endpoint{Process: "fabrictest-reader", Host: env.Remote.Endpoint.Host, Device: s.reader.Device()}
	}
	return env
}

// waitPins fails the test if the owner still holds pins once transfers have
// ended: a transport that forgets to release leaks the owner's memory.
func (s *suite) waitPins(t *testing.T) {
	deadline := time.Now().Add(pinBound)
	for s.owner.pins.Load() != 0 {
		if time.Now().After(deadline) {
			t.Errorf("owner still holds %d pins %v after the transfers ended", s.owner.pins.Load(), pinBound)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *suite) remote(env Env, o *object, off, n int64) fabric.Remote {
	r := env.Remote
	r.Claim = s.owner.claim(o)
	r.Offset, r.Length = off, n
	return r
}

func (s *suite) object(t *testing.T, n int64) *object {
	t.Helper()
	o, err := s.owner.put(context.Background(), n)
	if err != nil {
		t.Fatalf("owner: allocate %d bytes: %v", n, err)
	}
	t.Cleanup(func() { s.owner.free(o) })
	return o
}

func (s *suite) dst(t *testing.T, env Env, n int64) tensor.Buffer {
	t.Helper()
	b, err := env.Alloc(context.Background(), n)
	if err != nil {
		t.Fatalf("reader: allocate %d bytes: %v", n, err)
	}
	t.Cleanup(func() { b.Release() })
	if p, err := tensor.BytesOf(b); err == nil {
		clear(p)
	}
	return b
}

// within runs f and fails the test if it does not return within bound. A
// hung call is the one failure this suite exists to catch, so it reports
// it rather than waiting for go test's global timeout.
func within(t *testing.T, bound time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(bound):
		t.Fatalf("HUNG: %s did not return within %v", what, bound)
		return nil
	}
}

// typed reports whether err is one of the conditions transports must
// report by sentinel, so callers can act on it with errors.Is.
func typed(err error) bool {
	for _, s := range []error{
		fabric.ErrObjectNotFound, fabric.ErrObjectFreed, fabric.ErrStaleRef, fabric.ErrUnauthorized,
		fabric.ErrBadRequest, fabric.ErrCorrupt, fabric.ErrNoPath, fabric.ErrPeerClosed, fabric.ErrStalled,
		fabric.ErrClosed, net.ErrClosed, context.Canceled, context.DeadlineExceeded,
		tensor.ErrTooSmall, tensor.ErrOutOfMemory,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func (s *suite) read(t *testing.T, env Env, ctx context.Context, o *object, off, n int64, dst tensor.Buffer, bound time.Duration) (fabric.Stats, error) {
	t.Helper()
	var st fabric.Stats
	err := within(t, bound, fmt.Sprintf("Read of %d bytes", n), func() error {
		var err error
		st, err = env.Reader.Read(ctx, s.remote(env, o, off, n), dst)
		return err
	})
	return st, err
}

// verify checks that dst holds exactly src[off:off+n].
func verify(t *testing.T, o *object, off, n int64, dst tensor.Buffer) {
	t.Helper()
	want, err := tensor.BytesOf(o.buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tensor.BytesOf(dst)
	if err != nil {
		t.Fatal(err)
	}
	want, got = want[off:off+n], got[:n]
	if bytes.Equal(want, got) {
		return
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("byte %d of %d differs: got %#x, want %#x", i, n, got[i], want[i])
		}
	}
}

func (s *suite) reach(t *testing.T, env Env) {
	if _, ok := env.Reader.Reach(env.Remote.Endpoint, env.Dst); !ok {
		t.Fatalf("%s does not reach %v -> %v, the pair its own harness set up", env.Reader.Name(), env.Remote.Endpoint, env.Dst)
	}
	if env.Reader.Name() == "" {
		t.Error("Name is empty")
	}
}

func (s *suite) sizes(t *testing.T, env Env) {
	sizes := []int64{0, 1, 4095, 4096, 256<<10 + 3, 8<<20 + 1, 64 << 20, s.h.MaxSize}
	for _, n := range sizes {
		if n > s.h.MaxSize || (n > 64<<20 && testing.Short()) {
			continue
		}
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			o := s.object(t, n)
			dst := s.dst(t, env, n)
			st, err := s.read(t, env, context.Background(), o, 0, n, dst, bigBound)
			if err != nil {
				t.Fatalf("read %d bytes: %v", n, err)
			}
			verify(t, o, 0, n, dst)
			if st.Bytes != n {
				t.Errorf("Stats.Bytes = %d, want %d", st.Bytes, n)
			}
			if st.Transport != env.Reader.Name() {
				t.Errorf("Stats.Transport = %q, want %q", st.Transport, env.Reader.Name())
			}
		})
	}
}

func (s *suite) ranges(t *testing.T, env Env) {
	const n = 1<<20 + 17
	o := s.object(t, n)
	for _, r := range [][2]int64{{0, n}, {4097, 300000}, {n - 1, 1}, {n, 0}, {12345, n - 12345}} {
		dst := s.dst(t, env, r[1])
		if _, err := s.read(t, env, context.Background(), o, r[0], r[1], dst, faultBound); err != nil {
			t.Fatalf("read [%d,+%d): %v", r[0], r[1], err)
		}
		verify(t, o, r[0], r[1], dst)
	}
	for _, r := range [][2]int64{{0, n + 1}, {n, 1}, {-1, 10}, {n + 100, 0}} {
		dst := s.dst(t, env, max(r[1], 1))
		_, err := s.read(t, env, context.Background(), o, r[0], r[1], dst, faultBound)
		if !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("read [%d,+%d) of a %d-byte object: got %v, want fabric.ErrBadRequest", r[0], r[1], n, err)
		}
	}
	small := s.dst(t, env, 100)
	if _, err := s.read(t, env, context.Background(), o, 0, 101, small, faultBound); !errors.Is(err, tensor.ErrTooSmall) {
		t.Errorf("read of 101 bytes into 100: got %v, want tensor.ErrTooSmall", err)
	}
	// The connection must still be usable after refused requests.
	dst := s.dst(t, env, 4096)
	if _, err := s.read(t, env, context.Background(), o, 8, 4096, dst, faultBound); err != nil {
		t.Fatalf("read after refused requests: %v", err)
	}
	verify(t, o, 8, 4096, dst)
}

func (s *suite) concurrent(t *testing.T, env Env) {
	const transfers = 64
	var wg sync.WaitGroup
	errs := make([]error, transfers)
	objs := make([]*object, transfers)
	dsts := make([]tensor.Buffer, transfers)
	for i := range transfers {
		n := int64(1<<20 + i*4099)
		objs[i] = s.object(t, n)
		dsts[i] = s.dst(t, env, n)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range transfers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = env.Reader.Read(context.Background(), s.remote(env, objs[i], 0, objs[i].buf.Len()), dsts[i])
			}()
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(bigBound):
		t.Fatalf("HUNG: %d concurrent reads did not finish within %v", transfers, bigBound)
	}
	for i := range transfers {
		if errs[i] != nil {
			t.Fatalf("transfer %d: %v", i, errs[i])
		}
		verify(t, objs[i], 0, objs[i].buf.Len(), dsts[i])
	}
}

func (s *suite) expectRefused(t *testing.T, env Env, r fabric.Remote, want error) {
	t.Helper()
	dst := s.dst(t, env, max(r.Length, 1))
	err := within(t, faultBound, "a refused read", func() error {
		_, err := env.Reader.Read(context.Background(), r, dst)
		return err
	})
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want %v", err, want)
	}
	if p, _ := tensor.BytesOf(dst); slices.ContainsFunc(p, func(b byte) bool { return b != 0 }) {
		t.Errorf("a refused read wrote into the destination")
	}
}

func (s *suite) unknown(t *testing.T, env Env) {
	o := s.object(t, 4096)
	r := s.remote(env, o, 0, 4096)
	r.Claim.Object[0] ^= 0xff
	s.expectRefused(t, env, r, fabric.ErrObjectNotFound)
}

func (s *suite) forged(t *testing.T, env Env) {
	o := s.object(t, 4096)
	r := s.remote(env, o, 0, 4096)
	r.Claim.Token = append([]byte(nil), r.Claim.Token...)
	r.Claim.Token[3] ^= 1
	s.expectRefused(t, env, r, fabric.ErrUnauthorized)
	r.Claim.Token = nil
	s.expectRefused(t, env, r, fabric.ErrUnauthorized)
}

// viewOnly: an owner that published a 16-byte view of a buffer grants those
// bytes and no others. The Source enforces it, from the range the server
// passes with the claim (Claim.For), so this checks that the server does.
func (s *suite) viewOnly(t *testing.T, env Env) {
	const n, start = 64 << 10, 4096
	o := s.object(t, n)
	s.owner.publishView(o, start, start+16)
	dst := s.dst(t, env, 16)
	if _, err := s.read(t, env, context.Background(), o, start, 16, dst, faultBound); err != nil {
		t.Fatalf("read of the published view: %v", err)
	}
	verify(t, o, start, 16, dst)
	for _, r := range [][2]int64{{0, n}, {start, 32}, {start - 16, 16}, {start + 16, 16}} {
		s.expectRefused(t, env, s.remote(env, o, r[0], r[1]), fabric.ErrUnauthorized)
	}
}

func (s *suite) stale(t *testing.T, env Env) {
	o := s.object(t, 4096)
	r := s.remote(env, o, 0, 4096)
	r.Claim.Incarnation++
	s.expectRefused(t, env, r, fabric.ErrStaleRef)
}

func (s *suite) freedBetweenReads(t *testing.T, env Env) {
	const n = 2 << 20
	o := s.object(t, n)
	dst := s.dst(t, env, n)
	if _, err := s.read(t, env, context.Background(), o, 0, n, dst, faultBound); err != nil {
		t.Fatal(err)
	}
	verify(t, o, 0, n, dst)
	s.owner.free(o)
	// A transport that caches mappings or registrations must notice.
	s.expectRefused(t, env, s.remote(env, o, 0, n), fabric.ErrObjectFreed)
}

// acceptable checks the outcome of a transfer that a fault interrupted: a
// typed error, or success with exactly the right bytes.
func acceptable(t *testing.T, err error, o *object, n int64, dst tensor.Buffer) {
	t.Helper()
	if err == nil {
		verify(t, o, 0, n, dst)
		return
	}
	if !typed(err) {
		t.Fatalf("untyped error (match a fabric sentinel with errors.Is): %v", err)
	}
}

func (s *suite) cancelMid(t *testing.T, env Env) {
	n := min(256<<20, s.h.MaxSize)
	o := s.object(t, n)
	dst := s.dst(t, env, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.owner.nextOpen(cancel)
	_, err := s.read(t, env, ctx, o, 0, n, dst, faultBound)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled read: got %v, want context.Canceled", err)
	}
	acceptable(t, err, o, n, dst)
	// The transport must still work after a cancelled transfer.
	small := s.object(t, 64<<10)
	sdst := s.dst(t, env, 64<<10)
	if _, err := s.read(t, env, context.Background(), small, 0, 64<<10, sdst, faultBound); err != nil {
		t.Fatalf("read after a cancelled one: %v", err)
	}
	verify(t, small, 0, 64<<10, sdst)
}

func (s *suite) stalledOwner(t *testing.T, env Env) {
	release := s.owner.stallOpens()
	defer release()
	o := s.object(t, 1<<20)
	dst := s.dst(t, env, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := s.read(t, env, ctx, o, 0, 1<<20, dst, faultBound)
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, fabric.ErrStalled) {
		t.Fatalf("read from a stalled owner: got %v, want context.DeadlineExceeded or fabric.ErrStalled", err)
	}
	release()
}

func (s *suite) ownerCloses(t *testing.T, env Env) {
	if env.CloseOwner == nil {
		t.Fatal("fabrictest: Env.CloseOwner is required")
	}
	n := min(256<<20, s.h.MaxSize)
	o := s.object(t, n)
	dst := s.dst(t, env, n)
	var closing sync.WaitGroup
	closing.Add(1)
	s.owner.nextOpen(func() {
		go func() {
			defer closing.Done()
			env.CloseOwner()
		}()
	})
	_, err := s.read(t, env, context.Background(), o, 0, n, dst, faultBound)
	closing.Wait()
	acceptable(t, err, o, n, dst)
	// With the owner gone, the next read fails fast with a typed error.
	_, err = s.read(t, env, context.Background(), o, 0, n, dst, faultBound)
	if err == nil || !typed(err) {
		t.Fatalf("read from a closed owner: got %v, want a typed error", err)
	}
}

func (s *suite) corrupt(t *testing.T, env Env) {
	if env.Corrupt == nil && s.h.InProcess {
		t.Skip("in-process transport: the reader copies straight from the owner's memory, no medium between them to corrupt")
	}
	if env.Corrupt == nil {
		t.Fatal("fabrictest: Env.Corrupt is required")
	}
	const n = 4<<20 + 5
	o := s.object(t, n)
	dst := s.dst(t, env, n)
	env.Corrupt()
	_, err := s.read(t, env, context.Background(), o, 0, n, dst, faultBound)
	if err != nil && !errors.Is(err, fabric.ErrCorrupt) && !errors.Is(err, fabric.ErrBadRequest) && !errors.Is(err, fabric.ErrPeerClosed) {
		t.Fatalf("corrupted transfer: got %v, want fabric.ErrCorrupt, ErrBadRequest or ErrPeerClosed", err)
	}
	acceptable(t, err, o, n, dst)
	if err == nil {
		t.Log("the transport repaired the corruption itself (the data verified)")
	}
	// The next transfer is clean.
	clear2, _ := tensor.BytesOf(dst)
	clear(clear2)
	if _, err := s.read(t, env, context.Background(), o, 0, n, dst, faultBound); err != nil {
		t.Fatalf("read after a corrupted one: %v", err)
	}
	verify(t, o, 0, n, dst)
}

func (s *suite) push(t *testing.T, env Env) {
	w, ok := env.Reader.(fabric.Writer)
	if !ok {
		t.Skipf("%s does not implement fabric.Writer (pull only)", env.Reader.Name())
	}
	for _, n := range []int64{0, 1<<20 + 7, 64 << 20} {
		src := s.dst(t, env, n)
		p, _ := tensor.BytesOf(src)
		fill(p, uint64(n)+99)
		sink, err := s.owner.sinkOf(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.owner.free(sink) })
		r := s.remote(env, sink, 0, n)
		err = within(t, bigBound, "Write", func() error {
			_, err := w.Write(context.Background(), src, r)
			return err
		})
		if err != nil {
			t.Fatalf("push %d bytes: %v", n, err)
		}
		got, _ := tensor.BytesOf(sink.buf)
		if !bytes.Equal(got[:n], p[:n]) {
			t.Fatalf("push of %d bytes: the sink does not hold what was pushed", n)
		}
	}
	sink, err := s.owner.sinkOf(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.owner.free(sink) })
	src := s.dst(t, env, 4096)
	r := s.remote(env, sink, 0, 4096)
	r.Claim.Token = []byte("forged")
	err = within(t, faultBound, "a refused Write", func() error {
		_, err := w.Write(context.Background(), src, r)
		return err
	})
	if !errors.Is(err, fabric.ErrUnauthorized) {
		t.Fatalf("push with a forged token: got %v, want fabric.ErrUnauthorized", err)
	}
	// A push names a sink, never an object: pushing into a readable object
	// must be refused.
	o := s.object(t, 4096)
	err = within(t, faultBound, "a Write into an object", func() error {
		_, err := w.Write(context.Background(), src, s.remote(env, o, 0, 4096))
		return err
	})
	if !errors.Is(err, fabric.ErrObjectNotFound) {
		t.Fatalf("push into a read-only object: got %v, want fabric.ErrObjectNotFound", err)
	}
}

func (s *suite) closeTwice(t *testing.T, env Env) {
	o := s.object(t, 4096)
	dst := s.dst(t, env, 4096)
	if _, err := s.read(t, env, context.Background(), o, 0, 4096, dst, faultBound); err != nil {
		t.Fatal(err)
	}
	if err := env.Reader.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := env.Reader.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := s.read(t, env, context.Background(), o, 0, 4096, dst, faultBound)
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: got %v, want an error matching net.ErrClosed (fabric.ErrClosed)", err)
	}
}
