package rdt

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// PeerEventKind says what happened to a watched peer.
type PeerEventKind int

const (
	// PeerAlive: an incarnation of the peer answered for the first time
	// (after a restart, a new incarnation).
	PeerAlive PeerEventKind = iota + 1
	// PeerDied: the incarnation stopped answering.
	PeerDied
)

func (k PeerEventKind) String() string {
	switch k {
	case PeerAlive:
		return "alive"
	case PeerDied:
		return "died"
	}
	return "unknown"
}

// PeerEvent reports a change in a watched peer's liveness.
type PeerEvent struct {
	Peer        peer.ID
	Kind        PeerEventKind
	Incarnation uint64 // the incarnation that came alive or died; 0 if it never answered
	Reason      string // for PeerDied: "connection lost", "missed 3 heartbeats", "restarted"
	At          time.Time
}

// lifeMetrics count the lifecycle machinery.
type lifeMetrics struct {
	heartbeats    *prometheus.CounterVec // tensorlane_heartbeats_total{result}
	peerDeaths    *prometheus.CounterVec // tensorlane_peer_deaths_total{reason}
	leaseRequests *prometheus.CounterVec // tensorlane_lease_requests_total{op}
	leaseMessages *prometheus.CounterVec // tensorlane_lease_messages_total{op}
	leasesExpired prometheus.Counter     // tensorlane_leases_expired_total
	leasesHeld    prometheus.GaugeFunc   // tensorlane_leases_held (this runtime's, as a reader)
	leasesGranted prometheus.GaugeFunc   // tensorlane_leases_granted (on this runtime's objects)
	objectsFreed  *prometheus.CounterVec // tensorlane_objects_freed_total{why}
	ownerDied     prometheus.Counter     // tensorlane_owner_died_errors_total
}

func newLifeMetrics(reg prometheus.Registerer, r *Runtime) *lifeMetrics {
	m := &lifeMetrics{
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_heartbeats_total", Help: "Heartbeats sent to watched peers, by result (ok, missed).",
		}, []string{"result"}),
		peerDeaths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_peer_deaths_total", Help: "Peer incarnations declared dead, by reason.",
		}, []string{"reason"}),
		leaseRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_lease_requests_total", Help: "Lease claims served by this runtime as owner, by op (lease, release).",
		}, []string{"op"}),
		leaseMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_lease_messages_total", Help: "Lease messages (each carrying many claims) served by this runtime as owner, by op (lease, release).",
		}, []string{"op"}),
		leasesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_leases_expired_total", Help: "Reader leases on this runtime's objects that expired without renewal.",
		}),
		leasesHeld: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tensorlane_leases_held", Help: "Refs this runtime holds leases on, as a reader.",
		}, func() float64 { return float64(r.holdCount()) }),
		leasesGranted: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tensorlane_leases_granted", Help: "Reader leases on this runtime's objects.",
		}, func() float64 { return float64(r.objects.Leases()) }),
		objectsFreed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_objects_freed_total", Help: "Objects removed from the object table, by cause.",
		}, []string{"why"}),
		ownerDied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_owner_died_errors_total", Help: "Gets that failed with ErrOwnerDied.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.heartbeats, m.peerDeaths, m.leaseRequests, m.leaseMessages, m.leasesExpired, m.leasesHeld, m.leasesGranted, m.objectsFreed, m.ownerDied)
	}
	return m
}

// peerTable tracks the liveness of peers this runtime depends on. A peer is
// monitored (pinged every HeartbeatInterval) while something needs it: a
// WatchPeer caller or a Get in flight.
type peerTable struct {
	r  *Runtime
	mu sync.Mutex
	m  map[peer.ID]*peerState
	wg sync.WaitGroup
	// stopped is set by Shutdown: no new monitors.
	stopped bool
}

type peerState struct {
	id    peer.ID
	alive bool
	down  bool   // a death verdict stands and no incarnation answered since
	inc   uint64 // incarnation last seen alive
	users int    // Gets in flight and watchers
	watch map[*watcher]struct{}
	// deaths are channels closed when the given incarnation is declared
	// dead; dead remembers the verdicts, which are final.
	deaths map[uint64]chan struct{}
	dead   map[uint64]bool
	seen   map[uint64]bool // incarnations that answered at least once
	kick   chan struct{}
	cancel context.CancelFunc
}

// watcher is one WatchPeer channel; its mutex orders sends against close.
type watcher struct {
	mu     sync.Mutex
	ch     chan PeerEvent
	closed bool
}

