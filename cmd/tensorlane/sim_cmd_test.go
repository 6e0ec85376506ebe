package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabricsim"
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
