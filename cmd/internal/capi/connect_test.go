package capi

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Connect opens the control channel ahead of a transfer from the address
// Stats reports; bad and unreachable addresses get their kinds.
func TestConnect(t *testing.T) {
	_, a, b := pair(t, `{"allow_transports":["tcp"]}`)
	ctx := context.Background()
	addr := a.Stats().Address
	require.Contains(t, addr, "/p2p/"+a.Stats().Peer)
	require.NoError(t, b.Connect(ctx, addr, 5*time.Second))
	require.NoError(t, b.Connect(ctx, addr, 0), "again: already connected")
	require.NoError(t, b.Connect(ctx, b.Stats().Address, 0), "itself: nothing to do")

	for _, bad := range []string{"", "not an address", "/ip4/127.0.0.1/tcp/1"} {
		err := b.Connect(ctx, bad, time.Second)
		require.Error(t, err, "%q", bad)
		assert.Equal(t, "invalid_argument", Kinds[Code(err)], "%q: %v", bad, err)
	}
	// A runtime that is gone: its address no longer answers.
	lib := New()
	h, err := lib.NewRuntime(ctx, []byte(`{"allow_transports":["tcp"]}`))
	require.NoError(t, err)
	c, err := lib.Runtime(h)
	require.NoError(t, err)
	gone := c.Stats().Address
	require.NoError(t, lib.Close(ctx, h))
	err = b.Connect(ctx, gone, 2*time.Second)
	require.Error(t, err)
	assert.Equal(t, "peer_unreachable", Kinds[Code(err)], "%v", err)
}
