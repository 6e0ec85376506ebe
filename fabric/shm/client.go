package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/kit"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/pcopy"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config configures the reader (and pusher) side of the shm and p2p
// transports. Zero values mean the documented defaults.
type Config struct {
	// Security: Identity (required), ClusterKey (the cluster key, proven to
	// owners that require it), StallTimeout (bounds each socket
	// operation: request, grant, done; a silent owner fails the transfer
	// with fabric.ErrStalled; default 30 s) and Logger; see
	// fabric.Security. EncryptData is ignored (nothing to encrypt).
	fabric.Security
	// Topology tells p2p which devices share a device link; without it
	// p2p reaches nothing (shm does not need it).
	Topology *topology.Cluster
	// DialTimeout bounds connecting and authenticating; default 10 s.
	DialTimeout time.Duration
	// MaxConns bounds the connections to one owner (one transfer uses one
	// at a time; more wait for a free one); default 16.
	MaxConns int
	// MaxIdle is how many idle connections are kept per owner; default 4.
	MaxIdle int
	// MaxMappings and MaxMappedBytes bound the mapping cache; defaults
	// 1024 mappings and 64 GiB of mapped address space. A cached mapping
	// keeps the owner's object's memory alive, so the cache also drops an
	// owner's mappings as soon as it goes away.
	MaxMappings    int
	MaxMappedBytes int64
	// ChunkSize is how many bytes are copied between context checks;
	// default 8 MiB.
	ChunkSize int
	// Registerer, when set, gets the mapping cache's metrics
	// (tensorlane_shm_*); nil registers nothing.
	Registerer prometheus.Registerer
	// PrefetchBytes bounds the owners' slabs this reader maps and
	// populates ahead of its reads (prefetch.go): after its first
	// exchange with an owner, it asks for the owner's slabs while the
	// slabs it maps stay within this many bytes. Default
	// DefaultPrefetchBytes; negative turns prefetch off.
	PrefetchBytes int64
}

// DefaultPrefetchBytes is Config.PrefetchBytes's default: address space
// only (the pages are the owner's), and 2 MiB of page tables per GiB.
const DefaultPrefetchBytes = 4 << 30

func (c *Config) defaults() error {
	if err := c.Security.Defaults("shm: Config"); err != nil {
		return err
	}
	c.EncryptData = false // nothing to encrypt: descriptors and offsets only
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 16
	}
	if c.MaxIdle <= 0 {
		c.MaxIdle = 4
	}
	if c.MaxMappings <= 0 {
		c.MaxMappings = 1024
	}
	if c.MaxMappedBytes <= 0 {
		c.MaxMappedBytes = 64 << 30
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = 8 << 20
	}
	if c.PrefetchBytes == 0 {
		c.PrefetchBytes = DefaultPrefetchBytes
	}
	return nil
}

// Client is the reader side shared by the p2p and shm transports: one
// connection pool per owner and one mapping cache. Its P2P and SHM methods
// return the two transport views over it.
type Client struct {
	cfg   Config
	cache *cache
	slabs slabs // owners' slabs, mapped once each (slab.go)
	batch batchCounters

	// pool holds the connections per owner (fabric/internal/kit): idle
	// ones reused, at most MaxConns each, transfers queued past that.
	pool *kit.Pool[connKey, *pconn]

	// anchors holds, per owner, the connection that keeps our slab views'
	// holds alive (slab.go): out of the pool's rotation (it keeps its
	// slot), closed by the pool's Close.
	anchorMu sync.Mutex
	anchors  map[string]*pconn
	unviewQ  map[string][]uint64 // unviews waiting for an anchor

	// Slab prefetch (prefetch.go): the owners asked once, the
	// goroutines in flight, and what stops them.
	pfMu     sync.Mutex
	pfAsked  map[string]bool
	pfClosed bool
	pfWG     sync.WaitGroup
	pfCtx    context.Context
	pfCancel context.CancelFunc
	idle     idleGate // transfers in flight: the prefetch waits for none

	afterMap func()       // test hook: runs between mapping and copying
	onFD     func(fd int) // test hook: sees each received descriptor before it is mapped
}

