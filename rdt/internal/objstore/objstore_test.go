package objstore

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

func newObject(t *testing.T, tab *Table, desc tensor.Desc) *Object {
	t.Helper()
	mem := tensor.NewHostMemory(1 << 20)
	_, end := desc.Span()
	buf, err := mem.Alloc(context.Background(), end)
	require.NoError(t, err)
	return tab.Add(mem, buf, desc, "owner")
}

func claimOf(o *Object, inc uint64) fabric.Claim {
	return fabric.Claim{Object: o.ID, Incarnation: inc, Token: o.Token}.For(o.Start, o.End-o.Start)
}

// Every data path resolves a claim here: each way a claim can be wrong is
// refused with its own condition.
func TestOpenChecksClaims(t *testing.T) {
	ctx := context.Background()
	tab := New(7)
	o := newObject(t, tab, tensor.NewDesc(tensor.Float32, 4, 4))
	good := claimOf(o, 7)
	for _, tc := range []struct {
		name string
		edit func(c *fabric.Claim)
		want error
	}{
		{"stale incarnation", func(c *fabric.Claim) { c.Incarnation = 8 }, errs.StaleRef},
		{"unknown object", func(c *fabric.Claim) { c.Object[0] ^= 1 }, errs.ObjectNotFound},
		{"wrong token", func(c *fabric.Claim) { c.Token = make([]byte, 16) }, errs.Unauthorized},
		{"range past the view", func(c *fabric.Claim) { c.Length++ }, fabric.ErrUnauthorized},
	} {
		c := good
		c.Token = append([]byte(nil), good.Token...)
		tc.edit(&c)
		_, err := tab.Open(ctx, c)
		assert.ErrorIs(t, err, tc.want, tc.name)
	}
	p, err := tab.Open(ctx, good)
	require.NoError(t, err)
	assert.Equal(t, 1, tab.Pins())
	require.NoError(t, p.Release())
	require.NoError(t, p.Release(), "idempotent")
	assert.Equal(t, 0, tab.Pins())
}

// A released object stays while a reader leases it, and goes when the
// lease expires; a freed object's late readers learn it was freed.
func TestReleaseWaitsForLeases(t *testing.T) {
	tab := New(1)
	var freed []string
	tab.SetHooks(Hooks{OnFree: func(_ fabric.ObjectID, why string) { freed = append(freed, why) }})
	o := newObject(t, tab, tensor.NewDesc(tensor.Uint8, 64))
	c := claimOf(o, 1)
	reader := peer.ID("reader")
	now := time.Unix(1000, 0)
	require.NoError(t, tab.Lease(reader, c, o.Layout, now.Add(time.Second)))
	assert.ErrorIs(t, tab.Lease(reader, c, LayoutOf(tensor.NewDesc(tensor.Uint8, 32)), now), errs.LayoutMismatch)
	require.NoError(t, tab.Release(o.ID))
	assert.Equal(t, 1, tab.Len(), "a leased object outlives its owner's release")
	assert.Equal(t, 0, tab.Expire(now))
	assert.Equal(t, 1, tab.Expire(now.Add(2*time.Second)))
	assert.Equal(t, 0, tab.Len())
	assert.Equal(t, []string{"leases expired"}, freed)
	done, err := tab.FreedChan(o.ID)
	require.NoError(t, err)
	<-done
	_, err = tab.Open(context.Background(), c)
	assert.ErrorIs(t, err, errs.ObjectFreed)
}

// A freed object's memory goes back only when the last read lets go.
func TestFreeWaitsForPins(t *testing.T) {
	ctx := context.Background()
	tab := New(1)
	o := newObject(t, tab, tensor.NewDesc(tensor.Uint8, 64))
	p, err := tab.Open(ctx, claimOf(o, 1))
	require.NoError(t, err)
	require.NoError(t, tab.Free(o.ID))
	done, err := tab.FreedChan(o.ID)
	require.NoError(t, err)
	select {
	case <-done:
		t.Fatal("memory returned while a read pins it")
	default:
	}
	require.NoError(t, p.Release())
	<-done
	assert.Equal(t, 0, tab.Close(), "Close reports no reads in flight")
}

// LayoutOf is what a lease compares: equal layouts (whether strides are
// spelled out or implied) give the same digest, and any change to dtype,
// shape, strides or offset gives another.
func TestLayoutDigest(t *testing.T) {
	base := tensor.NewDesc(tensor.Float32, 4, 8)
	implied := base.Clone()
	implied.Strides = nil
	assert.Equal(t, LayoutOf(base), LayoutOf(implied))
	transposed := base.Clone()
	transposed.Strides = []int64{1, 4}
	offset := base.Clone()
	offset.Offset = 8
	for name, d := range map[string]tensor.Desc{
		"dtype":   tensor.NewDesc(tensor.Int32, 4, 8),
		"shape":   tensor.NewDesc(tensor.Float32, 8, 4),
		"rank":    tensor.NewDesc(tensor.Float32, 32),
		"strides": transposed,
		"offset":  offset,
	} {
		assert.NotEqual(t, LayoutOf(base), LayoutOf(d), name)
	}
}
