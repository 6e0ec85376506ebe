package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestClaimResolutionBounded: a claim that takes too long to resolve is
// cancelled after HandshakeTimeout (its ctx says DeadlineExceeded and
// carries the deadline), the reader hears a refusal, and the connection
// serves the next request with a fresh context.
func TestClaimResolutionBounded(t *testing.T) {
	const timeout = 100 * time.Millisecond
	var block atomic.Bool
	block.Store(true)
	type seen struct {
		err           error
		deadline      time.Time
		hasDL         bool
		began, errdAt time.Time
	}
	saw := make(chan seen, 1)
	f := newFixture(t, 4096, func(c *ServerConfig) {
		c.HandshakeTimeout = timeout
		open := c.Source
		c.Source = fabric.SourceFunc(func(ctx context.Context, cl fabric.Claim) (tensor.Buffer, error) {
			if !block.Load() {
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("fresh request got a done context: %w", err)
				}
				return open.Open(ctx, cl)
			}
			s := seen{began: time.Now()}
			s.deadline, s.hasDL = ctx.Deadline()
			<-ctx.Done()
			s.err, s.errdAt = ctx.Err(), time.Now()
			saw <- s
			return nil, ctx.Err()
		})
	})
	var dials atomic.Int64
	tr := f.transport(t, Config{Dial: counting(&dials)})
	_, err := tr.Read(context.Background(), f.remote(10), f.dst(t, 10))
	require.Error(t, err)
	assert.False(t, errors.Is(err, fabric.ErrStalled) || errors.Is(err, fabric.ErrPeerClosed), "a refusal, not a broken connection: %v", err)
	s := <-saw
	assert.ErrorIs(t, s.err, context.DeadlineExceeded)
	require.True(t, s.hasDL)
	assert.GreaterOrEqual(t, s.deadline.Sub(s.began), timeout-time.Millisecond)
	assert.False(t, s.errdAt.Before(s.deadline), "cancelled no earlier than its deadline")

	block.Store(false)
	for range 3 {
		_, err = tr.Read(context.Background(), f.remote(4096), f.dst(t, 4096))
		require.NoError(t, err)
	}
	assert.Equal(t, int64(1), dials.Load(), "the connection stayed in step")
}

// TestIdleConnectionOutlivesDeadlines: the owner keeps a request's read
// deadline armed after it; a connection that then sits idle past it is
// not dropped, and serves the next request (plain and encrypted).
func TestIdleConnectionOutlivesDeadlines(t *testing.T) {
	for _, encrypt := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypt=%v", encrypt), func(t *testing.T) {
			const stall = 40 * time.Millisecond
			pf := newPushFixtureWith(t, 64<<10, func(c *ServerConfig) {
				c.StallTimeout = stall
				c.EncryptData = encrypt
			})
			var dials atomic.Int64
			tr := pf.transport(t, Config{Compression: CompressOff, Security: fabric.Security{EncryptData: encrypt}, Dial: counting(&dials)})
			src, _ := tensor.BytesOf(pf.src)
			for i := range 3 {
				clear(pf.sink)
				_, err := tr.Write(context.Background(), pf.src, pf.target(0, 64<<10))
				require.NoError(t, err, "push %d", i)
				require.True(t, bytes.Equal(src, pf.sink))
				_, err = tr.Read(context.Background(), pf.remote(1000), pf.dst(t, 1000))
				require.NoError(t, err, "read %d", i)
				time.Sleep(4 * stall) // idle past the armed deadlines
			}
			assert.Equal(t, int64(1), dials.Load(), "one connection throughout")
		})
	}
}

// TestOwnerDropsStalledPeer: with deadlines no longer re-armed per
// request, the owner still hangs up on a peer that stops mid-request
// within its StallTimeout: one that sends half a request, a pusher that
// stops sending blocks (after the go-ahead, or mid-block of a small push),
// and a reader that stops reading.
func TestOwnerDropsStalledPeer(t *testing.T) {
	const stall = 100 * time.Millisecond
	const big = 16 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := make(chan struct{}, 8)
	var pf *pushFixture
	pf = newPushFixtureWith(t, big, func(c *ServerConfig) {
		c.Listener = closeWatch{ln, closed}
		c.StallTimeout = stall
		c.Source = fabric.SourceFunc(func(ctx context.Context, cl fabric.Claim) (tensor.Buffer, error) {
			return nopRelease{pf.src}, nil // more than the socket buffers hold
		})
	})
	push := func(n int64, flags byte) []byte {
		return request{op: opWrite, claim: pf.target(0, n).Claim, length: n, flags: flags}.appendTo(nil)
	}
	read := request{op: opRead, claim: pf.remote(big).Claim, length: big}.appendTo(nil)
	var hdr [headerSize]byte
	tcodec.RawHeader(make([]byte, 4096)).Put(hdr[:])
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"half a request", read[:len(read)/2]},
		{"push stops after the go-ahead", push(1<<20, 0)},
		{"small push stops mid-block", append(append(push(4096, flagEager), hdr[:]...), make([]byte, 100)...)},
		{"reader stops reading", read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", pf.srv.Addr())
			require.NoError(t, err)
			defer nc.Close()
			nc.(*net.TCPConn).SetReadBuffer(4096) // a stopped reader's window closes early
			k, _ := testhelp.Key(t)
			_, err = peerauth.Client(nc, k, pf.ownerID)
			require.NoError(t, err)
			_, err = nc.Write(tc.send)
			require.NoError(t, err)
			select {
			case <-closed:
			case <-time.After(20 * time.Second): // far beyond the owner's deadline
				t.Fatal("the owner kept the stalled connection")
			}
		})
	}
}

// closeWatch reports each accepted connection's Close on closed.
type closeWatch struct {
	net.Listener
	closed chan struct{}
}

func (l closeWatch) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, closed: l.closed}, nil
}

type watchedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { c.closed <- struct{}{} })
	return c.Conn.Close()
}