// connKey names an owner's socket and the identity it must prove.
type connKey struct {
	want        peer.ID
	owner, addr string
}

type pconn struct {
	c     *net.UnixConn
	cli   *Client
	owner string
	buf   []byte // received packets
	oob   []byte // received descriptors
	out   []byte // requests being sent
	// bbuf and boob receive batch replies and their descriptors
	// (batch.go), made on a connection's first batch.
	bbuf, boob []byte
	// slabs are the owner's slabs whose descriptor came on this
	// connection, by mapping id (guarded by Client.slabs.mu).
	slabs map[uint64]*slabMap
	// anchor: a slab view came on this connection; it becomes the
	// owner's anchor unless there is one (slab.go). wmu orders an
	// anchor's unviews.
	anchor bool
	wmu    sync.Mutex
}

// Close closes the connection and drops the slabs it received: the owner
// forgets what it sent on it. The pool calls it whenever it closes one.
func (pc *pconn) Close() error {
	err := pc.c.Close()
	pc.cli.slabs.dropConn(pc) // a copy in flight keeps its slab until it ends
	return err
}

// NewClient returns a client; Close releases its connections and mappings.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, cache: newCache(cfg.MaxMappings, cfg.MaxMappedBytes), anchors: map[string]*pconn{}, unviewQ: map[string][]uint64{},
		pfAsked: map[string]bool{}}
	c.pfCtx, c.pfCancel = context.WithCancel(context.Background())
	c.idle.init()
	c.pool = kit.NewPool(kit.PoolConfig[connKey, *pconn]{Dial: c.dial, MaxConns: cfg.MaxConns, MaxIdle: cfg.MaxIdle})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(collector{c}); err != nil {
			return nil, fmt.Errorf("shm: register metrics: %w", err)
		}
	}
	return c, nil
}

// CacheStats reports what the mapping cache holds and has done.
func (c *Client) CacheStats() CacheStats { return c.cache.snapshot() }

// SlabStats reports the slab mappings (slab.go).
func (c *Client) SlabStats() SlabStats { return c.slabs.snapshot() }

// Close closes every connection (transfers in flight fail) and unmaps every
// cached mapping once no copy uses it. It is idempotent.
func (c *Client) Close() error {
	c.pfMu.Lock()
	c.pfClosed = true
	c.pfMu.Unlock()
	c.pfCancel()
	c.pool.Close() // anchors too: they keep their pool slot
	c.pfWG.Wait()  // prefetches end at their next chunk, or when their connection closes
	c.anchorMu.Lock()
	clear(c.anchors)
	clear(c.unviewQ)
	c.anchorMu.Unlock()
	c.cache.clear()
	return nil
}

// owner names one owner's data service: its peer ID and socket path.
func ownerKey(id peer.ID, path string) string { return id.String() + "@" + path }

// addrOf finds the owner's socket: one server serves both names, so either
// address will do.
func addrOf(name string, r fabric.Remote) string {
	if a := r.Addrs[name]; a != "" {
		return a
	}
	if a := r.Addrs[fabric.SHM]; a != "" {
		return a
	}
	return r.Addrs[fabric.P2P]
}

func (c *Client) target(name string, r fabric.Remote) (peer.ID, string, error) {
	addr := addrOf(name, r)
	if addr == "" {
		return "", "", fmt.Errorf("%w: owner %s serves no shm socket", fabric.ErrNoPath, r.Peer)
	}
	want, err := peer.Decode(r.Peer)
	if err != nil {
		return "", "", fmt.Errorf("%w: owner peer id %q: %v", fabric.ErrBadRequest, r.Peer, err)
	}
	if r.Offset < 0 || r.Length < 0 {
		return "", "", fmt.Errorf("%w: range [%d,+%d)", fabric.ErrBadRequest, r.Offset, r.Length)
	}
	return want, addr, nil
}

