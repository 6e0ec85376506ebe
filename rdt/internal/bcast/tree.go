package bcast

import "slices"

// Reader states in the owner's tree.
const (
	Pending = iota
	Complete
	Failed
)

// Reader is the owner's view of one reader of a broadcast: its place in
// the tree now and as planned, and how it is doing. The runtime keeps the
// reader's slots and outcome beside it.
type Reader struct {
	State    int   // Pending, Complete or Failed
	Parent   int   // its feeder now: -1 the owner
	First    int   // the parent planned at first
	Children []int // the readers it was told to forward to (planned or adopted)
	Direct   bool  // the owner feeds it now
}

// Tree is the owner's view of a broadcast's readers. It decides where an
// orphan goes; the runtime sends the notices and writes the chunks. It is
// driven from the owner's one event loop, so it takes no lock.
type Tree struct {
	Nodes []*Reader
}

// Plant places reader i under parent (-1: the owner) as the plan says.
func (t *Tree) Plant(i, parent int) {
	n := t.Nodes[i]
	n.Parent, n.First = parent, parent
	if parent >= 0 {
		t.Nodes[parent].Children = append(t.Nodes[parent].Children, i)
	}
}

// Feed records that the owner feeds reader i itself from now on.
func (t *Tree) Feed(i int) {
	n := t.Nodes[i]
	n.Parent, n.Direct = -1, true
}

// Orphaned says whether reader c still waits on from: pending, not fed by
// the owner, and from its feeder. A failure of from is news to c only then
// (a stale report about an edge already routed around is not).
func (t *Tree) Orphaned(c, from int) bool {
	n := t.Nodes[c]
	return n.State == Pending && !n.Direct && n.Parent == from
}

// Reparent finds orphan c, whose feeder from failed it, a new feeder: the
// nearest planned ancestor of from that has not failed, which then lists c
// among its children, and returns it; or -1 when none is left, and the
// owner must feed c (Feed). A reader's feeder is always one of its planned
// ancestors (or the owner), so no re-parent makes a cycle.
func (t *Tree) Reparent(c, from int) int {
	for p := t.Nodes[from].First; p >= 0; p = t.Nodes[p].First {
		pn := t.Nodes[p]
		if pn.State == Failed {
			continue
		}
		t.Nodes[c].Parent = p
		if !slices.Contains(pn.Children, c) {
			pn.Children = append(pn.Children, c)
		}
		return p
	}
	return -1
}

// Finished says whether no reader is pending.
func (t *Tree) Finished() bool {
	for _, n := range t.Nodes {
		if n.State == Pending {
			return false
		}
	}
	return true
}
