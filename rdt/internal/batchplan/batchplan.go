// Package batchplan groups a batch's planned items the way rdt's
// ExplainBatch and ExplainPushBatch report them: by peer and chosen path,
// each group saying whether its path moves the items together. It is a
// pure function of the plans it is given; rdt's BatchPlan and BatchGroup
// are its Groups and Group, converted.
package batchplan

import "github.com/tensorlane/tensorlane/fabric"

// Group is the items of one peer that take one path (rdt.BatchGroup).
type Group struct {
	Owner     string
	Transport string
	Refs      int
	Bytes     int64
	Coalesced bool
	Reason    string
}

// Grouper builds the groups one planned item at a time; its zero value is
// empty.
type Grouper struct {
	Groups []Group
	// Refused counts items no transfer can happen for.
	Refused int
	at      map[[2]string]int
}

// Add puts an item of plan (bytes long) into the group of (peer, chosen
// transport); coalesces says whether that transport moves many items of
// one peer together, own (when not "") why it is not a transfer between
// runtimes, verb what the transport does one at a time ("reads",
// "pushes"), whose whose objects it moves together ("of one owner").
func (g *Grouper) Add(peer string, plan fabric.Plan, coalesces bool, own string, bytes int64, verb, whose string) {
	if plan.Err != nil || plan.Chosen == "" {
		g.Refused++
		return
	}
	if g.at == nil {
		g.at = map[[2]string]int{}
	}
	k := [2]string{peer, plan.Chosen}
	i, ok := g.at[k]
	if !ok {
		i = len(g.Groups)
		g.at[k] = i
		b := Group{Owner: peer, Transport: plan.Chosen}
		switch {
		case own != "":
			b.Reason = own
		case coalesces:
			b.Coalesced = true
			b.Reason = plan.Chosen + " moves many objects " + whose + " together"
		default:
			b.Reason = plan.Chosen + " " + verb + " one object at a time"
		}
		g.Groups = append(g.Groups, b)
	}
	g.Groups[i].Refs++
	g.Groups[i].Bytes += bytes
}

// Done ends the grouping: a group of one item coalesces nothing.
func (g *Grouper) Done() []Group {
	for i, b := range g.Groups {
		if b.Coalesced && b.Refs < 2 {
			g.Groups[i].Coalesced = false
			g.Groups[i].Reason = "a single object: nothing to coalesce"
		}
	}
	return g.Groups
}
