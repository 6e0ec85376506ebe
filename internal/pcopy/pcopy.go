// Package pcopy copies large byte ranges with several goroutines at once.
//
// One core cannot saturate a machine's memory bandwidth: a single-thread
// memcpy of a large buffer reaches a fraction of what two or more cores
// together move. The on-host transports (fabric/local, fabric/shm) copy
// large objects through Copy, which stripes the range over a few workers,
// checks the context (and an optional liveness check) between chunks, and
// can turn a fault on shared memory that shrank under it (SIGBUS) into an
// error instead of a crash, in every worker.
package pcopy

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// Options tune a copy; the zero value means the defaults.
type Options struct {
	// Workers is the most goroutines that copy at once. Default
	// GOMAXPROCS, at most 8.
	Workers int
	// Chunk is how many bytes a worker copies between checks of the
	// context and Check. Default 1 MiB.
	Chunk int
	// MinParallel is the size under which one goroutine copies: starting
	// workers costs more than it gains. Default 8 MiB.
	MinParallel int
	// Check, when set, is called between chunks (serialized across
	// workers); its error stops the copy.
	Check func() error
	// GuardFaults turns a memory fault during the copy (a shared file that
	// shrank under its mapping) into a *FaultError.
	GuardFaults bool
}

// FaultError is a memory fault met during a guarded copy.
type FaultError struct{ Cause error }

func (e *FaultError) Error() string {
	return fmt.Sprintf("pcopy: memory fault during copy: %v", e.Cause)
}
func (e *FaultError) Unwrap() error { return e.Cause }

func (o Options) withDefaults() Options {
	if o.Workers <= 0 {
		o.Workers = min(runtime.GOMAXPROCS(0), 8)
	}
	if o.Chunk <= 0 {
		o.Chunk = 1 << 20
	}
	if o.MinParallel <= 0 {
		o.MinParallel = 8 << 20
	}
	return o
}

// Copy copies from into to (len(to) >= len(from)) and returns the first
// error: ctx's, Check's, or a *FaultError. After an error to's contents
// are undefined.
func Copy(ctx context.Context, to, from []byte, o Options) error {
	if len(to) < len(from) {
		return fmt.Errorf("pcopy: destination of %d bytes for %d", len(to), len(from))
	}
	return Gather(ctx, to, from, []Run{{Off: 0, Len: int64(len(from))}}, o)
}

// Run is one contiguous range of a gather's source: Len bytes from Off.
type Run struct{ Off, Len int64 }

// Gather copies the concatenation of runs of from, in order, into to from
// its start (len(to) >= the runs' total), as Copy copies: on several
// workers when large, checking ctx and Check about every Chunk bytes,
// guarding faults. The runs must lie inside from (callers validate them:
// fabric.CheckRuns). After an error to's contents are undefined.
func Gather(ctx context.Context, to, from []byte, runs []Run, o Options) error {
	o = o.withDefaults()
	var n int64
	for _, r := range runs {
		if r.Off < 0 || r.Len < 0 || r.Off+r.Len > int64(len(from)) {
			return fmt.Errorf("pcopy: run [%d,+%d) outside a source of %d bytes", r.Off, r.Len, len(from))
		}
		n += r.Len
	}
	if int64(len(to)) < n {
		return fmt.Errorf("pcopy: destination of %d bytes for runs of %d", len(to), n)
	}
	workers := min(o.Workers, max(1, int(n)/(o.MinParallel/2)))
	if n < int64(o.MinParallel) || workers < 2 {
		return gatherStripe(ctx, to, from, runs, 0, n, &o, nil)
	}
	var checkMu sync.Mutex
	check := o.Check
	if check != nil {
		check = func() error { checkMu.Lock(); defer checkMu.Unlock(); return o.Check() }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stripe := (n/int64(workers) + 4095) &^ 4095 // whole pages of to per worker
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for a := int64(0); a < n; a += stripe {
		b := min(a+stripe, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := gatherStripe(ctx, to, from, runs, a, b, &o, check); err != nil {
				once.Do(func() { first = err; cancel(err) })
			}
		}()
	}
	wg.Wait()
	return first
}

// gatherStripe copies bytes [a, b) of the runs' concatenation into the
// same range of to.
func gatherStripe(ctx context.Context, to, from []byte, runs []Run, a, b int64, o *Options, check func() error) (err error) {
	if check == nil {
		check = o.Check
	}
	if o.GuardFaults {
		old := debug.SetPanicOnFault(true)
		defer func() {
			debug.SetPanicOnFault(old)
			if r := recover(); r != nil {
				if re, ok := r.(runtime.Error); ok {
					err = &FaultError{Cause: re}
					return
				}
				panic(r)
			}
		}()
	}
	var at, sinceCheck int64 // at: the concatenation's offset of run i
	for _, r := range runs {
		lo, hi := max(a, at), min(b, at+r.Len)
		for lo < hi {
			if sinceCheck == 0 {
				if err := ctx.Err(); err != nil {
					if c := context.Cause(ctx); c != nil {
						return c
					}
					return err
				}
				if check != nil {
					if err := check(); err != nil {
						return err
					}
				}
			}
			k := min(hi-lo, int64(o.Chunk)-sinceCheck)
			copy(to[lo:lo+k], from[r.Off+lo-at:r.Off+lo-at+k])
			lo += k
			sinceCheck = (sinceCheck + k) % int64(o.Chunk)
		}
		at += r.Len
		if at >= b {
			break
		}
	}
	return nil
}
