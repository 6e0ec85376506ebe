package shm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
)

// TestMapRefusesUnsealed (issue 29 item 12): a received descriptor that its
// sender can still shrink is refused before it is mapped. Before, a hostile
// owner granted such a file, truncated it, and the reader died of SIGBUS
// touching its view (views are not guarded copies). Every mapping of a
// received descriptor (a copy's, a view's, a slab's) goes through
// mapRegionFlags.
func TestMapRefusesUnsealed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		seals  int
		refuse bool
	}{
		{"no seals", 0, true},
		{"grow sealed only", unix.F_SEAL_GROW, true},
		{"write sealed only", unix.F_SEAL_FUTURE_WRITE, true},
		{"shrink sealed", unix.F_SEAL_SHRINK, false},
		{"as our owners seal", unix.F_SEAL_SHRINK | unix.F_SEAL_GROW, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, err := unix.MemfdCreate("hostile-owner", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			require.NoError(t, err)
			defer unix.Close(fd)
			const n = 1 << 20
			require.NoError(t, unix.Ftruncate(fd, n))
			if tc.seals != 0 {
				_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, tc.seals)
				require.NoError(t, err)
			}
			for _, flags := range []int{0, unix.MAP_POPULATE} {
				data, _, err := mapRegionFlags(fd, 0, n, false, flags)
				if tc.refuse {
					assert.ErrorIs(t, err, fabric.ErrCorrupt)
					assert.Nil(t, data)
					continue
				}
				require.NoError(t, err)
				assert.Error(t, unix.Ftruncate(fd, 0), "a sealed file cannot shrink")
				_ = data[n-1] // no SIGBUS
				unix.Munmap(data)
			}
		})
	}
	// A file that is not a memfd cannot be sealed at all.
	f, err := unix.Open(t.TempDir(), unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	require.NoError(t, err)
	defer unix.Close(f)
	require.NoError(t, unix.Ftruncate(f, 1<<16))
	_, _, err = mapRegion(f, 0, 1<<16, false)
	assert.ErrorIs(t, err, fabric.ErrCorrupt, "a plain file")
}
