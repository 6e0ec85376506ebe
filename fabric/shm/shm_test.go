package shm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// key is the shared helper under the short name this package's tests use.
var key = testhelp.Key

func dgx(t testing.TB) *topology.Cluster {
	t.Helper()
	c, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	return c
}

func harness(name string) fabrictest.Harness {
	return fabrictest.Harness{Name: name, Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink) fabrictest.Env {
		ownerKey, ownerID := key(t)
		readerKey, _ := key(t)
		srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: src, Sink: sink})
		require.NoError(t, err)
		cfg := Config{Security: fabric.Security{Identity: readerKey}, Topology: dgx(t)}
		var tr *Transport
		if name == fabric.P2P {
			tr, err = NewP2P(cfg)
		} else {
			tr, err = New(cfg)
		}
		require.NoError(t, err)
		t.Cleanup(func() {
			tr.Close()
			srv.Close()
		})
		return fabrictest.Env{
			Reader: tr,
			Remote: fabric.Remote{
				Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
				Peer:     ownerID.String(),
				Addrs:    map[string]string{fabric.SHM: srv.Addr()},
			},
			CloseOwner: func() { srv.Close() },
			Corrupt:    func() { srv.corrupt.Store(true) },
		}
	}}
}

func TestConformance(t *testing.T) {
	for _, name := range []string{fabric.P2P, fabric.SHM} {
		t.Run(name, func(t *testing.T) { fabrictest.Run(t, harness(name)) })
	}
}

// fixture is one owner with one object in a simulated arena, served in
// this process over the real socket, and a reader client.
type fixture struct {
	srv     *Server
	cli     *Client
	mem     *tensor.SimMemory
	obj     tensor.Buffer
	data    []byte
	ownerID peer.ID
	freed   atomic.Bool
	opens   atomic.Int64
	claim   fabric.Claim
}

func newFixture(t testing.TB, size int64, mutate func(*ServerConfig, *Config)) *fixture {
	f := &fixture{claim: fabric.Claim{Object: fabric.ObjectID{1}, Incarnation: 3, Token: []byte("0123456789abcdef")}}
	var err error
	f.mem, err = tensor.NewSimMemory(tensor.GPUDevice(0), size+1<<20)
	require.NoError(t, err)
	f.obj, err = f.mem.Alloc(context.Background(), size)
	require.NoError(t, err)
	f.data, _ = tensor.BytesOf(f.obj)
	fillPattern(f.data, 1)
	ownerKey, ownerID := key(t)
	f.ownerID = ownerID
	scfg := ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
		f.opens.Add(1)
		switch {
		case c.Object != f.claim.Object:
			return nil, fabric.ErrObjectNotFound
		case f.freed.Load():
			return nil, fabric.ErrObjectFreed
		case !bytes.Equal(c.Token, f.claim.Token):
			return nil, fabric.ErrUnauthorized
		}
		return nopRelease{f.obj}, nil
	})}
	readerKey, _ := key(t)
	ccfg := Config{Security: fabric.Security{Identity: readerKey}, Topology: dgx(t)}
	if mutate != nil {
		mutate(&scfg, &ccfg)
	}
	f.srv, err = Listen(scfg)
	require.NoError(t, err)
	f.cli, err = NewClient(ccfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		f.cli.Close()
		f.srv.Close()
		f.obj.Release()
		f.mem.Close()
	})
	return f
}

func (f *fixture) remote(n int64) fabric.Remote {
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer:     f.ownerID.String(), Addrs: map[string]string{fabric.SHM: f.srv.Addr()},
		Claim: f.claim, Length: n,
	}
}

// nopRelease hands out the object itself as the pin (host visible and
// exportable), with a Release that keeps it.
type nopRelease struct{ tensor.Buffer }

func (n nopRelease) Bytes() []byte { b, _ := tensor.BytesOf(n.Buffer); return b }
func (n nopRelease) Export(a tensor.Access) (tensor.Handle, error) {
	return tensor.ExportOf(n.Buffer, a)
}
func (n nopRelease) Release() error { return nil }