func (w *watcher) send(evs []PeerEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range evs {
		if w.closed {
			return
		}
		// Never block the monitor: a watcher that does not keep up loses
		// events, the runtime never loses its liveness checks.
		select {
		case w.ch <- ev:
		default:
		}
	}
}

func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
}

func newPeerTable(r *Runtime) *peerTable { return &peerTable{r: r, m: map[peer.ID]*peerState{}} }

func (t *peerTable) state(id peer.ID) *peerState {
	st, ok := t.m[id]
	if !ok {
		st = &peerState{id: id, watch: map[*watcher]struct{}{}, deaths: map[uint64]chan struct{}{}, dead: map[uint64]bool{}, seen: map[uint64]bool{}, kick: make(chan struct{}, 1)}
		t.m[id] = st
	}
	return st
}

// use registers a user of id and starts its monitor if needed; the returned
// func unregisters.
func (t *peerTable) use(id peer.ID) func() {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.state(id)
	st.users++
	if st.cancel == nil && !t.stopped {
		ctx, cancel := context.WithCancel(context.Background())
		st.cancel = cancel
		t.wg.Add(1)
		go t.monitor(ctx, st)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			st.users--
			if st.users == 0 && st.cancel != nil {
				st.cancel()
				st.cancel = nil
			}
		})
	}
}

// deathOf returns a channel closed when incarnation inc of id is declared
// dead (already closed if it was, or if another incarnation answers now).
func (t *peerTable) deathOf(id peer.ID, inc uint64) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.state(id)
	if st.alive && st.inc != inc {
		st.dead[inc] = true
	}
	if st.dead[inc] {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	ch, ok := st.deaths[inc]
	if !ok {
		ch = make(chan struct{})
		st.deaths[inc] = ch
	}
	return ch
}

// seenAlive reports whether incarnation inc of id ever answered.
func (t *peerTable) seenAlive(id peer.ID, inc uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.m[id]
	return ok && st.seen[inc]
}

// replaced reports whether another incarnation than inc of id answers now
// (it restarted).
func (t *peerTable) replaced(id peer.ID, inc uint64) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.m[id]
	if ok && st.alive && st.inc != inc {
		return st.inc, true
	}
	return 0, false
}

// isDead reports whether incarnation inc of id was declared dead.
func (t *peerTable) isDead(id peer.ID, inc uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.m[id]
	return ok && st.dead[inc]
}

// watch adds an event channel for id; the returned func removes and closes
// it.
func (t *peerTable) watch(id peer.ID, ch chan PeerEvent) func() {
	w := &watcher{ch: ch}
	t.mu.Lock()
	st := t.state(id)
	st.watch[w] = struct{}{}
	var first []PeerEvent
	if st.alive {
		first = []PeerEvent{{Peer: id, Kind: PeerAlive, Incarnation: st.inc, At: t.r.cfg.Clock.Now()}}
	}
	t.mu.Unlock()
	w.send(first)
	done := t.use(id)
	return func() {
		t.mu.Lock()
		delete(st.watch, w)
		t.mu.Unlock()
		done()
		w.close()
	}
}

// kickPeer asks id's monitor to check it now (its connection went away).
func (t *peerTable) kickPeer(id peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st, ok := t.m[id]; ok {
		select {
		case st.kick <- struct{}{}:
		default:
		}
	}
}

// sawAlive records an answer from incarnation inc of id.
func (t *peerTable) sawAlive(id peer.ID, inc uint64) {
	t.mu.Lock()
	st := t.state(id)
	if (st.alive && st.inc == inc) || st.dead[inc] {
		// Nothing new, or a verdict already given: it is final for an
		// incarnation, so refs to it stay failed even if it answers again
		// after a partition.
		t.mu.Unlock()
		return
	}
	now := t.r.cfg.Clock.Now()
	var evs []PeerEvent
	var died []uint64
	if st.alive {
		evs = append(evs, PeerEvent{Peer: id, Kind: PeerDied, Incarnation: st.inc, Reason: "restarted", At: now})
		died = append(died, st.inc)
		st.dead[st.inc] = true
	}
	// Every other incarnation someone waits on is gone: only one runs.
	for i, ch := range st.deaths {
		if i != inc {
			st.dead[i] = true
			close(ch)
			delete(st.deaths, i)
		}
	}
	st.alive, st.down, st.inc = true, false, inc
	if len(st.seen) > 64 {
		clear(st.seen)
	}
	st.seen[inc] = true
	evs = append(evs, PeerEvent{Peer: id, Kind: PeerAlive, Incarnation: inc, At: now})
	ws := t.watchersLocked(st)
	t.mu.Unlock()
	for _, w := range ws {
		w.send(evs)
	}
	for _, i := range died {
		t.r.peerDied(id, i, "restarted")
	}
}

