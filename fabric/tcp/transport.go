package tcp

import (
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
	"golang.org/x/sync/errgroup"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config configures the reader side of the tcp transport. Zero values mean
// the documented defaults.
type Config struct {
	Identity crypto.PrivKey // required: the runtime's libp2p identity key
	// Streams is the most connections one large read is striped over;
	// default 4.
	Streams int
	// StripeMin is the least number of bytes worth a stream of its own;
	// default 8 MiB.
	StripeMin int64
	// DialTimeout bounds connecting and authenticating; default 10 s.
	DialTimeout time.Duration
	// StallTimeout is how long a read may make no progress before it fails
	// with fabric.ErrStalled; default 30 s.
	StallTimeout time.Duration
	// MaxIdle is how many idle connections are kept per owner; default
	// 2*Streams.
	MaxIdle int
	Logger  *slog.Logger
}

func (c *Config) defaults() error {
	if c.Identity == nil {
		return errors.New("tcp: Config needs Identity")
	}
	if c.Streams <= 0 {
		c.Streams = 4
	}
	if c.StripeMin <= 0 {
		c.StripeMin = 8 << 20
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 30 * time.Second
	}
	if c.MaxIdle <= 0 {
		c.MaxIdle = 2 * c.Streams
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Transport is the "tcp" transport: dedicated data connections,
// authenticated against both runtimes' libp2p identities, chunked and
// checksummed (CRC-32C), striped over several streams for large reads.
type Transport struct {
	cfg Config

	mu     sync.Mutex
	idle   map[string][]*conn // by peer + address
	all    map[*conn]struct{}
	closed bool
}

var _ fabric.Transport = (*Transport)(nil)

type conn struct {
	net.Conn
	key string
}

// New returns a tcp transport.
func New(cfg Config) (*Transport, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Transport{cfg: cfg, idle: map[string][]*conn{}, all: map[*conn]struct{}{}}, nil
}

// Name returns "tcp".
func (t *Transport) Name() string { return fabric.TCP }

// loopbackGBps and netGBps are planning estimates, not promises.
const (
	loopbackGBps = 2.5
	netGBps      = 1.2
)

// Reach serves any pair: tcp is the path of last resort.
func (t *Transport) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	if src.Host == dst.Host {
		return fabric.Cost{Path: topology.Path{Class: topology.PathSYS}, GBps: loopbackGBps, Reason: "same host over loopback sockets"}, true
	}
	return fabric.Cost{Path: topology.Path{Class: topology.PathNET}, GBps: netGBps, Reason: "any host over TCP"}, true
}

// Read pulls src into dst over one or more authenticated connections.
func (t *Transport) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	start := time.Now()
	addr := src.Addrs[fabric.TCP]
	if addr == "" {
		return fabric.Stats{}, fmt.Errorf("%w: owner %s serves no tcp address", fabric.ErrNoPath, src.Peer)
	}
	want, err := peer.Decode(src.Peer)
	if err != nil {
		return fabric.Stats{}, fmt.Errorf("%w: owner peer id %q: %v", fabric.ErrBadRequest, src.Peer, err)
	}
	if src.Length < 0 || dst.Len() < src.Length {
		return fabric.Stats{}, fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dst.Len(), src.Length)
	}
	to, err := tensor.BytesOf(dst)
	if err != nil {
		return fabric.Stats{}, err
	}
	to = to[:src.Length]

	streams := int(min(int64(t.cfg.Streams), max(1, src.Length/t.cfg.StripeMin)))
	part := (src.Length + int64(streams) - 1) / int64(streams)
	part = (part + DefaultChunkSize - 1) / DefaultChunkSize * DefaultChunkSize
	g, gctx := errgroup.WithContext(ctx)
	used := 0
	for off := int64(0); off < src.Length || (off == 0 && src.Length == 0); off += part {
		end := min(off+part, src.Length)
		used++
		g.Go(func() error {
			return t.readRange(gctx, want, addr, src.Claim, src.Offset+off, to[off:end])
		})
		if src.Length == 0 {
			break
		}
	}
	if err := g.Wait(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fabric.Stats{}, cerr
		}
		return fabric.Stats{}, err
	}
	return fabric.Stats{Transport: fabric.TCP, Bytes: src.Length, Duration: time.Since(start), Streams: used}, nil
}