// fillPattern writes bytes that differ between positions and seeds.
// norace: the bytes are written before any transfer sees them, and checking
// each store made large fills cost seconds under -race.
//
//go:norace
func fillPattern(p []byte, seed byte) {
	for i := range p {
		p[i] = byte(i*7+i>>13) ^ seed
	}
}

func hostDst(t testing.TB, n int64) (tensor.Buffer, []byte) {
	b, err := tensor.NewHostMemory(0).Alloc(context.Background(), n)
	require.NoError(t, err)
	t.Cleanup(func() { b.Release() })
	p, _ := tensor.BytesOf(b)
	return b, p
}

// TestRevocation: a cached mapping never outlives its object. After the
// owner frees the object the next read fails with ErrObjectFreed, and the
// mapping is dropped.
func TestRevocation(t *testing.T) {
	const n = 3<<20 + 11
	f := newFixture(t, n, nil)
	tr := f.cli.SHM()
	dst, got := hostDst(t, n)
	for i := range 3 {
		_, err := tr.Read(context.Background(), f.remote(n), dst)
		require.NoError(t, err, "read %d", i)
		require.Equal(t, f.data, got[:n])
	}
	s := f.cli.CacheStats()
	assert.EqualValues(t, 1, s.Mapped, "one descriptor mapped for three reads")
	assert.EqualValues(t, 2, s.Hits)
	assert.Equal(t, 1, s.Live)

	f.freed.Store(true)
	// Whatever the arena holds now (the memory may be reused), the cached
	// mapping must not serve it.
	fillPattern(f.data, 0x55)
	clear(got)
	_, err := tr.Read(context.Background(), f.remote(n), dst)
	require.ErrorIs(t, err, fabric.ErrObjectFreed)
	assert.Equal(t, make([]byte, n), got[:n], "a refused read wrote into the destination")
	s = f.cli.CacheStats()
	assert.EqualValues(t, 1, revokedMetric(t, f.cli), "revoked counter")
	assert.EqualValues(t, 1, s.Revoked)
	assert.Equal(t, 0, s.Live)
	assert.EqualValues(t, 1, s.Unmapped)
}

// TestViewsShareClient: p2p and shm views of one client share its
// connections and mappings, and closing a view leaves the client working.
func TestViewsShareClient(t *testing.T) {
	const n = 1 << 20
	f := newFixture(t, n, nil)
	dst, got := hostDst(t, n)
	p2p, shmv := f.cli.P2P(), f.cli.SHM()
	st, err := p2p.Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	assert.Equal(t, fabric.P2P, st.Transport)
	require.NoError(t, p2p.Close())
	_, err = p2p.Read(context.Background(), f.remote(n), dst)
	require.ErrorIs(t, err, net.ErrClosed)
	st, err = shmv.Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	assert.Equal(t, fabric.SHM, st.Transport)
	assert.Equal(t, f.data, got[:n])
	assert.EqualValues(t, 1, f.cli.CacheStats().Mapped)
}

func TestReach(t *testing.T) {
	k, _ := key(t)
	withTopo, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(t)})
	require.NoError(t, err)
	noTopo, err := NewClient(Config{Security: fabric.Security{Identity: k}})
	require.NoError(t, err)
	t.Cleanup(func() { withTopo.Close(); noTopo.Close() })
	ep := func(proc, host string, dev tensor.DeviceID) fabric.Endpoint {
		return fabric.Endpoint{Process: proc, Host: host, Device: dev}
	}
	g0, g1, cpu := tensor.GPUDevice(0), tensor.GPUDevice(1), tensor.HostDevice
	for _, c := range []struct {
		name     string
		tr       *Transport
		src, dst fabric.Endpoint
		want     bool
	}{
		{"p2p linked devices", withTopo.P2P(), ep("a", "h0", g0), ep("b", "h0", g1), true},
		{"p2p same process", withTopo.P2P(), ep("a", "h0", g0), ep("a", "h0", g1), false},
		{"p2p other host", withTopo.P2P(), ep("a", "h0", g0), ep("b", "h1", g1), false},
		{"p2p to host memory", withTopo.P2P(), ep("a", "h0", g0), ep("b", "h0", cpu), false},
		{"p2p without topology", noTopo.P2P(), ep("a", "h0", g0), ep("b", "h0", g1), false},
		{"shm linked devices", withTopo.SHM(), ep("a", "h0", g0), ep("b", "h0", g1), true},
		{"shm to host memory", withTopo.SHM(), ep("a", "h0", g0), ep("b", "h0", cpu), true},
		{"shm without topology", noTopo.SHM(), ep("a", "h0", g0), ep("b", "h0", g1), true},
		{"shm same process", noTopo.SHM(), ep("a", "h0", g0), ep("a", "h0", g1), false},
		{"shm other host", noTopo.SHM(), ep("a", "h0", g0), ep("b", "h1", g0), false},
		{"shm no host", noTopo.SHM(), ep("a", "", g0), ep("b", "", g0), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cost, ok := c.tr.Reach(c.src, c.dst)
			assert.Equal(t, c.want, ok, cost.Reason)
			assert.NotEmpty(t, cost.Reason)
			if ok {
				assert.Positive(t, cost.GBps)
			}
		})
	}
}

