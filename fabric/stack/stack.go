package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/linkstat"
	"github.com/tensorlane/tensorlane/fabric/local"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/shm"
	"github.com/tensorlane/tensorlane/fabric/tcp"
)

// LinkStats and Monitor are fabric/linkstat's, named here so that callers
// of the stack (rdt's Runtime.Links) need not import the transport
// packages themselves.
type (
	LinkStats = linkstat.LinkStats
	Monitor   = linkstat.Monitor
)

// Stack is the running set of transports of one runtime: servers that
// answer other runtimes' reads and pushes, and the reader-side transports
// the planner chooses among. Close it once the runtime is done with it.
type Stack struct {
	cfg    Config
	node   Node
	log    *slog.Logger
	listen *fabric.ListenerMetrics // every data listener's (tcp, shm, rdma rails)
	health *linkHealth             // link telemetry → rail health (health.go); nil when off

	tcpSrv *tcp.Server
	tcpTr  *tcp.Transport
	local  []fabric.Transport // "local" and in-process "p2p"

	shmSrv *shm.Server
	shmCli *shm.Client

	rdmaSrv  *rdma.Server
	rdmaTr   *rdma.Transport
	rdmaProv rdma.Provider

	closeOnce sync.Once
	closeErr  error
}

// Start starts the transports cfg allows for node. The tcp path and link
// telemetry (when asked for) must start, or Start fails and leaves nothing
// running; the shared-memory and rdma paths are optional: one that cannot
// start is logged at Warn and left out, and other runtimes' reads fall
// back (visibly) to a worse path.
func Start(ctx context.Context, cfg Config, node Node) (*Stack, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n, err := node.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Stack{cfg: c, node: n, log: n.Logger, listen: fabric.NewListenerMetrics(n.Registerer)}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	s.tcpSrv, err = tcp.Listen(tcp.ServerConfig{Addr: c.DataAddr, Security: n.Security, Source: n.Source, Sink: n.Sink, Limits: c.Limits, ListenerMetrics: s.listen,
		Registerer: n.Registerer})
	if err != nil {
		return nil, err
	}
	if s.health, err = s.startLinkHealth(); err != nil {
		return nil, err
	}
	s.tcpTr, err = tcp.New(tcp.Config{Security: n.Security, Streams: c.Streams, Compression: c.Compression, Registerer: n.Registerer, Dial: s.health.tcpDial()})
	if err != nil {
		return nil, err
	}
	lc := local.Config{Process: n.Process, Source: n.Source, Sink: n.Sink, Topology: n.Cluster}
	s.local = []fabric.Transport{local.New(lc), local.NewP2P(lc)}
	if !c.DisableSHM {
		if err := s.startSHM(); err != nil {
			s.log.Warn("shared-memory paths (p2p, shm) not started: same-host readers in other processes fall back", "err", err)
			s.closeSHM(true)
		}
	}
	if err := s.startRDMA(ctx); err != nil {
		s.log.Warn("rdma path not started: readers on other hosts fall back to tcp", "err", err)
		s.closeRDMA(true)
	}
	ok = true
	return s, nil
}

func (s *Stack) startSHM() error {
	c, n := s.cfg, s.node
	var err error
	s.shmSrv, err = shm.Listen(shm.ServerConfig{
		Security: n.Security, Source: n.Source, Sink: n.Sink, Slabs: n.Slabs,
		Dir: c.SHMDir, Limits: c.Limits, ListenerMetrics: s.listen,
	})
	if err != nil {
		return err
	}
	s.shmCli, err = shm.NewClient(shm.Config{
		Security: n.Security, Topology: n.Cluster,
		Registerer: n.Registerer, // tensorlane_shm_*: the mapping cache and slab mappings
	})
	return err
}

// Config returns the settings the stack runs with: the caller's, with the
// environment applied (unless IgnoreEnv) and defaults filled in. Its Allow
// and Deny are what the planner should apply.
func (s *Stack) Config() Config { return s.cfg }

