package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/bench/devbench"
	"github.com/tensorlane/tensorlane/bench/harness"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

func runBenchArgs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newBenchCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

var tiny = []string{"--no-ucx", "--retries", "0", "--baseline-runs", "2", "--sizes", "4KiB,8KiB", "--concurrency", "1", "--min-time", "1ms", "--min-rounds", "2", "--latency-samples", "5"}

// narrow is the matrix of the baseline and check runs: two paths keep them
// fast (every path is covered by the first run).
var narrow = append([]string{"--paths", "p2p,tcp", "--push", "rdma"}, tiny...)

// One tiny run of every path through the command (JSON lines, --out), then
// --write-baseline and --check against doctored copies whose ratios are out
// of reach, on a narrower matrix.
func TestBenchCommand(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.json")
	out, err := runBenchArgs(t, append([]string{"--json", "--out", dir}, tiny...)...)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	paths, modes := map[string]bool{}, map[string]bool{}
	for _, l := range lines {
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &r), l)
		for _, k := range []string{"path", "mode", "size", "concurrency", "gbps", "baseline", "baseline_gbps", "ratio"} {
			assert.Contains(t, r, k, l)
		}
		paths[r["path"].(string)] = true
		modes[r["mode"].(string)] = true
	}
	for _, p := range []string{"local", "p2p", "p2p-ipc", "shm", "rdma", "tcp", "tcp-z"} {
		assert.True(t, paths[p], "no %s line", p)
	}
	assert.True(t, modes["push"] && modes["pull"], "modes %v", modes)
	_, err = runBenchArgs(t, append([]string{"--write-baseline", base}, narrow...)...)
	require.NoError(t, err)
	for _, f := range []string{"results.json", "report.md", "base.json", "throughput-tcp.png", "throughput-p2p-ipc.png"} {
		_, err := os.Stat(filepath.Join(dir, f))
		assert.NoError(t, err, f)
	}

	f, err := harness.ReadFile(base)
	require.NoError(t, err)
	for i := range f.Records {
		f.Records[i].Ratio *= 1000
	}
	f.Records = append(f.Records, harness.Record{Kind: harness.KindThroughput, Path: "p2p", Mode: harness.ModePull, Size: 1 << 30, Concurrency: 1, Baseline: harness.BaseMemcpy, Ratio: 1})
	high := filepath.Join(dir, "high.json")
	require.NoError(t, harness.WriteFile(high, f))
	out, err = runBenchArgs(t, append([]string{"--check", high}, narrow...)...)
	require.Error(t, err)
	assert.Regexp(t, `(?m)^FAIL: \d+ of \d+ ratios against .*high.json`, out, "one final verdict")
	assert.Contains(t, err.Error(), "throughput/p2p/pull/4KiB/c1/vs-memcpy")
	assert.Contains(t, err.Error(), "throughput/p2p/pull/1GiB/c1/vs-memcpy: in the baseline")

	for i := range f.Records {
		f.Records[i].Ratio /= 1e9 // every current ratio is far above these
	}
	f.Records = f.Records[:len(f.Records)-1]
	low := filepath.Join(dir, "low.json")
	require.NoError(t, harness.WriteFile(low, f))
	out, err = runBenchArgs(t, append([]string{"--check", low}, narrow...)...)
	require.NoError(t, err)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	assert.Regexp(t, `^PASS: \d+ ratios .* of .*low.json$`, lines[len(lines)-1], "ends with one verdict that says what was compared")
	assert.NotContains(t, out, "NOT MET")
	assert.Contains(t, out, "serialize", "every path is also measured against the object-store way")
}

func TestBenchBadFlags(t *testing.T) {
	_, err := runBenchArgs(t, "--check", filepath.Join(t.TempDir(), "nope.json"))
	assert.Error(t, err, "a missing baseline fails before measuring")
	_, err = runBenchArgs(t, "--tolerance", "1.5", "--sizes", "4KiB")
	assert.Error(t, err)
	_, err = runBenchArgs(t, "--sizes", "lots")
	assert.Error(t, err)
	_, err = runBenchArgs(t, "--sizes", "4KiB", "--paths", "nvme")
	assert.ErrorContains(t, err, "unknown path")
	_, err = runBenchArgs(t, "--sizes", "4KiB", "--push", "tcp-z")
	assert.ErrorContains(t, err, "no push mode")
}

// The device rows run on the fake CUDA driver (the CI machine has no GPU):
// every row measured against its baseline, including the cross-process
// ones (the owner is this test binary again, devbench.Owner in TestMain),
// and labelled fake-driver with a note that the figures mean nothing.
func TestBenchDeviceRows(t *testing.T) {
	t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
	out, err := runBenchArgs(t, "--json", "--paths", "device", "--sizes", "4MiB", "--min-rounds", "2")
	require.NoError(t, err)
	rows := map[string]harness.Record{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r harness.Record
		require.NoError(t, json.Unmarshal([]byte(l), &r), l)
		rows[r.Path] = r
	}
	for p, base := range map[string]string{devbench.PathD2D: devbench.BaseDtoD, devbench.PathIPCVMM: devbench.BaseDtoD,
		devbench.PathIPCLegacy: devbench.BaseDtoD, devbench.PathTCP: devbench.BaseRawTCP} {
		r, ok := rows[p]
		if !assert.True(t, ok, "no %s row in %s", p, out) {
			continue
		}
		assert.True(t, r.Measured(), "%s: %+v", p, r)
		assert.Equal(t, devbench.ModeFake, r.Mode, p)
		assert.Equal(t, base, r.Baseline, p)
		assert.Equal(t, int64(4<<20), r.Size, p)
		assert.Positive(t, r.Ratio, p)
		assert.Equal(t, 2, r.Rounds, p)
		assert.Contains(t, r.Note, "mean nothing", p)
	}
	out, err = runBenchArgs(t, "--paths", "device", "--sizes", "1MiB", "--min-rounds", "1")
	require.NoError(t, err)
	assert.Contains(t, out, "cuda-tcp  fake-driver")
	assert.Contains(t, out, "figures mean nothing")
}