// TestWrongPeer: a reader that expects another owner identity is refused
// in the handshake.
func TestWrongPeer(t *testing.T) {
	f := newFixture(t, 4096, nil)
	_, other := key(t)
	r := f.remote(4096)
	r.Peer = other.String()
	dst, _ := hostDst(t, 4096)
	_, err := f.cli.SHM().Read(context.Background(), r, dst)
	require.ErrorIs(t, err, fabric.ErrUnauthorized)
}

func TestBadRemote(t *testing.T) {
	f := newFixture(t, 4096, nil)
	dst, _ := hostDst(t, 4096)
	for _, c := range []struct {
		name   string
		mutate func(*fabric.Remote)
		want   error
	}{
		{"no address", func(r *fabric.Remote) { r.Addrs = nil }, fabric.ErrNoPath},
		{"bad peer id", func(r *fabric.Remote) { r.Peer = "not-a-peer" }, fabric.ErrBadRequest},
		{"negative length", func(r *fabric.Remote) { r.Length = -1 }, fabric.ErrBadRequest},
		{"no such socket", func(r *fabric.Remote) { r.Addrs = map[string]string{fabric.SHM: f.srv.Addr() + ".gone"} }, fabric.ErrPeerClosed},
		{"too long for dst", func(r *fabric.Remote) { r.Length = 4097 }, tensor.ErrTooSmall},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := f.remote(4096)
			c.mutate(&r)
			_, err := f.cli.SHM().Read(context.Background(), r, dst)
			require.ErrorIs(t, err, c.want)
		})
	}
}

// TestNoSink: a server without a Sink refuses pushes with a typed error.
func TestNoSink(t *testing.T) {
	f := newFixture(t, 4096, nil)
	src, _ := hostDst(t, 4096)
	_, err := f.cli.SHM().Write(context.Background(), src, f.remote(4096))
	require.ErrorIs(t, err, fabric.ErrBadRequest)
}

// TestHoldTimeout: a reader that maps and never says done loses the pin
// after HoldTimeout, and its read fails.
func TestHoldTimeout(t *testing.T) {
	f := newFixture(t, 1<<20, func(s *ServerConfig, c *Config) { s.HoldTimeout = 50 * time.Millisecond })
	hold, mapped := make(chan struct{}), make(chan struct{})
	f.cli.afterMap = func() { close(mapped); <-hold }
	dst, _ := hostDst(t, 1<<20)
	done := make(chan error, 1)
	go func() {
		_, err := f.cli.SHM().Read(context.Background(), f.remote(1<<20), dst)
		done <- err
	}()
	<-mapped
	// Release the reader only once the owner has given up on it.
	deadline := time.Now().Add(30 * time.Second)
	for f.srv.connCount() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	require.Zero(t, f.srv.connCount(), "the owner kept a connection past HoldTimeout")
	close(hold)
	select {
	case err := <-done:
		require.ErrorIs(t, err, fabric.ErrPeerClosed)
	case <-time.After(30 * time.Second):
		t.Fatal("HUNG")
	}
}

