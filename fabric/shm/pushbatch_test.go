package shm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// sinkOwner is a manyOwner whose objects are also push sinks; a sink in
// busy refuses writes as a slot whose reader still consumes it does.
func sinkOwner(t *testing.T, busy map[int]bool) *manyOwner {
	var o *manyOwner
	o = newManyOwner(t, func(cfg *ServerConfig) {
		cfg.Sink = sinkFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			o.opens.Add(1)
			for i := range busy {
				if c.Object == objID(i) {
					return nil, fabric.ErrSinkBusy
				}
			}
			o.mu.Lock()
			defer o.mu.Unlock()
			b := o.objs[c.Object]
			if b == nil {
				return nil, fabric.ErrObjectFreed
			}
			o.pins.Add(1)
			return &countedPin{nopRelease: nopRelease{b}, pins: &o.pins}, nil
		})
	})
	return o
}

// push pushes a fresh pattern (seeded by round) into sinks [0, n) and
// checks every sink that took it; it returns each item's error.
func (o *manyOwner) push(t *testing.T, tr *Transport, n int, round byte) []error {
	t.Helper()
	var srcs []tensor.Buffer
	var dsts []fabric.Remote
	for i := range n {
		s, p := hostDst(t, int64(1000+i))
		fillPattern(p, byte(i)^round)
		srcs = append(srcs, s)
		dsts = append(dsts, o.remote(i))
	}
	sts, errs := tr.WriteBatch(context.Background(), srcs, dsts)
	require.Len(t, errs, n)
	for i, err := range errs {
		o.mu.Lock()
		got, _ := tensor.BytesOf(o.objs[objID(i)])
		o.mu.Unlock()
		want, _ := tensor.BytesOf(srcs[i])
		if err != nil {
			require.NotEqual(t, want[:len(got)], got, "item %d failed but its sink holds the push", i)
			continue
		}
		require.Equal(t, want[:len(got)], got, "item %d", i)
		require.Equal(t, int64(1000+i), sts[i].Bytes)
		if o.srv.noBatch.Load() {
			require.Zero(t, sts[i].Coalesced, "item %d was pushed alone", i)
		} else {
			require.Equal(t, n, sts[i].Coalesced, "item %d", i)
		}
	}
	return errs
}

// TestPushBatchFrames: 300 sinks of one owner take their pushes in two
// frames (256, 44), one round trip each, every sink's own pages granted
// writable and mapped once; pushed again, the cached writable mappings
// need no descriptor. A busy sink fails alone, typed, and is left as it
// was; no pin outlives the batch.
func TestPushBatchFrames(t *testing.T) {
	o := sinkOwner(t, map[int]bool{7: true})
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	for round := range 2 {
		for i, err := range o.push(t, cli.SHM(), 300, byte(round+1)) {
			if i == 7 {
				require.ErrorIs(t, err, fabric.ErrSinkBusy)
				continue
			}
			require.NoError(t, err, "round %d item %d", round, i)
		}
	}
	assert.Equal(t, BatchStats{Frames: 4, Items: 600, Descriptors: 299, Packets: 5}, cli.BatchStats())
	s := cli.CacheStats()
	assert.EqualValues(t, 299, s.Push.Mapped, "one writable mapping per sink")
	assert.EqualValues(t, 299, s.Push.Hits, "the second batch pushed through the cached mappings")
	assert.Zero(t, s.Pull.Mapped, "a push batch maps nothing read-only")
	waitFor(t, func() bool { return o.pins.Load() == 0 }, "pins released")
	assert.EqualValues(t, 600, o.opens.Load(), "every sink re-validated by the owner, every time")
}

// TestPushBatchOldOwner: an owner that refuses batches pushes the items
// one by one, and the client says so.
func TestPushBatchOldOwner(t *testing.T) {
	o := sinkOwner(t, nil)
	o.srv.noBatch.Store(true)
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	for _, err := range o.push(t, cli.P2P(), 20, 3) {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 20, cli.BatchStats().OneByOne)
	assert.EqualValues(t, 20, cli.CacheStats().Push.Mapped)
}

// TestPushBatchNoSink: an owner that accepts no pushes refuses every item
// of a push batch, typed, and writes nothing; the connection stays usable
// for a read batch afterwards.
func TestPushBatchNoSink(t *testing.T) {
	o := newManyOwner(t, nil)
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	for i, err := range o.push(t, cli.SHM(), 5, 9) {
		require.ErrorIs(t, err, fabric.ErrBadRequest, "item %d", i)
	}
	for _, err := range o.batch(t, cli.SHM(), 5) {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 2, cli.BatchStats().Frames)
}
