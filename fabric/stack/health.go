package stack

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/linkstat"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// linkHealth joins link telemetry (fabric/linkstat) to the data paths: the
// stack's data connections are dialed through it, so each is tracked
// under a label that names its transport, peer address and (rdma) rail,
// and a health transition of a rail's connection marks the rail degraded
// in the rdma transport (no new slices) until the link recovers or the
// mark runs out. tcp streams are tracked and their state exposed
// (Stack.Links), not paused: that is fabric/tcp's to do.
type linkHealth struct {
	mon      *linkstat.Monitor
	owned    bool // created by the stack (Config.LinkTelemetry): closed with it
	log      *slog.Logger
	host     string
	pause    time.Duration // first mark of a degraded rail
	pauseMax time.Duration
	unsub    func()
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	closeErr error

	mu    sync.Mutex
	rdma  *rdma.Transport
	links map[uint64]*healthLink // this stack's tracked connections, by linkstat ID
}

type healthLink struct {
	transport string // fabric.RDMA or fabric.TCP
	nic, addr string // rdma: local NIC and the owner address dialed
	// local and remote are the connection's addresses. accepted marks an
	// owner-side rail connection: the side that sends a READ's data, so
	// the one whose RTT and retransmissions show a bad link; a reader's
	// rail is matched to it by the mirrored addresses (on a monitor the
	// two runtimes share).
	local, remote string
	accepted      bool
	// rdma rails marked degraded: until when, the next mark's length
	// (doubling while the rail stays degraded under traffic), and the RTT
	// at the mark (a rail whose RTT falls is recovering: not marked again).
	until time.Time
	next  time.Duration
	rtt   time.Duration
}

// startLinkHealth returns nil when link telemetry is off.
func (s *Stack) startLinkHealth() (*linkHealth, error) {
	c := s.cfg
	mon, owned := c.LinkMonitor, false
	if mon == nil {
		if !c.LinkTelemetry {
			return nil, nil
		}
		var err error
		mon, err = linkstat.New(linkstat.Config{Registerer: s.node.Registerer, Logger: s.log})
		if err != nil {
			return nil, err
		}
		owned = true
	}
	return newLinkHealth(mon, owned, s.log, s.node.Host, c.LinkHealthPause), nil
}

func newLinkHealth(mon *linkstat.Monitor, owned bool, log *slog.Logger, host string, pause time.Duration) *linkHealth {
	h := &linkHealth{mon: mon, owned: owned, log: log, host: host, pause: pause,
		links: map[uint64]*healthLink{}, stop: make(chan struct{})}
	if h.pause <= 0 {
		h.pause = 10 * time.Second
	}
	h.pauseMax = 8 * h.pause
	h.unsub = mon.Subscribe(h.onHealth)
	h.wg.Add(1)
	go h.loop()
	return h
}

// track files a dialed connection under labels, remembering it as ours.
func (h *linkHealth) track(c net.Conn, l linkstat.Labels, hl *healthLink) {
	link, err := h.mon.Track(c, l)
	if err != nil {
		h.log.Warn("link telemetry: connection not tracked", "link", l.Link, "err", err)
		return
	}
	h.mu.Lock()
	h.links[link.Stats().ID] = hl
	h.mu.Unlock()
}

// nicListen is a software RDMA NIC's Listen (listen nil: a
// net.ListenConfig): the owner's accepted rail connections are tracked too,
// since for READs they carry the data.
func (h *linkHealth) nicListen(nic string, listen func(ctx context.Context, network, addr string) (net.Listener, error)) func(ctx context.Context, network, addr string) (net.Listener, error) {
	if h == nil {
		return listen
	}
	if listen == nil {
		listen = (&net.ListenConfig{}).Listen
	}
	return func(ctx context.Context, network, addr string) (net.Listener, error) {
		ln, err := listen(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return trackedListener{ln, h, nic}, nil
	}
}

type trackedListener struct {
	net.Listener
	h   *linkHealth
	nic string
}

func (l trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	remote := c.RemoteAddr().String()
	l.h.track(c, linkstat.Labels{Link: l.h.host + "/" + l.nic + "<-" + remote, Transport: fabric.RDMA, Peer: remote},
		&healthLink{transport: fabric.RDMA, nic: l.nic, local: c.LocalAddr().String(), remote: remote, accepted: true})
	return c, nil
}

// tcpDial is fabric/tcp's Config.Dial: a net.Dialer (tcp bounds it with its
// DialTimeout) whose connections are tracked.
func (h *linkHealth) tcpDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if h == nil {
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		h.track(c, linkstat.Labels{Link: h.host + " tcp->" + addr, Transport: fabric.TCP, Peer: addr},
			&healthLink{transport: fabric.TCP, addr: addr, local: c.LocalAddr().String(), remote: c.RemoteAddr().String()})
		return c, nil
	}
}