// TestGuardedCopyFault: an arena file that shrinks under a mapping yields
// ErrCorrupt, not a crash.
func TestGuardedCopyFault(t *testing.T) {
	fd, err := unix.MemfdCreate("shm-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	const n = 1 << 20
	require.NoError(t, unix.Ftruncate(fd, n))
	// Mapped directly: mapRegion refuses a file that is not size-sealed.
	data, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(data)
	require.NoError(t, unix.Ftruncate(fd, 0))
	err = guardedCopy(context.Background(), make([]byte, n), data, 64<<10, nil)
	require.ErrorIs(t, err, fabric.ErrCorrupt)
}

func TestMapRegionChecks(t *testing.T) {
	fd, err := unix.MemfdCreate("shm-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 64<<10))
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	require.NoError(t, err)
	_, _, err = mapRegion(fd, 60<<10, 8<<10, false)
	require.ErrorIs(t, err, fabric.ErrCorrupt, "range beyond the file")
	dir, err := unix.Open(os.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(dir)
	_, _, err = mapRegion(dir, 0, 4096, false)
	require.ErrorIs(t, err, fabric.ErrCorrupt, "a directory is no arena")
	data, base, err := mapRegion(fd, 5000, 100, false)
	require.NoError(t, err)
	assert.EqualValues(t, 4096, base)
	assert.Len(t, data, 4096)
	unix.Munmap(data)
}

func TestPrivateDir(t *testing.T) {
	root := t.TempDir()
	open := filepath.Join(root, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, privateDir(open))
	fi, err := os.Stat(open)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "an open directory of ours is closed")

	file := filepath.Join(root, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.Error(t, privateDir(file))

	link := filepath.Join(root, "link")
	require.NoError(t, os.Symlink(open, link))
	require.Error(t, privateDir(link), "a symlink could point anywhere")

	if os.Getuid() == 0 {
		theirs := filepath.Join(root, "theirs")
		require.NoError(t, os.Mkdir(theirs, 0o700))
		require.NoError(t, os.Chown(theirs, 65534, 65534))
		require.Error(t, privateDir(theirs), "another user's directory")
	}
}

// TestPeerCred: both ends see each other's uid.
func TestPeerCred(t *testing.T) {
	path := filepath.Join(DefaultDir(), socketName())
	require.NoError(t, privateDir(DefaultDir()))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.AcceptUnix()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, sameUser(c))
	require.NoError(t, sameUser(s))
	uid, err := peerUID(s)
	require.NoError(t, err)
	assert.Equal(t, os.Getuid(), uid)
}

func TestServerConfig(t *testing.T) {
	k, _ := key(t)
	src := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound })
	_, err := Listen(ServerConfig{Source: src})
	require.Error(t, err)
	_, err = Listen(ServerConfig{Security: fabric.Security{Identity: k}, Source: src, Path: "/tmp/" + string(bytes.Repeat([]byte("x"), 120))})
	require.Error(t, err)
	s, err := Listen(ServerConfig{Security: fabric.Security{Identity: k}, Source: src})
	require.NoError(t, err)
	_, err = os.Stat(s.Addr())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	_, err = os.Stat(s.Addr())
	require.True(t, errors.Is(err, os.ErrNotExist), "socket removed on Close: %v", err)
	_, err = NewClient(Config{})
	require.Error(t, err)
}

// TestCancelDuringCopy: cancelling between the grant and the end of the
// copy stops the copy at the next chunk, releases the owner's pin (the
// connection closes) and leaves the client usable.
func TestCancelDuringCopy(t *testing.T) {
	const n = 16 << 20
	var pins atomic.Int64
	f := newFixture(t, n, func(s *ServerConfig, c *Config) {
		inner := s.Source
		s.Source = fabric.SourceFunc(func(ctx context.Context, cl fabric.Claim) (tensor.Buffer, error) {
			b, err := inner.Open(ctx, cl)
			if err != nil {
				return nil, err
			}
			pins.Add(1)
			return &countedPin{nopRelease: b.(nopRelease), pins: &pins}, nil
		})
		c.ChunkSize = 1 << 20
	})
	ctx, cancel := context.WithCancel(context.Background())
	f.cli.afterMap = cancel
	dst, _ := hostDst(t, n)
	_, err := f.cli.SHM().Read(ctx, f.remote(n), dst)
	require.ErrorIs(t, err, context.Canceled)
	f.cli.afterMap = nil
	deadline := time.Now().Add(15 * time.Second)
	for pins.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	require.Zero(t, pins.Load(), "the owner still holds the pin of a cancelled read")
	_, err = f.cli.SHM().Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
}

