package softrdma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// NIC is one simulated RDMA NIC: a name and the address its listener binds
// to. A host (or network namespace) with two interfaces gets two NICs with
// two addresses, hence two real rails.
type NIC struct {
	Name string
	// Addr is the listen address ("10.1.0.2:4791", port 0 picks one). Its
	// host part is also the local address queue pairs dial from, so their
	// traffic leaves through this NIC's interface.
	Addr string
	// Listen creates the listener; default net.ListenConfig.Listen. Tests
	// pass one that creates it inside a network namespace.
	Listen func(ctx context.Context, network, addr string) (net.Listener, error)
	// Dial connects from laddr (may be "") to raddr; default a net.Dialer
	// bound to laddr.
	Dial func(ctx context.Context, network, laddr, raddr string) (net.Conn, error)
}

// Config configures the software provider. Zero values mean the defaults.
type Config struct {
	NICs []NIC
	// ChunkSize is the largest payload of one data frame, the unit of
	// checksumming and of one socket write; default 1 MiB (fewer frames
	// and syscalls per byte), at most MaxPayload.
	ChunkSize int
	// HandshakeTimeout bounds authenticating an accepted queue pair;
	// default 10 s.
	HandshakeTimeout time.Duration
}

// Provider is the software verbs provider: each NIC is a TCP listener, a
// queue pair is one authenticated TCP connection between two NICs, and the
// passive side serves one-sided READ and WRITE requests straight from and
// into its registered memory, checking keys and ranges against its
// registration table. Nothing is simulated about the bytes: they cross real
// sockets; what is emulated is the NIC (in software, on the host CPU).
type Provider struct {
	cfg     Config
	corrupt atomic.Bool
}

var _ rdma.Provider = (*Provider)(nil)

// New returns a provider driving cfg.NICs.
func New(cfg Config) (*Provider, error) {
	seen := map[string]bool{}
	for i, n := range cfg.NICs {
		if n.Name == "" || seen[n.Name] {
			return nil, fmt.Errorf("softrdma: NIC %d: empty or duplicate name %q", i, n.Name)
		}
		seen[n.Name] = true
		if _, _, err := net.SplitHostPort(n.Addr); err != nil {
			return nil, fmt.Errorf("softrdma: NIC %s: address %q: %v", n.Name, n.Addr, err)
		}
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 1 << 20
	}
	cfg.ChunkSize = min(cfg.ChunkSize, MaxPayload)
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	return &Provider{cfg: cfg}, nil
}

// Name returns "softrdma".
func (p *Provider) Name() string { return "softrdma" }

// Devices lists the configured NICs.
func (p *Provider) Devices() []rdma.Device {
	out := make([]rdma.Device, len(p.cfg.NICs))
	for i, n := range p.cfg.NICs {
		out[i] = rdma.Device{Name: n.Name, Addr: n.Addr}
	}
	return out
}

// InjectCorruption makes the next data frame a device of this provider
// sends as a responder carry a flipped bit (after its checksum was
// computed). Fault injection for tests; the receiver must catch it.
func (p *Provider) InjectCorruption() { p.corrupt.Store(true) }

