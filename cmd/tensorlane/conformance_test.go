package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology/topocheck"
)

func TestConformanceCommand(t *testing.T) {
	trees := filepath.Join("..", "..", "topology", "testdata", "sysfs")
	out, err := execCmd(t, newConformanceCmd(), "--plugin", "nvidia", "--json", "--trees", trees)
	require.NoError(t, err)
	var reps []topocheck.Report
	require.NoError(t, json.Unmarshal([]byte(out), &reps))
	require.Len(t, reps, 1)
	assert.True(t, reps[0].OK())
	assert.Equal(t, "nvidia", reps[0].Plugin)
	// Levels by name, as the table prints them (issue 19.7).
	assert.Regexp(t, `"declared": "(experimental|alpha|beta|stable)"`, out)
	assert.Regexp(t, `"verified": "(none|experimental|alpha|beta|stable)"`, out)

	out, err = execCmd(t, newConformanceCmd(), "--plugin", "gaudi", "-v", "--trees", trees)
	require.NoError(t, err)
	assert.Contains(t, out, "PLUGIN")
	assert.Contains(t, out, "skip stable")

	_, err = execCmd(t, newConformanceCmd(), "--plugin", "nope")
	assert.Error(t, err)
}