type countedPin struct {
	nopRelease
	pins *atomic.Int64
	once atomic.Bool
}

func (p *countedPin) Release() error {
	if !p.once.Swap(true) {
		p.pins.Add(-1)
	}
	return nil
}

// TestStalledOwnerTimeout: an owner that never answers fails the read with
// ErrStalled after StallTimeout, with no help from the caller's context.
func TestStalledOwnerTimeout(t *testing.T) {
	release := make(chan struct{})
	f := newFixture(t, 4096, func(s *ServerConfig, c *Config) {
		s.Source = fabric.SourceFunc(func(ctx context.Context, cl fabric.Claim) (tensor.Buffer, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, fabric.ErrObjectNotFound
		})
		c.StallTimeout = 100 * time.Millisecond
	})
	defer close(release)
	dst, _ := hostDst(t, 4096)
	start := time.Now()
	_, err := f.cli.SHM().Read(context.Background(), f.remote(4096), dst)
	require.ErrorIs(t, err, fabric.ErrStalled)
	assert.Less(t, time.Since(start), 30*time.Second, "bounded by StallTimeout, not the default")
}

// TestClusterKey: an owner with a cluster key admits only readers that
// hold the same key.
func TestClusterKey(t *testing.T) {
	psk := []byte("cluster-key-0123456789abcdef0123")
	for _, c := range []struct {
		name   string
		reader []byte
		want   error
	}{
		{"same key", psk, nil},
		{"no key", nil, fabric.ErrUnauthorized},
		{"other key", []byte("another-cluster-key-0123456789ab"), fabric.ErrUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, 4096, func(s *ServerConfig, cc *Config) { s.ClusterKey, cc.ClusterKey = psk, c.reader })
			dst, got := hostDst(t, 4096)
			_, err := f.cli.SHM().Read(context.Background(), f.remote(4096), dst)
			if c.want == nil {
				require.NoError(t, err)
				require.Equal(t, f.data, got)
				return
			}
			require.ErrorIs(t, err, c.want)
		})
	}
}

// revokedMetric registers c's metrics on a fresh registry and returns the
// value of the revoked-events series of reads.
func revokedMetric(t *testing.T, c *Client) float64 { return eventMetric(t, c, "revoked", "pull") }

// eventMetric registers c's metrics on a fresh registry and returns the
// value of one mapping-events series.
func eventMetric(t *testing.T, c *Client, event, direction string) float64 {
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(collector{c}))
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 28, n, "two gauges and five event counters per direction; two slab gauges and seven slab counters; prefetch bytes and prefetches in flight; five batch counters")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "tensorlane_shm_mapping_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["event"] == event && labels["direction"] == direction {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s/%s series", event, direction)
	return 0
}

// TestSweepStale: a socket left by a server that died (SIGKILL leaves the
// file) is removed by the next Listen in that directory; live ones stay.
func TestSweepStale(t *testing.T) {
	dir := t.TempDir()
	// A pid that does not exist: beyond pid_max.
	stale := filepath.Join(dir, "shm-4194305-000000000000.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	require.NoError(t, err)
	ln.SetUnlinkOnClose(false)
	ln.Close()
	// Listening, with a dead pid in its name: it stays.
	alive := filepath.Join(dir, "shm-4194306-000000000000.sock")
	ln2, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: alive, Net: "unixpacket"})
	require.NoError(t, err)
	defer ln2.Close()
	go func() {
		if c, err := ln2.Accept(); err == nil {
			c.Close()
		}
	}()
	k, _ := key(t)
	srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: k}, Dir: dir, Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) {
		return nil, fabric.ErrObjectNotFound
	})})
	require.NoError(t, err)
	defer srv.Close()
	_, err = os.Stat(stale)
	assert.True(t, errors.Is(err, os.ErrNotExist), "stale socket removed: %v", err)
	_, err = os.Stat(alive)
	assert.NoError(t, err, "a socket someone listens on stays")
}

