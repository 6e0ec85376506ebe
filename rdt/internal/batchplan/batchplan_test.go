package batchplan

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/fabric"
)

func TestGrouper(t *testing.T) {
	tcp, shm := fabric.Plan{Chosen: fabric.TCP}, fabric.Plan{Chosen: fabric.SHM}
	var g Grouper
	g.Add("a", tcp, true, "", 10, "reads", "of one owner")
	g.Add("a", tcp, true, "", 5, "reads", "of one owner")
	g.Add("b", tcp, true, "", 7, "reads", "of one owner")
	g.Add("a", shm, false, "", 1, "reads", "of one owner")
	g.Add("me", shm, false, "own objects", 2, "reads", "of one owner")
	g.Add("a", fabric.Plan{Err: errors.New("no path")}, false, "", 1, "reads", "of one owner")
	g.Add("a", fabric.Plan{}, false, "", 1, "reads", "of one owner")
	assert.Equal(t, []Group{
		{Owner: "a", Transport: fabric.TCP, Refs: 2, Bytes: 15, Coalesced: true, Reason: "tcp moves many objects of one owner together"},
		{Owner: "b", Transport: fabric.TCP, Refs: 1, Bytes: 7, Reason: "a single object: nothing to coalesce"},
		{Owner: "a", Transport: fabric.SHM, Refs: 1, Bytes: 1, Reason: "shm reads one object at a time"},
		{Owner: "me", Transport: fabric.SHM, Refs: 1, Bytes: 2, Reason: "own objects"},
	}, g.Done())
	assert.Equal(t, 2, g.Refused)
}
