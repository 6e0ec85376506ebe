package rdma

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Device memory the CPU cannot address (tensor/cuda) crosses rdma through
// host staging, as over tcp: the device's pinned memory where it has some
// (tensor.StageFor), registered with the NICs in its place. The reader
// stages its destination (or the pusher its source) around the transfer;
// an owner stages an object before the reader's one-sided READs. Pushes
// into an owner's device memory are refused (the owner would have to copy
// the staged bytes in when the push completes, which the verbs-shaped
// protocol does not tell it yet); the planner then takes tcp. GPUDirect
// RDMA (registering device memory with the NIC itself) is the real fix:
// gpudirect.go decides, from what the provider and the device report,
// whether it could be used, and every staged transfer says why it was
// staged (a warning once per reason, a metric, Explain).

// readDevice reads through host staging into dst, a segment at a time
// (fabric.StagedRead: the device takes one segment in while the next
// crosses the wire).
func (t *Transport) readDevice(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	t.gd.staged(dst, "read")
	return fabric.ReadStaged(ctx, fabric.RDMA, src, dst, func(ctx context.Context, r fabric.Remote, p []byte) (fabric.Stats, error) {
		return t.transfer(ctx, r, dst.Device(), p, nil, false)
	})
}

// writeDevice pushes src's bytes through host staging, a segment at a
// time, each a push of its range (fabric.WriteStaged).
func (t *Transport) writeDevice(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	t.gd.staged(src, "push")
	return fabric.WriteStaged(ctx, fabric.RDMA, src, dst.Length, func(ctx context.Context, off int64, p []byte) (fabric.Stats, error) {
		r := dst
		r.Offset, r.Length = dst.Offset+off, int64(len(p))
		return t.transfer(ctx, r, src.Device(), p, nil, true)
	})
}

// stagedPin holds a device object pinned and the staged copy the NICs
// read; Release releases both.
type stagedPin struct {
	tensor.Buffer
	stage tensor.Buffer
}

func (s *stagedPin) Release() error {
	s.stage.Release()
	return s.Buffer.Release()
}

// stageRead copies [off, off+n) of a device pin into host staging and
// returns the pin that owns both and the staged bytes. On error pin is
// released (and nil returned).
func stageRead(ctx context.Context, pin tensor.Buffer, off, n int64, push bool) (tensor.Buffer, []byte, error) {
	if push {
		pin.Release()
		return nil, nil, fmt.Errorf("%w: rdma pushes into device memory (%v) are not supported; use tcp", fabric.ErrNoPath, pin.Device())
	}
	stage, err := tensor.StageFor(ctx, pin, max(n, 1))
	if err != nil {
		pin.Release()
		return nil, nil, err
	}
	sp := &stagedPin{Buffer: pin, stage: stage}
	p, err := tensor.BytesOf(stage)
	if err == nil {
		err = tensor.Copy(ctx, stage, 0, pin, off, n)
	}
	if err != nil {
		sp.Release()
		return nil, nil, err
	}
	return sp, p[:n], nil
}
