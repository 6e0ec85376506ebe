package objstore

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// Expiring runs pass (an expiry pass: Expire and what the runtime makes
// of it) every period and, at once, after DropPeer marked leases of a dead
// reader expired, until ctx is done.
func (t *Table) Expiring(ctx context.Context, clk clockwork.Clock, period time.Duration, pass func()) {
	tick := clk.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		case <-t.reap:
		}
		pass()
	}
}