// read pulls src into dst through the owner's object, mapped read-only.
func (c *Client) read(ctx context.Context, name string, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return fabric.Stats{}, err
	}
	want, addr, err := c.target(name, src)
	if err != nil {
		return fabric.Stats{}, err
	}
	if dst.Len() < src.Length {
		return fabric.Stats{}, fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dst.Len(), src.Length)
	}
	to, dev, err := hostOrDevice(dst, src.Length)
	if err != nil {
		return fabric.Stats{}, err
	}
	owner := ownerKey(want, addr)
	key := cacheKey{owner: owner, object: src.Claim.Object, incarnation: src.Claim.Incarnation}
	c.idle.enter()
	defer c.idle.leave()
	var copied bool
	err = c.withConn(ctx, want, owner, addr, func(pc *pconn) error {
		if err := c.transferOn(ctx, pc, key, src, to, nil, dev, &copied); err != nil {
			return err
		}
		return c.prefetchOnce(pc) // after the first slab grant of this owner (prefetch.go)
	})
	if err != nil {
		return fabric.Stats{}, err
	}
	return fabric.Stats{Transport: name, Bytes: src.Length, Duration: time.Since(start), Streams: 1, ViewCopy: copied}, nil
}

// write pushes src's first dst.Length bytes into the sink dst names; with
// runs (validated: fabric.CheckRuns), the concatenation of those runs of
// src (host memory), copied from src straight into the sink's pages.
func (c *Client) write(ctx context.Context, name string, src tensor.Buffer, dst fabric.Remote, runs []pcopy.Run) (fabric.Stats, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return fabric.Stats{}, err
	}
	want, addr, err := c.target(name, dst)
	if err != nil {
		return fabric.Stats{}, err
	}
	if src.Len() < dst.Length {
		return fabric.Stats{}, fmt.Errorf("%w: source holds %d of the %d bytes to push", tensor.ErrTooSmall, src.Len(), dst.Length)
	}
	var from []byte
	var dev tensor.Buffer
	if runs != nil {
		from, err = tensor.BytesOf(src)
	} else {
		from, dev, err = hostOrDevice(src, dst.Length)
	}
	if err != nil {
		return fabric.Stats{}, err
	}
	owner := ownerKey(want, addr)
	key := cacheKey{owner: owner, object: dst.Claim.Object, incarnation: dst.Claim.Incarnation, push: true}
	err = c.withConn(ctx, want, owner, addr, func(pc *pconn) error {
		return c.transferOn(ctx, pc, key, dst, from, runs, dev, nil)
	})
	if err != nil {
		return fabric.Stats{}, err
	}
	return fabric.Stats{Transport: name, Bytes: dst.Length, Duration: time.Since(start), Streams: 1}, nil
}

