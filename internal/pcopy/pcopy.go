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
	o = o.withDefaults()
	if len(to) < len(from) {
		return fmt.Errorf("pcopy: destination of %d bytes for %d", len(to), len(from))
	}
	n := len(from)
	workers := min(o.Workers, max(1, n/(o.MinParallel/2)))
	if n < o.MinParallel || workers < 2 {
		return copyStripe(ctx, to, from, &o, nil)
	}
	var checkMu sync.Mutex
	check := o.Check
	if check != nil {
		check = func() error { checkMu.Lock(); defer checkMu.Unlock(); return o.Check() }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Stripes are whole pages, so no two workers touch one page.
	stripe := (n/workers + 4095) &^ 4095
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for off := 0; off < n; off += stripe {
		end := min(off+stripe, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := copyStripe(ctx, to[off:end], from[off:end], &o, check); err != nil {
				once.Do(func() { first = err; cancel(err) })
			}
		}()
	}
	wg.Wait()
	return first
}

func copyStripe(ctx context.Context, to, from []byte, o *Options, check func() error) (err error) {
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
	for off := 0; off < len(from); off += o.Chunk {
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
		copy(to[off:], from[off:min(off+o.Chunk, len(from))])
	}
	return nil
}
