package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabricsim"
	"github.com/tensorlane/tensorlane/internal/testhelp"
)

func TestSimCommand(t *testing.T) {
	var out bytes.Buffer
	o := simOptions{preset: "dgx-h100", hosts: 48, workloads: "weight-sync", size: "1TB", trainers: 256, inference: 128, replicaGPUs: 16, readers: "1,8"}
	require.NoError(t, runSim(&out, o))
	require.Contains(t, out.String(), "line-rate bound")
	require.Contains(t, out.String(), "h32 ingress")

	out.Reset()
	dir := t.TempDir()
	o = simOptions{preset: "dgx-h100", hosts: 4, workloads: "broadcast,many-to-one,placement", size: "1GiB", readers: "1,8", bundles: 3, jsonOut: true, plotFile: filepath.Join(dir, "sim.png")}
	require.NoError(t, runSim(&out, o))
	var recs []simRecord
	require.NoError(t, json.Unmarshal(out.Bytes(), &recs))
	require.Len(t, recs, 5)
	for _, r := range recs[:4] {
		require.Positive(t, r.Seconds, r.Case)
		require.Positive(t, r.BoundSeconds, r.Case)
	}
	require.Equal(t, "placement", recs[4].Workload)
	require.Equal(t, 3, recs[4].Transfers["bundles"])
	st, err := os.Stat(o.plotFile)
	require.NoError(t, err)
	require.Positive(t, st.Size())
}

func TestSimCommandBadInput(t *testing.T) {
	base := simOptions{preset: "dgx-h100", hosts: 2, workloads: "weight-sync", size: "1GB", trainers: 8, inference: 8, replicaGPUs: 8, readers: "1"}
	for name, mut := range map[string]func(*simOptions){
		"workload": func(o *simOptions) { o.workloads = "teleport" },
		"size":     func(o *simOptions) { o.size = "lots" },
		"hosts":    func(o *simOptions) { o.hosts = 0 },
		"gpus":     func(o *simOptions) { o.trainers = 64 },
		"readers":  func(o *simOptions) { o.workloads, o.readers = "broadcast", "1,x" },
		"many":     func(o *simOptions) { o.workloads, o.readers = "broadcast", "99" },
		"preset":   func(o *simOptions) { o.preset = "nope" },
		"rail":     func(o *simOptions) { o.railGbps = -1 },
		"eff":      func(o *simOptions) { o.rdmaEff = 1.5 },
	} {
		o := base
		mut(&o)
		err := runSim(&bytes.Buffer{}, o)
		require.Error(t, err, name)
		require.False(t, strings.Contains(err.Error(), "panic"), name)
	}
	o := base
	o.trainers = 64
	require.ErrorIs(t, runSim(&bytes.Buffer{}, o), fabricsim.ErrBadSpec)
	n, err := parseSimSize("1.5TiB")
	require.NoError(t, err)
	require.Equal(t, int64(1.5*(1<<40)), n)
}

// Every result is printed and plotted beside its bound: a placement's is
// issue 28's goal, in a plot of its own; a result bound by a link the
// line-rate bound does not count says so.
func TestSimCommandBoundsAndPlots(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	o := simOptions{preset: "dgx-h100", hosts: 4, workloads: "broadcast,placement", size: "1GiB", readers: "1", bundles: 3, plotFile: filepath.Join(dir, "sim.png")}
	require.NoError(t, runSim(&out, o))
	s := out.String()
	require.Contains(t, s, "busiest link")
	require.Contains(t, s, "h0/0 pcie up", "one GPU's broadcast is bound by its PCIe link")
	require.Contains(t, s, "note: broadcast 1GiB to 1 readers: bound by h0/0 pcie up")
	require.Contains(t, s, "goal < 1 CPU-s, < 64 MB")
	for _, f := range []string{"sim.png", "sim-placement.png"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		require.Positive(t, st.Size(), f)
	}
	// Placement alone plots into the file asked for.
	o = simOptions{preset: "gb200-nvl72", hosts: 8, workloads: "placement", bundles: 2, size: "1GB", readers: "1", plotFile: filepath.Join(dir, "place.png")}
	require.NoError(t, runSim(&bytes.Buffer{}, o))
	_, err := os.Stat(filepath.Join(dir, "place.png"))
	require.NoError(t, err)
}

// A transfer with a rail cut stalls the cut rail's slices for the rail
// timeout; a bad --cut is refused.
func TestSimCommandTransferCut(t *testing.T) {
	var out bytes.Buffer
	o := simOptions{preset: "dgx-h100", hosts: 2, workloads: "transfer", size: "1GiB", readers: "1", railTimeout: 10, jsonOut: true}
	require.NoError(t, runSim(&out, o))
	var whole []simRecord
	require.NoError(t, json.Unmarshal(out.Bytes(), &whole))
	out.Reset()
	o.cut = "h1/ibp25s0@0.001"
	require.NoError(t, runSim(&out, o))
	var cut []simRecord
	require.NoError(t, json.Unmarshal(out.Bytes(), &cut))
	require.Less(t, whole[0].Seconds, 0.1)
	require.Greater(t, cut[0].Seconds, 10.0, "the cut rail's slices wait out the timeout")
	require.Contains(t, cut[0].Binding, "pcie up", "a cut link's use is against its rate as built")
	for _, bad := range []string{"h1/ibp25s0", "ibp25s0@1", "h1/ibp25s0@x", "h1/nope@0"} {
		o.cut = bad
		require.ErrorIs(t, runSim(&bytes.Buffer{}, o), fabricsim.ErrBadSpec, bad)
	}
}

// calibrate measures this process's CPU and writes constants the
// simulator takes.
func TestSimCalibrate(t *testing.T) {
	// The runtimes it starts are shut down, their goroutines gone.
	defer goleak.VerifyNone(t, append(testhelp.Libp2pBackground(), goleak.IgnoreCurrent())...)
	file := filepath.Join(t.TempDir(), "cal.json")
	var out bytes.Buffer
	require.NoError(t, runCalibrate(t.Context(), &out, calibrateOptions{out: file, rounds: 2, size: "8MiB"}))
	require.Contains(t, out.String(), "calibration written to")
	cal, err := fabricsim.ReadCalibration(file)
	require.NoError(t, err)
	require.Positive(t, cal.ByteSeconds)
	require.Len(t, cal.Samples, 6)
	require.Contains(t, cal.Samples[4].What, "two slots of the reader", "the edge inside a runtime is measured")
	require.InDelta(t, float64(cal.Cores), cal.CPU().Cores, 0)
}
