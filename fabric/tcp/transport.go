package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/kit"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config configures the reader side of the tcp transport (and the sending
// side of pushes). Zero values mean the documented defaults.
type Config struct {
	// Security is who this runtime is and what its data connections
	// prove: Identity (required), ClusterKey, EncryptData, StallTimeout (default
	// 30 s) and Logger; see fabric.Security.
	fabric.Security
	// Streams is the most connections one large transfer is striped over;
	// default 4.
	Streams int
	// StripeMin is the least number of bytes worth a stream of its own;
	// default 8 MiB.
	StripeMin int64
	// ChunkSize is the unit of checksumming (and of compression) for
	// pushes; reads use the server's. Default 256 KiB, at most 1 MiB.
	ChunkSize int
	// DialTimeout bounds connecting and authenticating; default 10 s.
	DialTimeout time.Duration
	// MaxConns is the most connections open to one owner at once; a
	// transfer that finds them all busy waits (as long as its ctx allows)
	// for the first one given back. Default 64.
	MaxConns int
	// MaxIdle is how many idle connections are kept per owner; default
	// MaxConns, so that a steady load of concurrent transfers does not
	// pay a handshake each.
	MaxIdle int
	// IdleTimeout closes connections idle for longer (checked whenever a
	// connection to the same owner is given back); default 90 s.
	IdleTimeout time.Duration
	// Compression says when transfers are compressed; default
	// CompressAuto (only when the link to the peer is measured slower than
	// the codec).
	Compression Compression
	// CodecBps is the codec throughput, bytes per second over all streams,
	// that CompressAuto compares the link with; default: measured once per
	// process on bf16 weights.
	CodecBps float64
	// Dial, when set, makes the data connections instead of a net.Dialer
	// (to dial from another network namespace, say).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Registerer receives the transport's metrics; nil: not registered.
	Registerer prometheus.Registerer
	// SealedChecksums keeps the XXH3-64 block checksums on encrypted
	// connections too. By default the AEAD that authenticates every
	// record is the check there, and raw blocks carry no checksum (see
	// docs/benchmarks.md, "the wire", for what each mode guarantees).
	SealedChecksums bool
}

func (c *Config) defaults() error {
	if err := c.Security.Defaults("tcp: Config"); err != nil {
		return err
	}
	if c.Streams <= 0 {
		c.Streams = 4
	}
	if c.StripeMin <= 0 {
		c.StripeMin = 8 << 20
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.ChunkSize > tcodec.MaxBlock {
		return fmt.Errorf("tcp: ChunkSize %d above %d", c.ChunkSize, tcodec.MaxBlock)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 64
	}
	if c.MaxIdle <= 0 {
		c.MaxIdle = c.MaxConns
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 90 * time.Second
	}
	if c.Compression > CompressAlways {
		return fmt.Errorf("tcp: unknown %v", c.Compression)
	}
	return nil
}

// Transport is the "tcp" transport: dedicated data connections,
// authenticated against both runtimes' libp2p identities, chunked and
// checksummed (XXH3-64), striped over several streams for large transfers,
// and compressed (losslessly, per block) when the link is slower than the
// codec. It pulls (Read) and pushes (Write).
type Transport struct {
	cfg   Config
	links links
	m     *metrics

	// pool holds the connections per owner (fabric/internal/kit): idle
	// ones reused, at most MaxConns each, transfers queued past that.
	pool *kit.Pool[connKey, *conn]

	corruptNext atomic.Bool // tests: damage the next pushed block

	// unsealed holds the owners (connKey) that refused flagSealed, being
	// older than it: their transfers keep the checksums.
	unsealed sync.Map
	sealedN  atomic.Int64 // transfers whose raw blocks went unsummed (tests)

	sums sumStats // raw blocks pushed, by where their checksum came from
}

// SendSums reports where the checksums of the raw blocks this transport
// pushed came from: a sealed object's cache (tensor.Summed), or computed.
func (t *Transport) SendSums() SumStats { return t.sums.stats() }

var (
	_ fabric.Transport = (*Transport)(nil)
	_ fabric.Writer    = (*Transport)(nil)
)

// connKey names an owner's data service: its peer ID (as the ref spells
// it) and address.
type connKey struct{ peer, addr string }

type conn struct {
	*link
	key   connKey
	abort func() // closes it; made once, for the per-transfer ctx watcher
}

// New returns a tcp transport.
func New(cfg Config) (*Transport, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, m: m}
	for i, name := range sumSources {
		t.sums.vec[i] = m.pushSums.WithLabelValues(name)
	}
	t.pool = kit.NewPool(kit.PoolConfig[connKey, *conn]{
		Dial: t.dial, MaxConns: cfg.MaxConns, MaxIdle: cfg.MaxIdle, IdleTimeout: cfg.IdleTimeout,
		OnWait: m.waits.Inc, OnDial: m.dials.Inc,
	})
	return t, nil
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
		return fabric.Cost{Path: topology.Path{Class: topology.PathSYS}, GBps: loopbackGBps, Reason: "same host over loopback sockets", Stripes: t.cfg.Streams}, true
	}
	return fabric.Cost{Path: topology.Path{Class: topology.PathNET}, GBps: netGBps, Reason: "any host over TCP", Stripes: t.cfg.Streams}, true
}

