package reshard

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
)

// global fills a tensor's bytes with a pattern that differs per element.
func global(shape []int64, elem int64) []byte {
	n := elem
	for _, s := range shape {
		n *= s
	}
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*131 + i>>8 + i>>16)
	}
	return p
}

// extract copies box's elements out of the row-major tensor g.
func extract(g []byte, shape []int64, elem int64, b Box) []byte {
	whole := Box{Start: make([]int64, len(shape)), End: shape}
	rank := len(shape)
	st := make([]int64, rank)
	s := elem
	for d := rank - 1; d >= 0; d-- {
		st[d] = s
		s *= shape[d]
	}
	out := make([]byte, 0, b.Elems()*elem)
	idx := append([]int64(nil), b.Start...)
	for {
		o := offset(idx, whole, st)
		out = append(out, g[o:o+elem]...)
		d := rank - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < b.End[d] {
				break
			}
			idx[d] = b.Start[d]
		}
		if d < 0 {
			return out
		}
	}
}

func split(t *testing.T, shape []int64, elem int64, dim, n int) Layout {
	t.Helper()
	l, err := Split(shape, elem, dim, n)
	require.NoError(t, err)
	return l
}

// TestPlanMovesExactlyTheBytes: for each pair of layouts, packing every
// move out of the source shards and unpacking it into the destination
// shards rebuilds each destination shard exactly, each byte moves once per
// destination, and the ranges are as few as the layouts allow.
func TestPlanMovesExactlyTheBytes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		shape       []int64
		elem        int64
		from, to    [2]int // (dimension, count)
		moves       int
		maxRangesPM int64 // the most contiguous ranges of one move
	}{
		{"FSDP rows (3) to TP columns (2)", []int64{12, 10}, 2, [2]int{0, 3}, [2]int{1, 2}, 6, 4},
		{"TP columns (4) to FSDP rows (2)", []int64{8, 16}, 4, [2]int{1, 4}, [2]int{0, 2}, 8, 4},
		{"rows (3) to rows (2): whole rows, one range each", []int64{9, 7}, 2, [2]int{0, 3}, [2]int{0, 2}, 4, 1},
		{"the same layout: one range per shard", []int64{6, 5}, 4, [2]int{0, 3}, [2]int{0, 3}, 3, 1},
		{"uneven: 7 rows over 3, 5 columns over 2", []int64{7, 5}, 2, [2]int{0, 3}, [2]int{1, 2}, 6, 3},
		{"3-D: heads (dim 1) to head_dim (dim 2)", []int64{2, 4, 6}, 2, [2]int{1, 2}, [2]int{2, 3}, 6, 4},
		{"3-D: dim 0 to dim 1", []int64{4, 3, 5}, 1, [2]int{0, 2}, [2]int{1, 3}, 6, 2},
		{"one holder to eight", []int64{16, 32}, 2, [2]int{0, 1}, [2]int{1, 8}, 8, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from := split(t, tc.shape, tc.elem, tc.from[0], tc.from[1])
			to := split(t, tc.shape, tc.elem, tc.to[0], tc.to[1])
			p, err := NewPlan(from, to)
			require.NoError(t, err)
			assert.Len(t, p.Moves, tc.moves)
			g := global(tc.shape, tc.elem)
			assert.Equal(t, int64(len(g)), p.Bytes(), "every byte once: each destination element comes from one source")
			srcs := make([][]byte, len(from.Shards))
			for i, b := range from.Shards {
				srcs[i] = extract(g, tc.shape, tc.elem, b)
			}
			dsts := make([][]byte, len(to.Shards))
			for j := range to.Shards {
				dsts[j] = make([]byte, to.Bytes(j))
			}
			for _, m := range p.Moves {
				assert.LessOrEqual(t, m.Ranges(), tc.maxRangesPM, "move %d->%d", m.Src, m.Dst)
				buf := make([]byte, m.Bytes)
				m.Pack(buf, srcs[m.Src])
				assert.Equal(t, extract(g, tc.shape, tc.elem, m.Box), buf, "a move's packed bytes are its block, row-major")
				// A gathered push sends SrcRuns: the same bytes, no pack.
				runs := m.SrcRuns()
				require.NoError(t, fabric.CheckRuns(runs, from.Bytes(m.Src), m.Bytes))
				var gathered []byte
				for k, r := range runs {
					gathered = append(gathered, srcs[m.Src][r.Off:r.Off+r.Len]...)
					if k > 0 {
						assert.NotEqual(t, runs[k-1].Off+runs[k-1].Len, r.Off, "touching runs are merged")
					}
				}
				assert.Equal(t, buf, gathered, "move %d->%d: the runs are Pack's bytes", m.Src, m.Dst)
				assert.LessOrEqual(t, int64(len(runs)), m.Ranges())
				m.Unpack(dsts[m.Dst], buf)
			}
			for j, b := range to.Shards {
				assert.True(t, bytes.Equal(extract(g, tc.shape, tc.elem, b), dsts[j]), "destination %d", j)
			}
			assert.Contains(t, p.Explain(), "destination 0")
		})
	}
}

