package linkstat

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// The sock_ops program goes only to a cgroup holding this process alone
// (issue 13, item 6): a configured cgroup shared with another process is
// refused, and the monitor polls TCP_INFO, saying why; by default a process
// whose cgroup is shared moves into a child cgroup of its own (saying so),
// every monitor of the process shares it, and the last Close moves the
// process back and removes it; a cgroup the process holds alone is used as
// it is.
func TestEBPFOnlyInACgroupOfItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	shared := childCgroup(t) // this process alone, for now
	other := exec.Command("sleep", "600")
	require.NoError(t, other.Start()) // born in shared: now it is shared
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	procs := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	require.Contains(t, procs(shared), strconv.Itoa(other.Process.Pid))
	newMon := func(cfg Config) (*Monitor, *logBuf) {
		logs := &logBuf{}
		cfg.Logger, cfg.Interval = slog.New(slog.NewTextHandler(logs, nil)), time.Hour
		m, err := New(cfg)
		require.NoError(t, err)
		return m, logs
	}

	// Configured, but shared: refused.
	m, logs := newMon(Config{Cgroup: shared})
	assert.Equal(t, ModeTCPInfo, m.Mode())
	assert.Contains(t, logs.String(), "falling back to polling TCP_INFO")
	assert.Contains(t, logs.String(), "holds other processes")
	require.NoError(t, m.Close())

	// Default: a child cgroup of its own.
	m1, logs := newMon(Config{})
	if m1.Mode() != ModeEBPF {
		m1.Close()
		t.Skipf("eBPF not permitted here: %s", logs.String())
	}
	child := filepath.Join(shared, "tensorlane-"+strconv.Itoa(os.Getpid()))
	assert.Equal(t, child, m1.Cgroup(), "not the shared cgroup")
	assert.Equal(t, strconv.Itoa(os.Getpid()), procs(child))
	assert.Equal(t, strconv.Itoa(other.Process.Pid), procs(shared))
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "child cgroup")
	m2, _ := newMon(Config{})
	assert.Equal(t, child, m2.Cgroup(), "one child per process")
	require.NoError(t, m1.Close())
	assert.DirExists(t, child, "the second monitor still uses it")
	require.NoError(t, m2.Close())
	assert.NoDirExists(t, child)
	assert.Contains(t, procs(shared), strconv.Itoa(os.Getpid()), "moved back")

	// Alone again: its own cgroup serves as it is.
	require.NoError(t, other.Process.Kill())
	other.Wait()
	m, logs = newMon(Config{})
	defer m.Close()
	assert.Equal(t, shared, m.Cgroup())
	assert.Contains(t, logs.String(), "holds it alone")
}

func TestAlone(t *testing.T) {
	assert.Error(t, alone("/nonexistent/cgroup"))
	mount, err := cgroup2Mount()
	if err != nil {
		t.Skipf("no cgroup v2 mounted: %v", err)
	}
	// The hierarchy's root holds every process of the host (or container).
	if err := alone(mount); err != nil {
		assert.ErrorIs(t, err, errSharedCgroup)
	}
}
