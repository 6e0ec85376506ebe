package shm

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

func abuseHarness() fabrictest.AbuseHarness {
	return fabrictest.AbuseHarness{Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink, cfg fabrictest.AbuseConfig) fabrictest.AbuseTarget {
		ownerKey, ownerID := key(t)
		attacker, _ := key(t)
		srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey, StallTimeout: cfg.StallTimeout}, Source: src, Sink: sink, Dir: t.TempDir(),
			Limits: cfg.Limits, ListenerMetrics: cfg.Metrics, HandshakeTimeout: cfg.HandshakeTimeout, HoldTimeout: cfg.StallTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		// A token length field of 255 (the most is 64).
		oversized := request{op: opRead, length: 1}.marshal()
		oversized[requestFixed-1] = 255
		return fabrictest.AbuseTarget{
			Listener: "shm",
			Dial: func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unixpacket", srv.Addr())
			},
			Handshake: func(ctx context.Context, c net.Conn) (net.Conn, error) {
				if d, ok := ctx.Deadline(); ok {
					c.SetDeadline(d)
					defer c.SetDeadline(time.Time{})
				}
				_, err := peerauth.ClientWith(newPacketRW(c.(*net.UnixConn)), attacker, ownerID, peerauth.Options{})
				return c, err
			},
			Oversized: oversized,
			// A read request whose grant is never read, nor its copy
			// confirmed: the server holds the pin until HoldTimeout.
			Unread: func(ctx context.Context, c net.Conn, big fabric.Remote) error {
				_, err := c.Write(request{op: opRead, claim: big.Claim, offset: big.Offset, length: big.Length}.marshal())
				return err
			},
			Reader: func(t testing.TB) fabric.Transport {
				readerKey, _ := key(t)
				tr, err := New(Config{Security: fabric.Security{Identity: readerKey}, Topology: dgx(t)})
				if err != nil {
					t.Fatal(err)
				}
				return tr
			},
			Remote: fabric.Remote{
				Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
				Peer:     ownerID.String(),
				Addrs:    map[string]string{fabric.SHM: srv.Addr()},
			},
			Conns: srv.connCount,
		}
	}}
}

// TestAbuse runs the listener abuse suite against the shm socket.
func TestAbuse(t *testing.T) { fabrictest.RunAbuse(t, abuseHarness()) }
