package rdt

import (
	"fmt"
	"math"
	"strings"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Plan says which path a Get of a ref onto a device would take, and why:
// the path between the two ends, the best transport the topology allows,
// the one chosen, and every transport considered with why it was taken or
// refused. It is plain data (it holds no transport): keep it, compare it,
// print it (String) or encode it; its JSON is what the C ABI's tl_explain
// and Python's Runtime.explain return.
type Plan struct {
	Src string `json:"src"` // the owner's end: host/device
	Dst string `json:"dst"` // the reader's end
	// Path is the topology's path class between the ends, named as
	// nvidia-smi topo -m names it: "NV18", "PIX", "SYS", "NET".
	Path   string `json:"path"`
	Best   string `json:"best"`   // the best transport the topology allows between the ends
	Chosen string `json:"chosen"` // the transport a Get would use; "" when none can
	// Via names which implementation of Chosen, when two share its name
	// ("cross-process" p2p).
	Via string `json:"via,omitempty"`
	// Stripes is how many rails (rdma) or connections (tcp) Chosen cuts a
	// large transfer across; 0 when it does not stripe.
	Stripes int `json:"stripes,omitempty"`
	// ZeroCopy: the reader gets the owner's own memory (a view) and
	// allocates nothing.
	ZeroCopy bool `json:"zero_copy,omitempty"`
	// Degraded: Chosen is worse than Best, a fallback; Fallback says aloud
	// why Best is not used (its candidate's reason).
	Degraded bool   `json:"degraded"`
	Fallback string `json:"fallback,omitempty"`
	// Problem says why no transfer can happen at all, whatever the paths
	// (a device the actor may not use, a malformed ref); Err is the same
	// as an error, for errors.Is (ErrUnknownDevice, ErrMalformedRef).
	Problem string `json:"problem,omitempty"`
	Err     error  `json:"-"`
	// Candidates are the transports considered, best first: the usable
	// ones and why, then those refused and why (not in the allow list,
	// denied, cannot reach, the owner publishes no address for it, not
	// running in this runtime).
	Candidates []Candidate `json:"candidates"`
}

// Candidate is one transport a Plan considered.
type Candidate struct {
	Transport string `json:"transport"`
	Via       string `json:"via,omitempty"`
	Usable    bool   `json:"usable"`
	// GBps is the planner's throughput estimate in gigabytes per second;
	// 0 when there is none or it is unbounded (a view moves nothing).
	GBps    float64 `json:"gbps"`
	Reason  string  `json:"reason"`            // why it can serve, or why it was refused
	Stripes int     `json:"stripes,omitempty"` // as Plan.Stripes, for this transport
}

// Label names a candidate distinctly: "p2p (cross-process)".
func (c Candidate) Label() string {
	if c.Via == "" {
		return c.Transport
	}
	return c.Transport + " (" + c.Via + ")"
}

// Explain says which path a Get of ref onto dst would take, and why the
// other transports would not be used. A destination Get would refuse (a
// device the actor may not use, a malformed ref) makes a plan with nothing
// chosen and Err saying why.
func (a *Actor) Explain(ref Ref, dst tensor.DeviceID) Plan {
	return planFrom(a.explain(ref, dst))
}

// planFrom copies the planner's plan into rdt's, leaving the transports
// behind.
func planFrom(p fabric.Plan) Plan {
	out := Plan{Src: p.Src.String(), Dst: p.Dst.String(), Path: p.Path.String(), Best: p.Best, Chosen: p.Chosen,
		ZeroCopy: p.ZeroCopy, Degraded: p.Degraded, Problem: p.Problem, Err: p.Err,
		Candidates: make([]Candidate, 0, len(p.Candidates))}
	chosen := false
	for _, c := range p.Candidates {
		g := c.GBps
		if math.IsInf(g, 0) || math.IsNaN(g) {
			g = 0
		}
		out.Candidates = append(out.Candidates, Candidate{Transport: c.Transport, Via: c.Via, Usable: c.Usable,
			GBps: g, Reason: c.Reason, Stripes: c.Stripes})
		// Chosen is the first usable candidate of its name.
		if !chosen && c.Usable && c.Transport == p.Chosen {
			chosen, out.Via, out.Stripes = true, c.Via, c.Stripes
		}
		if p.Degraded && c.Transport == p.Best && !c.Usable && out.Fallback == "" {
			out.Fallback = c.Reason
		}
	}
	return out
}

// chosen is the index of the candidate Chosen names, or -1.
func (p Plan) chosen() int {
	for i, c := range p.Candidates {
		if c.Usable && c.Transport == p.Chosen {
			return i
		}
	}
	return -1
}

// String renders the plan for people: the ends, the path, the best and
// chosen transports and the fallback on one line, then one candidate a
// line, the chosen one starred.
func (p Plan) String() string {
	var b strings.Builder
	star := p.chosen()
	chosen := "none"
	if star >= 0 {
		chosen = p.Candidates[star].Label()
	}
	fmt.Fprintf(&b, "%s -> %s: path %s, best %s, chosen %s", p.Src, p.Dst, p.Path, p.Best, chosen)
	if p.Stripes > 1 {
		fmt.Fprintf(&b, " (striped over up to %d)", p.Stripes)
	}
	if p.ZeroCopy {
		b.WriteString(" (zero-copy view)")
	}
	if p.Problem != "" {
		fmt.Fprintf(&b, " (%s)", p.Problem)
	}
	if p.Degraded {
		fmt.Fprintf(&b, " (DEGRADED: %s is not available", p.Best)
		if p.Fallback != "" {
			b.WriteString(": " + p.Fallback)
		}
		b.WriteString(")")
	}
	width := 5
	for _, c := range p.Candidates {
		width = max(width, len(c.Label()))
	}
	for i, c := range p.Candidates {
		mark := "  "
		if i == star {
			mark = "* "
		}
		fmt.Fprintf(&b, "\n  %s%-*s %s", mark, width, c.Label(), c.Reason)
	}
	return b.String()
}
