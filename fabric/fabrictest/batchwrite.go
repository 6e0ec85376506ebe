package fabrictest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// The batch push cases run for transports that implement
// fabric.BatchWriter, as the batch read cases do for BatchReader: each
// item ends on its own (its sink holds exactly what was pushed, or a typed
// error names its own fault and its sink is untouched), a cancelled batch
// and an owner that closes or stalls mid-batch end every item within the
// bound, and the transport works afterwards.

func (s *suite) batchWriter(t *testing.T, env Env) fabric.BatchWriter {
	return capable[fabric.BatchWriter](t, env, "fabric.BatchWriter (items are pushed one by one)")
}

func (s *suite) writeBatch(t *testing.T, bw fabric.BatchWriter, ctx context.Context, srcs []tensor.Buffer, dsts []fabric.Remote) ([]fabric.Stats, []error) {
	t.Helper()
	return batchWithin(t, "WriteBatch", len(dsts), func() ([]fabric.Stats, []error) { return bw.WriteBatch(ctx, srcs, dsts) })
}

// pushItem is one item of a push batch: the source, the sink it goes to
// (nil when the item names no sink of the owner's), and its Remote.
type pushItem struct {
	src  tensor.Buffer
	sink *object
	dst  fabric.Remote
}

// pushSource allocates n reader-side bytes with a pattern of their own.
func (s *suite) pushSource(t *testing.T, env Env, n int64, seed uint64) tensor.Buffer {
	t.Helper()
	b := s.dst(t, env, n)
	p, _ := tensor.BytesOf(b)
	fill(p, seed)
	return b
}

// pushTo makes a sink of n bytes and a source to push into it.
func (s *suite) pushTo(t *testing.T, env Env, n int64) pushItem {
	t.Helper()
	sink, err := s.owner.sinkOf(context.Background(), n)
	if err != nil {
		t.Fatalf("owner: allocate a sink of %d bytes: %v", n, err)
	}
	t.Cleanup(func() { s.owner.free(sink) })
	return pushItem{src: s.pushSource(t, env, n, uint64(n)*31+uint64(sink.id[0])), sink: sink, dst: s.remote(env, sink, 0, n)}
}

func splitPush(items []pushItem) ([]tensor.Buffer, []fabric.Remote) {
	srcs := make([]tensor.Buffer, len(items))
	dsts := make([]fabric.Remote, len(items))
	for i, it := range items {
		srcs[i], dsts[i] = it.src, it.dst
	}
	return srcs, dsts
}

// pushed reports whether the item's sink holds what was pushed into it.
func pushed(it pushItem) bool {
	want, _ := tensor.BytesOf(it.src)
	got, _ := tensor.BytesOf(it.sink.buf)
	return bytes.Equal(got[:it.dst.Length], want[:it.dst.Length])
}

// untouched reports whether a sink is still all zeros.
func untouched(o *object) bool {
	p, _ := tensor.BytesOf(o.buf)
	return !slices.ContainsFunc(p, func(b byte) bool { return b != 0 })
}

// pushAcceptable: a pushed item's sink holds its bytes; a failed one has a
// typed error.
func pushAcceptable(t *testing.T, err error, it pushItem) {
	t.Helper()
	if err == nil {
		if !pushed(it) {
			t.Fatalf("a push of %d bytes reported success, but the sink does not hold what was pushed", it.dst.Length)
		}
		return
	}
	if !typed(err) {
		t.Fatalf("untyped error (match a fabric sentinel with errors.Is): %v", err)
	}
}