// transfer is one Read or Write as its stripes see it.
type transfer struct {
	op       byte
	key      connKey
	claim    fabric.Claim
	compress bool
	dtype    tensor.DType
	// received, when set, hears of a read's bytes as they arrive: n bytes
	// from object offset off are in place (a device read copies them in
	// meanwhile, fabric.StagedReadProgress).
	received func(off int64, n int)
	// sums, for a push of a sealed object, are its blocks' checksums, at
	// offsets in the pushed bytes (p[0] is 0); base is the remote offset
	// p[0] goes to.
	sums *tensor.ChunkSums
	base int64
}

// Read pulls src into dst over one or more authenticated connections.
func (t *Transport) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	if src.Length < 0 || dst.Len() < src.Length {
		return fabric.Stats{}, fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dst.Len(), src.Length)
	}
	if tensor.IsDevice(dst) {
		return t.readDevice(ctx, src, dst)
	}
	to, err := tensor.BytesOf(dst)
	if err != nil {
		return fabric.Stats{}, err
	}
	return t.run(ctx, opRead, src, to[:src.Length])
}

// Write pushes the first dst.Length bytes of src into the sink the owner
// of dst resolves dst.Claim to, at dst.Offset. The owner verifies every
// block and acknowledges the whole push; Write returns nil only after that.
func (t *Transport) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	if dst.Length < 0 || src.Len() < dst.Length {
		return fabric.Stats{}, fmt.Errorf("%w: source holds %d of %d bytes", fabric.ErrBadRequest, src.Len(), dst.Length)
	}
	if tensor.IsDevice(src) {
		return t.writeDevice(ctx, src, dst)
	}
	from, err := tensor.BytesOf(src)
	if err != nil {
		return fabric.Stats{}, err
	}
	// A sealed object's blocks go with their cached checksums.
	return t.runWith(ctx, opWrite, dst, from[:dst.Length], nil, nil, tensor.SumsOf(src))
}

func (t *Transport) run(ctx context.Context, op byte, r fabric.Remote, p []byte) (fabric.Stats, error) {
	return t.runWith(ctx, op, r, p, nil, nil, nil)
}

// runWith is run with a read's progress reported to received, and a
// push's cached checksums (transfer). A gathered push (WriteRuns) passes
// its data as g instead of p.
func (t *Transport) runWith(ctx context.Context, op byte, r fabric.Remote, p []byte, g *gather, received func(off int64, n int), sums *tensor.ChunkSums) (fabric.Stats, error) {
	start := time.Now()
	addr := r.Addrs[fabric.TCP]
	if addr == "" {
		return fabric.Stats{}, fmt.Errorf("%w: owner %s serves no tcp address", fabric.ErrNoPath, r.Peer)
	}
	x := transfer{op: op, key: connKey{r.Peer, addr}, claim: r.Claim, dtype: r.DType, received: received, sums: sums, base: r.Offset}
	n := int64(len(p))
	if g != nil {
		n = g.n
	}
	var est linkEstimate
	var codecBps float64
	if t.cfg.Compression == CompressAuto && n >= minCompress {
		// Only auto mode at sizes worth compressing looks at the link;
		// small transfers skip the lookup (and its lock).
		est = t.links.get(x.key)
		if est.bps > 0 {
			codecBps = t.codecBps()
		}
	}
	compress, reason := decide(t.cfg.Compression, n, est, codecBps)
	x.compress = compress
	t.m.decided(compress, reason).Inc()

	streams := int(min(int64(t.cfg.Streams), max(1, n/t.cfg.StripeMin)))
	var wire int64
	var err error
	if streams == 1 {
		wire, err = t.stripe(ctx, &x, r.Offset, p, g)
	} else {
		streams, wire, err = t.striped(ctx, x, r.Offset, p, g, n, streams)
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fabric.Stats{}, cerr
		}
		return fabric.Stats{}, err
	}
	d := time.Since(start)
	t.links.observe(x.key, compress, reason, n, wire, d)
	if compress {
		t.m.raw.Add(float64(n))
		t.m.wire.Add(float64(wire))
	}
	if (compress || reason != "small" && reason != "empty") && t.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
		t.cfg.Logger.Debug("tcp transfer", "op", opName(op), "peer", r.Peer, "bytes", n, "wire", wire,
			"ratio", float64(wire)/float64(max(n, 1)), "compressed", compress, "reason", reason,
			"dtype", r.DType, "streams", streams, "seconds", d.Seconds())
	}
	return fabric.Stats{Transport: fabric.TCP, Bytes: n, Duration: d, Streams: streams}, nil
}

