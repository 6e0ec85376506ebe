package rdma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// Queue pairs the owner's rails reaped as idle (ServerConfig.Limits) are
// reconnected by the next read, which succeeds.
func TestIdleQueuePairsReconnect(t *testing.T) {
	const size = 1 << 20
	ctx := context.Background()
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(0), 4*size)
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	obj, _ := mem.Alloc(ctx, size)
	data, _ := tensor.BytesOf(obj)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ownerKey, ownerID := key(t)
	lm := fabric.NewListenerMetrics(nil)
	prov, _ := softrdma.New(softrdma.Config{NICs: loopbackNICs("nic0", "nic1")})
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: prov, Security: fabric.Security{Identity: ownerKey},
		Limits: fabric.ListenerLimits{IdleTimeout: 100 * time.Millisecond}, ListenerMetrics: lm,
		Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) { return nopRelease{obj}, nil })})
	require.NoError(t, err)
	readerKey, _ := key(t)
	rp, _ := softrdma.New(softrdma.Config{NICs: loopbackNICs("nic0", "nic1")})
	tr, err := rdma.New(ctx, rdma.Config{Provider: rp, Security: fabric.Security{Identity: readerKey}, AllowLoopback: true})
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close(); srv.Close() })
	remote := fabric.Remote{Endpoint: fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)}, Peer: ownerID.String(),
		Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Claim: fabric.Claim{Object: fabric.ObjectID{1}}, Length: size}
	conns := func() float64 {
		return testutilGauge(lm, "rdma/nic0") + testutilGauge(lm, "rdma/nic1")
	}
	for i := range 2 {
		dst, _ := mem.Alloc(ctx, size)
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := tr.Read(rctx, remote, dst)
		cancel()
		require.NoError(t, err, "read %d", i)
		got, _ := tensor.BytesOf(dst)
		require.True(t, bytes.Equal(got, data), "read %d: bytes differ", i)
		dst.Release()
		require.Eventually(t, func() bool { return conns() == 0 }, 20*time.Second, 5*time.Millisecond,
			"the owner reaps idle queue pairs")
	}
}

func testutilGauge(m *fabric.ListenerMetrics, listener string) float64 {
	return testutil.ToFloat64(m.Conns.WithLabelValues(listener))
}
