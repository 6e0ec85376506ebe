package shm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp/caps"
	"github.com/tensorlane/tensorlane/tensor"
)

// The tests below are the reader's (or pusher's) view of a grant: they keep
// a duplicate of the descriptor the owner passed and try, as a hostile peer
// would, to reach more than the granted object through it. Before grants
// were per allocation, the descriptor was the owner's whole device arena:
// every one of them failed.

// received collects duplicates of the descriptors c receives.
type received struct {
	mu  sync.Mutex
	fds []int
}

func receive(t *testing.T, c *Client) *received {
	r := &received{}
	c.onFD = func(fd int) {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return
		}
		r.mu.Lock()
		r.fds = append(r.fds, d)
		r.mu.Unlock()
	}
	t.Cleanup(func() { closeAll(r.fds) })
	return r
}

func (r *received) only(t *testing.T) int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.fds, 1, "descriptors received")
	return r.fds[0]
}

// wholeFile reads everything the descriptor reaches.
func wholeFile(t *testing.T, fd int) []byte {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	p := make([]byte, st.Size)
	n, err := unix.Pread(fd, p, 0)
	require.NoError(t, err)
	return p[:n]
}

func secretAlloc(t *testing.T, m *tensor.SimMemory, n int64, b byte) []byte {
	t.Helper()
	buf, err := m.Alloc(context.Background(), n)
	require.NoError(t, err)
	t.Cleanup(func() { buf.Release() })
	p, _ := tensor.BytesOf(buf)
	for i := range p {
		p[i] = b
	}
	return p
}

// TestGrantReachesOnlyTheObject: a reader granted object A gets a
// descriptor of A's allocation alone: not another actor's object B of the
// same device, not an object C allocated after the grant.
func TestGrantReachesOnlyTheObject(t *testing.T) {
	const n = 64<<10 + 3
	f := newFixture(t, n, nil)
	secretAlloc(t, f.mem, 256<<10, 0xB5) // B: never shared
	got := receive(t, f.cli)
	dst, p := hostDst(t, n)
	_, err := f.cli.SHM().Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	require.Equal(t, f.data, p[:n])
	secretAlloc(t, f.mem, 256<<10, 0xC5) // C: allocated after the grant

	fd := got.only(t)
	file := wholeFile(t, fd)
	require.Equal(t, int((n+pageSize-1)&^(pageSize-1)), len(file), "the descriptor reaches more than the object's pages")
	assert.Equal(t, f.data, file[:n])
	assert.Equal(t, make([]byte, len(file)-n), file[n:], "the page tail past the object is zero")
	for _, secret := range []byte{0xB5, 0xC5} {
		assert.False(t, bytes.Contains(file, bytes.Repeat([]byte{secret}, 256)), "secret %#x visible through the grant", secret)
	}
}

// TestGrantRefusesWrite: the reader cannot write the owner's object
// through its grant: not through the descriptor (read-only), not by
// reopening it for writing through /proc (refused to an unprivileged
// process of our user; a privileged one that may reopen it still cannot
// write, map it writable, truncate it or punch holes in it). Nor can it
// reopen the owner's own read-write descriptors through /proc/PID/fd.
func TestGrantRefusesWrite(t *testing.T) {
	const n = 1 << 20
	f := newFixture(t, n, nil)
	got := receive(t, f.cli)
	dst, _ := hostDst(t, n)
	_, err := f.cli.SHM().Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	fd := got.only(t)

	_, err = unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	assert.ErrorIs(t, err, unix.EACCES, "the grant maps writable")
	_, err = unix.Pwrite(fd, []byte{1}, 0)
	assert.ErrorIs(t, err, unix.EBADF, "the grant is writable")

	reopen := "/proc/self/fd/" + strconv.Itoa(fd)
	owned := ownerMemfds(t, "/proc/self/fd", "tensorlane-sim")
	require.NotEmpty(t, owned, "the owner's own descriptors")
	caps.WithoutDACOverride(t, func() {
		for _, path := range append([]string{reopen}, owned...) {
			w, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(w)
			}
			if path != reopen && errors.Is(err, unix.ENOENT) {
				continue // an owner descriptor another test closed since it was listed
			}
			assert.ErrorIs(t, err, unix.EACCES, "%s reopened for writing", path)
		}
	})
	if w, err := unix.Open(reopen, unix.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
		// Privileged: reopening is allowed, writing is not (sealed).
		defer unix.Close(w)
		_, err = unix.Pwrite(w, []byte{1}, 0)
		assert.ErrorIs(t, err, unix.EPERM, "write through the reopened grant")
		_, err = unix.Mmap(w, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		assert.ErrorIs(t, err, unix.EPERM, "writable mapping of the reopened grant")
		assert.ErrorIs(t, unix.Ftruncate(w, 0), unix.EPERM, "truncate the owner's object")
		assert.ErrorIs(t, unix.Fallocate(w, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, n), unix.EPERM)
	}
	file := wholeFile(t, fd)
	require.Equal(t, n, len(file), "the object's file was resized")
	assert.Equal(t, f.data, file, "the object is unchanged")
}

