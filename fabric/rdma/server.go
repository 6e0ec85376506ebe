package rdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// ServerConfig configures the owner side of the rdma transport. Zero
// values mean the documented defaults.
type ServerConfig struct {
	Provider Provider // required
	// Security: Identity (required), ClusterKey (the cluster key queue pairs
	// must prove, OpenConfig.ClusterKey), AllowPeer (admits remote peers; nil
	// admits every authenticated one) and Logger; see fabric.Security.
	// rdma does not encrypt, so EncryptData is refused.
	fabric.Security
	Source fabric.Source // required: resolves claims to memory (and pins it)
	// Sink, when set, accepts pushes (remote WRITEs into reader-allocated
	// buffers).
	Sink fabric.Sink
	// NICs names the provider devices to serve on; default every device
	// that has an address.
	NICs []string
	// OpenTimeout bounds resolving a claim (Source.Open); default 5 s, or
	// Security.StallTimeout when that is shorter: an owner that cannot
	// resolve a claim makes no progress, which StallTimeout bounds.
	OpenTimeout time.Duration
	// Limits caps the queue pairs each rail accepts (in total and per
	// peer) and closes those idle for longer than Limits.IdleTimeout; zero
	// values mean fabric's defaults (1024, 128, 5 min).
	Limits fabric.ListenerLimits
	// ListenerMetrics counts each rail's listener ("rdma/<nic>"); nil: not
	// counted.
	ListenerMetrics *fabric.ListenerMetrics
	// Metrics counts device memory the owner stages for the NICs
	// (DeviceStaged); nil: not counted.
	Metrics *Metrics
}

// Server is the owner side: one listening device per NIC. A reader's
// control message resolves a claim through the Source, which pins the
// object; the server registers the pinned range on every NIC and answers
// with the keys. The pin and the registrations last until the reader says
// done, the queue pair the claim came over goes away, the object is
// revoked (Revoke) or the server closes; deregistration makes later
// accesses with those keys fail with a remote access error.
type Server struct {
	cfg  ServerConfig
	nics []serverNIC
	gd   *gpuDirect

	mu     sync.Mutex
	regs   map[regID]*registration
	tombs  map[regID]time.Time // done before the resolve finished
	closed bool
}

type serverNIC struct {
	name string
	dev  Context
	pd   ProtectionDomain
}

type regID struct {
	peer peer.ID
	id   uint64
}

type registration struct {
	id  regID
	qp  qpRef
	obj fabric.ObjectID
	pin tensor.Buffer
	mrs []MemoryRegion
}

type qpRef struct {
	nic string
	id  uint64
}

// tombstoneTTL bounds how long a done that overtook its resolve is
// remembered.
const tombstoneTTL = time.Minute

// Listen opens the NICs and starts serving.
func Listen(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if err := cfg.Security.Defaults("rdma: ServerConfig"); err != nil {
		return nil, err
	}
	if cfg.Provider == nil || cfg.Source == nil {
		return nil, errors.New("rdma: ServerConfig needs a Provider and a Source")
	}
	if cfg.EncryptData {
		return nil, ErrEncrypt
	}
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = min(5*time.Second, cfg.StallTimeout)
	}
	names := cfg.NICs
	if len(names) == 0 {
		for _, d := range cfg.Provider.Devices() {
			if d.Addr != "" {
				names = append(names, d.Name)
			}
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: provider %s has no device to serve on", ErrNoDevice, cfg.Provider.Name())
	}
	s := &Server{cfg: cfg, regs: map[regID]*registration{}, tombs: map[regID]time.Time{},
		gd: &gpuDirect{prov: cfg.Provider, log: cfg.Logger, metrics: cfg.Metrics}}
	for _, name := range names {
		dev, err := cfg.Provider.Open(ctx, name, OpenConfig{Security: cfg.Security, Listen: true,
			Handler: &nicHandler{s: s, nic: name}, Limits: cfg.Limits, ListenerMetrics: cfg.ListenerMetrics})
		if err != nil {
			s.Close()
			return nil, err
		}
		pd, err := dev.AllocPD()
		if err != nil {
			dev.Close()
			s.Close()
			return nil, err
		}
		s.nics = append(s.nics, serverNIC{name: name, dev: dev, pd: pd})
	}
	return s, nil
}

// Addr returns the address list readers put in Remote.Addrs["rdma"].
func (s *Server) Addr() string {
	rails := make([]Rail, len(s.nics))
	for i, n := range s.nics {
		rails[i] = Rail{NIC: n.name, Addr: n.dev.Addr()}
	}
	return FormatAddrs(rails)
}

// Registrations returns how many claims are registered right now.
func (s *Server) Registrations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.regs)
}

// Revoke deregisters every registration of the object and releases its
// pins, as freeing the object must: readers still using the keys get a
// remote access error (fabric.ErrObjectFreed) instead of data. It returns
// how many registrations it revoked.
func (s *Server) Revoke(obj fabric.ObjectID) int {
	s.mu.Lock()
	var gone []*registration
	for k, r := range s.regs {
		if r.obj == obj {
			gone = append(gone, r)
			delete(s.regs, k)
		}
	}
	s.mu.Unlock()
	for _, r := range gone {
		r.release()
	}
	if len(gone) > 0 {
		s.cfg.Logger.Info("rdma registrations revoked", "object", obj, "count", len(gone))
	}
	return len(gone)
}