// striped moves p over up to streams connections at once. It is apart
// from run so that the closures it needs do not make small transfers
// allocate.
func (t *Transport) striped(ctx context.Context, x transfer, base int64, p []byte, g *gather, n int64, streams int) (int, int64, error) {
	part := (n + int64(streams) - 1) / int64(streams)
	part = (part + DefaultChunkSize - 1) / DefaultChunkSize * DefaultChunkSize
	eg, gctx := errgroup.WithContext(ctx)
	var wires atomic.Int64
	used := 0
	for off := int64(0); off < n; off += part {
		end := min(off+part, n)
		used++
		var sp []byte
		var sg *gather
		if g != nil {
			sg = g.slice(off, end)
		} else {
			sp = p[off:end]
		}
		eg.Go(func() error {
			wire, err := t.stripe(gctx, &x, base+off, sp, sg)
			wires.Add(wire)
			return err
		})
	}
	err := eg.Wait()
	return used, wires.Load(), err
}

func opName(op byte) string {
	if op == opWrite {
		return "write"
	}
	return "read"
}

func (t *Transport) codecBps() float64 {
	if t.cfg.CodecBps > 0 {
		return t.cfg.CodecBps
	}
	return codecThroughput(t.cfg.Streams)
}

// stripe moves [off, off+len(p)) of the object on one connection and
// returns the bytes it put on or took off the wire. A pooled connection
// that the owner has since closed is replaced once.
func (t *Transport) stripe(ctx context.Context, x *transfer, off int64, p []byte, g *gather) (wire int64, err error) {
	for attempt := 0; ; attempt++ {
		c, pooled, err := t.pool.Get(ctx, x.key)
		if err != nil {
			return wire, err
		}
		// Cancellation closes the connection, which unblocks any I/O at
		// once. A context that cannot be cancelled needs no watcher.
		stop := func() bool { return true }
		if ctx.Done() != nil {
			stop = context.AfterFunc(ctx, c.abort)
		}
		w, inStep, err := t.exchange(c, x, off, p, g)
		wire += w
		if errors.Is(err, errSealRefused) {
			// An owner from before flagSealed, which hung up: ask again
			// with checksums, on a new connection.
			stop()
			t.pool.Discard(c)
			t.unsealed.Store(x.key, true)
			continue
		}
		if !stop() {
			t.pool.Discard(c)
			if ctx.Err() != nil {
				return wire, ctx.Err()
			}
			return wire, err
		}
		if inStep {
			t.pool.Put(c)
			return wire, err
		}
		t.pool.Discard(c)
		if pooled && attempt == 0 && errors.Is(err, fabric.ErrPeerClosed) {
			continue
		}
		return wire, err
	}
}

