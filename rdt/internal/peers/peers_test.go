package peers

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"
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
