package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
)

func TestRunBroadcastSmall(t *testing.T) {
	recs, err := RunBroadcast(context.Background(), BroadcastConfig{Sizes: []int64{1 << 20}, Readers: []int{1, 3}, Transports: []string{"tcp"},
		Rounds: 1, ChunkSize: 256 << 10, Naive: true}, nil)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	for _, r := range recs {
		assert.Equal(t, PathBroadcast, r.Path)
		assert.Positive(t, r.Seconds)
		assert.Positive(t, r.RatioVsOne)
	}
	assert.Equal(t, 1.0, recs[0].RatioVsOne)
	var buf bytes.Buffer
	require.NoError(t, WriteBroadcastJSON(&buf, recs))
	var m map[string]any
	require.NoError(t, json.Unmarshal(bytes.SplitN(buf.Bytes(), []byte("\n"), 2)[0], &m))
	for _, k := range []string{"path", "readers", "size", "seconds", "ratio_vs_one"} {
		assert.Contains(t, m, k)
	}
	f, err := WriteBroadcastPlot(t.TempDir(), recs)
	require.NoError(t, err)
	assert.FileExists(t, f)
	_, err = RunBroadcast(context.Background(), BroadcastConfig{Transports: []string{"carrier-pigeon"}}, nil)
	assert.Error(t, err)
}

// Windows compared in one run: each window's cells against its own one
// reader, N pushes timed once (with the first window).
func TestRunBroadcastWindows(t *testing.T) {
	recs, err := RunBroadcast(context.Background(), BroadcastConfig{Sizes: []int64{1 << 20}, Readers: []int{1, 2}, Transports: []string{"rdma"},
		Rounds: 1, ChunkSize: 64 << 10, Windows: []int{1, 4}, Naive: true}, nil)
	require.NoError(t, err)
	require.Len(t, recs, 4)
	for i, w := range []int{1, 1, 4, 4} {
		assert.Equal(t, w, recs[i].Window)
		assert.Positive(t, recs[i].Seconds)
	}
	assert.Equal(t, 1.0, recs[0].RatioVsOne)
	assert.Equal(t, 1.0, recs[2].RatioVsOne, "window 4 against its own one reader")
	assert.Positive(t, recs[1].Naive)
	assert.Zero(t, recs[3].Naive)
	var buf bytes.Buffer
	require.NoError(t, WriteBroadcastTable(&buf, recs))
	assert.Contains(t, buf.String(), "| rdma | 1MiB | 4 | 2 |")
	_, err = RunBroadcast(context.Background(), BroadcastConfig{Sizes: []int64{1 << 20}, Readers: []int{1}, Transports: []string{"tcp"}, Rounds: 1, Windows: []int{99}}, nil)
	assert.ErrorIs(t, err, rdt.ErrMalformedRef)
}

func TestStateDictShape(t *testing.T) {
	s := StateDictShape(1)
	var total, largest int64
	for _, n := range s {
		total += 2 * n
		largest = max(largest, 2*n)
	}
	assert.Len(t, s, 200)
	assert.InDelta(t, 2.05, float64(total)/(1<<30), 0.05)
	assert.Equal(t, int64(250<<20), largest/(1<<20)<<20)
}

func TestRunStateDictSmall(t *testing.T) {
	rec, err := RunStateDict(context.Background(), StateDictConfig{Scale: 256, Transport: "tcp", Rounds: 1})
	require.NoError(t, err)
	assert.Equal(t, 200, rec.Tensors)
	assert.Positive(t, rec.Ratio)
}

func TestRunZeroCopySmall(t *testing.T) {
	recs, err := RunZeroCopy(context.Background(), []int64{1 << 20, 4 << 20}, 1)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	for _, r := range recs {
		assert.Positive(t, r.ViewSeconds)
		assert.Positive(t, r.WarmSeconds)
	}
}
