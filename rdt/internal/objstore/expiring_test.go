package objstore

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// A dead reader's leases go at the next pass, which its death brings
// forward; otherwise passes come every period.
func TestExpiring(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	clk := clockwork.NewFakeClock()
	tab := New(1)
	mem := tensor.NewHostMemory(1 << 20)
	buf, err := mem.Alloc(ctx, 64)
	require.NoError(t, err)
	o := tab.Add(mem, buf, tensor.NewDesc(tensor.Uint8, 64), "a")
	claim := fabric.Claim{Object: o.ID, Incarnation: 1, Token: o.Token}
	tab.LeaseClaims("reader", false, []fabric.Claim{claim}, []LayoutSum{LayoutOf(o.Desc)}, clk.Now().Add(time.Hour))
	require.Equal(t, 1, tab.Leases())
	passes := make(chan int, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tab.Expiring(ctx, clk, time.Minute, func() { passes <- tab.Expire(clk.Now()) })
	}()
	defer func() { cancel(); <-done }()
	require.Positive(t, tab.DropPeer("reader"))
	require.Equal(t, 1, <-passes, "the death brings the pass forward")
	require.NoError(t, clk.BlockUntilContext(ctx, 1))
	clk.Advance(time.Minute)
	require.Equal(t, 0, <-passes, "and passes come every period")
}
