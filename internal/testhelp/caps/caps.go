// Package caps lets a test act as an unprivileged process of its own user
// while it runs as root: the on-host grant tests check what such a process
// can do with a descriptor it was handed. It imports nothing of this
// module, so tests of any package (tensor's own included) can use it.
package caps

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// WithoutDACOverride runs f on a thread without CAP_DAC_OVERRIDE and
// CAP_DAC_READ_SEARCH in its effective set, as an unprivileged process of
// the same user would.
func WithoutDACOverride(t testing.TB, f func()) {
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved, data [2]unix.CapUserData
	require.NoError(t, unix.Capget(&hdr, &saved[0]))
	data = saved
	data[0].Effective &^= 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH
	require.NoError(t, unix.Capset(&hdr, &data[0]))
	f()
	if unix.Capset(&hdr, &saved[0]) == nil {
		runtime.UnlockOSThread() // else the thread dies with the goroutine
	}
}
