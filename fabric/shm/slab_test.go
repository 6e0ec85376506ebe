package shm

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

var slabPSK = []byte("slab-cluster-key-0123456789abcde")

// slabOwner is an owner whose objects live in a SlabMemory, served over
// the real socket.
type slabOwner struct {
	srv     *Server
	mem     *tensor.SlabMemory
	ownerID peer.ID
	mu      sync.Mutex
	objs    map[fabric.ObjectID]tensor.Buffer
}

func newSlabOwner(t *testing.T, psk []byte, authorize func(peer.ID) error) *slabOwner {
	t.Helper()
	return newSlabOwnerWith(t, psk, authorize, tensor.SlabConfig{SlabSize: 8 << 20}, false)
}

// newSlabOwnerWith is newSlabOwner with its memory's config, announcing
// its slabs (prefetch.go) when announce is set.
func newSlabOwnerWith(t *testing.T, psk []byte, authorize func(peer.ID) error, mc tensor.SlabConfig, announce bool) *slabOwner {
	t.Helper()
	mem, err := tensor.NewSlabMemory(mc)
	require.NoError(t, err)
	o := &slabOwner{mem: mem, objs: map[fabric.ObjectID]tensor.Buffer{}}
	ownerKey, ownerID := key(t)
	o.ownerID = ownerID
	var slabs []tensor.SlabExporter
	if announce {
		slabs = append(slabs, mem)
	}
	o.srv, err = Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey, ClusterKey: psk, AllowPeer: authorize}, Slabs: slabs,
		Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			o.mu.Lock()
			defer o.mu.Unlock()
			b := o.objs[c.Object]
			if b == nil {
				return nil, fabric.ErrObjectFreed
			}
			return nopRelease{b}, nil
		})})
	require.NoError(t, err)
	t.Cleanup(func() {
		o.srv.Close()
		o.mu.Lock()
		for _, b := range o.objs {
			b.Release()
		}
		o.mu.Unlock()
		mem.Close()
	})
	return o
}

// put allocates an object of n bytes filled with seed's pattern.
func (o *slabOwner) put(t *testing.T, id byte, n int64, seed byte) []byte {
	t.Helper()
	b, err := o.mem.Alloc(context.Background(), n)
	require.NoError(t, err)
	p, _ := tensor.BytesOf(b)
	fillPattern(p, seed)
	o.mu.Lock()
	o.objs[fabric.ObjectID{id}] = b
	o.mu.Unlock()
	return append([]byte(nil), p...)
}

func (o *slabOwner) free(id byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.objs[fabric.ObjectID{id}].Release()
	delete(o.objs, fabric.ObjectID{id})
}

func (o *slabOwner) remote(id byte, n int64) fabric.Remote {
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.HostDevice},
		Peer:     o.ownerID.String(), Addrs: map[string]string{fabric.SHM: o.srv.Addr()},
		Claim: fabric.Claim{Object: fabric.ObjectID{id}, Incarnation: 1}, Length: n,
	}
}

