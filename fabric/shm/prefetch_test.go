package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

// prefetchReader is a slab reader with its prefetch budget.
func prefetchReader(t *testing.T, psk []byte, budget int64) *Client {
	t.Helper()
	readerKey, _ := key(t)
	c, err := NewClient(Config{Security: fabric.Security{Identity: readerKey, ClusterKey: psk}, Topology: dgx(t), PrefetchBytes: budget})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// waitPrefetches waits (bounded) until c finished n prefetches.
func waitPrefetches(t *testing.T, c *Client, n int64) SlabStats {
	t.Helper()
	require.Eventually(t, func() bool { return c.SlabStats().Prefetches >= n }, 10*time.Second, time.Millisecond)
	return c.SlabStats()
}

// rssOf reads /proc/self/smaps for the mapping that holds p: the bytes of
// it this process has page tables for (Rss counts present entries).
func rssOf(t *testing.T, p []byte) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	addr := uint64(uintptr(unsafe.Pointer(&p[0])))
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := strings.Cut(strings.Fields(line)[0], "-"); ok && !strings.HasSuffix(line, ":") && !strings.Contains(lo, ":") {
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = a <= addr && addr < b
				continue
			}
		}
		if in && strings.HasPrefix(line, "Rss:") {
			kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return 0
}

// slabData returns the reader's mappings of owner slabs.
func slabData(c *Client) [][]byte {
	c.slabs.mu.Lock()
	defer c.slabs.mu.Unlock()
	var out [][]byte
	for _, m := range c.slabs.byKey {
		out = append(out, m.data)
	}
	return out
}

// TestSlabPrefetch: after its first slab grant, a reader maps the owner's
// other slabs (announced) and builds the page tables of all of them in
// the background; later objects in them cost no mmap, and their bytes are
// the owner's.
func TestSlabPrefetch(t *testing.T) {
	o := newSlabOwnerWith(t, slabPSK, nil, tensor.SlabConfig{SlabSize: 8 << 20, Reserve: 16 << 20}, true)
	require.NoError(t, o.mem.WaitPopulated(context.Background()))
	small := o.put(t, 1, 4096, 3) // in the reserve
	mid := o.put(t, 2, 4<<20, 5)  // in the reserve
	big := o.put(t, 3, 12<<20, 7) // a slab of its own
	require.EqualValues(t, 2, o.mem.Slabs())
	c := prefetchReader(t, slabPSK, 0)

	got, err := readInto(t, c, o.remote(1, 4096))
	require.NoError(t, err)
	require.Equal(t, small, got)
	st := waitPrefetches(t, c, 1)
	assert.EqualValues(t, 2, st.Live, "both slabs mapped: %+v", st)
	// The slab the grant did not bring was announced (on the grant's
	// connection, which holds the other already).
	assert.EqualValues(t, 1, st.Announced, "%+v", st)
	assert.EqualValues(t, 2, st.Mapped, "%+v", st)
	assert.EqualValues(t, (16+12)<<20, st.PrefetchedBytes, "every page of both slabs: %+v", st)
	assert.Zero(t, st.Prefetching)
	for _, d := range slabData(c) {
		assert.EqualValues(t, len(d), rssOf(t, d), "page tables built for the whole slab")
	}

	for id, want := range map[byte][]byte{3: big, 2: mid} {
		got, err := readInto(t, c, o.remote(id, int64(len(want))))
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	st2 := c.SlabStats()
	assert.EqualValues(t, 2, st2.Mapped, "no mmap for the objects after the prefetch")
	assert.EqualValues(t, 1, st2.Prefetches, "one prefetch per owner")
	assert.EqualValues(t, st.Announced, gatherCounter(t, c, "tensorlane_shm_slab_events_total", map[string]string{"event": "announced"}))
	assert.EqualValues(t, (16+12)<<20, gatherCounter(t, c, "tensorlane_shm_slab_prefetch_bytes_total", nil))

	// The owner frees and reuses a range: the reader still reads the new
	// object's bytes through its prefetched mapping.
	o.free(3)
	again := o.put(t, 4, 12<<20, 9)
	got, err = readInto(t, c, o.remote(4, int64(len(again))))
	require.NoError(t, err)
	require.Equal(t, again, got)
}

// TestSlabPrefetchBudget: a reader maps no more announced slabs than its
// budget allows, and a reader with prefetch off asks for none.
func TestSlabPrefetchBudget(t *testing.T) {
	for _, tc := range []struct {
		name          string
		budget        int64
		prefetches    int64
		live          int
		announcedMore int64
	}{
		{"budget below the other slab", 20 << 20, 1, 1, 0},
		{"off", -1, 0, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newSlabOwnerWith(t, slabPSK, nil, tensor.SlabConfig{SlabSize: 8 << 20, Reserve: 16 << 20}, true)
			o.put(t, 1, 4096, 3)
			o.put(t, 3, 12<<20, 7)
			c := prefetchReader(t, slabPSK, tc.budget)
			_, err := readInto(t, c, o.remote(1, 4096))
			require.NoError(t, err)
			var st SlabStats
			if tc.prefetches > 0 {
				st = waitPrefetches(t, c, tc.prefetches)
			} else {
				st = c.SlabStats()
			}
			assert.Equal(t, tc.live, st.Live)
			assert.Equal(t, tc.announcedMore, st.Announced)
		})
	}
}

