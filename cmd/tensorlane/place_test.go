package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

func TestPlaceJSON(t *testing.T) {
	req := writeFile(t, "req.json", `{"strategy":"PACK","bundles":[{"kind":"gpu","devices":4},{"kind":"gpu","devices":4}],
		"topology":{"required":"nvlink-domain"},"traffic":[{"from":0,"to":1,"gbps":800}]}`)
	var out bytes.Buffer
	err := runPlace(nil, &out, placeOptions{preset: "gb200-nvl72", racks: 2, request: req, jsonOut: true})
	require.NoError(t, err)
	var got struct {
		Feasible    bool     `json:"feasible"`
		Reasons     []string `json:"reasons"`
		Assignments []struct {
			Bundle  int    `json:"bundle"`
			Host    string `json:"host"`
			Devices []int  `json:"devices"`
			NUMA    int    `json:"numa"`
		} `json:"assignments"`
		EstimatedSeconds float64 `json:"estimated_seconds"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.True(t, got.Feasible)
	require.NotNil(t, got.Reasons)
	require.Len(t, got.Assignments, 2)
	require.Equal(t, "h0", got.Assignments[0].Host)
	require.Equal(t, []int{0, 1, 2, 3}, got.Assignments[0].Devices)
	require.InDelta(t, 100.0/4/900, got.EstimatedSeconds, 1e-9)
}

func TestPlaceInfeasibleAndState(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	req := writeFile(t, "req.json", `{"bundles":[{"kind":"gpu","devices":4},{"kind":"gpu","devices":4},{"kind":"gpu","devices":4},{"kind":"gpu","devices":4},{"kind":"gpu","devices":4}],"topology":{"required":"nvlink-domain"}}`)
	o := placeOptions{preset: "gb200-nvl72", racks: 1, hostsPerRack: 6, request: req, state: state, jsonOut: true}
	// Reserve writes the state; the second identical request no longer fits.
	o.reserve = "first"
	var out bytes.Buffer
	require.NoError(t, runPlace(nil, &out, o))
	_, err := os.Stat(state)
	require.NoError(t, err)
	o.reserve = ""
	out.Reset()
	err = runPlace(nil, &out, o)
	require.ErrorIs(t, err, errPlaceInfeasible)
	var got placeOutput
	require.NoError(t, json.Unmarshal(out.Bytes(), &got))
	require.False(t, got.Feasible)
	require.Contains(t, got.Reasons, "needs 20 GPUs in one NVLink domain; the largest free has 4")
	require.Empty(t, got.Assignments)
}

func TestPlaceRayAndText(t *testing.T) {
	req := writeFile(t, "req.json", `{"name":"pg","strategy":"SPREAD","bundles":[{"kind":"gpu","devices":2,"cpus":4},{"kind":"gpu","devices":2}]}`)
	var out bytes.Buffer
	require.NoError(t, runPlace(nil, &out, placeOptions{preset: "dgx-h100", hosts: 2, request: req, ray: true}))
	require.Contains(t, out.String(), `"tensorlane.io/host": "h0"`)
	require.Contains(t, out.String(), `"strategy": "SPREAD"`)
	out.Reset()
	require.NoError(t, runPlace(nil, &out, placeOptions{preset: "dgx-h100", hosts: 2, request: req}))
	require.Contains(t, out.String(), "bundle 1")
	require.Contains(t, out.String(), "(2 hosts)")
	out.Reset()
	one := writeFile(t, "one.json", `{"bundles":[{"kind":"gpu","devices":2}]}`)
	require.NoError(t, runPlace(nil, &out, placeOptions{preset: "dgx-h100", hosts: 1, request: one}))
	require.Contains(t, out.String(), "(1 host)", "singular for one")
}

func TestPlaceBadInput(t *testing.T) {
	bad := writeFile(t, "bad.json", `{"bundles":[{"devices":-1}]}`)
	good := writeFile(t, "good.json", `{"bundles":[{"devices":1}]}`)
	for name, o := range map[string]placeOptions{
		"no request":       {preset: "dgx-h100"},
		"bad request":      {preset: "dgx-h100", request: bad},
		"missing file":     {preset: "dgx-h100", request: filepath.Join(t.TempDir(), "nope.json")},
		"unknown preset":   {preset: "nope", request: good},
		"negative racks":   {preset: "dgx-h100", racks: -1, request: good},
		"reserve no state": {preset: "dgx-h100", request: good, reserve: "x"},
		"bad state":        {preset: "dgx-h100", request: good, state: writeFile(t, "s.json", `{"failed_hosts":["zz"]}`)},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			require.Error(t, runPlace(nil, &out, o))
		})
	}
}

func TestPlaceStdin(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runPlace(bytes.NewBufferString(`{"bundles":[{"kind":"tpu","devices":4}],"topology":{"required":"slice"}}`), &out,
		placeOptions{preset: "tpu-v5p", racks: 1, request: "-", jsonOut: true}))
	require.Contains(t, out.String(), `"feasible": true`)
}
