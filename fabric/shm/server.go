package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/acceptor"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

// ServerConfig configures the owner side of the shm and p2p transports.
// Zero values mean the documented defaults.
type ServerConfig struct {
	// Security: Identity (required), ClusterKey (the cluster key: when set,
	// clients must prove they hold it), AllowPeer, StallTimeout (bounds
	// each socket operation, a reply; default 30 s) and Logger; see
	// fabric.Security. EncryptData is ignored: no tensor byte crosses the
	// socket, only descriptors and offsets.
	fabric.Security
	Source fabric.Source // required: resolves read claims to memory
	// Sink, when set, lets writers push into buffers this runtime
	// allocated (fabric.Writer); without it pushes are refused.
	Sink fabric.Sink
	// Dir is the private directory the socket is created in; default
	// DefaultDir(). It is created with mode 0700 and refused if another
	// user owns it.
	Dir string
	// Path, when set, is the socket's full path (its directory must still
	// be private); default Dir/shm-<pid>-<random>.sock.
	Path string
	// HandshakeTimeout bounds the authentication of a new connection and
	// the Source's Open of one claim; default 10 s.
	HandshakeTimeout time.Duration
	// HoldTimeout bounds how long one client may keep an object pinned
	// between the grant and its "done" (the copy); default 60 s. A client
	// that takes longer loses the connection and its transfer fails.
	HoldTimeout time.Duration
	// Limits caps connections (in total and per peer) and closes
	// authenticated connections idle for longer than Limits.IdleTimeout;
	// zero values mean fabric's defaults (1024, 128, 5 min).
	Limits fabric.ListenerLimits
	// ListenerMetrics counts the listener (label "shm"); nil: not counted.
	ListenerMetrics *fabric.ListenerMetrics
	// Slabs are the owner's slab memories (tensor.SlabMemory) whose slabs
	// it announces to readers of its trust scope that ask (opSlabs), so
	// they map them and build their page tables before their first
	// transfer (prefetch.go). Only with ClusterKey: without a trust scope
	// nothing is announced, as no slab object is granted.
	Slabs []tensor.SlabExporter
}

func (c *ServerConfig) defaults() error {
	if err := c.Security.Defaults("shm: ServerConfig"); err != nil {
		return err
	}
	if c.Source == nil {
		return errors.New("shm: ServerConfig needs a Source")
	}
	c.EncryptData = false // nothing to encrypt: descriptors and offsets only
	if c.Dir == "" {
		c.Dir = DefaultDir()
	}
	if c.Path == "" {
		c.Path = filepath.Join(c.Dir, socketName())
	} else {
		c.Dir = filepath.Dir(c.Path)
	}
	if len(c.Path) > maxSocketPath {
		return fmt.Errorf("shm: socket path %q is longer than %d bytes", c.Path, maxSocketPath)
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.HoldTimeout <= 0 {
		c.HoldTimeout = 60 * time.Second
	}
	c.Limits = c.Limits.WithDefaults()
	return nil
}

// Server serves reads (and pushes) of one runtime's objects to other
// processes of the same user on this host, by passing the descriptor of
// each object's own allocation (read-only for reads).
type Server struct {
	cfg    ServerConfig
	ln     *net.UnixListener
	salt   uint64
	ctx    context.Context // cancelled by Close: aborts Opens in progress
	cancel context.CancelFunc

	loop *acceptor.Loop

	holds viewHolds // readers' views of slab objects (slab.go)

	corrupt      atomic.Bool // test hook: damage the next grant
	noBatch      atomic.Bool // test hook: refuse batches as a version 4 owner does
	exportWarned atomic.Bool
}

// Listen creates the socket and starts serving.
func Listen(cfg ServerConfig) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := privateDir(cfg.Dir); err != nil {
		return nil, err
	}
	if n := sweepStale(cfg.Dir); n > 0 {
		cfg.Logger.Info("shm: removed sockets of servers that died without closing", "dir", cfg.Dir, "count", n)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: cfg.Path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("shm: listen on %s: %w", cfg.Path, err)
	}
	ln.SetUnlinkOnClose(true)
	var salt [8]byte
	if _, err := io.ReadFull(randReader, salt[:]); err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{cfg: cfg, ln: ln, salt: binary.LittleEndian.Uint64(salt[:])}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.loop = acceptor.Start(ln, acceptor.Config{Name: "shm", Limits: cfg.Limits, Metrics: cfg.ListenerMetrics, Logger: cfg.Logger},
		func(c net.Conn) { s.serve(c.(*net.UnixConn)) })
	return s, nil
}

// Addr returns the socket's path, which readers find under
// Remote.Addrs["shm"] (and "p2p": one server serves both).
func (s *Server) Addr() string { return s.cfg.Path }

