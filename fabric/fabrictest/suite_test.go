package fabrictest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// direct is the smallest correct transport: it reads straight from the
// owner's Source in the same process. The suite must pass it; the real
// transports run the suite in their own packages.
type direct struct {
	src   fabric.Source
	sinks fabric.Sink

	mu          sync.Mutex
	closed      bool
	ownerClosed *bool
	corruptNext *bool
}

func (d *direct) Name() string { return "direct" }
func (d *direct) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	return fabric.Cost{GBps: 1, Reason: "same test"}, true
}
func (d *direct) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

func (d *direct) check() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return fabric.ErrClosed
	case *d.ownerClosed:
		return fmt.Errorf("%w: owner gone", fabric.ErrPeerClosed)
	case *d.corruptNext:
		*d.corruptNext = false
		return fmt.Errorf("%w: reply garbled", fabric.ErrCorrupt)
	}
	return nil
}

func (d *direct) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	if err := d.check(); err != nil {
		return fabric.Stats{}, err
	}
	if dst.Len() < src.Length {
		return fabric.Stats{}, tensor.ErrTooSmall
	}
	pin, err := d.src.Open(ctx, src.Claim.For(src.Offset, src.Length))
	if err != nil {
		return fabric.Stats{}, err
	}
	defer pin.Release()
	if err := fabric.CheckRange(src.Offset, src.Length, pin.Len()); err != nil {
		return fabric.Stats{}, err
	}
	from, _ := tensor.BytesOf(pin)
	to, _ := tensor.BytesOf(dst)
	for off := int64(0); off < src.Length; off += 1 << 20 {
		if err := ctx.Err(); err != nil {
			return fabric.Stats{}, err
		}
		if err := d.check(); err != nil {
			return fabric.Stats{}, err
		}
		end := min(off+1<<20, src.Length)
		copy(to[off:end], from[src.Offset+off:src.Offset+end])
	}
	return fabric.Stats{Transport: d.Name(), Bytes: src.Length}, nil
}

func (d *direct) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	if err := d.check(); err != nil {
		return fabric.Stats{}, err
	}
	pin, err := d.sinks.OpenSink(ctx, dst.Claim)
	if err != nil {
		return fabric.Stats{}, err
	}
	defer pin.Release()
	if err := fabric.CheckRange(dst.Offset, dst.Length, pin.Len()); err != nil {
		return fabric.Stats{}, err
	}
	from, _ := tensor.BytesOf(src)
	to, _ := tensor.BytesOf(pin)
	copy(to[dst.Offset:dst.Offset+dst.Length], from[:dst.Length])
	return fabric.Stats{Transport: d.Name(), Bytes: dst.Length}, nil
}

func TestSuitePassesACorrectTransport(t *testing.T) {
	fabrictest.Run(t, fabrictest.Harness{Name: "direct", MaxSize: 64 << 20, Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink) fabrictest.Env {
		ownerClosed, corrupt := false, false
		d := &direct{src: src, sinks: sink, ownerClosed: &ownerClosed, corruptNext: &corrupt}
		return fabrictest.Env{
			Reader: d,
			Remote: fabric.Remote{Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)}},
			CloseOwner: func() {
				d.mu.Lock()
				ownerClosed = true
				d.mu.Unlock()
			},
			Corrupt: func() {
				d.mu.Lock()
				corrupt = true
				d.mu.Unlock()
			},
		}
	}})
}
