package shm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

// manyOwner serves many objects, each its own allocation (and memfd),
// counting the pins it holds.
type manyOwner struct {
	srv     *Server
	ownerID peer.ID
	mu      sync.Mutex
	objs    map[fabric.ObjectID]tensor.Buffer
	pins    atomic.Int64
	opens   atomic.Int64
}

func newManyOwner(t *testing.T, mutate func(*ServerConfig)) *manyOwner {
	t.Helper()
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(0), 1<<30)
	require.NoError(t, err)
	o := &manyOwner{objs: map[fabric.ObjectID]tensor.Buffer{}}
	ownerKey, ownerID := key(t)
	o.ownerID = ownerID
	cfg := ServerConfig{Security: fabric.Security{Identity: ownerKey}, Dir: t.TempDir(),
		Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			o.opens.Add(1)
			o.mu.Lock()
			defer o.mu.Unlock()
			b := o.objs[c.Object]
			if b == nil {
				return nil, fabric.ErrObjectFreed
			}
			o.pins.Add(1)
			return &countedPin{nopRelease: nopRelease{b}, pins: &o.pins}, nil
		})}
	if mutate != nil {
		mutate(&cfg)
	}
	o.srv, err = Listen(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		o.srv.Close()
		for _, b := range o.objs {
			b.Release()
		}
		mem.Close()
	})
	for i := range 600 {
		b, err := mem.Alloc(context.Background(), int64(1000+i))
		require.NoError(t, err)
		p, _ := tensor.BytesOf(b)
		fillPattern(p, byte(i))
		o.objs[objID(i)] = b
	}
	return o
}

func objID(i int) fabric.ObjectID { return fabric.ObjectID{byte(i), byte(i >> 8), 0xbb} }

func (o *manyOwner) remote(i int) fabric.Remote {
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer:     o.ownerID.String(), Addrs: map[string]string{fabric.SHM: o.srv.Addr()},
		Claim: fabric.Claim{Object: objID(i), Incarnation: 1}, Length: int64(1000 + i),
	}
}

// batch reads objects [0, n) and checks every byte.
func (o *manyOwner) batch(t *testing.T, tr *Transport, n int) []error {
	t.Helper()
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for i := range n {
		srcs = append(srcs, o.remote(i))
		d, _ := hostDst(t, int64(1000+i))
		dsts = append(dsts, d)
	}
	sts, errs := tr.ReadBatch(context.Background(), srcs, dsts)
	for i, err := range errs {
		if err != nil {
			continue
		}
		got, _ := tensor.BytesOf(dsts[i])
		want, _ := tensor.BytesOf(o.objs[objID(i)])
		require.Equal(t, want, got[:len(want)], "item %d", i)
		if o.srv.noBatch.Load() {
			require.Zero(t, sts[i].Coalesced, "item %d was read alone", i)
		} else {
			require.Equal(t, n, sts[i].Coalesced, "item %d", i)
		}
	}
	return errs
}

// TestBatchFrames: 600 objects of one owner move in three frames (256,
// 256, 88), each one round trip whose 256 descriptors come in two packets
// (SCM_MAX_FD is 253); read again, the cached mappings need no descriptor
// at all. No pin outlives the batch.
func TestBatchFrames(t *testing.T) {
	o := newManyOwner(t, nil)
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	for _, err := range o.batch(t, cli.SHM(), 600) {
		require.NoError(t, err)
	}
	assert.Equal(t, BatchStats{Frames: 3, Items: 600, Descriptors: 600, Packets: 5}, cli.BatchStats())
	assert.EqualValues(t, 600, cli.CacheStats().Mapped)
	for _, err := range o.batch(t, cli.SHM(), 600) {
		require.NoError(t, err)
	}
	assert.Equal(t, BatchStats{Frames: 6, Items: 1200, Descriptors: 600, Packets: 8}, cli.BatchStats())
	assert.EqualValues(t, 600, cli.CacheStats().Hits, "the second batch read every object through its cached mapping")
	waitFor(t, func() bool { return o.pins.Load() == 0 }, "pins released")
	assert.EqualValues(t, 1200, o.opens.Load(), "every item re-validated by the owner, every time")
	assert.Equal(t, 6.0, gatherCounter(t, cli, "tensorlane_shm_batch_events_total", map[string]string{"event": "frames"}))
	assert.Equal(t, 8.0, gatherCounter(t, cli, "tensorlane_shm_batch_events_total", map[string]string{"event": "packets"}))
}