// serve runs one connection; the accept loop closes it afterwards.
func (s *Server) serve(c *net.UnixConn) {
	if err := sameUser(c); err != nil {
		s.cfg.Logger.Warn("shm connection refused", "err", err)
		return
	}
	c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	rw := newPacketRW(c)
	res, err := peerauth.ServerFor(rw, s.cfg.Security)
	who := res.Peer
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, errEOFPacket) {
			s.cfg.Logger.Debug("shm connection closed before the handshake", "err", err)
		} else {
			s.cfg.Logger.Warn("shm connection refused", "err", err)
		}
		return
	}
	if rw.pending() != 0 {
		s.cfg.Logger.Warn("shm connection out of step after the handshake", "peer", who)
		return
	}
	if err := s.loop.Admit(c, who.String()); err != nil {
		return
	}
	s.holds.connect(who)
	defer s.holds.disconnect(who) // the peer's last connection takes its holds
	c.SetDeadline(time.Time{})
	// Room for a batch request, the longest packet a client sends.
	buf, oob := make([]byte, max(maxPacket, maxBatchReq)), make([]byte, oobSpace)
	sent := map[uint64]bool{} // slabs whose descriptor this connection carried (slab.go)
	for {
		// An authenticated connection may wait for its next request at
		// most IdleTimeout: each one pins a descriptor and a goroutine.
		// Not while the peer holds views: closing its last connection
		// would give their ranges to other objects under the views.
		if s.holds.holding(who) {
			c.SetReadDeadline(time.Time{})
		} else {
			c.SetReadDeadline(time.Now().Add(s.cfg.Limits.IdleTimeout))
		}
		p, fds, err := recvPacket(c, buf, oob)
		closeAll(fds) // clients send no descriptors
		if err == nil && len(p) > 0 && p[0] == opUnview {
			id, err := parseUnview(p)
			if err != nil {
				s.cfg.Logger.Debug("bad shm unview", "peer", who, "err", err)
				return
			}
			s.holds.release(who, id)
			continue
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			s.loop.Dropped("idle", who.String())
			return
		}
		if err != nil {
			if !errors.Is(err, errEOFPacket) && !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Debug("shm connection ended", "peer", who, "err", err)
			}
			return
		}
		if (p[0] == opBatch || p[0] == opBatchPush) && !s.noBatch.Load() {
			reqs, err := parseBatch(p)
			if err == nil {
				err = s.handleBatch(c, buf, oob, reqs, sent, who)
			} else {
				c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
				sendPacket(c, refusal(err), -1)
			}
			if err != nil {
				s.cfg.Logger.Debug("shm batch ended the connection", "peer", who, "err", err)
				return
			}
			continue
		}
		req, err := parseRequest(p)
		if err != nil {
			c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
			sendPacket(c, refusal(err), -1)
			s.cfg.Logger.Debug("bad shm request", "peer", who, "err", err)
			return
		}
		if req.op == opSlabs {
			if err := s.announce(c, req, sent, who); err != nil {
				s.cfg.Logger.Debug("shm slab announcement ended the connection", "peer", who, "err", err)
				return
			}
			continue
		}
		if err := s.handle(c, buf, oob, req, sent, who); err != nil {
			s.cfg.Logger.Debug("shm request ended the connection", "peer", who, "object", req.claim.Object, "err", err)
			return
		}
	}
}

