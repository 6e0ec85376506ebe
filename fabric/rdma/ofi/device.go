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
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/acceptor"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// device is an opened NIC: a libfabric fabric and domain, and when it
// listens a target endpoint with its progress loop and the bootstrap
// listener.
type device struct {
	p   *Provider
	nic NIC
	cfg rdma.OpenConfig
	log *slog.Logger
	dom *C.tl_dom

	mrMode  uint64
	keySize int
	noWait  bool

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
	ln       net.Listener
	loop     *acceptor.Loop // accepts and tracks bootstrap connections
	addrName []byte         // the target's fi_getname

	mu       sync.Mutex
	closed   bool
	mrs      map[uint32]*mr // by lkey
	nextLKey uint32
	qps      map[*qp]struct{}
	cqs      map[*cq]struct{}
	nextQP   uint64
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
	cfg.Limits = cfg.Limits.WithDefaults()
	d := &device{p: p, nic: nic, cfg: cfg, log: cfg.Logger.With("nic", nic.Name, "ofi", p.prov),
		mrMode: uint64(C.tl_mr_mode(info)), keySize: int(C.tl_mr_key_size(info)), noWait: p.cfg.NoWait,
		mrs: map[uint32]*mr{}, qps: map[*qp]struct{}{}, cqs: map[*cq]struct{}{},
		stop: make(chan struct{}), kick: make(chan struct{}, 1)}
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
	d.ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", d.nic.Addr)
	if err != nil {
		return fmt.Errorf("ofi: NIC %s: bootstrap listen on %s: %w", d.nic.Name, d.nic.Addr, err)
	}
	d.wg.Add(1)
	go d.progress()
	d.loop = acceptor.Start(d.ln, acceptor.Config{Name: "rdma/" + d.nic.Name, Limits: d.cfg.Limits,
		Metrics: d.cfg.ListenerMetrics, Logger: d.cfg.Logger}, d.serve)
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
			d.fiMu.Lock()
			slept = C.tl_trywait(d.dom, d.tcq) == 0
			d.fiMu.Unlock()
			if slept {
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
			d.log.Debug("ofi target completion error", "err", fiErr("target", C.tl_err_errno((*C.struct_fi_cq_err_entry)(errb))))
		case n < 0:
			d.log.Debug("ofi target progress", "err", fiErr("fi_cq_read", C.int(n)))
		}
		if d.wanted.Load() > 0 {
			runtime.Gosched()
		}
		_ = slept
		idle = backoff(idle, n == 0, d.kick) // as in cq.Wait: never spin while idle
	}
}

// lockFI takes fiMu, waking the device's queues asleep in fi_cq_sread
// first. The caller must not hold d.mu.
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
	d.mu.Lock()
	for q := range d.cqs {
		if q.wait {
			C.tl_cq_signal(q.c)
		}
	}
	if d.tcq != nil && d.tcqWait {
		C.tl_cq_signal(d.tcq)
	}
	d.mu.Unlock()
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
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.nextQP++
	id := d.nextQP
	d.mu.Unlock()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(d.p.cfg.HandshakeTimeout))
	res, err := peerauth.ServerFor(c, d.cfg.Security)
	if err != nil {
		d.log.Warn("rdma queue pair refused", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if err := d.loop.Admit(c, res.Peer.String()); err != nil {
		return
	}
	if err := peerauth.WriteField(c, d.addrName); err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	from := rdma.RemoteQP{ID: id, Peer: res.Peer}
	ctx, cancel := context.WithCancel(context.Background())
	var handlers sync.WaitGroup
	var wmu sync.Mutex
	sem := make(chan struct{}, maxHandlers)
	defer func() {
		c.Close()
		cancel()
		handlers.Wait()
		if d.cfg.Handler != nil {
			d.cfg.Handler.QPClosed(from)
		}
	}()
	// A queue pair that sends nothing for IdleTimeout is dropped (readers
	// ping while they have requests in flight, see qp.keepalive). The
	// deadline is re-armed at most every idle/8, idle+idle/8 ahead.
	idle := d.cfg.Limits.IdleTimeout
	var armed time.Time
	for {
		if now := time.Now(); now.Sub(armed) > idle/8 {
			c.SetReadDeadline(now.Add(idle + idle/8))
			armed = now
		}
		f, err := readFrame(c)
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			d.loop.Dropped("idle", res.Peer.String())
			return
		}
		if err != nil {
			d.log.Debug("rdma queue pair ended", "peer", res.Peer, "err", err)
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
			d.log.Warn("rdma queue pair dropped: unexpected frame", "peer", res.Peer, "kind", f.kind)
			return
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			defer func() { <-sem }()
			out, closing := d.answer(ctx, from, f)
			if closing {
				// The device is closing under the handler: the queue pair
				// ends (the reader sees its owner go away, a typed error),
				// rather than carry an internal error back.
				c.Close()
				return
			}
			if out.kind == kindReply && len(out.payload) > 0 && d.p.corrupt.CompareAndSwap(true, false) {
				out.payload = out.payload[:len(out.payload)-1]
			}
			wmu.Lock()
			c.SetWriteDeadline(time.Now().Add(d.p.cfg.HandshakeTimeout))
			_, err := c.Write(appendFrame(nil, out))
			wmu.Unlock()
			if err != nil {
				c.Close()
			}
		}()
	}
}

