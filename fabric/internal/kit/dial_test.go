package kit

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
)

// TestConnect: every way a dial and handshake can end comes back as the
// typed error the planner acts on, and a failed connection is closed.
func TestConnect(t *testing.T) {
	refused := errors.New("connection refused")
	for _, c := range []struct {
		name    string
		dialErr error
		shake   func(net.Conn) error
		cancel  bool // the caller gives up during the handshake
		want    error
	}{
		{"ok", nil, func(net.Conn) error { return nil }, false, nil},
		{"dial refused", refused, nil, false, fabric.ErrPeerClosed},
		{"unauthorized as is", nil, func(net.Conn) error { return fabric.ErrUnauthorized }, false, fabric.ErrUnauthorized},
		{"bad request as is", nil, func(net.Conn) error { return fabric.ErrBadRequest }, false, fabric.ErrBadRequest},
		{"dropped", nil, func(net.Conn) error { return io.ErrUnexpectedEOF }, false, fabric.ErrPeerClosed},
		{"silent owner: the deadline", nil, func(c net.Conn) error { _, err := c.Read(make([]byte, 1)); return err }, false, fabric.ErrStalled},
		{"caller gives up", nil, func(c net.Conn) error { _, err := c.Read(make([]byte, 1)); return err }, true, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			ours, theirs := net.Pipe()
			defer theirs.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			shake := c.shake
			if c.cancel {
				shake = func(conn net.Conn) error {
					cancel()
					return c.shake(conn)
				}
			}
			timeout := time.Hour
			if c.want == fabric.ErrStalled {
				timeout = 50 * time.Millisecond
			}
			conn, err := Connect(ctx, timeout, "test", "pipe",
				func(context.Context) (net.Conn, error) { return ours, c.dialErr }, shake)
			if c.want == nil {
				require.NoError(t, err)
				assert.Same(t, ours, conn)
				return
			}
			assert.ErrorIs(t, err, c.want)
			assert.Nil(t, conn)
			if c.dialErr == nil {
				_, werr := ours.Write([]byte{1})
				assert.ErrorIs(t, werr, io.ErrClosedPipe, "the failed connection is closed")
			}
		})
	}
}

func TestSourceAddr(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1:4000": "10.0.0.1:0",
		"[fe80::1]:1":   "[fe80::1]:0",
		"0.0.0.0:4000":  "",
		"[::]:4000":     "",
		":4000":         "",
		"nic0.local:1":  "nic0.local:0",
		"garbage":       "",
	} {
		assert.Equal(t, want, SourceAddr(in), in)
	}
}

// TestDialFrom: the connection leaves from the address asked for.
func TestDialFrom(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := DialFrom(context.Background(), "tcp", "127.0.0.2:0", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, "127.0.0.2", c.LocalAddr().(*net.TCPAddr).IP.String())
	_, err = DialFrom(context.Background(), "tcp", "not an address", ln.Addr().String())
	assert.Error(t, err)
}
