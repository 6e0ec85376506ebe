package shm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

// handleBatch answers a batch of read or push requests (batchwire.go): it
// opens and grants each item as handle does one request, answers with
// every item's grant or refusal and the granted items' descriptors, and
// holds every pin until the client's one done. Each item is checked as a
// single request is (the Source's Open with the claim's range, or the
// Sink's OpenSink for a push; CheckRange; the export's own range checks:
// a push descriptor reaches its sink's pages alone, writable), and fails
// alone (a busy sink with fabric.ErrSinkBusy, typed). It returns an error only
// when the connection cannot be used any more.
func (s *Server) handleBatch(c *net.UnixConn, buf, oob []byte, reqs []request, sent map[uint64]bool, who peer.ID) (err error) {
	items := make([]batchItem, len(reqs))
	pins := make([]tensor.Buffer, 0, len(reqs))
	var fds []int
	// One bound for all the opens: a stalled Source must not hold the
	// connection for a timeout per item.
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandshakeTimeout)
	for i, req := range reqs {
		pin, err := s.open(ctx, req)
		if err == nil {
			err = fabric.CheckRange(req.offset, req.length, pin.Len())
		}
		var g grant
		fd := -1
		if err == nil && req.length > 0 {
			g, fd, _, err = s.exportHandle(pin, req, sent)
			if err != nil && !errors.Is(err, tensor.ErrReleased) {
				level := slog.LevelDebug
				if !s.exportWarned.Swap(true) {
					level = slog.LevelWarn
				}
				s.cfg.Logger.Log(s.ctx, level, "shm: cannot grant the object, the reader must take another path", "object", req.claim.Object, "batch", true, "push", req.op == opPush, "err", err)
			}
		}
		if err != nil {
			if pin != nil {
				pin.Release()
			}
			if s.ctx.Err() != nil {
				// Close cancelled the opens: the reader must learn that the
				// owner is going away, not of an internal error.
				err = fmt.Errorf("%w: %v", fabric.ErrOwnerClosed, err)
			}
			items[i] = refusedItem(err)
			continue
		}
		pins = append(pins, pin)
		if fd >= 0 {
			fds = append(fds, fd)
		}
		items[i] = batchItem{g: g, code: peerauth.StatusOK}
	}
	cancel()
	// As in handle: every way out closes the connection before unpinning.
	defer func() {
		closeAll(fds)
		if err != nil {
			c.Close()
		}
		for _, pin := range pins {
			pin.Release()
		}
	}()
	reply := marshalBatchReply(items, len(fds))
	if s.corrupt.Swap(false) {
		reply[replyHead+20] ^= 0x40 // inside the first item: a wrong place to copy from
	}
	c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
	first := fds[:min(len(fds), maxFDsPerPacket)]
	if err = sendPacketFDs(c, reply, first); err != nil {
		return err
	}
	for rest := fds[len(first):]; len(rest) > 0; {
		n := min(len(rest), maxFDsPerPacket)
		if err = sendPacketFDs(c, fdsPacket(n), rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	// The descriptors are the client's now (or the socket's, until it
	// reads them): ours go at once, whatever the client does.
	closeAll(fds)
	fds = nil
	return s.awaitDone(c, buf, oob, " after a batch")
}