// withConn runs one exchange on a connection to owner. A pooled
// connection that the owner has since closed is replaced once; cancelling
// ctx closes the connection, which unblocks any socket call at once.
func (c *Client) withConn(ctx context.Context, want peer.ID, owner, addr string, f func(*pconn) error) error {
	for attempt := 0; ; attempt++ {
		pc, pooled, err := c.pool.Get(ctx, connKey{want, owner, addr})
		if err != nil {
			if errors.Is(err, fabric.ErrPeerClosed) {
				c.ownerGone(owner, err)
			}
			return err
		}
		stop := context.AfterFunc(ctx, func() { pc.c.Close() })
		err = f(pc)
		if !stop() {
			c.pool.Discard(pc)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if errors.Is(err, errConfirmedLost) {
			c.pool.Discard(pc)
			return nil
		}
		var re *peerauth.RemoteError
		if err == nil || errors.As(err, &re) {
			if pc.anchor && c.keepAnchor(pc) {
				return err
			}
			c.pool.Put(pc) // still in step
			return err
		}
		c.pool.Discard(pc)
		if pooled && attempt == 0 && errors.Is(err, errStaleConn) {
			continue
		}
		if errors.Is(err, fabric.ErrPeerClosed) {
			c.ownerGone(owner, err)
		}
		return err
	}
}

// errStaleConn marks a pooled connection the owner closed before our
// request reached it: nothing was granted, so a fresh one may try again.
var errStaleConn = errors.New("shm: connection closed before the owner answered")

func (c *Client) ownerGone(owner string, err error) {
	if s := c.cache.snapshot(); s.Live > 0 {
		c.cfg.Logger.Info("shm owner unreachable, dropping its mappings", "owner", owner, "err", err)
	}
	c.cache.purge(owner)
}

// exchangeRequest sends req and reads the owner's reply and descriptors.
func (c *Client) exchangeRequest(pc *pconn, req request) (grant, []int, error) {
	pc.c.SetDeadline(time.Now().Add(c.cfg.StallTimeout))
	pc.out = req.appendTo(pc.out[:0])
	if err := sendPacket(pc.c, pc.out, -1); err != nil {
		return grant{}, nil, staleOr(c.ioError(err))
	}
	p, fds, err := recvPacket(pc.c, pc.buf, pc.oob)
	if err != nil {
		return grant{}, nil, staleOr(c.ioError(err))
	}
	g, err := parseReply(p)
	if err != nil {
		closeAll(fds)
		return grant{}, nil, err
	}
	if (g.flags&flagFD != 0) != (len(fds) == 1) || len(fds) > 1 {
		closeAll(fds)
		return grant{}, nil, fmt.Errorf("%w: grant flags %#x with %d descriptors", fabric.ErrCorrupt, g.flags, len(fds))
	}
	return g, fds, nil
}

// staleOr marks a failure before any grant as retryable on a fresh
// connection (the owner may simply have closed an idle one).
func staleOr(err error) error {
	if errors.Is(err, fabric.ErrPeerClosed) {
		return fmt.Errorf("%w: %w", errStaleConn, err)
	}
	return err
}

// confirm ends a read or a push without waiting for the owner to be
// scheduled: the owner closes the connection before it ever unpins on its
// own (timeout, Close, death), and otherwise unpins only on our done. So a
// connection that is still open once the copy has ended proves the pin was
// held for all of it: a read copied the live object, a push wrote into the
// live sink (never into memory the owner had freed and reused). The done
// goes out now, and nothing comes back for it: the owner unpins and reads
// the connection's next request, so the next exchange never waits for the
// owner to have been scheduled in between. (The deadline stays set on an
// idle connection: every exchange sets its own.)
func (c *Client) confirm(pc *pconn) error {
	if err := peerOpen(pc.c); err != nil {
		return err
	}
	pc.c.SetWriteDeadline(time.Now().Add(c.cfg.StallTimeout))
	if err := sendPacket(pc.c, doneCopied, -1); err != nil {
		// The copy was confirmed; only the connection is lost.
		return fmt.Errorf("%w: %w", errConfirmedLost, c.ioError(err))
	}
	return nil
}

// doneCopied is the done packet; it is only ever read.
var doneCopied = []byte{opDone, 0}

// errConfirmedLost marks a read whose bytes are good but whose connection
// cannot be reused.
var errConfirmedLost = errors.New("shm: read confirmed, connection lost")

// peerOpen reports, without blocking, whether the owner still has its end
// of the connection open: no hang-up, no error, nothing unsolicited to read.
func peerOpen(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
	}
	var revents int16
	var perr error
	cerr := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		for {
			_, perr = unix.Poll(fds, 0)
			if perr != unix.EINTR {
				break
			}
		}
		revents = fds[0].Revents
	})
	switch {
	case cerr != nil:
		return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, cerr)
	case perr != nil:
		return fmt.Errorf("%w: poll: %v", fabric.ErrPeerClosed, perr)
	case revents != 0:
		return fmt.Errorf("%w: the owner dropped the connection before the copy was confirmed (poll %#x)", fabric.ErrPeerClosed, revents)
	}
	return nil
}

// refused drops what a refusal of key's claim makes useless: a claim the
// owner refuses itself (freed, unknown, forged) loses its mapping, and a
// stale one takes every mapping of its owner incarnation with it. Nothing
// depends on this for safety (every transfer is re-validated): it frees
// the address space, and the owner's pages, early.
func (c *Client) refused(key cacheKey, err error) {
	var re *peerauth.RemoteError
	if !errors.As(err, &re) {
		return
	}
	switch re.Code {
	case peerauth.StatusStale:
		c.cache.revokeIncarnation(key.owner, key.incarnation)
	case peerauth.StatusFreed, peerauth.StatusNotFound, peerauth.StatusUnauthorized:
		c.cache.revoke(key)
	}
}

