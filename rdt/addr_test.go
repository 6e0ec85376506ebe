package rdt

import (
	"context"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testPeer = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"

func TestActorAddrText(t *testing.T) {
	id, err := peer.Decode(testPeer)
	require.NoError(t, err)
	a1 := ma.StringCast("/ip4/127.0.0.1/tcp/4001")
	a2 := ma.StringCast("/ip6/::1/tcp/4002")
	for _, tc := range []struct {
		addr ActorAddr
		text string
	}{
		{ActorAddr{Peer: id, Name: "trainer", Addrs: []ma.Multiaddr{a1}}, "trainer@/ip4/127.0.0.1/tcp/4001/p2p/" + testPeer},
		{ActorAddr{Peer: id, Name: "r@1 x", Addrs: []ma.Multiaddr{a1, a2}}, "r%401+x@/ip4/127.0.0.1/tcp/4001/p2p/" + testPeer + ",/ip6/::1/tcp/4002/p2p/" + testPeer},
		{ActorAddr{Peer: id, Name: "n"}, "n@/p2p/" + testPeer},
	} {
		b, err := tc.addr.MarshalText()
		require.NoError(t, err)
		assert.Equal(t, tc.text, string(b))
		got, err := ParseActorAddr(string(b))
		require.NoError(t, err)
		assert.Equal(t, tc.addr.Peer, got.Peer)
		assert.Equal(t, tc.addr.Name, got.Name)
		assert.Equal(t, len(tc.addr.Addrs), len(got.Addrs))
		var u ActorAddr
		bin, _ := tc.addr.MarshalBinary()
		require.NoError(t, u.UnmarshalBinary(bin))
		assert.Equal(t, got, u)
	}
	for _, bad := range []string{"", "noat", "@/p2p/" + testPeer, "x@", "x@/ip4/127.0.0.1/tcp/1", "x@/p2p/notapeer",
		"x@/ip4/1.2.3.4/tcp/1/p2p/" + testPeer + ",/p2p/12D3KooWKnDdG3iXw9eTFijk3EWSunZcFi54Zka4wmtqtt6rPxc8", "%zz@/p2p/" + testPeer} {
		_, err := ParseActorAddr(bad)
		assert.ErrorIs(t, err, ErrMalformedAddr, "%q", bad)
	}
	_, err = ActorAddr{}.MarshalText()
	assert.ErrorIs(t, err, ErrMalformedAddr)
}

func FuzzParseActorAddr(f *testing.F) {
	f.Add("trainer@/ip4/127.0.0.1/tcp/4001/p2p/" + testPeer)
	f.Add("n@/p2p/" + testPeer)
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseActorAddr(s)
		if err != nil {
			return
		}
		b, err := a.MarshalText()
		require.NoError(t, err)
		b2, err := ParseActorAddr(string(b))
		require.NoError(t, err)
		assert.Equal(t, a.Name, b2.Name)
		assert.Equal(t, a.Peer, b2.Peer)
	})
}

// A parsed address is all Send needs to reach another runtime.
func TestSendToParsedAddr(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	sender, _ := p.a.Spawn("sender")
	rcv, _ := p.b.Spawn("receiver")
	text, err := rcv.Addr().MarshalText()
	require.NoError(t, err)
	to, err := ParseActorAddr(string(text))
	require.NoError(t, err)
	require.NoError(t, sender.Send(ctx, to, Message{Payload: []byte("hi")}))
	m, err := rcv.Receive(ctx)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(m.Payload))
}
