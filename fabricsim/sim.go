package fabricsim

import (
	"container/heap"
	"math"
	"slices"
)

// engine is the event loop: links with a capacity, transfers that each run as
// one or more flows over paths of links, sharing every link max-min
// fairly, and timers for latencies and per-message costs. Time is in
// seconds from the start of the run. An engine is not safe for concurrent
// use; one runs one workload.
type engine struct {
	now     float64
	links   []link
	active  []*transfer
	timers  timerHeap
	seq     int
	dirty   bool
	events  int
	on      [][]*flow // per link, the flows on it
	touched []int     // links whose flows changed since the last share
	gen     int       // marks of share's walk
	lh      shareHeap
	// maxEvents bounds a run, so that a plan that never ends (a bug)
	// fails with ErrRunaway instead of spinning.
	maxEvents int
	// burst is a shaped link's token bucket in bytes (0: none).
	burst float64
}

type link struct {
	name  string
	cap   float64 // bytes/s
	bytes float64 // carried so far
	busy  float64 // seconds with some flow on it
	// shaped links are token buckets (tc's tbf): idle, they gather
	// tokens at their rate, up to the engine's burst, and a transfer
	// that starts on them spends those at once. lastActive is when the
	// link last carried a flow.
	shaped     bool
	lastActive float64
	// scratch for the water-filling
	left  float64
	count int
	mark  int
	ver   int
}

// transfer is bytes moving over one or more flows (a striped rdma read has
// one flow per rail); the flows share the remainder, so the rails finish
// together as the real scheduler's rate-proportional slices do.
type transfer struct {
	Bytes     float64
	Start     float64 // when its flows began
	End       float64 // when the last byte landed
	remaining float64
	flows     []*flow
	done      func(*transfer)
	rate      float64
}

type flow struct {
	path []int
	rate float64
	t    *transfer
	mark int
}

func newSim() *engine {
	return &engine{maxEvents: 50_000_000}
}

// Now is the simulated time in seconds.
func (s *engine) Now() float64 { return s.now }

// addLink adds a link of capacity bytes/s and returns its index.
func (s *engine) addLink(name string, bytesPerSec float64) int {
	s.links = append(s.links, link{name: name, cap: bytesPerSec})
	s.on = append(s.on, nil)
	return len(s.links) - 1
}

// after runs f at now+d.
func (s *engine) after(d float64, f func()) {
	s.seq++
	heap.Push(&s.timers, timer{at: s.now + max(d, 0), seq: s.seq, f: f})
}

// start begins moving n bytes over the given paths (one flow each) now;
// done runs when the last byte has landed. Zero bytes, or no path, end at
// once (the latter is a plan error the caller checks before).
func (s *engine) start(n float64, paths [][]int, done func(*transfer)) *transfer {
	t := &transfer{Bytes: n, Start: s.now, remaining: n, done: done}
	if n <= 0 || len(paths) == 0 {
		t.End = s.now
		s.after(0, func() { done(t) })
		return t
	}
	if s.burst > 0 {
		t.remaining -= min(s.credit(paths), n*(1-1e-9))
	}
	for _, p := range paths {
		f := &flow{path: p, t: t}
		t.flows = append(t.flows, f)
		for _, l := range p {
			s.on[l] = append(s.on[l], f)
			s.touched = append(s.touched, l)
		}
		if len(p) == 0 {
			f.rate = math.Inf(1) // nothing limits it: it ends at once
			t.rate = math.Inf(1)
		}
	}
	s.active = append(s.active, t)
	s.dirty = true
	return t
}

// cancel stops t where it is: its flows leave their links and done never
// runs. A transfer that already ended is left alone.
func (s *engine) cancel(t *transfer) {
	i := slices.Index(s.active, t)
	if i < 0 {
		return
	}
	s.active = slices.Delete(s.active, i, i+1)
	s.drop(t)
	s.dirty = true
}

// setCap changes link l's capacity now (0: it carries nothing, a cut).
func (s *engine) setCap(l int, bytesPerSec float64) {
	s.links[l].cap = bytesPerSec
	s.touched = append(s.touched, l)
	s.dirty = true
}

// credit is what the paths' shaped links let through at once: per path,
// the tokens its idle shaped links gathered (the fewest of them), and
// nothing where one is busy. The links' buckets are spent.
func (s *engine) credit(paths [][]int) float64 {
	sum := 0.0
	for _, p := range paths {
		c, shaped := s.burst, false
		for _, l := range p {
			lk := &s.links[l]
			if !lk.shaped {
				continue
			}
			shaped = true
			if len(s.on[l]) > 0 {
				c = 0
			} else {
				c = min(c, (s.now-lk.lastActive)*lk.cap)
			}
		}
		if shaped {
			sum += c
			for _, l := range p {
				if s.links[l].shaped {
					s.links[l].lastActive = s.now
				}
			}
		}
	}
	return sum
}

