package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
)

// The test binary plays both roles: the reader re-executes it as the owner.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "owner" {
		if err := owner(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(testhelp.Isolated(m).Run())
}

func TestTwoProcesses(t *testing.T) {
	// Both processes claim devices in one directory (a test binary would
	// otherwise get a private one).
	t.Setenv(rdt.EnvRuntimeDir, t.TempDir())
	t.Setenv(rdt.EnvDevices, "")
	t.Setenv("TENSORLANE_TRANSPORTS", "")
	var out bytes.Buffer
	require.NoError(t, reader(&out))
	t.Log(out.String())
	assert.Contains(t, out.String(), "got float32[1024 1024] on gpu:1 over p2p: v[1000]=1000")
	assert.Contains(t, out.String(), "claim of gpu:0 refused: held by the owner process: true")
}
