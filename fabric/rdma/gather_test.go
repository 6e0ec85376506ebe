package rdma

import (
	"slices"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
)

// TestGatherSlices: the work requests of a gathered push cover the
// destination range in order, none crosses a slice boundary or has more
// than maxSGE pieces, and their pieces, in order, are the runs.
func TestGatherSlices(t *testing.T) {
	strided := func(off, n, stride, count int64) []fabric.Run {
		var out []fabric.Run
		for k := range count {
			out = append(out, fabric.Run{Off: off + k*stride, Len: n})
		}
		return out
	}
	type wr struct {
		off, n int64
		segs   []fabric.Run
	}
	for _, tc := range []struct {
		name   string
		runs   []fabric.Run
		size   int64
		maxSGE int
		want   []wr // nil: only the invariants
	}{
		{"one run", []fabric.Run{{Off: 5, Len: 250}}, 100, 4, []wr{
			{0, 100, []fabric.Run{run(5, 100)}}, {100, 100, []fabric.Run{run(105, 100)}}, {200, 50, []fabric.Run{run(205, 50)}}}},
		{"a run inside one slice", []fabric.Run{{Off: 10, Len: 20}, {Off: 0, Len: 5}}, 100, 4, []wr{
			{0, 25, []fabric.Run{run(10, 20), run(0, 5)}}}},
		{"runs across slice boundaries", []fabric.Run{{Off: 0, Len: 60}, {Off: 100, Len: 60}, {Off: 200, Len: 60}}, 100, 4, []wr{
			{0, 100, []fabric.Run{run(0, 60), run(100, 40)}}, {100, 80, []fabric.Run{run(140, 20), run(200, 60)}}}},
		{"tiny runs over MaxSGE", strided(0, 1, 3, 10), 100, 4, []wr{
			{0, 4, []fabric.Run{run(0, 1), run(3, 1), run(6, 1), run(9, 1)}}, {4, 4, []fabric.Run{run(12, 1), run(15, 1), run(18, 1), run(21, 1)}},
			{8, 2, []fabric.Run{run(24, 1), run(27, 1)}}}},
		{"adjacent runs are one piece", []fabric.Run{{Off: 0, Len: 10}, {Off: 10, Len: 10}, {Off: 30, Len: 10}, {Off: 40, Len: 90}}, 100, 1, []wr{
			{0, 20, []fabric.Run{run(0, 20)}}, {20, 80, []fabric.Run{run(30, 80)}}, {100, 20, []fabric.Run{run(110, 20)}}}},
		{"reshard rows", strided(4096, 4096, 8192, 1365), 1 << 20, 64, nil},
		{"MaxSGE 1", strided(7, 33, 50, 300), 1000, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := gatherSlices(tc.runs, tc.size, tc.maxSGE)
			if tc.want != nil {
				var g []wr
				for _, s := range got {
					g = append(g, wr{s.off, s.n, s.segs})
				}
				if !slices.EqualFunc(g, tc.want, func(a, b wr) bool { return a.off == b.off && a.n == b.n && slices.Equal(a.segs, b.segs) }) {
					t.Fatalf("work requests\n got %v\nwant %v", g, tc.want)
				}
			}
			var pos int64
			var pieces []fabric.Run
			for i, s := range got {
				if s.off != pos {
					t.Fatalf("request %d at %d, want %d", i, s.off, pos)
				}
				if len(s.segs) == 0 || len(s.segs) > tc.maxSGE || fabric.RunsBytes(s.segs) != s.n {
					t.Fatalf("request %d: %d pieces of %d bytes for %d (MaxSGE %d)", i, len(s.segs), fabric.RunsBytes(s.segs), s.n, tc.maxSGE)
				}
				if s.off/tc.size != (s.off+s.n-1)/tc.size {
					t.Fatalf("request %d [%d,+%d) crosses a slice boundary", i, s.off, s.n)
				}
				pos += s.n
				pieces = append(pieces, s.segs...)
			}
			if pos != fabric.RunsBytes(tc.runs) {
				t.Fatalf("requests of %d bytes, runs of %d", pos, fabric.RunsBytes(tc.runs))
			}
			if !slices.Equal(coalesce(pieces), coalesce(tc.runs)) {
				t.Fatal("the pieces are not the runs' bytes in order")
			}
		})
	}
}

func run(off, n int64) fabric.Run { return fabric.Run{Off: off, Len: n} }

// coalesce merges runs that follow each other in the source: two lists
// name the same bytes in the same order exactly when their coalesced forms
// are equal.
func coalesce(runs []fabric.Run) []fabric.Run {
	var out []fabric.Run
	for _, r := range runs {
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == r.Off {
			out[k].Len += r.Len
			continue
		}
		out = append(out, r)
	}
	return out
}
