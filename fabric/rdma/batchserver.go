package rdma

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

// handleBatch answers a resolve batch (every claim registered as if alone,
// each item with its own outcome) or a done batch.
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
	items := make([]batchItem, len(reqs))
	for i := range reqs {
		if err := ctx.Err(); err != nil {
			// The reader gave up (its queue pair went away): what is
			// registered already is released with it.
			return nil, err
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
