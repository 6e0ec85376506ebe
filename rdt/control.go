package rdt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/internal/wire"
)

// The control channel: one libp2p stream (Noise-secured, yamux-multiplexed)
// per message. The sender writes a length-prefixed envelope; the receiver
// answers with a status byte and a reason, so Send reports an unknown actor
// or a full inbox instead of losing the message.
const (
	controlProtocol = protocol.ID("/tensorlane/ctl/1.0.0")
	envelopeVersion = 1
	// MaxPayload bounds a control message's payload: tensors belong in refs.
	MaxPayload     = 4 << 20
	maxRefs        = 4096
	maxRefBytes    = 4096
	maxEnvelope    = MaxPayload + maxRefs*maxRefBytes/4
	controlTimeout = 30 * time.Second
)

const (
	replyOK byte = iota
	replyUnknownActor
	replyMalformed
	replyBusy
)

func encodeEnvelope(to string, m Message) ([]byte, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("rdt: payload of %d bytes over the %d-byte limit; put tensors in refs", len(m.Payload), MaxPayload)
	}
	if len(m.Refs) > maxRefs {
		return nil, fmt.Errorf("rdt: %d refs in one message, limit %d", len(m.Refs), maxRefs)
	}
	e := wire.Encoder{Buf: make([]byte, 0, 256+len(m.Payload))}
	e.Byte(envelopeVersion)
	e.String(to)
	e.Bytes([]byte(m.From.Peer))
	e.String(m.From.Name)
	e.Uvarint(uint64(len(m.From.Addrs)))
	for _, a := range m.From.Addrs {
		e.Bytes(a.Bytes())
	}
	e.Bytes(m.Payload)
	e.Uvarint(uint64(len(m.Refs)))
	for _, r := range m.Refs {
		b, err := r.MarshalBinary()
		if err != nil {
			return nil, err
		}
		e.Bytes(b)
	}
	return e.Buf, nil
}

func decodeEnvelope(p []byte) (to string, m Message, err error) {
	d := wire.NewDecoder(p)
	if v := d.Byte(); v != envelopeVersion {
		return "", Message{}, fmt.Errorf("%w: envelope version %d", wire.ErrMalformed, v)
	}
	to = d.String(maxRefString)
	from := d.Bytes(128)
	m.From.Name = d.String(maxRefString)
	for n := d.Count(maxRefAddrs); n > 0; n-- {
		a, aerr := ma.NewMultiaddrBytes(d.Bytes(maxRefString))
		if aerr == nil {
			m.From.Addrs = append(m.From.Addrs, a)
		}
	}
	m.Payload = d.Bytes(MaxPayload)
	for n := d.Count(maxRefs); n > 0 && d.Err() == nil; n-- {
		ref, rerr := ParseRef(d.Bytes(maxRefBytes))
		if rerr != nil && d.Err() == nil {
			return "", Message{}, rerr
		}
		m.Refs = append(m.Refs, ref)
	}
	if err := d.Finish(); err != nil {
		return "", Message{}, err
	}
	if len(from) > 0 {
		if m.From.Peer, err = peer.IDFromBytes(from); err != nil {
			return "", Message{}, fmt.Errorf("%w: sender: %v", wire.ErrMalformed, err)
		}
	}
	return to, m, nil
}

// Send delivers a message to an actor on this or another runtime. It returns
// once the receiving runtime has queued the message, with ErrUnknownActor if
// there is no such actor.
func (a *Actor) Send(ctx context.Context, to ActorAddr, msg Message) error {
	r := a.rt
	if r.isClosed() {
		return ErrClosed
	}
	msg.From = a.Addr()
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	if to.Peer == r.host.ID() {
		// Round-trip through the encoding so local and remote receivers see
		// the same thing (and refs are independent copies).
		body, err := encodeEnvelope(to.Name, msg)
		if err != nil {
			return err
		}
		_, m, err := decodeEnvelope(body)
		if err != nil {
			return err
		}
		return r.deliver(ctx, to.Name, m)
	}
	body, err := encodeEnvelope(to.Name, msg)
	if err != nil {
		return err
	}
	if len(to.Addrs) > 0 {
		r.host.Peerstore().AddAddrs(to.Peer, to.Addrs, peerstore.TempAddrTTL)
	}
	s, err := r.host.NewStream(ctx, to.Peer, controlProtocol)
	if err != nil {
		return fmt.Errorf("rdt: open control stream to %v: %w", to, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(body)))
	if _, err := s.Write(append(n[:], body...)); err != nil {
		return fmt.Errorf("rdt: send to %v: %w", to, err)
	}
	s.CloseWrite()
	var status [1]byte
	if _, err := io.ReadFull(s, status[:]); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("rdt: send to %v: no reply: %w", to, err)
	}
	reason, _ := io.ReadAll(io.LimitReader(s, 1024))
	switch status[0] {
	case replyOK:
		return nil
	case replyUnknownActor:
		return fmt.Errorf("%w: %v", ErrUnknownActor, to)
	default:
		return fmt.Errorf("rdt: %v refused the message: %s", to, reason)
	}
}

func (r *Runtime) deliver(ctx context.Context, name string, m Message) error {
	r.mu.Lock()
	a, ok := r.actors[name]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q on %s", ErrUnknownActor, name, r.cfg.Host)
	}
	select {
	case a.inbox <- m:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rdt: inbox of %q full: %w", name, ctx.Err())
	case <-r.done:
		return ErrClosed
	}
}

func (r *Runtime) handleControl(s network.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(controlTimeout))
	reply := func(code byte, reason string) { s.Write(append([]byte{code}, reason...)) }
	var n [4]byte
	if _, err := io.ReadFull(s, n[:]); err != nil {
		s.Reset()
		return
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxEnvelope {
		reply(replyMalformed, fmt.Sprintf("message of %d bytes over the limit", size))
		return
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(s, body); err != nil {
		s.Reset()
		return
	}
	to, m, err := decodeEnvelope(body)
	if err != nil {
		r.log.Warn("malformed control message", "from", shortID(s.Conn().RemotePeer()), "err", err)
		reply(replyMalformed, err.Error())
		return
	}
	// The libp2p connection authenticated the sender; trust it over the
	// envelope.
	m.From.Peer = s.Conn().RemotePeer()
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout/2)
	defer cancel()
	switch err := r.deliver(ctx, to, m); {
	case err == nil:
		reply(replyOK, "")
	case errors.Is(err, ErrUnknownActor):
		reply(replyUnknownActor, err.Error())
	default:
		reply(replyBusy, err.Error())
	}
}
