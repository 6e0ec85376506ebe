package topotest_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/topotest"
)

// cache shares built trees between the tests; read-only checks use the
// committed copies in ../testdata/sysfs.
func cache(t *testing.T) *topotest.TreeCache {
	c := topotest.NewTreeCache(t.TempDir())
	for _, f := range topotest.Fixtures() {
		c.Seed(f.Name, filepath.Join("..", "testdata", "sysfs", f.Name))
	}
	return c
}

func TestBuiltinPluginsConform(t *testing.T) {
	c := cache(t)
	for _, p := range topology.BuiltinPlugins() {
		t.Run(p.Name(), func(t *testing.T) {
			rep := topotest.Run(t, p, topotest.Config{Cache: c})
			assert.GreaterOrEqual(t, rep.Verified, p.Maturity())
		})
	}
}
