package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/acceptor"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// ServerConfig configures the owner side of the tcp transport. Zero values
// mean the documented defaults.
type ServerConfig struct {
	Addr string // listen address; default "127.0.0.1:0"
	// Listener, when set, is served instead of listening on Addr (a socket
	// made in another network namespace, say). Close closes it.
	Listener net.Listener
	// Security: Identity (required), ClusterKey and EncryptData (cluster membership
	// and encryption in the data handshake), AllowPeer (nil admits every
	// authenticated peer), StallTimeout (how long a transfer may make no
	// progress: a reader that stopped reading, a pusher that stopped
	// sending; default 30 s) and Logger; see fabric.Security.
	fabric.Security
	Source fabric.Source // required: resolves claims to memory
	// Sink resolves the claims of pushes to the buffers they fill; nil:
	// pushes are refused with fabric.ErrObjectNotFound.
	Sink fabric.Sink
	// ChunkSize is the unit of checksumming (and of compression) for
	// reads; default 256 KiB, at most 1 MiB.
	ChunkSize int
	// HandshakeTimeout bounds the authentication of a new connection and
	// resolving a claim (a resolution that overruns is cancelled within
	// 1/8 of it more); default 10 s.
	HandshakeTimeout time.Duration
	// Limits caps connections (in total and per peer) and closes
	// authenticated connections idle for longer than Limits.IdleTimeout;
	// zero values mean fabric's defaults (1024, 128, 5 min).
	Limits fabric.ListenerLimits
	// ListenerMetrics counts the listener (label "tcp"); nil: not counted.
	ListenerMetrics *fabric.ListenerMetrics
	// Registerer takes the server's own metrics
	// (tensorlane_tcp_owner_checksums_total); nil: not registered, still
	// counted (Server.SendSums).
	Registerer prometheus.Registerer
}

func (c *ServerConfig) defaults() error {
	if err := c.Security.Defaults("tcp: ServerConfig"); err != nil {
		return err
	}
	if c.Source == nil {
		return errors.New("tcp: ServerConfig needs a Source")
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.ChunkSize > tcodec.MaxBlock {
		return fmt.Errorf("tcp: ChunkSize %d above %d", c.ChunkSize, tcodec.MaxBlock)
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	c.Limits = c.Limits.WithDefaults()
	return nil
}

// DefaultChunkSize keeps each checksummed chunk small enough to stay in
// cache between the checksum and the copy.
const DefaultChunkSize = 256 << 10

// Server serves object reads and pushes on dedicated TCP connections.
type Server struct {
	cfg  ServerConfig
	ln   net.Listener
	loop *acceptor.Loop

	corruptNext  atomic.Bool                                    // tests: damage the next block served
	refuseSealed atomic.Bool                                    // tests: answer flagSealed as an owner before it did
	wholeStage   atomic.Bool                                    // benchmarks: stage a device read whole before sending, as before sendDevice
	traceFn      atomic.Pointer[func(step string, piece int64)] // tests: sendDevice's steps

	sums sumStats // raw blocks sent, by where their checksum came from
}

// SumStats counts the raw blocks an owner sent with a checksum, by where
// the checksum came from. A sealed object's blocks are computed (and
// stored) by its first read and cached for every later one; other
// objects' (borrowed memory that may change, device memory staged per
// read) are computed at every send.
type SumStats struct {
	Cached   int64 // from the object's cache: its memory not read for them
	Stored   int64 // computed at send and stored in the object's cache
	Computed int64 // computed at send: no cache (the object may change), or off its grid
}

// SendSums reports where the checksums of the raw blocks served so far
// came from.
func (s *Server) SendSums() SumStats {
	return s.sums.stats()
}

var sumSources = [3]string{"cached", "stored", "computed"}

// Listen starts a data server.
func Listen(cfg ServerConfig) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("tcp: listen on %s: %w", cfg.Addr, err)
		}
	}
	s := &Server{cfg: cfg, ln: ln}
	if cfg.Registerer != nil {
		vec := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_tcp_owner_checksums_total",
			Help: "Raw blocks the tcp owner sent with a checksum, by its source: cached (a sealed object's, computed once), stored (computed and cached), computed (at send).",
		}, []string{"source"})
		if err := cfg.Registerer.Register(vec); err != nil {
			if cfg.Listener == nil {
				ln.Close()
			}
			return nil, fmt.Errorf("tcp: register metrics: %w", err)
		}
		for i, name := range sumSources {
			s.sums.vec[i] = vec.WithLabelValues(name)
		}
	}
	s.loop = acceptor.Start(ln, acceptor.Config{Name: "tcp", Limits: cfg.Limits, Metrics: cfg.ListenerMetrics, Logger: cfg.Logger}, s.serve)
	return s, nil
}

