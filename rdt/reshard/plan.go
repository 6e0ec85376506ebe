// Package reshard moves a tensor from one sharding to another: trainers
// hold shards in one layout (FSDP rows over several trainer actors, say),
// readers need another (tensor-parallel columns), and each reader receives
// exactly the byte ranges it needs from every trainer that holds them. The
// Plan is computed once from the two layouts (a static schedule, reused
// every step): per (source shard, destination shard) pair, the strided runs
// of bytes to move. Explain draws it.
//
// Sender and Receiver run a plan over rdt (many senders at once, not one
// rank 0): each receiver reserves one flow-controlled slot per incoming
// move, and each sender pushes every move of its shard into its slot. A
// sender made over the shard's rdt object (NewSenderOver) pushes each
// move's strided runs straight from the shard (rdt.PushRuns: tcp and rdma
// send them with no packed copy of the move; a path that cannot is counted
// and packs); one given the shard as plain memory each step (NewSender) packs
// each move into a buffer published once, then pushes that. A receiver
// made over its shard's memory (NewReceiverOver) lands each move that is
// one contiguous range of it in place; the others are scattered when all
// have landed. Only the planned bytes cross the wire.
package reshard

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tensorlane/tensorlane/rdt"
)

// ErrLayout is a layout or plan that does not describe the tensor: shards
// out of bounds, overlapping, or leaving a gap, or shapes that differ.
var ErrLayout = errors.New("reshard: bad layout")

// Box is a block of a tensor: [Start[d], End[d]) in each dimension.
type Box struct {
	Start, End []int64
}

func (b Box) extent(d int) int64 { return b.End[d] - b.Start[d] }

// Elems is the number of elements in the box.
func (b Box) Elems() int64 {
	n := int64(1)
	for d := range b.Start {
		n *= b.extent(d)
	}
	return n
}