// TestBatchRevocation: an item freed since its mapping was cached fails
// alone, and its mapping goes.
func TestBatchRevocation(t *testing.T) {
	o := newManyOwner(t, nil)
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	for _, err := range o.batch(t, cli.SHM(), 10) {
		require.NoError(t, err)
	}
	o.mu.Lock()
	delete(o.objs, objID(4))
	o.mu.Unlock()
	errs := o.batch(t, cli.SHM(), 10)
	for i, err := range errs {
		if i == 4 {
			require.ErrorIs(t, err, fabric.ErrObjectFreed)
		} else {
			require.NoError(t, err, "item %d", i)
		}
	}
	assert.EqualValues(t, 1, cli.CacheStats().Revoked)
}

// TestBatchSlab: objects in one slab cost a batch one descriptor, and a
// second batch none.
func TestBatchSlab(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	var srcs []fabric.Remote
	var want [][]byte
	for i := range 40 {
		want = append(want, o.put(t, byte(i+1), int64(3000+i), byte(i)))
		srcs = append(srcs, o.remote(byte(i+1), int64(3000+i)))
	}
	c, _ := slabReader(t, slabPSK)
	for round := range 2 {
		var dsts []tensor.Buffer
		for _, s := range srcs {
			d, _ := hostDst(t, s.Length)
			dsts = append(dsts, d)
		}
		_, errs := c.SHM().ReadBatch(context.Background(), srcs, dsts)
		for i, err := range errs {
			require.NoError(t, err)
			got, _ := tensor.BytesOf(dsts[i])
			require.Equal(t, want[i], got[:len(want[i])])
		}
		assert.EqualValues(t, 1, c.BatchStats().Descriptors, "round %d: one slab, one descriptor", round)
	}
	assert.EqualValues(t, 1, c.SlabStats().Mapped)
}

// TestBatchOldOwner: an owner that does not know batches (wire version 4)
// refuses the request; the items are read one by one, and say so.
func TestBatchOldOwner(t *testing.T) {
	o := newManyOwner(t, nil)
	o.srv.noBatch.Store(true)
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	for _, err := range o.batch(t, cli.SHM(), 20) {
		require.NoError(t, err)
	}
	assert.EqualValues(t, 20, cli.BatchStats().OneByOne)
	assert.EqualValues(t, 20, cli.CacheStats().Mapped)
}

// TestBatchUnreadReply: a reader that asks for 256 objects and never reads
// the reply or its descriptors, nor says done, holds the owner's pins and
// descriptors for HoldTimeout at most; then the connection goes and
// everything with it.
func TestBatchUnreadReply(t *testing.T) {
	o := newManyOwner(t, func(c *ServerConfig) { c.HoldTimeout, c.StallTimeout = 200*time.Millisecond, 200*time.Millisecond })
	// A first read of each object makes its read-only sealed twin, which
	// the object keeps for later grants: not a leak.
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	for _, err := range o.batch(t, cli.SHM(), maxBatch) {
		require.NoError(t, err)
	}
	cli.Close()
	before := openFDs(t)
	attacker, _ := key(t)
	nc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: o.srv.Addr(), Net: "unixpacket"})
	require.NoError(t, err)
	_, err = peerauth.ClientWith(newPacketRW(nc), attacker, o.ownerID, peerauth.Options{})
	require.NoError(t, err)
	var reqs []request
	for i := range maxBatch {
		r := o.remote(i)
		reqs = append(reqs, request{op: opRead, claim: r.Claim, length: r.Length})
	}
	_, err = nc.Write(appendBatch(nil, reqs))
	require.NoError(t, err)
	waitFor(t, func() bool { return o.pins.Load() == maxBatch }, "all pinned")
	waitFor(t, func() bool { return o.pins.Load() == 0 && o.srv.connCount() == 0 }, "pins released and the connection dropped after HoldTimeout")
	nc.Close() // the descriptors still queued on it go with it
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := openFDs(t); n > before {
		es, _ := os.ReadDir("/proc/self/fd")
		var extra []string
		for _, e := range es[max(0, len(es)-10):] {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			extra = append(extra, e.Name()+"->"+l)
		}
		t.Fatalf("%d descriptors open, %d before: %v", n, before, extra)
	}
}

