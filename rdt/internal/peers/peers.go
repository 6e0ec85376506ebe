// Package peers is rdt's failure detector: it monitors the peers a
// runtime depends on (heartbeats on the lifecycle protocol while a Get, a
// broadcast or a watcher needs one), declares an incarnation dead once
// (missed heartbeats, a lost connection, a restart) and tells whoever
// waits on it. What it needs of the runtime is Prober; rdt's PeerEvent is
// its Event.
package peers

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Kind says what happened to a watched peer (rdt.PeerEventKind).
type Kind int

// The kinds, as rdt numbers them.
const (
	Alive Kind = iota + 1
	Died
)

// Event reports a change in a watched peer's liveness (rdt.PeerEvent).
type Event struct {
	Peer        peer.ID
	Kind        Kind
	Incarnation uint64
	Reason      string
	At          time.Time
}

// Prober is what the table asks of its runtime.
type Prober interface {
	// Ping sends id a heartbeat and returns the incarnation that answered.
	Ping(ctx context.Context, id peer.ID) (uint64, error)
	// Connected says whether a control connection to id is up.
	Connected(id peer.ID) bool
	// ClearBackoff lets the next dial to id go out at once.
	ClearBackoff(id peer.ID)
	// Died is called once per incarnation declared dead.
	Died(id peer.ID, inc uint64, reason string)
}

// Config is what a Table is built from.
type Config struct {
	Prober     Prober
	Clock      clockwork.Clock
	Interval   time.Duration // between heartbeats
	Misses     int           // heartbeats missed in a row before a peer is dead
	Log        *slog.Logger
	Heartbeats *prometheus.CounterVec // {result}: ok, missed
}

// Table tracks the liveness of peers a runtime depends on. A peer is
// monitored (pinged every Interval) while something needs it: a watcher or
// a Get in flight.
type Table struct {
	c  Config
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

// watcher is one watch; its mutex orders deliveries against its end.
type watcher struct {
	mu      sync.Mutex
	deliver func(Event) // must not block: a watcher that does not keep up loses events
	end     func()
	closed  bool
}

func (w *watcher) send(evs []Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range evs {
		if w.closed {
			return
		}
		w.deliver(ev)
	}
}

func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		w.end()
	}
}

// New returns a table with no peer monitored.
func New(c Config) *Table { return &Table{c: c, m: map[peer.ID]*peerState{}} }

func (t *Table) state(id peer.ID) *peerState {
	st, ok := t.m[id]
	if !ok {
		st = &peerState{id: id, watch: map[*watcher]struct{}{}, deaths: map[uint64]chan struct{}{}, dead: map[uint64]bool{}, seen: map[uint64]bool{}, kick: make(chan struct{}, 1)}
		t.m[id] = st
	}
	return st
}

