package tcp

import (
	"context"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Device memory the CPU cannot address (tensor/cuda) crosses tcp through
// host staging: the device's pinned memory where it has some
// (tensor.StageFor), so the socket reads into or writes from memory the
// device copies by one DMA. A reader's device copies overlap the wire
// (segments, fabric.StagedRead); an owner stages each request's range
// before sending it, and a pusher stages its source whole before sending;
// those copies count in the transfer's time.

// stageTimeout bounds the device copy an owner makes for a request (the
// device's own bound, CopyTimeout, is longer).
const stageTimeout = 30 * time.Second

// readDevice reads through host staging into dst, a segment at a time
// (fabric.StagedRead: the device takes one segment in while the next
// crosses the wire).
func (t *Transport) readDevice(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	return fabric.ReadStaged(ctx, fabric.TCP, src, dst, func(ctx context.Context, r fabric.Remote, p []byte) (fabric.Stats, error) {
		return t.run(ctx, opRead, r, p)
	})
}

// writeDevice copies src's bytes out to host staging, then pushes them.
func (t *Transport) writeDevice(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	return fabric.WriteStaged(ctx, fabric.TCP, src, dst.Length, func(ctx context.Context, p []byte) (fabric.Stats, error) {
		return t.run(ctx, opWrite, dst, p)
	})
}

// stagedPin is a pin of device memory with the host staging a request
// moves through; Release releases both.
type stagedPin struct {
	tensor.Buffer // the pin
	stage         tensor.Buffer
	off, n        int64
}

func (s *stagedPin) Release() error {
	s.stage.Release()
	return s.Buffer.Release()
}

// commit copies a push's staged bytes into the device.
func (s *stagedPin) commit() error {
	ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
	defer cancel()
	return tensor.Copy(ctx, s.Buffer, s.off, s.stage, 0, s.n)
}

// stageDevice returns staging for a request on device memory: for a read
// it already holds the requested bytes; for a push the caller commits it
// once received.
func stageDevice(pin tensor.Buffer, req request) (tensor.Buffer, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
	defer cancel()
	stage, err := tensor.StageFor(ctx, pin, max(req.length, 1))
	if err != nil {
		pin.Release()
		return nil, nil, err
	}
	sp := &stagedPin{Buffer: pin, stage: stage, off: req.offset, n: req.length}
	p, err := tensor.BytesOf(stage)
	if err == nil && req.op == opRead {
		err = tensor.Copy(ctx, stage, 0, pin, req.offset, req.length)
	}
	if err != nil {
		sp.Release()
		return nil, nil, err
	}
	return sp, p[:req.length], nil
}