// Addr returns the address readers dial.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// serve runs one connection; the accept loop closes it afterwards.
func (s *Server) serve(c net.Conn) {
	raw := c // the accept loop's; c may become the encrypted one
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	res, err := peerauth.ServerFor(c, s.cfg.Security)
	if err == nil {
		c, err = res.Wrap(c)
	}
	who := res.Peer
	if err != nil {
		s.cfg.Logger.Warn("data connection refused", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if err := s.loop.Admit(raw, who.String()); err != nil {
		return
	}
	l := newLink(c, s.cfg.StallTimeout)
	l.sumStats = &s.sums
	// A record layer may lose its place if a deadline interrupts a
	// record half read, so encrypted connections wait for requests under
	// the idle deadline alone (see awaitRequest).
	l.strictIdle = res.Keys != nil
	l.sealed = res.Keys != nil
	l.SetDeadline(time.Time{}) // the handshake's
	claims := claimCtx{timeout: s.cfg.HandshakeTimeout}
	defer claims.stop()
	for {
		err := l.awaitRequest(s.cfg.Limits.IdleTimeout)
		var req request
		if err == nil {
			// A request that starts arriving must arrive in time.
			l.armRead()
			req, err = readRequest(l.r, &l.reqb)
			switch {
			case err != nil || req.flags&flagSealed == 0:
			case s.refuseSealed.Load():
				err = fmt.Errorf("%w: unknown flags %#x", fabric.ErrBadRequest, req.flags) // as before flagSealed
			case !l.sealed:
				err = fmt.Errorf("%w: flag sealed on a plain connection", fabric.ErrBadRequest)
			}
		}
		if errors.Is(err, errIdle) {
			s.loop.Dropped("idle", who.String())
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Debug("data connection ended", "peer", who, "err", err)
				if errors.Is(err, fabric.ErrBadRequest) {
					l.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
					peerauth.WriteStatus(c, peerauth.StatusBadRequest, err.Error())
				}
			}
			return
		}
		if req.op == opWrite {
			err = s.handleWrite(l, &claims, req)
		} else {
			err = s.handleRead(l, &claims, req)
		}
		if err != nil {
			s.cfg.Logger.Debug("request failed", "op", opName(req.op), "peer", who, "object", req.claim.Object, "err", err)
			return
		}
	}
}

// refuse answers a request with the status that carries err. The
// connection stays usable unless the write fails.
func refuse(l *link, err error) error {
	l.armWrite()
	return peerauth.WriteStatus(l, peerauth.StatusFor(err), err.Error())
}

// open resolves a claim with a bounded wait and checks the range.
func (s *Server) open(claims *claimCtx, req request, resolve func(context.Context, fabric.Claim) (tensor.Buffer, error)) (tensor.Buffer, []byte, error) {
	pin, err := resolve(claims.begin(), req.claim.For(req.offset, req.length))
	claims.end()
	if err != nil {
		return nil, nil, err
	}
	if err = fabric.CheckRange(req.offset, req.length, pin.Len()); err != nil {
		pin.Release()
		return nil, nil, err
	}
	if tensor.IsDevice(pin) {
		if req.op == opRead {
			return pin, nil, nil // staged piece by piece as it is sent (sendDevice)
		}
		return stageDevice(pin, req)
	}
	data, err := tensor.BytesOf(pin)
	if err != nil {
		pin.Release()
		return nil, nil, err
	}
	return pin, data[req.offset : req.offset+req.length], nil
}

// handleRead answers one read. It returns an error only when the
// connection cannot be used any more.
func (s *Server) handleRead(l *link, claims *claimCtx, req request) error {
	pin, data, err := s.open(claims, req, s.cfg.Source.Open)
	if err != nil {
		return refuse(l, err)
	}
	if tensor.IsDevice(pin) {
		return s.sendDevice(l, pin, req)
	}
	defer pin.Release()
	// A sealed object's checksums are computed once, by its first read,
	// and served from its cache after that (tensor.ChunkSums).
	l.sums, l.sumsAt = tensor.SumsOf(pin), req.offset
	// writev: the status, block headers and the tensor bytes straight from
	// device memory, with no copy into a staging buffer (unless the reader
	// asked for compression, which encodes block by block).
	_, err = l.sendBlocks(statusOK[:], data, s.cfg.ChunkSize, req.flags&flagCompress != 0,
		tcodec.HintFor(req.dtype), s.corruptNext.Swap(false), req.flags&flagSealed != 0)
	l.sums = nil
	return err
}

var statusOK = [1]byte{peerauth.StatusOK}

var errNoSink = fmt.Errorf("%w: this owner accepts no pushes", fabric.ErrObjectNotFound)

// handleWrite receives one push into the sink the claim names.
func (s *Server) handleWrite(l *link, claims *claimCtx, req request) error {
	eager := req.flags&flagEager != 0
	var pin tensor.Buffer
	var data []byte
	var err error
	if s.cfg.Sink == nil {
		err = errNoSink
	} else {
		pin, data, err = s.open(claims, req, s.cfg.Sink.OpenSink)
	}
	if err != nil {
		if err := refuse(l, err); err != nil || !eager {
			return err
		}
		// The blocks are on their way already: skip them to stay in step.
		return l.skipBlocks(req.length)
	}
	defer pin.Release()
	if !eager {
		l.armWrite()
		if _, err := l.Write(statusOK[:]); err != nil {
			return err
		}
	}
	var received func(int)
	sp, device := pin.(*stagedPin)
	if device {
		received = sp.received
	}
	if _, err := l.recvBlocksTo(data, req.offset, req.flags&flagSealed != 0, received); err != nil {
		if device {
			sp.abort()
		}
		if errors.Is(err, fabric.ErrCorrupt) {
			// Tell the pusher why, then hang up: the rest of its blocks
			// are still in flight, so the connection is out of step.
			l.armWrite()
			peerauth.WriteStatus(l, statusCorrupt, err.Error())
		}
		return err
	}
	if device {
		// Device memory: the verified bytes went in as they arrived; the
		// rest goes in now, before the pusher hears that its push is
		// complete.
		if err := sp.commit(); err != nil {
			return refuse(l, err)
		}
	}
	l.armWrite()
	_, err = l.Write(statusOK[:])
	return err
}

// claimCtx is the context the claim resolutions of one connection run
// under: each is bounded by timeout (HandshakeTimeout) like a
// context.WithTimeout, without the new context and timer that costs per
// request. One timer per connection is re-armed at most every timeout/8,
// timeout+timeout/8 ahead, so a resolution that overruns is cancelled
// between timeout and 9/8 of it. Resolutions on one connection run one at
// a time, on its serving goroutine; a resolver must not keep the context
// after it returns.
type claimCtx struct {
	context.Context // the current one; cancelled when a resolution overran
	timeout         time.Duration

	mu       sync.Mutex
	cancel   context.CancelFunc
	timer    *time.Timer
	armed    time.Time // the timer fires at armed+timeout+timeout/8
	active   bool      // a resolution is running
	deadline time.Time // the running resolution's
}

func (o *claimCtx) begin() context.Context {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.Context == nil || o.Context.Err() != nil {
		o.Context, o.cancel = context.WithCancel(context.Background())
	}
	o.active, o.deadline = true, now.Add(o.timeout)
	if now.Sub(o.armed) > o.timeout/8 {
		o.armed = now
		if o.timer == nil {
			o.timer = time.AfterFunc(o.timeout+o.timeout/8, o.fire)
		} else {
			o.timer.Reset(o.timeout + o.timeout/8)
		}
	}
	return o
}

func (o *claimCtx) end() {
	o.mu.Lock()
	o.active = false
	o.mu.Unlock()
}

// fire cancels the running resolution if it overran. A timer that went
// off just as begin re-armed it finds a fresh deadline and does nothing.
func (o *claimCtx) fire() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.active && !time.Now().Before(o.deadline) {
		o.cancel()
	}
}

func (o *claimCtx) stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.timer != nil {
		o.timer.Stop()
	}
	if o.cancel != nil {
		o.cancel()
	}
}

// Deadline is the running resolution's.
func (o *claimCtx) Deadline() (time.Time, bool) { return o.deadline, true }

// Err says why a resolution was cancelled: it ran out of time.
func (o *claimCtx) Err() error {
	if o.Context.Err() != nil {
		return context.DeadlineExceeded
	}
	return nil
}

// Close stops accepting, closes every connection (aborting transfers in
// flight) and waits for the server's goroutines. It is idempotent.
func (s *Server) Close() error { return s.loop.Close() }
