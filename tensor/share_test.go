package tensor

import (
	"bytes"
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tensorlane/tensorlane/internal/testhelp/caps"
	"golang.org/x/sys/unix"
)

// memories returns each kind of memory that exports, fresh per test.
func memories(t *testing.T) map[string]Memory {
	sim, err := NewSimMemory(GPUDevice(0), 64<<20)
	require.NoError(t, err)
	host := NewHostMemory(0)
	t.Cleanup(func() {
		sim.Close()
		host.Close()
	})
	return map[string]Memory{"sim": sim, "host": host}
}

func filled(t *testing.T, m Memory, n int64, b byte) (Buffer, []byte) {
	t.Helper()
	buf, err := m.Alloc(context.Background(), n)
	require.NoError(t, err)
	t.Cleanup(func() { buf.Release() })
	p, err := BytesOf(buf)
	require.NoError(t, err)
	for i := range p {
		p[i] = b
	}
	return buf, p
}

// readFile reads the whole file behind fd, as a holder of the handle could.
func readFile(t *testing.T, fd int) []byte {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	p := make([]byte, st.Size)
	n, err := unix.Pread(fd, p, 0)
	require.NoError(t, err)
	return p[:n]
}

// TestExportReachesOneAllocation: a handle's file is the exported
// allocation and nothing else: no other allocation of the device, live or
// allocated later, and no stale bytes past the buffer's end, for either
// access. (Before per-allocation files, the handle was the whole arena.)
func TestExportReachesOneAllocation(t *testing.T) {
	for name, m := range memories(t) {
		for _, access := range []Access{ReadOnly, Writable} {
			t.Run(name+"/"+access.String(), func(t *testing.T) {
				const n = 10000 // not page-aligned: a tail to check
				// A recycled allocation: its tail held someone else's bytes.
				old, _ := filled(t, m, n, 0xEE)
				require.NoError(t, old.Release())
				a, _ := filled(t, m, n, 0xAA)
				filled(t, m, 1<<20, 0xBB) // another actor's object, never shared
				h, err := ExportOf(a, access)
				require.NoError(t, err)
				defer unix.Close(h.FD)
				assert.Equal(t, access, h.Access)
				assert.Equal(t, pageRound(n), h.Size, "the file is the allocation, page-rounded")
				assert.Zero(t, h.Offset)
				assert.EqualValues(t, n, h.Length)
				filled(t, m, 1<<20, 0xCC) // allocated after the grant
				got := readFile(t, h.FD)
				require.Len(t, got, int(pageRound(n)))
				assert.Equal(t, bytes.Repeat([]byte{0xAA}, n), got[:n])
				assert.Equal(t, make([]byte, pageRound(n)-n), got[n:], "the page tail past the buffer is zeroed")
				for _, secret := range []byte{0xBB, 0xCC, 0xEE} {
					assert.NotContains(t, string(got), string(bytes.Repeat([]byte{secret}, 64)))
				}
			})
		}
	}
}

