package topocheck_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/topocheck"
)

// cache shares built trees between the tests; read-only checks use the
// committed copies in ../testdata/sysfs.
func cache(t *testing.T) *topocheck.TreeCache {
	c := topocheck.NewTreeCache(t.TempDir())
	for _, f := range topocheck.Fixtures() {
		c.Seed(f.Name, filepath.Join("..", "testdata", "sysfs", f.Name))
	}
	return c
}

// greedy claims every PCI function as a GPU: the suite must catch it.
type greedy struct{}

func (greedy) Name() string                { return "greedy" }
func (greedy) Maturity() topology.Maturity { return topology.Beta }
func (greedy) VendorIDs() []uint16         { return []uint16{0x1234} }
func (greedy) Discover(_ context.Context, s *topology.Scan) error {
	for i := range s.PCI {
		s.AddDevice(topology.Device{Kind: topology.KindGPU, Model: "x"}, &s.PCI[i])
	}
	return nil
}

type crashy struct{ greedy }

func (crashy) Name() string { return "crashy" }
func (crashy) Discover(_ context.Context, s *topology.Scan) error {
	if len(s.PCI) > 0 {
		var m map[string]int
		m["x"]++ // a nil map write: the plugin panics
	}
	return nil
}

func TestSuiteCatchesBadPlugins(t *testing.T) {
	c := cache(t)
	vm := topocheck.FixturesFor("") // the small VM tree keeps bad-input cheap
	rep := topocheck.Check(context.Background(), greedy{}, topocheck.Config{Cache: c, Fixtures: vm})
	assert.False(t, rep.OK())
	assert.Equal(t, topology.Maturity(-1), rep.Verified)
	failed := map[string]bool{}
	for _, r := range rep.Failed() {
		failed[r.Name] = true
	}
	assert.True(t, failed["foreign-trees"])
	assert.True(t, failed["vendor-ids"] || failed["fixtures"])

	rep = topocheck.Check(context.Background(), crashy{}, topocheck.Config{Cache: c, Fixtures: vm})
	assert.False(t, rep.OK())
	failed = map[string]bool{}
	for _, r := range rep.Failed() {
		failed[r.Name] = true
	}
	assert.True(t, failed["foreign-trees"], "%+v", rep.Results)
}

func TestSuiteWithOwnFixture(t *testing.T) {
	fx := topocheck.FixturesFor("nvidia")
	require.Len(t, fx, 1)
	fx[0].Want.Devices = 7 // wrong on purpose
	rep := topocheck.Check(context.Background(), topology.NVIDIAPlugin(), topocheck.Config{Fixtures: fx, Cache: cache(t)})
	assert.Equal(t, topology.Experimental, rep.Verified)
}

func TestTreeErrors(t *testing.T) {
	tr := topocheck.NewTree(t.TempDir())
	tr.File("a", "x")
	tr.File("a/b", "y") // a is a file
	assert.Error(t, tr.Err())
}