// Transports returns the reader-side transports that started, for
// fabric.NewPlanner (which ranks them; the order here does not matter).
func (s *Stack) Transports() []fabric.Transport {
	out := append([]fabric.Transport(nil), s.local...)
	if s.shmUp() {
		out = append(out, s.shmCli.P2P(), s.shmCli.SHM())
	}
	if s.rdmaUp() {
		out = append(out, s.rdmaTr)
	}
	return append(out, s.tcpTr)
}

func (s *Stack) shmUp() bool  { return s.shmSrv != nil && s.shmCli != nil }
func (s *Stack) rdmaUp() bool { return s.rdmaSrv != nil && s.rdmaTr != nil }

// Addrs are the data addresses refs carry, by transport name; a wildcard
// listener is advertised under a dialable address (see advertise).
func (s *Stack) Addrs() map[string]string {
	m := map[string]string{fabric.TCP: advertise(s.tcpSrv.Addr())}
	if s.shmUp() {
		m[fabric.SHM] = s.shmSrv.Addr()
	}
	if s.rdmaUp() {
		m[fabric.RDMA] = advertiseRails(s.rdmaSrv.Addr())
	}
	return m
}

// TCPAddr is the tcp data listener's address (host:port), as refs carry it.
func (s *Stack) TCPAddr() string { return advertise(s.tcpSrv.Addr()) }

// TCPSendSums reports where the checksums of the raw blocks the tcp owner
// served came from (all zero before its first network read).
func (s *Stack) TCPSendSums() tcp.SumStats { return s.tcpSrv.SendSums() }

// Served lists the transports refs say the owner serves, best first.
func (s *Stack) Served() []string {
	out := []string{fabric.Local, fabric.P2P, fabric.TCP}
	if s.shmUp() {
		out = append(out, fabric.SHM)
	}
	if s.rdmaUp() {
		out = append(out, fabric.RDMA)
	}
	return fabric.Ordered(out)
}

// Revoke drops the rdma registrations of a freed object at once, so a
// reader holding its keys gets an access error, never stale data.
func (s *Stack) Revoke(id fabric.ObjectID) {
	if s.rdmaSrv != nil {
		s.rdmaSrv.Revoke(id)
	}
}

// Links reports the stack's data connections (tcp streams, rdma rails) as
// link telemetry saw them at its last refresh, degraded ones with the
// reason; nil when link telemetry is off.
func (s *Stack) Links() []LinkStats { return s.health.snapshot() }

// LinkMonitor is the monitor measuring the stack's data connections (nil
// when link telemetry is off).
func (s *Stack) LinkMonitor() *Monitor {
	if s.health == nil {
		return nil
	}
	return s.health.mon
}

// Close stops every server and transport: tcp first, then link health
// (it acts on the rdma transport), rdma and shm. The fields stay set, so
// refs being built concurrently still read the addresses. Idempotent:
// later calls return the first call's result.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.tcpSrv != nil {
			errs = append(errs, s.tcpSrv.Close())
		}
		if s.tcpTr != nil {
			errs = append(errs, s.tcpTr.Close())
		}
		errs = append(errs, s.health.close(), s.closeRDMA(false), s.closeSHM(false))
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("stack: close: %w", err)
		}
	})
	return s.closeErr
}

// closeSHM closes the shm paths. forget drops them too (a start-up
// failure: the stack then runs without them).
func (s *Stack) closeSHM(forget bool) error {
	var errs []error
	if s.shmSrv != nil {
		errs = append(errs, s.shmSrv.Close())
	}
	if s.shmCli != nil {
		errs = append(errs, s.shmCli.Close())
	}
	if forget {
		s.shmSrv, s.shmCli = nil, nil
	}
	return errors.Join(errs...)
}

// closeRDMA closes the rdma path; forget as for closeSHM.
func (s *Stack) closeRDMA(forget bool) error {
	var errs []error
	if s.rdmaTr != nil {
		errs = append(errs, s.rdmaTr.Close())
	}
	if s.rdmaSrv != nil {
		errs = append(errs, s.rdmaSrv.Close())
	}
	if forget {
		s.rdmaTr, s.rdmaSrv, s.rdmaProv = nil, nil, nil
	}
	return errors.Join(errs...)
}
