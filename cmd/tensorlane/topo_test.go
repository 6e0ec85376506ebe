package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/topology"
)

// goldenFile compares got with testdata/<name>, rewriting it with -update.
func goldenFile(t *testing.T, name, got string) {
	t.Helper()
	testhelp.Golden(t, filepath.Join("testdata", name), []byte(got))
}

func execCmd(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{}, args...)) // never nil: cobra would read os.Args
	err := cmd.Execute()
	return out.String(), err
}

func tree(name string) string {
	return filepath.Join("..", "..", "topology", "testdata", "sysfs", name)
}

func TestTopoGolden(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"dgx-h100.tree", []string{"--sysfs-root", tree("dgx-h100")}},
		{"dgx-h100.matrix", []string{"--sysfs-root", tree("dgx-h100"), "-m"}},
		{"dgx-h100.json", []string{"--sysfs-root", tree("dgx-h100"), "--json"}},
		{"mi300x.matrix", []string{"--sysfs-root", tree("mi300x"), "-m"}},
		{"tpu-v5p.tree", []string{"--sysfs-root", tree("tpu-v5p")}},
		{"trn2.matrix", []string{"--sysfs-root", tree("trn2"), "-m"}},
		{"gaudi3.tree", []string{"--sysfs-root", tree("gaudi3")}},
		{"vm.tree", []string{"--sysfs-root", tree("vm")}},
		{"vm.json", []string{"--sysfs-root", tree("vm"), "--json"}},
		{"gb200-nvl72-x36.tree", []string{"--preset", "gb200-nvl72", "--hosts", "36"}},
		{"tpu-v5p-x8.json", []string{"--preset", "tpu-v5p", "--hosts", "8", "--slice", "2x2x4", "--host", "h5"}},
		{"mi355x.dot", []string{"--preset", "mi355x", "--dot"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := execCmd(t, newTopoCmd(), tt.args...)
			require.NoError(t, err)
			goldenFile(t, filepath.Join("topo", tt.name), out)
		})
	}
}

func TestTopoJSONShape(t *testing.T) {
	out, err := execCmd(t, newTopoCmd(), "--preset", "gb200-nvl72", "--hosts", "20", "--json")
	require.NoError(t, err)
	var v struct {
		Hosts []struct {
			Name    string `json:"name"`
			NUMA    []any  `json:"numa"`
			Devices []struct {
				ID         string `json:"id"`
				Kind       string `json:"kind"`
				Vendor     string `json:"vendor"`
				Model      string `json:"model"`
				NUMA       *int   `json:"numa"`
				NearestNIC string `json:"nearest_nic"`
			} `json:"devices"`
			NICs []any `json:"nics"`
		} `json:"hosts"`
		Domains []struct {
			Kind    string   `json:"kind"`
			Devices []string `json:"devices"`
		} `json:"domains"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Len(t, v.Hosts, 20)
	h := v.Hosts[19]
	assert.Equal(t, "h19", h.Name)
	assert.Len(t, h.NUMA, 2)
	assert.Len(t, h.NICs, 4)
	require.Len(t, h.Devices, 4)
	assert.Equal(t, "h19/2", h.Devices[2].ID)
	assert.Equal(t, "mlx5_2", h.Devices[2].NearestNIC)
	assert.NotNil(t, h.Devices[2].NUMA)
	kinds := map[string]int{}
	for _, d := range v.Domains {
		kinds[d.Kind]++
	}
	assert.Equal(t, map[string]int{"nvlink": 2, "rack": 2}, kinds)
	assert.Len(t, v.Domains[0].Devices, 72)
}

func TestTopoDumpRoundTrip(t *testing.T) {
	out, err := execCmd(t, newTopoCmd(), "--sysfs-root", tree("mi300x"), "--dump")
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "mi300x.json")
	require.NoError(t, os.WriteFile(p, []byte(out), 0o644))
	again, err := execCmd(t, newTopoCmd(), "--file", p, "--dump")
	require.NoError(t, err)
	assert.Equal(t, out, again)
	_, err = topology.LoadFile(p)
	require.NoError(t, err)
	m1, err := execCmd(t, newTopoCmd(), "--sysfs-root", tree("mi300x"), "-m")
	require.NoError(t, err)
	m2, err := execCmd(t, newTopoCmd(), "--file", p, "-m")
	require.NoError(t, err)
	assert.Equal(t, m1, m2)
}

func TestTopoBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"--preset", "nope"},
		{"--preset", "dgx-h100", "--hosts", "0"},
		{"--preset", "dgx-h100", "--file", "x"},
		{"--file", filepath.Join(t.TempDir(), "missing.json")},
		{"--sysfs-root", filepath.Join(t.TempDir(), "missing")},
		{"--preset", "dgx-h100", "--host", "h9"},
		{"--preset", "gb200-nvl72", "--hosts-per-rack", "19"},
		{"extra-arg"},
	} {
		_, err := execCmd(t, newTopoCmd(), args...)
		assert.Error(t, err, "%v", args)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"format":"tensorlane-topology","version":1,"hosts":[{"id":"a"},{"id":"a"}]}`), 0o644))
	_, err := execCmd(t, newTopoCmd(), "--file", bad)
	assert.ErrorIs(t, err, topology.ErrBadFile)
}

