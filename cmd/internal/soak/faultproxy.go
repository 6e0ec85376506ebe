package soak

import (
	"net"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// faultLinks are the fault proxies in front of one runtime's data
// services: its tcp server and each of its rdma rails.
type faultLinks struct {
	mu    sync.Mutex
	tcp   *faultProxy
	rails map[string]*faultProxy // by NIC
}

// target points the proxies at the runtime's current addresses, creating
// them on first use.
func (l *faultLinks) target(addrs map[string]string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := func(p **faultProxy, addr string) error {
		if *p == nil {
			np, err := newFaultProxy(addr)
			if err != nil {
				return err
			}
			*p = np
			return nil
		}
		(*p).setTarget(addr)
		return nil
	}
	if err := set(&l.tcp, addrs[fabric.TCP]); err != nil {
		return err
	}
	if a := addrs[fabric.RDMA]; a != "" {
		rails, err := rdma.ParseAddrs(a)
		if err != nil {
			return err
		}
		for _, r := range rails {
			p := l.rails[r.NIC]
			if err := set(&p, r.Addr); err != nil {
				return err
			}
			l.rails[r.NIC] = p
		}
	}
	return nil
}

// route rewrites a ref's data addresses to go through the proxies.
func (l *faultLinks) route(addrs map[string]string) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]string{fabric.TCP: l.tcp.Addr()}
	if rails, err := rdma.ParseAddrs(addrs[fabric.RDMA]); err == nil {
		for i, r := range rails {
			if p := l.rails[r.NIC]; p != nil {
				rails[i].Addr = p.Addr()
			}
		}
		out[fabric.RDMA] = rdma.FormatAddrs(rails)
	}
	return out
}

func (l *faultLinks) each(f func(*faultProxy)) {
	l.mu.Lock()
	ps := []*faultProxy{l.tcp}
	for _, p := range l.rails {
		ps = append(ps, p)
	}
	l.mu.Unlock()
	for _, p := range ps {
		if p != nil {
			f(p)
		}
	}
}

func (l *faultLinks) cut()                      { l.each((*faultProxy).cut) }
func (l *faultLinks) heal()                     { l.each((*faultProxy).heal) }
func (l *faultLinks) blackhole(d time.Duration) { l.each(func(p *faultProxy) { p.blackhole(d) }) }
func (l *faultLinks) delay(by, d time.Duration) { l.each(func(p *faultProxy) { p.delay(by, d) }) }
func (l *faultLinks) Close()                    { l.each(func(p *faultProxy) { p.Close() }) }

// faultProxy forwards TCP connections to a runtime's data address and
// injects link faults on command: cut (close every connection now),
// blackhole (stop forwarding without closing, for a while) and delay
// (hold each forwarded chunk back). Readers reach it through a rewritten
// ref; peerauth runs end to end through it, so it cannot read or forge.
type faultProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu        sync.Mutex
	target    string
	conns     map[net.Conn]struct{}
	closed    bool
	holdUntil time.Time // blackhole
	delayBy   time.Duration
	delayTill time.Time
	healed    chan struct{} // closed and replaced when a blackhole ends early
}

func newFaultProxy(target string) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, healed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

func (p *faultProxy) setTarget(t string) {
	p.mu.Lock()
	p.target = t
	p.mu.Unlock()
}

func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *faultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.mu.Lock()
			target := p.target
			p.mu.Unlock()
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return
			}
			if !p.track(up) {
				return
			}
			defer p.untrack(up)
			var pw sync.WaitGroup
			pw.Add(2)
			go func() { defer pw.Done(); p.pump(up, c) }()
			go func() { defer pw.Done(); p.pump(c, up) }()
			pw.Wait()
		}()
	}
}

// pump copies src to dst, applying the current faults to every chunk; it
// closes both when either side ends.
func (p *faultProxy) pump(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold(src) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold applies a blackhole or delay before a chunk goes on; false means the
// connection was cut or the proxy closed meanwhile.
func (p *faultProxy) hold(c net.Conn) bool {
	for {
		p.mu.Lock()
		_, live := p.conns[c]
		if p.closed || !live {
			p.mu.Unlock()
			return false
		}
		now := time.Now()
		wait, blackholed := p.holdUntil.Sub(now), true
		if wait <= 0 {
			wait, blackholed = 0, false
			if now.Before(p.delayTill) {
				wait = p.delayBy
			}
		}
		healed := p.healed
		p.mu.Unlock()
		if wait <= 0 {
			return true
		}
		// Wait in slices so that a cut during a blackhole is noticed.
		t := time.NewTimer(min(wait, 100*time.Millisecond))
		select {
		case <-t.C:
		case <-healed:
			t.Stop()
		}
		if !blackholed {
			return true
		}
	}
}

func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c) // pumps waiting in a blackhole see the cut
	}
}

func (p *faultProxy) blackhole(d time.Duration) {
	p.mu.Lock()
	p.holdUntil = time.Now().Add(d)
	p.mu.Unlock()
}

func (p *faultProxy) delay(by, d time.Duration) {
	p.mu.Lock()
	p.delayBy, p.delayTill = by, time.Now().Add(d)
	p.mu.Unlock()
}

// heal ends every fault at once.
func (p *faultProxy) heal() {
	p.mu.Lock()
	p.holdUntil, p.delayTill = time.Time{}, time.Time{}
	close(p.healed)
	p.healed = make(chan struct{})
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines. It is idempotent.
func (p *faultProxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
