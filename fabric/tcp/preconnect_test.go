package tcp

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
)

// TestPreconnect: Preconnect opens the connections a read of that size
// stripes over, and the read then dials none; a second Preconnect reuses
// the idle ones.
func TestPreconnect(t *testing.T) {
	const size = 4 << 20
	f := newFixture(t, size, nil)
	var dials atomic.Int64
	tr := f.transport(t, Config{Compression: CompressOff, Streams: 4, StripeMin: 1 << 20, Dial: counting(&dials)})
	require.NoError(t, tr.Preconnect(context.Background(), f.remote(size)))
	assert.Equal(t, int64(4), dials.Load(), "one connection per stripe")
	st, err := tr.Read(context.Background(), f.remote(size), f.dst(t, size))
	require.NoError(t, err)
	assert.Equal(t, 4, st.Streams)
	require.NoError(t, tr.Preconnect(context.Background(), f.remote(size)))
	require.NoError(t, tr.Preconnect(context.Background(), f.remote(4096)))
	assert.Equal(t, int64(4), dials.Load(), "the read and later preconnects found them idle")
}

// TestPreconnectErrors: no tcp address, an owner that is gone, a bad peer
// id, a closed transport: each a typed error, none hangs.
func TestPreconnectErrors(t *testing.T) {
	f := newFixture(t, 4096, nil)
	tr := f.transport(t, Config{})
	r := f.remote(4096)

	none := r
	none.Addrs = nil
	assert.ErrorIs(t, tr.Preconnect(context.Background(), none), fabric.ErrNoPath)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := r
	gone.Addrs = map[string]string{fabric.TCP: ln.Addr().String()}
	ln.Close()
	assert.Error(t, tr.Preconnect(context.Background(), gone))

	bad := r
	bad.Peer = "not-a-peer-id"
	assert.ErrorIs(t, tr.Preconnect(context.Background(), bad), fabric.ErrBadRequest)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr2 := f.transport(t, Config{})
	assert.True(t, errors.Is(tr2.Preconnect(ctx, r), context.Canceled))

	require.NoError(t, tr.Close())
	assert.Error(t, tr.Preconnect(context.Background(), r))
}

// BenchmarkPreconnect: a first read on a new transport (dial and handshake
// inside the read) against one whose connections Preconnect opened before
// the timer started, and a warm one, interleaved; the destination is warm
// in all three. new/warm and preconnected/warm are time ratios (1 = as
// fast as warm).
func BenchmarkPreconnect(b *testing.B) {
	for _, n := range []int64{1 << 20, 64 << 20} {
		b.Run(sizeName(n), func(b *testing.B) {
			f := newFixture(b, n, nil)
			ctx := context.Background()
			cfg := Config{Compression: CompressOff, StripeMin: 8 << 20}
			warm := f.transport(b, cfg)
			dst := f.dst(b, n)
			_, err := warm.Read(ctx, f.remote(n), dst)
			require.NoError(b, err)
			var d [3]time.Duration
			round := 0
			b.SetBytes(3 * n)
			for b.Loop() {
				fresh, pre := f.transport(b, cfg), f.transport(b, cfg)
				require.NoError(b, pre.Preconnect(ctx, f.remote(n)))
				trs := []*Transport{warm, fresh, pre}
				for k := range trs {
					i := (k + round) % len(trs) // rotate the order
					tr := trs[i]
					t0 := time.Now()
					if _, err := tr.Read(ctx, f.remote(n), dst); err != nil {
						b.Fatal(err)
					}
					d[i] += time.Since(t0)
				}
				fresh.Close()
				pre.Close()
				round++
			}
			b.ReportMetric(d[1].Seconds()/d[0].Seconds(), "new/warm")
			b.ReportMetric(d[2].Seconds()/d[0].Seconds(), "preconnected/warm")
		})
	}
}