// Open opens a NIC; with cfg.Listen it starts accepting queue pairs.
func (p *Provider) Open(ctx context.Context, name string, cfg rdma.OpenConfig) (rdma.Context, error) {
	var nic *NIC
	for i := range p.cfg.NICs {
		if p.cfg.NICs[i].Name == name {
			nic = &p.cfg.NICs[i]
		}
	}
	if nic == nil {
		return nil, fmt.Errorf("%w: %q", rdma.ErrNoDevice, name)
	}
	if cfg.Identity == nil {
		return nil, errors.New("softrdma: OpenConfig needs Identity")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &device{p: p, nic: *nic, cfg: cfg, log: cfg.Logger.With("nic", nic.Name),
		mrs: map[uint32]*mr{}, lkeys: map[uint32]*mr{}, qps: map[*qp]struct{}{}, conns: map[*responder]struct{}{},
		nextAddr: 1 << 40}
	if cfg.Listen {
		listen := nic.Listen
		if listen == nil {
			listen = (&net.ListenConfig{}).Listen
		}
		ln, err := listen(ctx, "tcp", nic.Addr)
		if err != nil {
			return nil, fmt.Errorf("softrdma: NIC %s: listen on %s: %w", nic.Name, nic.Addr, err)
		}
		d.ln = ln
		d.wg.Add(1)
		go d.accept()
	}
	return d, nil
}

// device is an opened NIC.
type device struct {
	p   *Provider
	nic NIC
	cfg rdma.OpenConfig
	log *slog.Logger
	ln  net.Listener

	mu       sync.Mutex
	mrs      map[uint32]*mr // by rkey
	lkeys    map[uint32]*mr
	nextAddr uint64
	qps      map[*qp]struct{}
	conns    map[*responder]struct{}
	closed   bool
	nextQP   uint64
	wg       sync.WaitGroup
}

func (d *device) Device() rdma.Device { return rdma.Device{Name: d.nic.Name, Addr: d.Addr()} }

func (d *device) Addr() string {
	if d.ln == nil {
		return ""
	}
	return d.ln.Addr().String()
}

func (d *device) AllocPD() (rdma.ProtectionDomain, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fabric.ErrClosed
	}
	return &pd{dev: d}, nil
}

func (d *device) CreateCQ() (rdma.CompletionQueue, error) {
	return &cq{notify: make(chan struct{}, 1)}, nil
}

// Close stops the listener, breaks every queue pair and responder, and
// deregisters all memory. Idempotent.
func (d *device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	var err error
	if d.ln != nil {
		err = d.ln.Close()
	}
	qps, conns := d.qps, d.conns
	d.qps, d.conns = map[*qp]struct{}{}, map[*responder]struct{}{}
	// A copy: Deregister, also called by other devices' goroutines (a
	// registration spans NICs), deletes from d.mrs under d.mu.
	mrs := make([]*mr, 0, len(d.mrs))
	for _, m := range d.mrs {
		mrs = append(mrs, m)
	}
	d.mu.Unlock()
	for q := range qps {
		q.Close()
	}
	for c := range conns {
		c.conn.Close()
	}
	d.wg.Wait()
	for _, m := range mrs {
		m.Deregister()
	}
	return err
}

func randKey() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:]) | 1 // 0 is never a key
}

// pd is a protection domain. Remote queue pairs are not bound to a
// protection domain in this provider: an accepted queue pair may reach any
// remotely accessible region of its device (ibverbs would also check that
// the region's PD is the QP's).
type pd struct {
	dev *device
}

func (p *pd) RegisterMemory(buf []byte, access rdma.Access) (rdma.MemoryRegion, error) {
	d := p.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fabric.ErrClosed
	}
	m := &mr{pd: p, buf: buf, access: access}
	for m.rkey == 0 || d.mrs[m.rkey] != nil {
		m.rkey = randKey()
	}
	for m.lkey == 0 || d.lkeys[m.lkey] != nil {
		m.lkey = randKey()
	}
	// Fresh I/O addresses for every registration, with a gap, so a revoked
	// (key, address) pair never names a later region.
	m.addr = d.nextAddr
	d.nextAddr += (uint64(len(buf)) + 2<<20) &^ (1<<20 - 1)
	d.mrs[m.rkey], d.lkeys[m.lkey] = m, m
	return m, nil
}

func (p *pd) CreateQP(c rdma.CompletionQueue, cfg rdma.QPConfig) (rdma.QueuePair, error) {
	q, ok := c.(*cq)
	if !ok {
		return nil, errors.New("softrdma: completion queue of another provider")
	}
	if cfg.MaxOutstanding <= 0 {
		cfg.MaxOutstanding = 128
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	qp := &qp{pd: p, cq: q, cfg: cfg, pending: map[uint64]*pendingWR{}, calls: map[uint64]chan callResult{}}
	qp.abort = func() { qp.fail(errAborted, rdma.StatusFlushed) }
	return qp, nil
}

// Close deregisters the domain's regions.
func (p *pd) Close() error {
	d := p.dev
	d.mu.Lock()
	var mine []*mr
	for _, m := range d.mrs {
		if m.pd == p {
			mine = append(mine, m)
		}
	}
	d.mu.Unlock()
	for _, m := range mine {
		m.Deregister()
	}
	return nil
}

// mr is a registration. Every access by the provider holds mu for reading
// and checks dead, so Deregister (which takes it for writing) waits for
// accesses in progress and none happens after it returns.
//
// Data frames move straight between the socket and the region (access),
// so an access may block on the network. An access that still holds the
// region ioGrace after Deregister began is aborted (its queue pair's
// connection is closed), which bounds Deregister by ioGrace instead of by
// a stalled peer's timeout.
type mr struct {
	pd         *pd
	buf        []byte
	lkey, rkey uint32
	addr       uint64
	access     rdma.Access

	mu   sync.RWMutex
	dead bool

	amu    sync.Mutex
	dying  bool            // Deregister began: no new access starts
	aborts map[*func()]int // accesses in progress: how to abort each
}

// ioGrace is how long Deregister lets an access in progress finish before
// aborting it.
const ioGrace = 250 * time.Millisecond

func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }
func (m *mr) Addr() uint64 { return m.addr }
func (m *mr) Len() int     { return len(m.buf) }