// nicDial is a software RDMA NIC's Dial: dial (nil: softrdma.DialFrom, the
// NIC's default), and track the rail's connection.
func (h *linkHealth) nicDial(nic string, dial func(ctx context.Context, network, laddr, raddr string) (net.Conn, error)) func(ctx context.Context, network, laddr, raddr string) (net.Conn, error) {
	if h == nil {
		return dial
	}
	if dial == nil {
		dial = softrdma.DialFrom
	}
	return func(ctx context.Context, network, laddr, raddr string) (net.Conn, error) {
		c, err := dial(ctx, network, laddr, raddr)
		if err != nil {
			return nil, err
		}
		h.track(c, linkstat.Labels{Link: h.host + "/" + nic + "->" + raddr, Transport: fabric.RDMA, Peer: raddr},
			&healthLink{transport: fabric.RDMA, nic: nic, addr: raddr, local: c.LocalAddr().String(), remote: c.RemoteAddr().String()})
		return c, nil
	}
}

func (h *linkHealth) setRDMA(t *rdma.Transport) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.rdma = t
	h.mu.Unlock()
}

// railLocked returns the reader rail a link's figures speak for: the
// rail's own connection, or the owner's end of it (an accepted connection,
// ours or another runtime's on a shared monitor, whose addresses mirror
// the rail's); nil if none. Called with h.mu held.
func (h *linkHealth) railLocked(st linkstat.LinkStats) *healthLink {
	if hl := h.links[st.ID]; hl != nil && hl.transport == fabric.RDMA && !hl.accepted {
		return hl
	}
	if st.Transport != fabric.RDMA {
		return nil
	}
	for _, hl := range h.links {
		if hl.transport == fabric.RDMA && !hl.accepted && hl.local == st.Remote && hl.remote == st.Local {
			return hl
		}
	}
	return nil
}

// onHealth acts on a transition of a link: marks the reader rail it speaks
// for degraded, or clears the mark; a tcp stream's is logged.
func (h *linkHealth) onHealth(st linkstat.LinkStats) {
	h.mu.Lock()
	tr := h.rdma
	if hl := h.links[st.ID]; hl != nil && hl.transport == fabric.TCP {
		h.mu.Unlock()
		if st.Degraded {
			h.log.Warn("tcp data connection degraded (measured and shown, not paused: fabric/tcp has no per-stream pause)",
				"link", st.Link, "reason", st.Reason, "rtt", st.RTT)
		} else {
			h.log.Info("tcp data connection recovered", "link", st.Link, "rtt", st.RTT)
		}
		return
	}
	hl := h.railLocked(st)
	if hl == nil || tr == nil {
		h.mu.Unlock()
		return // not a rail of this stack's reader
	}
	last := h.mon.Last()
	if !st.Degraded {
		// The rail recovers when none of its links (its own end, the
		// owner's) is still degraded.
		for _, o := range last {
			if o.ID != st.ID && o.Degraded && h.railLocked(o) == hl {
				h.mu.Unlock()
				return
			}
		}
		hl.until, hl.next = time.Time{}, 0
		h.mu.Unlock()
		tr.Recover(hl.nic, hl.addr)
		return
	}
	if !h.specificLocked(st, hl, last) {
		h.mu.Unlock()
		h.log.Debug("link degraded like its sibling rails (a loaded host, not a bad link): rail left in use", "link", st.Link, "reason", st.Reason)
		return
	}
	d := h.markLocked(hl, st)
	h.mu.Unlock()
	tr.Degrade(hl.nic, hl.addr, d, st.Link+": "+st.Reason)
}