// handle answers one request and holds the pin until the client's done.
// It returns an error only when the connection cannot be used any more.
func (s *Server) handle(c *net.UnixConn, buf, oob []byte, req request, sent map[uint64]bool, who peer.ID) (err error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandshakeTimeout)
	var pin tensor.Buffer
	pin, err = s.open(ctx, req)
	cancel()
	if err == nil {
		err = fabric.CheckRange(req.offset, req.length, pin.Len())
	}
	var g grant
	fd := -1
	var keep func() func()
	if err == nil && req.length > 0 {
		g, fd, keep, err = s.export(pin, req, sent)
		if err != nil && !errors.Is(err, tensor.ErrReleased) {
			// The reader falls back to a worse path (and says so); say here
			// why the owner could not grant, loudly the first time.
			level := slog.LevelDebug
			if !s.exportWarned.Swap(true) {
				level = slog.LevelWarn
			}
			s.cfg.Logger.Log(s.ctx, level, "shm: cannot grant the object, the reader must take another path", "object", req.claim.Object, "push", req.op == opPush, "err", err)
		}
	}
	if err == nil && keep != nil {
		// A view of a slab object: it gets a hold id, or is refused (the
		// slab's descriptor then did not travel after all).
		if g.hold, err = s.holds.next(who); err != nil {
			if fd >= 0 {
				unix.Close(fd)
				delete(sent, g.mapID)
			}
		}
	}
	if err != nil {
		if pin != nil {
			pin.Release()
		}
		c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
		return sendPacket(c, refusal(err), -1)
	}
	// Every way out below closes the connection before unpinning: a reader
	// that finds the connection still open after its copy knows the pin was
	// held for all of it (see Client.confirm).
	defer func() {
		if err != nil {
			c.Close()
		}
		pin.Release()
	}()
	// Hold the view's range from now (the pin keeps it until the done);
	// the hold is registered once the client confirms it has the view.
	var unhold func()
	if keep != nil {
		unhold = keep()
		defer func() {
			if unhold != nil {
				s.holds.abandon(who, g.hold)
				unhold() // never confirmed: no view holds it
			}
		}()
	}
	reply := g.marshal()
	if s.corrupt.Swap(false) {
		reply[20] ^= 0x40 // inside the object offset: a wrong place to copy from
	}
	c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
	err = sendPacket(c, reply, fd)
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return err
	}
	// The client maps and copies now; the pin stays held until it is done.
	if err = s.awaitDone(c, buf, oob, ""); err != nil {
		return err
	}
	if unhold != nil {
		s.holds.add(who, g.hold, unhold)
		unhold = nil
	}
	// Unpin (the deferred Release) and wait for the next request (serve
	// sets the idle deadline): the done is not acknowledged, so the client
	// never waits for us in between.
	return nil
}

// awaitDone waits, at most HoldTimeout, for the client's done after a
// grant or a batch reply (what names the exchange in the error).
func (s *Server) awaitDone(c *net.UnixConn, buf, oob []byte, what string) error {
	c.SetReadDeadline(time.Now().Add(s.cfg.HoldTimeout))
	p, fds, err := recvPacket(c, buf, oob)
	closeAll(fds)
	if err != nil {
		return err
	}
	if len(p) != doneLen || p[0] != opDone {
		return fmt.Errorf("%w: expected done%s, got %d bytes", fabric.ErrBadRequest, what, len(p))
	}
	return nil
}

// open pins what req names: the Source's object for a read or a view, the
// Sink's slot for a push.
func (s *Server) open(ctx context.Context, req request) (tensor.Buffer, error) {
	switch {
	case req.op == opRead || req.op == opView:
		return s.cfg.Source.Open(ctx, req.claim.For(req.offset, req.length))
	case s.cfg.Sink == nil:
		return nil, fmt.Errorf("%w: this runtime accepts no pushes", fabric.ErrBadRequest)
	}
	return s.cfg.Sink.OpenSink(ctx, req.claim)
}

// export describes pin's place in its allocation's file and, unless the
// client already has it mapped, returns a descriptor to pass. The
// descriptor reaches the pinned object's allocation and nothing else
// (tensor.Exportable), or a private copy of the object's published view
// when the object is part of a larger allocation (tensor.ViewShare):
// read-only (and sealed against writes) for reads, writable for pushes
// into the sink.
//
// A slab object (tensor.Handle.Slab, slab.go) is granted only when this
// owner requires the cluster key; its descriptor travels once per
// connection (sent records which).
func (s *Server) export(pin tensor.Buffer, req request, sent map[uint64]bool) (grant, int, func() func(), error) {
	g, fd, h, err := s.exportHandle(pin, req, sent)
	if err != nil || req.op != opView || g.flags&flagSlab == 0 {
		return g, fd, nil, err
	}
	if h.Keep == nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return grant{}, -1, nil, fmt.Errorf("shm: a slab handle that cannot hold its range for a view")
	}
	return g, fd, h.Keep, nil
}