// Close stops serving, breaks every queue pair and releases every pin.
// Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	var errs []error
	for _, n := range s.nics {
		errs = append(errs, n.dev.Close())
	}
	s.mu.Lock()
	regs := s.regs
	s.regs = map[regID]*registration{}
	s.mu.Unlock()
	for _, r := range regs {
		r.release()
	}
	return errors.Join(errs...)
}

func (r *registration) release() {
	for _, m := range r.mrs {
		m.Deregister()
	}
	r.pin.Release()
}

type nicHandler struct {
	s   *Server
	nic string
}

func (h *nicHandler) HandleMessage(ctx context.Context, from RemoteQP, msg []byte) ([]byte, error) {
	if len(msg) > 0 && (msg[0] == msgResolveBatch || msg[0] == msgDoneBatch || msg[0] == msgWriteBatch) {
		return h.s.handleBatch(ctx, qpRef{nic: h.nic, id: from.ID}, from.Peer, msg) // batchserver.go
	}
	res, done, err := decodeControl(msg)
	switch {
	case err != nil:
		return nil, err
	case res != nil:
		return h.s.resolve(ctx, qpRef{nic: h.nic, id: from.ID}, from.Peer, res)
	}
	h.s.done(regID{peer: from.Peer, id: done})
	return nil, nil
}

func (h *nicHandler) QPClosed(from RemoteQP) {
	ref := qpRef{nic: h.nic, id: from.ID}
	s := h.s
	s.mu.Lock()
	var gone []*registration
	for k, r := range s.regs {
		if r.qp == ref {
			gone = append(gone, r)
			delete(s.regs, k)
		}
	}
	s.mu.Unlock()
	for _, r := range gone {
		r.release()
	}
}

func (s *Server) resolve(ctx context.Context, qp qpRef, who peer.ID, req *resolveReq) ([]byte, error) {
	resp, err := s.register(ctx, qp, who, req)
	if err != nil {
		return nil, err
	}
	return resp.marshal(), nil
}

// register resolves and pins one claim, registers the pinned range on
// every NIC and records the registration under the reader's id.
func (s *Server) register(ctx context.Context, qp qpRef, who peer.ID, req *resolveReq) (resolveResp, error) {
	key := regID{peer: who, id: req.id}
	octx, cancel := context.WithTimeout(ctx, s.cfg.OpenTimeout)
	defer cancel()
	var pin tensor.Buffer
	var err error
	access := AccessRemoteRead
	if req.push {
		if s.cfg.Sink == nil {
			return resolveResp{}, fmt.Errorf("%w: this owner accepts no pushes", fabric.ErrBadRequest)
		}
		access = AccessRemoteWrite
		pin, err = s.cfg.Sink.OpenSink(octx, req.claim)
	} else {
		pin, err = s.cfg.Source.Open(octx, req.claim.For(req.offset, req.length))
	}
	if err != nil {
		return resolveResp{}, err
	}
	var data []byte
	if err = fabric.CheckRange(req.offset, req.length, pin.Len()); err == nil {
		if tensor.IsDevice(pin) {
			// Device memory: the NICs read a staged copy (see device.go).
			if !req.push {
				s.gd.staged(pin, "serve")
			}
			pin, data, err = stageRead(octx, pin, req.offset, req.length, req.push)
		} else if data, err = tensor.BytesOf(pin); err == nil {
			data = data[req.offset : req.offset+req.length]
		}
	}
	if err != nil {
		if pin != nil {
			pin.Release()
		}
		return resolveResp{}, err
	}
	reg := &registration{id: key, qp: qp, obj: req.claim.Object, pin: pin}
	resp := resolveResp{length: req.length}
	for _, n := range s.nics {
		// Bound to the reader where the provider can: keys that leak or
		// are guessed are useless to any other peer.
		var m MemoryRegion
		var err error
		if b, ok := n.pd.(PeerBinder); ok {
			m, err = b.RegisterMemoryFor(data, access, who)
		} else {
			m, err = n.pd.RegisterMemory(data, access)
		}
		if err != nil {
			reg.release()
			return resolveResp{}, fmt.Errorf("rdma: register on %s: %w", n.name, err)
		}
		reg.mrs = append(reg.mrs, m)
		resp.keys = append(resp.keys, regKey{NIC: n.name, RKey: m.RKey(), Addr: m.Addr()})
	}
	s.mu.Lock()
	_, cancelled := s.tombs[key]
	_, dup := s.regs[key]
	if s.closed || cancelled || dup {
		delete(s.tombs, key)
		s.mu.Unlock()
		reg.release()
		return resolveResp{}, fmt.Errorf("%w: registration %d cancelled or reused", fabric.ErrBadRequest, req.id)
	}
	s.regs[key] = reg
	s.mu.Unlock()
	return resp, nil
}

func (s *Server) done(key regID) {
	s.mu.Lock()
	r := s.regs[key]
	delete(s.regs, key)
	if r == nil {
		now := time.Now()
		for k, t := range s.tombs {
			if now.Sub(t) > tombstoneTTL {
				delete(s.tombs, k)
			}
		}
		if len(s.tombs) < 1<<16 {
			s.tombs[key] = now
		}
	}
	s.mu.Unlock()
	if r != nil {
		r.release()
	}
}
