package linkstat

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

type lent struct{ tensor.Buffer }

func (lent) Release() error  { return nil }
func (l lent) Bytes() []byte { return l.Buffer.(tensor.HostVisible).Bytes() }

// The fabric/tcp transport's data connections, made through Monitor.Dial,
// are measured in both modes.
func TestTCPTransportDial(t *testing.T) {
	for _, mode := range []Mode{ModeTCPInfo, ModeEBPF} {
		t.Run(string(mode), func(t *testing.T) {
			m, _ := newMonitor(t, mode, Config{})
			ctx := context.Background()
			ownerKey, ownerID := testhelp.Key(t)
			readerKey, _ := testhelp.Key(t)
			host := tensor.NewHostMemory(0)
			const n = 8 << 20
			obj, err := host.Alloc(ctx, n)
			require.NoError(t, err)
			defer obj.Release()
			id := fabric.ObjectID{7}
			srv, err := tcp.Listen(tcp.ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: fabric.SourceFunc(
				func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
					if c.Object != id {
						return nil, fabric.ErrObjectNotFound
					}
					return lent{obj}, nil
				})})
			require.NoError(t, err)
			defer srv.Close()
			tr, err := tcp.New(tcp.Config{Security: fabric.Security{Identity: readerKey}, Streams: 2, Compression: tcp.CompressOff, Dial: m.Dial})
			require.NoError(t, err)
			defer tr.Close()
			dst, err := host.Alloc(ctx, n)
			require.NoError(t, err)
			defer dst.Release()
			_, err = tr.Read(ctx, fabric.Remote{Peer: ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
				Claim: fabric.Claim{Object: id}, Length: n, DType: tensor.Uint8}, dst)
			require.NoError(t, err)

			var received uint64
			var snap []LinkStats
			// In eBPF mode the receiving side's count is current as of its
			// last ACK, which may be delayed: refresh until it is sent.
			for deadline := time.Now().Add(2 * time.Second); received < n && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				snap, received = m.Snapshot(), 0
				for _, s := range snap {
					received += s.BytesReceived
				}
			}
			require.NotEmpty(t, snap, "the transport's connections are tracked")
			for _, s := range snap {
				assert.Equal(t, srv.Addr(), s.Link)
				assert.False(t, s.Degraded, s.Reason)
				assert.Equal(t, mode, s.Source)
			}
			assert.GreaterOrEqual(t, received, uint64(n), "the reader side received the object over its tracked streams")
		})
	}
}
