// Package notices is the sending side of rdt's push-notice protocol
// (/tensorlane/push/1.0.0): the notices after bytes moved (a push, a push
// batch, the broadcast's messages) go out on long-lived pooled libp2p
// streams, each answered with a status byte (ctlwire's table). The
// receiving side's loop is Serve; what a notice does is rdt's
// (rdt/push.go).
package notices

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// Push notices travel on long-lived streams: opening a libp2p stream and
// negotiating its protocol for every push cost more than a 1 MiB copy
// through shared memory. A stream carries one notice at a time (write it,
// read the one-byte status), and the notices to one slot runtime share a
// small pool of streams, so pushes in flight at once do not queue behind
// each other.

const (
	// Idle is how long a slot runtime keeps a quiet notice stream.
	Idle = 30 * time.Second
	// noticeReuse is how long a pusher reuses an idle stream: well under
	// Idle, so it rarely meets one the other side has just closed.
	noticeReuse = 10 * time.Second
	// maxIdleNotices bounds the idle streams kept per slot runtime.
	maxIdleNotices = 8
)

type noticeStream struct {
	s    network.Stream
	used time.Time
}

// Pool sends notices on the push protocol, keeping the idle streams per
// slot runtime. Host and Protocol are set before the first Send.
type Pool struct {
	Host     host.Host
	Protocol protocol.ID
	// Timeout bounds a notice's exchange when ctx has a later deadline.
	Timeout time.Duration

	mu     sync.Mutex
	idle   map[peer.ID][]noticeStream
	closed bool
}

// take returns an idle stream to id that is still fresh, or nil.
func (p *Pool) take(id peer.ID) network.Stream {
	p.mu.Lock()
	defer p.mu.Unlock()
	for list := p.idle[id]; len(list) > 0; list = p.idle[id] {
		ns := list[len(list)-1]
		p.idle[id] = list[:len(list)-1]
		if time.Since(ns.used) < noticeReuse {
			return ns.s
		}
		ns.s.Reset()
	}
	return nil
}

// put keeps s for the next notice to id, or closes it.
func (p *Pool) put(id peer.ID, s network.Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle[id]) >= maxIdleNotices {
		s.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[peer.ID][]noticeStream{}
	}
	p.idle[id] = append(p.idle[id], noticeStream{s, time.Now()})
}

// Close resets every idle stream; later puts close theirs. Idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, list := range p.idle {
		for _, ns := range list {
			ns.s.Reset()
		}
	}
	p.idle = nil
}

// Send delivers note to the slot's runtime and returns its status
// byte. A pooled stream that fails is usually one the other side closed
// while idle, before reading the notice, so the notice is sent again, once,
// on a new stream; a failure on a new stream is returned. (Only a
// connection lost after the notice was read and before its answer came
// back makes the slot count that push twice; its bytes are the same.)
func (p *Pool) Send(ctx context.Context, to peer.ID, note []byte) (byte, error) {
	status, _, err := p.SendItems(ctx, to, note, 0)
	return status, err
}

// SendItems is Send for a notice about items slots (a push batch): an
// answer of ctlwire.StatusItems is followed by one status byte per item,
// returned too.
func (p *Pool) SendItems(ctx context.Context, to peer.ID, note []byte, items int) (byte, []byte, error) {
	for {
		s, pooled := p.take(to), true
		if s == nil {
			var err error
			if s, err = p.Host.NewStream(ctx, to, p.Protocol); err != nil {
				return 0, nil, fmt.Errorf("rdt: push done, but the slot's runtime cannot be told: %w", err)
			}
			pooled = false
		}
		status, each, err := exchange(ctx, s, note, items, p.Timeout)
		if err == nil {
			p.put(to, s)
			return status, each, nil
		}
		s.Reset()
		if !pooled || ctx.Err() != nil {
			return 0, nil, fmt.Errorf("rdt: notify push: %w", err)
		}
	}
}

func exchange(ctx context.Context, s network.Stream, note []byte, items int, timeout time.Duration) (byte, []byte, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	s.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if err := ctlwire.WriteMsg(s, note); err != nil {
		return 0, nil, err
	}
	status := make([]byte, 1, 1+items)
	if _, err := io.ReadFull(s, status); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	var each []byte
	if items > 0 && status[0] == ctlwire.StatusItems {
		each = status[1 : 1+items]
		if _, err := io.ReadFull(s, each); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, err
		}
	}
	s.SetDeadline(time.Time{})
	return status[0], each, nil
}

// IdleTo counts the idle streams kept to id.
func (p *Pool) IdleTo(id peer.ID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[id])
}
