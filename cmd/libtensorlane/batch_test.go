package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCBatch builds the shared library and runs testdata/batch_abi_test.c
// against tensorlane.h: the batch entry points with good and hostile input.
func TestCBatch(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the C ABI test needs it (apt-get install gcc)")
	}
	dir := t.TempDir()
	so := filepath.Join(dir, "libtensorlane.so")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", so, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	outp, err := build.CombinedOutput()
	require.NoError(t, err, "%s", outp)
	bin := filepath.Join(dir, "batch_abi_test")
	outp, err = exec.Command("gcc", "-Wall", "-Wextra", "-Werror", "-I.", "-o", bin, "testdata/batch_abi_test.c",
		"-L"+dir, "-ltensorlane").CombinedOutput()
	require.NoError(t, err, "%s", outp)
	run := exec.Command(bin)
	run.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "TENSORLANE_TRANSPORTS=", "TENSORLANE_SLABS=")
	outp, err = run.CombinedOutput()
	require.NoError(t, err, "%s", outp)
	assert.Contains(t, string(outp), "all batch checks passed")
}
