package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
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
				c.Encrypt = encrypt
			})
			var dials atomic.Int64
			tr := pf.transport(t, Config{Compression: CompressOff, Encrypt: encrypt, Dial: counting(&dials)})
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
