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
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"

	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
)

// device is an opened NIC: a libfabric fabric and domain, and when it
// listens a target endpoint with its progress loop and the bootstrap
// listener.
// MaxSGE is the most local segments one WRITE may carry (rdma.SGELimit):
// the domain's tx iov_limit (fi_writemsg's iov), at most maxSGECap and
// Config.MaxSGE.
func (d *device) MaxSGE() int { return d.maxSGE }

var _ rdma.SGELimit = (*device)(nil)

type device struct {
	// Base is what every provider's device has: name, configuration,
	// Mu and Closed (which also guard the tables below), the bootstrap
	// listener and queue-pair ids.
	provbase.Base
	p   *Provider
	nic NIC
	dom *C.tl_dom

	mrMode  uint64
	maxSGE  int // local segments per WRITE (tx iov_limit, capped)
	keySize int
	noWait  bool
	// pollFD: queues sleep on wait fds in poll(2) (Config.PollWaitFD,
	// or the netpoller could not watch one: netpollOnce logged it).
	pollFD      bool
	netpollOnce sync.Once

	// fiMu serializes every libfabric call on the domain: the rxm
	// provider crashed (1.17, tcp) when a queue was read while another
	// thread posted, closed an endpoint or a registration, despite
	// FI_THREAD_SAFE. A holder asleep in fi_cq_sread is woken
	// (fi_cq_signal) by whoever needs the lock (lockFI).
	fiMu sync.Mutex
	// wanted counts lockFI callers waiting: a reader does not go back to
	// sleep in fi_cq_sread while someone waits for the lock.
	wanted atomic.Int32
	// sleeping counts readers asleep in fi_cq_sread holding fiMu (queues
	// without a wait fd); lockFI wakes them only then.
	sleeping atomic.Int32

	// The target endpoint (listening devices): remote peers read and
	// write its registrations. Its data progress is manual on most
	// providers, so a goroutine drives it.
	target   *C.tl_ep
	tcq      *C.struct_fid_cq
	tcqWait  bool
	tfd      int           // tcq's wait fd, -1 when none
	kick     chan struct{} // wakes the progress loop's backoff
	addrName []byte        // the target's fi_getname

	mrs      map[uint32]*mr // by lkey
	nextLKey uint32
	qps      map[*qp]struct{}
	cqs      map[*cq]struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
}

