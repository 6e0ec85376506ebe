package testhelp

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 3},
	} {
		in := append([]float64(nil), c.in...)
		assert.Equal(t, c.want, Median(c.in), "%v", c.in)
		assert.Equal(t, in, c.in, "Median must not reorder its input")
	}
	assert.Equal(t, 2*time.Second, Median([]time.Duration{time.Second, 3 * time.Second, 2 * time.Second}))
}

func TestCPUTimeAdvances(t *testing.T) {
	t0 := CPUTime()
	require.Positive(t, t0)
	x := 0
	for i := 0; CPUTime() == t0 && i < 1e9; i++ {
		x += i
	}
	assert.Greater(t, CPUTime(), t0)
}

func TestKeyIsFresh(t *testing.T) {
	k1, id1 := Key(t)
	_, id2 := Key(t)
	assert.NotEqual(t, id1, id2)
	require.NotNil(t, k1)
}

func TestGolden(t *testing.T) {
	Golden(t, filepath.Join("testdata", "golden.txt"), []byte("a golden file\n"))
}

type host struct{ mem tensor.Memory }

func (h host) Memory(tensor.DeviceID) (tensor.Memory, error) { return h.mem, nil }

func TestFillSameBytes(t *testing.T) {
	m := host{tensor.NewHostMemory(0)}
	a := Fill(t, m, tensor.HostDevice, tensor.Float32, 3, 1000)
	b := Fill(t, m, tensor.HostDevice, tensor.Float32, 3, 1000)
	SameBytes(t, a, b)
	p, err := a.SpanBytes()
	require.NoError(t, err)
	assert.NotEqual(t, p[1], p[2], "the pattern differs from byte to byte")
}

func ExampleMedian() {
	fmt.Println(Median([]int{9, 1, 5}), Median([]float64{}))
	// Output: 5 0
}

type runFunc func() int

func (f runFunc) Run() int { return f() }

func TestIsolatedGivesEachRunItsOwnClaimsDir(t *testing.T) {
	t.Setenv(envRuntimeDir, "/before")
	t.Setenv(envIsolated, "")
	var dirs []string
	run := Isolated(runFunc(func() int {
		dir := os.Getenv(envRuntimeDir)
		st, err := os.Stat(dir)
		require.NoError(t, err)
		assert.True(t, st.IsDir())
		assert.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "private to the user")
		dirs = append(dirs, dir)
		return 3
	}))
	assert.Equal(t, 3, run.Run(), "the tests' exit code passes through")
	assert.Equal(t, 3, run.Run())
	require.Len(t, dirs, 2)
	assert.NotEqual(t, dirs[0], dirs[1])
	for _, d := range dirs {
		assert.NoDirExists(t, d, "removed after the run")
	}
	assert.Equal(t, "/before", os.Getenv(envRuntimeDir), "the environment is restored")
}

// A test binary that an isolated run starts keeps the directory its parent
// gave it.
func TestIsolatedChildKeepsItsParentsDir(t *testing.T) {
	t.Setenv(envRuntimeDir, "/from-parent")
	t.Setenv(envIsolated, "1")
	var got string
	Isolated(runFunc(func() int { got = os.Getenv(envRuntimeDir); return 0 })).Run()
	assert.Equal(t, "/from-parent", got)
}
