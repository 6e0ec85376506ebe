package demo

import (
	"context"
	"log/slog"
	"time"
)

// Loop runs steps until ctx ends, one every interval (the dashboard's demo
// traffic). A failed step is logged and counted in the runtimes' metrics
// (the page shows it); the loop goes on.
func (d *Rig) Loop(ctx context.Context, interval time.Duration, log *slog.Logger) {
	t := time.NewTimer(0)
	defer t.Stop()
	for step := 1; ; step++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ts, err := d.Step(ctx, step, func(Transfer) {})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("dashboard: demo step failed", "step", step, "err", err)
			// Messages of a broken step may still sit in inboxes; drain so the
			// next step's readers see their own refs.
			d.Drain()
		}
		for _, x := range ts {
			if !x.Verified {
				log.Error("dashboard: demo transfer did not verify", "step", step, "reader", x.Reader)
			}
		}
		t.Reset(interval)
	}
}
