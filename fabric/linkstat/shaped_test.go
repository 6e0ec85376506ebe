package linkstat

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShapedLink measures a link between two network namespaces, first as
// is and then shaped with a tc token bucket (40 Mbit/s, a 96 KiB queue), in
// both modes. The shaped link must be reported degraded (the queue inflates
// RTT far past its minimum; its tail drops cause retransmissions) and the
// plain one must not.
func TestShapedLink(t *testing.T) {
	for _, mode := range []Mode{ModeEBPF, ModeTCPInfo} {
		t.Run(string(mode), func(t *testing.T) {
			var mu sync.Mutex
			var events []LinkStats
			m, _ := newMonitor(t, mode, Config{OnHealth: func(s LinkStats) {
				mu.Lock()
				events = append(events, s)
				mu.Unlock()
			}})
			p := newNSPair(t) // sockets below are created after the monitor, in its cgroup

			c, s := p.connect(t)
			plain, err := m.Track(c, Labels{Link: "veth plain", Transport: "tcp", Peer: p.ipB})
			require.NoError(t, err)
			send(t, c, s, 8<<20)
			m.Refresh()
			ps := plain.Stats()
			t.Logf("%s plain veth: rtt %v, min rtt %v, retransmits %d, sent %d B, cwnd %d", mode, ps.RTT, ps.MinRTT, ps.Retransmits, ps.BytesSent, ps.Cwnd)
			assert.False(t, ps.Degraded, ps.Reason)
			assert.Equal(t, mode, ps.Source)
			plain.Untrack()

			p.shape(t, "40mbit", "32kb", "96kb")
			c2, s2 := p.connect(t)
			shaped, err := m.Track(c2, Labels{Link: "veth shaped", Transport: "tcp", Peer: p.ipB})
			require.NoError(t, err)
			// Refresh while the transfer runs, as the monitor's ticker would.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var maxRTT time.Duration
			sawDegraded := false
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := time.NewTicker(50 * time.Millisecond)
				defer tk.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tk.C:
						m.Refresh()
						st := shaped.Stats()
						maxRTT = max(maxRTT, st.RTT)
						sawDegraded = sawDegraded || st.Degraded
					}
				}
			}()
			start := time.Now()
			send(t, c2, s2, 4<<20)
			elapsed := time.Since(start)
			close(stop)
			wg.Wait()
			m.Refresh()
			ss := shaped.Stats()
			t.Logf("%s shaped veth (tbf 40mbit, 96kb queue): 4 MiB in %v (%.1f Mbit/s); rtt max %v, last %v, min rtt %v; retransmits %d of %d segments; sent %d B; degraded seen %v",
				mode, elapsed.Round(time.Millisecond), 4*8*1.048576/elapsed.Seconds(), maxRTT, ss.RTT, ss.MinRTT, ss.Retransmits, ss.SegmentsOut, ss.BytesSent, sawDegraded)
			assert.Equal(t, mode, ss.Source)
			if mode == ModeEBPF {
				// Cross-check against the kernel's TCP_INFO for the same socket.
				raw, err := rawOf(c2)
				require.NoError(t, err)
				ti, err := tcpInfo(raw)
				require.NoError(t, err)
				t.Logf("ebpf vs TCP_INFO on the shaped socket: retransmits %d vs %d, bytes acked %d vs %d, segments out %d vs %d",
					ss.Retransmits, ti.totalRetrans, ss.BytesSent, ti.bytesAcked, ss.SegmentsOut, ti.segsOut)
				// The map holds the figures of the socket's last event; an
				// ACK that gives no RTT sample (it acknowledges data the
				// peer had already SACKed, common after loss recovery) is
				// only counted at the next event, so at rest the two may
				// differ by the tail of the transfer.
				assert.LessOrEqual(t, ss.Retransmits, uint64(ti.totalRetrans))
				assert.LessOrEqual(t, uint64(ti.totalRetrans)-ss.Retransmits, max(16, uint64(ti.totalRetrans)/20))
				assert.LessOrEqual(t, ss.BytesSent, ti.bytesAcked)
				assert.Less(t, ti.bytesAcked-ss.BytesSent, uint64(256<<10))
			}
			assert.True(t, sawDegraded, "the shaped link is reported degraded")
			assert.Greater(t, maxRTT, 20*ps.MinRTT+5*time.Millisecond, "queueing inflates RTT")
			if mode == ModeTCPInfo {
				assert.GreaterOrEqual(t, ss.BytesSent, uint64(4<<20))
			} else {
				assert.GreaterOrEqual(t, ss.BytesSent, uint64(4<<20-256<<10), "within the tail the last event missed")
			}
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, events, "OnHealth told the caller")
			assert.True(t, events[0].Degraded)
			assert.Equal(t, "veth shaped", events[0].Link)
			t.Logf("%s first health event: %s", mode, events[0].Reason)
		})
	}
}
