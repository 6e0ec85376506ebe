package privdir_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/privdir"
)

// otherUID is a uid that is not ours; tests that plant files as another
// user need root to chown them.
const otherUID = 54321

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("planting another user's files needs root")
	}
}

func TestEnsure(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	require.NoError(t, os.Mkdir(target, 0o700))

	cases := []struct {
		name  string
		setup func(dir string)
		ok    bool
	}{
		{"new", func(string) {}, true},
		{"ours but open", func(d string) { require.NoError(t, os.Mkdir(d, 0o777)); require.NoError(t, os.Chmod(d, 0o777)) }, true},
		{"symlink to our dir", func(d string) { require.NoError(t, os.Symlink(target, d)) }, false},
		{"a file", func(d string) { require.NoError(t, os.WriteFile(d, nil, 0o600)) }, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(base, "d", string(rune('a'+i)))
			require.NoError(t, os.MkdirAll(filepath.Dir(dir), 0o700))
			c.setup(dir)
			err := privdir.Ensure(dir)
			if c.ok {
				require.NoError(t, err)
				fi, err := os.Stat(dir)
				require.NoError(t, err)
				assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
			} else {
				assert.ErrorIs(t, err, privdir.ErrNotPrivate)
			}
		})
	}
}

func TestEnsureRefusesAnotherUsersDirectory(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "planted")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chown(dir, otherUID, otherUID))
	err := privdir.Ensure(dir)
	var pe *privdir.Error
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, pe.Reason, "belongs to uid 54321")
}

// A directory planted in the shared tmp by another user is skipped, and the
// next candidate is used: neither written through nor a way to turn
// tensorlane off.
func TestUserDirSkipsPlantedDirectory(t *testing.T) {
	needRoot(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("XDG_CACHE_HOME", filepath.Join(tmp, "cache"))
	planted := filepath.Join(tmp, "tensorlane-0")
	require.NoError(t, os.Mkdir(planted, 0o777))
	require.NoError(t, os.Chown(planted, otherUID, otherUID))

	dir, skipped, err := privdir.UserDir()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(tmp, "cache", "tensorlane", "run"), dir)
	require.Len(t, skipped, 1)
	assert.ErrorIs(t, skipped[0], privdir.ErrNotPrivate)
}

func TestOpenFileRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o600))

	sym := filepath.Join(dir, "sym.lock")
	require.NoError(t, os.Symlink(victim, sym))
	_, err := privdir.OpenFile(sym)
	assert.ErrorIs(t, err, privdir.ErrNotPrivate)

	hard := filepath.Join(dir, "hard.lock")
	require.NoError(t, os.Link(victim, hard))
	_, err = privdir.OpenFile(hard)
	assert.ErrorIs(t, err, privdir.ErrNotPrivate)

	got, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious", string(got), "nothing written through a link")

	f, err := privdir.OpenFile(filepath.Join(dir, "fresh.lock"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