func (s *Server) exportHandle(pin tensor.Buffer, req request, sent map[uint64]bool) (grant, int, tensor.Handle, error) {
	access := tensor.ReadOnly
	if req.op == opPush {
		access = tensor.Writable
	}
	h, err := tensor.ExportOf(pin, access)
	if err != nil {
		return grant{}, -1, h, fmt.Errorf("shm: export: %w", err)
	}
	if h.Kind != tensor.HandleMemfd {
		g, fd, err := s.exportDevice(pin, h, req)
		return g, fd, h, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.FD, &st); err != nil {
		unix.Close(h.FD)
		return grant{}, -1, h, fmt.Errorf("shm: stat exported allocation: %w", err)
	}
	g := grant{mapID: s.mappingID(st.Dev, st.Ino, h.Offset, h.Length, h.Start), fileSize: h.Size, objOff: h.Offset, objLen: h.Length, viewOff: h.Start}
	// The handle must hold the requested range (the claim's range was
	// checked against the published view by Open); a view's private copy
	// holds the view alone, so it starts at the view's start.
	if h.Access != access || g.objOff < 0 || g.objLen < 0 || g.viewOff < 0 || g.objOff+g.objLen > g.fileSize || g.fileSize > st.Size ||
		req.offset < g.viewOff || req.offset+req.length > g.viewOff+g.objLen || g.viewOff+g.objLen > pin.Len() {
		unix.Close(h.FD)
		return grant{}, -1, h, fmt.Errorf("shm: export handle [%d,+%d) (view start %d) %v of a %d-byte allocation (file %d bytes) does not hold [%d,+%d) or is inconsistent",
			h.Offset, h.Length, h.Start, h.Access, h.Size, st.Size, req.offset, req.length)
	}
	if h.Copy {
		g.flags |= flagCopy
	}
	if h.Slab {
		if len(s.cfg.ClusterKey) == 0 || access != tensor.ReadOnly || h.Copy {
			unix.Close(h.FD)
			return grant{}, -1, h, errNoScope
		}
		g.flags |= flagSlab
		g.mapID = s.mappingID(st.Dev, st.Ino, 0, h.Size, -1)
		if sent[g.mapID] {
			unix.Close(h.FD)
			return g, -1, h, nil
		}
		sent[g.mapID] = true // if the send fails the connection ends with it
		g.flags |= flagFD
		return g, h.FD, h, nil
	}
	if req.have == g.mapID {
		// The client maps this region already (read-only for a read,
		// writable for a push: it keeps the two apart), and this grant
		// re-validated the claim: no descriptor needs to travel.
		unix.Close(h.FD)
		return g, -1, h, nil
	}
	g.flags |= flagFD
	return g, h.FD, h, nil
}

// announce answers opSlabs: the owner's slabs this connection has not
// carried yet, as many as fit the reader's budget (req.length bytes) and
// one packet, largest first. Slabs go only to readers of the trust scope
// (the handshake proved the cluster key, and AllowPeer admitted them), as
// slab grants do. It returns an error only when the connection is lost.
func (s *Server) announce(c *net.UnixConn, req request, sent map[uint64]bool, who peer.ID) error {
	c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
	if len(s.cfg.ClusterKey) == 0 {
		return sendPacket(c, refusal(errNoScope), -1)
	}
	var list []announced
	var fds []int
	defer func() { closeAll(fds) }()
	budget := req.length
	for _, m := range s.cfg.Slabs {
		hs, err := m.ExportSlabs(maxAnnounce)
		if err != nil {
			s.cfg.Logger.Debug("shm: cannot announce slabs", "peer", who, "err", err)
			continue
		}
		for _, h := range hs {
			var st unix.Stat_t
			id := uint64(0)
			if unix.Fstat(h.FD, &st) == nil {
				id = s.mappingID(st.Dev, st.Ino, 0, h.Size, -1) // as slab grants name it
			}
			if id == 0 || sent[id] || h.Size > budget || len(list) == maxAnnounce {
				unix.Close(h.FD)
				continue
			}
			budget -= h.Size
			list = append(list, announced{mapID: id, size: h.Size})
			fds = append(fds, h.FD)
		}
	}
	for _, a := range list {
		sent[a.mapID] = true // if the send fails the connection ends with it
	}
	s.cfg.Logger.Debug("shm: announced slabs", "peer", who, "slabs", len(list))
	return sendPacketFDs(c, announcePacket(list), fds)
}

// mappingID names one object's place in one allocation file. It is salted per
// server so ids mean nothing outside it.
func (s *Server) mappingID(dev, ino uint64, off, n, view int64) uint64 {
	h := fnv.New64a()
	var b [48]byte
	binary.LittleEndian.PutUint64(b[0:], s.salt)
	binary.LittleEndian.PutUint64(b[8:], dev)
	binary.LittleEndian.PutUint64(b[16:], ino)
	binary.LittleEndian.PutUint64(b[24:], uint64(off))
	binary.LittleEndian.PutUint64(b[32:], uint64(n))
	binary.LittleEndian.PutUint64(b[40:], uint64(view))
	h.Write(b[:])
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

func (s *Server) connCount() int { return s.loop.Len() }

// Close stops accepting, removes the socket, closes every connection
// (aborting transfers in flight: their readers fail with
// fabric.ErrPeerClosed) and waits for the server's goroutines. It is
// idempotent.
func (s *Server) Close() error {
	// Cancelling first makes Opens in progress give up, so their handlers
	// return as soon as the loop closes their connections.
	s.cancel()
	err := s.loop.Close()
	// The listener unlinks its socket; a leftover (a racing close) goes too.
	if rerr := os.Remove(s.cfg.Path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}