// specificLocked says whether a degraded link's trouble is its rail's own
// rather than the host's. A loaded host (CPU contention, the race
// detector) inflates the RTT of every bulk connection alike, so linkstat
// alone would flag healthy rails; a rail is only worse than its siblings
// when one of them (a link of another rail, on the same end: owner or
// reader) is not degraded, or when its RTT is over 4x theirs (and 5 ms
// above). With no sibling there is nothing to steer slices to. Called with
// h.mu held.
func (h *linkHealth) specificLocked(st linkstat.LinkStats, rail *healthLink, last []linkstat.LinkStats) bool {
	ownEnd := h.links[st.ID] == rail
	var minRTT time.Duration
	siblings := 0
	for _, o := range last {
		r := h.railLocked(o)
		if r == nil || r == rail || (h.links[o.ID] == r) != ownEnd {
			continue
		}
		if !o.Degraded {
			return true
		}
		if siblings == 0 || o.RTT < minRTT {
			minRTT = o.RTT
		}
		siblings++
	}
	return siblings > 0 && st.RTT > 4*minRTT && st.RTT-minRTT > 5*time.Millisecond
}

// markLocked starts a mark of the rail and returns its length: the first
// is pause, each further one (the rail still degraded under traffic when
// the previous ran out) twice the last, up to pauseMax.
func (h *linkHealth) markLocked(hl *healthLink, st linkstat.LinkStats) time.Duration {
	d := hl.next
	if d <= 0 {
		d = h.pause
	}
	hl.next = min(2*d, h.pauseMax)
	hl.until, hl.rtt = time.Now().Add(d), st.RTT
	return d
}

// loop renews marks: a rail whose mark ran out is tried again (it gets
// slices), and while telemetry still has it degraded with traffic on it
// and its RTT not falling it is marked again, for longer. It also marks a
// rail that stays degraded after its siblings recovered. Without this a
// rail would stay in use, since linkstat reports transitions only.
func (h *linkHealth) loop() {
	defer h.wg.Done()
	t := time.NewTicker(max(h.mon.Interval(), 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		type mark struct {
			nic, addr, reason string
			d                 time.Duration
		}
		var marks []mark
		now := time.Now()
		h.mu.Lock()
		tr := h.rdma
		last := h.mon.Last()
		for _, st := range last {
			if !st.Degraded {
				continue
			}
			hl := h.railLocked(st)
			if hl == nil || now.Before(hl.until) || st.RecentSegments == 0 {
				continue // marked, or no traffic (no fresh figures) since
			}
			if !hl.until.IsZero() && st.RecentRetransmits == 0 && st.RTT < hl.rtt*9/10 {
				continue // recovering: leave it in use
			}
			// A rail that turned degraded together with its siblings and
			// stayed so after they recovered is marked here too.
			if !h.specificLocked(st, hl, last) {
				continue
			}
			marks = append(marks, mark{hl.nic, hl.addr, "still degraded: " + st.Link + ": " + st.Reason, h.markLocked(hl, st)})
		}
		// Forget connections the monitor no longer tracks (closed).
		if len(h.links) > 0 {
			live := map[uint64]bool{}
			for _, st := range h.mon.Last() {
				live[st.ID] = true
			}
			for id := range h.links {
				if !live[id] {
					delete(h.links, id)
				}
			}
		}
		h.mu.Unlock()
		if tr == nil {
			continue
		}
		for _, m := range marks {
			tr.Degrade(m.nic, m.addr, m.d, m.reason)
		}
	}
}

// snapshot returns this stack's links at the monitor's last refresh.
func (h *linkHealth) snapshot() []linkstat.LinkStats {
	if h == nil {
		return nil
	}
	var out []linkstat.LinkStats
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, st := range h.mon.Last() {
		if h.links[st.ID] != nil {
			out = append(out, st)
		}
	}
	return out
}

// close stops acting on health and closes a monitor the stack created.
// Idempotent.
func (h *linkHealth) close() error {
	if h == nil {
		return nil
	}
	h.once.Do(func() {
		h.unsub()
		close(h.stop)
		h.wg.Wait()
		if h.owned {
			h.closeErr = h.mon.Close()
		}
	})
	return h.closeErr
}
