// Package provtest holds the test harness parts every rdma provider
// (fabric/rdma/softrdma, fabric/rdma/ofi) shares, so that their tests
// write only what is their own (the provider's setup, its wire frames).
package provtest

import (
	"context"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// Abuse is one rdma rail under the listener abuse suite: the owner's
// rdma.Server on one NIC ("nic0") of its provider, and the attacker's key.
type Abuse struct {
	// Rail is the NIC's listen address, where an attacker dials.
	Rail string
	// Target has every field the providers share filled: Listener, Dial,
	// Handshake, Remote and Conns; the caller adds Oversized, Reader
	// (and Unread).
	Target fabrictest.AbuseTarget
}

// NewAbuse serves src and sink with rdma.Listen over prov (whose one NIC
// is "nic0") as ownerKey, under cfg's limits and metrics, and fills the
// shared part of the suite's target: an attacker holding attackerKey
// dials the rail over plain TCP and authenticates with peerauth (its
// handshake then runs greet, nil: nothing, the provider's own greeting).
// The server closes with t.
func NewAbuse(t testing.TB, prov rdma.Provider, ownerKey, attackerKey crypto.PrivKey, src fabric.Source, sink fabric.Sink,
	cfg fabrictest.AbuseConfig, greet func(net.Conn) error) Abuse {
	t.Helper()
	ownerID, err := peer.IDFromPrivateKey(ownerKey)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rdma.Listen(context.Background(), rdma.ServerConfig{Provider: prov, Security: fabric.Security{Identity: ownerKey},
		Source: src, Sink: sink, Limits: cfg.Limits, ListenerMetrics: cfg.Metrics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	rails, err := rdma.ParseAddrs(srv.Addr())
	if err != nil || len(rails) != 1 {
		t.Fatalf("rails %v: %v", rails, err)
	}
	addr := rails[0].Addr
	const label = "rdma/nic0"
	return Abuse{Rail: addr, Target: fabrictest.AbuseTarget{
		Listener: label,
		Dial: func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		Handshake: func(ctx context.Context, c net.Conn) (net.Conn, error) {
			if d, ok := ctx.Deadline(); ok {
				c.SetDeadline(d)
				defer c.SetDeadline(time.Time{})
			}
			if _, err := peerauth.ClientWith(c, attackerKey, ownerID, peerauth.Options{}); err != nil {
				return c, err
			}
			if greet != nil {
				if err := greet(c); err != nil {
					return nil, err
				}
			}
			return c, nil
		},
		Remote: fabric.Remote{
			Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
			Peer:     ownerID.String(),
			Addrs:    map[string]string{fabric.RDMA: srv.Addr()},
		},
		// The rail's device is the server's own: its gauge says.
		Conns: func() int { return int(testutil.ToFloat64(cfg.Metrics.Conns.WithLabelValues(label))) },
	}}
}

// Reader returns a reader-side rdma transport over prov with a fresh
// identity, allowed to reach an owner on its own host.
func Reader(t testing.TB, prov rdma.Provider, key crypto.PrivKey) fabric.Transport {
	t.Helper()
	tr, err := rdma.New(context.Background(), rdma.Config{Provider: prov, Security: fabric.Security{Identity: key}, AllowLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// Key returns a fresh libp2p identity and its peer id.
func Key(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, id
}
