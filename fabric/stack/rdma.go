package stack

import (
	"context"
	"fmt"
	"net"

	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// startRDMA serves the host's RDMA NICs through Config.RDMAProvider, or
// the provider Config.RDMAProviderKind names: by default on simulated
// hosts the software provider, one TCP listener per NIC
// (Config.RDMAAddrs, default DataAddr's host), so every NIC is a real,
// separately measured rail.
func (s *Stack) startRDMA(ctx context.Context) error {
	c, n := s.cfg, s.node
	if c.DisableRDMA {
		return nil
	}
	if n.EncryptData {
		s.log.Info("rdma not started: data connections must be encrypted (EncryptData) and rdma does not encrypt; tcp serves other hosts")
		return nil
	}
	prov, err := s.provider()
	if err != nil || prov == nil {
		return err
	}
	s.rdmaProv = prov
	metrics := rdma.NewMetrics(n.Registerer)
	s.rdmaSrv, err = rdma.Listen(ctx, rdma.ServerConfig{
		Provider: prov, Security: n.Security, Source: n.Source, Sink: n.Sink,
		Limits: c.Limits, ListenerMetrics: s.listen, Metrics: metrics,
	})
	if err != nil {
		return err
	}
	s.rdmaTr, err = rdma.New(ctx, rdma.Config{
		Provider: prov, Security: n.Security, Topology: n.Cluster, Host: n.Host,
		Metrics: metrics, Clock: c.Clock,
	})
	if err == nil {
		s.health.setRDMA(s.rdmaTr)
	}
	return err
}

// provider returns the rdma provider to serve with; nil (and no error)
// when this host has nothing to serve.
func (s *Stack) provider() (rdma.Provider, error) {
	c := s.cfg
	switch c.RDMAProviderKind {
	case "", "soft", "softrdma":
	case "ofi":
		if c.RDMAProvider != nil {
			return c.RDMAProvider, nil
		}
		ocfg := ofi.Config{}
		if !c.IgnoreEnv {
			ocfg = ofi.FromEnv()
		}
		p, err := ofi.New(ocfg)
		if err != nil {
			return nil, fmt.Errorf("stack: rdma provider ofi: %w", err)
		}
		s.log.Info("rdma served by libfabric", "provider", p.Fabric(), "nics", len(p.Devices()))
		return p, nil
	default:
		return nil, fmt.Errorf("stack: unknown rdma provider %q (soft or ofi)", c.RDMAProviderKind)
	}
	if c.RDMAProvider != nil {
		return c.RDMAProvider, nil
	}
	return s.softProvider()
}

// softProvider is the software provider over the topology host's RDMA
// NICs (simulated NICs over TCP).
func (s *Stack) softProvider() (rdma.Provider, error) {
	c := s.cfg
	host, ok := s.node.Cluster.Host(s.node.Host)
	if !ok {
		return nil, nil
	}
	dataHost, _, err := net.SplitHostPort(c.DataAddr)
	if err != nil || dataHost == "" {
		dataHost = "127.0.0.1"
	}
	var nics []softrdma.NIC
	for _, nic := range host.NICs {
		if !nic.RDMA() {
			continue
		}
		addr := c.RDMAAddrs[nic.Name]
		if addr == "" {
			addr = c.RDMAAddrs[nic.RDMADevice]
		}
		if addr == "" {
			if !host.Simulated {
				continue // a real host needs a real provider (or explicit addresses)
			}
			// Simulated NICs listen where the tcp data server does, so a
			// runtime in a network namespace is reachable on both.
			addr = net.JoinHostPort(dataHost, "0")
		}
		nics = append(nics, softrdma.NIC{Name: nic.Name, Addr: addr, Dial: s.health.nicDial(nic.Name, nil), Listen: s.health.nicListen(nic.Name, nil)})
	}
	if len(nics) == 0 {
		return nil, nil
	}
	p, err := softrdma.New(softrdma.Config{NICs: nics})
	if err != nil {
		return nil, err
	}
	s.log.Info("rdma served by the software provider (simulated NICs over TCP)", "nics", len(nics))
	return p, nil
}
