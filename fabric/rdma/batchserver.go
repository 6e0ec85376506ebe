package rdma

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

// handleBatch answers a resolve or write batch (every claim registered as
// if alone, each item with its own outcome) or a done batch.
func (s *Server) handleBatch(ctx context.Context, qp qpRef, who peer.ID, msg []byte) ([]byte, error) {
	if msg[0] == msgDoneBatch {
		ids, err := decodeDoneBatch(msg)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			s.done(regID{peer: who, id: id})
		}
		return nil, nil
	}
	reqs, err := decodeResolveBatch(msg)
	if err != nil {
		return nil, err
	}
	// The whole batch gets the time one resolution gets: a Source that
	// stalls cannot hold the reader's control exchange for a count of
	// timeouts.
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpenTimeout)
	defer cancel()
	items := make([]batchItem, len(reqs))
	for i := range reqs {
		if ctx.Err() != nil {
			// The reader gave up, or the batch ran out of time: nothing of
			// it stays registered, and the reader hears why.
			for _, r := range reqs[:i] {
				s.done(regID{peer: who, id: r.id})
			}
			return nil, fmt.Errorf("%w: resolving a batch of %d took longer than %v (%d resolved)", fabric.ErrStalled, len(reqs), s.cfg.OpenTimeout, i)
		}
		resp, err := s.register(ctx, qp, who, &reqs[i])
		if err != nil {
			items[i] = batchItem{code: peerauth.StatusFor(err), text: err.Error()}
			continue
		}
		items[i] = batchItem{resp: resp, code: peerauth.StatusOK}
	}
	return marshalBatchReply(items), nil
}
