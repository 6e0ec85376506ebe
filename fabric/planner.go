package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// EnvTransports is the environment variable that narrows the transports a
// runtime may use: "tcp,rdma" allows only those, "^shm" denies shm.
const EnvTransports = "TENSORLANE_TRANSPORTS"

// PlannerConfig configures a Planner. The zero value plans with no topology
// (every pair of hosts is NET), allows every transport, and does not log or
// count.
type PlannerConfig struct {
	Topology *topology.Cluster
	Allow    []string // if not empty, only these transports
	Deny     []string
	Logger   *slog.Logger
	Metrics  *Metrics
	// Attempts is how many times one path is tried before the planner falls
	// back to the next; default 2. Only errors that another try might not
	// repeat (a dropped connection, a stall) are retried.
	Attempts int
	// RetryBackoff is the pause before the second try of a path, doubling
	// for each further try; default 20 ms.
	RetryBackoff time.Duration
}

// ParseSelection parses the TENSORLANE_TRANSPORTS syntax: a comma list of
// names to allow, or a list starting with ^ to deny.
func ParseSelection(s string) (allow, deny []string, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil, nil
	}
	negate := strings.HasPrefix(s, "^")
	s = strings.TrimPrefix(s, "^")
	var names []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(strings.ToLower(n))
		if n == "" {
			continue
		}
		if !Known(n) {
			return nil, nil, fmt.Errorf("fabric: unknown transport %q in %q (known: %s)", n, s, strings.Join(Names(), ","))
		}
		names = append(names, n)
	}
	if negate {
		return nil, names, nil
	}
	return names, nil, nil
}

// Planner ranks the transports that can connect two endpoints and runs a
// read on the best one, falling back to the next when a path fails.
type Planner struct {
	cfg        PlannerConfig
	transports []Transport
	log        *slog.Logger
	warned     sync.Map // degraded pairs already warned about
}

// Candidate is one transport considered for a transfer.
type Candidate struct {
	Transport string  `json:"transport"`
	Via       string  `json:"via,omitempty"` // which implementation, when two share a name
	Usable    bool    `json:"usable"`
	GBps      float64 `json:"gbps,omitempty"`
	Reason    string  `json:"reason"`
	Stripes   int     `json:"stripes,omitempty"` // Cost.Stripes: rails or connections one transfer is cut across

	t Transport // nil for the best path when this runtime does not run it
}

// Plan is the planner's decision for one source and destination.
type Plan struct {
	Src        Endpoint      `json:"-"`
	Dst        Endpoint      `json:"-"`
	Path       topology.Path `json:"path"`
	Best       string        `json:"best"`     // the best transport the topology allows
	Chosen     string        `json:"chosen"`   // the first usable candidate; "" when none
	Degraded   bool          `json:"degraded"` // Chosen is worse than Best
	Candidates []Candidate   `json:"candidates"`
	// Err says why no transfer can happen at all, whatever the paths (a
	// destination device the reader does not have); Problem is its text.
	Err     error  `json:"-"`
	Problem string `json:"problem,omitempty"`
	// ZeroCopy: the chosen transport hands the reader the owner's own
	// memory (a view) instead of a copy, and the reader allocates nothing.
	ZeroCopy bool `json:"zero_copy,omitempty"`
}

// Label names a candidate distinctly: "p2p (cross-process)".
func (c Candidate) Label() string {
	if c.Via == "" {
		return c.Transport
	}
	return c.Transport + " (" + c.Via + ")"
}

// Refuse marks the plan as impossible for a reason outside the paths.
func (p *Plan) Refuse(err error) {
	p.Err, p.Problem, p.Chosen, p.Degraded = err, err.Error(), "", false
	for i := range p.Candidates {
		p.Candidates[i].Usable = false
	}
}

// ChosenTransport returns the transport behind Chosen, or nil.
func (p Plan) ChosenTransport() Transport {
	if i := p.chosen(); i >= 0 {
		return p.Candidates[i].t
	}
	return nil
}

