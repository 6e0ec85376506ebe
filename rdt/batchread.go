package rdt

import (
	"fmt"
	"strings"

	"github.com/tensorlane/tensorlane/rdt/internal/batchplan"
	"github.com/tensorlane/tensorlane/tensor"
)

// BatchPlan says how GetBatch would move a batch onto a device: the refs
// grouped by owner and chosen path, and whether each group moves
// coalesced (one ReadBatch) or object by object.
type BatchPlan struct {
	Groups []BatchGroup `json:"groups"`
	// Refused counts refs no transfer can happen for (malformed, a device
	// the actor may not use, no path); Explain of each says why.
	Refused int `json:"refused,omitempty"`
}

// BatchGroup is the refs of one owner that take one path.
type BatchGroup struct {
	Owner     string `json:"owner"`
	Transport string `json:"transport"`
	Refs      int    `json:"refs"`
	Bytes     int64  `json:"bytes"`
	Coalesced bool   `json:"coalesced"`
	Reason    string `json:"reason"`
}

// String renders the plan one group a line.
func (p BatchPlan) String() string {
	var b strings.Builder
	for i, g := range p.Groups {
		if i > 0 {
			b.WriteByte('\n')
		}
		how := "one by one"
		if g.Coalesced {
			how = "coalesced"
		}
		fmt.Fprintf(&b, "%s via %s: %d refs, %d bytes, %s (%s)", g.Owner, g.Transport, g.Refs, g.Bytes, how, g.Reason)
	}
	if p.Refused > 0 {
		fmt.Fprintf(&b, "\n%d refs refused (Explain each for why)", p.Refused)
	}
	return b.String()
}

// ExplainBatch says how GetBatch of refs onto dst would move them.
func (a *Actor) ExplainBatch(refs []Ref, dst tensor.DeviceID) BatchPlan {
	return batchPlan(a.rt.reader.ExplainBatch(a.who(), wireRefs(refs), dst))
}

// batchPlan is g's groups as rdt reports them.
func batchPlan(g *batchplan.Grouper) BatchPlan {
	out := BatchPlan{Refused: g.Refused}
	for _, b := range g.Done() {
		out.Groups = append(out.Groups, BatchGroup(b))
	}
	return out
}
