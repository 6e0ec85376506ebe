// Package netnstest is internal/netns for tests: Require skips a test
// where network namespaces are not usable, and New and NewBridge create
// namespaces that are deleted when the test ends, even when it fails. The
// namespaces themselves (netns) carry no test code, so a program such as
// the conformance command can ask netns.Usable without linking testing.
package netnstest

import (
	"testing"

	"github.com/tensorlane/tensorlane/internal/netns"
)

// Require skips the test unless network namespaces, ip and tc are usable.
// It also sweeps namespaces left behind by dead test processes.
func Require(t testing.TB) {
	t.Helper()
	if err := netns.Usable(); err != nil {
		t.Skipf("skipping: needs root, ip(8), tc(8) and network namespaces: %v", err)
	}
	netns.Sweep()
}

// New creates a namespace whose name contains label (lowercase letters and
// digits, at most 12), with its loopback up, and deletes it in t.Cleanup.
func New(t testing.TB, label string) *netns.NS {
	t.Helper()
	ns, err := netns.Create(label)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	t.Cleanup(func() {
		if err := ns.Delete(); err != nil {
			t.Errorf("netns: cleanup: %v", err)
		}
	})
	return ns
}

// NewBridge creates a bridge namespace (deleted in t.Cleanup) with a bridge
// device "br0" that is up.
func NewBridge(t testing.TB, label string) *netns.Bridge {
	t.Helper()
	b, err := netns.CreateBridge(label)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	t.Cleanup(func() {
		if err := b.NS.Delete(); err != nil {
			t.Errorf("netns: cleanup: %v", err)
		}
	})
	return b
}
