package fabric_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestCheckRuns(t *testing.T) {
	for _, tc := range []struct {
		name       string
		runs       []fabric.Run
		size, want int64
		ok         bool
	}{
		{"one run, the whole source", []fabric.Run{{0, 10}}, 10, 10, true},
		{"strided", []fabric.Run{{0, 2}, {4, 2}, {8, 2}}, 10, 6, true},
		{"overlapping and out of order", []fabric.Run{{5, 5}, {0, 6}}, 10, 11, true},
		{"last byte", []fabric.Run{{9, 1}}, 10, 1, true},
		{"none", nil, 10, 0, false},
		{"empty run", []fabric.Run{{0, 0}, {0, 4}}, 10, 4, false},
		{"negative offset", []fabric.Run{{-1, 2}}, 10, 2, false},
		{"negative length", []fabric.Run{{2, -1}, {0, 3}}, 10, 2, false},
		{"past the end", []fabric.Run{{9, 2}}, 10, 2, false},
		{"offset past the end", []fabric.Run{{11, 1}}, 10, 1, false},
		{"short", []fabric.Run{{0, 4}}, 10, 5, false},
		{"long", []fabric.Run{{0, 4}, {0, 4}}, 10, 5, false},
		{"overflowing offset+len", []fabric.Run{{1, 1<<63 - 1}}, 1<<63 - 1, 1<<63 - 1, false},
		{"overflowing total", []fabric.Run{{0, 1<<62 + 1}, {0, 1<<62 + 1}, {0, 1<<62 + 1}, {0, 1<<62 + 1}}, 1<<63 - 1, 1<<63 - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fabric.CheckRuns(tc.runs, tc.size, tc.want)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, fabric.ErrBadRuns)
			require.True(t, fabric.Terminal(err), "bad runs fail on every path")
		})
	}
}

// FuzzCheckRuns: whatever the runs, CheckRuns either refuses them as
// ErrBadRuns or every run lies inside the source and their lengths add up
// to the destination's exactly (computed without overflow).
func FuzzCheckRuns(f *testing.F) {
	f.Add(int64(10), int64(6), []byte{0, 2, 4, 2, 8, 2})
	f.Add(int64(1<<62), int64(1<<62), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1})
	f.Fuzz(func(t *testing.T, size, want int64, raw []byte) {
		var runs []fabric.Run
		// Each run from up to 16 bytes: small values often, huge ones too.
		for len(raw) > 0 {
			var r fabric.Run
			if len(raw) >= 16 {
				r.Off, r.Len = int64(binary.LittleEndian.Uint64(raw)), int64(binary.LittleEndian.Uint64(raw[8:]))
				raw = raw[16:]
			} else if len(raw) >= 2 {
				r.Off, r.Len = int64(int8(raw[0])), int64(int8(raw[1]))
				raw = raw[2:]
			} else {
				raw = nil
			}
			runs = append(runs, r)
		}
		err := fabric.CheckRuns(runs, size, want)
		if err != nil {
			require.ErrorIs(t, err, fabric.ErrBadRuns)
			return
		}
		var total int64
		for _, r := range runs {
			require.True(t, r.Off >= 0 && r.Len > 0 && r.Off <= size && r.Len <= size-r.Off, "run %v outside %d", r, size)
			require.LessOrEqual(t, r.Len, want-total)
			total += r.Len
		}
		require.Equal(t, want, total)
	})
}

// gatherer is a fake pusher that also sends runs.
type gatherer struct {
	pusher
	gathered int
	runs     []fabric.Run
}

func (g *gatherer) WriteRuns(ctx context.Context, src tensor.Buffer, runs []fabric.Run, dst fabric.Remote) (fabric.Stats, error) {
	g.gathered++
	g.runs = runs
	return fabric.Stats{Transport: g.name, Bytes: dst.Length}, g.err
}

// written is a fake pusher that keeps what it was given to write.
type written struct {
	pusher
	got []byte
}

func (w *written) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	b, err := tensor.BytesOf(src)
	if err != nil {
		return fabric.Stats{}, err
	}
	w.got = bytes.Clone(b[:dst.Length])
	return w.pusher.Write(ctx, src, dst)
}

// TestWriteRunsGathersOrPacks: a path with GatherWriter gets the runs; one
// without gets them packed into a buffer from stage (released after),
// counted in tensorlane_gather_packed_total{transport}; without staging
// memory the push has no path; bad runs are refused before any path.
func TestWriteRunsGathersOrPacks(t *testing.T) {
	ctx := context.Background()
	mem := tensor.NewHostMemory(0)
	src, err := mem.Alloc(ctx, 16)
	require.NoError(t, err)
	defer src.Release()
	b, _ := tensor.BytesOf(src)
	for i := range b {
		b[i] = byte(i)
	}
	runs := []fabric.Run{{Off: 12, Len: 2}, {Off: 0, Len: 3}, {Off: 7, Len: 1}}
	at := fabric.Endpoint{Process: "a", Host: "h0", Device: tensor.HostDevice}
	dst := fabric.Remote{Endpoint: fabric.Endpoint{Process: "b", Host: "h1", Device: tensor.HostDevice}, Length: 6}
	staged := 0
	stage := func(ctx context.Context, n int64) (tensor.Buffer, error) {
		staged++
		return mem.Alloc(ctx, n)
	}

	g := &gatherer{pusher: pusher{fake: fake{name: fabric.TCP}}}
	m := fabric.NewMetrics(prometheus.NewRegistry())
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Metrics: m}, g)
	require.NoError(t, err)
	st, _, err := p.WriteRuns(ctx, at, src, runs, dst, stage)
	require.NoError(t, err)
	assert.Equal(t, int64(6), st.Bytes)
	assert.Equal(t, 1, g.gathered)
	assert.Equal(t, runs, g.runs)
	assert.Zero(t, staged)
	assert.Zero(t, testutil.ToFloat64(m.GatherPacked.WithLabelValues(fabric.TCP)))

	w := &written{pusher: pusher{fake: fake{name: fabric.TCP}}}
	m = fabric.NewMetrics(prometheus.NewRegistry())
	p, err = fabric.NewPlanner(fabric.PlannerConfig{Topology: cluster(t), Metrics: m}, w)
	require.NoError(t, err)
	_, _, err = p.WriteRuns(ctx, at, src, runs, dst, stage)
	require.NoError(t, err)
	assert.Equal(t, []byte{12, 13, 0, 1, 2, 7}, w.got, "packed in the runs' order")
	assert.Equal(t, 1, staged)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.GatherPacked.WithLabelValues(fabric.TCP)))
	assert.Zero(t, mem.Stats().Used-16, "the staging buffer was released")

	_, _, err = p.WriteRuns(ctx, at, src, runs, dst, nil)
	require.ErrorIs(t, err, fabric.ErrNoPath, "no staging memory for a path that cannot send runs")

	_, _, err = p.WriteRuns(ctx, at, src, []fabric.Run{{Off: 12, Len: 5}, {Off: 0, Len: 1}}, dst, stage)
	require.ErrorIs(t, err, fabric.ErrBadRuns)
	assert.Equal(t, 1, staged, "bad runs never reach a path")
	assert.False(t, errors.Is(err, fabric.ErrNoPath))
}