// readRange reads [off, off+len(p)) of the object into p on one connection.
// A pooled connection that the owner has since closed is replaced once.
func (t *Transport) readRange(ctx context.Context, want peer.ID, addr string, claim fabric.Claim, off int64, p []byte) error {
	for attempt := 0; ; attempt++ {
		c, pooled, err := t.get(ctx, want, addr)
		if err != nil {
			return err
		}
		// Cancellation closes the connection, which unblocks any read at once.
		stop := context.AfterFunc(ctx, func() { c.Close() })
		err = t.exchange(c, claim, off, p)
		if !stop() {
			t.discard(c)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		var re *peerauth.RemoteError
		switch {
		case err == nil, errors.As(err, &re):
			t.put(c) // the connection is still in step
			return err
		}
		t.discard(c)
		if pooled && attempt == 0 && errors.Is(err, fabric.ErrPeerClosed) {
			continue
		}
		return err
	}
}

func (t *Transport) exchange(c *conn, claim fabric.Claim, off int64, p []byte) error {
	req := readRequest{claim: claim, offset: off, length: int64(len(p))}
	c.SetDeadline(time.Now().Add(t.cfg.StallTimeout))
	if _, err := c.Write(req.marshal()); err != nil {
		return t.ioError(err)
	}
	var status [1]byte
	if _, err := io.ReadFull(c, status[:]); err != nil {
		return t.ioError(err)
	}
	if status[0] != peerauth.StatusOK {
		msg, err := peerauth.ReadField(c, peerauth.MaxMessage)
		if err != nil {
			return t.ioError(err)
		}
		return peerauth.StatusError(status[0], string(msg))
	}
	var hdr [chunkHeader]byte
	for pos := 0; pos < len(p); {
		c.SetReadDeadline(time.Now().Add(t.cfg.StallTimeout))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return t.ioError(err)
		}
		n := int(binary.BigEndian.Uint32(hdr[:4]))
		if n == 0 || n > len(p)-pos {
			return fmt.Errorf("%w: chunk of %d bytes with %d left", fabric.ErrCorrupt, n, len(p)-pos)
		}
		chunk := p[pos : pos+n]
		if _, err := io.ReadFull(c, chunk); err != nil {
			return t.ioError(err)
		}
		if crc32.Checksum(chunk, castagnoli) != binary.BigEndian.Uint32(hdr[4:]) {
			return fmt.Errorf("%w: checksum mismatch in chunk at byte %d", fabric.ErrCorrupt, off+int64(pos))
		}
		pos += n
	}
	c.SetDeadline(time.Time{})
	return nil
}

func (t *Transport) ioError(err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: no progress for %v: %v", fabric.ErrStalled, t.cfg.StallTimeout, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
	}
	return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
}

func (t *Transport) get(ctx context.Context, want peer.ID, addr string) (c *conn, pooled bool, err error) {
	c, err = t.pooled(want, addr)
	if c != nil || err != nil {
		return c, true, err
	}
	c, err = t.dial(ctx, want, addr)
	return c, false, err
}

func (t *Transport) pooled(want peer.ID, addr string) (*conn, error) {
	key := want.String() + "@" + addr
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, fabric.ErrClosed
	}
	if idle := t.idle[key]; len(idle) > 0 {
		c := idle[len(idle)-1]
		t.idle[key] = idle[:len(idle)-1]
		t.mu.Unlock()
		return c, nil
	}
	t.mu.Unlock()
	return nil, nil
}

func (t *Transport) dial(ctx context.Context, want peer.ID, addr string) (*conn, error) {
	key := want.String() + "@" + addr
	dctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: dial %s: %v", fabric.ErrPeerClosed, addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	stop := context.AfterFunc(dctx, func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	_, err = peerauth.Client(nc, t.cfg.Identity, want)
	if !stop() && err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		err = fmt.Errorf("%w: handshake with %s timed out", fabric.ErrStalled, addr)
	}
	if err != nil {
		nc.Close()
		if errors.Is(err, fabric.ErrUnauthorized) || errors.Is(err, fabric.ErrBadRequest) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: handshake with %s: %v", fabric.ErrPeerClosed, addr, err)
	}
	nc.SetDeadline(time.Time{})
	c := &conn{Conn: nc, key: key}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		nc.Close()
		return nil, fabric.ErrClosed
	}
	t.all[c] = struct{}{}
	return c, nil
}

func (t *Transport) put(c *conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || len(t.idle[c.key]) >= t.cfg.MaxIdle {
		delete(t.all, c)
		c.Close()
		return
	}
	t.idle[c.key] = append(t.idle[c.key], c)
}

func (t *Transport) discard(c *conn) {
	t.mu.Lock()
	delete(t.all, c)
	t.mu.Unlock()
	c.Close()
}

// Close closes every connection, aborting reads in flight. It is idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	for c := range t.all {
		c.Close()
	}
	t.all, t.idle = nil, nil
	return nil
}
