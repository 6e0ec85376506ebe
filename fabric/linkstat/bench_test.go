package linkstat

import (
	"log/slog"
	"net"
	"sort"
	"testing"
	"time"
)

func timed(b *testing.B, c, s net.Conn, n int64) time.Duration {
	t0 := time.Now()
	send(b, c, s, n)
	return time.Since(t0)
}

// BenchmarkSockOpsOverhead measures what the eBPF program costs a bulk
// transfer over loopback: with the program attached, one connection made
// before the attach (no callbacks) and one made after (callbacks on every
// RTT sample, retransmission and segment sent) move the same bytes in
// alternation, so machine load hits both alike. It reports the median ratio
// of their times (ebpf/plain; 1.00 = free) next to the usual figures.
func BenchmarkSockOpsOverhead(b *testing.B) {
	cg := childCgroup(b)
	plainC, plainS := loopbackPair(b) // before the attach: no sock_ops callbacks
	m, err := New(Config{Cgroup: cg, Interval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	if m.Mode() != ModeEBPF {
		b.Skip("eBPF not permitted here")
	}
	bpfC, bpfS := loopbackPair(b)
	l, err := m.Track(bpfC, Labels{Link: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	const n = 16 << 20
	send(b, plainC, plainS, n) // warm both
	send(b, bpfC, bpfS, n)
	var ratios []float64
	var plainT, bpfT time.Duration
	b.SetBytes(2 * n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Alternate which goes first, so order effects cancel.
		var tp, tb time.Duration
		if i%2 == 0 {
			tp, tb = timed(b, plainC, plainS, n), timed(b, bpfC, bpfS, n)
		} else {
			tb, tp = timed(b, bpfC, bpfS, n), timed(b, plainC, plainS, n)
		}
		plainT += tp
		bpfT += tb
		ratios = append(ratios, float64(tb)/float64(tp))
	}
	b.StopTimer()
	sort.Float64s(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ebpf/plain")
	b.ReportMetric(float64(n)*float64(b.N)/plainT.Seconds()/1e9, "plain-GB/s")
	b.ReportMetric(float64(n)*float64(b.N)/bpfT.Seconds()/1e9, "ebpf-GB/s")
	m.Refresh()
	if l.Stats().Source != ModeEBPF {
		b.Fatalf("the measured connection was not sampled by the program: %+v", l.Stats())
	}
}
