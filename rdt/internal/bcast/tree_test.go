package bcast

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// chain plants readers 0..n-1 as one chain under the owner.
func chain(n int) *Tree {
	t := &Tree{}
	for range n {
		t.Nodes = append(t.Nodes, &Reader{Parent: -1, First: -1})
	}
	for i := range n {
		t.Plant(i, i-1)
	}
	return t
}

// An orphan goes to the nearest planned ancestor of its failed feeder that
// has not failed, else to the owner; its own subtree stays behind it.
func TestTreeReparent(t *testing.T) {
	tr := chain(5) // owner → 0 → 1 → 2 → 3 → 4
	assert.Equal(t, []int{1}, tr.Nodes[0].Children)

	tr.Nodes[2].State = Failed
	assert.True(t, tr.Orphaned(3, 2))
	assert.Equal(t, 1, tr.Reparent(3, 2), "2's parent is alive")
	assert.Equal(t, 1, tr.Nodes[3].Parent)
	assert.Equal(t, 2, tr.Nodes[3].First, "the plan is kept")
	assert.Equal(t, []int{2, 3}, tr.Nodes[1].Children)
	assert.False(t, tr.Orphaned(3, 2), "a stale report about the old edge is no news")
	assert.True(t, tr.Orphaned(4, 3), "its subtree follows it unchanged")

	// 1 fails as well: 3 (now under 1) goes up past the failed 2 to 0.
	tr.Nodes[1].State = Failed
	assert.Equal(t, 0, tr.Reparent(3, 1))
	assert.Equal(t, []int{1, 3}, tr.Nodes[0].Children)
	assert.Equal(t, 0, tr.Reparent(3, 1), "re-parenting twice lists it once")
	assert.Equal(t, []int{1, 3}, tr.Nodes[0].Children)

	// Everything above fails: the owner feeds it.
	tr.Nodes[0].State = Failed
	assert.Equal(t, -1, tr.Reparent(3, 0))
	tr.Feed(3)
	assert.True(t, tr.Nodes[3].Direct)
	assert.Equal(t, -1, tr.Nodes[3].Parent)
	assert.False(t, tr.Orphaned(3, 0), "the owner's own feed is not re-parented by readers' reports")
}

// A feeder is always a planned ancestor, so re-parents never make a cycle:
// whichever readers fail, walking up from any reader reaches the owner.
func TestTreeNoCycle(t *testing.T) {
	const n = 6
	for mask := range 1 << n {
		tr := chain(n)
		for i := range n {
			if mask&(1<<i) != 0 {
				tr.Nodes[i].State = Failed
			}
		}
		for i := range n {
			if tr.Nodes[i].State != Failed && tr.Nodes[i].Parent >= 0 && tr.Nodes[tr.Nodes[i].Parent].State == Failed {
				if tr.Reparent(i, tr.Nodes[i].Parent) < 0 {
					tr.Feed(i)
				}
			}
		}
		for i := range n {
			seen := 0
			for p := tr.Nodes[i].Parent; p >= 0; p = tr.Nodes[p].Parent {
				seen++
				if !assert.Less(t, seen, n, "mask %b: a cycle through %d", mask, i) {
					return
				}
			}
		}
	}
}

func TestTreeFinished(t *testing.T) {
	tr := chain(2)
	assert.False(t, tr.Finished())
	tr.Nodes[0].State = Complete
	assert.False(t, tr.Finished())
	tr.Nodes[1].State = Failed
	assert.True(t, tr.Finished())
	assert.True(t, (&Tree{}).Finished(), "no readers")
}
