//go:build ofi

package ofi

/*
#include "cfi.h"
*/
import "C"

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provbase"
)

// domainInfo is one domain fi_getinfo offered.
type domainInfo struct {
	prov, fabric, domain string
	epType               int
	ip                   net.IP // the domain's IPv4 source address, when it has one
	speed                uint64 // link speed in bits/s, 0 when not given
}

// getinfo lists RDMA-capable endpoints (RDM, or MSG when msg), for one
// provider and domain when given, with the source pinned to node.
func getinfo(prov, domain, node string, msg bool) (*C.struct_fi_info, error) {
	var cp, cd, cn *C.char
	if prov != "" {
		cp = C.CString(prov)
		defer C.free(unsafe.Pointer(cp))
	}
	if domain != "" {
		cd = C.CString(domain)
		defer C.free(unsafe.Pointer(cd))
	}
	if node != "" {
		cn = C.CString(node)
		defer C.free(unsafe.Pointer(cn))
	}
	m := C.int(0)
	if msg {
		m = 1
	}
	var info *C.struct_fi_info
	if rc := C.tl_getinfo(cp, cd, cn, m, &info); rc != 0 {
		return nil, fiErr("fi_getinfo", C.int(rc))
	}
	return info, nil
}

// discover lists the domains of every provider that does RMA, in
// fi_getinfo's order (its preference).
func discover() ([]domainInfo, error) {
	var out []domainInfo
	var firstErr error
	for _, msg := range []bool{false, true} {
		info, err := getinfo("", "", "", msg)
		if err != nil {
			firstErr = cmpErr(firstErr, err)
			continue
		}
		for i := info; i != nil; i = C.tl_next(i) {
			d := domainInfo{prov: C.GoString(C.tl_prov(i)), fabric: C.GoString(C.tl_fabric_name(i)),
				domain: C.GoString(C.tl_domain_name(i)), epType: int(C.tl_ep_type(i)), speed: uint64(C.tl_link_speed(i))}
			if C.tl_addr_format(i) == C.FI_SOCKADDR_IN && C.tl_src_addrlen(i) >= 8 {
				sa := C.GoBytes(C.tl_src_addr(i), 8)
				d.ip = net.IPv4(sa[4], sa[5], sa[6], sa[7])
			}
			out = append(out, d)
		}
		C.fi_freeinfo(info)
	}
	if len(out) == 0 && firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// provMatches says whether a libfabric provider name ("tcp;ofi_rxm")
// answers to the name a user gave ("tcp", "tcp;ofi_rxm").
func provMatches(full, want string) bool {
	if want == "" || full == want {
		return true
	}
	first, _, _ := strings.Cut(full, ";")
	return first == want
}

// hostOnly are providers that never leave the host (or do no RMA): not a
// default choice for a path between hosts.
var hostOnly = map[string]bool{"shm": true, "sm2": true, "udp": true, "sockets": true}

// preferred orders the domains for the default choice: fi_getinfo's
// order (hardware first), except that the socket providers come last and
// net (libfabric's newer tcp, with native reliable datagrams) before
// tcp;ofi_rxm, which crashed in libfabric 1.17 when a peer went away with
// RMA requests in flight (docs/rdma-ofi.md).
func preferred(ds []domainInfo) []domainInfo {
	rank := func(d domainInfo) int {
		switch strings.SplitN(d.prov, ";", 2)[0] {
		case "net":
			if d.prov == "net" {
				return 1
			}
			return 2
		case "tcp", "sockets":
			return 3
		}
		return 0
	}
	out := append([]domainInfo(nil), ds...)
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) < rank(out[j]) })
	return out
}

// Provider drives libfabric domains as RDMA NICs.
type Provider struct {
	cfg      Config
	prov     string // the libfabric provider chosen, e.g. "tcp;ofi_rxm"
	nics     []NIC
	msg      bool // the provider offers MSG endpoints only
	log      *slog.Logger
	hmemOnce sync.Once
	hmem     rdma.HMEMCaps
}

var _ rdma.Provider = (*Provider)(nil)