// chosen is the index of the candidate Chosen names: the first usable one.
func (p Plan) chosen() int {
	for i, c := range p.Candidates {
		if c.Usable && c.Transport == p.Chosen {
			return i
		}
	}
	return -1
}

// String renders the plan for people, one candidate a line.
func (p Plan) String() string {
	var b strings.Builder
	chosen := "none"
	if i := p.chosen(); i >= 0 {
		chosen = p.Candidates[i].Label()
	}
	fmt.Fprintf(&b, "%v -> %v: path %v, best %s, chosen %s", p.Src, p.Dst, p.Path, p.Best, chosen)
	if p.ZeroCopy {
		b.WriteString(" (zero-copy view)")
	}
	if p.Problem != "" {
		fmt.Fprintf(&b, " (%s)", p.Problem)
	}
	if p.Degraded {
		fmt.Fprintf(&b, " (DEGRADED: %s is not available)", p.Best)
	}
	width := 5
	for _, c := range p.Candidates {
		width = max(width, len(c.Label()))
	}
	star := p.chosen()
	for i, c := range p.Candidates {
		mark := "  "
		if i == star {
			mark = "* "
		}
		fmt.Fprintf(&b, "\n  %s%-*s %s", mark, width, c.Label(), c.Reason)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// NewPlanner builds a planner over the given transports.
func NewPlanner(cfg PlannerConfig, transports ...Transport) (*Planner, error) {
	for _, n := range append(slices.Clone(cfg.Allow), cfg.Deny...) {
		if !Known(n) {
			return nil, fmt.Errorf("fabric: unknown transport %q in allow/deny list (known: %s)", n, strings.Join(Names(), ","))
		}
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 2
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = 20 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Planner{cfg: cfg, transports: transports, log: log}, nil
}

// quality orders transports for one pair of endpoints, best (lowest) first.
// It follows the registry's ranks, except that "local" between two
// different devices is a copy staged through host memory: better than
// leaving the process, worse than a device link.
func quality(name string, src, dst Endpoint) int {
	q := len(registry) * 2
	if t, ok := Lookup(name); ok {
		q = t.Rank * 2
	}
	if name == Local && src.Device != dst.Device {
		p2p, _ := Lookup(P2P)
		q = p2p.Rank*2 + 1
	}
	return q
}

// BestAllowed returns the best transport the topology allows between src and
// dst, whatever is configured or running: the yardstick for "degraded".
func (p *Planner) BestAllowed(src, dst Endpoint) (string, topology.Path) {
	path := p.path(src, dst)
	sameProc := src.Process != "" && src.Process == dst.Process
	switch {
	case sameProc && path.Class == topology.PathSELF:
		return Local, path
	case path.PeerToPeer(): // a device link, or PCIe P2P under a switch
		return P2P, path
	case sameProc && path.Class.SameHost():
		return Local, path
	case path.Class.SameHost():
		return SHM, path
	case p.hasRDMA(src.Host) && p.hasRDMA(dst.Host):
		return RDMA, path
	}
	return TCP, path
}

func (p *Planner) path(src, dst Endpoint) topology.Path {
	if p.cfg.Topology == nil {
		if src.Host == dst.Host && src.Device == dst.Device {
			return topology.Path{Class: topology.PathSELF}
		}
		return topology.Path{Class: topology.PathNET}
	}
	return p.cfg.Topology.PathBetween(src.TopologyEndpoint(), dst.TopologyEndpoint())
}

func (p *Planner) hasRDMA(host string) bool {
	h, ok := p.cfg.Topology.Host(host)
	if !ok {
		return false
	}
	for _, n := range h.NICs {
		if n.RDMA() {
			return true
		}
	}
	return false
}

// Plan ranks every transport for a transfer from src to dst.
func (p *Planner) Plan(src, dst Endpoint) Plan {
	best, path := p.BestAllowed(src, dst)
	plan := Plan{Src: src, Dst: dst, Path: path, Best: best}
	ts := slices.Clone(p.transports)
	slices.SortStableFunc(ts, func(a, b Transport) int { return quality(a.Name(), src, dst) - quality(b.Name(), src, dst) })
	for _, t := range ts {
		c := Candidate{Transport: t.Name(), t: t}
		if v, ok := t.(Variant); ok {
			c.Via = v.Variant()
		}
		switch cost, ok := t.Reach(src, dst); {
		case len(p.cfg.Allow) > 0 && !slices.Contains(p.cfg.Allow, t.Name()):
			c.Reason = "not in the allow list"
		case slices.Contains(p.cfg.Deny, t.Name()):
			c.Reason = "denied by configuration"
		case !ok:
			c.Reason = cost.Reason
			if c.Reason == "" {
				c.Reason = "cannot reach the destination"
			}
		default:
			c.Usable, c.GBps, c.Reason, c.Stripes = true, cost.GBps, cost.Reason, cost.Stripes
			if plan.Chosen == "" {
				plan.Chosen = t.Name()
			}
		}
		plan.Candidates = append(plan.Candidates, c)
	}
	// The best path explains itself even when this runtime does not run it,
	// so a degraded plan says what is missing.
	if !slices.ContainsFunc(plan.Candidates, func(c Candidate) bool { return c.Transport == best }) {
		plan.Candidates = append(plan.Candidates, Candidate{Transport: best, Reason: "allowed by the topology but not running in this runtime"})
	}
	plan.Degraded = plan.Chosen != "" && quality(plan.Chosen, src, dst) > quality(best, src, dst)
	return plan
}

// Transports returns the configured transports with the given name (there
// may be several: an in-process and a cross-process "p2p").
func (p *Planner) Transports(name string) []Transport {
	var out []Transport
	for _, t := range p.transports {
		if t.Name() == name {
			out = append(out, t)
		}
	}
	return out
}

// PlanRead is the plan a read of src into memory at dst runs: Plan, with
// the transports the owner publishes no address for ruled out, and marked
// zero-copy when the reader may use the owner's memory in place (same
// process, same device, a transport that can hand out views). Fetch and
// Read execute exactly this value, so what Explain prints is what runs.
func (p *Planner) PlanRead(src Remote, dst Endpoint) Plan {
	plan := p.Plan(src.Endpoint, dst)
	rule(&plan, func(t Transport) string {
		if a, ok := t.(Addressed); ok && a.AddressOf(src) == "" {
			return "the owner publishes no " + t.Name() + " address (it does not serve " + t.Name() + ")"
		}
		return ""
	})
	if i := plan.chosen(); i >= 0 && plan.Chosen == Local && src.Endpoint.Device == dst.Device {
		_, plan.ZeroCopy = plan.Candidates[i].t.(Viewer)
	}
	return plan
}

// PlanWrite is the plan a push of an object at src into the reader-allocated
// buffer dst names runs: Plan, with the transports that cannot push or that
// the destination publishes no address for ruled out.
func (p *Planner) PlanWrite(src Endpoint, dst Remote) Plan {
	plan := p.Plan(src, dst.Endpoint)
	rule(&plan, func(t Transport) string {
		if _, ok := t.(Writer); !ok {
			return "cannot push (pull only)"
		}
		if a, ok := t.(Addressed); ok && a.AddressOf(dst) == "" {
			return "the destination publishes no " + t.Name() + " address (it does not serve " + t.Name() + ")"
		}
		return ""
	})
	return plan
}

// PlanView is the plan of a zero-copy map of src from dst: only transports
// that can hand the reader the owner's memory are usable. Nothing chosen
// means no path can map it (another host): copy instead.
func (p *Planner) PlanView(src Remote, dst Endpoint) Plan {
	plan := p.Plan(src.Endpoint, dst)
	rule(&plan, func(t Transport) string {
		if _, ok := t.(Viewer); !ok {
			return "copies only (cannot map the owner's memory)"
		}
		return ""
	})
	plan.ZeroCopy = plan.Chosen != ""
	return plan
}

// Read moves src into buf (which lives at dst) on the best usable transport,
// retrying a path that failed for a passing reason and then falling back to
// the next candidate. Every fallback and every degraded transfer is logged
// and counted.
func (p *Planner) Read(ctx context.Context, src Remote, dst Endpoint, buf tensor.Buffer) (Stats, Plan, error) {
	plan := p.PlanRead(src, dst)
	plan.ZeroCopy = false // the caller gave the memory: always a copy
	st, err := p.RunRead(ctx, &plan, src, buf)
	return st, plan, err
}

// RunRead executes a read plan into buf; plan.Chosen ends up naming the
// transport that moved the bytes.
func (p *Planner) RunRead(ctx context.Context, plan *Plan, src Remote, buf tensor.Buffer) (Stats, error) {
	return p.run(ctx, plan, src.Claim.Object, func(t Transport) (Stats, error) { return t.Read(ctx, src, buf) })
}

// Fetch executes a read plan into memory of its own: a zero-copy plan maps
// the owner's memory in place; any other allocates with alloc and reads
// into it, releasing the allocation again if the read fails.
func (p *Planner) Fetch(ctx context.Context, plan *Plan, src Remote, alloc func(ctx context.Context, n int64) (tensor.Buffer, error)) (tensor.Buffer, Stats, error) {
	if plan.ZeroCopy {
		return p.RunView(ctx, plan, src)
	}
	buf, err := alloc(ctx, src.Length)
	if err != nil {
		return nil, Stats{}, err
	}
	st, err := p.RunRead(ctx, plan, src, buf)
	if err != nil {
		buf.Release()
		return nil, st, err
	}
	return buf, st, nil
}

// RunView executes a zero-copy plan: the first usable candidate that maps
// the object wins. The buffer pins the owner's object until released.
func (p *Planner) RunView(ctx context.Context, plan *Plan, src Remote) (tensor.Buffer, Stats, error) {
	if plan.Chosen == "" {
		return nil, Stats{}, fmt.Errorf("%w: no zero-copy path %v -> %v", ErrNoPath, plan.Src, plan.Dst)
	}
	start := time.Now()
	var err error
	for _, c := range plan.Candidates {
		v, ok := c.t.(Viewer)
		if !c.Usable || !ok {
			continue
		}
		var buf tensor.Buffer
		if buf, err = v.View(ctx, src); err == nil {
			plan.Chosen = c.Transport
			return buf, Stats{Transport: c.Transport, Bytes: src.Length, Duration: time.Since(start), Streams: 1, ZeroCopy: true}, nil
		}
		err = &PathError{Transport: c.Transport, Attempt: 1, Err: err}
		if Terminal(err) || ctx.Err() != nil {
			break
		}
	}
	return nil, Stats{}, err
}

// Write pushes buf, an object of this runtime that lives at src, into the
// reader-allocated buffer that dst names, on the best transport that can
// push (implements Writer), with the same retries, fallback and accounting
// as Read.
func (p *Planner) Write(ctx context.Context, src Endpoint, buf tensor.Buffer, dst Remote) (Stats, Plan, error) {
	plan := p.PlanWrite(src, dst)
	st, err := p.RunWrite(ctx, &plan, buf, dst)
	return st, plan, err
}

// RunWrite executes a write plan (PlanWrite's, for dst's endpoint and
// addresses; its offset and length may differ from the planned ones):
// a caller that pushes many pieces to one slot plans once and runs the
// plan for each, as a broadcast edge does for its chunks. plan.Chosen ends
// up naming the transport that moved the bytes.
func (p *Planner) RunWrite(ctx context.Context, plan *Plan, buf tensor.Buffer, dst Remote) (Stats, error) {
	return p.run(ctx, plan, dst.Claim.Object, func(t Transport) (Stats, error) { return t.(Writer).Write(ctx, buf, dst) })
}

// rule marks the usable candidates for which why gives a reason unusable
// (with that reason) and chooses again.
func rule(plan *Plan, why func(Transport) string) {
	plan.Chosen = ""
	for i, c := range plan.Candidates {
		if !c.Usable {
			continue
		}
		if reason := why(c.t); reason != "" {
			plan.Candidates[i].Usable, plan.Candidates[i].Reason = false, reason
		} else if plan.Chosen == "" {
			plan.Chosen = c.Transport
		}
	}
	plan.Degraded = plan.Chosen != "" && quality(plan.Chosen, plan.Src, plan.Dst) > quality(plan.Best, plan.Src, plan.Dst)
}

// run tries the plan's usable candidates in order.
func (p *Planner) run(ctx context.Context, plan *Plan, obj ObjectID, move func(Transport) (Stats, error)) (Stats, error) {
	if plan.Chosen == "" {
		return Stats{}, fmt.Errorf("%w: %v -> %v", ErrNoPath, plan.Src, plan.Dst)
	}
	var errs []error
	var prev string
	for _, c := range plan.Candidates {
		if !c.Usable {
			continue
		}
		if prev != "" {
			p.log.Warn("transfer falling back to a worse path", "from", prev, "to", c.Transport,
				"object", obj, "src", plan.Src, "dst", plan.Dst, "err", errs[len(errs)-1])
			if p.cfg.Metrics != nil {
				p.cfg.Metrics.Fallbacks.WithLabelValues(prev, c.Transport).Inc()
			}
		}
		if quality(c.Transport, plan.Src, plan.Dst) > quality(plan.Best, plan.Src, plan.Dst) {
			p.warnDegraded(plan.Best, c.Transport, plan.Path, plan.Src, plan.Dst)
			if p.cfg.Metrics != nil {
				p.cfg.Metrics.Degraded.WithLabelValues(plan.Best, c.Transport).Inc()
			}
		}
		for attempt := 1; ; attempt++ {
			start := time.Now()
			st, err := move(c.t)
			p.count(c.Transport, st, time.Since(start), err)
			if err == nil {
				plan.Chosen = c.Transport
				return st, nil
			}
			err = &PathError{Transport: c.Transport, Attempt: attempt, Err: err}
			errs = append(errs, err)
			if Terminal(err) || ctx.Err() != nil {
				return st, err
			}
			// A missing path (ErrNoPath) does not come back on a second try.
			if attempt >= p.cfg.Attempts || errors.Is(err, ErrNoPath) {
				break
			}
			p.log.Info("retrying a failed path", "transport", c.Transport, "attempt", attempt+1, "object", obj, "err", err)
			if p.cfg.Metrics != nil {
				p.cfg.Metrics.Retries.WithLabelValues(c.Transport).Inc()
			}
			if err := sleepCtx(ctx, p.cfg.RetryBackoff<<(attempt-1)); err != nil {
				return Stats{}, errors.Join(append(errs, err)...)
			}
		}
		prev = c.Transport
	}
	return Stats{}, errors.Join(errs...)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// warnDegraded logs a degraded pair of hosts once at Warn and then at Debug,
// so the warning is seen without flooding the log; the metric counts every
// transfer.
func (p *Planner) warnDegraded(best, used string, path topology.Path, src, dst Endpoint) {
	key := best + ">" + used + " " + src.Host + ">" + dst.Host
	level := slog.LevelDebug
	if _, seen := p.warned.LoadOrStore(key, true); !seen {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "transfer uses a worse path than the topology allows",
		"best", best, "used", used, "path", path.String(), "src", src, "dst", dst)
}

func (p *Planner) count(transport string, st Stats, d time.Duration, err error) {
	m := p.cfg.Metrics
	if m == nil {
		return
	}
	if err != nil {
		m.Transfers.WithLabelValues(transport, "error").Inc()
		return
	}
	m.Transfers.WithLabelValues(transport, "ok").Inc()
	m.Bytes.WithLabelValues(transport).Add(float64(st.Bytes))
	m.Seconds.WithLabelValues(transport).Observe(d.Seconds())
}
