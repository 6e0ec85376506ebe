package rdt

import (
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Ref is a small, serializable reference to a tensor that stays in its
// owner's device memory. It carries everything a reader needs to fetch the
// bytes directly: the owner's identity and addresses, where the tensor lives,
// its layout, the transports the owner serves, and an unguessable capability
// token. It marshals to a few hundred bytes, so it can ride any control
// channel (ours, Ray actor calls, gRPC).
type Ref struct {
	Object      fabric.ObjectID
	Owner       peer.ID
	Incarnation uint64            // the owner runtime's life; a restarted owner has a new one
	Addrs       []string          // owner's control multiaddrs
	DataAddrs   map[string]string // transport name -> data address
	Host        string            // owner's topology host
	Device      tensor.DeviceID
	Desc        tensor.Desc
	Transports  []string // transports the owner serves
	Token       []byte   // capability: whoever holds the ref may read the object
}

func (r Ref) String() string {
	return fmt.Sprintf("ref %s (%v on %s/%v, owner %s)", r.Object, r.Desc, r.Host, r.Device, shortID(r.Owner))
}

// shortID is a peer's name in logs and messages.
func shortID(id peer.ID) string { return refwire.ShortID(id) }

// MarshalBinary encodes the ref (version 1; the codec is package refwire).
// A ref with more addresses than a reader accepts is refused here, where
// the mistake is, rather than on every reader.
func (r Ref) MarshalBinary() ([]byte, error) { return refwire.Marshal(refwire.Ref(r)) }

// UnmarshalBinary decodes a ref, checking every field. Malformed input
// returns an error matching ErrMalformedRef; it never panics.
func (r *Ref) UnmarshalBinary(p []byte) error {
	out, err := refwire.Unmarshal(p)
	if err != nil {
		return err
	}
	*r = Ref(out)
	return nil
}

// span is the byte range of the owner's buffer the ref's tensor touches.
func (r Ref) span() (off, n int64) { return refwire.Ref(r).Span() }

// ParseRef decodes a marshalled ref.
func ParseRef(p []byte) (Ref, error) {
	var r Ref
	err := r.UnmarshalBinary(p)
	return r, err
}
