package tensor

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mapFile maps the whole file behind fd read-only, as a holder could.
func mapFile(t *testing.T, fd int) []byte {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	p, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(p) })
	return p
}

// TestViewShareReachesOnlyTheView: a 16 KiB view in the middle of a 1 MiB
// buffer full of a secret is shared as a private copy: the whole file
// behind the handle (mapped or read) holds the view's bytes and zeros,
// never the secret; the copy is staged once, accounted on the device,
// sealed read-only, and returned on Release. The parent is not exported
// (so not sealed against later pushes).
func TestViewShareReachesOnlyTheView(t *testing.T) {
	for name, m := range memories(t) {
		t.Run(name, func(t *testing.T) {
			const size, start, n = 1 << 20, 512<<10 + 100, 16 << 10 // start not page-aligned
			parent, p := filled(t, m, size, 0x5E)
			for i := start; i < start+n; i++ {
				p[i] = byte(i * 7)
			}
			want := append([]byte(nil), p[start:start+n]...)
			used := m.Stats().Used
			v := NewViewShare(m, parent, start, start+n)
			assert.Zero(t, v.Staged(), "nothing staged before the first grant")

			h, staged, err := v.Export(ReadOnly)
			require.NoError(t, err)
			defer unix.Close(h.FD)
			assert.Equal(t, int64(n), staged)
			assert.Equal(t, Handle{FD: h.FD, Size: pageRound(n), Offset: 0, Length: n, Start: start, Access: ReadOnly, Copy: true}, h)
			assert.Equal(t, int64(n), v.Staged())
			assert.GreaterOrEqual(t, m.Stats().Used-used, int64(n), "the copy is accounted on the device")

			for how, file := range map[string][]byte{"pread": readFile(t, h.FD), "mmap": mapFile(t, h.FD)} {
				require.Len(t, file, int(pageRound(n)), how)
				assert.Equal(t, want, file[h.Offset:h.Offset+h.Length], how)
				assert.Equal(t, make([]byte, len(file)-n), file[n:], "%s: the page tail is zero", how)
				assert.False(t, bytes.Contains(file, bytes.Repeat([]byte{0x5E}, 64)), "%s: the parent's secret is reachable", how)
			}
			_, err = unix.Pwrite(h.FD, []byte{1}, 0)
			assert.Error(t, err, "a read-only grant writes")

			// Later grants share the same copy: no second staging.
			h2, staged, err := v.Export(ReadOnly)
			require.NoError(t, err)
			unix.Close(h2.FD)
			assert.Zero(t, staged)
			_, _, err = v.Export(Writable)
			assert.ErrorIs(t, err, ErrExportAccess)

			// The parent was never exported: it can still be pushed into.
			ph, err := ExportOf(parent, Writable)
			require.NoError(t, err)
			unix.Close(ph.FD)

			require.NoError(t, v.Release())
			require.NoError(t, v.Release(), "idempotent")
			assert.Equal(t, used, m.Stats().Used, "the copy went back to the device")
			assert.Zero(t, v.Staged())
			_, _, err = v.Export(ReadOnly)
			assert.ErrorIs(t, err, ErrReleased)
			assert.Equal(t, want, readFile(t, h.FD), "a holder keeps what it was granted")
		})
	}
}

// TestViewShareWholeIsZeroCopy: a view that is its whole allocation is
// exported as it is: no copy, the allocation's own file.
func TestViewShareWholeIsZeroCopy(t *testing.T) {
	for name, m := range memories(t) {
		t.Run(name, func(t *testing.T) {
			const n = 10000
			parent, _ := filled(t, m, n, 1)
			used := m.Stats().Used
			v := NewViewShare(m, parent, 0, n)
			defer v.Release()
			h, staged, err := v.Export(ReadOnly)
			require.NoError(t, err)
			defer unix.Close(h.FD)
			assert.Zero(t, staged)
			assert.Zero(t, v.Staged())
			assert.Equal(t, used, m.Stats().Used)
			assert.Equal(t, Handle{FD: h.FD, Size: pageRound(n), Length: n, Access: ReadOnly}, h)
			direct, err := ExportOf(parent, ReadOnly)
			require.NoError(t, err)
			defer unix.Close(direct.FD)
			var a, b unix.Stat_t
			require.NoError(t, unix.Fstat(h.FD, &a))
			require.NoError(t, unix.Fstat(direct.FD, &b))
			assert.Equal(t, b.Ino, a.Ino, "the allocation's own file")
		})
	}
}

// TestViewShareOutOfMemory: when the device cannot hold the copy, Export
// says so with an error that matches ErrNotExportable (the caller falls
// back to a path that needs no handle) and ErrOutOfMemory, stages nothing,
// and succeeds later once memory is free.
func TestViewShareOutOfMemory(t *testing.T) {
	m, err := NewSimMemory(GPUDevice(0), 1<<20)
	require.NoError(t, err)
	defer m.Close()
	parent, _ := filled(t, m, 768<<10, 3)
	hog, err := m.Alloc(context.Background(), 256<<10)
	require.NoError(t, err)
	v := NewViewShare(m, parent, 4096, 4096+64<<10)
	defer v.Release()
	_, _, err = v.Export(ReadOnly)
	require.ErrorIs(t, err, ErrViewCopy)
	require.ErrorIs(t, err, ErrNotExportable)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Zero(t, v.Staged())
	require.NoError(t, hog.Release())
	h, staged, err := v.Export(ReadOnly)
	require.NoError(t, err)
	unix.Close(h.FD)
	assert.Equal(t, int64(64<<10), staged)
}
