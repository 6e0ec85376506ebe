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
	"net"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/kit"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
)

// qp is the active side of a queue pair: its own endpoint (closing it
// stops its transfers) and the bootstrap connection that authenticated
// the remote and carries Call.
type qp struct {
	// Fault holds why the queue pair broke (it breaks under mu) and is
	// closed-state too: a broken queue pair is closed for good.
	provbase.Fault
	dev *device
	cq  *cq
	cfg rdma.QPConfig

	mu    sync.Mutex // guards ep against close while posting
	ep    *C.tl_ep
	conn  net.Conn
	calls provbase.Calls[bootFrame]
	wmu   sync.Mutex
	wg    sync.WaitGroup

	// Guarded by cq.mu; ep is closed and cleared only with dev.fiMu held
	// as well, so a holder of either may use it.
	ops          map[*op]struct{} // not reported yet
	live         int              // contexts libfabric holds
	draining     bool             // broken: close ep when live drops to 0
	lastProgress time.Time
}

func (p *pd) CreateQP(c rdma.CompletionQueue, cfg rdma.QPConfig) (rdma.QueuePair, error) {
	q, ok := c.(*cq)
	if !ok || q.dev != p.dev {
		return nil, errors.New("ofi: CreateQP needs a completion queue of the same device")
	}
	d := p.dev
	qp := &qp{dev: d, cq: q, cfg: provbase.QPConfig(cfg), ops: map[*op]struct{}{}}
	d.lockFI()
	defer d.fiMu.Unlock()
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if d.Closed {
		return nil, fabric.ErrClosed
	}
	if rc := C.tl_ep_open(d.dom, q.c, &qp.ep); rc != 0 {
		return nil, fmt.Errorf("ofi: NIC %s: queue pair endpoint: %w", d.nic.Name, fiErr("fi_endpoint", rc))
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		C.tl_ep_close(qp.ep)
		return nil, fabric.ErrClosed
	}
	q.qps[qp] = struct{}{}
	q.mu.Unlock()
	d.qps[qp] = struct{}{}
	return qp, nil
}

// Connect dials the remote device's bootstrap address from this NIC,
// authenticates both ends (and the cluster key), and inserts the remote
// endpoint's address. ctx bounds it, and HandshakeTimeout the handshake.
func (q *qp) Connect(ctx context.Context, addr string, want peer.ID) error {
	d := q.dev
	q.mu.Lock()
	if q.Err() != nil || q.conn != nil {
		q.mu.Unlock()
		return fmt.Errorf("%w: ofi: queue pair closed or already connected", fabric.ErrClosed)
	}
	q.mu.Unlock()
	// The bootstrap connection leaves from this NIC's address; after the
	// handshake the owner sends its target endpoint's address.
	var name []byte
	conn, err := d.Dial(ctx, addr, want, kit.DialFrom, func(conn net.Conn) (err error) {
		name, err = peerauth.ReadField(conn, MaxAddr)
		return err
	})
	if err != nil {
		return err
	}
	if len(name) == 0 {
		conn.Close()
		return fmt.Errorf("%w: ofi: %s sent an empty endpoint address", fabric.ErrBadRequest, addr)
	}
	q.mu.Lock()
	if q.Err() != nil {
		q.mu.Unlock()
		conn.Close()
		return fabric.ErrClosed
	}
	// The address's length is the provider's (fi_getname of a domain of
	// the same provider); C copies what it needs.
	cname := C.CBytes(padAddr(name))
	d.lockFI()
	rc := C.int(-C.FI_ECANCELED)
	q.cq.mu.Lock()
	if q.ep != nil {
		rc = C.tl_ep_insert(q.ep, cname)
	}
	q.cq.mu.Unlock()
	d.fiMu.Unlock()
	C.free(cname)
	if rc != 0 {
		q.mu.Unlock()
		conn.Close()
		return fmt.Errorf("%w: ofi: insert %s's endpoint address: %v", fabric.ErrBadRequest, addr, fiErr("fi_av_insert", rc))
	}
	q.conn = conn
	q.wg.Add(2)
	q.mu.Unlock()
	go q.receive()
	go q.keepalive()
	return nil
}

// keepEvery is how often a queue pair with requests in flight pings the
// owner: the data moves outside the bootstrap connection, which would
// otherwise look idle to the owner's listener (fabric.ListenerLimits's
// IdleTimeout, 5 minutes by default) during a long transfer.
const keepEvery = 30 * time.Second

