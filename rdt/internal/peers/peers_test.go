package peers

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
)

// verdicts records the incarnations declared dead; it answers no ping.
type verdicts struct {
	mu   sync.Mutex
	dead []string
}

func (v *verdicts) Ping(context.Context, peer.ID) (uint64, error) {
	return 0, errors.New("no network here")
}
func (v *verdicts) Connected(peer.ID) bool { return false }
func (v *verdicts) ClearBackoff(peer.ID)   {}
func (v *verdicts) Died(id peer.ID, inc uint64, reason string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.dead = append(v.dead, reason)
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A verdict is final and given once per incarnation: a restart kills the
// old incarnation, a lost peer kills the live one and any waited on.
func TestVerdicts(t *testing.T) {
	v := &verdicts{}
	tab := New(Config{Prober: v, Clock: clockwork.NewFakeClock()})
	id := peer.ID("owner")
	first := tab.DeathOf(id, 1)
	tab.SawAlive(id, 1)
	assert.True(t, tab.SeenAlive(id, 1))
	assert.False(t, closed(first))
	tab.SawAlive(id, 2) // restarted
	assert.True(t, closed(first), "the old incarnation is dead once a new one answers")
	now, restarted := tab.Replaced(id, 1)
	assert.True(t, restarted)
	assert.Equal(t, uint64(2), now)
	assert.True(t, tab.IsDead(id, 1))
	second := tab.DeathOf(id, 2)
	tab.DeclareDead(id, "missed heartbeats")
	tab.DeclareDead(id, "missed heartbeats") // no second verdict
	assert.True(t, closed(second))
	tab.SawAlive(id, 2) // answering after a partition does not revive it
	assert.True(t, tab.IsDead(id, 2))
	assert.Equal(t, []string{"restarted", "missed heartbeats"}, v.dead)
	tab.Stop()
}

// pings counts a prober's pings; every one fails.
type pings struct {
	verdicts
	n chan struct{}
}

func (p *pings) Ping(context.Context, peer.ID) (uint64, error) {
	p.n <- struct{}{}
	return 0, errors.New("refused")
}

// A dropped connection ends a peer that answered before at once; one that
// never answered (its handshake refused us) only misses a heartbeat, so a
// read from it is not taken for the owner's death.
func TestKickDeclaresDeadOnlyAPeerSeenAlive(t *testing.T) {
	for _, seen := range []bool{false, true} {
		p := &pings{n: make(chan struct{}, 8)}
		tab := New(Config{Prober: p, Clock: clockwork.NewFakeClock(), Interval: time.Second, Misses: 5,
			Log: slog.New(slog.DiscardHandler), Heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hb"}, []string{"result"})})
		id := peer.ID("owner")
		death := tab.DeathOf(id, 7)
		if seen {
			tab.SawAlive(id, 7)
		}
		done := tab.Use(id)
		if !seen {
			<-p.n // an unknown peer is pinged as its monitor starts
		}
		tab.Kick(id)
		<-p.n
		// The monitor handles one event at a time: the next kick's ping
		// comes after the first kick's verdict (or its absence).
		tab.Kick(id)
		select {
		case <-p.n:
		case <-death:
		}
		assert.Equal(t, seen, closed(death), "seen alive before: %v", seen)
		done()
		tab.Stop()
	}
}