// Use registers a user of id and starts its monitor if needed; the returned
// func unregisters.
func (t *Table) Use(id peer.ID) func() {
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

// DeathOf returns a channel closed when incarnation inc of id is declared
// dead (already closed if it was, or if another incarnation answers now).
func (t *Table) DeathOf(id peer.ID, inc uint64) <-chan struct{} {
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

// SeenAlive reports whether incarnation inc of id ever answered.
func (t *Table) SeenAlive(id peer.ID, inc uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.m[id]
	return ok && st.seen[inc]
}

// Replaced reports whether another incarnation than inc of id answers now
// (it restarted).
func (t *Table) Replaced(id peer.ID, inc uint64) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.m[id]
	if ok && st.alive && st.inc != inc {
		return st.inc, true
	}
	return 0, false
}

// IsDead reports whether incarnation inc of id was declared dead.
func (t *Table) IsDead(id peer.ID, inc uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ok := t.m[id]
	return ok && st.dead[inc]
}

// Watch delivers id's events (deliver must not block) until the returned
// func is called, which calls end.
func (t *Table) Watch(id peer.ID, deliver func(Event), end func()) func() {
	w := &watcher{deliver: deliver, end: end}
	t.mu.Lock()
	st := t.state(id)
	st.watch[w] = struct{}{}
	var first []Event
	if st.alive {
		first = []Event{{Peer: id, Kind: Alive, Incarnation: st.inc, At: t.c.Clock.Now()}}
	}
	t.mu.Unlock()
	w.send(first)
	done := t.Use(id)
	return func() {
		t.mu.Lock()
		delete(st.watch, w)
		t.mu.Unlock()
		done()
		w.close()
	}
}

// Kick asks id's monitor to check it now (its connection went away).
func (t *Table) Kick(id peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st, ok := t.m[id]; ok {
		select {
		case st.kick <- struct{}{}:
		default:
		}
	}
}

// SawAlive records an answer from incarnation inc of id.
func (t *Table) SawAlive(id peer.ID, inc uint64) {
	t.mu.Lock()
	st := t.state(id)
	if (st.alive && st.inc == inc) || st.dead[inc] {
		// Nothing new, or a verdict already given: it is final for an
		// incarnation, so refs to it stay failed even if it answers again
		// after a partition.
		t.mu.Unlock()
		return
	}
	now := t.c.Clock.Now()
	var evs []Event
	var died []uint64
	if st.alive {
		evs = append(evs, Event{Peer: id, Kind: Died, Incarnation: st.inc, Reason: "restarted", At: now})
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
	evs = append(evs, Event{Peer: id, Kind: Alive, Incarnation: inc, At: now})
	ws := t.watchersLocked(st)
	t.mu.Unlock()
	for _, w := range ws {
		w.send(evs)
	}
	for _, i := range died {
		t.c.Prober.Died(id, i, "restarted")
	}
}

// DeclareDead records that id stopped answering: its live incarnation, and
// any incarnation a Get waits on, are dead.
func (t *Table) DeclareDead(id peer.ID, reason string) {
	t.mu.Lock()
	st := t.state(id)
	if st.down && len(st.deaths) == 0 {
		t.mu.Unlock()
		return
	}
	now := t.c.Clock.Now()
	var evs []Event
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
		evs = append(evs, Event{Peer: id, Kind: Died, Incarnation: i, Reason: reason, At: now})
	}
	if len(evs) == 0 && !st.down {
		evs = append(evs, Event{Peer: id, Kind: Died, Reason: reason, At: now}) // never answered
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
		t.c.Prober.Died(id, i, reason)
	}
}

func (t *Table) watchersLocked(st *peerState) []*watcher {
	out := make([]*watcher, 0, len(st.watch))
	for w := range st.watch {
		out = append(out, w)
	}
	return out
}

// monitor pings st's peer every HeartbeatInterval, and at once when its
// connection is lost, until nobody needs it.
func (t *Table) monitor(ctx context.Context, st *peerState) {
	defer t.wg.Done()
	p := t.c.Prober
	interval, misses := t.c.Interval, 0
	clk := t.c.Clock
	tick := clk.NewTicker(interval)
	defer tick.Stop()
	ping := func(kicked bool) {
		if kicked {
			// A re-dial right after a lost connection must not be refused by
			// the swarm's backoff from an earlier failure.
			p.ClearBackoff(st.id)
		}
		// The ping's bound is on the clock too: a missed heartbeat is a
		// clock event, so a fake clock decides when one is missed.
		pctx, cancel := clockTimeout(ctx, clk, interval)
		inc, err := p.Ping(pctx, st.id)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			misses = 0
			t.c.Heartbeats.WithLabelValues("ok").Inc()
			t.SawAlive(st.id, inc)
			return
		}
		misses++
		t.c.Heartbeats.WithLabelValues("missed").Inc()
		t.c.Log.Debug("heartbeat missed", "peer", refwire.ShortID(st.id), "misses", misses, "err", err)
		t.mu.Lock()
		wasAlive := st.alive
		t.mu.Unlock()
		switch {
		case kicked && wasAlive:
			// A connection that worked went away and the peer no longer
			// answers. A peer that never answered has lost nothing: a
			// refused handshake (an allowlist, a wrong cluster key) drops
			// the connection too, and is a miss like any other, not a
			// death (its reads say unreachable; a frozen one is found by
			// the misses and the probe).
			t.DeclareDead(st.id, "connection lost")
		case misses >= t.c.Misses:
			t.DeclareDead(st.id, "missed heartbeats")
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
			if !p.Connected(st.id) {
				ping(true)
			}
		case <-tick.Chan():
			ping(false)
		}
	}
}

// Stop ends every monitor and closes every watcher.
func (t *Table) Stop() {
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
