package rdt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/privdir"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestParseVisible(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{"", nil, false},
		{"none", []int{}, false},
		{"0", []int{0}, false},
		{" 0, 2 ", []int{0, 2}, false},
		{"a", nil, true},
		{"-1", nil, true},
		{"1,,2", nil, true},
	} {
		got, err := parseVisible(tc.in)
		if tc.bad {
			assert.Error(t, err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

func TestVisibleDevices(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{5, 2}})
	require.NoError(t, err)
	defer r.Shutdown(ctx)
	assert.Equal(t, []tensor.DeviceID{tensor.HostDevice, tensor.GPUDevice(2), tensor.GPUDevice(5)}, r.Devices())
	_, err = r.Memory(tensor.GPUDevice(0))
	assert.ErrorIs(t, err, ErrUnknownDevice)

	none, err := New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, VisibleDevices: []int{}})
	require.NoError(t, err)
	assert.Equal(t, []tensor.DeviceID{tensor.HostDevice}, none.Devices())
	require.NoError(t, none.Shutdown(ctx))

	_, err = New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, VisibleDevices: []int{8}})
	assert.ErrorIs(t, err, ErrUnknownDevice, "dgx-h100 has gpu:0..7")

	t.Setenv(EnvDevices, "1,3")
	t.Setenv(EnvRuntimeDir, dir)
	e, err := New(ctx, Config{DeviceMemory: 1 << 20})
	require.NoError(t, err)
	assert.Equal(t, []tensor.DeviceID{tensor.HostDevice, tensor.GPUDevice(1), tensor.GPUDevice(3)}, e.Devices())
	require.NoError(t, e.Shutdown(ctx))
	t.Setenv(EnvDevices, "x")
	_, err = New(ctx, Config{})
	assert.ErrorContains(t, err, EnvDevices)
}

// Without TENSORLANE_DEVICES, the devices a scheduler handed the process
// through CUDA_VISIBLE_DEVICES are the ones the runtime claims.
func TestCUDAVisibleDevices(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "0,2", want: []int{0, 2}},
		{in: " 3 ", want: []int{3}},
		{in: "", want: []int{}},
		{in: "-1", want: []int{}},
		{in: "1,-1,2", want: []int{1}},
		{in: "GPU-8e6c0f3a", bad: true},
	} {
		got, err := parseCUDAVisible(tc.in)
		if tc.bad {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}

	ctx := context.Background()
	t.Setenv(EnvRuntimeDir, t.TempDir())
	t.Setenv(EnvDevices, "") // restored after the test, then unset for it
	os.Unsetenv(EnvDevices)
	t.Setenv(EnvCUDAVisible, "2")
	r, err := New(ctx, Config{DeviceMemory: 1 << 20})
	require.NoError(t, err)
	assert.Equal(t, []tensor.DeviceID{tensor.HostDevice, tensor.GPUDevice(2)}, r.Devices())
	require.NoError(t, r.Shutdown(ctx))

	t.Setenv(EnvDevices, "1")
	r, err = New(ctx, Config{DeviceMemory: 1 << 20})
	require.NoError(t, err)
	assert.Equal(t, []tensor.DeviceID{tensor.HostDevice, tensor.GPUDevice(1)}, r.Devices(), "TENSORLANE_DEVICES wins")
	require.NoError(t, r.Shutdown(ctx))
}

// The helper process for TestDeviceClaimsAcrossProcesses: a runtime that
// claims TENSORLANE_DEVICES of h0 and holds them until stdin closes.
func TestClaimHelperProcess(t *testing.T) {
	if os.Getenv("TL_CLAIM_HELPER") != "1" {
		t.Skip("helper process for TestDeviceClaimsAcrossProcesses")
	}
	ctx := context.Background()
	r, err := New(ctx, Config{DeviceMemory: 1 << 20})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("ready", r.Devices())
	bufio.NewReader(os.Stdin).ReadString('\n')
	r.Shutdown(ctx)
}

func TestDeviceClaimsAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TL_CLAIM_HELPER=1", EnvDevices+"=0,1", EnvRuntimeDir+"="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "ready", line)

	// Another process's gpu:1 is refused, clearly.
	_, err = New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{1, 2}})
	require.ErrorIs(t, err, ErrDeviceClaimed)
	var ce *DeviceClaimError
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, tensor.GPUDevice(1), ce.Device)
	assert.Equal(t, "h0", ce.Host)
	assert.Equal(t, cmd.Process.Pid, ce.PID)
	t.Log(err)

	// Disjoint devices of the same host are fine, and the refused attempt
	// left nothing claimed (gpu:2 is free).
	r, err := New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{2, 3}})
	require.NoError(t, err)
	// Runtimes of one process share its claims (in-process simulation).
	r2, err := New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{3}})
	require.NoError(t, err)
	require.NoError(t, r2.Shutdown(ctx))

	// A killed holder's claims go with it.
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	r3, err := New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{0, 1}})
	require.NoError(t, err)
	require.NoError(t, r3.Shutdown(ctx))
	require.NoError(t, r.Shutdown(ctx))
	stdin.Close()
	left, _ := os.ReadDir(dir)
	assert.Empty(t, left, "released claims leave no lock files")
}

// A lock file name planted as a symbolic link (another local user, or a
// stale link in a directory we were tricked into) is refused, and the file
// it points at is never opened for writing or truncated.
func TestClaimRefusesPlantedLockLink(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious\n"), 0o600))
	// Learn the lock's name from a first, honest claim.
	r, err := New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{0}})
	require.NoError(t, err)
	locks, _ := filepath.Glob(filepath.Join(dir, "*.lock"))
	require.Len(t, locks, 1)
	require.NoError(t, r.Shutdown(ctx))
	require.NoError(t, os.Symlink(victim, locks[0]))

	_, err = New(ctx, Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{0}})
	require.ErrorIs(t, err, privdir.ErrNotPrivate)
	got, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(got))
}

// A claims directory owned by another user is refused, not claimed
// through: its owner could swap any lock for a link.
func TestClaimRefusesAnotherUsersDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("planting another user's directory needs root")
	}
	dir := filepath.Join(t.TempDir(), "planted")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chown(dir, 54321, 54321))
	_, err := New(context.Background(), Config{IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 1 << 20, VisibleDevices: []int{0}})
	require.ErrorIs(t, err, privdir.ErrNotPrivate)
}
