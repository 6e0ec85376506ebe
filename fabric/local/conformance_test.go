package local

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// harness runs the in-process transport called name ("local" or "p2p")
// between GPU 0 (owner) and GPU 1 (reader) of one runtime on a DGX H100,
// whose GPUs share NVLink, so both transports reach the pair.
func harness(t *testing.T, name string) fabrictest.Harness {
	cl, err := topology.Preset("dgx-h100", 1)
	if err != nil {
		t.Fatal(err)
	}
	host := cl.Hosts[0].ID
	return fabrictest.Harness{Name: name, InProcess: true, Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink) fabrictest.Env {
		// The owner is this runtime's own object table: once it shuts down it
		// refuses new opens, as rdt's does, while pins already handed out
		// stay valid until released.
		var closed atomic.Bool
		owner := fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			if closed.Load() {
				return nil, fabric.ErrOwnerClosed
			}
			return src.Open(ctx, c)
		})
		cfg := Config{Process: "rt", Source: owner, Sink: sink, Topology: cl}
		var tr fabric.Transport = New(cfg)
		if name == fabric.P2P {
			tr = NewP2P(cfg)
		}
		t.Cleanup(func() { tr.Close() })
		return fabrictest.Env{
			Reader:     tr,
			Remote:     fabric.Remote{Endpoint: fabric.Endpoint{Process: "rt", Host: host, Device: tensor.GPUDevice(0)}},
			Dst:        fabric.Endpoint{Process: "rt", Host: host, Device: tensor.GPUDevice(1)},
			CloseOwner: func() { closed.Store(true) },
		}
	}}
}

func TestConformance(t *testing.T) {
	fabrictest.Run(t, harness(t, fabric.Local))
	// p2p runs the same copy code as local (copyFrom, copyInto); the 1 GiB
	// case, run above, would only cost the shared machines another 2 GiB
	// of arenas and a few seconds under -race.
	h := harness(t, fabric.P2P)
	h.MaxSize = 64 << 20
	fabrictest.Run(t, h)
}
