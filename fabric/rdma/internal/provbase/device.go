package provbase

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/acceptor"
	"github.com/tensorlane/tensorlane/fabric/internal/kit"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// Base is the part of an opened NIC every provider has. A provider's
// device embeds it, calls Init before anything else, and guards its own
// tables (registrations, queue pairs) with Mu, so that Closed and those
// tables change together.
type Base struct {
	// Name is the NIC's name.
	Name string
	// Cfg is the device's open configuration, Limits defaulted.
	Cfg rdma.OpenConfig
	// Log carries the NIC's name (and what Init was given).
	Log *slog.Logger
	// Label is the listener's metrics label, "rdma/<nic>".
	Label string
	// HandshakeTimeout bounds the bootstrap handshake on both ends.
	HandshakeTimeout time.Duration

	// Mu guards Closed and the embedding device's tables.
	Mu sync.Mutex
	// Closed is set once by the device's Close.
	Closed bool

	prov    string // "softrdma", "ofi": prefixes errors
	nicAddr string // the NIC's configured address: dials leave from its host
	nextQP  uint64 // guarded by Mu
	ln      net.Listener
	loop    *acceptor.Loop // nil when the device does not listen
}

// CheckOpen validates an rdma.OpenConfig for provider prov once, before
// the provider opens anything: the security block's defaults ladder
// (an identity is required), and no encryption (rdma.ErrEncrypt: a
// provider moves registered memory as it is).
func CheckOpen(prov string, cfg *rdma.OpenConfig) error {
	if err := cfg.Security.Defaults(prov + ": OpenConfig"); err != nil {
		return err
	}
	if cfg.EncryptData {
		return rdma.ErrEncrypt
	}
	return nil
}

// Init fills the device's configuration (checked by CheckOpen): prov names the provider in
// errors, nicAddr is the NIC's configured address (queue pairs dial from
// its host part), attrs are added to the logger after the NIC's name.
func (d *Base) Init(prov, name, nicAddr string, cfg rdma.OpenConfig, handshake time.Duration, attrs ...any) {
	cfg.Limits = cfg.Limits.WithDefaults()
	d.prov, d.Name, d.nicAddr, d.Cfg, d.HandshakeTimeout = prov, name, nicAddr, cfg, handshake
	d.Log = cfg.Logger.With(append([]any{"nic", name}, attrs...)...)
	d.Label = "rdma/" + name
}

// Live returns fabric.ErrClosed once the device is closed, else nil.
func (d *Base) Live() error {
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if d.Closed {
		return fabric.ErrClosed
	}
	return nil
}

// MarkClosed sets Closed and reports whether this call did: its caller
// is the one Close that tears the device down (Close is idempotent).
// Whatever adds to the device's tables checks Closed under Mu, so after
// this the tables only shrink.
func (d *Base) MarkClosed() bool {
	d.Mu.Lock()
	defer d.Mu.Unlock()
	was := d.Closed
	d.Closed = true
	return !was
}

// Device describes the NIC, with the address it listens on.
func (d *Base) Device() rdma.Device { return rdma.Device{Name: d.Name, Addr: d.Addr()} }

// Addr is the address the device listens on ("" when it does not).
func (d *Base) Addr() string {
	if d.ln == nil {
		return ""
	}
	return d.ln.Addr().String()
}

// Serve accepts queue pairs on ln with the shared accept loop (connection
// caps, backoff, metrics) and runs serve for each; the loop closes each
// connection after serve returns.
func (d *Base) Serve(ln net.Listener, serve func(net.Conn)) {
	d.ln = ln
	d.loop = acceptor.Start(ln, acceptor.Config{Name: d.Label, Limits: d.Cfg.Limits,
		Metrics: d.Cfg.ListenerMetrics, Logger: d.Cfg.Logger}, serve)
}

// CloseListener stops accepting, closes every accepted connection and
// waits for their serve calls. Idempotent.
func (d *Base) CloseListener() error {
	if d.loop != nil {
		return d.loop.Close()
	}
	if d.ln != nil {
		return d.ln.Close()
	}
	return nil
}

// Dropped counts an accepted queue pair the device drops for reason.
func (d *Base) Dropped(reason string, who peer.ID) { d.loop.Dropped(reason, who.String()) }

