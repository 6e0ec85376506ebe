//go:build ofi

package ofi

/*
#include "cfi.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
)

// op is one posted work request. Its C context (fi_context2 plus our id)
// is freed only when libfabric returns it in a completion, or with the
// CQ, so its address is never reused while libfabric may still report it.
type op struct {
	id   uint64 // the context's id
	wr   rdma.WorkRequest
	opc  rdma.Opcode
	qp   *qp
	mrs  []*mr // the regions its segments lie in, each once
	ctx  unsafe.Pointer
	done bool // reported (completed or flushed): a late completion is dropped
	live bool // libfabric holds its context and may touch its memory
}

// cq is a libfabric completion queue shared by the queue pairs created
// on it. Completions read from libfabric (by Wait or Poll) go to ready.
type cq struct {
	dev  *device
	c    *C.struct_fid_cq
	wait bool
	// ready holds the completions read and not polled yet, and the
	// channel that wakes Wait (a completion, a signal).
	ready provbase.Completions

	buf  unsafe.Pointer
	errb unsafe.Pointer

	mu     sync.Mutex
	ops    map[uint64]*op // by context id, until libfabric returns the context
	nextID uint64
	qps    map[*qp]struct{}
	closed bool
	probes sync.WaitGroup // classify goroutines
	fd     int            // the wait object's fd (FI_GETWAIT), -1 when none
	kick   chan struct{}  // a post wakes Wait's backoff
	// waiter sleeps on fd through the netpoller (waitfd.go); waiting is
	// held by the one goroutine using it.
	waiter   *fdWaiter
	waiterFD int // the fd waiter watches, or failed to: -1 before the first
	waiting  sync.Mutex
}

const cqBatch = 64

// netpollWait bounds one sleep through the netpoller (waitfd.go).
const netpollWait = 2 * time.Millisecond

// statusAmbiguous marks a cancelled request that classify resolves.
const statusAmbiguous rdma.Status = 255

func newCQ(d *device, c *C.struct_fid_cq, wait bool, fd int) *cq {
	q := &cq{dev: d, c: c, wait: wait, ops: map[uint64]*op{}, qps: map[*qp]struct{}{},
		buf: C.malloc(C.tl_entry_size() * cqBatch), errb: C.malloc(C.size_t(unsafe.Sizeof(C.struct_fi_cq_err_entry{}))),
		fd: fd, kick: make(chan struct{}, 1), waiterFD: -1}
	return q
}

// Poll moves ready completions into wc; it reads libfabric without
// waiting (which also drives manual progress).
func (q *cq) Poll(wc []rdma.Completion) int {
	if q.ready.Len() < len(wc) {
		q.read(-1)
	}
	return q.ready.Poll(wc)
}

// Wait blocks until a completion is ready or ctx ends. It sleeps in
// fi_cq_sread (woken by fi_cq_signal when ctx ends or a queue pair
// flushes), or polls with backoff on a CQ without a wait object; every
// round it also breaks queue pairs whose work made no progress within
// their timeout.
func (q *cq) Wait(ctx context.Context) error {
	stop := context.AfterFunc(ctx, q.signal)
	defer stop()
	idle := 0
	for {
		ready := q.ready.Len() > 0
		q.mu.Lock()
		closed := q.closed
		q.mu.Unlock()
		if ready {
			return nil
		}
		if closed {
			return fabric.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		select {
		case <-q.ready.Notify():
			continue
		default:
		}
		timeout := -1
		q.mu.Lock()
		fd := q.fd
		q.mu.Unlock()
		slept := false
		if w := q.waiterFor(fd); w != nil {
			// Sleep on the wait fd through the netpoller when fi_trywait
			// says nothing is pending (fi_cq_signal wakes it too).
			// A short timeout: should the one request's own send wait
			// for a writable socket (which does not wake the watch), the
			// loop comes round to drive it soon.
			slept = w.wait(netpollWait, q.tryWait)
			q.waiting.Unlock()
		} else if fd >= 0 {
			// Sleep on the wait fd without holding fiMu when fi_trywait
			// says nothing is pending (fi_cq_signal wakes it too).
			if slept = q.tryWait(); slept {
				pollFD(fd, 50)
			}
		} else if q.wait {
			timeout = 50
		}
		n := q.read(timeout)
		q.checkTimeouts()
		if q.dev.wanted.Load() > 0 {
			runtime.Gosched()
		}
		// Without a wait object, when fi_trywait refuses to let us sleep,
		// or when the wait fd stays readable with nothing to read (the net
		// provider does both while it has connections), back off: an idle
		// queue must not burn a core.
		idle = backoff(idle, n == 0, q.kick)
	}
}

// tryWait reports whether fi_trywait lets a waiter sleep on the wait fd.
func (q *cq) tryWait() bool {
	q.dev.fiMu.Lock()
	defer q.dev.fiMu.Unlock()
	return C.tl_trywait(q.dev.dom, q.c) == 0
}

// waiterFor returns the netpoller waiter for the queue's wait fd, with
// q.waiting held, or nil when there is none (no fd, the runtime cannot
// poll it, writes are outstanding, or another goroutine is waiting on it:
// that one then sleeps on the fd with poll). A queue reset opens a new
// fd, and a new waiter.
func (q *cq) waiterFor(fd int) *fdWaiter {
	if fd < 0 || q.dev.pollFD || !q.waiting.TryLock() {
		return nil
	}
	q.mu.Lock()
	if len(q.ops) > 1 {
		// A pipeline (a bulk transfer) may need a socket to become
		// writable again before its requests or data go out, which the
		// provider's wait set does not pass on to a watch (see
		// device.progress): it sleeps in poll(2), which finds the set
		// readable and keeps going. Its rate does not hang on how fast
		// one wake is; a single request's latency does.
		q.mu.Unlock()
		q.waiting.Unlock()
		return nil
	}
	for _, o := range q.ops {
		if o.opc == rdma.OpWrite {
			// A write's data may wait for a writable socket too.
			q.mu.Unlock()
			q.waiting.Unlock()
			return nil
		}
	}
	if q.waiterFD != fd {
		q.waiter.close()
		q.waiter, q.waiterFD = nil, fd
		if !q.closed {
			q.waiter = q.dev.waiterFor(fd)
		}
	}
	w := q.waiter
	q.mu.Unlock()
	if w == nil {
		q.waiting.Unlock()
	}
	return w
}

func (q *cq) signal() {
	q.ready.Signal()
	q.mu.Lock()
	if !q.closed && q.wait {
		C.tl_cq_signal(q.c)
	}
	q.mu.Unlock()
}

// progress reads the queue once without waiting, unless another
// goroutine is reading it (which progresses it as well). It reports
// whether it read.
func (q *cq) progress() bool {
	if !q.dev.fiMu.TryLock() {
		return false
	}
	q.dev.fiMu.Unlock()
	q.read(-1)
	return true
}

// read reads one batch from libfabric (timeout in ms, < 0: do not wait)
// and turns it into completions. It returns how many entries it read.
func (q *cq) read(timeout int) int {
	n, broken, err := q.readC(timeout)
	// A queue pair whose request failed for its connection is broken: its
	// other requests are flushed and its endpoint closed (which needs
	// fiMu, so after readC let it go).
	if broken != nil {
		broken.fail(err, rdma.StatusFlushed)
	}
	return n
}

func (q *cq) readC(timeout int) (int, *qp, error) {
	q.dev.fiMu.Lock()
	defer q.dev.fiMu.Unlock()
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if closed {
		return 0, nil, nil
	}
	if q.dev.wanted.Load() > 0 {
		timeout = -1 // someone waits for fiMu: do not sleep holding it
	}
	if timeout >= 0 {
		q.dev.sleeping.Add(1)
		defer q.dev.sleeping.Add(-1)
	}
	n := C.tl_cq_read(q.c, (*C.struct_fi_cq_data_entry)(q.buf), cqBatch, C.int(timeout), (*C.struct_fi_cq_err_entry)(q.errb))
	switch {
	case n > 0:
		entries := (*C.struct_fi_cq_data_entry)(q.buf)
		q.mu.Lock()
		for i := range C.size_t(n) {
			q.completeLocked(C.tl_entry_ctx(entries, i), rdma.StatusSuccess, nil)
		}
		q.mu.Unlock()
		return int(n), nil, nil
	case n == -C.FI_EAVAIL:
		e := (*C.struct_fi_cq_err_entry)(q.errb)
		status, err := mapError(int(C.tl_err_errno(e)), int(C.tl_err_prov(e)), C.GoString(C.tl_cq_strerror(q.c, e)))
		q.mu.Lock()
		if status == statusAmbiguous {
			// Report it once we know whether the owner is alive.
			o := q.takeLocked(C.tl_err_ctx(e))
			if o != nil && !q.closed {
				q.probes.Add(1)
				go q.classify(o, err)
			}
			q.mu.Unlock()
			return 1, nil, nil
		}
		o := q.completeLocked(C.tl_err_ctx(e), status, err)
		q.mu.Unlock()
		if o != nil && status != rdma.StatusSuccess && status != rdma.StatusRemoteAccess && status != rdma.StatusLocalProtection {
			return 1, o.qp, err
		}
		return 1, nil, nil
	case n < 0:
		q.dev.Log.Debug("ofi cq read", "err", fiErr("fi_cq_read", C.int(n)))
	}
	return 0, nil, nil
}

// lock takes the device's fiMu (see device.fiMu).
func (q *cq) lock() { q.dev.lockFI() }

// closeEP closes an endpoint bound to this queue.
func (q *cq) closeEP(ep *C.tl_ep) {
	q.lock()
	C.tl_ep_close(ep)
	q.dev.fiMu.Unlock()
}

// completeLocked handles a context libfabric returned (fiMu and mu
// held): the context is freed, the region no longer in use by it, and the
// operation reported unless it was flushed already. A broken queue pair
// whose last operation came back closes its endpoint now.
func (q *cq) completeLocked(ctx unsafe.Pointer, st rdma.Status, err error) *op {
	o := q.takeLocked(ctx)
	if o != nil {
		q.finishLocked(o, st, err)
	}
	return o
}

// takeLocked is completeLocked without reporting: the context is freed,
// the memory released, and the operation returned (nil when it was
// reported already).
func (q *cq) takeLocked(ctx unsafe.Pointer) *op {
	if ctx == nil {
		return nil
	}
	id := uint64(C.tl_ctx_id(ctx))
	o := q.ops[id]
	delete(q.ops, id)
	C.tl_ctx_free(ctx)
	if o == nil {
		return nil
	}
	q.releaseLocked(o)
	p := o.qp
	if p.draining && p.live == 0 && p.ep != nil {
		C.tl_ep_close(p.ep)
		p.ep = nil
		delete(q.qps, p)
	}
	if o.done {
		return nil
	}
	return o
}

// classify reports a request the provider cancelled: the net and tcp
// providers drop the data connection when a request names a key the
// target does not know (revoked by Deregister), the same way they report
// a peer that went away. The bootstrap connection tells them apart: if
// the owner still answers a ping, the key was refused (remote access
// error, the queue pair stays usable); if not, the queue pair is broken.
func (q *cq) classify(o *op, err error) {
	defer q.probes.Done()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	status := rdma.StatusRemoteAccess
	if perr := o.qp.ping(ctx); perr != nil {
		status = rdma.StatusFlushed
		err = errors.Join(fabric.ErrPeerClosed, err)
	}
	q.mu.Lock()
	if !o.done {
		q.finishLocked(o, status, err)
	}
	q.mu.Unlock()
	if status == rdma.StatusFlushed {
		o.qp.fail(err, rdma.StatusFlushed)
	}
	q.signal()
}

// probeTimeout bounds the ping that classifies a cancelled request.
const probeTimeout = 2 * time.Second

// releaseLocked records that libfabric no longer touches o's memory.
func (q *cq) releaseLocked(o *op) {
	if !o.live {
		return
	}
	o.live = false
	o.qp.live--
	for _, m := range o.mrs {
		m.mu.Lock()
		delete(m.inflight, o)
		if len(m.inflight) == 0 {
			m.idle.Broadcast()
		}
		m.mu.Unlock()
	}
}

// finishLocked reports o's completion (once).
func (q *cq) finishLocked(o *op, st rdma.Status, err error) {
	o.done = true
	wc := rdma.Completion{ID: o.wr.ID, Op: o.opc, Status: st, Err: err}
	if st == rdma.StatusSuccess {
		wc.Bytes = int(o.wr.Length)
	}
	q.ready.Push(wc)
	delete(o.qp.ops, o)
	o.qp.lastProgress = time.Now()
}

// reset is the last resort when requests do not come back (a hung
// peer) or the queue closes: every queue pair on it is broken and its
// endpoint closed, then the libfabric queue itself is closed, so nothing
// touches the requests' memory any more. libfabric 1.17's rxm crashed
// reading a queue after one of its endpoints was closed with requests in
// flight, so the queue is never read again: unless closing, a fresh one
// takes its place (the transport reconnects its rails).
func (q *cq) reset(closing bool, cause error) {
	q.mu.Lock()
	qps := make([]*qp, 0, len(q.qps))
	for p := range q.qps {
		qps = append(qps, p)
	}
	q.mu.Unlock()
	for _, p := range qps {
		p.fail(cause, rdma.StatusFlushed)
	}
	d := q.dev
	q.lock()
	defer d.fiMu.Unlock()
	d.Mu.Lock() // lockFI signals d.cqs' queues under d.Mu: swap it under d.Mu too
	defer d.Mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	for p := range q.qps {
		if p.ep != nil {
			C.tl_ep_close(p.ep)
			p.ep = nil
		}
	}
	q.qps = map[*qp]struct{}{}
	C.tl_cq_close(q.c)
	for id, o := range q.ops {
		q.releaseLocked(o)
		if !o.done {
			q.finishLocked(o, rdma.StatusFlushed, cause)
		}
		C.tl_ctx_free(o.ctx)
		delete(q.ops, id)
	}
	if !closing {
		if c, wait, fd, err := d.openCQ(); err == nil {
			q.c, q.wait, q.fd = c, wait, fd
			return
		}
		d.Log.Warn("ofi: could not reopen a completion queue; the NIC's transfers fail from now on")
	}
	q.closed = true
	delete(d.cqs, q)
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// checkTimeouts breaks queue pairs with work outstanding and no
// completion within their timeout (the retry limit of RC).
func (q *cq) checkTimeouts() {
	now := time.Now()
	var stale []*qp
	q.mu.Lock()
	for p := range q.qps {
		if len(p.ops) > 0 && now.Sub(p.lastProgress) > p.cfg.Timeout {
			stale = append(stale, p)
		}
	}
	q.mu.Unlock()
	for _, p := range stale {
		p.fail(fmt.Errorf("%w: ofi: no progress from the remote in %v", fabric.ErrStalled, p.cfg.Timeout), rdma.StatusRetryExceeded)
	}
}

// Close closes the libfabric queue and frees the contexts it still
// held. The queue pairs on it must be closed first (the device does).
func (q *cq) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	qps := make([]*qp, 0, len(q.qps))
	for p := range q.qps {
		qps = append(qps, p)
	}
	q.mu.Unlock()
	for _, p := range qps {
		p.Close()
	}
	// Let the broken queue pairs' requests come back, bounded, before
	// their endpoints are closed under them.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		q.mu.Lock()
		live := 0
		for _, p := range qps {
			live += p.live
		}
		q.mu.Unlock()
		if live == 0 {
			break
		}
		if q.read(-1) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	q.reset(true, fmt.Errorf("%w: ofi: completion queue closed", fabric.ErrClosed))
	q.probes.Wait()
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.dev.Mu.Lock()
	delete(q.dev.cqs, q)
	q.dev.Mu.Unlock()
	q.mu.Lock()
	q.waiter.close()
	q.mu.Unlock()
	C.free(q.buf)
	C.free(q.errb)
	return nil
}

// mapError turns a libfabric completion error into a work completion
// status.
// The tcp provider reports a key its target does not know as a
// cancelled request whose provider error is ENOENT (EACCES for a range
// or access the key does not allow).
//
// The net provider instead drops the connection (ECANCELED with
// EINPROGRESS), which looks like a peer that died: statusAmbiguous sends
// it to classify.
func mapError(code, prov int, detail string) (rdma.Status, error) {
	err := fmt.Errorf("ofi: %s (%d): %s", C.GoString(C.fi_strerror(C.int(code))), code, detail)
	if syscall.Errno(code) == syscall.ECANCELED && (syscall.Errno(prov) == syscall.ENOENT || syscall.Errno(prov) == syscall.EACCES) {
		return rdma.StatusRemoteAccess, err
	}
	if syscall.Errno(code) == syscall.ECANCELED {
		return statusAmbiguous, err
	}
	switch syscall.Errno(code) {
	case syscall.EACCES, syscall.EPERM, syscall.ENOKEY, syscall.EKEYREJECTED, syscall.EINVAL, syscall.EFAULT:
		return rdma.StatusRemoteAccess, err
	case syscall.ECANCELED:
		return rdma.StatusFlushed, err
	case syscall.ETIMEDOUT:
		return rdma.StatusRetryExceeded, errors.Join(fabric.ErrStalled, err)
	}
	return rdma.StatusFlushed, errors.Join(fabric.ErrPeerClosed, err)
}