// TestCrossProcessGrant: the same, against an owner in another process:
// the reader's descriptor is the object's allocation alone, and neither it
// nor the owner's own descriptors (/proc/PID/fd/N) can be reopened for
// writing by an unprivileged process of the same user.
func TestCrossProcessGrant(t *testing.T) {
	sizes := []int64{3<<20 + 5, 1 << 20}
	h := startHelper(t, sizes...)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(t)})
	require.NoError(t, err)
	defer cli.Close()
	got := receive(t, cli)
	dst, p := hostDst(t, sizes[0])
	_, err = cli.SHM().Read(context.Background(), h.remote(0, 0, sizes[0]), dst)
	require.NoError(t, err)
	require.Equal(t, -1, checkWords(p, h.info.Objects[0].Seed, 0, sizes[0]))

	fd := got.only(t)
	file := wholeFile(t, fd)
	require.Equal(t, int((sizes[0]+pageSize-1)&^(pageSize-1)), len(file), "the descriptor reaches more than the object")
	assert.Equal(t, p, file[:sizes[0]])
	other := make([]byte, sizes[1])
	fillWords(other, h.info.Objects[1].Seed)
	assert.False(t, bytes.Contains(file, other[:4096]), "the other object is visible through the grant")

	owned := ownerMemfds(t, "/proc/"+strconv.Itoa(h.cmd.Process.Pid)+"/fd", "tensorlane-sim")
	// One memfd per allocation, plus the read-only open the owner keeps of
	// the one it shared.
	require.Len(t, owned, len(sizes)+1, "the owner's descriptors of its allocations")
	caps.WithoutDACOverride(t, func() {
		for _, path := range append([]string{"/proc/self/fd/" + strconv.Itoa(fd)}, owned...) {
			w, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(w)
			}
			assert.ErrorIs(t, err, unix.EACCES, "%s reopened for writing", path)
		}
	})
}

