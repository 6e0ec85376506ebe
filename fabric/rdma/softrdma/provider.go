package softrdma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/kit"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/faults"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
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
	// Dial connects from laddr (may be "") to raddr; default DialFrom.
	Dial func(ctx context.Context, network, laddr, raddr string) (net.Conn, error)
}

// DialFrom is NIC.Dial's default: a TCP connection to raddr from laddr
// (host:port, port 0 for any; "" lets the kernel choose), so a rail's
// traffic leaves through its own NIC's address. A Dial that wraps it (to
// track the connection, or to dial inside a network namespace) calls it.
func DialFrom(ctx context.Context, network, laddr, raddr string) (net.Conn, error) {
	return kit.DialFrom(ctx, network, laddr, raddr)
}

// Config configures the software provider. Zero values mean the defaults.
type Config struct {
	NICs []NIC
	// ChunkSize is the largest payload of one data frame, the unit of
	// checksumming and of one socket write; default 1 MiB (fewer frames
	// and syscalls per byte), at most MaxPayload.
	ChunkSize int
	// MaxSGE is the most local segments one WRITE may carry
	// (rdma.WorkRequest.SGL; the device's rdma.SGELimit); default
	// DefaultMaxSGE. A WRITE's segments go out as its ordinary data
	// frames, each written with one writev from the segments.
	MaxSGE int
	// HandshakeTimeout bounds authenticating an accepted queue pair;
	// default 10 s.
	HandshakeTimeout time.Duration
	// StallTimeout bounds each frame write of a responder: a requester
	// that stops reading is dropped rather than holding the responder (and
	// the registrations of its queue pair); default 30 s.
	StallTimeout time.Duration
	// Faults is how this module's tests make the provider damage what it
	// sends; nil (the only value other code can set) is healthy.
	Faults *faults.Sim
}

