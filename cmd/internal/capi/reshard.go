package capi

import (
	"github.com/tensorlane/tensorlane/rdt/reshard"
)

// ReshardRequest asks for a resharding plan (rdt/reshard): a tensor of
// Shape with ElemSize-byte elements, from one layout to another. A layout
// is either Split, [dimension, count] (FSDP rows: [0, n]; tensor-parallel
// columns: [rank-1, n]), or Shards, each holder's block as [start, end)
// per dimension.
type ReshardRequest struct {
	Shape    []int64    `json:"shape"`
	ElemSize int64      `json:"elem_size"`
	From     LayoutSpec `json:"from"`
	To       LayoutSpec `json:"to"`
}

// LayoutSpec is one layout of a ReshardRequest.
type LayoutSpec struct {
	Split  []int      `json:"split,omitempty"`
	Shards []ShardBox `json:"shards,omitempty"`
}

// ShardBox is one holder's block.
type ShardBox struct {
	Start []int64 `json:"start"`
	End   []int64 `json:"end"`
}

func (s LayoutSpec) layout(shape []int64, elem int64) (reshard.Layout, error) {
	switch {
	case len(s.Split) == 2 && s.Shards == nil:
		return reshard.Split(shape, elem, s.Split[0], s.Split[1])
	case s.Split == nil && len(s.Shards) > 0:
		l := reshard.Layout{Shape: shape, ElemSize: elem}
		for _, b := range s.Shards {
			l.Shards = append(l.Shards, reshard.Box{Start: b.Start, End: b.End})
		}
		return l, l.Validate()
	}
	return reshard.Layout{}, invalid("a layout is a split [dimension, count] or a list of shards")
}

// PlanJSON is a resharding plan: per move, the source and destination
// shards, the block, the byte count and the strided runs (offsets in each
// shard's row-major memory); Explain draws it.
type PlanJSON struct {
	SrcBytes []int64    `json:"src_bytes"` // each source shard's size
	DstBytes []int64    `json:"dst_bytes"` // each destination shard's size
	Moves    []MoveJSON `json:"moves"`
	Bytes    int64      `json:"bytes"`
	Explain  string     `json:"explain"`
}

// MoveJSON is one move.
type MoveJSON struct {
	Src   int           `json:"src"`
	Dst   int           `json:"dst"`
	Box   ShardBox      `json:"box"`
	Bytes int64         `json:"bytes"`
	Runs  []reshard.Run `json:"runs"`
}

// ReshardPlan computes a plan (pure: no runtime needed).
func ReshardPlan(reqJSON []byte) (PlanJSON, error) {
	var req ReshardRequest
	if err := strictJSON(reqJSON, &req); err != nil {
		return PlanJSON{}, err
	}
	from, err := req.From.layout(req.Shape, req.ElemSize)
	if err != nil {
		return PlanJSON{}, invalid("from: %v", err)
	}
	to, err := req.To.layout(req.Shape, req.ElemSize)
	if err != nil {
		return PlanJSON{}, invalid("to: %v", err)
	}
	p, err := reshard.NewPlan(from, to)
	if err != nil {
		return PlanJSON{}, invalid("%v", err)
	}
	out := PlanJSON{Bytes: p.Bytes(), Explain: p.Explain(), Moves: []MoveJSON{}}
	for i := range from.Shards {
		out.SrcBytes = append(out.SrcBytes, from.Bytes(i))
	}
	for j := range to.Shards {
		out.DstBytes = append(out.DstBytes, to.Bytes(j))
	}
	for _, m := range p.Moves {
		out.Moves = append(out.Moves, MoveJSON{Src: m.Src, Dst: m.Dst, Box: ShardBox{Start: m.Box.Start, End: m.Box.End}, Bytes: m.Bytes, Runs: m.Runs})
	}
	return out, nil
}
