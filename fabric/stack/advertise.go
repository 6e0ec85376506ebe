package stack

import (
	"net"
	"sync"

	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// advertise turns a listener's address into one a reader can dial. A
// listener on a wildcard (0.0.0.0, [::]) accepts on every interface, but
// a ref that carried the wildcard would make a reader on another host
// dial itself (issue 29 item 9): the ref names this host's outbound
// address instead (the interface of the default route), else its first
// global unicast address, else loopback. A listener on one address is
// advertised as it is.
func advertise(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsUnspecified() {
		return addr
	}
	// Go listens dual-stack on both wildcards ("0.0.0.0:0" comes back as
	// [::]:port), so an IPv4 address serves either; it is tried first, as
	// Ray's node addresses are IPv4.
	return net.JoinHostPort(outbound().String(), port)
}

// outbound is looked up once per process: refs are made per Put, and a
// process keeps its network namespace.
var outbound = sync.OnceValue(func() net.IP { return outboundIP(false) })

// outboundIP is the address this host reaches others from: the source
// address of the default route (a UDP "connect" sends nothing), else the
// first global unicast interface address, else loopback. v6 asks for IPv6
// first; either family serves a dual-stack wildcard listener.
func outboundIP(v6 bool) net.IP {
	families := []string{"udp4", "udp6"}
	probes := []string{"192.0.2.1:9", "[2001:db8::1]:9"} // TEST-NET, never routed to
	if v6 {
		families[0], families[1] = families[1], families[0]
		probes[0], probes[1] = probes[1], probes[0]
	}
	for i, fam := range families {
		if c, err := net.Dial(fam, probes[i]); err == nil {
			ip := c.LocalAddr().(*net.UDPAddr).IP
			c.Close()
			if ip.IsGlobalUnicast() {
				return ip
			}
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
				return n.IP
			}
		}
	}
	if v6 {
		return net.IPv6loopback
	}
	return net.IPv4(127, 0, 0, 1)
}

// advertiseRails applies advertise to each rail of an rdma address.
func advertiseRails(addrs string) string {
	rails, err := rdma.ParseAddrs(addrs)
	if err != nil {
		return addrs
	}
	for i := range rails {
		rails[i].Addr = advertise(rails[i].Addr)
	}
	return rdma.FormatAddrs(rails)
}