// TestCacheLimits: the cache evicts the least recently used mapping beyond
// its limits, never one in use, and unmaps an evicted mapping only when its
// last user lets go.
func TestCacheLimits(t *testing.T) {
	mk := func(c *cache, obj byte, size int) *mapping {
		data, err := unix.Mmap(-1, 0, size, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		require.NoError(t, err)
		m := &mapping{key: cacheKey{owner: "o", object: fabric.ObjectID{obj}}, id: uint64(obj), objLen: int64(size), data: data, refs: 1}
		c.insert(m)
		return m
	}
	c := newCache(2, 1<<20)
	a := mk(c, 1, 4096)
	c.release(a)
	b := mk(c, 2, 4096) // b stays in use
	require.NotNil(t, c.acquire(a.key))
	c.release(a) // a is now the most recently used
	d := mk(c, 3, 4096)
	c.release(d)
	s := c.snapshot()
	assert.Equal(t, 2, s.Live)
	assert.EqualValues(t, 1, s.Evicted)
	assert.Nil(t, c.acquire(b.key), "b was least recently used")
	assert.NotNil(t, b.data, "b is still mapped: its user holds it")
	c.release(b)
	assert.Nil(t, b.data, "unmapped once its user let go")

	// The byte limit: one large mapping pushes the others out.
	big := mk(c, 4, 1<<20)
	c.release(big)
	s = c.snapshot()
	assert.Equal(t, 1, s.Live)
	assert.EqualValues(t, 1<<20, s.Bytes)

	c.purge("o")
	s = c.snapshot()
	assert.Equal(t, 0, s.Live)
	assert.Zero(t, s.Bytes)
	assert.Nil(t, big.data)
}

// TestReadDescriptorIsReadOnly: the descriptor a reader gets cannot be
// mapped writable, and once an object was shared read-only (and sealed) a
// push into it is refused; a pusher's descriptor of a sink is writable.
func TestReadDescriptorIsReadOnly(t *testing.T) {
	f := newFixture(t, 8192, nil)
	pin := nopRelease{f.obj}
	g, fd, _, err := f.srv.exportHandle(pin, request{op: opRead, length: 8192}, nil)
	require.NoError(t, err)
	require.NotZero(t, g.flags&flagFD)
	defer unix.Close(fd)
	_, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.ErrorIs(t, err, unix.EACCES, "a read descriptor maps writable")
	ro, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	unix.Munmap(ro)
	_, _, _, err = f.srv.exportHandle(pin, request{op: opPush, length: 8192}, nil)
	require.ErrorIs(t, err, tensor.ErrExportAccess, "a push into an object shared read-only")

	// A reader that already maps the object gets no descriptor at all.
	g2, fd2, _, err := f.srv.exportHandle(pin, request{op: opRead, length: 8192, have: g.mapID}, nil)
	require.NoError(t, err)
	assert.Equal(t, -1, fd2)
	assert.Zero(t, g2.flags&flagFD)

	sink, err := f.mem.Alloc(context.Background(), 8192)
	require.NoError(t, err)
	defer sink.Release()
	_, pfd, _, err := f.srv.exportHandle(nopRelease{sink}, request{op: opPush, length: 8192}, nil)
	require.NoError(t, err)
	defer unix.Close(pfd)
	rw, err := unix.Mmap(pfd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	unix.Munmap(rw)
}

// A pooled connection the server reaped as idle is replaced on the next
// read, which succeeds.
func TestPooledConnReapedAsIdle(t *testing.T) {
	const n = 64 << 10
	f := newFixture(t, n, func(s *ServerConfig, _ *Config) { s.Limits.IdleTimeout = 100 * time.Millisecond })
	ctx := context.Background()
	for i := range 2 {
		dst, p := hostDst(t, n)
		_, err := f.cli.SHM().Read(ctx, f.remote(n), dst)
		require.NoError(t, err, "read %d", i)
		require.Equal(t, f.data, p)
		require.Eventually(t, func() bool { return f.srv.connCount() == 0 }, 20*time.Second, 5*time.Millisecond,
			"the server reaps the idle pooled connection")
	}
}