// TestSlabAnnounceNeedsScope: an owner without a cluster key announces
// nothing (it grants no slab object either), with a typed refusal, and
// the connection stays usable.
func TestSlabAnnounceNeedsScope(t *testing.T) {
	o := newSlabOwnerWith(t, nil, nil, tensor.SlabConfig{SlabSize: 8 << 20, Reserve: 16 << 20}, true)
	c := prefetchReader(t, nil, 0)
	r := o.remote(1, 1)
	want, addr, err := c.target(fabric.SHM, r)
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		err = c.withConn(context.Background(), want, ownerKey(want, addr), addr, func(pc *pconn) error {
			held, err := c.announced(pc, 1<<30)
			assert.Empty(t, held)
			return err
		})
		var re *peerauth.RemoteError
		require.True(t, errors.As(err, &re), "%v", err)
		assert.Contains(t, err.Error(), "trust scope")
	}
	assert.Zero(t, c.SlabStats().Live)
}

// TestSlabPrefetchClose: Close stops a prefetch in flight and waits for it
// (goleak checks the goroutines in TestMain); nothing stays mapped.
func TestSlabPrefetchClose(t *testing.T) {
	o := newSlabOwnerWith(t, slabPSK, nil, tensor.SlabConfig{SlabSize: 8 << 20}, true)
	o.put(t, 1, 4096, 3)
	for i := byte(2); i < 8; i++ {
		o.put(t, i, 16<<20, i) // slabs of their own
	}
	c := prefetchReader(t, slabPSK, 0)
	_, err := readInto(t, c, o.remote(1, 4096))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	st := c.SlabStats()
	assert.Zero(t, st.Prefetching)
	assert.Zero(t, st.Live, fmt.Sprintf("%+v", st))
}

// TestIdleGate: the prefetch's wait returns at once with no transfer in
// flight, waits while one is, and gives up when its context ends.
func TestIdleGate(t *testing.T) {
	var g idleGate
	g.init()
	require.NoError(t, g.wait(context.Background()))
	g.enter()
	done := make(chan error, 1)
	go func() { done <- g.wait(context.Background()) }()
	select {
	case <-done:
		t.Fatal("wait returned with a transfer in flight")
	case <-time.After(20 * time.Millisecond):
	}
	g.leave()
	require.NoError(t, <-done)

	g.enter()
	defer g.leave()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- g.wait(ctx) }()
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}