// answer runs the handler for one message; an error travels as a
// peerauth status code and message.
func (d *device) answer(ctx context.Context, from rdma.RemoteQP, f bootFrame) (bootFrame, bool) {
	h := d.cfg.Handler
	var resp []byte
	var err error
	if h == nil {
		err = fmt.Errorf("%w: ofi: this device takes no messages", fabric.ErrBadRequest)
	} else {
		resp, err = h.HandleMessage(ctx, from, f.payload)
	}
	if err == nil && len(resp) > MaxMessage {
		err = fmt.Errorf("ofi: answer of %d bytes (max %d)", len(resp), MaxMessage)
	}
	if err != nil {
		d.mu.Lock()
		closed := d.closed
		d.mu.Unlock()
		if closed || errors.Is(err, fabric.ErrClosed) {
			return bootFrame{}, true
		}
		text := err.Error()
		if len(text) > peerauth.MaxMessage {
			text = text[:peerauth.MaxMessage]
		}
		return bootFrame{kind: kindError, id: f.id, payload: append([]byte{peerauth.StatusFor(err)}, text...)}, false
	}
	return bootFrame{kind: kindReply, id: f.id, payload: resp}, false
}

func (d *device) Device() rdma.Device { return rdma.Device{Name: d.nic.Name, Addr: d.Addr()} }

func (d *device) Addr() string {
	if d.ln == nil {
		return ""
	}
	return d.ln.Addr().String()
}

func (d *device) AllocPD() (rdma.ProtectionDomain, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fabric.ErrClosed
	}
	return &pd{dev: d}, nil
}

func (d *device) CreateCQ() (rdma.CompletionQueue, error) {
	d.lockFI()
	defer d.fiMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
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
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.stop)
	qps := make([]*qp, 0, len(d.qps))
	for q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
	if d.loop != nil {
		d.loop.Close() // stops accepting, aborts every connection, waits for their handlers
	} else if d.ln != nil {
		d.ln.Close()
	}
	d.mu.Lock()
	if d.tcq != nil && d.tcqWait {
		C.tl_cq_signal(d.tcq)
	}
	d.mu.Unlock()
	d.wg.Wait()
	d.mu.Lock()
	mrs := make([]*mr, 0, len(d.mrs))
	for _, m := range d.mrs {
		mrs = append(mrs, m)
	}
	cqs := make([]*cq, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	d.mu.Unlock()
	for _, m := range mrs {
		m.Deregister()
	}
	for _, c := range cqs {
		c.Close()
	}
	d.mu.Lock()
	tcq := d.tcq
	d.tcq = nil
	d.mu.Unlock()
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