func (q *qp) keepalive() {
	defer q.wg.Done()
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		select {
		case <-q.Broken():
			return
		case <-t.C:
		}
		q.cq.mu.Lock()
		busy := q.live > 0 || len(q.ops) > 0
		q.cq.mu.Unlock()
		if !busy {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.dev.p.cfg.HandshakeTimeout)
		err := q.ping(ctx)
		cancel()
		if err != nil && q.Err() == nil {
			q.fail(fmt.Errorf("%w: ofi: owner did not answer a keepalive: %v", fabric.ErrPeerClosed, err), rdma.StatusFlushed)
		}
	}
}

// padAddr pads a received address to MaxAddr bytes: fi_av_insert reads
// as many bytes as the provider's address format has, never fewer than
// a peer could send short.
func padAddr(b []byte) []byte {
	out := make([]byte, MaxAddr)
	copy(out, b)
	return out
}

// receive reads answers to calls until the connection ends, which breaks
// the queue pair.
func (q *qp) receive() {
	defer q.wg.Done()
	for {
		f, err := readFrame(q.conn)
		if err == nil && (f.kind == kindCall || f.kind == kindPing) {
			err = fmt.Errorf("%w: ofi: the owner sent a call", fabric.ErrBadRequest)
		}
		if err != nil {
			q.fail(fmt.Errorf("%w: ofi: bootstrap connection: %v", fabric.ErrPeerClosed, err), rdma.StatusFlushed)
			return
		}
		if ch := q.calls.Take(f.id); ch != nil {
			ch <- f
		}
	}
}

func (q *qp) PostRead(wr rdma.WorkRequest) error  { return q.post(rdma.OpRead, wr) }
func (q *qp) PostWrite(wr rdma.WorkRequest) error { return q.post(rdma.OpWrite, wr) }

