//go:build ofi

package ofi

import (
	"net"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provtest"
)

// TestAbuse runs the listener abuse suite against a rail's bootstrap
// listener. ReadsNothing is skipped: the bootstrap connection carries only
// small control answers (the data moves through libfabric), so a peer
// that reads nothing cannot make the owner block writing to it.
func TestAbuse(t *testing.T) {
	fabrictest.RunAbuse(t, fabrictest.AbuseHarness{Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink, cfg fabrictest.AbuseConfig) fabrictest.AbuseTarget {
		prov := loopback(t, "nic0")
		prov.cfg.HandshakeTimeout = cfg.HandshakeTimeout
		// After the handshake the owner sends its endpoint's address.
		tg := provtest.NewAbuse(t, prov, testKey(t), testKey(t), src, sink, cfg, func(c net.Conn) error {
			_, err := peerauth.ReadField(c, MaxAddr)
			return err
		}).Target
		// A call whose length field says 4 GiB.
		oversized := appendFrame(nil, bootFrame{kind: kindCall, id: 1})
		oversized[9], oversized[10], oversized[11], oversized[12] = 0xff, 0xff, 0xff, 0xff
		tg.Oversized = oversized
		tg.Reader = func(t testing.TB) fabric.Transport { return provtest.Reader(t, loopback(t, "nic0"), testKey(t)) }
		return tg
	}})
}