// Accept authenticates an accepted connection: it numbers the queue
// pair, runs the peerauth handshake (identity, cluster key, AllowPeer)
// within HandshakeTimeout, admits the peer against the per-peer limits,
// then runs after (nil: nothing; the provider's own greeting, still under
// the handshake's deadline). ok is false when the queue pair must end:
// the device is closed, or the peer was refused (logged).
func (d *Base) Accept(c net.Conn, after func(net.Conn) error) (from rdma.RemoteQP, ok bool) {
	d.Mu.Lock()
	if d.Closed {
		d.Mu.Unlock()
		return from, false
	}
	d.nextQP++
	from.ID = d.nextQP
	d.Mu.Unlock()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(d.HandshakeTimeout))
	res, err := peerauth.ServerFor(c, d.Cfg.Security)
	if err != nil {
		d.Log.Warn("rdma queue pair refused", "remote", c.RemoteAddr(), "err", err)
		return from, false
	}
	if err := d.loop.Admit(c, res.Peer.String()); err != nil {
		return from, false
	}
	if after != nil {
		if err := after(c); err != nil {
			return from, false
		}
	}
	c.SetDeadline(time.Time{})
	from.Peer = res.Peer
	return from, true
}

// Dial connects a queue pair to a remote device's address from this
// NIC's address (so the rail is the NIC's own path) with dial, and
// authenticates that its owner is want (when not empty), then runs after
// (nil: nothing), all within ctx and HandshakeTimeout; errors are typed
// as kit.Connect's.
func (d *Base) Dial(ctx context.Context, addr string, want peer.ID,
	dial func(ctx context.Context, network, laddr, raddr string) (net.Conn, error), after func(net.Conn) error) (net.Conn, error) {
	laddr := kit.SourceAddr(d.nicAddr)
	return kit.Connect(ctx, d.HandshakeTimeout, d.prov+" "+d.Name, addr,
		func(ctx context.Context) (net.Conn, error) { return dial(ctx, "tcp", laddr, addr) },
		func(conn net.Conn) error {
			if _, err := peerauth.ClientFor(conn, d.Cfg.Security, want); err != nil {
				return err
			}
			if after != nil {
				return after(conn)
			}
			return nil
		})
}

// Handle runs the device's message handler for one message of from; a
// device without one refuses it (fabric.ErrBadRequest).
func (d *Base) Handle(ctx context.Context, from rdma.RemoteQP, msg []byte) ([]byte, error) {
	h := d.Cfg.Handler
	if h == nil {
		return nil, fmt.Errorf("%w: %s: this device takes no messages", fabric.ErrBadRequest, d.prov)
	}
	return h.HandleMessage(ctx, from, msg)
}

// Session is the passive side's bookkeeping of one accepted queue pair:
// its idle deadline, its handlers (at most a bound at once, each with a
// context cancelled when the queue pair ends), and the handler's QPClosed
// once they all returned.
type Session struct {
	d        *Base
	conn     net.Conn
	From     rdma.RemoteQP
	ctx      context.Context
	cancel   context.CancelFunc
	handlers sync.WaitGroup
	sem      chan struct{}
	armed    time.Time
}

// Session starts the bookkeeping of an accepted, authenticated queue
// pair; maxHandlers bounds its messages handled at once. The caller ends
// it with End.
func (d *Base) Session(c net.Conn, from rdma.RemoteQP, maxHandlers int) *Session {
	s := &Session{d: d, conn: c, From: from, sem: make(chan struct{}, maxHandlers)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// ArmIdle re-arms the read deadline that drops a queue pair silent for
// the listener's IdleTimeout (each one pins a descriptor, a goroutine and
// its buffers). It re-arms at most every idle/8, idle+idle/8 ahead, so it
// costs no timer per frame and bites between idle and 9/8 of it.
func (s *Session) ArmIdle() {
	idle := s.d.Cfg.Limits.IdleTimeout
	if now := time.Now(); now.Sub(s.armed) > idle/8 {
		s.conn.SetReadDeadline(now.Add(idle + idle/8))
		s.armed = now
	}
}

// Ended reports a failed read of the queue pair's connection: an idle
// queue pair is counted as dropped, any other end logged (quietly: a
// peer that goes away is normal).
func (s *Session) Ended(err error) {
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		s.d.Dropped("idle", s.From.Peer)
		return
	}
	if !errors.Is(err, net.ErrClosed) {
		s.d.Log.Debug("rdma queue pair ended", "peer", s.From.Peer, "err", err)
	}
}

// Go runs fn in a goroutine once fewer than maxHandlers are running; it
// returns false (without running fn) when the queue pair ended first.
func (s *Session) Go(fn func(ctx context.Context)) bool {
	select {
	case s.sem <- struct{}{}:
	case <-s.ctx.Done():
		return false
	}
	s.handlers.Add(1)
	go func() {
		defer s.handlers.Done()
		defer func() { <-s.sem }()
		fn(s.ctx)
	}()
	return true
}

// End closes the connection, cancels the running handlers, waits for
// them, then tells the device's handler the queue pair is gone.
func (s *Session) End() {
	s.conn.Close()
	s.cancel()
	s.handlers.Wait()
	if h := s.d.Cfg.Handler; h != nil {
		h.QPClosed(s.From)
	}
}
