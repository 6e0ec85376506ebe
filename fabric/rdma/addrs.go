package rdma

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/tensorlane/tensorlane/fabric"
)

// Rail is one NIC of an owner, as Remote.Addrs["rdma"] lists it.
type Rail struct {
	NIC  string // the owner's NIC name (topology NIC Name or RDMADevice)
	Addr string // host:port its queue pairs connect to
}

// MaxRails bounds the rails one address may list.
const MaxRails = 16

// FormatAddrs encodes rails as Remote.Addrs["rdma"] carries them:
// "nic0=10.1.0.2:4791,nic1=10.2.0.2:4791".
func FormatAddrs(rails []Rail) string {
	parts := make([]string, len(rails))
	for i, r := range rails {
		parts[i] = r.NIC + "=" + r.Addr
	}
	return strings.Join(parts, ",")
}

// ParseAddrs decodes an rdma address list. Entries are "name=host:port"
// separated by commas (spaces around them are ignored); a bare "host:port"
// is named "rail<i>" by its position. Names are 1-64 letters, digits, '_',
// '-' or '.', unique; ports are 1-65535; IPv6 hosts are bracketed. Anything
// else is an ErrBadRequest naming the entry.
func ParseAddrs(s string) ([]Rail, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("%w: empty rdma address", fabric.ErrBadRequest)
	}
	entries := strings.Split(s, ",")
	if len(entries) > MaxRails {
		return nil, fmt.Errorf("%w: rdma address lists %d rails (max %d)", fabric.ErrBadRequest, len(entries), MaxRails)
	}
	rails := make([]Rail, 0, len(entries))
	seen := map[string]bool{}
	for i, e := range entries {
		e = strings.TrimSpace(e)
		name, addr, named := strings.Cut(e, "=")
		if !named {
			name, addr = "rail"+strconv.Itoa(i), e
		}
		name, addr = strings.TrimSpace(name), strings.TrimSpace(addr)
		if !validName(name) {
			return nil, fmt.Errorf("%w: rdma rail %d: bad NIC name %q", fabric.ErrBadRequest, i, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("%w: rdma rail %d: NIC %q listed twice", fabric.ErrBadRequest, i, name)
		}
		seen[name] = true
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" || strings.ContainsAny(host, " ,=[]") {
			return nil, fmt.Errorf("%w: rdma rail %q: bad address %q", fabric.ErrBadRequest, name, addr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
			return nil, fmt.Errorf("%w: rdma rail %q: bad port %q", fabric.ErrBadRequest, name, port)
		}
		rails = append(rails, Rail{NIC: name, Addr: net.JoinHostPort(host, port)})
	}
	return rails, nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}