// Provider is the software verbs provider: each NIC is a TCP listener, a
// queue pair is one authenticated TCP connection between two NICs, and the
// passive side serves one-sided READ and WRITE requests straight from and
// into its registered memory, checking keys and ranges against its
// registration table. Nothing is simulated about the bytes: they cross real
// sockets; what is emulated is the NIC (in software, on the host CPU).
type Provider struct {
	cfg Config
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
	if cfg.MaxSGE <= 0 {
		cfg.MaxSGE = DefaultMaxSGE
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = 30 * time.Second
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
	if err := provbase.CheckOpen("softrdma", &cfg); err != nil {
		return nil, err
	}
	d := &device{p: p, nic: *nic, mrs: map[uint32]*mr{}, lkeys: map[uint32]*mr{}, qps: map[*qp]struct{}{},
		dead: map[uint32]peer.ID{}}
	d.Init("softrdma", nic.Name, nic.Addr, cfg, p.cfg.HandshakeTimeout)
	if cfg.Listen {
		listen := nic.Listen
		if listen == nil {
			listen = (&net.ListenConfig{}).Listen
		}
		ln, err := listen(ctx, "tcp", nic.Addr)
		if err != nil {
			return nil, fmt.Errorf("softrdma: NIC %s: listen on %s: %w", nic.Name, nic.Addr, err)
		}
		d.Serve(ln, d.serve)
	}
	return d, nil
}

// device is an opened NIC: the providers' shared base (name,
// configuration, lock and closed state, listener, queue-pair ids) and
// the registration tables, guarded by Mu.
type device struct {
	provbase.Base
	p   *Provider
	nic NIC

	mrs   map[uint32]*mr // by rkey
	lkeys map[uint32]*mr
	qps   map[*qp]struct{}
	// dead remembers the rkeys of recent deregistrations (and whom they
	// were bound to): a reader that still uses one raced a revocation, it
	// did not guess. Bounded by deadOrder.
	dead      map[uint32]peer.ID
	deadOrder []uint32
}

func (d *device) AllocPD() (rdma.ProtectionDomain, error) {
	if err := d.Live(); err != nil {
		return nil, err
	}
	return &pd{dev: d}, nil
}

func (d *device) CreateCQ() (rdma.CompletionQueue, error) { return &cq{}, nil }

// Close stops the listener, breaks every queue pair and responder, and
// deregisters all memory. Idempotent.
func (d *device) Close() error {
	if !d.MarkClosed() {
		return nil
	}
	d.Mu.Lock()
	qps := d.qps
	d.qps = map[*qp]struct{}{}
	// A copy: Deregister, also called by other devices' goroutines (a
	// registration spans NICs), deletes from d.mrs under d.Mu.
	mrs := make([]*mr, 0, len(d.mrs))
	for _, m := range d.mrs {
		mrs = append(mrs, m)
	}
	d.Mu.Unlock()
	for q := range qps {
		q.Close()
	}
	// Closes the listener and every responder's connection, and waits for
	// the responders.
	err := d.CloseListener()
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
// remotely accessible region of its device that is not bound to another
// peer (RegisterMemoryFor; ibverbs would check that the region's PD is the
// QP's).
type pd struct {
	dev *device
}

func (p *pd) RegisterMemory(buf []byte, access rdma.Access) (rdma.MemoryRegion, error) {
	return p.RegisterMemoryFor(buf, access, "")
}

var _ rdma.PeerBinder = (*pd)(nil)

// RegisterMemoryFor registers buf for remote access by queue pairs
// authenticated as remote only ("" : any peer). A remote access names a
// region by (rkey, address): the 32-bit rkey (fresh, random, never one in
// use or recently revoked) and a random 4 KiB-aligned I/O address in a
// 2^58-byte space make a guess succeed once in about 2^78 tries, and a
// queue pair is dropped after maxBadKeys wrong ones.
func (p *pd) RegisterMemoryFor(buf []byte, access rdma.Access, remote peer.ID) (rdma.MemoryRegion, error) {
	d := p.dev
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if d.Closed {
		return nil, fabric.ErrClosed
	}
	m := &mr{pd: p, buf: buf, access: access, peer: remote}
	for m.rkey == 0 || d.mrs[m.rkey] != nil || d.dead[m.rkey] != "" {
		m.rkey = randKey()
	}
	for m.lkey == 0 || d.lkeys[m.lkey] != nil {
		m.lkey = randKey()
	}
	// Random I/O addresses: predictable ones would leave the rkey alone
	// to guess.
	m.addr = randAddr()
	d.mrs[m.rkey], d.lkeys[m.lkey] = m, m
	return m, nil
}

// randAddr returns a random 4 KiB-aligned address in [2^40, 2^40+2^58):
// far from 0 and from the top, so that addr+len never wraps.
func randAddr() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return 1<<40 + binary.BigEndian.Uint64(b[:])&(1<<58-1)&^(4<<10-1)
}

func (p *pd) CreateQP(c rdma.CompletionQueue, cfg rdma.QPConfig) (rdma.QueuePair, error) {
	q, ok := c.(*cq)
	if !ok {
		return nil, errors.New("softrdma: completion queue of another provider")
	}
	qp := &qp{pd: p, cq: q, cfg: provbase.QPConfig(cfg), pending: map[uint64]*pendingWR{}}
	qp.abort = func() { qp.fail(errAborted, rdma.StatusFlushed) }
	return qp, nil
}

// Close deregisters the domain's regions.
func (p *pd) Close() error {
	d := p.dev
	d.Mu.Lock()
	var mine []*mr
	for _, m := range d.mrs {
		if m.pd == p {
			mine = append(mine, m)
		}
	}
	d.Mu.Unlock()
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
	peer       peer.ID // the only peer that may access it remotely; "": any

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
	d.Mu.Lock()
	if d.mrs[m.rkey] == m {
		delete(d.mrs, m.rkey)
		if m.access&(rdma.AccessRemoteRead|rdma.AccessRemoteWrite) != 0 {
			d.buryLocked(m.rkey, m.peer)
		}
	}
	if d.lkeys[m.lkey] == m {
		delete(d.lkeys, m.lkey)
	}
	d.Mu.Unlock()
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

// maxDead bounds the revoked rkeys a device remembers.
const maxDead = 1 << 14

// anyPeer stands for "bound to no peer" among the dead keys (whose zero
// value means "not dead").
const anyPeer = peer.ID("*")

func (d *device) buryLocked(rkey uint32, bound peer.ID) {
	if bound == "" {
		bound = anyPeer
	}
	if len(d.deadOrder) >= maxDead {
		delete(d.dead, d.deadOrder[0])
		d.deadOrder = d.deadOrder[1:]
	}
	d.dead[rkey] = bound
	d.deadOrder = append(d.deadOrder, rkey)
}

// remoteMR returns the region rkey names for a remote access by who that
// needs need. When there is none, guess says whether the key was never
// issued to who (nor revoked lately): a wrong guess, not a lost race with a
// revocation.
func (d *device) remoteMR(rkey uint32, need rdma.Access, who peer.ID) (m *mr, ok, guess bool) {
	d.Mu.Lock()
	defer d.Mu.Unlock()
	m = d.mrs[rkey]
	switch {
	case m != nil && (m.peer == "" || m.peer == who):
		if m.access&need != 0 {
			return m, true, false
		}
		return nil, false, true // a region's key, asking for what it does not allow
	case m == nil:
		if b := d.dead[rkey]; b == anyPeer || (b != "" && b == who) {
			return nil, false, false
		}
	}
	return nil, false, true
}

// DefaultMaxSGE is Config.MaxSGE's default: 256 segments. A frame then
// has at most 256 pieces, one writev of 258 iovecs (under the kernel's
// 1024), and a resharded move's 4 KiB runs fill 1 MiB per WRITE, about a
// slice: with 64 (1.25-1.32x the unsharded step in BenchmarkReshard's
// gathered step) four times the work requests and completions cost more
// than with 256 (1.15-1.25x); 1024 read the same (1.17-1.24x), load
// 3.6-4.5.
const DefaultMaxSGE = 256

// MaxSGE is the most local segments one WRITE may carry (rdma.SGELimit).
func (d *device) MaxSGE() int { return d.p.cfg.MaxSGE }

var _ rdma.SGELimit = (*device)(nil)

func (d *device) localMR(p *pd, lkey uint32) *mr {
	d.Mu.Lock()
	defer d.Mu.Unlock()
	if m := d.lkeys[lkey]; m != nil && m.pd == p {
		return m
	}
	return nil
}

// cq is a completion queue with a completion channel: the responses'
// receivers push into it.
type cq struct{ provbase.Completions }