// batchWriteMixed: valid sinks of many sizes (empty, small, striped) among
// a closed, an unknown, a forged and a stale one, a readable object that
// is no sink, and a source shorter than its sink's range.
func (s *suite) batchWriteMixed(t *testing.T, env Env) {
	bw := s.batchWriter(t, env)
	sizes := []int64{0, 1, 4096, 64 << 10, 64<<10 + 3, 1 << 20, 3<<20 + 1, 20 << 20}
	for i := range 40 {
		sizes = append(sizes, int64(4096+i*977))
	}
	sizes = slices.DeleteFunc(sizes, func(n int64) bool { return n > s.h.MaxSize })
	var items []pushItem
	for _, n := range sizes {
		items = append(items, s.pushTo(t, env, n))
	}
	want := make([]error, len(items))
	bad := func(it pushItem, err error) {
		items = append(items, it)
		want = append(want, err)
	}
	closed := s.pushTo(t, env, 4096)
	s.owner.free(closed.sink)
	closed.sink = nil
	bad(closed, fabric.ErrObjectFreed)
	unknown := s.pushTo(t, env, 4096)
	unknown.dst.Claim.Object[0] ^= 0xff
	bad(unknown, fabric.ErrObjectNotFound)
	forged := s.pushTo(t, env, 4096)
	forged.dst.Claim.Token = slices.Clone(forged.dst.Claim.Token)
	forged.dst.Claim.Token[0] ^= 1
	bad(forged, fabric.ErrUnauthorized)
	stale := s.pushTo(t, env, 4096)
	stale.dst.Claim.Incarnation++
	bad(stale, fabric.ErrStaleRef)
	o := s.object(t, 4096) // readable, not a sink: a push never lands in it
	bad(pushItem{src: s.pushSource(t, env, 4096, 5), dst: s.remote(env, o, 0, 4096)}, fabric.ErrObjectNotFound)
	short := s.pushTo(t, env, 8192)
	short.src = s.pushSource(t, env, 100, 6)
	bad(short, fabric.ErrBadRequest)
	// Valid items behind the refused ones, so a pipelining transport shows
	// it stays in step.
	for _, n := range []int64{5000, 70000} {
		items = append(items, s.pushTo(t, env, n))
		want = append(want, nil)
	}
	srcs, dsts := splitPush(items)
	sts, errs := s.writeBatch(t, bw, context.Background(), srcs, dsts)
	for i, it := range items {
		if want[i] != nil {
			// A source shorter than its range: Write's own check, which
			// transports word as ErrBadRequest or tensor.ErrTooSmall.
			short := want[i] == fabric.ErrBadRequest && errors.Is(errs[i], tensor.ErrTooSmall)
			if !errors.Is(errs[i], want[i]) && !short {
				t.Errorf("item %d: got %v, want %v", i, errs[i], want[i])
			}
			if it.sink != nil && !untouched(it.sink) {
				t.Errorf("item %d: a refused push wrote into its sink", i)
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("item %d (%d bytes): %v", i, it.dst.Length, errs[i])
			continue
		}
		if !pushed(it) {
			t.Errorf("item %d (%d bytes): the sink does not hold what was pushed", i, it.dst.Length)
		}
		if sts[i].Bytes != it.dst.Length || sts[i].Transport != env.Reader.Name() {
			t.Errorf("item %d: Stats %+v, want %d bytes over %s", i, sts[i], it.dst.Length, env.Reader.Name())
		}
	}
	// The object no push may land in is as it was.
	want0, _ := tensor.BytesOf(o.buf)
	check := make([]byte, len(want0))
	fill(check, binary.LittleEndian.Uint64(o.id[:]))
	if !bytes.Equal(want0, check) {
		t.Error("a push refused as no sink changed the readable object it named")
	}
	// Mismatched arguments fail every item, and run nothing.
	_, errs = bw.WriteBatch(context.Background(), srcs[:1], dsts[:2])
	if len(errs) != 2 {
		t.Fatalf("mismatched batch: %d errors for 2 sinks", len(errs))
	}
	for i, err := range errs {
		if !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("mismatched batch, item %d: got %v, want fabric.ErrBadRequest", i, err)
		}
	}
}

// pushBatchOf makes n sinks of sizes spread up to top, with their sources.
func (s *suite) pushBatchOf(t *testing.T, env Env, n int, top int64) []pushItem {
	var items []pushItem
	for i := range n {
		items = append(items, s.pushTo(t, env, max(1, top>>(i%8))-int64(i)))
	}
	return items
}

// batchWriteWorks checks that a small push batch succeeds.
func (s *suite) batchWriteWorks(t *testing.T, env Env, bw fabric.BatchWriter) {
	t.Helper()
	items := s.pushBatchOf(t, env, 5, 128<<10)
	srcs, dsts := splitPush(items)
	_, errs := s.writeBatch(t, bw, context.Background(), srcs, dsts)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("push batch after a faulted one, item %d: %v", i, err)
		}
		if !pushed(items[i]) {
			t.Fatalf("push batch after a faulted one, item %d: the sink does not hold what was pushed", i)
		}
	}
}

// batchWriteCancel cancels a push batch as the owner opens its first sink.
func (s *suite) batchWriteCancel(t *testing.T, env Env) {
	bw := s.batchWriter(t, env)
	items := s.pushBatchOf(t, env, 64, min(4<<20, s.h.MaxSize))
	srcs, dsts := splitPush(items)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.owner.nextOpen(cancel)
	_, errs := s.writeBatch(t, bw, ctx, srcs, dsts)
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("item %d of a cancelled push batch: got %v, want context.Canceled", i, err)
		}
		pushAcceptable(t, err, items[i])
	}
	s.batchWriteWorks(t, env, bw)
}

// batchWriteOwnerCloses closes the owner as it opens the batch's first
// sink.
func (s *suite) batchWriteOwnerCloses(t *testing.T, env Env) {
	bw := s.batchWriter(t, env)
	items := s.pushBatchOf(t, env, 64, min(4<<20, s.h.MaxSize))
	srcs, dsts := splitPush(items)
	var closing sync.WaitGroup
	closing.Add(1)
	s.owner.nextOpen(func() {
		go func() {
			defer closing.Done()
			env.CloseOwner()
		}()
	})
	_, errs := s.writeBatch(t, bw, context.Background(), srcs, dsts)
	closing.Wait()
	for i, err := range errs {
		pushAcceptable(t, err, items[i])
	}
	_, errs = s.writeBatch(t, bw, context.Background(), srcs[:3], dsts[:3])
	for i, err := range errs {
		if err == nil || !typed(err) {
			t.Errorf("item %d of a push batch to a closed owner: got %v, want a typed error", i, err)
		}
	}
}

// batchWriteStalled: an owner whose sink opens stall fails every item of a
// push batch by the caller's deadline, with a typed error.
func (s *suite) batchWriteStalled(t *testing.T, env Env) {
	bw := s.batchWriter(t, env)
	items := s.pushBatchOf(t, env, 8, 256<<10)
	srcs, dsts := splitPush(items)
	release := s.owner.stallOpens()
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, errs := s.writeBatch(t, bw, ctx, srcs, dsts)
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, fabric.ErrStalled) {
			t.Errorf("item %d of a push batch to a stalled owner: got %v, want context.DeadlineExceeded or fabric.ErrStalled", i, err)
		}
	}
	release()
}