func slabReader(t *testing.T, psk []byte) (*Client, peer.ID) {
	t.Helper()
	readerKey, readerID := key(t)
	c, err := NewClient(Config{Security: fabric.Security{Identity: readerKey, ClusterKey: psk}, Topology: dgx(t)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, readerID
}

func readInto(t *testing.T, c *Client, r fabric.Remote) ([]byte, error) {
	t.Helper()
	dst, p := hostDst(t, r.Length)
	_, err := c.SHM().Read(context.Background(), r, dst)
	return p, err
}

// TestSlabMappedOnce: objects in one slab cost the reader one descriptor
// and one mmap; later grants carry offsets only (counted by the metrics),
// and the slab is unmapped when the client closes.
func TestSlabMappedOnce(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	sizes := []int64{3<<20 + 5, 4096, 1 << 20}
	var want [][]byte
	for i, n := range sizes {
		want = append(want, o.put(t, byte(i+1), n, byte(i+7)))
	}
	c, _ := slabReader(t, slabPSK)
	got := receive(t, c)
	for round := 0; round < 2; round++ {
		for i, n := range sizes {
			p, err := readInto(t, c, o.remote(byte(i+1), n))
			require.NoError(t, err)
			require.Equal(t, want[i], p, "object %d", i)
		}
	}
	got.only(t) // one descriptor for the six reads
	s := c.SlabStats()
	assert.EqualValues(t, 1, s.Mapped, "mmaps")
	assert.EqualValues(t, 5, s.Hits)
	assert.Equal(t, 1, s.Live)
	assert.EqualValues(t, 8<<20, s.Bytes)
	assert.Zero(t, c.CacheStats().Mapped, "no per-object mappings")
	assert.EqualValues(t, 1, slabMetric(t, c, "mapped"))
	assert.EqualValues(t, 5, slabMetric(t, c, "hit"))
	require.NoError(t, c.Close())
	assert.Zero(t, c.SlabStats().Live)
	assert.EqualValues(t, 1, c.SlabStats().Unmapped)
}

// TestSlabConnsShareMapping: concurrent reads on several connections each
// receive the slab's descriptor (the owner counts per connection), but the
// reader maps the slab once.
func TestSlabConnsShareMapping(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	const n = 256 << 10
	want := o.put(t, 1, n, 3)
	c, _ := slabReader(t, slabPSK)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			dst, p := hostDst(t, n)
			_, errs[i] = c.SHM().Read(context.Background(), o.remote(1, n), dst)
			if errs[i] == nil && string(p) != string(want) {
				errs[i] = errors.New("bytes differ")
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	s := c.SlabStats()
	assert.EqualValues(t, 1, s.Mapped)
	assert.Equal(t, 1, s.Live)
}

// TestSlabGrantRefusesWrite: a slab descriptor is read-only, as every
// read grant is: it cannot be mapped writable nor written.
func TestSlabGrantRefusesWrite(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	o.put(t, 1, 1<<20, 1)
	c, _ := slabReader(t, slabPSK)
	got := receive(t, c)
	_, err := readInto(t, c, o.remote(1, 1<<20))
	require.NoError(t, err)
	fd := got.only(t)
	_, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	assert.ErrorIs(t, err, unix.EACCES, "the slab maps writable")
	_, err = unix.Pwrite(fd, []byte("x"), 0)
	assert.Error(t, err, "the slab is writable")
	assert.Error(t, unix.Ftruncate(fd, 0), "the slab can be truncated")
}

// TestSlabScope: readers outside the owner's trust scope get nothing: a
// reader with another cluster key or none fails the handshake, one the
// owner's authorization denies is refused, and an owner without a cluster
// key grants no slab at all.
func TestSlabScope(t *testing.T) {
	var denied peer.ID
	o := newSlabOwner(t, slabPSK, func(p peer.ID) error {
		if p == denied {
			return fabric.ErrUnauthorized
		}
		return nil
	})
	o.put(t, 1, 4096, 1)
	for _, psk := range [][]byte{nil, []byte("another-cluster-key-0123456789ab")} {
		c, _ := slabReader(t, psk)
		got := receive(t, c)
		_, err := readInto(t, c, o.remote(1, 4096))
		require.ErrorIs(t, err, fabric.ErrUnauthorized)
		assert.Empty(t, got.fds)
		assert.Zero(t, c.SlabStats().Mapped)
	}
	c, id := slabReader(t, slabPSK)
	denied = id
	got := receive(t, c)
	_, err := readInto(t, c, o.remote(1, 4096))
	require.ErrorIs(t, err, fabric.ErrUnauthorized)
	assert.Empty(t, got.fds)

	open := newSlabOwner(t, nil, nil)
	open.put(t, 1, 4096, 1)
	c2, _ := slabReader(t, nil)
	got2 := receive(t, c2)
	_, err = readInto(t, c2, open.remote(1, 4096))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "trust scope")
	assert.Empty(t, got2.fds)
}

// TestSlabFreeReuse: a freed object's range goes to the owner's next
// object; its readers read it from the slab they mapped already, and the
// freed object's claim is refused.
func TestSlabFreeReuse(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	const n = 2 << 20
	o.put(t, 1, n, 1)
	c, _ := slabReader(t, slabPSK)
	_, err := readInto(t, c, o.remote(1, n))
	require.NoError(t, err)
	o.free(1)
	slabs := o.mem.Slabs()
	want := o.put(t, 2, n, 9)
	assert.Equal(t, slabs, o.mem.Slabs(), "the freed range is reused, no new slab")
	_, err = readInto(t, c, o.remote(1, n))
	require.ErrorIs(t, err, fabric.ErrObjectFreed)
	p, err := readInto(t, c, o.remote(2, n))
	require.NoError(t, err)
	assert.Equal(t, want, p)
	assert.EqualValues(t, 1, c.SlabStats().Mapped)
}

// TestSlabView: a view of a slab object maps nothing new (the slab is
// mapped once), and the owner holds the object's range while the view
// lives: freed and reallocated, the range is not reused under the view.
// Unview gives it back.
func TestSlabView(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	const n = 2 << 20
	want := o.put(t, 1, n, 4)
	c, readerID := slabReader(t, slabPSK)
	tr := c.SHM()
	v, err := tr.View(context.Background(), o.remote(1, n))
	require.NoError(t, err)
	got, err := tensor.BytesOf(v)
	require.NoError(t, err)
	require.Equal(t, want, got)
	// The done goes unanswered: the owner registers the hold on reading it
	// (its pin held the object until then).
	waitFor(t, func() bool { return o.srv.holds.count(readerID) == 1 }, "the hold")
	assert.EqualValues(t, n, o.mem.Held())

	o.free(1)
	o.put(t, 2, n, 9) // may not take the held range
	o.put(t, 3, n, 10)
	assert.Equal(t, want, got, "the view changed after its object was freed")
	p, err := readInto(t, c, o.remote(2, n))
	require.NoError(t, err)
	assert.NotEqual(t, want, p)
	assert.EqualValues(t, 1, c.SlabStats().Mapped, "one mmap for the view and the read")

	require.NoError(t, v.Release())
	require.NoError(t, v.Release())
	waitFor(t, func() bool { return o.srv.holds.count(readerID) == 0 }, "the unview")
	assert.Zero(t, o.mem.Held())
}

// TestSlabViewAnchor: a view's hold survives a cancelled transfer that
// closes a pooled connection (the first view's connection is the anchor,
// never used for transfers), and goes when the reader closes its client.
func TestSlabViewAnchor(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	want := o.put(t, 1, 1<<20, 5)
	o.put(t, 2, 4<<20, 6)
	c, readerID := slabReader(t, slabPSK)
	v, err := c.SHM().View(context.Background(), o.remote(1, 1<<20))
	require.NoError(t, err)
	defer v.Release()
	waitFor(t, func() bool { return o.srv.holds.count(readerID) == 1 }, "the hold")
	ctx, cancel := context.WithCancel(context.Background())
	c.afterMap = cancel // cancelled mid-copy: the pooled connection is closed
	dst, _ := hostDst(t, 4<<20)
	_, err = c.SHM().Read(ctx, o.remote(2, 4<<20), dst)
	require.ErrorIs(t, err, context.Canceled)
	c.afterMap = nil
	o.free(1)
	o.put(t, 3, 1<<20, 7)
	got, _ := tensor.BytesOf(v)
	assert.Equal(t, want, got)
	assert.Equal(t, 1, o.srv.holds.count(readerID), "the hold outlived the closed connection")
	require.NoError(t, c.Close())
	waitFor(t, func() bool { return o.srv.holds.count(readerID) == 0 }, "the holds of a reader that closed")
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func slabMetric(t *testing.T, c *Client, event string) float64 {
	t.Helper()
	eventMetric(t, c, "mapped", "pull") // checks the series count
	return gatherCounter(t, c, "tensorlane_shm_slab_events_total", map[string]string{"event": event})
}

// gatherCounter registers c's metrics on a fresh registry and returns one
// counter series.
func gatherCounter(t *testing.T, c *Client, name string, want map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(collector{c}))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s %v series", name, want)
	return 0
}

// TestSlabConcurrent: views, reads and frees of slab objects from several
// goroutines at once; every byte read is the object's, and every hold
// goes once the views are released.
func TestSlabConcurrent(t *testing.T) {
	o := newSlabOwner(t, slabPSK, nil)
	const n = 256 << 10
	wants := map[byte][]byte{}
	for id := byte(1); id <= 4; id++ {
		wants[id] = o.put(t, id, n, id*3)
	}
	c, readerID := slabReader(t, slabPSK)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 4; g++ {
		wg.Go(func() {
			for i := 0; i < 20; i++ {
				id := byte(1 + (g+i)%4)
				if i%2 == 0 {
					v, err := c.SHM().View(context.Background(), o.remote(id, n))
					if err != nil {
						errs <- err
						return
					}
					if p, _ := tensor.BytesOf(v); !bytes.Equal(p, wants[id]) {
						errs <- errors.New("view bytes differ")
					}
					v.Release()
					continue
				}
				dst, p := hostDst(t, n)
				if _, err := c.SHM().Read(context.Background(), o.remote(id, n), dst); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(p, wants[id]) {
					errs <- errors.New("read bytes differ")
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	waitFor(t, func() bool { return o.srv.holds.count(readerID) == 0 }, "every unview")
	assert.Zero(t, o.mem.Held())
	assert.EqualValues(t, 1, c.SlabStats().Mapped)
}
