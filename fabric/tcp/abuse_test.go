package tcp

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

func abuseHarness(encrypt bool) fabrictest.AbuseHarness {
	return fabrictest.AbuseHarness{Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink, cfg fabrictest.AbuseConfig) fabrictest.AbuseTarget {
		ownerKey, ownerID := testhelp.Key(t)
		attacker, _ := testhelp.Key(t)
		srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: ownerKey, EncryptData: encrypt, StallTimeout: cfg.StallTimeout}, Source: src, Sink: sink,
			Limits: cfg.Limits, ListenerMetrics: cfg.Metrics, HandshakeTimeout: cfg.HandshakeTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		// Past the longest token: the length field says 255 bytes.
		oversized := request{op: opRead, length: 1}.appendTo(nil)
		oversized[1+16+8] = 255
		return fabrictest.AbuseTarget{
			Listener: "tcp",
			Dial: func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", srv.Addr())
			},
			Handshake: func(ctx context.Context, c net.Conn) (net.Conn, error) {
				if d, ok := ctx.Deadline(); ok {
					c.SetDeadline(d)
					defer c.SetDeadline(time.Time{})
				}
				res, err := peerauth.ClientWith(c, attacker, ownerID, peerauth.Options{Encrypt: encrypt})
				if err != nil {
					return nil, err
				}
				return res.Wrap(c)
			},
			Oversized: oversized,
			Unread: func(ctx context.Context, c net.Conn, big fabric.Remote) error {
				req := request{op: opRead, claim: big.Claim, offset: big.Offset, length: big.Length}
				_, err := c.Write(req.appendTo(nil))
				return err
			},
			Reader: func(t testing.TB) fabric.Transport {
				readerKey, _ := testhelp.Key(t)
				tr, err := New(Config{Security: fabric.Security{Identity: readerKey, EncryptData: encrypt}})
				if err != nil {
					t.Fatal(err)
				}
				return tr
			},
			Remote: fabric.Remote{
				Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
				Peer:     ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
			},
			Conns: srv.loop.Len,
		}
	}}
}

// TestAbuse runs the listener abuse suite against the tcp server, in clear
// and encrypted (whose idle wait takes another path, see awaitRequest).
func TestAbuse(t *testing.T) {
	t.Run("clear", func(t *testing.T) { fabrictest.RunAbuse(t, abuseHarness(false)) })
	t.Run("encrypted", func(t *testing.T) { fabrictest.RunAbuse(t, abuseHarness(true)) })
}