func (b Box) String() string {
	parts := make([]string, len(b.Start))
	for d := range b.Start {
		parts[d] = fmt.Sprintf("%d:%d", b.Start[d], b.End[d])
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// intersect returns the common block of a and b, and whether it is not
// empty.
func intersect(a, b Box) (Box, bool) {
	out := Box{Start: make([]int64, len(a.Start)), End: make([]int64, len(a.Start))}
	for d := range a.Start {
		out.Start[d], out.End[d] = max(a.Start[d], b.Start[d]), min(a.End[d], b.End[d])
		if out.Start[d] >= out.End[d] {
			return out, false
		}
	}
	return out, true
}

// Layout is how a tensor of Shape (elements of ElemSize bytes) is spread
// over holders: Shards[i] is the block holder i keeps, contiguous and
// row-major in its memory.
type Layout struct {
	Shape    []int64
	ElemSize int64
	Shards   []Box
}

// Split cuts dimension dim into n nearly equal blocks, one per holder (the
// first holders get one more row when it does not divide): Split(shape, e,
// 0, n) is FSDP's rows, Split(shape, e, len(shape)-1, n) tensor-parallel
// columns.
func Split(shape []int64, elemSize int64, dim, n int) (Layout, error) {
	l := Layout{Shape: slices.Clone(shape), ElemSize: elemSize}
	if dim < 0 || dim >= len(shape) || n <= 0 || int64(n) > shape[dim] {
		return l, fmt.Errorf("%w: split dimension %d of %v into %d", ErrLayout, dim, shape, n)
	}
	q, r := shape[dim]/int64(n), shape[dim]%int64(n)
	var at int64
	for i := range n {
		size := q
		if int64(i) < r {
			size++
		}
		b := Box{Start: make([]int64, len(shape)), End: slices.Clone(shape)}
		b.Start[dim], b.End[dim] = at, at+size
		at += size
		l.Shards = append(l.Shards, b)
	}
	return l, l.Validate()
}

// Validate checks that the shards lie inside the tensor, do not overlap and
// cover it.
func (l Layout) Validate() error {
	if len(l.Shape) == 0 || l.ElemSize <= 0 || len(l.Shards) == 0 {
		return fmt.Errorf("%w: shape %v, element size %d, %d shards", ErrLayout, l.Shape, l.ElemSize, len(l.Shards))
	}
	total := int64(1)
	for _, s := range l.Shape {
		if s <= 0 {
			return fmt.Errorf("%w: shape %v", ErrLayout, l.Shape)
		}
		total *= s
	}
	var covered int64
	for i, b := range l.Shards {
		if len(b.Start) != len(l.Shape) || len(b.End) != len(l.Shape) {
			return fmt.Errorf("%w: shard %d %v has another rank than %v", ErrLayout, i, b, l.Shape)
		}
		for d := range l.Shape {
			if b.Start[d] < 0 || b.End[d] > l.Shape[d] || b.Start[d] >= b.End[d] {
				return fmt.Errorf("%w: shard %d %v outside %v or empty", ErrLayout, i, b, l.Shape)
			}
		}
		for j := range i {
			if _, ok := intersect(b, l.Shards[j]); ok {
				return fmt.Errorf("%w: shards %d %v and %d %v overlap", ErrLayout, j, l.Shards[j], i, b)
			}
		}
		covered += b.Elems()
	}
	if covered != total {
		return fmt.Errorf("%w: the shards hold %d of %d elements", ErrLayout, covered, total)
	}
	return nil
}

// Bytes is the size of shard i in memory.
func (l Layout) Bytes(i int) int64 { return l.Shards[i].Elems() * l.ElemSize }

// Run is Count byte ranges of Len bytes: the k-th starts at SrcOff +
// k*SrcStride in the source shard's memory and at DstOff + k*DstStride in
// the destination's.
type Run struct {
	SrcOff    int64 `json:"src_off"`
	SrcStride int64 `json:"src_stride"`
	DstOff    int64 `json:"dst_off"`
	DstStride int64 `json:"dst_stride"`
	Len       int64 `json:"len"`
	Count     int64 `json:"count"`
}

// Move is what source shard Src sends destination shard Dst: the block
// they share, as strided runs, Bytes in all.
type Move struct {
	Src, Dst int
	Box      Box
	Runs     []Run
	Bytes    int64
}

// Ranges is the number of contiguous byte ranges the move touches.
func (m Move) Ranges() int64 {
	var n int64
	for _, r := range m.Runs {
		n += r.Count
	}
	return n
}

// Plan is the static schedule from one layout to another.
type Plan struct {
	From, To Layout
	Moves    []Move // by destination, then source
}

// NewPlan computes which bytes each destination shard needs from each
// source shard.
func NewPlan(from, to Layout) (*Plan, error) {
	if err := from.Validate(); err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	if err := to.Validate(); err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	if !slices.Equal(from.Shape, to.Shape) || from.ElemSize != to.ElemSize {
		return nil, fmt.Errorf("%w: from %v (%d-byte elements) to %v (%d-byte elements)", ErrLayout, from.Shape, from.ElemSize, to.Shape, to.ElemSize)
	}
	p := &Plan{From: from, To: to}
	for j, db := range to.Shards {
		for i, sb := range from.Shards {
			box, ok := intersect(sb, db)
			if !ok {
				continue
			}
			runs := runsOf(box, sb, db, from.ElemSize)
			p.Moves = append(p.Moves, Move{Src: i, Dst: j, Box: box, Runs: runs, Bytes: box.Elems() * from.ElemSize})
		}
	}
	return p, nil
}

// runsOf lists box's bytes as strided runs in the row-major memory of the
// source shard src and the destination shard dst. The trailing dimensions
// that box spans whole in both shards merge into one contiguous range; the
// innermost of the remaining dimensions becomes the stride; any further
// ones give one Run per index.
func runsOf(box, src, dst Box, elem int64) []Run {
	rank := len(box.Start)
	// Row-major strides (bytes) of each shard's memory.
	sst, dstr := make([]int64, rank), make([]int64, rank)
	s, t := elem, elem
	for d := rank - 1; d >= 0; d-- {
		sst[d], dstr[d] = s, t
		s *= src.extent(d)
		t *= dst.extent(d)
	}
	// k: the first dimension (from the outside) from which the ranges are
	// contiguous in both: every dimension after k is whole in all three.
	k := rank - 1
	for k > 0 && box.extent(k) == src.extent(k) && box.extent(k) == dst.extent(k) {
		k--
	}
	length := elem
	for d := k; d < rank; d++ {
		length *= box.extent(d)
	}
	if k == 0 {
		return []Run{{SrcOff: offset(box.Start, src, sst), DstOff: offset(box.Start, dst, dstr), Len: length, Count: 1}}
	}
	// Dimension k-1 strides; dimensions before it enumerate.
	var runs []Run
	idx := slices.Clone(box.Start)
	for {
		runs = append(runs, Run{SrcOff: offset(idx, src, sst), SrcStride: sst[k-1], DstOff: offset(idx, dst, dstr), DstStride: dstr[k-1],
			Len: length, Count: box.extent(k - 1)})
		d := k - 2
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < box.End[d] {
				break
			}
			idx[d] = box.Start[d]
		}
		if d < 0 {
			return runs
		}
	}
}

// offset is the byte offset of element idx in shard b's memory.
func offset(idx []int64, b Box, strides []int64) int64 {
	var o int64
	for d := range idx {
		o += (idx[d] - b.Start[d]) * strides[d]
	}
	return o
}

// Into returns the moves into destination shard j.
func (p *Plan) Into(j int) []Move {
	var out []Move
	for _, m := range p.Moves {
		if m.Dst == j {
			out = append(out, m)
		}
	}
	return out
}

// FromShard returns the moves out of source shard i.
func (p *Plan) FromShard(i int) []Move {
	var out []Move
	for _, m := range p.Moves {
		if m.Src == i {
			out = append(out, m)
		}
	}
	return out
}

// Bytes is the total the plan moves (each element once per destination
// that needs it).
func (p *Plan) Bytes() int64 {
	var n int64
	for _, m := range p.Moves {
		n += m.Bytes
	}
	return n
}

// Explain draws the plan: per destination shard, which sources send it
// which block, as how many ranges of how many bytes.
func (p *Plan) Explain() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reshard %v (%d-byte elements): %d source shards -> %d destination shards, %d moves, %d bytes\n",
		p.From.Shape, p.From.ElemSize, len(p.From.Shards), len(p.To.Shards), len(p.Moves), p.Bytes())
	for j, db := range p.To.Shards {
		fmt.Fprintf(&b, "destination %d %v (%d bytes)\n", j, db, p.To.Bytes(j))
		for _, m := range p.Into(j) {
			fmt.Fprintf(&b, "  <- source %d %v: block %v, %d bytes in %d ranges of %d bytes\n",
				m.Src, p.From.Shards[m.Src], m.Box, m.Bytes, m.Ranges(), m.Runs[0].Len)
		}
	}
	return b.String()
}

