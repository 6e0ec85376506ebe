package fabric

import "slices"

// The transport registry: every transport this build knows, written once.
// The planner ranks by it, refs encode the transports an owner serves with
// its wire bits, TENSORLANE_TRANSPORTS is checked against it, and the
// stack lists what it serves in its order. Adding a transport is one row
// here (with a new, never reused wire bit) plus its implementation.

// Reach says how far apart two endpoints a transport can connect.
type Reach uint8

const (
	SameProcess Reach = iota // one runtime's memory
	SameHost                 // processes of one host
	AnyHost                  // across the network
)

func (r Reach) String() string {
	switch r {
	case SameProcess:
		return "same process"
	case SameHost:
		return "same host"
	default:
		return "any host"
	}
}

// TransportInfo describes one transport: its name, its rank (lower is
// better; the planner breaks cost ties with it), the bit that stands for it
// in a ref (stable forever: refs cross versions), how far it reaches, and
// a line for people.
type TransportInfo struct {
	Name    string
	Rank    int
	WireBit uint8
	Reach   Reach
	Doc     string
}

// registry is in rank order. Wire bits 0-4 are the version-1 ref's mask,
// which followed this order; a new transport takes bit 5, 6 or 7.
var registry = [...]TransportInfo{
	{Local, 0, 0, SameProcess, "same process: zero-copy on one device, a direct copy otherwise"},
	{P2P, 1, 1, SameHost, "device to device over a device link (NVLink, xGMI, PCIe P2P)"},
	{SHM, 2, 2, SameHost, "same host through shared host memory"},
	{RDMA, 3, 3, AnyHost, "one-sided reads and writes of registered memory through NICs"},
	{TCP, 4, 4, AnyHost, "anything reachable: multi-stream, checksummed, optionally compressed"},
}

// Registered returns every known transport, best first (a copy).
func Registered() []TransportInfo { return slices.Clone(registry[:]) }

// Names returns the transport names, best first.
func Names() []string {
	out := make([]string, len(registry))
	for i, t := range registry {
		out[i] = t.Name
	}
	return out
}

// Lookup returns the registry's entry for name.
func Lookup(name string) (TransportInfo, bool) {
	for _, t := range registry {
		if t.Name == name {
			return t, true
		}
	}
	return TransportInfo{}, false
}

// Known reports whether name is a registered transport.
func Known(name string) bool { _, ok := Lookup(name); return ok }

// WireMask encodes a set of transport names as a ref carries it; unknown
// names are left out.
func WireMask(names []string) byte {
	var m byte
	for _, n := range names {
		if t, ok := Lookup(n); ok {
			m |= 1 << t.WireBit
		}
	}
	return m
}

// FromWireMask decodes a ref's transport mask, best first. Bits this build
// does not know (a newer owner's transports) are ignored: a reader uses
// what it has.
func FromWireMask(m byte) []string {
	var out []string
	for _, t := range registry {
		if m&(1<<t.WireBit) != 0 {
			out = append(out, t.Name)
		}
	}
	return out
}

// Ordered returns names sorted best first, unknown names last.
func Ordered(names []string) []string {
	out := slices.Clone(names)
	rank := func(n string) int {
		if t, ok := Lookup(n); ok {
			return t.Rank
		}
		return len(registry)
	}
	slices.SortStableFunc(out, func(a, b string) int { return rank(a) - rank(b) })
	return out
}
