package tcp

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
)

// Preconnect opens (and authenticates) ahead of time the connections a
// read of r would use, and leaves them idle in the pool, so that the read
// itself starts warm: a reader that learns of a ref before it Gets it
// (rdt's Actor.Warm) moves the dial and handshake out of the Get. Measured
// on loopback (docs/benchmarks.md, "the wire"), a first 64 MiB read on new
// connections takes about 1.3x a warm one, and a first 1 MiB read 2-3x.
//
// It opens as many connections as the read would stripe over (at most
// Streams), counting idle ones it finds; it never holds more than
// MaxConns. Connections it opened are kept as long as any idle ones
// (IdleTimeout). Errors are the ones a read would get dialing.
func (t *Transport) Preconnect(ctx context.Context, r fabric.Remote) error {
	addr := r.Addrs[fabric.TCP]
	if addr == "" {
		return fmt.Errorf("%w: owner %s serves no tcp address", fabric.ErrNoPath, r.Peer)
	}
	key := connKey{r.Peer, addr}
	want := int(min(int64(t.cfg.Streams), max(1, r.Length/t.cfg.StripeMin)))
	got := make([]*conn, 0, want)
	defer func() {
		for _, c := range got {
			t.pool.Put(c)
		}
	}()
	for range want {
		c, _, err := t.pool.Get(ctx, key)
		if err != nil {
			return err
		}
		got = append(got, c)
	}
	return nil
}
