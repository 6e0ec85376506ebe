package rdt

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/internal/peers"
	"github.com/tensorlane/tensorlane/tensor"
)

// silentListener is a frozen process's listener: the kernel accepts
// connections into the backlog, no process ever reads or writes them.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", l.Addr().(*net.TCPAddr).Port)
}

// talkingListener is a live process that will not talk our protocol (a
// wrong cluster key, an allowlist): it accepts, says something, hangs up.
func talkingListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("garbage\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", l.Addr().(*net.TCPAddr).Port)
}

// closedPort is an address no process listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)
}

func TestProbeOwner(t *testing.T) {
	key := make([]byte, 32)
	rand.Read(key)
	live := newPair(t, nil).a
	private := newPair(t, func(c *Config) { c.ClusterKey = key }).a
	addrs := func(r *Runtime) []string {
		var out []string
		for _, m := range r.host.Addrs() {
			out = append(out, m.String()+"/p2p/"+r.ID().String())
		}
		return out
	}
	silent, talking, closed := silentListener(t), talkingListener(t), closedPort(t)
	tests := []struct {
		name  string
		addrs []string
		want  peers.ProbeOutcome
	}{
		{"frozen process", []string{silent}, peers.Silent},
		{"live runtime", addrs(live), peers.Spoke},
		{"live runtime on a private network", addrs(private), peers.Spoke},
		{"a process that hangs up", []string{talking}, peers.Spoke},
		{"nobody listens", []string{closed}, peers.NoConnect},
		{"no address", nil, peers.NoConnect},
		{"not tcp", []string{"/ip4/127.0.0.1/udp/9/quic-v1", "not a multiaddr"}, peers.NoConnect},
		{"one address answers", []string{silent, closed, talking}, peers.Spoke},
		{"silent and closed", []string{closed, silent}, peers.Silent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each waits out a probe's deadline; none uses another's sockets exclusively
			require.Equal(t, tt.want, peers.Probe(context.Background(), tt.addrs, peers.ProbeWait))
		})
	}
}

// TestNeverReachedOwner: a reader that never reached the owner, whose
// heartbeats then go unanswered from the start, gets OwnerDied when the
// owner's listener accepts connections and no process serves them (a
// sender frozen before first contact: python/tests/test_ray_multinode.py::
// test_frozen_sender_is_owner_died), and PeerUnreachable when a live
// process refuses it or nothing listens.
func TestNeverReachedOwner(t *testing.T) {
	// Heartbeats an hour apart: the dial's own deadline (libp2p's) ends
	// the lease request before any verdict, the path a loaded machine's
	// late heartbeats take.
	slowBeats := func(c *Config) { fastLife(c); c.HeartbeatInterval = time.Hour }
	tests := []struct {
		name string
		addr func(*testing.T) string
		life func(*Config)
		want error
	}{
		{"frozen", silentListener, fastLife, ErrOwnerDied},
		{"frozen, the dial gives up first", silentListener, slowBeats, ErrOwnerDied},
		{"live but refusing", talkingListener, fastLife, ErrPeerUnreachable},
		{"live but refusing, the dial gives up first", talkingListener, slowBeats, ErrPeerUnreachable},
		{"nobody listens", closedPort, fastLife, ErrPeerUnreachable},
	}
	for _, tt := range tests {
		for _, how := range []string{"get", "batch"} {
			t.Run(tt.name+"/"+how, func(t *testing.T) {
				t.Parallel() // each case waits on deadlines in its own pair of runtimes
				ctx := context.Background()
				p := newPair(t, tt.life)
				owner, _ := p.a.Spawn("owner")
				reader, _ := p.b.Spawn("reader")
				ref, err := owner.Put(ctx, fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 1<<16))
				require.NoError(t, err)
				ref.Addrs = []string{tt.addr(t) + "/p2p/" + p.a.ID().String()}
				ctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang fails the test, nothing is timed
				defer cancel()
				// libp2p's own dial deadline, shortened: that it ends the
				// request is the point, not how long it takes.
				ctx = network.WithDialPeerTimeout(ctx, 2*time.Second)
				if how == "batch" {
					items, err := reader.GetBatch(ctx, []Ref{ref}, tensor.GPUDevice(1), BatchConfig{})
					require.NoError(t, err)
					ReleaseBatch(items)
					require.ErrorIs(t, items[0].Err, tt.want)
					return
				}
				got, err := reader.Get(ctx, ref, tensor.GPUDevice(1))
				if err == nil {
					got.Release()
				}
				require.ErrorIs(t, err, tt.want)
			})
		}
	}
}
