package rdt

import (
	"context"
	"errors"
	"fmt"
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
// kernel still accepts connections on its behalf. The first is
// ErrPeerUnreachable; the second is, for every reader, a dead owner
// (ErrOwnerDied), as it would be had the reader met it before it froze.
//
// A live libp2p listener speaks first: on accepting a connection it writes
// the multistream header (and, on a private network, its nonce before
// that) without waiting for the dialer. So a TCP connection the owner's
// kernel accepts but on which not one byte arrives within probeWait says
// that no process serves the listener.

// deathVerdict is the error of a Get or lease request that waited on the
// owner of ref (what says which) when the heartbeats declared it dead: the
// owner died (or restarted: a stale ref), or, when it never answered this
// runtime, died if the probe finds it frozen and is unreachable if not
// (a live process that will not talk to us, or nothing listening).
func (r *Runtime) deathVerdict(ctx context.Context, ref Ref, what string) error {
	if _, restarted := r.peers.Replaced(ref.Owner, ref.Incarnation); !restarted && !r.peers.SeenAlive(ref.Owner, ref.Incarnation) {
		o := probeOwner(ctx, ref.Addrs, probeWait)
		r.log.Info("owner never answered this runtime: probed its control listener", "owner", shortID(ref.Owner), "outcome", o.String(), "while", what)
		if o == probeSilent {
			return r.deadErr(ref, fmt.Errorf("never answered this runtime while %s; its control listener accepts connections that no process serves (frozen or hung)", what))
		}
		return fmt.Errorf("%w: the owner of %v never answered this runtime (its heartbeats missed from the start)", ErrPeerUnreachable, ref)
	}
	return r.deadErr(ref, fmt.Errorf("declared dead while %s", what))
}

// frozenOwner reports whether err, the failure of this runtime's first
// contact with ref's owner (a lease request whose dial gave up:
// ErrPeerUnreachable), came from a frozen owner: one that never answered
// here, whose listener the probe finds silent. The dial's own deadline
// (libp2p's, 5 s on private networks) can come before the heartbeats'
// verdict, so both paths ask.
func (r *Runtime) frozenOwner(ctx context.Context, ref Ref, err error) bool {
	if err == nil || !errors.Is(err, ErrPeerUnreachable) || errors.Is(err, ErrOwnerDied) {
		return false
	}
	if _, restarted := r.peers.Replaced(ref.Owner, ref.Incarnation); restarted || r.peers.SeenAlive(ref.Owner, ref.Incarnation) {
		return false
	}
	o := probeOwner(ctx, ref.Addrs, probeWait)
	r.log.Info("first contact with an owner failed: probed its control listener", "owner", shortID(ref.Owner), "outcome", o.String(), "err", err)
	return o == probeSilent
}

// frozenErr is the error of a read from a frozen owner (frozenOwner).
func (r *Runtime) frozenErr(ref Ref, err error) error {
	return r.deadErr(ref, fmt.Errorf("never answered this runtime (%v); its control listener accepts connections that no process serves (frozen or hung)", err))
}

// probeWait is how long the probe waits for the owner's first byte: far
// above what a live process on a loaded machine takes to write it, far
// below the heartbeat bound the reader already waited.
const probeWait = time.Second

// probeOutcome is what the probe of an owner's control addresses saw.
type probeOutcome int

const (
	probeNoConnect probeOutcome = iota // no address accepted a connection
	probeSilent                        // a connection was accepted, nothing came
	probeSpoke                         // a process answered (bytes, or a close/reset)
)

func (o probeOutcome) String() string {
	switch o {
	case probeSpoke:
		return "spoke"
	case probeSilent:
		return "silent"
	}
	return "no connection"
}

// probeOwner dials every TCP address among addrs (multiaddrs) at once and
// reports what it saw: probeSpoke when any process answered, else
// probeSilent when any connection was accepted and stayed silent for wait,
// else probeNoConnect. Non-TCP addresses are skipped.
func probeOwner(ctx context.Context, addrs []string, wait time.Duration) probeOutcome {
	ctx, cancel := context.WithTimeout(ctx, 2*wait)
	defer cancel()
	var (
		mu  sync.Mutex
		out = probeNoConnect
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
			out = max(out, o) // one process that spoke outweighs silent addresses
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func probeOne(ctx context.Context, network, addr string, wait time.Duration) probeOutcome {
	d := net.Dialer{Timeout: wait}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return probeNoConnect
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	_, err = c.Read(b[:])
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return probeSilent
	}
	return probeSpoke // a byte, EOF or a reset: a process handled the connection
}
