package rdt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"

	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
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
	maxRefBytes    = ctlwire.MaxRef
	maxEnvelope    = MaxPayload + maxRefs*maxRefBytes/4
	controlTimeout = 30 * time.Second
	// ackWait bounds how long a control handler waits for the sender's
	// acknowledgement of its answer (an older sender sends none: EOF).
	ackWait = 2 * time.Second
	ackByte = 1
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
	to = d.String(ctlwire.MaxString)
	from := d.Bytes(128)
	m.From.Name = d.String(ctlwire.MaxString)
	for n := d.Count(refwire.MaxAddrs); n > 0; n-- {
		a, aerr := ma.NewMultiaddrBytes(d.Bytes(ctlwire.MaxString))
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

// ErrDeliveryUnknown: Send wrote the whole message but the receiver's
// answer was lost (its runtime or the connection went away), so whether
// the message was queued is not known. Send never retries (delivery is at
// most once); a caller that must know asks the receiver.
var ErrDeliveryUnknown = errs.DeliveryUnknown

// Send delivers a message to an actor on this or another runtime, at most
// once. A nil error means the receiving runtime queued the message for the
// actor; ErrUnknownActor, a refusal (inbox full, receiver shutting down) or
// a failure to reach the receiver mean it did not; ErrDeliveryUnknown
// means the answer was lost after the whole message went out. A receiver
// that shuts down answers the messages it has queued before it closes.
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
	var status [1]byte
	if _, err := io.ReadFull(s, status[:]); err != nil {
		// The whole message went out: it may have been queued.
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("%w: %v: no reply: %w", ErrDeliveryUnknown, to, err)
	}
	reason, _ := io.ReadAll(io.LimitReader(s, 1024))
	// Say the answer arrived: a receiver closing its connection before
	// that could reset it under the answer (see handleControl).
	s.Write([]byte{ackByte})
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
	closed := r.closed
	r.mu.Unlock()
	if closed {
		// Decided before the select, which picks at random among ready
		// cases: a closing runtime queues nothing more.
		return ErrClosed
	}
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
	if !r.ctl.enter() {
		s.Write([]byte{replyBusy})
		s.Write([]byte("runtime shutting down"))
		s.Close()
		return
	}
	defer r.ctl.leave()
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
	// Wait (briefly) for the sender to say it read the answer: closing the
	// connection at Shutdown while bytes are unread on it makes the kernel
	// send a reset, which can destroy the answer in flight.
	s.CloseWrite()
	s.SetReadDeadline(time.Now().Add(ackWait))
	var ack [1]byte
	s.Read(ack[:])
}

// handlers counts control handlers in flight, so Shutdown lets them write
// their answers before the control host closes: a message queued is a
// message acknowledged.
type handlers struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n reaches 0
}

func (h *handlers) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.n++
	return true
}

func (h *handlers) leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n--; h.n == 0 && h.closed {
		close(h.idle)
	}
}

// drain refuses new handlers and waits for those in flight, within ctx.
func (h *handlers) drain(ctx context.Context) {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		h.idle = make(chan struct{})
		if h.n == 0 {
			close(h.idle)
		}
	}
	idle := h.idle
	h.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}
