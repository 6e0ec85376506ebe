package dashboard

import (
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/rdt"
)

// Throughput over time, per path. The runtimes keep their last
// rdt.RecentTransfers transfers; each request folds the ones not seen yet
// into one-second buckets by the time they ended, so a page polling every
// second or so misses nothing (unless a runtime ends more than that many
// transfers between polls), and no goroutine runs behind the handler.

// throughputWindow is how much history /api/throughput returns.
const throughputWindow = 60 * time.Second

// Throughput is /api/throughput: bytes per second for each path over the
// last Seconds seconds, oldest first, the last bucket ending at End.
type Throughput struct {
	End     time.Time            `json:"end"`
	Seconds int                  `json:"seconds"`
	GBps    map[string][]float64 `json:"gbps"`
}

type throughputState struct {
	mu      sync.Mutex
	seen    map[*rdt.Runtime]uint64    // highest transfer Seq folded in, per runtime
	buckets map[int64]map[string]int64 // unix second -> path -> bytes
}

func (h *Handler) throughput(w http.ResponseWriter, _ *http.Request) {
	h.writeJSON(w, h.sampleThroughput(time.Now()))
}

func (h *Handler) sampleThroughput(now time.Time) Throughput {
	s := &h.tput
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen, s.buckets = map[*rdt.Runtime]uint64{}, map[int64]map[string]int64{}
	}
	oldest := now.Add(-throughputWindow).Unix()
	for _, rt := range h.cfg.Runtimes {
		last := s.seen[rt]
		for _, t := range rt.RecentTransfers() {
			if t.Seq <= last || t.Error != "" || t.Path == "" {
				continue
			}
			s.seen[rt] = max(s.seen[rt], t.Seq)
			end := t.Start.Add(t.Duration).Unix()
			if end < oldest {
				continue
			}
			if s.buckets[end] == nil {
				s.buckets[end] = map[string]int64{}
			}
			s.buckets[end][t.Path] += t.Bytes
		}
	}
	for sec := range s.buckets {
		if sec < oldest {
			delete(s.buckets, sec)
		}
	}
	n := int(throughputWindow / time.Second)
	out := Throughput{End: now.Truncate(time.Second), Seconds: n, GBps: map[string][]float64{}}
	paths := map[string]bool{}
	for _, b := range s.buckets {
		for p := range b {
			paths[p] = true
		}
	}
	names := make([]string, 0, len(paths))
	for p := range paths {
		names = append(names, p)
	}
	sort.Strings(names)
	first := now.Unix() - int64(n) + 1
	for _, p := range names {
		series := make([]float64, n)
		for i := range series {
			series[i] = float64(s.buckets[first+int64(i)][p]) / 1e9
		}
		out.GBps[p] = series
	}
	return out
}
