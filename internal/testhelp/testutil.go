package testhelp

import (
	"cmp"
	"crypto/rand"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Key returns a fresh Ed25519 identity and its peer ID.
func Key(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	id, err := peer.IDFromPrivateKey(k)
	require.NoError(t, err)
	return k, id
}

// updateFlag is -update, registered here once so every test binary that
// uses Golden has it; a package that registered its own first keeps it.
var updateFlag = func() *flag.Flag {
	if f := flag.Lookup("update"); f != nil {
		return f
	}
	flag.Bool("update", false, "rewrite golden files")
	return flag.Lookup("update")
}()

// Updating reports whether the test binary runs with -update.
func Updating() bool { return updateFlag.Value.String() == "true" }

// Golden compares got with the file at path (relative to the package under
// test, e.g. testdata/golden/x.txt), or rewrites the file when the tests
// run with -update.
func Golden(t testing.TB, path string, got []byte) {
	t.Helper()
	if Updating() {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, got, 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "rerun the package's tests with -update to create it")
	assert.Equal(t, string(want), string(got), "golden %s differs (rerun with -update if the change is intended)", path)
}

// Median is the middle of x (the upper one of an even count), or the zero
// value for an empty x. x is not reordered.
func Median[T cmp.Ordered](x []T) T {
	if len(x) == 0 {
		var zero T
		return zero
	}
	x = slices.Clone(x)
	slices.Sort(x)
	return x[len(x)/2]
}

// CPUTime is the user plus system CPU time this process has used: the
// figure that says what a codec or a transfer costs, whatever else loads
// the machine.
func CPUTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
