package softrdma

import (
	"crypto/rand"
	"encoding/binary"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// Issue 13, item 8: rkeys were bound to no peer, I/O addresses were
// sequential, and a queue pair could guess keys for ever.

func TestAddressesUnpredictable(t *testing.T) {
	p := newPair(t, 4096, 0)
	spd, _ := p.server.AllocPD()
	seen := map[uint64]bool{}
	var addrs []uint64
	for range 16 {
		m, err := spd.RegisterMemory(make([]byte, 4096), rdma.AccessRemoteRead)
		require.NoError(t, err)
		assert.Zero(t, m.Addr()%4096, "page aligned")
		assert.False(t, seen[m.Addr()])
		seen[m.Addr()] = true
		addrs = append(addrs, m.Addr())
	}
	steps := map[uint64]bool{}
	for i := 1; i < len(addrs); i++ {
		steps[addrs[i]-addrs[i-1]] = true
	}
	assert.Greater(t, len(steps), 1, "addresses follow no fixed stride: %x", addrs)
}

func TestKeysBoundToPeer(t *testing.T) {
	p := newPair(t, 4096, 0)
	spd, _ := p.server.AllocPD()
	binder := spd.(rdma.PeerBinder)
	_, other := newKey(t)
	theirs, err := binder.RegisterMemoryFor(make([]byte, 4096), rdma.AccessRemoteRead, other)
	require.NoError(t, err)
	mine, err := binder.RegisterMemoryFor(p.remoteBuf, rdma.AccessRemoteRead, p.clientID)
	require.NoError(t, err)

	wr := p.readWR(1, 0, 100)
	wr.RKey, wr.RemoteAddr = theirs.RKey(), theirs.Addr()
	require.NoError(t, p.qp.PostRead(wr))
	assert.Equal(t, rdma.StatusRemoteAccess, p.wait(t).Status, "keys of a region bound to another peer are refused")

	clear(p.localBuf)
	wr = p.readWR(2, 0, 100)
	wr.RKey, wr.RemoteAddr = mine.RKey(), mine.Addr()
	require.NoError(t, p.qp.PostRead(wr))
	assert.Equal(t, rdma.StatusSuccess, p.wait(t).Status, "the peer it is bound to reads it")
	assert.Equal(t, p.remoteBuf[:100], p.localBuf[:100])
}

func TestBadKeysDropQueuePair(t *testing.T) {
	m := fabric.NewListenerMetrics(nil)
	p := newPairWith(t, 4096, 0, func(c *rdma.OpenConfig) { c.ListenerMetrics = m })
	for i := range maxBadKeys {
		wr := p.readWR(uint64(i), 0, 10)
		var k [4]byte
		rand.Read(k[:])
		wr.RKey = binary.BigEndian.Uint32(k[:]) | 1
		if wr.RKey == p.remote.RKey() {
			wr.RKey ^= 2
		}
		if err := p.qp.PostRead(wr); err != nil {
			break // broken already
		}
		wc := p.wait(t)
		if i < maxBadKeys-1 {
			assert.Equal(t, rdma.StatusRemoteAccess, wc.Status, "guess %d", i)
		}
	}
	require.Eventually(t, func() bool { return p.qp.Err() != nil }, 10*time.Second, 5*time.Millisecond,
		"the queue pair is dropped after %d bad keys", maxBadKeys)
	assert.Equal(t, float64(maxBadKeys), testutil.ToFloat64(m.BadKeys.WithLabelValues("rdma/s0")))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Dropped.WithLabelValues("rdma/s0", "bad_keys")))
	select {
	case <-p.handler.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not told the queue pair closed")
	}
}

// A reader that raced a revocation used a key it was given: however many
// times, that is no guess, and its queue pair stays up.
func TestRevokedKeysAreNoGuess(t *testing.T) {
	m := fabric.NewListenerMetrics(nil)
	p := newPairWith(t, 4096, 0, func(c *rdma.OpenConfig) { c.ListenerMetrics = m })
	wr := p.readWR(1, 0, 100)
	require.NoError(t, p.remote.Deregister())
	for range 2 * maxBadKeys {
		require.NoError(t, p.qp.PostRead(wr))
		assert.Equal(t, rdma.StatusRemoteAccess, p.wait(t).Status)
	}
	assert.NoError(t, p.qp.Err())
	assert.Zero(t, testutil.ToFloat64(m.BadKeys.WithLabelValues("rdma/s0")))
}

func TestIdleQueuePairDropped(t *testing.T) {
	m := fabric.NewListenerMetrics(nil)
	p := newPairWith(t, 4096, 0, func(c *rdma.OpenConfig) {
		c.ListenerMetrics = m
		c.Limits.IdleTimeout = 200 * time.Millisecond
	})
	require.NoError(t, p.qp.PostRead(p.readWR(1, 0, 100)))
	require.Equal(t, rdma.StatusSuccess, p.wait(t).Status)
	select {
	case <-p.handler.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("an idle queue pair was never dropped")
	}
	require.Eventually(t, func() bool { return p.qp.Err() != nil }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Dropped.WithLabelValues("rdma/s0", "idle")))
}
