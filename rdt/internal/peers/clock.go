package peers

import (
	"context"
	"errors"
	"time"

	"github.com/jonboulle/clockwork"
)

// errClockTimeout is the cause of a context that clockTimeout ended.
var errClockTimeout = errors.New("rdt: lifecycle timeout on the runtime's clock")

// clockTimeout is context.WithTimeout on clk: on the wall clock it is
// exactly that; on a fake clock the context ends when the clock is advanced
// past d. (clockwork.WithTimeout is not used: its context's Err blocks
// until the context is done, which breaks callers that poll Err.)
func clockTimeout(ctx context.Context, clk clockwork.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if _, fake := clk.(*clockwork.FakeClock); !fake {
		return context.WithTimeout(ctx, d)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	t := clk.AfterFunc(d, func() { cancel(errClockTimeout) })
	return cctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}