func (q *qp) post(opc rdma.Opcode, wr rdma.WorkRequest) error {
	d := q.dev
	if err := rdma.CheckSGL(wr, opc, d.maxSGE); err != nil {
		return err
	}
	segs := wr.SGL
	if len(segs) == 0 {
		segs = []rdma.Segment{{LKey: wr.LKey, Addr: wr.LocalAddr, Length: wr.Length}}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.Ready(q.conn != nil); err != nil {
		return err
	}
	// The segments' addresses in this process and their registrations'
	// descriptors; for a WRITE of several, fi_writemsg's iov.
	var mrs []*mr
	locals, lens, descs := make([]uint64, len(segs)), make([]uint64, len(segs)), make([]uint64, len(segs))
	var bad error
	d.Mu.Lock()
	for i, sg := range segs {
		m := d.mrs[sg.LKey]
		var local uintptr
		ok := m != nil
		if ok {
			local, ok = m.ptr(sg.Addr, sg.Length)
		}
		if !ok {
			bad = fmt.Errorf("ofi: lkey %d does not cover [%#x,+%d)", sg.LKey, sg.Addr, sg.Length)
			break
		}
		locals[i], lens[i], descs[i] = uint64(local), uint64(sg.Length), uint64(uintptr(m.desc))
		if !slices.Contains(mrs, m) {
			mrs = append(mrs, m)
		}
	}
	d.Mu.Unlock()
	c := q.cq
	c.mu.Lock()
	if bad != nil {
		// As verbs does: the request completes with a local protection error.
		c.ready.Push(rdma.Completion{ID: wr.ID, Op: opc, Status: rdma.StatusLocalProtection, Err: bad})
		c.mu.Unlock()
		c.signal()
		return nil
	}
	if len(q.ops) >= q.cfg.MaxOutstanding {
		c.mu.Unlock()
		return rdma.ErrQueueFull
	}
	c.nextID++
	o := &op{id: c.nextID, wr: wr, opc: opc, qp: q, mrs: mrs}
	c.mu.Unlock()
	o.ctx = unsafe.Pointer(C.tl_ctx_new(C.uint64_t(o.id)))
	if o.ctx == nil {
		return fmt.Errorf("ofi: out of C memory for a request context")
	}
	write := C.int(0)
	if opc == rdma.OpWrite {
		write = 1
	}
	// -FI_EAGAIN: the provider's queue is full or (rxm) the connection to
	// the peer is still being set up; both move only with progress, so
	// drive it and try again for a short while before reporting a full
	// queue (the caller retries).
	for start := time.Now(); ; {
		c.lock()
		c.mu.Lock()
		ep := q.ep
		if ep == nil {
			c.mu.Unlock()
			c.dev.fiMu.Unlock()
			C.tl_ctx_free(o.ctx)
			return q.errOr(fabric.ErrClosed)
		}
		// Recorded before the post: its completion may be read by the
		// next fi_cq_read, which waits for fiMu.
		if len(q.ops) == 0 {
			q.lastProgress = time.Now()
		}
		o.live = true
		q.live++
		c.ops[o.id] = o
		q.ops[o] = struct{}{}
		for _, m := range mrs {
			m.mu.Lock()
			m.inflight[o] = struct{}{}
			m.mu.Unlock()
		}
		c.mu.Unlock()
		var rc C.ssize_t
		if len(segs) == 1 {
			rc = C.tl_post(ep, write, C.uint64_t(locals[0]), C.size_t(lens[0]), mrs[0].desc, C.uint64_t(wr.RemoteAddr), C.uint64_t(wr.RKey), o.ctx)
		} else {
			rc = C.tl_postv(ep, (*C.uint64_t)(unsafe.Pointer(&locals[0])), (*C.uint64_t)(unsafe.Pointer(&lens[0])),
				(*C.uint64_t)(unsafe.Pointer(&descs[0])), C.size_t(len(segs)), C.uint64_t(wr.RemoteAddr), C.uint64_t(wr.RKey), o.ctx)
		}
		if rc != 0 {
			// Not posted: libfabric holds no reference to the context.
			c.mu.Lock()
			delete(c.ops, o.id)
			delete(q.ops, o)
			c.releaseLocked(o)
			c.mu.Unlock()
		}
		c.dev.fiMu.Unlock()
		if rc == 0 {
			kickOf(c.kick)
			return nil
		}
		if rc != -C.FI_EAGAIN {
			C.tl_ctx_free(o.ctx)
			return fmt.Errorf("ofi: post %v: %w", opc, fiErr("fi_read/fi_write", C.int(rc)))
		}
		if time.Since(start) > postRetry {
			C.tl_ctx_free(o.ctx)
			return rdma.ErrQueueFull
		}
		if !c.progress() {
			runtime.Gosched()
		}
	}
}

func (q *qp) errOr(def error) error {
	if err := q.Err(); err != nil {
		return err
	}
	return def
}

// postRetry bounds how long a post drives progress while the provider
// says -FI_EAGAIN.
const postRetry = 20 * time.Millisecond

// Call sends a control message over the bootstrap connection and waits
// for the answer, ctx, or the queue pair's end.
func (q *qp) Call(ctx context.Context, msg []byte) ([]byte, error) {
	return q.roundTrip(ctx, kindCall, msg)
}

// ping asks the owner's side of the bootstrap connection for an empty
// answer.
func (q *qp) ping(ctx context.Context) error {
	_, err := q.roundTrip(ctx, kindPing, nil)
	return err
}

func (q *qp) roundTrip(ctx context.Context, kind byte, msg []byte) ([]byte, error) {
	f, err := q.calls.Round(ctx, &q.Fault, len(msg), MaxMessage, func(id uint64) error {
		q.mu.Lock()
		if err := q.Ready(q.conn != nil); err != nil {
			q.mu.Unlock()
			return err
		}
		conn := q.conn
		q.mu.Unlock()
		q.wmu.Lock()
		dl, ok := ctx.Deadline()
		if !ok || time.Until(dl) > q.dev.p.cfg.HandshakeTimeout {
			dl = time.Now().Add(q.dev.p.cfg.HandshakeTimeout) // a bounded write, whatever ctx says
		}
		conn.SetWriteDeadline(dl)
		_, err := conn.Write(appendFrame(nil, bootFrame{kind: kind, id: id, payload: msg}))
		q.wmu.Unlock()
		if err != nil {
			q.fail(fmt.Errorf("%w: ofi: send control message: %v", fabric.ErrPeerClosed, err), rdma.StatusFlushed)
			return q.Err()
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case f.kind == kindError:
		return nil, provbase.RemoteError(f.payload)
	}
	return f.payload, nil
}

// Close flushes outstanding requests and disconnects. Idempotent.
func (q *qp) Close() error {
	q.fail(fmt.Errorf("%w: ofi: queue pair closed", fabric.ErrClosed), rdma.StatusFlushed)
	q.wg.Wait()
	return nil
}

// fail breaks the queue pair once: its outstanding requests are
// reported with status and the bootstrap connection closes. Its endpoint
// closes once libfabric returned every request's context (closing it
// under requests in flight crashed the rxm provider); a request that
// never comes back is cut off by the region's Deregister or the queue's
// Close.
func (q *qp) fail(err error, status rdma.Status) {
	var conn net.Conn
	if !q.BreakUnder(&q.mu, err, status, func() { conn = q.conn }) {
		return
	}
	if conn != nil {
		conn.Close()
	}
	c := q.cq
	c.lock()
	c.mu.Lock()
	for o := range q.ops {
		c.finishLocked(o, status, err)
	}
	q.draining = true
	if q.live == 0 && q.ep != nil {
		C.tl_ep_close(q.ep)
		q.ep = nil
		delete(c.qps, q)
	}
	c.mu.Unlock()
	c.dev.fiMu.Unlock()
	c.signal()
	d := q.dev
	d.Mu.Lock()
	delete(d.qps, q)
	d.Mu.Unlock()
}