func (m *mr) Deregister() error {
	m.amu.Lock()
	m.dying = true
	busy := len(m.aborts) > 0
	m.amu.Unlock()
	if busy {
		t := time.AfterFunc(ioGrace, m.abortAccesses)
		defer t.Stop()
	}
	m.mu.Lock()
	was := m.dead
	m.dead = true
	m.mu.Unlock()
	if was {
		return nil
	}
	d := m.pd.dev
	d.mu.Lock()
	if d.mrs[m.rkey] == m {
		delete(d.mrs, m.rkey)
	}
	if d.lkeys[m.lkey] == m {
		delete(d.lkeys, m.lkey)
	}
	d.mu.Unlock()
	return nil
}

func (m *mr) abortAccesses() {
	m.amu.Lock()
	defer m.amu.Unlock()
	for abort := range m.aborts {
		(*abort)()
	}
}

// span returns the offset of [addr, addr+n) inside the region, or false.
func (m *mr) span(addr uint64, n uint64) (int, bool) {
	if addr < m.addr || n > uint64(len(m.buf)) || addr-m.addr > uint64(len(m.buf))-n {
		return 0, false
	}
	return int(addr - m.addr), true
}

// io runs fn on the region's bytes [addr, addr+n) with the region held
// against Deregister; fn may block on a socket, which *abort (called at
// most once, from another goroutine, when Deregister has waited ioGrace)
// must unblock. It returns false without calling fn if the region is gone
// or the range lies outside it; otherwise fn's error.
func (m *mr) io(addr uint64, n int, abort *func(), fn func(p []byte) error) (bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	off, ok := m.span(addr, uint64(n))
	if m.dead || !ok {
		return false, nil
	}
	m.amu.Lock()
	if m.dying {
		m.amu.Unlock()
		return false, nil
	}
	if m.aborts == nil {
		m.aborts = map[*func()]int{}
	}
	m.aborts[abort]++
	m.amu.Unlock()
	err := fn(m.buf[off : off+n])
	m.amu.Lock()
	if m.aborts[abort]--; m.aborts[abort] == 0 {
		delete(m.aborts, abort)
	}
	m.amu.Unlock()
	return true, err
}

func (d *device) remoteMR(rkey uint32, need rdma.Access) (*mr, bool) {
	d.mu.Lock()
	m := d.mrs[rkey]
	d.mu.Unlock()
	return m, m != nil && m.access&need != 0
}

func (d *device) localMR(p *pd, lkey uint32) *mr {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.lkeys[lkey]; m != nil && m.pd == p {
		return m
	}
	return nil
}

// cq is a completion queue with a completion channel.
type cq struct {
	mu     sync.Mutex
	q      []rdma.Completion
	notify chan struct{}
	closed bool
}

func (c *cq) push(wc rdma.Completion) {
	c.mu.Lock()
	c.q = append(c.q, wc)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(wc []rdma.Completion) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(wc, c.q)
	c.q = c.q[n:]
	if len(c.q) == 0 {
		c.q = nil
	}
	return n
}

func (c *cq) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		ready, closed := len(c.q) > 0, c.closed
		c.mu.Unlock()
		switch {
		case ready:
			return nil
		case closed:
			return fabric.ErrClosed
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *cq) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return nil
}
