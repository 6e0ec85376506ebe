package notices

import (
	"errors"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// Serve answers the notices of one stream, one at a time, with what answer
// says (a status byte, or a push batch's statuses), until the sender
// closes it or it has been quiet for Idle. A notice whose framing is lost
// is refused and the stream hung up.
func Serve(s network.Stream, answer func(from peer.ID, note []byte) []byte) {
	defer s.Close()
	from := s.Conn().RemotePeer()
	for {
		s.SetDeadline(time.Now().Add(Idle))
		p, err := ctlwire.ReadMsg(s, ctlwire.MaxNotice)
		if err != nil {
			if errors.Is(err, wire.ErrMalformed) {
				s.Write([]byte{ctlwire.StatusRefused})
			}
			return // closed, reset, quiet for Idle, or malformed
		}
		if _, err := s.Write(answer(from, p)); err != nil {
			return
		}
	}
}
