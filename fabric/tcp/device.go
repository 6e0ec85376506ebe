package tcp

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// Device memory the CPU cannot address (tensor/cuda) crosses tcp through
// host staging: the device's pinned memory where it has some
// (tensor.StageFor), so the socket reads into or writes from memory the
// device copies by one DMA. A reader copies the bytes into the device as
// they arrive (fabric.StagedReadProgress); an owner answering a read stages the
// range a piece at a time into a ring of two pinned pieces, the device
// copying piece k+1 out while piece k is on the wire (sendDevice). A
// pusher pushes 32 MiB segments, the device copying segment i+1 out while
// segment i is pushed (fabric.WriteStaged); an owner receiving a push into
// device memory copies the verified bytes in as they arrive (stagedPin).
// The copies count in the transfer's time.

// stageTimeout bounds the device copy an owner makes for a request (the
// device's own bound, CopyTimeout, is longer).
const stageTimeout = 30 * time.Second

// readDevice reads through host staging into dst, a segment at a time,
// the device copying each segment's bytes in as they arrive and verify
// (fabric.StagedReadProgress): only the last piece's copy is not
// overlapped with the wire.
func (t *Transport) readDevice(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	return fabric.ReadStagedProgress(ctx, fabric.TCP, src, dst, func(ctx context.Context, r fabric.Remote, p []byte, received func(off int64, n int)) (fabric.Stats, error) {
		return t.runWith(ctx, opRead, r, p, nil, received, nil)
	})
}

// writeDevice pushes src's bytes through host staging, a segment at a
// time, each a push of its range (fabric.WriteStaged).
func (t *Transport) writeDevice(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	return fabric.WriteStaged(ctx, fabric.TCP, src, dst.Length, func(ctx context.Context, off int64, p []byte) (fabric.Stats, error) {
		r := dst
		r.Offset, r.Length = dst.Offset+off, int64(len(p))
		return t.run(ctx, opWrite, r, p)
	})
}

// stagedPin is a pin of device memory with the host staging a request
// moves through; Release releases both. For a push, the received bytes go
// into the device a piece at a time while the rest arrives (received),
// one copy in flight; commit copies the remainder.
type stagedPin struct {
	tensor.Buffer // the pin
	stage         tensor.Buffer
	off, n        int64

	done    int64          // bytes copied in or being copied
	pending tensor.Pending // the copy under way
	cancel  context.CancelFunc
	err     error // the first failed copy: no more are started
}

func (s *stagedPin) Release() error {
	s.abort()
	s.stage.Release()
	return s.Buffer.Release()
}

// received starts copying the verified bytes [done, pos) into the device
// once a piece of them is there, after the copy before has ended.
func (s *stagedPin) received(pos int) {
	if s.err != nil || int64(pos)-s.done < ownerPiece {
		return
	}
	if s.err = s.wait(); s.err != nil {
		return
	}
	s.start(int64(pos))
}

func (s *stagedPin) start(pos int64) {
	ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
	s.pending, s.cancel = tensor.StartCopy(ctx, s.Buffer, s.off+s.done, s.stage, s.done, pos-s.done), cancel
	s.done = pos
}

// wait waits for the copy under way, if any.
func (s *stagedPin) wait() error {
	if s.pending == nil {
		return nil
	}
	err := s.pending.Wait(context.Background())
	s.cancel()
	s.pending, s.cancel = nil, nil
	if err != nil {
		return fmt.Errorf("tcp: copy pushed bytes into %v: %w", s.Buffer.Device(), err)
	}
	return nil
}

// abort waits for a copy under way (the staging must outlive it).
func (s *stagedPin) abort() { s.wait() }

