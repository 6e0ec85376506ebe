package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/bench/devbench"
	"github.com/tensorlane/tensorlane/internal/testhelp"
)

// TestMain lets a test run this binary as the command itself: with
// TENSORLANE_TEST_MAIN set, the test binary is `tensorlane` (main()).
func TestMain(m *testing.M) {
	if code, ok := devbench.Owner(); ok { // the device bench's owner process
		os.Exit(code)
	}
	if os.Getenv("TENSORLANE_TEST_MAIN") == "1" {
		os.Args = append([]string{"tensorlane"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(testhelp.Isolated(m).Run())
}

// runMain runs the command in a child process and returns its stdout,
// stderr and exit code.
func runMain(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TENSORLANE_TEST_MAIN=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errOut.String(), code
}

// The exit codes scripts rely on: 0 on success, 1 with "tensorlane: <why>"
// on stderr for bad flags, bad input and failed checks.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"topo", "--preset", "dgx-h100"}, 0, ""},
		{[]string{"topo", "--preset", "nope"}, 1, "tensorlane: "},
		{[]string{"demo", "--hosts", "0"}, 1, "tensorlane: hosts, readers, tensors and steps must be at least 1"},
		{[]string{"soak", "--runtimes", "1"}, 1, "tensorlane: soak: need --runtimes >= 2"},
		{[]string{"worker", "--device-memory", "lots"}, 1, `tensorlane: invalid argument "lots" for "--device-memory" flag: bad size "lots"`},
		{[]string{"env", "--root", "/nonexistent"}, 1, "tensorlane: env: --root"},
		{[]string{"no-such-command"}, 1, "tensorlane: unknown command"},
	} {
		out, errOut, code := runMain(t, c.args...)
		assert.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		if c.stderr != "" {
			assert.True(t, strings.HasPrefix(errOut, c.stderr), "%v: stderr %q", c.args, errOut)
		} else {
			assert.Empty(t, errOut, "%v", c.args)
			assert.NotEmpty(t, out, "%v", c.args)
		}
	}
}