// run advances until nothing is left to do.
func (s *engine) run() error {
	for {
		if s.events++; s.events > s.maxEvents {
			return ErrRunaway
		}
		if s.dirty {
			s.share()
			s.dirty = false
		}
		// The next thing to happen: a timer, or a transfer's end.
		next := math.Inf(1)
		if len(s.timers) > 0 {
			next = s.timers[0].at
		}
		for _, t := range s.active {
			if t.rate > 0 {
				next = min(next, s.now+t.remaining/t.rate)
			}
		}
		if math.IsInf(next, 1) {
			if len(s.active) > 0 {
				return ErrStuck
			}
			return nil
		}
		s.advance(next)
		// Transfers that ended (within a rounding error of their size).
		var ended []*transfer
		kept := s.active[:0]
		for _, t := range s.active {
			if t.remaining <= 1e-7*t.Bytes+1e-3 || math.IsInf(t.rate, 1) {
				t.End = s.now
				ended = append(ended, t)
				s.dirty = true
				s.drop(t)
				continue
			}
			kept = append(kept, t)
		}
		for i := len(kept); i < len(s.active); i++ {
			s.active[i] = nil
		}
		s.active = kept
		for _, t := range ended {
			t.done(t)
		}
		for len(s.timers) > 0 && s.timers[0].at <= s.now {
			tm := heap.Pop(&s.timers).(timer)
			tm.f()
		}
	}
}

// advance moves time to at, moving every flow's bytes.
func (s *engine) advance(at float64) {
	dt := at - s.now
	if dt > 0 {
		for _, t := range s.active {
			t.remaining -= t.rate * dt
			for _, f := range t.flows {
				for _, l := range f.path {
					s.links[l].bytes += f.rate * dt
				}
			}
		}
		for i := range s.links {
			if s.links[i].count > 0 {
				s.links[i].busy += dt
				s.links[i].lastActive = at
			}
		}
	}
	s.now = at
}

// drop takes t's flows off their links.
func (s *engine) drop(t *transfer) {
	for _, f := range t.flows {
		for _, l := range f.path {
			on := s.on[l]
			for i, g := range on {
				if g == f {
					on[i] = on[len(on)-1]
					on[len(on)-1] = nil
					s.on[l] = on[:len(on)-1]
					break
				}
			}
			s.touched = append(s.touched, l)
		}
	}
}

// share sets the rates of the flows whose links changed: max-min fair
// over the links (progressive filling: the link with the smallest fair
// share fixes its flows' rates, its capacity is spent, repeat). Max-min
// fairness splits over the connected parts of the flow-link graph, so
// only the parts a started or ended flow touched are filled again; a
// broadcast's edges are mostly apart from each other, and this keeps a
// run of a million chunks to seconds.
func (s *engine) share() {
	s.gen++
	gen := s.gen
	var comp []*flow
	var used []int
	queue := s.touched
	for _, l := range queue {
		s.links[l].mark = gen
		used = append(used, l)
	}
	for len(queue) > 0 {
		l := queue[0]
		queue = queue[1:]
		for _, f := range s.on[l] {
			if f.mark == gen {
				continue
			}
			f.mark = gen
			comp = append(comp, f)
			for _, m := range f.path {
				if s.links[m].mark != gen {
					s.links[m].mark = gen
					used = append(used, m)
					queue = append(queue, m)
				}
			}
		}
	}
	s.touched = s.touched[:0]
	for _, l := range used {
		s.links[l].left, s.links[l].count = s.links[l].cap, len(s.on[l])
	}
	for _, f := range comp {
		f.rate = -1
	}
	// A min-heap of links by fair share, updated lazily: a link's entry
	// is stale when its version moved on.
	s.lh = s.lh[:0]
	for _, l := range used {
		lk := &s.links[l]
		lk.ver++
		if lk.count > 0 {
			s.lh = append(s.lh, linkShare{share: lk.left / float64(lk.count), link: l, ver: lk.ver})
		}
	}
	heap.Init(&s.lh)
	for s.lh.Len() > 0 {
		e := heap.Pop(&s.lh).(linkShare)
		lk := &s.links[e.link]
		if e.ver != lk.ver || lk.count == 0 {
			continue
		}
		share := max(e.share, 0)
		for _, f := range s.on[e.link] {
			if f.rate >= 0 {
				continue
			}
			f.rate = share
			for _, l := range f.path {
				o := &s.links[l]
				o.left -= share
				o.count--
				if l != e.link && o.count > 0 {
					o.ver++
					heap.Push(&s.lh, linkShare{share: o.left / float64(o.count), link: l, ver: o.ver})
				}
			}
		}
	}
	for _, l := range used {
		s.links[l].count = len(s.on[l])
	}
	for _, f := range comp {
		f.t.rate = -1 // recomputed below, once per transfer
	}
	for _, f := range comp {
		t := f.t
		if t.rate >= 0 {
			continue
		}
		t.rate = 0
		for _, g := range t.flows {
			t.rate += g.rate
		}
	}
}

type timer struct {
	at  float64
	seq int
	f   func()
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type linkShare struct {
	share float64
	link  int
	ver   int
}

type shareHeap []linkShare

func (h shareHeap) Len() int { return len(h) }
func (h shareHeap) Less(i, j int) bool {
	if h[i].share != h[j].share {
		return h[i].share < h[j].share
	}
	return h[i].link < h[j].link
}
func (h shareHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *shareHeap) Push(x any)   { *h = append(*h, x.(linkShare)) }
func (h *shareHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
