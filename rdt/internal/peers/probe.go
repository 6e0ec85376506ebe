package peers

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// An owner that never answered this runtime and then missed its heartbeats
// is one of two things: a live process that will not talk to us (a wrong
// cluster key, a firewall, an allowlist), or a process that is not running
// (frozen by SIGSTOP, hung in a debugger, swapped out for good) while its
// kernel still accepts connections on its behalf. The first is rdt's
// ErrPeerUnreachable; the second is, for every reader, a dead owner
// (ErrOwnerDied), as it would be had the reader met it before it froze.
//
// A live libp2p listener speaks first: on accepting a connection it writes
// the multistream header (and, on a private network, its nonce before
// that) without waiting for the dialer. So a TCP connection the owner's
// kernel accepts but on which not one byte arrives within ProbeWait says
// that no process serves the listener.

// ProbeWait is how long the probe waits for the owner's first byte: far
// above what a live process on a loaded machine takes to write it, far
// below the heartbeat bound the reader already waited.
const ProbeWait = time.Second

// ProbeOutcome is what the probe of a peer's control addresses saw.
type ProbeOutcome int

// The outcomes, ordered: one process that spoke outweighs silent
// addresses, one silent address outweighs refused ones.
const (
	NoConnect ProbeOutcome = iota // no address accepted a connection
	Silent                        // a connection was accepted, nothing came
	Spoke                         // a process answered (bytes, or a close/reset)
)

func (o ProbeOutcome) String() string {
	switch o {
	case Spoke:
		return "spoke"
	case Silent:
		return "silent"
	}
	return "no connection"
}

// NeverAnswered reports whether incarnation inc of id has neither answered
// this runtime nor been replaced by one that does: the only case in which
// its death verdict needs the probe to say frozen or unreachable.
func (t *Table) NeverAnswered(id peer.ID, inc uint64) bool {
	_, restarted := t.Replaced(id, inc)
	return !restarted && !t.SeenAlive(id, inc)
}

// Probe dials every TCP address among addrs (multiaddrs) at once and
// reports what it saw: Spoke when any process answered, else Silent when
// any connection was accepted and stayed silent for wait, else NoConnect.
// Non-TCP addresses are skipped.
func Probe(ctx context.Context, addrs []string, wait time.Duration) ProbeOutcome {
	ctx, cancel := context.WithTimeout(ctx, 2*wait)
	defer cancel()
	var (
		mu  sync.Mutex
		out = NoConnect
		wg  sync.WaitGroup
	)
	for _, s := range addrs {
		m, err := ma.NewMultiaddr(s)
		if err != nil {
			continue
		}
		if _, err := m.ValueForProtocol(ma.P_TCP); err != nil {
			continue
		}
		if t, _ := peer.SplitAddr(m); t != nil { // a trailing /p2p/<id> is no part of the socket address
			m = t
		}
		na, err := manet.ToNetAddr(m)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := probeOne(ctx, na.Network(), na.String(), wait)
			mu.Lock()
			out = max(out, o)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func probeOne(ctx context.Context, network, addr string, wait time.Duration) ProbeOutcome {
	d := net.Dialer{Timeout: wait}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return NoConnect
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	_, err = c.Read(b[:])
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return Silent
	}
	return Spoke // a byte, EOF or a reset: a process handled the connection
}