// TestBatchAbsurdRequests: a batch that announces more items than it
// holds, or than a batch may have, is refused before anything is opened,
// and the connection closed.
func TestBatchAbsurdRequests(t *testing.T) {
	o := newManyOwner(t, nil)
	attacker, _ := key(t)
	for _, p := range [][]byte{
		{opBatch, 0xff, 0xff},
		{opBatch, 0, 0},
		append([]byte{opBatch, 1, 1}, make([]byte, 48*257)...),
		append([]byte{opBatch, 0, 2}, make([]byte, 48)...),
	} {
		nc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: o.srv.Addr(), Net: "unixpacket"})
		require.NoError(t, err)
		_, err = peerauth.ClientWith(newPacketRW(nc), attacker, o.ownerID, peerauth.Options{})
		require.NoError(t, err)
		_, err = nc.Write(p)
		require.NoError(t, err)
		buf := make([]byte, maxPacket)
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := nc.Read(buf)
		require.NoError(t, err)
		_, err = parseReply(buf[:n])
		require.ErrorIs(t, err, fabric.ErrBadRequest)
		n, _ = nc.Read(buf)
		require.Zero(t, n, "connection closed after the refusal")
		nc.Close()
	}
	assert.Zero(t, o.opens.Load())
}

// TestBatchDescriptorLimit: a reader whose descriptor table fills up
// mid-batch gets ErrDescriptorLimit (typed, not corrupt), leaks no
// descriptor and no pin, and reads the same batch once it has room. The
// owner is another process, so only the reader's table is limited.
func TestBatchDescriptorLimit(t *testing.T) {
	sizes := make([]int64, 200)
	for i := range sizes {
		sizes[i] = 4096 + int64(i)
	}
	h := startHelper(t, sizes...)
	readerKey, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: readerKey}})
	require.NoError(t, err)
	defer cli.Close()
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for i, n := range sizes {
		srcs = append(srcs, h.remote(i, 0, n))
		d, _ := hostDst(t, n)
		dsts = append(dsts, d)
	}
	// Connect first (one item), so the limit bites on the descriptors.
	_, errs := cli.SHM().ReadBatch(context.Background(), srcs[:1], dsts[:1])
	require.NoError(t, errs[0])
	before := openFDs(t)
	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old))
	lim := old
	lim.Cur = uint64(limitLeaving(t, 50))
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	_, errs = cli.SHM().ReadBatch(context.Background(), srcs[1:], dsts[1:])
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old))
	for i, err := range errs {
		require.ErrorIs(t, err, ErrDescriptorLimit, "item %d", i+1)
		require.ErrorIs(t, err, syscall.EMFILE)
	}
	assert.LessOrEqual(t, openFDs(t), before, "descriptors leaked")
	_, errs = cli.SHM().ReadBatch(context.Background(), srcs, dsts)
	for i, err := range errs {
		require.NoError(t, err, "item %d", i)
		p, _ := tensor.BytesOf(dsts[i])
		require.Equal(t, -1, checkWords(p[:sizes[i]], h.info.Objects[i].Seed, 0, sizes[i]), "item %d", i)
	}
}

// limitLeaving returns the descriptor limit under which exactly room
// descriptors are free: earlier tests leave holes in the table.
func limitLeaving(t *testing.T, room int) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	open := map[int]bool{}
	for _, e := range es {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err == nil {
			open[fd] = true
		}
	}
	lim := 0
	for free := 0; free < room; lim++ {
		if !open[lim] {
			free++
		}
	}
	return lim
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(es)
}