// transferOn runs one read (key.push false: r's bytes of the owner's
// object into p) or push (p into r's bytes of the owner's sink) on pc.
//
// Both reuse a cached mapping of the claim when the owner's grant names
// the same region of the same allocation file: the owner still opens (and pins)
// the claim for every transfer, so a mapping is only ever used under a
// fresh grant, and a refused claim drops it. A push maps the sink's own
// pages writable (its descriptor reaches the sink alone); a read maps the
// object's pages read-only.
//
// copied, when not nil, is set to whether the owner granted a private copy
// of its object's view rather than the object's own memory.
//
// Our side is p when it is host visible, or dev (device memory, p nil).
// A grant of device memory (flagDevice) is imported and copied by the
// device (see importDevice and deviceCopy).
func (c *Client) transferOn(ctx context.Context, pc *pconn, key cacheKey, r fabric.Remote, p []byte, runs []pcopy.Run, dev tensor.Buffer, copied *bool) error {
	held := c.cache.acquire(key)
	req := request{op: opRead, claim: r.Claim, offset: r.Offset, length: r.Length}
	if key.push {
		req.op = opPush
	}
	if held != nil {
		req.have = held.id
	}
	g, fds, err := c.exchangeRequest(pc, req)
	if err != nil {
		if held != nil {
			c.cache.release(held)
		}
		c.refused(key, err)
		return err
	}
	if copied != nil {
		*copied = g.flags&flagCopy != 0
	}
	if err := c.useGrant(ctx, pc, key, g, fds, held, r, p, runs, dev); err != nil {
		return err
	}
	return c.confirm(pc)
}

// useGrant copies under the owner's grant g (with the descriptor it
// carried, if any, in fds) as transferOn describes, and releases held, the
// cached mapping of key the request named (or nil). A push with runs
// copies those runs of p (the whole source) rather than p. It closes every
// descriptor in fds. The caller confirms the copy (confirm) once it has
// made every copy of its exchange.
func (c *Client) useGrant(ctx context.Context, pc *pconn, key cacheKey, g grant, fds []int, held *mapping, r fabric.Remote, p []byte, runs []pcopy.Run, dev tensor.Buffer) (err error) {
	defer func() {
		if held != nil {
			c.cache.release(held)
		}
	}()
	if g.flags&flagSlab != 0 {
		return c.slabCopy(ctx, pc, key, g, fds, r, p, dev)
	}
	if r.Length == 0 {
		closeAll(fds)
		return nil
	}
	plen := int64(len(p))
	if runs != nil {
		plen = r.Length // the runs' total (fabric.CheckRuns)
	}
	if (dev == nil && plen != r.Length) || r.Offset < g.viewOff || r.Offset+r.Length > g.viewOff+g.objLen {
		closeAll(fds)
		return fmt.Errorf("%w: grant of the object's bytes [%d,+%d) does not hold [%d,+%d)", fabric.ErrCorrupt, g.viewOff, g.objLen, r.Offset, r.Length)
	}
	m := held
	if len(fds) == 1 && g.flags&flagDevice != 0 {
		if m, err = c.importDevice(ctx, key, g, fds[0], dev); err != nil {
			return err
		}
		c.cache.insert(m)
		if held != nil {
			c.cache.release(held)
		}
		held = m
	} else if len(fds) == 1 {
		if c.onFD != nil {
			c.onFD(fds[0])
		}
		data, base, err := mapRegion(fds[0], g.objOff, g.objLen, key.push)
		unix.Close(fds[0])
		if err != nil {
			return err
		}
		m = &mapping{key: key, id: g.mapID, objOff: g.objOff, objLen: g.objLen, viewOff: g.viewOff, base: base, data: data, refs: 1}
		c.cache.insert(m)
		if held != nil {
			c.cache.release(held)
		}
		held = m
	} else if m == nil || m.id != g.mapID || m.objOff != g.objOff || m.objLen != g.objLen || m.viewOff != g.viewOff ||
		(m.dev != nil) != (g.flags&flagDevice != 0) {
		closeAll(fds)
		return fmt.Errorf("%w: owner granted mapping %#x without a descriptor, which we do not hold", fabric.ErrCorrupt, g.mapID)
	} else {
		c.cache.hit(key)
	}
	if c.afterMap != nil {
		c.afterMap()
	}
	if m.dev != nil {
		if runs != nil { // a device sink: its copy takes one contiguous source
			packed := make([]byte, r.Length)
			if err := pcopy.Gather(ctx, packed, p, runs, pcopy.Options{}); err != nil {
				return err
			}
			p = packed
		}
		return deviceCopy(ctx, key.push, m.dev, r.Offset-m.viewOff, r.Length, p, dev)
	}
	obj := m.bytes()[r.Offset-m.viewOff : r.Offset-m.viewOff+r.Length]
	switch {
	case dev != nil:
		return hostToDevice(ctx, key.push, obj, dev)
	case key.push:
		// A push writes into the reader's memory: between chunks, stop as
		// soon as the owner has dropped the connection (it unpins the sink
		// right after, and the pages may then belong to something else).
		peer := func() error { return peerOpen(pc.c) }
		if runs != nil {
			return guardedGather(ctx, obj, p, runs, c.cfg.ChunkSize, peer)
		}
		return guardedCopy(ctx, obj, p, c.cfg.ChunkSize, peer)
	}
	return guardedCopy(ctx, p, obj, c.cfg.ChunkSize, nil)
}

