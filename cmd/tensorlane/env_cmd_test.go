package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/cmd/internal/envinfo"
)

func TestEnvFromTrees(t *testing.T) {
	tests := []struct {
		tree   string
		accel  string
		comps  map[string]string
		distro string
	}{
		{"dgx-h100", "nvidia H100-SXM5-80GB", map[string]string{"nvidia-driver": "550.90.07", "mlx5_core": "24.04-0.7.0"}, "Ubuntu 22.04.4 LTS"},
		{"mi300x", "amd MI300X-192GB", map[string]string{"rocm": "6.2.1-112", "amdgpu-driver": "6.8.5"}, "Ubuntu 22.04.4 LTS"},
		{"trn2", "aws Trainium2", map[string]string{"neuron-driver": "2.18.12.0", "efa": "2.10.0g"}, "Amazon Linux 2023.5.20240805"},
		{"gaudi3", "intel Gaudi3-128GB", map[string]string{"habanalabs-driver": "1.18.0-524"}, "Ubuntu 22.04.4 LTS"},
	}
	for _, tt := range tests {
		t.Run(tt.tree, func(t *testing.T) {
			out, err := execCmd(t, newEnvCmd(), "--root", tree(tt.tree), "--json")
			require.NoError(t, err)
			var m envinfo.Manifest
			require.NoError(t, json.Unmarshal([]byte(out), &m))
			assert.Equal(t, tt.distro, m.Distribution)
			assert.Equal(t, "6.8.0-45-generic", m.Kernel)
			assert.Positive(t, m.Accelerators[tt.accel], "%v", m.Accelerators)
			for k, v := range tt.comps {
				assert.Equal(t, v, m.Components[k], k)
			}
			assert.NotEmpty(t, m.Go)
		})
	}
	out, err := execCmd(t, newEnvCmd(), "--root", tree("dgx-h100"))
	require.NoError(t, err)
	goldenFile(t, "env/dgx-h100.txt", out)
}

func TestEnvLive(t *testing.T) {
	out, err := execCmd(t, newEnvCmd())
	require.NoError(t, err)
	assert.Contains(t, out, "go:")
	out, err = execCmd(t, newEnvCmd(), "--json")
	require.NoError(t, err)
	assert.True(t, json.Valid([]byte(out)))
}

// A root that is not there fails clearly instead of reporting an empty
// machine (issue 19.7).
func TestEnvBadRoot(t *testing.T) {
	_, err := execCmd(t, newEnvCmd(), "--root", "/nonexistent")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "/nonexistent")
	_, err = execCmd(t, newEnvCmd(), "--root", "/etc/hostname")
	assert.ErrorContains(t, err, "not a directory")
}