// ownerMemfds lists the memfds named prefix* among the descriptors in dir
// (a /proc/PID/fd), as paths another process would open.
func ownerMemfds(t *testing.T, dir, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(target, "/memfd:"+prefix) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// TestGrantRevokedAfterFree: after the owner frees the object and reuses
// the memory for new objects of the same size, the reader's mapping of its
// old grant never shows the new owner's bytes, and the next read is
// refused.
func TestGrantRevokedAfterFree(t *testing.T) {
	const n = 256 << 10
	f := newFixture(t, n, nil)
	got := receive(t, f.cli)
	dst, _ := hostDst(t, n)
	_, err := f.cli.SHM().Read(context.Background(), f.remote(n), dst)
	require.NoError(t, err)
	fd := got.only(t)
	view, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(view)
	want := bytes.Clone(f.data)

	f.freed.Store(true)
	require.NoError(t, f.obj.Release())
	for i := range 4 {
		secretAlloc(t, f.mem, n, byte(0xD0+i)) // the next owners of the memory
	}
	assert.Equal(t, want, view, "a freed grant shows memory reused for another object")
	assert.Equal(t, want, wholeFile(t, fd)[:n])
	_, err = f.cli.SHM().Read(context.Background(), f.remote(n), dst)
	require.Error(t, err)
	assert.Zero(t, f.cli.CacheStats().Live, "the cached mapping was dropped")
}

// TestPushGrantReachesOnlySlot: a pusher given one slot gets a descriptor
// of that slot alone: it can write the slot, cannot reach the other
// objects of the slot runtime's device, and cannot resize the slot's file.
func TestPushGrantReachesOnlySlot(t *testing.T) {
	const n = 32<<10 + 7
	f := newSinkFixture(t, n)
	other := secretAlloc(t, f.mem, 128<<10, 0xE5) // another object of the device
	got := receive(t, f.cli)
	src, p := hostDst(t, n)
	fillPattern(p, 0x42)
	_, err := f.cli.SHM().Write(context.Background(), src, f.remote(n))
	require.NoError(t, err)
	require.Equal(t, p[:n], f.data)

	fd := got.only(t)
	file := wholeFile(t, fd)
	require.Equal(t, int((n+pageSize-1)&^(pageSize-1)), len(file), "the pusher's descriptor reaches more than the slot's pages")
	assert.Equal(t, p[:n], file[:n])
	assert.False(t, bytes.Contains(file, bytes.Repeat([]byte{0xE5}, 256)), "another object visible through the push grant")
	w, err := unix.Mmap(fd, 0, len(file), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	for i := range w {
		w[i] = 0x99 // the whole file: the slot, and nothing else
	}
	require.NoError(t, unix.Munmap(w))
	assert.Equal(t, bytes.Repeat([]byte{0x99}, n), f.data)
	assert.Equal(t, bytes.Repeat([]byte{0xE5}, 128<<10), other, "a push grant wrote outside its slot")
	assert.ErrorIs(t, unix.Ftruncate(fd, 1<<30), unix.EPERM, "the pusher grew the slot's file")
	assert.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM, "the pusher shrank the slot's file under its owner")
}

// viewPin is an owner's pin of a published view [start, end) of a larger
// allocation, shared as rdt shares one: through a tensor.ViewShare.
type viewPin struct {
	tensor.Buffer
	share *tensor.ViewShare
	end   int64
}

func (v viewPin) Len() int64 { return v.end }
func (v viewPin) Bytes() []byte {
	b, _ := tensor.BytesOf(v.Buffer)
	return b[:v.end]
}
func (v viewPin) Export(a tensor.Access) (tensor.Handle, error) {
	h, _, err := v.share.Export(a)
	return h, err
}
func (v viewPin) Release() error { return nil }

// TestViewGrantReachesOnlyTheView: the object is a 16 KiB view in the
// middle of a 1 MiB allocation that holds a secret. Readers over shm and
// p2p get the view's bytes, and the descriptor each received (mapped whole,
// or read with pread) holds the view and zeros, never the secret around it.
// Before views were staged, the descriptor was the whole parent allocation.
func TestViewGrantReachesOnlyTheView(t *testing.T) {
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
	want := append([]byte(nil), f.data[start:start+n]...)
	r := f.remote(n)
	r.Offset = start

	for _, tr := range []string{fabric.SHM, fabric.P2P} {
		t.Run(tr, func(t *testing.T) {
			k, _ := key(t)
			cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(t)})
			require.NoError(t, err)
			defer cli.Close()
			got := receive(t, cli)
			dst, p := hostDst(t, n)
			transport := cli.SHM()
			if tr == fabric.P2P {
				transport = cli.P2P()
			}
			stats, err := transport.Read(context.Background(), r, dst)
			require.NoError(t, err)
			require.Equal(t, want, p)
			assert.True(t, stats.ViewCopy, "the stats say the owner served a copy of the view")

			fd := got.only(t)
			var st unix.Stat_t
			require.NoError(t, unix.Fstat(fd, &st))
			mapped, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
			require.NoError(t, err)
			defer unix.Munmap(mapped)
			for how, file := range map[string][]byte{"pread": wholeFile(t, fd), "mmap": mapped} {
				require.Equal(t, int((n+pageSize-1)&^(pageSize-1)), len(file), "%s: the descriptor reaches more than the view's pages", how)
				assert.Equal(t, want, file[:n], how)
				assert.Equal(t, make([]byte, len(file)-n), file[n:], "%s: the page tail past the view is zero", how)
				assert.False(t, bytes.Contains(file, bytes.Repeat([]byte{0x5E}, 64)), "%s: the parent's secret is reachable", how)
			}
		})
	}
	assert.Equal(t, int64(n), share.Staged(), "staged once for both readers")
}

// TestCrossProcessViewGrant: the owner is a second process that publishes
// a 16 KiB view in the middle of a 1 MiB allocation. The descriptor this
// process receives over p2p (mapped whole, or read with pread) holds the
// view's bytes alone, none of the parent's around it.
func TestCrossProcessViewGrant(t *testing.T) {
	const size, start, n = 1 << 20, 512<<10 + 100, 16 << 10
	t.Setenv(helperViewEnv, strconv.Itoa(start)+","+strconv.Itoa(start+n))
	h := startHelper(t, size)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(t)})
	require.NoError(t, err)
	defer cli.Close()
	got := receive(t, cli)
	parent := make([]byte, size)
	fillWords(parent, h.info.Objects[0].Seed)
	dst, p := hostDst(t, n)
	stats, err := cli.P2P().Read(context.Background(), h.remote(0, start, n), dst)
	require.NoError(t, err)
	require.Equal(t, parent[start:start+n], p)
	assert.True(t, stats.ViewCopy)
	_, err = cli.P2P().Read(context.Background(), h.remote(0, 0, n), dst)
	require.ErrorIs(t, err, fabric.ErrUnauthorized, "a range outside the view")

	fd := got.only(t)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	mapped, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mapped)
	for how, file := range map[string][]byte{"pread": wholeFile(t, fd), "mmap": mapped} {
		require.Equal(t, int((n+pageSize-1)&^(pageSize-1)), len(file), "%s: the descriptor reaches more than the view's pages", how)
		assert.Equal(t, parent[start:start+n], file[:n], how)
		assert.Equal(t, make([]byte, len(file)-n), file[n:], "%s: the page tail past the view is zero", how)
		for _, at := range []int{0, start - 4096, start + n, size - 4096} {
			assert.False(t, bytes.Contains(file, parent[at:at+4096]), "%s: the parent's bytes at %d are reachable", how, at)
		}
	}
}