// TestBatchViewGrant: the object is a 16 KiB view in the middle of a
// larger allocation that holds a secret. In one batch, ranges inside the
// view get its bytes (from the private copy of the view, which is all the
// descriptors reach), and ranges reaching outside it fail alone, writing
// nothing.
func TestBatchViewGrant(t *testing.T) {
	const size, start, n = 1 << 20, 512<<10 + 100, 16 << 10
	var share *tensor.ViewShare
	f := newFixture(t, size, func(s *ServerConfig, _ *Config) {
		s.Source = fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			if c.Offset < start || c.Offset+c.Length > start+n {
				return nil, fabric.ErrUnauthorized
			}
			return viewPin{Buffer: share.Src(), share: share, end: start + n}, nil
		})
	})
	share = tensor.NewViewShare(f.mem, f.obj, start, start+n)
	defer share.Release()
	for i := range f.data {
		f.data[i] = 0x5E
	}
	fillPattern(f.data[start:start+n], 9)
	got := receive(t, f.cli)
	ranges := []struct {
		off, n int64
		ok     bool
	}{{start, n, true}, {start + 100, 1000, true}, {start - 10, 20, false}, {start + n - 10, 20, false}, {0, size, false}, {start + n - 1, 1, true}}
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for _, r := range ranges {
		src := f.remote(r.n)
		src.Offset = r.off
		d, _ := hostDst(t, r.n)
		srcs, dsts = append(srcs, src), append(dsts, d)
	}
	sts, errs := f.cli.SHM().ReadBatch(context.Background(), srcs, dsts)
	for i, r := range ranges {
		p, _ := tensor.BytesOf(dsts[i])
		if !r.ok {
			require.ErrorIs(t, errs[i], fabric.ErrUnauthorized, "range %d", i)
			require.Equal(t, make([]byte, r.n), p[:r.n], "range %d: a refused item wrote", i)
			continue
		}
		require.NoError(t, errs[i], "range %d", i)
		require.Equal(t, f.data[r.off:r.off+r.n], p[:r.n], "range %d", i)
		assert.True(t, sts[i].ViewCopy, "range %d: served from the view's copy", i)
	}
	got.mu.Lock()
	fds := slices.Clone(got.fds)
	got.mu.Unlock()
	require.NotEmpty(t, fds)
	for _, fd := range fds {
		file := wholeFile(t, fd)
		require.Equal(t, int((n+pageSize-1)&^(pageSize-1)), len(file), "a descriptor reaches more than the view's pages")
		assert.False(t, bytes.Contains(file, bytes.Repeat([]byte{0x5E}, 64)), "the parent's secret is reachable")
	}
}

// TestBatchOwnerKilled: the owner process is killed (SIGKILL) while a
// reader copies its batch. Every item ends within the bound with
// fabric.ErrPeerClosed (the copy was not confirmed under a live pin, so
// none may be used), and the dead owner's mappings are dropped.
func TestBatchOwnerKilled(t *testing.T) {
	sizes := repeat(40, 1<<20)
	h := startHelper(t, sizes...)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}})
	require.NoError(t, err)
	defer cli.Close()
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for i, n := range sizes {
		srcs = append(srcs, h.remote(i, 0, n))
		d, _ := hostDst(t, n)
		dsts = append(dsts, d)
	}
	var once sync.Once
	cli.afterMap = func() { once.Do(func() { h.kill(t) }) }
	done := make(chan []error, 1)
	go func() {
		_, errs := cli.SHM().ReadBatch(context.Background(), srcs, dsts)
		done <- errs
	}()
	select {
	case errs := <-done:
		for i, err := range errs {
			require.ErrorIs(t, err, fabric.ErrPeerClosed, "item %d", i)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("HUNG: a batch from a killed owner did not return within 30 s")
	}
	cli.afterMap = nil
	assert.Zero(t, cli.CacheStats().Live, "a dead owner's mappings are dropped")
}
