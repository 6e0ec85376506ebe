package reshard

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testhelp.Libp2pBackground()...) }

// newRuntime starts a runtime claiming host h of a two-host dgx-h100
// cluster.
func newRuntime(ctx context.Context, h string) (*rdt.Runtime, error) {
	cl, err := topology.Preset("dgx-h100", 2)
	if err != nil {
		return nil, err
	}
	return rdt.New(ctx, rdt.Config{Cluster: cl, Host: h, IgnoreEnv: true, DeviceMemory: 64 << 20})
}

// runtimes starts one runtime per host name.
func runtimes(t *testing.T, hosts ...string) []*rdt.Runtime {
	t.Helper()
	ctx := context.Background()
	var out []*rdt.Runtime
	for _, h := range hosts {
		r, err := newRuntime(ctx, h)
		require.NoError(t, err)
		t.Cleanup(func() { r.Shutdown(ctx) })
		out = append(out, r)
	}
	return out
}

// TestReshardFSDPRowsToTPColumns: three trainers hold FSDP rows of a
// weight (two on one host, one on the other), two readers need
// tensor-parallel columns (one per host); the plan is made once and run for
// three steps, every trainer pushing its part to every reader at once, and
// each reader's shard is exactly its columns of that step's weight. Only
// the planned bytes move.
func TestReshardFSDPRowsToTPColumns(t *testing.T) {
	ctx := context.Background()
	shape, elem := []int64{96, 40}, int64(2)
	from := split(t, shape, elem, 0, 3)
	to := split(t, shape, elem, 1, 2)
	p, err := NewPlan(from, to)
	require.NoError(t, err)
	t.Log(p.Explain())

	rts := runtimes(t, "h0", "h1", "h0", "h0", "h1")
	var senders []*Sender
	for i := range 3 {
		a, err := rts[i].Spawn("trainer")
		require.NoError(t, err)
		s, err := NewSender(ctx, a, p, i)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close(ctx) })
		senders = append(senders, s)
	}
	slots := map[Key]rdt.Ref{}
	var receivers []*Receiver
	for j := range 2 {
		a, err := rts[3+j].Spawn("engine")
		require.NoError(t, err)
		r, err := NewReceiver(ctx, a, p, j)
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		for k, v := range r.Slots() {
			slots[k] = v
		}
		receivers = append(receivers, r)
	}
	require.Len(t, slots, len(p.Moves))

	for step := range 3 {
		g := global(shape, elem)
		for i := range g {
			g[i] += byte(step * 17)
		}
		// Every trainer sends at once: many senders, not one rank 0.
		type sent struct {
			xs  []rdt.Transfer
			err error
		}
		done := make(chan sent, len(senders))
		for i, s := range senders {
			src := extract(g, shape, elem, from.Shards[i])
			go func() {
				xs, err := s.Send(ctx, src, slots)
				done <- sent{xs, err}
			}()
		}
		var pushed int64
		for range senders {
			r := <-done
			require.NoError(t, r.err)
			for _, x := range r.xs {
				pushed += x.Stats.Bytes
			}
		}
		assert.Equal(t, p.Bytes(), pushed, "the wire carries the planned bytes, no more")
		for j, r := range receivers {
			dst := make([]byte, to.Bytes(j))
			require.NoError(t, r.Receive(ctx, dst))
			assert.True(t, bytes.Equal(extract(g, shape, elem, to.Shards[j]), dst), "step %d reader %d", step, j)
		}
	}
	assert.Equal(t, int64(len(global(shape, elem))), p.Bytes(), "each reader gets only its columns: the tensor's bytes once in all")
}
