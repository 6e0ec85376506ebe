package fabrictest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// The batch cases run for transports that implement fabric.BatchReader:
// each item of a batch ends on its own (the right bytes, or a typed error
// naming its own fault), a cancelled batch and an owner that closes
// mid-batch end every item within the bound, and the transport works
// afterwards.

func (s *suite) batchReader(t *testing.T, env Env) fabric.BatchReader {
	return capable[fabric.BatchReader](t, env, "fabric.BatchReader (items are read one by one)")
}

func (s *suite) readBatch(t *testing.T, br fabric.BatchReader, ctx context.Context, srcs []fabric.Remote, dsts []tensor.Buffer) ([]fabric.Stats, []error) {
	t.Helper()
	return batchWithin(t, "ReadBatch", len(srcs), func() ([]fabric.Stats, []error) { return br.ReadBatch(ctx, srcs, dsts) })
}

// capable returns env.Reader as the optional capability T, or skips the
// case: it is for transports that have T (what names it and what happens
// without it).
func capable[T any](t *testing.T, env Env, what string) T {
	c, ok := env.Reader.(T)
	if !ok {
		t.Skipf("%s does not implement %s", env.Reader.Name(), what)
	}
	return c
}

// batchWithin runs a batch call of n items within the fault bound and
// fails the test unless it answered every item.
func batchWithin(t *testing.T, name string, n int, call func() ([]fabric.Stats, []error)) ([]fabric.Stats, []error) {
	t.Helper()
	var sts []fabric.Stats
	var errs []error
	within(t, faultBound, fmt.Sprintf("%s of %d items", name, n), func() error {
		sts, errs = call()
		return nil
	})
	if len(sts) != n || len(errs) != n {
		t.Fatalf("%s of %d items returned %d stats and %d errors", name, n, len(sts), len(errs))
	}
	return sts, errs
}

// batchMixed: valid objects of many sizes (empty, small, striped) among a
// freed, an unknown, a forged, a stale one and a range outside its object.
func (s *suite) batchMixed(t *testing.T, env Env) {
	br := s.batchReader(t, env)
	sizes := []int64{0, 1, 4096, 64 << 10, 64<<10 + 3, 1 << 20, 3<<20 + 1, 20 << 20}
	for i := range 40 {
		sizes = append(sizes, int64(4096+i*977))
	}
	sizes = slices.DeleteFunc(sizes, func(n int64) bool { return n > s.h.MaxSize })
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	var objs []*object
	for _, n := range sizes {
		o := s.object(t, n)
		objs = append(objs, o)
		srcs = append(srcs, s.remote(env, o, 0, n))
		dsts = append(dsts, s.dst(t, env, n))
	}
	want := make([]error, len(srcs))
	bad := func(r fabric.Remote, err error) {
		srcs = append(srcs, r)
		dsts = append(dsts, s.dst(t, env, max(r.Length, 1)))
		objs = append(objs, nil)
		want = append(want, err)
	}
	freed := s.object(t, 4096)
	s.owner.free(freed)
	bad(s.remote(env, freed, 0, 4096), fabric.ErrObjectFreed)
	unknown := s.remote(env, s.object(t, 4096), 0, 4096)
	unknown.Claim.Object[0] ^= 0xff
	bad(unknown, fabric.ErrObjectNotFound)
	forged := s.remote(env, s.object(t, 4096), 0, 4096)
	forged.Claim.Token = slices.Clone(forged.Claim.Token)
	forged.Claim.Token[0] ^= 1
	bad(forged, fabric.ErrUnauthorized)
	stale := s.remote(env, s.object(t, 4096), 0, 4096)
	stale.Claim.Incarnation++
	bad(stale, fabric.ErrStaleRef)
	bad(s.remote(env, s.object(t, 4096), 4000, 200), fabric.ErrBadRequest)
	// Valid items behind the refused ones, so a pipelining transport shows
	// it stays in step.
	for _, n := range []int64{5000, 70000} {
		o := s.object(t, n)
		objs = append(objs, o)
		srcs = append(srcs, s.remote(env, o, 0, n))
		dsts = append(dsts, s.dst(t, env, n))
		want = append(want, nil)
	}
	sts, errs := s.readBatch(t, br, context.Background(), srcs, dsts)
	for i := range srcs {
		if want[i] != nil {
			if !errors.Is(errs[i], want[i]) {
				t.Errorf("item %d: got %v, want %v", i, errs[i], want[i])
			}
			if p, _ := tensor.BytesOf(dsts[i]); slices.ContainsFunc(p, func(b byte) bool { return b != 0 }) {
				t.Errorf("item %d: a refused item wrote into its destination", i)
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("item %d (%d bytes): %v", i, srcs[i].Length, errs[i])
			continue
		}
		verify(t, objs[i], 0, srcs[i].Length, dsts[i])
		if sts[i].Bytes != srcs[i].Length || sts[i].Transport != env.Reader.Name() {
			t.Errorf("item %d: Stats %+v, want %d bytes over %s", i, sts[i], srcs[i].Length, env.Reader.Name())
		}
	}
	// Mismatched arguments fail every item, and run nothing.
	_, errs = br.ReadBatch(context.Background(), srcs[:2], dsts[:1])
	for i, err := range errs {
		if !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("mismatched batch, item %d: got %v, want fabric.ErrBadRequest", i, err)
		}
	}
}