// New discovers the domains of the chosen libfabric provider (see
// Config). It fails with ErrUnavailable when none does RMA.
func New(cfg Config) (*Provider, error) {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	doms, err := discover()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if cfg.Provider == "" {
		doms = preferred(doms)
	}
	var pick []domainInfo
	for _, d := range doms {
		if cfg.Provider == "" && hostOnly[strings.SplitN(d.prov, ";", 2)[0]] {
			continue
		}
		if provMatches(d.prov, cfg.Provider) && (len(pick) == 0 || d.prov == pick[0].prov) {
			pick = append(pick, d)
		}
	}
	if len(pick) == 0 {
		want := cfg.Provider
		if want == "" {
			want = "any"
		}
		return nil, fmt.Errorf("%w: fi_getinfo lists no RMA endpoint of provider %s (check fi_info and FI_PROVIDER)", ErrUnavailable, want)
	}
	p := &Provider{cfg: cfg, prov: pick[0].prov, msg: true, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, d := range pick {
		if d.epType == C.FI_EP_RDM {
			p.msg = false
		}
	}
	if len(cfg.NICs) > 0 {
		seen := map[string]bool{}
		for i, n := range cfg.NICs {
			if n.Domain == "" {
				n.Domain = n.Name
			}
			if n.Name == "" {
				n.Name = topoName(n.Domain)
			}
			if seen[n.Name] {
				return nil, fmt.Errorf("ofi: NIC %d: duplicate name %q", i, n.Name)
			}
			seen[n.Name] = true
			if n.Addr != "" {
				if _, _, err := net.SplitHostPort(n.Addr); err != nil {
					return nil, fmt.Errorf("ofi: NIC %s: address %q: %v", n.Name, n.Addr, err)
				}
			}
			if !hasDomain(pick, n.Domain) {
				return nil, fmt.Errorf("%w: provider %s has no domain %q (fi_info -p %s lists them)", rdma.ErrNoDevice, p.prov, n.Domain, p.prov)
			}
			if n.Addr == "" {
				n.Addr = defaultAddr(pick, n.Domain)
			}
			n.Fabric, n.SpeedGbps = describe(pick, n.Domain)
			p.nics = append(p.nics, n)
		}
		return p, nil
	}
	seen := map[string]bool{}
	for _, d := range pick {
		// tcp lists a domain once per address family; IPv4 is the one a
		// bootstrap address is taken from.
		if seen[d.domain] || (p.isTCP() && d.ip == nil) {
			continue
		}
		seen[d.domain] = true
		n := NIC{Name: topoName(d.domain), Domain: d.domain, Addr: defaultAddr(pick, d.domain)}
		n.Fabric, n.SpeedGbps = describe(pick, d.domain)
		p.nics = append(p.nics, n)
	}
	return p, nil
}

// isTCP says whether the provider runs over IP sockets (tcp, and net, its
// successor with native reliable datagrams), whose domains are network
// interfaces with IP source addresses.
func (p *Provider) isTCP() bool {
	return provMatches(p.prov, "tcp") || provMatches(p.prov, "net") || provMatches(p.prov, "sockets")
}

func hasDomain(ds []domainInfo, name string) bool {
	for _, d := range ds {
		if d.domain == name {
			return true
		}
	}
	return false
}

// describe is a domain's fabric name and link speed (Gbit/s, 0 when not
// given), from its IPv4 entry when it has one.
func describe(ds []domainInfo, name string) (string, float64) {
	fabric, speed := "", 0.0
	for _, d := range ds {
		if d.domain != name {
			continue
		}
		if fabric == "" || d.ip != nil {
			fabric = d.fabric
		}
		if d.speed > 0 {
			speed = float64(d.speed) / 1e9
		}
	}
	return fabric, speed
}

// defaultAddr is the bootstrap address of a domain: its IPv4 address,
// port 0; "" when it has none (efa).
func defaultAddr(ds []domainInfo, name string) string {
	for _, d := range ds {
		if d.domain == name && d.ip != nil {
			return net.JoinHostPort(d.ip.String(), "0")
		}
	}
	return ""
}

// Name returns "ofi".
func (p *Provider) Name() string { return "ofi" }

// Fabric names the libfabric provider in use ("tcp;ofi_rxm", "verbs;ofi_rxm", "efa").
func (p *Provider) Fabric() string { return p.prov }

// Devices lists the NICs (domains) the provider drives.
func (p *Provider) Devices() []rdma.Device {
	out := make([]rdma.Device, len(p.nics))
	for i, n := range p.nics {
		out[i] = rdma.Device{Name: n.Name, Addr: n.Addr}
	}
	return out
}

// HMEM reports whether the provider's NICs register device memory
// (rdma.HMEMReporter): fi_getinfo asked once for the same endpoints with
// FI_HMEM in caps and FI_MR_HMEM in mr_mode. Only registering what the
// answer allows is safe: a provider that did not say FI_MR_HMEM may take a
// device pointer for host memory.
func (p *Provider) HMEM() rdma.HMEMCaps {
	p.hmemOnce.Do(func() {
		cp := C.CString(p.prov)
		defer C.free(unsafe.Pointer(cp))
		var dmabuf C.int
		rc := C.tl_hmem_probe(cp, &dmabuf)
		p.hmem = hmemCaps(p.prov, int(rc), dmabuf != 0)
	})
	return p.hmem
}

// hmemCaps turns tl_hmem_probe's answer into the capability rdma decides
// by. libfabric does not say which device interfaces it initialised (a
// provider reports FI_HMEM once any did), so an HMEM provider is taken to
// drive both CUDA and ROCr; a registration of one it lacks fails at
// fi_mr_regattr.
func hmemCaps(prov string, rc int, dmabuf bool) rdma.HMEMCaps {
	c := rdma.HMEMCaps{Provider: "ofi " + prov}
	if rc != 0 {
		c.Note = fiErr("fi_getinfo with FI_HMEM and FI_MR_HMEM", C.int(rc)).Error()
		return c
	}
	c.HMEM, c.Ifaces, c.DMABuf = true, []string{"cuda", "rocr"}, dmabuf
	return c
}

// NICs lists the NICs with their domains.
func (p *Provider) NICs() []NIC { return append([]NIC(nil), p.nics...) }

// Probe says whether the provider can run here: libfabric's version, the
// providers and domains that do RMA, or why none can be used.
func Probe(cfg Config) Availability {
	a := Availability{BuiltIn: true}
	v := uint32(C.fi_version())
	a.Version = fmt.Sprintf("%d.%d", v>>16, v&0xffff)
	doms, err := discover()
	if err != nil {
		a.Reason = err.Error()
		return a
	}
	seen := map[string]bool{}
	for _, d := range doms {
		if !seen[d.prov] {
			seen[d.prov] = true
			a.Providers = append(a.Providers, d.prov)
		}
		if k := d.prov + "/" + d.domain; !seen[k] {
			seen[k] = true
			a.Domains = append(a.Domains, k)
		}
	}
	if _, err := New(cfg); err != nil {
		a.Reason = err.Error()
	}
	return a
}

// Open opens a NIC; with cfg.Listen it serves remote reads and writes of
// its registrations and accepts bootstrap connections at its Addr.
func (p *Provider) Open(ctx context.Context, name string, cfg rdma.OpenConfig) (rdma.Context, error) {
	var nic *NIC
	for i := range p.nics {
		if p.nics[i].Name == name {
			nic = &p.nics[i]
		}
	}
	if nic == nil {
		return nil, fmt.Errorf("%w: %q", rdma.ErrNoDevice, name)
	}
	if cfg.Logger == nil {
		cfg.Logger = p.log
	}
	if err := provbase.CheckOpen("ofi", &cfg); err != nil {
		return nil, err
	}
	if nic.Addr == "" {
		return nil, fmt.Errorf("ofi: NIC %s (domain %s) has no IP address for its bootstrap listener: set NIC.Addr", nic.Name, nic.Domain)
	}
	return openDevice(ctx, p, *nic, cfg)
}

// fiError is a libfabric error code with the call that returned it.
type fiError struct {
	Op   string
	Code int // positive FI_E* / errno
}

func (e *fiError) Error() string {
	return fmt.Sprintf("ofi: %s: %s (%d)", e.Op, C.GoString(C.fi_strerror(C.int(e.Code))), e.Code)
}

func fiErr(op string, rc C.int) error {
	if rc < 0 {
		rc = -rc
	}
	return &fiError{Op: op, Code: int(rc)}
}