func openDevice(ctx context.Context, p *Provider, nic NIC, cfg rdma.OpenConfig) (*device, error) {
	host, _, _ := net.SplitHostPort(nic.Addr)
	node := ""
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && p.isTCP() {
		node = host // the endpoints' source address: traffic leaves through this NIC
	}
	if p.msg {
		return nil, fmt.Errorf("%w: provider %s offers only connected (FI_EP_MSG) endpoints, which this version does not drive yet", ErrUnavailable, p.prov)
	}
	info, err := getinfo(p.prov, nic.Domain, node, p.msg)
	if err != nil {
		return nil, fmt.Errorf("ofi: NIC %s (domain %s): %w", nic.Name, nic.Domain, err)
	}
	defer C.fi_freeinfo(info)
	d := &device{p: p, nic: nic,
		mrMode: uint64(C.tl_mr_mode(info)), keySize: int(C.tl_mr_key_size(info)), noWait: p.cfg.NoWait, pollFD: p.cfg.PollWaitFD,
		mrs: map[uint32]*mr{}, qps: map[*qp]struct{}{}, cqs: map[*cq]struct{}{},
		stop: make(chan struct{}), kick: make(chan struct{}, 1)}
	d.maxSGE = max(1, min(int(C.tl_iov_limit(info)), maxSGECap))
	if p.cfg.MaxSGE > 0 {
		d.maxSGE = min(d.maxSGE, p.cfg.MaxSGE)
	}
	d.Init("ofi", nic.Name, nic.Addr, cfg, p.cfg.HandshakeTimeout, "ofi", p.prov)
	if rc := C.tl_dom_open(info, &d.dom); rc != 0 {
		return nil, fmt.Errorf("ofi: NIC %s: open domain %s: %w", nic.Name, nic.Domain, fiErr("fi_domain", rc))
	}
	if !cfg.Listen {
		return d, nil
	}
	if err := d.listen(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// openCQ opens a completion queue: with a wait fd where the provider
// offers one (waited on with fi_trywait and poll, without holding fiMu),
// else with a wait object (fi_cq_sread), unless NoWait (or neither works):
// then reads poll with backoff. fd is -1 without a wait fd.
func (d *device) openCQ() (c *C.struct_fid_cq, wait bool, fd int, err error) {
	if !d.noWait {
		if rc := C.tl_cq_open(d.dom, 2, &c); rc == 0 {
			return c, true, int(C.tl_cq_waitfd(c)), nil
		}
		if rc := C.tl_cq_open(d.dom, 1, &c); rc == 0 {
			return c, true, -1, nil
		}
	}
	if rc := C.tl_cq_open(d.dom, 0, &c); rc != 0 {
		return nil, false, -1, fiErr("fi_cq_open", rc)
	}
	return c, false, -1, nil
}

func (d *device) listen(ctx context.Context) error {
	var err error
	d.tcq, d.tcqWait, d.tfd, err = d.openCQ()
	if err != nil {
		return fmt.Errorf("ofi: NIC %s: %w", d.nic.Name, err)
	}
	if rc := C.tl_ep_open(d.dom, d.tcq, &d.target); rc != 0 {
		return fmt.Errorf("ofi: NIC %s: target endpoint: %w", d.nic.Name, fiErr("fi_endpoint", rc))
	}
	d.addrName = C.GoBytes(unsafe.Pointer(&d.target.name[0]), C.int(d.target.namelen))
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", d.nic.Addr)
	if err != nil {
		return fmt.Errorf("ofi: NIC %s: bootstrap listen on %s: %w", d.nic.Name, d.nic.Addr, err)
	}
	d.wg.Add(1)
	go d.progress()
	d.Serve(ln, d.serve)
	return nil
}

// progress drives the target endpoint: on manual-progress providers
// (tcp, verbs via rxm) remote reads and writes are served only while
// someone reads its completion queue. fi_cq_sread sleeps on the wait
// object between requests; without one the loop backs off to 1 ms.
func (d *device) progress() {
	defer d.wg.Done()
	buf := C.malloc(C.tl_entry_size() * 16)
	errb := C.malloc(C.size_t(unsafe.Sizeof(C.struct_fi_cq_err_entry{})))
	defer C.free(buf)
	defer C.free(errb)
	var idle int
	fd := d.tfd
	tryWait := func() bool {
		d.fiMu.Lock()
		defer d.fiMu.Unlock()
		return C.tl_trywait(d.dom, d.tcq) == 0
	}
	for {
		select {
		case <-d.stop:
			return
		default:
		}
		slept := false
		if fd >= 0 {
			// Sleep on the wait fd without holding fiMu (fi_trywait says
			// whether nothing is pending); a read comes after every wake.
			// In poll(2), not through the netpoller as the queues do
			// (waitfd.go): the target sends the data of remote reads, and
			// a socket that becomes writable again does not wake a watch
			// on the wait fd (the provider's set passes on only POLLIN);
			// poll(2) finds the set readable anyway and keeps going.
			if slept = tryWait(); slept {
				pollFD(fd, 100)
			}
		}
		timeout := C.int(-1)
		if fd < 0 && d.tcqWait && d.wanted.Load() == 0 {
			timeout = 100
			d.sleeping.Add(1)
		}
		d.fiMu.Lock()
		n := C.tl_cq_read(d.tcq, (*C.struct_fi_cq_data_entry)(buf), 16, timeout, (*C.struct_fi_cq_err_entry)(errb))
		d.fiMu.Unlock()
		if timeout >= 0 {
			d.sleeping.Add(-1)
		}
		switch {
		case n == -C.FI_EAVAIL:
			d.Log.Debug("ofi target completion error", "err", fiErr("target", C.tl_err_errno((*C.struct_fi_cq_err_entry)(errb))))
		case n < 0:
			d.Log.Debug("ofi target progress", "err", fiErr("fi_cq_read", C.int(n)))
		}
		if d.wanted.Load() > 0 {
			runtime.Gosched()
		}
		_ = slept
		idle = backoff(idle, n == 0, d.kick) // as in cq.Wait: never spin while idle
	}
}

// waiterFor makes the netpoller waiter for a wait fd, or returns nil: no
// fd, Config.PollWaitFD, or the runtime cannot watch it (logged once per
// device: its queues then sleep in poll(2), each wake a thread the kernel
// has to schedule).
func (d *device) waiterFor(fd int) *fdWaiter {
	if fd < 0 || d.pollFD {
		return nil
	}
	w := newFDWaiter(fd)
	if w == nil {
		d.netpollOnce.Do(func() {
			d.Log.Warn("ofi: the Go netpoller cannot watch the provider's wait fd; completion queues sleep in poll(2), which wakes slower", "nic", d.nic.Name)
		})
	}
	return w
}

// lockFI takes fiMu, waking the device's queues asleep in fi_cq_sread
// first. The caller must not hold d.Mu.
func (d *device) lockFI() {
	if d.fiMu.TryLock() {
		return
	}
	d.wanted.Add(1)
	defer d.wanted.Add(-1)
	if d.sleeping.Load() == 0 {
		d.fiMu.Lock()
		return
	}
	d.Mu.Lock()
	for q := range d.cqs {
		if q.wait {
			C.tl_cq_signal(q.c)
		}
	}
	if d.tcq != nil && d.tcqWait {
		C.tl_cq_signal(d.tcq)
	}
	d.Mu.Unlock()
	d.fiMu.Lock()
}

// pollFD waits up to ms milliseconds for fd to become readable.
func pollFD(fd, ms int) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	unix.Poll(fds, ms)
}

// backoff sleeps for a polling loop that found nothing: a few passes
// without sleeping, then 10 µs doubling to 1 ms, cut short by kick. It
// returns the new idle count (0 when work came).
func backoff(idle int, empty bool, kick <-chan struct{}) int {
	if !empty {
		return 0
	}
	idle++
	if idle > 16 {
		t := time.NewTimer(min(10*time.Microsecond<<min(idle-16, 7), time.Millisecond))
		defer t.Stop()
		select {
		case <-t.C:
		case <-kick:
			return 0 // work is coming: poll eagerly again
		}
	}
	return idle
}

// kickOf wakes a loop in backoff (see backoff): a post on the reader's
// queue, a registration on the owner's target, which announce requests.
func kickOf(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// maxHandlers bounds the control messages one bootstrap connection has
// in its handler at once.
const maxHandlers = 16

// serve is the passive side of one queue pair: authenticate, send the
// target endpoint's address, answer control messages until the
// connection ends, then tell the handler the queue pair is gone.
func (d *device) serve(c net.Conn) {
	from, ok := d.Accept(c, func(c net.Conn) error { return peerauth.WriteField(c, d.addrName) })
	if !ok {
		return
	}
	var wmu sync.Mutex
	s := d.Session(c, from, maxHandlers)
	defer s.End()
	// A queue pair that sends nothing for IdleTimeout is dropped (readers
	// ping while they have requests in flight, see qp.keepalive).
	for {
		s.ArmIdle()
		f, err := readFrame(c)
		if err != nil {
			s.Ended(err)
			return
		}
		if f.kind == kindPing {
			wmu.Lock()
			c.SetWriteDeadline(time.Now().Add(d.p.cfg.HandshakeTimeout))
			_, err := c.Write(appendFrame(nil, bootFrame{kind: kindReply, id: f.id}))
			wmu.Unlock()
			if err != nil {
				return
			}
			continue
		}
		if f.kind != kindCall {
			d.Log.Warn("rdma queue pair dropped: unexpected frame", "peer", from.Peer, "kind", f.kind)
			return
		}
		ok := s.Go(func(ctx context.Context) {
			out, closing := d.answer(ctx, from, f)
			if closing {
				// The device is closing under the handler: the queue pair
				// ends (the reader sees its owner go away, a typed error),
				// rather than carry an internal error back.
				c.Close()
				return
			}
			if out.kind == kindReply && len(out.payload) > 0 && d.p.cfg.Faults.TakeCorrupt() {
				out.payload = out.payload[:len(out.payload)-1]
			}
			wmu.Lock()
			c.SetWriteDeadline(time.Now().Add(d.p.cfg.HandshakeTimeout))
			_, err := c.Write(appendFrame(nil, out))
			wmu.Unlock()
			if err != nil {
				c.Close()
			}
		})
		if !ok {
			return
		}
	}
}

// answer runs the handler for one message; an error travels as a
// peerauth status code and message.
func (d *device) answer(ctx context.Context, from rdma.RemoteQP, f bootFrame) (bootFrame, bool) {
	resp, err := d.Handle(ctx, from, f.payload)
	if err == nil && len(resp) > MaxMessage {
		err = fmt.Errorf("ofi: answer of %d bytes (max %d)", len(resp), MaxMessage)
	}
	if err != nil {
		d.Mu.Lock()
		closed := d.Closed
		d.Mu.Unlock()
		if closed || errors.Is(err, fabric.ErrClosed) {
			return bootFrame{}, true
		}
		return bootFrame{kind: kindError, id: f.id, payload: provbase.ErrorAnswer(err)}, false
	}
	return bootFrame{kind: kindReply, id: f.id, payload: resp}, false
}

func (d *device) AllocPD() (rdma.ProtectionDomain, error) {
	if err := d.Live(); err != nil {
		return nil, err
	}
	return &pd{dev: d}, nil
}

func (d *device) CreateCQ() (rdma.CompletionQueue, error) {
	d.lockFI()
	defer d.fiMu.Unlock()
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if d.Closed {
		return nil, fabric.ErrClosed
	}
	c, wait, fd, err := d.openCQ()
	if err != nil {
		return nil, fmt.Errorf("ofi: NIC %s: %w", d.nic.Name, err)
	}
	q := newCQ(d, c, wait, fd)
	d.cqs[q] = struct{}{}
	return q, nil
}

// Close stops the listener and the progress loop, breaks every queue
// pair and bootstrap connection, deregisters all memory and closes the
// libfabric objects. Idempotent.
func (d *device) Close() error {
	if !d.MarkClosed() {
		return nil
	}
	close(d.stop)
	d.Mu.Lock()
	qps := make([]*qp, 0, len(d.qps))
	for q := range d.qps {
		qps = append(qps, q)
	}
	d.Mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
	d.CloseListener() // stops accepting, aborts every connection, waits for their handlers
	d.Mu.Lock()
	if d.tcq != nil && d.tcqWait {
		C.tl_cq_signal(d.tcq)
	}
	d.Mu.Unlock()
	d.wg.Wait()
	d.Mu.Lock()
	mrs := make([]*mr, 0, len(d.mrs))
	for _, m := range d.mrs {
		mrs = append(mrs, m)
	}
	cqs := make([]*cq, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	d.Mu.Unlock()
	for _, m := range mrs {
		m.Deregister()
	}
	for _, c := range cqs {
		c.Close()
	}
	d.Mu.Lock()
	tcq := d.tcq
	d.tcq = nil
	d.Mu.Unlock()
	d.fiMu.Lock()
	defer d.fiMu.Unlock()
	if d.target != nil {
		C.tl_ep_close(d.target)
	}
	if tcq != nil {
		C.tl_cq_close(tcq)
	}
	C.tl_dom_close(d.dom)
	return nil
}

type pd struct{ dev *device }

func (p *pd) Close() error { return nil }
