package provbase

import (
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// QPConfig returns cfg with its zero values replaced by rdma.QPConfig's
// documented defaults (128 outstanding requests, a 10 s timeout).
func QPConfig(cfg rdma.QPConfig) rdma.QPConfig {
	if cfg.MaxOutstanding <= 0 {
		cfg.MaxOutstanding = 128
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	return cfg
}

// Fault is a queue pair's broken state: it breaks once, for one reason
// (what its calls return) and with one status (what its outstanding work
// requests complete with). A provider's queue pair embeds it (Err is
// rdma.QueuePair's) and calls Break while holding the lock that guards
// its outstanding work, so that nothing is posted after the flush. The
// zero value is a working queue pair.
type Fault struct {
	mu     sync.Mutex // a leaf: taken under the queue pair's own locks
	err    error
	status rdma.Status
	done   chan struct{} // made on demand, closed by Break
}

// closedCh stands for a Done channel asked for after the break.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Break records err and status unless the queue pair broke before; it
// reports whether this call broke it (and must then flush its work).
func (f *Fault) Break(err error, status rdma.Status) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return false
	}
	f.err, f.status = err, status
	if f.done != nil {
		close(f.done)
	} else {
		f.done = closedCh
	}
	return true
}

// BreakUnder takes mu (the queue pair's lock over its outstanding
// work), breaks the queue pair and, when this call broke it, runs take
// before letting mu go: what take moves out of the queue pair is the
// caller's to flush, and nothing is posted after it. It reports whether
// this call broke the queue pair.
func (f *Fault) BreakUnder(mu sync.Locker, err error, status rdma.Status, take func()) bool {
	mu.Lock()
	defer mu.Unlock()
	if !f.Break(err, status) {
		return false
	}
	take()
	return true
}

// Ready says whether work may be posted: the reason the queue pair
// broke, rdma.ErrNotConn before it connected, nil when it may.
func (f *Fault) Ready(connected bool) error {
	if err := f.Err(); err != nil {
		return err
	}
	if !connected {
		return rdma.ErrNotConn
	}
	return nil
}

// Err is nil while the queue pair works, then the reason it broke.
func (f *Fault) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Why returns the reason and the flush status (nil and success while the
// queue pair works).
func (f *Fault) Why() (error, rdma.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err, f.status
}

// Broken is closed when the queue pair breaks.
func (f *Fault) Broken() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		f.done = make(chan struct{})
	}
	return f.done
}
