package linkstat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestResolveCgroup(t *testing.T) {
	got, err := resolveCgroup("/some/where", "")
	require.NoError(t, err)
	assert.Equal(t, "/some/where", got, "a configured cgroup is used as is")

	mount, err := cgroup2Mount()
	if err != nil {
		t.Skipf("no cgroup v2 mounted: %v", err)
	}
	self, err := resolveCgroup("", "")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(self, mount), "%s under %s", self, mount)
	_, err = os.Stat(filepath.Join(self, "cgroup.procs"))
	assert.NoError(t, err)
}

// Where only cgroup v1 is mounted the monitor can mount a v2 hierarchy
// (Config.MountCgroup2); here one is mounted already, so mount a second
// view of it in a temporary directory and check it is usable.
func TestMountCgroup2(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting cgroup2 needs root")
	}
	dir := filepath.Join(t.TempDir(), "cg2")
	if err := mountCgroup2(dir); err != nil {
		t.Skipf("mounting cgroup2 not permitted here: %v", err)
	}
	t.Cleanup(func() { require.NoError(t, unix.Unmount(dir, 0)) })
	_, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	assert.NoError(t, err)
}
