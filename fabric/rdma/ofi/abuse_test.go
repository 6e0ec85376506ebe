//go:build ofi

package ofi

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestAbuse runs the listener abuse suite against a rail's bootstrap
// listener. ReadsNothing is skipped: the bootstrap connection carries only
// small control answers (the data moves through libfabric), so a peer
// that reads nothing cannot make the owner block writing to it.
func TestAbuse(t *testing.T) {
	fabrictest.RunAbuse(t, fabrictest.AbuseHarness{Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink, cfg fabrictest.AbuseConfig) fabrictest.AbuseTarget {
		ownerKey := testKey(t)
		ownerID, _ := peer.IDFromPrivateKey(ownerKey)
		attacker := testKey(t)
		prov := loopback(t, "nic0")
		prov.cfg.HandshakeTimeout = cfg.HandshakeTimeout
		srv, err := rdma.Listen(context.Background(), rdma.ServerConfig{Provider: prov, Security: fabric.Security{Identity: ownerKey}, Source: src, Sink: sink,
			Limits: cfg.Limits, ListenerMetrics: cfg.Metrics})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		rails, _ := rdma.ParseAddrs(srv.Addr())
		addr := rails[0].Addr
		// A call whose length field says 4 GiB.
		oversized := appendFrame(nil, bootFrame{kind: kindCall, id: 1})
		oversized[9], oversized[10], oversized[11], oversized[12] = 0xff, 0xff, 0xff, 0xff
		return fabrictest.AbuseTarget{
			Listener: "rdma/nic0",
			Dial: func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			},
			Handshake: func(ctx context.Context, c net.Conn) (net.Conn, error) {
				if d, ok := ctx.Deadline(); ok {
					c.SetDeadline(d)
					defer c.SetDeadline(time.Time{})
				}
				if _, err := peerauth.ClientWith(c, attacker, ownerID, peerauth.Options{}); err != nil {
					return nil, err
				}
				if _, err := peerauth.ReadField(c, MaxAddr); err != nil {
					return nil, err
				}
				return c, nil
			},
			Oversized: oversized,
			Reader: func(t testing.TB) fabric.Transport {
				tr, err := rdma.New(context.Background(), rdma.Config{Provider: loopback(t, "nic0"), Security: fabric.Security{Identity: testKey(t)}, AllowLoopback: true})
				if err != nil {
					t.Fatal(err)
				}
				return tr
			},
			Remote: fabric.Remote{
				Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
				Peer:     ownerID.String(), Addrs: map[string]string{fabric.RDMA: srv.Addr()},
			},
			Conns: func() int { return int(testutil.ToFloat64(cfg.Metrics.Conns.WithLabelValues("rdma/nic0"))) },
		}
	}})
}