// TestExportReadOnlyRefusesWrites: a read-only handle cannot be written,
// mapped writable or truncated; reopening it for writing through /proc is
// refused to an unprivileged process of the same user (mode 0400), and
// even a process that may reopen it (root) cannot write through the
// reopened descriptor (F_SEAL_FUTURE_WRITE). The owner still writes through
// its own mapping, and the holder sees that. (Before, the reopen succeeded
// and wrote into the owner's arena.)
func TestExportReadOnlyRefusesWrites(t *testing.T) {
	for name, m := range memories(t) {
		t.Run(name, func(t *testing.T) {
			const n = 8192
			a, p := filled(t, m, n, 0xAA)
			h, err := ExportOf(a, ReadOnly)
			require.NoError(t, err)
			defer unix.Close(h.FD)
			_, err = unix.Mmap(h.FD, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			assert.ErrorIs(t, err, unix.EACCES, "a read-only descriptor maps writable")
			_, err = unix.Pwrite(h.FD, []byte{1}, 0)
			assert.ErrorIs(t, err, unix.EBADF)
			assert.Error(t, unix.Ftruncate(h.FD, 0))

			path := "/proc/self/fd/" + strconv.Itoa(h.FD)
			caps.WithoutDACOverride(t, func() {
				fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err == nil {
					unix.Close(fd)
				}
				assert.ErrorIs(t, err, unix.EACCES, "an unprivileged process of our user reopened the grant for writing")
			})
			if fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
				// Privileged (root): the reopen is allowed, writing is not.
				defer unix.Close(fd)
				_, err = unix.Pwrite(fd, []byte{1}, 0)
				assert.ErrorIs(t, err, unix.EPERM, "write through a reopened read-only grant")
				_, err = unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
				assert.ErrorIs(t, err, unix.EPERM, "writable mapping of a reopened read-only grant")
				assert.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM, "truncating a reopened grant")
				assert.ErrorIs(t, unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, n), unix.EPERM)
			}

			p[100] = 0x11 // the owner's own mapping stays writable
			assert.Equal(t, byte(0x11), readFile(t, h.FD)[100])
			_, err = ExportOf(a, Writable)
			assert.ErrorIs(t, err, ErrExportAccess, "writable after a read-only seal")
			assert.ErrorIs(t, err, ErrNotExportable)
		})
	}
}

// TestExportWritableReachesOnlyItsSlot: a writable handle writes the slot
// and nothing else; the slot stays shareable read-only afterwards (without
// the seal, since a writer maps it).
func TestExportWritableReachesOnlyItsSlot(t *testing.T) {
	for name, m := range memories(t) {
		t.Run(name, func(t *testing.T) {
			slot, sp := filled(t, m, 4096, 0)
			_, other := filled(t, m, 4096, 0xBB)
			h, err := ExportOf(slot, Writable)
			require.NoError(t, err)
			defer unix.Close(h.FD)
			w, err := unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			require.NoError(t, err)
			for i := range w {
				w[i] = 0x77
			}
			require.NoError(t, unix.Munmap(w))
			assert.Equal(t, bytes.Repeat([]byte{0x77}, 4096), sp)
			assert.Equal(t, bytes.Repeat([]byte{0xBB}, 4096), other)
			assert.Len(t, readFile(t, h.FD), 4096, "the writable file is the slot alone")
			assert.ErrorIs(t, unix.Ftruncate(h.FD, 1<<20), unix.EPERM, "a writer grew the slot's file")
			assert.ErrorIs(t, unix.Ftruncate(h.FD, 0), unix.EPERM, "a writer shrank the slot's file under the owner")
			r, err := ExportOf(slot, ReadOnly)
			require.NoError(t, err)
			unix.Close(r.FD)
		})
	}
}

// TestExportRevocation: once the owner releases an exported allocation,
// its memory never serves another allocation, so a holder that keeps a
// mapping sees the freed object's bytes, never a later owner's. (Before,
// first-fit put the next allocation at the same arena offset, and the
// holder's mapping showed it.)
func TestExportRevocation(t *testing.T) {
	for name, m := range memories(t) {
		t.Run(name, func(t *testing.T) {
			const n = 64 << 10
			a, _ := filled(t, m, n, 0xAA)
			h, err := ExportOf(a, ReadOnly)
			require.NoError(t, err)
			view, err := unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ, unix.MAP_SHARED)
			require.NoError(t, err)
			defer unix.Munmap(view)
			require.NoError(t, unix.Close(h.FD))
			require.NoError(t, a.Release())
			for i := range 8 { // the same size again and again: any reuse would show
				b, p := filled(t, m, n, byte(0xC0+i))
				p[0] = 0xC0
				require.NoError(t, b.Release())
			}
			assert.Equal(t, bytes.Repeat([]byte{0xAA}, n), view[:n], "a revoked mapping shows another allocation's bytes")
		})
	}
}
