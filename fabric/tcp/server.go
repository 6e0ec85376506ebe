package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ServerConfig configures the owner side of the tcp transport. Zero values
// mean the documented defaults.
type ServerConfig struct {
	Addr      string         // listen address; default "127.0.0.1:0"
	Identity  crypto.PrivKey // required: the runtime's libp2p identity key
	Source    fabric.Source  // required: resolves claims to memory
	Authorize func(peer.ID) error
	// ChunkSize is the unit of checksumming; default 256 KiB.
	ChunkSize int
	// HandshakeTimeout bounds the authentication of a new connection;
	// default 10 s.
	HandshakeTimeout time.Duration
	// StallTimeout bounds how long a write may make no progress (a reader
	// that stopped reading); default 30 s.
	StallTimeout time.Duration
	Logger       *slog.Logger
}

func (c *ServerConfig) defaults() error {
	if c.Identity == nil || c.Source == nil {
		return errors.New("tcp: ServerConfig needs Identity and Source")
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// DefaultChunkSize keeps each checksummed chunk small enough to stay in
// cache between the checksum and the copy.
const DefaultChunkSize = 256 << 10

// Server serves object reads on dedicated TCP connections.
type Server struct {
	cfg ServerConfig
	ln  net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen starts a data server.
func Listen(cfg ServerConfig) (*Server, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the address readers dial.
func (s *Server) Addr() string { return s.ln.Addr().String() }

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // listener closed
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	who, err := peerauth.Server(c, s.cfg.Identity, s.cfg.Authorize)
	if err != nil {
		s.cfg.Logger.Warn("data connection refused", "remote", c.RemoteAddr(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	r := bufio.NewReaderSize(c, 512)
	for {
		req, err := readRequestFrom(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Debug("data connection ended", "peer", who, "err", err)
				if errors.Is(err, fabric.ErrBadRequest) {
					peerauth.WriteStatus(c, peerauth.StatusBadRequest, err.Error())
				}
			}
			return
		}
		if err := s.handle(c, req); err != nil {
			s.cfg.Logger.Debug("read request failed", "peer", who, "object", req.claim.Object, "err", err)
			return
		}
	}
}

// handle answers one request. It returns an error only when the connection
// cannot be used any more.
func (s *Server) handle(c net.Conn, req readRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
	pin, err := s.cfg.Source.Open(ctx, req.claim)
	cancel()
	if err != nil {
		c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
		return peerauth.WriteStatus(c, peerauth.StatusFor(err), err.Error())
	}
	defer pin.Release()
	var data []byte
	if err = fabric.CheckRange(req.offset, req.length, pin.Len()); err == nil {
		data, err = tensor.BytesOf(pin)
	}
	if err != nil {
		c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
		return peerauth.WriteStatus(c, peerauth.StatusFor(err), err.Error())
	}
	data = data[req.offset : req.offset+req.length]
	status := []byte{peerauth.StatusOK}
	var hdr [chunkHeader]byte
	if len(data) == 0 {
		c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
		_, err := c.Write(status)
		return err
	}
	for off := 0; off < len(data); off += s.cfg.ChunkSize {
		p := data[off:min(off+s.cfg.ChunkSize, len(data))]
		binary.BigEndian.PutUint32(hdr[:4], uint32(len(p)))
		binary.BigEndian.PutUint32(hdr[4:], crc32.Checksum(p, castagnoli))
		// writev: the header and the tensor bytes straight from device
		// memory, with no copy into a staging buffer.
		bufs := net.Buffers{status, hdr[:], p}
		status = nil
		c.SetWriteDeadline(time.Now().Add(s.cfg.StallTimeout))
		if _, err := bufs.WriteTo(c); err != nil {
			return err
		}
	}
	return nil
}

// Close stops accepting, closes every connection (aborting reads in
// flight) and waits for the server's goroutines. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}
