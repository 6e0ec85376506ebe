// Package topotest runs the conformance suite for topology device plugins
// (topology/topocheck) in a vendor's tests, one subtest per check:
//
//	func TestConformance(t *testing.T) {
//		topotest.Run(t, myplugin.New(), topotest.Config{
//			Fixtures: []topotest.Fixture{{Name: "board-a", Build: buildBoardA, Want: topotest.Want{Devices: 8, ...}}},
//		})
//	}
//
// Run fails the test when the plugin does not reach its declared Maturity.
// The suite itself, the fake system trees (Tree) and the fixtures of
// well-known machines live in topocheck, which programs import; this
// package is for tests only, and its names are topocheck's.
package topotest

import (
	"context"
	"testing"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/topocheck"
)

// The suite's types and the tree builders, under the names vendors' tests
// already use.
type (
	Config    = topocheck.Config
	Fixture   = topocheck.Fixture
	Want      = topocheck.Want
	Report    = topocheck.Report
	Result    = topocheck.Result
	TreeCache = topocheck.TreeCache
	Tree      = topocheck.Tree
	PCI       = topocheck.PCI
)

var (
	Check        = topocheck.Check
	Fixtures     = topocheck.Fixtures
	FixturesFor  = topocheck.FixturesFor
	NewTree      = topocheck.NewTree
	NewTreeCache = topocheck.NewTreeCache
	BuildDGXH100 = topocheck.BuildDGXH100
	BuildMI300X  = topocheck.BuildMI300X
	BuildTPUv5p  = topocheck.BuildTPUv5p
	BuildTrn2    = topocheck.BuildTrn2
	BuildGaudi3  = topocheck.BuildGaudi3
	BuildVM      = topocheck.BuildVM
)

// Run runs the suite as subtests of t and fails t when the plugin does
// not reach its declared maturity.
func Run(t *testing.T, p topology.Plugin, cfg Config) Report {
	t.Helper()
	rep := Check(context.Background(), p, cfg)
	for _, r := range rep.Results {
		t.Run(r.Name, func(t *testing.T) {
			switch {
			case r.Skipped:
				t.Skip(r.Msg)
			case !r.Passed && r.Level <= rep.Declared:
				t.Errorf("%s check (%s) failed: %s", r.Name, r.Level, r.Msg)
			case !r.Passed:
				t.Logf("%s check (%s, above the declared %s) failed: %s", r.Name, r.Level, rep.Declared, r.Msg)
			}
		})
	}
	if !rep.OK() {
		t.Errorf("plugin %s declares %s but verifies only %s", rep.Plugin, rep.Declared, rep.Verified)
	}
	return rep
}
