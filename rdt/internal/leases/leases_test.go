package leases

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// owner answers every lease message as an owner that grants all, and
// counts the claims released.
type owner struct {
	mu       sync.Mutex
	released int
}

func (o *owner) Lease(_ context.Context, _ peer.ID, kind byte, claims []fabric.Claim, _ []ctlwire.Layout) (uint64, []error, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if kind == ctlwire.LifeRelease {
		o.released += len(claims)
	}
	return 1, make([]error, len(claims)), nil
}

func newTable(o *owner, clk clockwork.Clock, gone *[]Key) *Table {
	return New(Config{Leaser: o, Self: "me", Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Linger: time.Second, RenewWait: time.Second, ReleaseWait: time.Second,
		Watch: func(peer.ID) func() { return func() {} }, Gone: func(k Key) { *gone = append(*gone, k) }})
}

// One lease per ref, shared by its holders and Gets; it goes when the last
// holder does, a Get-only one after it lingered.
func TestHolders(t *testing.T) {
	ctx := context.Background()
	clk := clockwork.NewFakeClock()
	o := &owner{}
	var gone []Key
	tab := newTable(o, clk, &gone)
	ref := refwire.Ref{Owner: "them", Incarnation: 1, Object: fabric.ObjectID{1}, Token: []byte("t")}
	var layout ctlwire.Layout
	held, err := tab.Join("a", ref, layout)
	require.NoError(t, err)
	assert.False(t, held)
	require.NoError(t, tab.Add("a", ref, layout))
	held, err = tab.Join("", ref, layout) // a Get joins
	assert.True(t, held)
	require.NoError(t, err)
	forged := ref
	forged.Token = []byte("x")
	_, err = tab.Join("b", forged, layout)
	assert.ErrorIs(t, err, errs.Unauthorized)
	_, err = tab.Join("b", ref, ctlwire.Layout{1})
	assert.ErrorIs(t, err, errs.LayoutMismatch)

	require.NoError(t, tab.Unhold(ctx, "a", ref))
	assert.Equal(t, 1, tab.Len(), "the Get still holds it")
	tab.Unget(KeyOf(ref))
	assert.True(t, tab.ReleaseIdle(ctx), "lingers")
	clk.Advance(2 * time.Second)
	assert.False(t, tab.ReleaseIdle(ctx))
	assert.Equal(t, 0, tab.Len())
	assert.Equal(t, 1, o.released)

	require.NoError(t, tab.Add("a", ref, layout))
	tab.Drop("them", 1)
	assert.Equal(t, []Key{KeyOf(ref)}, gone, "a dead owner's leases are gone")
	require.NoError(t, tab.Add("a", ref, layout))
	tab.ReleaseAll(ctx)
	assert.Equal(t, 2, o.released)
	assert.ErrorIs(t, tab.Add("a", ref, layout), errs.Closed)
}

// Keep renews what is held and releases a Get-only lease once it lingered.
func TestKeep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	clk := clockwork.NewFakeClock()
	o := &owner{}
	var gone []Key
	tab := newTable(o, clk, &gone)
	done := make(chan struct{})
	go func() { defer close(done); tab.Keep(ctx) }()
	defer func() { cancel(); <-done }()
	ref := refwire.Ref{Owner: "them", Incarnation: 1, Object: fabric.ObjectID{1}, Token: []byte("t")}
	require.NoError(t, tab.Add("", ref, ctlwire.Layout{}))
	tab.Unget(KeyOf(ref))
	require.NoError(t, clk.BlockUntilContext(ctx, 2), "the renewal ticker and the linger timer")
	assert.Equal(t, 1, tab.Len(), "it lingers")
	clk.Advance(time.Second)
	require.Eventually(t, func() bool { return tab.Len() == 0 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { o.mu.Lock(); defer o.mu.Unlock(); return o.released == 1 }, 10*time.Second, time.Millisecond)
}
