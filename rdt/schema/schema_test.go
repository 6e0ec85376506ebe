package schema

import (
	"bytes"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The table itself: names are snake_case and unique, aliases name no other
// field and no other alias, every field has a doc and at least one layer.
func TestTable(t *testing.T) {
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	seen := map[string]string{}
	for _, f := range Fields() {
		assert.Regexp(t, snake, f.Name)
		assert.NotEmpty(t, f.Doc, f.Name)
		assert.NotZero(t, f.Layers, f.Name)
		assert.Empty(t, seen[f.Name], "%s defined twice", f.Name)
		seen[f.Name] = f.Name
	}
	for _, f := range Fields() {
		for _, a := range f.Aliases {
			assert.NotZero(t, a.Layer&f.Layers, "%s: alias %s of a layer the field is not in", f.Name, a.Name)
			if other, ok := seen[a.Name]; ok && other != f.Name {
				assert.Failf(t, "alias clash", "%s: alias %s is taken by %s", f.Name, a.Name, other)
			}
			seen[a.Name] = f.Name
		}
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct{ name, goName, flag string }{
		{"listen_addrs", "ListenAddrs", "listen-addrs"},
		{"disable_rdma", "DisableRDMA", "disable-rdma"},
		{"rdma_ip", "RDMAIP", "rdma-ip"},
		{"cluster_key", "ClusterKey", "cluster-key"},
		{"heartbeat_interval", "HeartbeatInterval", "heartbeat-interval"},
	} {
		f := Field{Name: c.name}
		assert.Equal(t, c.goName, f.GoName(), c.name)
		assert.Equal(t, c.flag, f.Flag(), c.name)
	}
}

// doc is a struct of every JSON field, as the C ABI's Config holds them.
type doc struct {
	Preset          string   `json:"preset"`
	ListenAddrs     []string `json:"listen_addrs"`
	AllowTransports []string `json:"allow_transports"`
	DenyTransports  []string `json:"deny_transports"`
	TransferTimeout Seconds  `json:"transfer_timeout"`
	HostMemory      Size     `json:"host_memory"`
	StagePoolBytes  Size     `json:"stage_pool_bytes"`
	ClusterKey      string   `json:"cluster_key"`
	EncryptData     bool     `json:"encrypt_data"`
	HeartbeatMisses int      `json:"heartbeat_misses"`
	VisibleDevices  []int    `json:"visible_devices"`
	Slabs           *bool    `json:"slabs"`
}

const key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

func TestDecode(t *testing.T) {
	yes := true
	for _, c := range []struct {
		name, in string
		want     doc
		err      error  // errors.Is
		field    string // FieldError.Field
		suggest  string
		warn     string // in the log
		msg      string // in the error
	}{
		{name: "empty", in: ""},
		{name: "fields", in: `{"preset":"dgx-h100","listen_addrs":["/ip4/1.2.3.4/tcp/1"],"encrypt_data":true,"heartbeat_misses":5,"slabs":true}`,
			want: doc{Preset: "dgx-h100", ListenAddrs: []string{"/ip4/1.2.3.4/tcp/1"}, EncryptData: true, HeartbeatMisses: 5, Slabs: &yes}},
		{name: "durations in seconds", in: `{"transfer_timeout":1.5}`, want: doc{TransferTimeout: Seconds(1500 * time.Millisecond)}},
		{name: "durations as strings", in: `{"transfer_timeout":"2m"}`, want: doc{TransferTimeout: Seconds(2 * time.Minute)}},
		{name: "sizes", in: `{"host_memory":"64MiB","stage_pool_bytes":-1}`, want: doc{HostMemory: 64 << 20, StagePoolBytes: -1}},
		{name: "alias", in: `{"allow":["tcp"]}`, want: doc{AllowTransports: []string{"tcp"}}, warn: "old=allow new=allow_transports"},
		{name: "millisecond alias", in: `{"transfer_timeout_ms":250}`, want: doc{TransferTimeout: Seconds(250 * time.Millisecond)}, warn: "old=transfer_timeout_ms"},
		{name: "alias and field", in: `{"listen":[],"listen_addrs":[]}`, err: ErrConflict, field: "listen"},
		{name: "unknown with suggestion", in: `{"encrypt_dat":true}`, err: ErrUnknownField, field: "encrypt_dat", suggest: "encrypt_data"},
		{name: "old PSK name", in: `{"psk":"00"}`, err: ErrUnknownField, field: "psk"},
		{name: "unknown far from all", in: `{"zzzzzzzzzz":1}`, err: ErrUnknownField, field: "zzzzzzzzzz"},
		{name: "worker-only field", in: `{"verbose":true}`, err: ErrUnknownField, field: "verbose", msg: "a setting of worker only"},
		{name: "wrong type", in: `{"heartbeat_misses":"3"}`, err: ErrBadValue, field: "heartbeat_misses"},
		{name: "fraction", in: `{"heartbeat_misses":1.5}`, err: ErrBadValue, field: "heartbeat_misses"},
		{name: "bad size", in: `{"host_memory":"lots"}`, err: ErrBadValue, field: "host_memory"},
		{name: "negative size", in: `{"host_memory":-5}`, err: ErrBadValue, field: "host_memory"},
		{name: "negative duration", in: `{"transfer_timeout":-1}`, err: ErrBadValue, field: "transfer_timeout"},
		{name: "bad key", in: `{"cluster_key":"abc"}`, err: ErrBadValue, field: "cluster_key"},
		{name: "good key", in: `{"cluster_key":"` + key + `"}`, want: doc{ClusterKey: key}},
		{name: "bad device list", in: `{"visible_devices":[-1]}`, err: ErrBadValue, field: "visible_devices"},
		{name: "strings list", in: `{"allow_transports":"tcp"}`, err: ErrBadValue, field: "allow_transports"},
	} {
		t.Run(c.name, func(t *testing.T) {
			warned.Clear()
			var buf bytes.Buffer
			var got doc
			err := Decode([]byte(c.in), JSON, &got, slog.New(slog.NewTextHandler(&buf, nil)))
			if c.err != nil {
				require.ErrorIs(t, err, c.err)
				var fe *FieldError
				require.ErrorAs(t, err, &fe)
				assert.Equal(t, c.field, fe.Field)
				assert.Equal(t, c.suggest, fe.Suggest)
				assert.Contains(t, err.Error(), c.field)
				assert.Contains(t, err.Error(), c.msg)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			if c.warn != "" {
				assert.Contains(t, buf.String(), c.warn)
			}
		})
	}
}

// An alias warns once per process.
func TestDeprecatedWarnsOnce(t *testing.T) {
	warned.Clear()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	for range 3 {
		var d doc
		require.NoError(t, Decode([]byte(`{"deny":["rdma"]}`), JSON, &d, log))
	}
	assert.Equal(t, 1, bytes.Count(buf.Bytes(), []byte("old=deny")))
}

// A struct missing a field of its layer is refused: the layer and the table
// must agree.
func TestDecodeIntoStructMissingAField(t *testing.T) {
	var d struct{}
	err := Decode([]byte(`{"preset":"x"}`), JSON, &d, nil)
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrUnknownField))
}

func TestSuggest(t *testing.T) {
	for _, c := range []struct{ key, want string }{
		{"hearbeat_interval", "heartbeat_interval"},
		{"transports", "allow_transports"},
		{"ClusterKey", "cluster_key"}, // the Go spelling
		{"DisableRDMA", "disable_rdma"},
		{"psk", ""},
		{"cluster-key", "cluster_key"},
		{"stall", "stall_timeout"},
	} {
		assert.Equal(t, c.want, Suggest(c.key, JSON), c.key)
	}
}

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"4096", 4096, false}, {"64MiB", 64 << 20, false}, {"64M", 64 << 20, false}, {"1.5GiB", 3 << 29, false},
		{"1GB", 1e9, false}, {"-1", -1, false}, {"8 KiB", 8 << 10, false},
		{"lots", 0, true}, {"", 0, true}, {"1XB", 0, true},
	} {
		got, err := ParseSize(c.in)
		if c.bad {
			assert.Error(t, err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
}

// workerish holds every Worker field, as worker.Config does.
type workerish struct {
	Preset, Host, DataAddr, RDMAProvider, RDMAIP, IdentityFile, ClusterKeyFile, DeviceBackend string
	Hosts, HeartbeatMisses                                                                    int
	ListenAddrs, AllowTransports, DenyTransports, AllowPeers                                  []string
	DisableRDMA, EncryptData, Verbose                                                         bool
	DeviceMemory, HostMemory                                                                  int64
	TransferTimeout, StallTimeout, LeaseRenew, LeaseExpiry, HeartbeatInterval                 time.Duration
}

func TestBindFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want workerish
		err  string
	}{
		{name: "none"},
		{name: "names", args: []string{"--listen-addrs", "/ip4/1.2.3.4/tcp/1", "--encrypt-data", "--host-memory", "1GiB", "--stall-timeout", "5s", "--hosts", "2", "-v"},
			want: workerish{ListenAddrs: []string{"/ip4/1.2.3.4/tcp/1"}, EncryptData: true, HostMemory: 1 << 30, StallTimeout: 5 * time.Second, Hosts: 2, Verbose: true}},
		{name: "aliases", args: []string{"--encrypt", "--no-rdma", "--transports", "tcp,shm", "--listen", "/ip4/1.2.3.4/tcp/1"},
			want: workerish{EncryptData: true, DisableRDMA: true, AllowTransports: []string{"tcp", "shm"}, ListenAddrs: []string{"/ip4/1.2.3.4/tcp/1"}}},
		{name: "bad size", args: []string{"--host-memory", "-1MiB"}, err: "bad size"},
		{name: "json-only field", args: []string{"--cluster-key", key}, err: "unknown flag"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("w", pflag.ContinueOnError)
			fs.SetOutput(&bytes.Buffer{})
			var got workerish
			require.NoError(t, BindFlags(fs, &got, Worker, map[string]string{"verbose": "v"}))
			err := fs.Parse(c.args)
			if c.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

// BindFlags refuses a struct that lacks a field of the layer or holds it
// in the wrong type.
func TestBindFlagsChecksTheStruct(t *testing.T) {
	fs := pflag.NewFlagSet("w", pflag.ContinueOnError)
	var missing struct{ Preset string }
	assert.ErrorContains(t, BindFlags(fs, &missing, Worker, nil), "has no field")
	var wrong workerish
	type bad struct {
		workerish
		Hosts string
	}
	_ = wrong
	assert.ErrorContains(t, BindFlags(pflag.NewFlagSet("w", pflag.ContinueOnError), &bad{}, Worker, nil), "Hosts")
}

// TestPlainDefaultsParse: every Duration and Int field whose default is a
// value (not prose such as "3 × lease_renew") parses, so DefaultDuration
// and DefaultInt serve the code that applies defaults.
func TestPlainDefaultsParse(t *testing.T) {
	assert.Equal(t, 2*time.Minute, DefaultDuration("transfer_timeout"))
	assert.Equal(t, 1024, DefaultInt("inbox_size"))
	for _, f := range Fields() {
		switch {
		case f.Type == Duration && f.Default != "" && !strings.Contains(f.Default, "×"):
			assert.NotPanics(t, func() { DefaultDuration(f.Name) }, f.Name)
		case f.Type == Int && f.Default != "" && f.Default[0] >= '0' && f.Default[0] <= '9':
			assert.NotPanics(t, func() { DefaultInt(f.Name) }, f.Name)
		}
	}
	assert.Panics(t, func() { DefaultDuration("inbox_size") })
	assert.Panics(t, func() { DefaultInt("no_such_field") })
}
