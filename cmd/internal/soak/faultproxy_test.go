package soak

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// echoServer answers every connection by echoing it, as the far end of a
// proxied link.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func TestFaultProxy(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) }) // registered first, so it runs after the other cleanups
	p, err := newFaultProxy(echoServer(t))
	require.NoError(t, err)
	defer p.Close()
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	roundTrip := func(c net.Conn, timeout time.Duration) error {
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 4)
		_, err := io.ReadFull(c, buf)
		return err
	}
	cases := []struct {
		name  string
		fault func()
		check func(t *testing.T, c net.Conn)
	}{
		{"clean", func() {}, func(t *testing.T, c net.Conn) { assert.NoError(t, roundTrip(c, 5*time.Second)) }},
		{"cut closes the connection", p.cut, func(t *testing.T, c net.Conn) {
			err := roundTrip(c, 5*time.Second)
			require.Error(t, err)
			var ne net.Error
			assert.False(t, errors.As(err, &ne) && ne.Timeout(), "a cut is seen as a close, not a timeout: %v", err)
		}},
		{"blackhole holds without closing", func() { p.blackhole(time.Hour) }, func(t *testing.T, c net.Conn) {
			err := roundTrip(c, 300*time.Millisecond)
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "%v", err)
			p.heal()
			buf := make([]byte, 4) // the held bytes arrive after healing
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = io.ReadFull(c, buf)
			assert.NoError(t, err)
		}},
		{"delay slows each chunk", func() { p.delay(50*time.Millisecond, time.Hour) }, func(t *testing.T, c net.Conn) {
			start := time.Now()
			assert.NoError(t, roundTrip(c, 5*time.Second))
			assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "two proxied chunks, each held back")
			p.heal()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial()
			require.NoError(t, roundTrip(c, 5*time.Second)) // connected through
			tc.fault()
			tc.check(t, c)
		})
	}
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "idempotent")
}
