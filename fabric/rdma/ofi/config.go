package ofi

import (
	"errors"
	"os"
	"strings"
	"time"

	"github.com/tensorlane/tensorlane/fabric/rdma/internal/faults"
)

// Errors of the provider.
var (
	// ErrNotBuiltIn: this binary was built without the "ofi" build tag.
	ErrNotBuiltIn = errors.New("ofi: the libfabric provider is not built in (build with -tags ofi; needs libfabric-dev)")
	// ErrUnavailable: libfabric offers no usable provider or domain.
	ErrUnavailable = errors.New("ofi: no usable libfabric provider")
)

// EnvProvider names the libfabric provider to use ("tcp", "verbs", "efa"),
// read by FromEnv. libfabric's own FI_PROVIDER filter applies as well.
const EnvProvider = "TENSORLANE_OFI_PROVIDER"

// NIC is one domain (NIC) to drive.
type NIC struct {
	// Name is the NIC's name as the topology knows it; default: the
	// domain's name with efa's "-rdm"/"-dgrm" suffix dropped.
	Name string
	// Domain is the libfabric domain ("lo", "eth0", "mlx5_0",
	// "rdmap0s31-rdm"); default Name.
	Domain string
	// Addr is the TCP bootstrap address the device listens on
	// ("10.1.0.2:4791", port 0 picks one). Default: the domain's own IP
	// address (tcp, verbs over IPoIB/RoCE) with port 0; a domain without
	// one (efa) needs it set.
	Addr string
	// Fabric and SpeedGbps are what fi_getinfo says of the domain (its
	// fabric name, e.g. an IP subnet or an InfiniBand subnet, and its link
	// speed, 0 when the provider does not give it); filled in by New.
	Fabric    string
	SpeedGbps float64
}

// Config configures the provider. The zero value discovers every domain
// of the best provider libfabric offers.
type Config struct {
	// Provider is the libfabric provider name ("tcp" selects
	// "tcp;ofi_rxm" for reliable datagrams); default: the first one
	// fi_getinfo lists that does RMA.
	Provider string
	// NICs are the domains to drive; default: every domain the provider
	// offers, one NIC each (IPv4 addresses only for tcp).
	NICs []NIC
	// HandshakeTimeout bounds a bootstrap connection's authentication;
	// default 10 s.
	HandshakeTimeout time.Duration
	// NoWait makes completion queues poll with backoff instead of
	// sleeping on the provider's wait object (fi_cq_sread). Default:
	// wait objects where the provider has them.
	NoWait bool
	// PollWaitFD makes every completion queue with a wait fd sleep on it
	// in poll(2), a thread blocked in the kernel, as before the netpoller
	// did it (benchmarks compare the two). Default: the Go netpoller
	// watches a reader's queue's fd while one request and no write is
	// outstanding (waitfd.go).
	PollWaitFD bool
	// MaxSGE caps the local segments of one WRITE (rdma.SGELimit, the
	// device's MaxSGE; fi_writemsg's iov): default the domain's tx
	// iov_limit, at most maxSGECap; 1 makes rdma.Transport pack every
	// gathered push. On the net provider over loopback (iov_limit 4),
	// WRITEs of 4 runs of 128 KiB took 0.96-1.42x a plain push in 11 of
	// 13 rounds (1.53-1.69x in two) where the transport's pack took
	// 1.48-1.70x; 4 KiB runs the transport packs anyway, 16 KiB a WRITE
	// being far too little (BenchmarkWriteRunsOFI, load 2-3).
	MaxSGE int
	// Faults is how this module's tests make the provider damage what it
	// sends: the next control answer loses its last byte, which the
	// reader must catch. The data itself cannot be damaged from here:
	// libfabric moves it, and the wire's own checks (the NIC's CRC, TCP's
	// checksum for the tcp provider) cover it. nil (the only value other
	// code can set) is healthy.
	Faults *faults.Sim
}

// maxSGECap bounds a device's MaxSGE whatever the domain's iov_limit: an
// iovec array of a WRITE lives on the C stack of its post.
const maxSGECap = 64

// FromEnv returns the Config the environment asks for: the libfabric
// provider named by TENSORLANE_OFI_PROVIDER.
func FromEnv() Config {
	return Config{Provider: strings.TrimSpace(os.Getenv(EnvProvider))}
}

// Availability says whether the provider can run here, and why not.
type Availability struct {
	BuiltIn   bool     // built with the ofi tag
	Version   string   // libfabric's version, when built in
	Providers []string // libfabric providers that offer RMA endpoints
	Domains   []string // "provider/domain" pairs, in fi_getinfo's order
	Reason    string   // why it cannot run, "" when it can
}

// topoName maps a libfabric domain name to the NIC name the topology
// uses: efa lists "rdmap0s31-rdm" and "rdmap0s31-dgrm" for the device
// rdmap0s31, verbs lists "mlx5_0" (and "mlx5_0-xrc" for XRC).
func topoName(domain string) string {
	for _, s := range []string{"-rdm", "-dgrm", "-xrc"} {
		if n, ok := strings.CutSuffix(domain, s); ok {
			return n
		}
	}
	return domain
}
