package fabrictest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// pushRuns is the case of transports with fabric.GatherWriter: a gathered
// push lands exactly the concatenation of its runs in the sink, whatever
// the runs (rows of a few KiB, runs across and inside blocks, one byte,
// one run of all the bytes); runs that do not describe the push fail as
// fabric.ErrBadRuns and a forged sink token as fabric.ErrUnauthorized.
func (s *suite) pushRuns(t *testing.T, env Env) {
	g := capable[fabric.GatherWriter](t, env, "fabric.GatherWriter (runs are packed by the planner)")
	const size = 9<<20 + 77
	src := s.dst(t, env, size)
	p, _ := tensor.BytesOf(src)
	fill(p, 24)
	strided := func(off, n, stride, count int64) []fabric.Run {
		var out []fabric.Run
		for k := range count {
			out = append(out, fabric.Run{Off: off + k*stride, Len: n})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		runs []fabric.Run
	}{
		{"one run", []fabric.Run{{Off: 0, Len: size}}},
		{"rows", strided(4096, 4096, 8192, 1000)},
		{"runs across blocks", strided(3, 700<<10, 701<<10, 12)},
		{"bytes", append(strided(1, 1, 7, 999), fabric.Run{Off: size - 1, Len: 1})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []byte
			for _, r := range tc.runs {
				want = append(want, p[r.Off:r.Off+r.Len]...)
			}
			n := int64(len(want))
			sink, err := s.owner.sinkOf(context.Background(), n)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.owner.free(sink) })
			err = within(t, bigBound, "WriteRuns", func() error {
				st, err := g.WriteRuns(context.Background(), src, tc.runs, s.remote(env, sink, 0, n))
				if err == nil && st.Bytes != n {
					err = fmt.Errorf("Stats.Bytes %d, want %d", st.Bytes, n)
				}
				return err
			})
			if err != nil {
				t.Fatalf("gathered push of %d runs: %v", len(tc.runs), err)
			}
			got, _ := tensor.BytesOf(sink.buf)
			if !bytes.Equal(got[:n], want) {
				t.Fatalf("gathered push of %d runs: the sink does not hold the runs' bytes in order", len(tc.runs))
			}
		})
	}
	sink, err := s.owner.sinkOf(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.owner.free(sink) })
	runs := strided(0, 1024, 2048, 4)
	err = within(t, faultBound, "WriteRuns with short runs", func() error {
		_, err := g.WriteRuns(context.Background(), src, runs[:3], s.remote(env, sink, 0, 4096))
		return err
	})
	if !errors.Is(err, fabric.ErrBadRuns) {
		t.Fatalf("runs short of the sink: got %v, want fabric.ErrBadRuns", err)
	}
	r := s.remote(env, sink, 0, 4096)
	r.Claim.Token = []byte("forged")
	err = within(t, faultBound, "a refused WriteRuns", func() error {
		_, err := g.WriteRuns(context.Background(), src, runs, r)
		return err
	})
	if !errors.Is(err, fabric.ErrUnauthorized) {
		t.Fatalf("gathered push with a forged token: got %v, want fabric.ErrUnauthorized", err)
	}
}