// slabCopy is useGrant for a slab grant: the copy reads the object's
// place in the owner's slab, mapped once for every object in it.
func (c *Client) slabCopy(ctx context.Context, pc *pconn, key cacheKey, g grant, fds []int, r fabric.Remote, p []byte, dev tensor.Buffer) error {
	if len(fds) == 1 && c.onFD != nil {
		c.onFD(fds[0])
	}
	m, err := c.slabs.forGrant(pc, g, fds)
	if err != nil {
		return err
	}
	defer c.slabs.release(m)
	if key.push {
		// Owners never grant a slab writable: it reaches other objects.
		return fmt.Errorf("%w: owner granted a push into a read-only slab", fabric.ErrCorrupt)
	}
	if r.Length == 0 {
		return nil
	}
	if (dev == nil && int64(len(p)) != r.Length) || r.Offset < g.viewOff || r.Offset+r.Length > g.viewOff+g.objLen {
		return fmt.Errorf("%w: grant of the object's bytes [%d,+%d) does not hold [%d,+%d)", fabric.ErrCorrupt, g.viewOff, g.objLen, r.Offset, r.Length)
	}
	if c.afterMap != nil {
		c.afterMap()
	}
	obj := m.object(g.objOff+r.Offset-g.viewOff, r.Length)
	if dev != nil {
		return hostToDevice(ctx, false, obj, dev)
	}
	return guardedCopy(ctx, p, obj, c.cfg.ChunkSize, nil)
}

func (c *Client) ioError(err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: no answer from the owner for %v: %v", fabric.ErrStalled, c.cfg.StallTimeout, err)
	case errors.Is(err, fabric.ErrCorrupt), errors.Is(err, ErrDescriptorLimit):
		return err
	}
	return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
}

func (c *Client) dial(ctx context.Context, k connKey) (*pconn, error) {
	want, owner, addr := k.want, k.owner, k.addr
	var d net.Dialer
	nc, err := kit.Connect(ctx, c.cfg.DialTimeout, "shm", addr,
		func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unixpacket", addr) },
		func(nc net.Conn) error {
			if err := sameUser(nc.(*net.UnixConn)); err != nil {
				return err
			}
			rw := newPacketRW(nc.(*net.UnixConn))
			if _, err := peerauth.ClientFor(rw, c.cfg.Security, want); err != nil {
				return err
			}
			if rw.pending() != 0 {
				return fmt.Errorf("%w: data after the handshake", fabric.ErrBadRequest)
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	uc := nc.(*net.UnixConn)
	return &pconn{c: uc, cli: c, owner: owner, buf: make([]byte, maxPacket), oob: make([]byte, oobSpace), out: make([]byte, 0, requestFixed+maxToken),
		slabs: map[uint64]*slabMap{}}, nil
}