// batchCancel cancels a batch as the owner serves its first item.
func (s *suite) batchCancel(t *testing.T, env Env) {
	br := s.batchReader(t, env)
	srcs, dsts, objs := s.batchOf(t, env, 64, min(4<<20, s.h.MaxSize))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.owner.nextOpen(cancel)
	_, errs := s.readBatch(t, br, ctx, srcs, dsts)
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("item %d of a cancelled batch: got %v, want context.Canceled", i, err)
		}
		acceptable(t, err, objs[i], srcs[i].Length, dsts[i])
	}
	s.batchWorks(t, env, br)
}

// batchOwnerCloses closes the owner as it serves the batch's first item.
func (s *suite) batchOwnerCloses(t *testing.T, env Env) {
	br := s.batchReader(t, env)
	srcs, dsts, objs := s.batchOf(t, env, 64, min(4<<20, s.h.MaxSize))
	var closing sync.WaitGroup
	closing.Add(1)
	s.owner.nextOpen(func() {
		go func() {
			defer closing.Done()
			env.CloseOwner()
		}()
	})
	_, errs := s.readBatch(t, br, context.Background(), srcs, dsts)
	closing.Wait()
	for i, err := range errs {
		acceptable(t, err, objs[i], srcs[i].Length, dsts[i])
	}
	_, errs = s.readBatch(t, br, context.Background(), srcs[:3], dsts[:3])
	for i, err := range errs {
		if err == nil || !typed(err) {
			t.Errorf("item %d of a batch from a closed owner: got %v, want a typed error", i, err)
		}
	}
}

// batchOf makes n objects of sizes spread up to top.
func (s *suite) batchOf(t *testing.T, env Env, n int, top int64) ([]fabric.Remote, []tensor.Buffer, []*object) {
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	var objs []*object
	for i := range n {
		size := max(1, top>>(i%8)) - int64(i)
		o := s.object(t, size)
		objs = append(objs, o)
		srcs = append(srcs, s.remote(env, o, 0, size))
		dsts = append(dsts, s.dst(t, env, size))
	}
	return srcs, dsts, objs
}

// batchWorks checks that a small batch succeeds.
func (s *suite) batchWorks(t *testing.T, env Env, br fabric.BatchReader) {
	t.Helper()
	srcs, dsts, objs := s.batchOf(t, env, 5, 128<<10)
	_, errs := s.readBatch(t, br, context.Background(), srcs, dsts)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("batch after a faulted one, item %d: %v", i, err)
		}
		verify(t, objs[i], 0, srcs[i].Length, dsts[i])
	}
}

// batchStalled: an owner whose opens stall fails every item of a batch by
// the caller's deadline, with a typed error.
func (s *suite) batchStalled(t *testing.T, env Env) {
	br := s.batchReader(t, env)
	srcs, dsts, _ := s.batchOf(t, env, 8, 256<<10)
	release := s.owner.stallOpens()
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, errs := s.readBatch(t, br, ctx, srcs, dsts)
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, fabric.ErrStalled) {
			t.Errorf("item %d of a batch from a stalled owner: got %v, want context.DeadlineExceeded or fabric.ErrStalled", i, err)
		}
	}
	release()
}