// TestPlanRefusesBadLayouts: overlapping, gapped, out-of-bounds shards and
// layouts of different tensors are refused, typed.
func TestPlanRefusesBadLayouts(t *testing.T) {
	shape := []int64{4, 4}
	good := Layout{Shape: shape, ElemSize: 4, Shards: []Box{{Start: []int64{0, 0}, End: []int64{2, 4}}, {Start: []int64{2, 0}, End: []int64{4, 4}}}}
	require.NoError(t, good.Validate())
	for name, l := range map[string]Layout{
		"overlap":  {Shape: shape, ElemSize: 4, Shards: []Box{{Start: []int64{0, 0}, End: []int64{3, 4}}, {Start: []int64{2, 0}, End: []int64{4, 4}}}},
		"gap":      {Shape: shape, ElemSize: 4, Shards: []Box{{Start: []int64{0, 0}, End: []int64{1, 4}}, {Start: []int64{2, 0}, End: []int64{4, 4}}}},
		"outside":  {Shape: shape, ElemSize: 4, Shards: []Box{{Start: []int64{0, 0}, End: []int64{5, 4}}}},
		"rank":     {Shape: shape, ElemSize: 4, Shards: []Box{{Start: []int64{0}, End: []int64{4}}}},
		"no shard": {Shape: shape, ElemSize: 4},
		"elem":     {Shape: shape, ElemSize: 0, Shards: good.Shards},
	} {
		_, err := NewPlan(l, good)
		assert.True(t, errors.Is(err, ErrLayout), "%s: %v", name, err)
	}
	other := split(t, []int64{4, 8}, 4, 0, 2)
	_, err := NewPlan(good, other)
	assert.ErrorIs(t, err, ErrLayout)
	_, err = Split(shape, 4, 2, 2)
	assert.ErrorIs(t, err, ErrLayout)
	_, err = Split(shape, 4, 0, 5)
	assert.ErrorIs(t, err, ErrLayout)
}

// TestSrcRuns: the runs a move yields, by hand, for the layouts reshard
// is for: rows to columns (one run per row of the source shard, strided by
// its row), columns to rows (the destination's rows are whole rows of the
// column shard: contiguous, one run), rows to rows (one run), 3-D.
func TestSrcRuns(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shape    []int64
		elem     int64
		from, to [2]int
		src, dst int
		want     []rdt.Run
	}{
		// Shard 1 holds rows 2..3 of a 4x6 (2-byte) tensor: 12-byte rows;
		// destination 1 is columns 3..5: bytes 6..11 of each row.
		{"rows (2) to columns (2)", []int64{4, 6}, 2, [2]int{0, 2}, [2]int{1, 2}, 1, 1, []rdt.Run{{Off: 6, Len: 6}, {Off: 18, Len: 6}}},
		// Column shard 0 holds columns 0..2 (6-byte rows); destination 1
		// is rows 2..3: rows 2 and 3 of the shard, contiguous: one run.
		{"columns (2) to rows (2)", []int64{4, 6}, 2, [2]int{1, 2}, [2]int{0, 2}, 0, 1, []rdt.Run{{Off: 12, Len: 12}}},
		{"rows (2) to rows (4)", []int64{4, 6}, 2, [2]int{0, 2}, [2]int{0, 4}, 1, 3, []rdt.Run{{Off: 12, Len: 12}}},
		// 2x2x4 (1-byte), dim 0 over 2 to dim 2 over 2: shard 0 is [0:1,
		// 0:2, 0:4] (8 bytes), destination 1 takes bytes 2..3 of each
		// 4-byte row.
		{"3-D: dim 0 to dim 2", []int64{2, 2, 4}, 1, [2]int{0, 2}, [2]int{2, 2}, 0, 1, []rdt.Run{{Off: 2, Len: 2}, {Off: 6, Len: 2}}},
		{"the same layout: the whole shard", []int64{4, 6}, 2, [2]int{0, 2}, [2]int{0, 2}, 1, 1, []rdt.Run{{Off: 0, Len: 24}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlan(split(t, tc.shape, tc.elem, tc.from[0], tc.from[1]), split(t, tc.shape, tc.elem, tc.to[0], tc.to[1]))
			require.NoError(t, err)
			var got []rdt.Run
			found := false
			for _, m := range p.Moves {
				if m.Src == tc.src && m.Dst == tc.dst {
					got, found = m.SrcRuns(), true
				}
			}
			require.True(t, found, "no move %d -> %d", tc.src, tc.dst)
			assert.Equal(t, tc.want, got)
		})
	}
}
