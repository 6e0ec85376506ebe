package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/rdt/schema"
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
		{[]string{"--encrypt-dta"}, "did you mean --encrypt-data?"},
		{[]string{"--stall"}, "did you mean --stall-timeout?"},
		{[]string{"--cluster-key", "00"}, "did you mean --cluster-key-file?"},
		{[]string{"--stall-timeout", "-1s"}, "must not be negative"},
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

// The worker's flags are the schema's worker fields, by their flag names;
// old names set the same fields.
func TestWorkerFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want worker.Config
	}{
		{"defaults", nil, worker.Config{}},
		{"names", []string{"--listen-addrs", "/ip4/10.0.0.2/tcp/4001", "--allow-transports", "tcp", "--deny-transports", "shm", "--disable-rdma",
			"--encrypt-data", "--allow-peers", "a,b", "--cluster-key-file", "/k", "--heartbeat-interval", "2s", "--heartbeat-misses", "5",
			"--lease-expiry", "1m", "--device-backend", "sim", "--device-memory", "8MiB", "--host-memory", "1GiB", "--rdma-provider", "soft"},
			worker.Config{ListenAddrs: []string{"/ip4/10.0.0.2/tcp/4001"}, AllowTransports: []string{"tcp"}, DenyTransports: []string{"shm"}, DisableRDMA: true,
				EncryptData: true, AllowPeers: []string{"a", "b"}, ClusterKeyFile: "/k", HeartbeatInterval: 2 * time.Second, HeartbeatMisses: 5,
				LeaseExpiry: time.Minute, DeviceBackend: "sim", DeviceMemory: 8 << 20, HostMemory: 1 << 30, RDMAProvider: "soft"}},
		{"old names", []string{"--listen", "/ip4/10.0.0.2/tcp/4001", "--transports", "tcp", "--no-rdma", "--encrypt"},
			worker.Config{ListenAddrs: []string{"/ip4/10.0.0.2/tcp/4001"}, AllowTransports: []string{"tcp"}, DisableRDMA: true, EncryptData: true}},
		{"device memory in words", []string{"--device-memory", "1001"}, worker.Config{DeviceMemory: 1000}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := newWorkerCmd()
			require.NoError(t, cmd.ParseFlags(c.args))
			var got worker.Config
			// Read back what the flags wrote, through the same binding.
			fs := pflag.NewFlagSet("w", pflag.ContinueOnError)
			require.NoError(t, schema.BindFlags(fs, &got, schema.Worker, map[string]string{"verbose": "v"}))
			require.NoError(t, fs.Parse(c.args))
			got, err := workerConfig(fs, got)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
	// Every flag is a schema field or a hidden old name.
	fields := map[string]bool{}
	for _, f := range schema.Of(schema.Worker) {
		fields[f.Flag()] = true
	}
	newWorkerCmd().Flags().VisitAll(func(f *pflag.Flag) {
		assert.True(t, fields[f.Name] || f.Hidden, "--%s is no schema field", f.Name)
	})
}