// Pack copies the move's bytes out of the source shard's memory src into
// buf (m.Bytes long), run by run, range by range.
func (m Move) Pack(buf, src []byte) {
	at := int64(0)
	for _, r := range m.Runs {
		for k := range r.Count {
			o := r.SrcOff + k*r.SrcStride
			copy(buf[at:at+r.Len], src[o:o+r.Len])
			at += r.Len
		}
	}
}

// SrcRuns lists the move's bytes as contiguous ranges of the source
// shard's memory, in the order Pack copies them, ranges that touch merged:
// what a gathered push sends (rdt.PushRuns), equal byte for byte to Pack's
// buffer.
func (m Move) SrcRuns() []rdt.Run {
	var out []rdt.Run
	for _, r := range m.Runs {
		for k := range r.Count {
			o := r.SrcOff + k*r.SrcStride
			if n := len(out); n > 0 && out[n-1].Off+out[n-1].Len == o {
				out[n-1].Len += r.Len
				continue
			}
			out = append(out, rdt.Run{Off: o, Len: r.Len})
		}
	}
	return out
}

// Unpack copies buf (as Pack made it) into the destination shard's memory
// dst.
func (m Move) Unpack(dst, buf []byte) {
	at := int64(0)
	for _, r := range m.Runs {
		for k := range r.Count {
			o := r.DstOff + k*r.DstStride
			copy(dst[o:o+r.Len], buf[at:at+r.Len])
			at += r.Len
		}
	}
}
