package rdt

import (
	"context"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSendTruthfulWhenReceiverShutsDown: a receiver that shuts down right
// after Receive used to leave its sender with "no reply: stream reset" for
// a message it had delivered (issue 19.4). Send's answer must agree with
// what the receiver got: nil exactly when the message was queued.
func TestSendTruthfulWhenReceiverShutsDown(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	sender, _ := p.a.Spawn("sender")
	const rounds = 12
	delivered := 0
	for i := range rounds {
		rt, err := New(ctx, Config{Cluster: p.cluster, Host: "h1", IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 1 << 20})
		require.NoError(t, err)
		rcv, _ := rt.Spawn("receiver")
		got := make(chan bool, 1)
		go func() {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := rcv.Receive(rctx)
			rt.Shutdown(ctx) // at once, the answer perhaps not yet written
			got <- err == nil
		}()
		err = sender.Send(ctx, rcv.Addr(), Message{Payload: []byte{byte(i)}})
		received := <-got
		if received {
			delivered++
			assert.NoError(t, err, "round %d: the receiver got the message, Send must say so", i)
		} else {
			assert.Error(t, err, "round %d", i)
		}
	}
	assert.Equal(t, rounds, delivered, "every message reached a live receiver")
	// After Shutdown, Send fails and says why.
	rt, err := New(ctx, Config{Cluster: p.cluster, Host: "h1", IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 1 << 20})
	require.NoError(t, err)
	rcv, _ := rt.Spawn("receiver")
	require.NoError(t, rt.Shutdown(ctx))
	err = sender.Send(ctx, rcv.Addr(), Message{Payload: []byte("late")})
	assert.Error(t, err)
	assert.NotErrorIs(t, err, ErrDeliveryUnknown, "nothing was written: not delivered, for sure")
}

// A receiver that takes the whole message and vanishes before answering
// leaves the outcome unknown, and Send says exactly that.
func TestSendDeliveryUnknown(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	sender, _ := p.a.Spawn("sender")
	rcv, _ := p.b.Spawn("receiver")
	p.b.host.SetStreamHandler(controlProtocol, func(s network.Stream) {
		var n [4]byte
		io.ReadFull(s, n[:])
		io.CopyN(io.Discard, s, int64(binary.BigEndian.Uint32(n[:])))
		s.Reset()
	})
	err := sender.Send(ctx, rcv.Addr(), Message{Payload: []byte("x")})
	assert.ErrorIs(t, err, ErrDeliveryUnknown)
}
