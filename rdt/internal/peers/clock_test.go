package peers

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClockTimeout(t *testing.T) {
	t.Run("fake clock", func(t *testing.T) {
		clk := clockwork.NewFakeClock()
		ctx, cancel := clockTimeout(context.Background(), clk, time.Second)
		defer cancel()
		assert.NoError(t, ctx.Err(), "Err answers at once while the context runs")
		clk.Advance(time.Second - time.Nanosecond)
		assert.NoError(t, ctx.Err())
		clk.Advance(time.Nanosecond)
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("not done after the clock passed the timeout")
		}
		assert.ErrorIs(t, context.Cause(ctx), errClockTimeout)
	})
	t.Run("fake clock, cancelled first", func(t *testing.T) {
		clk := clockwork.NewFakeClock()
		ctx, cancel := clockTimeout(context.Background(), clk, time.Second)
		cancel()
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
		clk.Advance(time.Hour) // the stopped timer fires nothing
		assert.ErrorIs(t, context.Cause(ctx), context.Canceled)
	})
	t.Run("wall clock", func(t *testing.T) {
		ctx, cancel := clockTimeout(context.Background(), clockwork.NewRealClock(), time.Hour)
		defer cancel()
		d, ok := ctx.Deadline()
		require.True(t, ok, "a plain context.WithTimeout")
		assert.WithinDuration(t, time.Now().Add(time.Hour), d, time.Minute)
	})
}
