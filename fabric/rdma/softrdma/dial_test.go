package softrdma

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDialFrom(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name, laddr string
		ctx         context.Context
		wantIP      string // "" when the dial must fail
	}{
		{"kernel chooses", "", context.Background(), "127.0.0.1"},
		{"bound to an address", "127.0.0.1:0", context.Background(), "127.0.0.1"},
		{"bound to another loopback address", "127.0.0.2:0", context.Background(), "127.0.0.2"},
		{"bad local address", "not an address", context.Background(), ""},
		{"cancelled", "127.0.0.1:0", cancelled, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := DialFrom(c.ctx, "tcp", c.laddr, ln.Addr().String())
			if c.wantIP == "" {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			defer conn.Close()
			assert.Equal(t, c.wantIP, conn.LocalAddr().(*net.TCPAddr).IP.String())
		})
	}
}