func TestTopoLive(t *testing.T) {
	out, err := execCmd(t, newTopoCmd())
	require.NoError(t, err)
	assert.Contains(t, out, "host ")
	out, err = execCmd(t, newTopoCmd(), "--json")
	require.NoError(t, err)
	assert.True(t, json.Valid([]byte(out)))
	_, err = execCmd(t, newTopoCmd(), "-m")
	require.NoError(t, err)
}

func TestTopoRegistered(t *testing.T) {
	names := map[string]bool{}
	for _, c := range rootCmd.Commands() {
		names[c.Name()] = true
	}
	for _, n := range []string{"topo", "env", "conformance"} {
		assert.True(t, names[n], n)
	}
	assert.True(t, strings.Contains(newTopoCmd().Long, "gb200-nvl72"))
}

// The DOT output renders, and Graphviz shows two-line labels, not a literal
// "\n" (issue 19.7). Needs Graphviz's dot: .ci/run installs it.
func TestDotRendersWithGraphviz(t *testing.T) {
	dot, err := exec.LookPath("dot")
	if err != nil {
		t.Skip("Graphviz dot is not installed (apt-get install graphviz); .ci/run installs it")
	}
	out, err := execCmd(t, newTopoCmd(), "--preset", "dgx-h100", "--dot")
	require.NoError(t, err)
	cmd := exec.Command(dot, "-Tsvg")
	cmd.Stdin = strings.NewReader(out)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	svg, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	texts := regexp.MustCompile(`<text[^>]*>([^<]*)</text>`).FindAllStringSubmatch(string(svg), -1)
	require.NotEmpty(t, texts)
	var all []string
	for _, m := range texts {
		all = append(all, m[1])
		assert.NotContains(t, m[1], `\n`, "a literal \\n in a rendered label")
	}
	assert.Contains(t, all, "NUMA 0", "the NUMA label's first line")
	assert.Contains(t, all, "GPU0", "the device label's first line")
}

func TestTopoRayLabels(t *testing.T) {
	var out, errb bytes.Buffer
	err := runTopo(t.Context(), &out, &errb, topoOptions{preset: "tpu-v5p", hosts: 2, rayLabels: true})
	require.NoError(t, err)
	assert.Contains(t, out.String(), `ray start --labels="ray.io/accelerator-type=tpu-v5p,ray.io/tpu-slice-name=slice0,tensorlane.io/host=h1,`)
	assert.Contains(t, out.String(), "# h0 (simulated, preset)")
}