// declareDead records that id stopped answering: its live incarnation, and
// any incarnation a Get waits on, are dead.
func (t *peerTable) declareDead(id peer.ID, reason string) {
	t.mu.Lock()
	st := t.state(id)
	if st.down && len(st.deaths) == 0 {
		t.mu.Unlock()
		return
	}
	now := t.r.cfg.Clock.Now()
	var evs []PeerEvent
	var died []uint64
	if st.alive {
		died = append(died, st.inc)
		st.dead[st.inc] = true
	}
	for i, ch := range st.deaths {
		if !st.dead[i] || i == st.inc {
			if i != st.inc || !st.alive {
				died = append(died, i)
			}
			st.dead[i] = true
		}
		close(ch)
		delete(st.deaths, i)
	}
	for _, i := range died {
		evs = append(evs, PeerEvent{Peer: id, Kind: PeerDied, Incarnation: i, Reason: reason, At: now})
	}
	if len(evs) == 0 && !st.down {
		evs = append(evs, PeerEvent{Peer: id, Kind: PeerDied, Reason: reason, At: now}) // never answered
	}
	st.alive, st.down = false, true
	if len(st.dead) > 64 { // bound the memory of old verdicts
		for i := range st.dead {
			if len(st.dead) <= 32 {
				break
			}
			delete(st.dead, i)
		}
	}
	ws := t.watchersLocked(st)
	t.mu.Unlock()
	for _, w := range ws {
		w.send(evs)
	}
	for _, i := range died {
		t.r.peerDied(id, i, reason)
	}
}

func (t *peerTable) watchersLocked(st *peerState) []*watcher {
	out := make([]*watcher, 0, len(st.watch))
	for w := range st.watch {
		out = append(out, w)
	}
	return out
}

// monitor pings st's peer every HeartbeatInterval, and at once when its
// connection is lost, until nobody needs it.
func (t *peerTable) monitor(ctx context.Context, st *peerState) {
	defer t.wg.Done()
	r := t.r
	interval, misses := r.cfg.HeartbeatInterval, 0
	clk := r.cfg.Clock
	tick := clk.NewTicker(interval)
	defer tick.Stop()
	ping := func(kicked bool) {
		if kicked {
			// A re-dial right after a lost connection must not be refused by
			// the swarm's backoff from an earlier failure.
			if sw, ok := r.host.Network().(*swarm.Swarm); ok {
				sw.Backoff().Clear(st.id)
			}
		}
		// The ping's bound is on the clock too: a missed heartbeat is a
		// clock event, so a fake clock decides when one is missed.
		pctx, cancel := clockTimeout(ctx, clk, interval)
		reply, err := r.call(pctx, st.id, ctlwire.LifeMsg{Kind: ctlwire.LifePing})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			misses = 0
			r.lifeMetrics.heartbeats.WithLabelValues("ok").Inc()
			t.sawAlive(st.id, reply.Incarnation)
			return
		}
		misses++
		r.lifeMetrics.heartbeats.WithLabelValues("missed").Inc()
		r.log.Debug("heartbeat missed", "peer", shortID(st.id), "misses", misses, "err", err)
		switch {
		case kicked:
			t.declareDead(st.id, "connection lost")
		case misses >= r.cfg.HeartbeatMisses:
			t.declareDead(st.id, "missed heartbeats")
		}
	}
	t.mu.Lock()
	known := st.alive
	t.mu.Unlock()
	if !known {
		ping(false) // learn the incarnation now; a known peer waits a tick
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-st.kick:
			if r.host.Network().Connectedness(st.id) != network.Connected {
				ping(true)
			}
		case <-tick.Chan():
			ping(false)
		}
	}
}

// stop ends every monitor and closes every watcher.
func (t *peerTable) stop() {
	t.mu.Lock()
	t.stopped = true
	var ws []*watcher
	for _, st := range t.m {
		if st.cancel != nil {
			st.cancel()
			st.cancel = nil
		}
		for w := range st.watch {
			ws = append(ws, w)
			delete(st.watch, w)
		}
	}
	t.mu.Unlock()
	t.wg.Wait()
	for _, w := range ws {
		w.close()
	}
}
