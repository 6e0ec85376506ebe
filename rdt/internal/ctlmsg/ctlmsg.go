// Package ctlmsg is rdt's actor-message protocol (/tensorlane/ctl/1.0.0):
// one libp2p stream per message; the sender writes a length-prefixed
// envelope, the receiver answers with a status byte and a reason, so Send
// reports an unknown actor or a full inbox instead of losing the message,
// and the sender acknowledges the answer. rdt's Send and its control
// handler are its two ends (rdt/control.go); the inboxes stay rdt's.
package ctlmsg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

const (
	version = 1
	// MaxPayload bounds a message's payload: tensors belong in refs.
	MaxPayload  = 4 << 20
	maxRefs     = 4096
	maxRefBytes = ctlwire.MaxRef
	maxEnvelope = MaxPayload + maxRefs*maxRefBytes/4
	// ackWait bounds how long a handler waits for the sender's
	// acknowledgement of its answer (an older sender sends none: EOF).
	ackWait = 2 * time.Second
	ackByte = 1
)

// Answers: the first byte of the receiver's reply.
const (
	ReplyOK byte = iota
	ReplyUnknownActor
	ReplyMalformed
	ReplyBusy
)

// Envelope is one message: its receiving actor, its sender (the receiver
// trusts the authenticated connection over From), payload and refs.
type Envelope struct {
	To        string
	From      peer.ID
	FromName  string
	FromAddrs []ma.Multiaddr
	Payload   []byte
	Refs      []refwire.Ref
}

// Encode writes e (version 1).
func Encode(m Envelope) ([]byte, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("rdt: payload of %d bytes over the %d-byte limit; put tensors in refs", len(m.Payload), MaxPayload)
	}
	if len(m.Refs) > maxRefs {
		return nil, fmt.Errorf("rdt: %d refs in one message, limit %d", len(m.Refs), maxRefs)
	}
	e := wire.Encoder{Buf: make([]byte, 0, 256+len(m.Payload))}
	e.Byte(version)
	e.String(m.To)
	e.Bytes([]byte(m.From))
	e.String(m.FromName)
	e.Uvarint(uint64(len(m.FromAddrs)))
	for _, a := range m.FromAddrs {
		e.Bytes(a.Bytes())
	}
	e.Bytes(m.Payload)
	e.Uvarint(uint64(len(m.Refs)))
	for _, r := range m.Refs {
		b, err := refwire.Marshal(r)
		if err != nil {
			return nil, err
		}
		e.Bytes(b)
	}
	return e.Buf, nil
}

// Decode reads an envelope; malformed input is an error (wire.ErrMalformed,
// or errs.MalformedRef for a ref), never a panic.
func Decode(p []byte) (Envelope, error) {
	var m Envelope
	d := wire.NewDecoder(p)
	if v := d.Byte(); v != version {
		return Envelope{}, fmt.Errorf("%w: envelope version %d", wire.ErrMalformed, v)
	}
	m.To = d.String(ctlwire.MaxString)
	from := d.Bytes(128)
	m.FromName = d.String(ctlwire.MaxString)
	for n := d.Count(refwire.MaxAddrs); n > 0; n-- {
		a, aerr := ma.NewMultiaddrBytes(d.Bytes(ctlwire.MaxString))
		if aerr == nil {
			m.FromAddrs = append(m.FromAddrs, a)
		}
	}
	m.Payload = d.Bytes(MaxPayload)
	for n := d.Count(maxRefs); n > 0 && d.Err() == nil; n-- {
		ref, rerr := refwire.Unmarshal(d.Bytes(maxRefBytes))
		if rerr != nil && d.Err() == nil {
			return Envelope{}, rerr
		}
		m.Refs = append(m.Refs, ref)
	}
	if err := d.Finish(); err != nil {
		return Envelope{}, err
	}
	if len(from) > 0 {
		var err error
		if m.From, err = peer.IDFromBytes(from); err != nil {
			return Envelope{}, fmt.Errorf("%w: sender: %v", wire.ErrMalformed, err)
		}
	}
	return m, nil
}

// Call sends an encoded envelope on s and returns the receiver's answer.
// sent says the whole message went out before err (so it may have been
// queued).
func Call(ctx context.Context, s network.Stream, body []byte) (status byte, reason string, sent bool, err error) {
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(body)))
	if _, err := s.Write(append(n[:], body...)); err != nil {
		return 0, "", false, err
	}
	var st [1]byte
	if _, err := io.ReadFull(s, st[:]); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, "", true, err
	}
	r, _ := io.ReadAll(io.LimitReader(s, 1024))
	// Say the answer arrived: a receiver closing its connection before
	// that could reset it under the answer (see Serve).
	s.Write([]byte{ackByte})
	return st[0], string(r), true, nil
}

// Serve answers the message on s: deliver queues it (within timeout/2) or
// says why not (errs.UnknownActor, or a refusal).
func Serve(s network.Stream, timeout time.Duration, log *slog.Logger, deliver func(context.Context, Envelope) error) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(timeout))
	reply := func(code byte, reason string) { s.Write(append([]byte{code}, reason...)) }
	var n [4]byte
	if _, err := io.ReadFull(s, n[:]); err != nil {
		s.Reset()
		return
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxEnvelope {
		reply(ReplyMalformed, fmt.Sprintf("message of %d bytes over the limit", size))
		return
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(s, body); err != nil {
		s.Reset()
		return
	}
	m, err := Decode(body)
	if err != nil {
		log.Warn("malformed control message", "from", refwire.ShortID(s.Conn().RemotePeer()), "err", err)
		reply(ReplyMalformed, err.Error())
		return
	}
	// The libp2p connection authenticated the sender; trust it over the
	// envelope.
	m.From = s.Conn().RemotePeer()
	ctx, cancel := context.WithTimeout(context.Background(), timeout/2)
	defer cancel()
	switch err := deliver(ctx, m); {
	case err == nil:
		reply(ReplyOK, "")
	case errors.Is(err, errs.UnknownActor):
		reply(ReplyUnknownActor, err.Error())
	default:
		reply(ReplyBusy, err.Error())
	}
	// Wait (briefly) for the sender to say it read the answer: closing the
	// connection at Shutdown while bytes are unread on it makes the kernel
	// send a reset, which can destroy the answer in flight.
	s.CloseWrite()
	s.SetReadDeadline(time.Now().Add(ackWait))
	var ack [1]byte
	s.Read(ack[:])
}

// Refuse answers s that the runtime is shutting down.
func Refuse(s network.Stream) {
	s.Write([]byte{ReplyBusy})
	s.Write([]byte("runtime shutting down"))
	s.Close()
}

// Gate counts handlers in flight, so Shutdown lets them write their
// answers before the control host closes: a message queued is a message
// acknowledged. The zero value is open.
type Gate struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n reaches 0
}

// Enter admits a handler, unless the gate is draining.
func (h *Gate) Enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.n++
	return true
}

// Leave ends a handler Enter admitted.
func (h *Gate) Leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n--; h.n == 0 && h.closed {
		close(h.idle)
	}
}

// Drain refuses new handlers and waits for those in flight, within ctx.
func (h *Gate) Drain(ctx context.Context) {
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