// exchange runs one request on c and returns the bytes of data it moved
// over the wire. inStep reports whether c can carry another request: after
// success, and after the owner refused the request with a status (the
// refusal ends the exchange cleanly).
func (t *Transport) exchange(c *conn, x *transfer, off int64, p []byte, g *gather) (wire int64, inStep bool, err error) {
	n := int64(len(p))
	if g != nil {
		n = g.n
	}
	req := request{op: x.op, claim: x.claim, offset: off, length: n, dtype: x.dtype}
	if x.compress {
		req.flags = flagCompress
	}
	// A small push goes out with its request in one writev, and waits for
	// one status (the ack) instead of two.
	eager := x.op == opWrite && n <= eagerMax
	if eager {
		req.flags |= flagEager
	}
	sealed := c.sealed && !t.cfg.SealedChecksums && n > 0
	if sealed {
		if _, old := t.unsealed.Load(x.key); old {
			sealed = false
		}
	}
	if sealed {
		req.flags |= flagSealed
	}
	c.req = req.appendTo(c.req[:0])
	if !eager {
		c.armWrite()
		if _, err := c.Write(c.req); err != nil {
			return 0, false, t.ioError(err)
		}
		if refused, err := t.status(c); err != nil {
			return 0, refused, sealRefused(sealed, err)
		}
	}
	if sealed {
		t.sealedN.Add(1)
	}
	if x.op == opRead {
		var progress func(pos int)
		if x.received != nil {
			progress = func(pos int) { x.received(off, pos) }
		}
		wire, err := c.recvBlocksTo(p, off, sealed, progress)
		if err != nil {
			if errors.Is(err, fabric.ErrCorrupt) {
				return wire, false, err
			}
			return wire, false, t.ioError(err)
		}
		return wire, true, nil
	}
	var prefix []byte
	if eager {
		prefix = c.req
	}
	c.sums, c.sumsAt = x.sums, off-x.base
	if g != nil {
		wire, err = c.sendGathered(prefix, g, t.cfg.ChunkSize, x.compress, tcodec.HintFor(x.dtype), t.corruptNext.Swap(false), sealed)
	} else {
		wire, err = c.sendBlocks(prefix, p, t.cfg.ChunkSize, x.compress, tcodec.HintFor(x.dtype), t.corruptNext.Swap(false), sealed)
	}
	c.sums = nil
	wire -= int64(len(prefix))
	if err != nil {
		// The owner may have refused a block and hung up: its verdict, if
		// it sent one, says more than the broken pipe.
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, serr := t.status(c); serr != nil && !errors.Is(serr, fabric.ErrPeerClosed) && !errors.Is(serr, fabric.ErrStalled) {
			return wire, false, sealRefused(sealed, serr)
		}
		return wire, false, t.ioError(err)
	}
	// The owner's acknowledgement of the whole push.
	refused, err := t.status(c)
	if eager && sealRefused(sealed, err) != err {
		return wire, false, errSealRefused
	}
	return wire, err == nil || refused, err
}

// errSealRefused: an owner from before flagSealed refused it (and hung up).
var errSealRefused = errors.New("tcp: owner refused flag sealed")

// sealRefused turns an old owner's refusal of a sealed request (a bad
// request with unknown flags, as readRequest words it) into
// errSealRefused, which makes the stripe ask again with checksums.
func sealRefused(sealed bool, err error) error {
	if sealed && errors.Is(err, fabric.ErrBadRequest) && strings.Contains(err.Error(), "unknown flags") {
		return errSealRefused
	}
	return err
}

// status reads a status byte and, when it is not OK, the owner's message.
// refused reports a clean refusal, after which the connection is in step.
func (t *Transport) status(c *conn) (refused bool, err error) {
	c.armRead()
	code, err := c.r.ReadByte()
	if err != nil {
		return false, t.ioError(err)
	}
	if code == peerauth.StatusOK {
		return false, nil
	}
	msg, err := peerauth.ReadField(c.r, peerauth.MaxMessage)
	if err != nil {
		return false, t.ioError(err)
	}
	if code == statusCorrupt {
		// The owner hangs up after this one.
		return false, fmt.Errorf("%w: owner: %s", fabric.ErrCorrupt, msg)
	}
	return true, peerauth.StatusError(code, string(msg))
}

func (t *Transport) ioError(err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: no progress for %v: %v", fabric.ErrStalled, t.cfg.StallTimeout, err)
	}
	return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
}

func (t *Transport) dial(ctx context.Context, k connKey) (*conn, error) {
	want, err := peer.Decode(k.peer)
	if err != nil {
		return nil, fmt.Errorf("%w: owner peer id %q: %v", fabric.ErrBadRequest, k.peer, err)
	}
	dial := t.cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	var res peerauth.Result
	nc, err := kit.Connect(ctx, t.cfg.DialTimeout, "tcp", k.addr,
		func(ctx context.Context) (net.Conn, error) { return dial(ctx, "tcp", k.addr) },
		func(nc net.Conn) (err error) {
			res, err = peerauth.ClientFor(nc, t.cfg.Security, want)
			return err
		})
	if err != nil {
		return nil, err
	}
	sc, err := res.Wrap(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := &conn{link: newLink(sc, t.cfg.StallTimeout), key: k}
	c.sumStats = &t.sums // the raw blocks it pushes
	c.sealed = res.Keys != nil
	c.abort = func() { c.Close() }
	return c, nil
}

// Close closes every connection, aborting transfers in flight. It is
// idempotent.
func (t *Transport) Close() error { return t.pool.Close() }
