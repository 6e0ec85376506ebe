package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The protocol's own tests are in cmd/internal/worker; these check the flags.

func TestWorkerBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--hosts", "0"}, "need at least one host"},
		{[]string{"--device-memory", "lots"}, `bad size "lots"`},
		{[]string{"--device-memory", "4"}, "less than one 8-byte word"},
		{[]string{"--preset="}, `unknown preset ""`},
		{[]string{"--host-memory", "-1MiB"}, "bad size"},
		{[]string{"--preset", "nope"}, "nope"},
		{[]string{"--cluster-key-file", filepath.Join(t.TempDir(), "missing")}, "missing"},
		{[]string{"--host", "h9", "--rdma-ip", "127.0.0.1"}, `host "h9" is not in`},
	} {
		_, err := execCmd(t, newWorkerCmd(), c.args...)
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want, "%v", c.args)
	}
}

// A worker whose stdin is closed at once still comes up, says it is ready
// and shuts down cleanly.
func TestWorkerReadyAndExit(t *testing.T) {
	cmd := newWorkerCmd()
	cmd.SetIn(strings.NewReader(`{"id":1,"op":"exit"}` + "\n"))
	out, err := execCmd(t, cmd, "--device-memory", "8MiB", "--no-rdma")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	assert.Contains(t, lines[0], `"event":"ready"`)
	assert.Equal(t, `{"id":1,"ok":true}`, lines[1])
}