// commit copies a push's staged bytes not yet copied into the device, and
// returns once all are there, or the first copy's error.
func (s *stagedPin) commit() error {
	if s.err != nil {
		s.abort()
		return s.err
	}
	if err := s.wait(); err != nil {
		return err
	}
	if s.done < s.n {
		s.start(s.n)
	}
	return s.wait()
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

// ownerPiece is the unit an owner stages device memory in for a read: on
// a GPU its DMA (about 0.1 ms at PCIe 5 speed) hides behind the wire time
// of the piece before (about 1 ms at 4 GB/s), and a ring of two keeps the
// pinned memory a read needs small whatever its size. A multiple of every
// power-of-two ChunkSize, so blocks do not straddle pieces.
const ownerPiece = 4 << 20

// sendDevice answers a read of device memory: the first piece is staged
// before the status goes out (so a device that fails at once is refused
// with a status, and the connection stays usable); then piece k+1's copy
// runs (tensor.StartCopy: an async copy on a stream, an event behind it)
// while piece k is written to the socket. A copy that fails mid-stream
// ends the connection: the reader has the status and some blocks, and
// learns of the failure as the owner hanging up (fabric.ErrPeerClosed).
func (s *Server) sendDevice(l *link, pin tensor.Buffer, req request) error {
	n := req.length
	if s.wholeStage.Load() || n == 0 {
		stage, data, err := stageDevice(pin, req)
		if err != nil {
			return refuse(l, err) // stageDevice released pin
		}
		defer stage.Release()
		_, err = l.sendBlocks(statusOK[:], data, s.cfg.ChunkSize, req.flags&flagCompress != 0,
			tcodec.HintFor(req.dtype), s.corruptNext.Swap(false), req.flags&flagSealed != 0)
		return err
	}
	defer pin.Release()
	piece := min(int64(ownerPiece), n)
	slots := int64(1)
	if n > piece {
		slots = 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
	stage, err := tensor.StageFor(ctx, pin, piece*slots)
	cancel()
	if err != nil {
		return refuse(l, err)
	}
	defer stage.Release()
	buf, err := tensor.BytesOf(stage)
	if err != nil {
		return refuse(l, err)
	}
	pieces := (n + piece - 1) / piece
	span := func(k int64) (at, off, m int64) { return (k % slots) * piece, k * piece, min(piece, n-k*piece) }
	// Each copy gets its own bound: the whole read may take longer than
	// one copy may.
	type inflight struct {
		p      tensor.Pending
		ctx    context.Context
		cancel context.CancelFunc
		k      int64
	}
	start := func(k int64) inflight {
		at, off, m := span(k)
		s.trace("copy", k)
		ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
		return inflight{tensor.StartCopy(ctx, stage, at, pin, req.offset+off, m), ctx, cancel, k}
	}
	wait := func(f inflight) error {
		defer f.cancel()
		err := f.p.Wait(f.ctx)
		s.trace("copied", f.k)
		if err != nil {
			_, off, m := span(f.k)
			return fmt.Errorf("tcp: stage bytes %d..%d of %v: %w", req.offset+off, req.offset+off+m, pin.Device(), err)
		}
		return nil
	}
	if err := wait(start(0)); err != nil {
		s.cfg.Logger.Warn("device staging failed", "object", req.claim.Object, "err", err)
		return refuse(l, err)
	}
	prefix := statusOK[:]
	compress, hint, sealed := req.flags&flagCompress != 0, tcodec.HintFor(req.dtype), req.flags&flagSealed != 0
	corrupt := s.corruptNext.Swap(false)
	for k := range pieces {
		var ahead *inflight
		if k+1 < pieces {
			f := start(k + 1)
			ahead = &f
		}
		at, _, m := span(k)
		s.trace("send", k)
		_, err := l.sendBlocks(prefix, buf[at:at+m], s.cfg.ChunkSize, compress, hint, corrupt, sealed)
		s.trace("sent", k)
		prefix, corrupt = nil, false
		if ahead != nil {
			// Always wait, even after a failed send: the device may still
			// be writing the other slot of the ring.
			if cerr := wait(*ahead); cerr != nil && err == nil {
				s.cfg.Logger.Warn("device staging failed mid-read; hanging up", "object", req.claim.Object, "err", cerr)
				err = cerr
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// trace reports a step of sendDevice to a test watching their order.
func (s *Server) trace(step string, piece int64) {
	if f := s.traceFn.Load(); f != nil {
		(*f)(step, piece)
	}
}
