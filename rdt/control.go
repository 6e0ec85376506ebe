package rdt

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlmsg"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// The control channel: one libp2p stream (Noise-secured, yamux-multiplexed)
// per message, the protocol of package ctlmsg; the inboxes are the actors'.
const (
	controlProtocol = ctlmsg.Protocol
	// MaxPayload bounds a control message's payload: tensors belong in refs.
	MaxPayload     = ctlmsg.MaxPayload
	controlTimeout = 30 * time.Second
)

// encodeEnvelope is m to actor to, as ctlmsg writes it.
func encodeEnvelope(to string, m Message) ([]byte, error) {
	refs := make([]refwire.Ref, len(m.Refs))
	for i, r := range m.Refs {
		refs[i] = refwire.Ref(r)
	}
	return ctlmsg.Encode(ctlmsg.Envelope{To: to, From: m.From.Peer, FromName: m.From.Name, FromAddrs: m.From.Addrs, Payload: m.Payload, Refs: refs})
}

// decodeEnvelope reads what encodeEnvelope writes.
func decodeEnvelope(p []byte) (to string, m Message, err error) {
	e, err := ctlmsg.Decode(p)
	if err != nil {
		return "", Message{}, err
	}
	return e.To, messageOf(e), nil
}

func messageOf(e ctlmsg.Envelope) Message {
	m := Message{From: ActorAddr{Peer: e.From, Name: e.FromName, Addrs: e.FromAddrs}, Payload: e.Payload}
	for _, r := range e.Refs {
		m.Refs = append(m.Refs, Ref(r))
	}
	return m
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
	body, err := encodeEnvelope(to.Name, msg)
	if err != nil {
		return err
	}
	if to.Peer == r.host.ID() {
		// Round-trip through the encoding so local and remote receivers see
		// the same thing (and refs are independent copies).
		_, m, err := decodeEnvelope(body)
		if err != nil {
			return err
		}
		return r.deliver(ctx, to.Name, m)
	}
	return ctlmsg.Send(ctx, r.host, to.Peer, to.Addrs, to, body)
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
	if !r.ctl.Enter() {
		ctlmsg.Refuse(s)
		return
	}
	defer r.ctl.Leave()
	ctlmsg.Serve(s, controlTimeout, r.log, func(ctx context.Context, e ctlmsg.Envelope) error {
		return r.deliver(ctx, e.To, messageOf(e))
	})
}
