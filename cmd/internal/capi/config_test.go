package capi

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/rdt/schema"
	"github.com/tensorlane/tensorlane/tensor/backend"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
	"github.com/tensorlane/tensorlane/tensor/hip"
	"github.com/tensorlane/tensorlane/tensor/hip/hiptest"
)

// jsonType is the Go type of each schema type in Config.
var jsonType = map[schema.Type]reflect.Type{
	schema.String:   reflect.TypeFor[string](),
	schema.Bool:     reflect.TypeFor[bool](),
	schema.Int:      reflect.TypeFor[int](),
	schema.Strings:  reflect.TypeFor[[]string](),
	schema.Ints:     reflect.TypeFor[[]int](),
	schema.ByteSize: reflect.TypeFor[schema.Size](),
	schema.Duration: reflect.TypeFor[schema.Seconds](),
	schema.HexKey:   reflect.TypeFor[string](),
	schema.OptBool:  reflect.TypeFor[*bool](),
}

// Config holds exactly the schema's JSON fields: Go name, JSON key and type.
func TestConfigMatchesSchema(t *testing.T) {
	ct := reflect.TypeFor[Config]()
	var have, want []string
	for f := range ct.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		have = append(have, tag)
		sf, ok := schema.Lookup(tag)
		if assert.True(t, ok, "Config.%s: json %q is no schema field", f.Name, tag) {
			assert.Equal(t, sf.GoName(), f.Name, tag)
			assert.Equal(t, jsonType[sf.Type], f.Type, "Config.%s", f.Name)
		}
	}
	for _, f := range schema.Of(schema.JSON) {
		want = append(want, f.Name)
	}
	slices.Sort(have)
	slices.Sort(want)
	assert.Equal(t, want, have)
}

// Every field reaches rdt.Config, by its new name and by its old one.
func TestConfigToRuntime(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte(slabKey+"\n"), 0o600))
	priv, _, err := crypto.GenerateEd25519Key(nil)
	require.NoError(t, err)
	pid, err := peer.IDFromPrivateKey(priv)
	require.NoError(t, err)
	for _, c := range []struct {
		name, in string
		check    func(t *testing.T, rc rdt.Config)
	}{
		{"transports", `{"listen_addrs":["/ip4/127.0.0.1/tcp/0"],"data_addr":"127.0.0.1:0","allow_transports":["tcp","shm"],"deny_transports":["rdma"],"disable_rdma":true,"rdma_provider":"soft"}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Equal(t, []string{"/ip4/127.0.0.1/tcp/0"}, rc.ListenAddrs)
				assert.Equal(t, "127.0.0.1:0", rc.DataAddr)
				assert.Equal(t, []string{"tcp", "shm"}, rc.AllowTransports)
				assert.Equal(t, []string{"rdma"}, rc.DenyTransports)
				assert.True(t, rc.DisableRDMA)
				assert.Equal(t, "soft", rc.RDMAProvider)
			}},
		{"old names", `{"listen":["/ip4/127.0.0.1/tcp/0"],"allow":["tcp"],"deny":["rdma"],"transfer_timeout_ms":1500}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Equal(t, []string{"/ip4/127.0.0.1/tcp/0"}, rc.ListenAddrs)
				assert.Equal(t, []string{"tcp"}, rc.AllowTransports)
				assert.Equal(t, []string{"rdma"}, rc.DenyTransports)
				assert.Equal(t, 1500*time.Millisecond, rc.TransferTimeout)
			}},
		{"security", `{"cluster_key":"` + slabKey + `","allow_peers":["` + pid.String() + `"],"encrypt_data":true}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Len(t, rc.ClusterKey, 32)
				assert.Equal(t, []peer.ID{pid}, rc.AllowPeers)
				assert.True(t, rc.EncryptData)
			}},
		{"key and identity files", `{"cluster_key_file":"` + keyFile + `","identity_file":"` + filepath.Join(dir, "id") + `"}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Len(t, rc.ClusterKey, 32)
				assert.NotNil(t, rc.Identity)
			}},
		{"timers", `{"transfer_timeout":"1m","stall_timeout":5,"lease_renew":"2s","lease_expiry":7,"heartbeat_interval":0.25,"heartbeat_misses":4,"inbox_size":16}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Equal(t, time.Minute, rc.TransferTimeout)
				assert.Equal(t, 5*time.Second, rc.StallTimeout)
				assert.Equal(t, 2*time.Second, rc.LeaseRenew)
				assert.Equal(t, 7*time.Second, rc.LeaseExpiry)
				assert.Equal(t, 250*time.Millisecond, rc.HeartbeatInterval)
				assert.Equal(t, 4, rc.HeartbeatMisses)
				assert.Equal(t, 16, rc.InboxSize)
			}},
		{"devices", `{"device_backend":"sim","visible_devices":[0,2],"device_memory":"16MiB","runtime_dir":"` + dir + `"}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Equal(t, "sim", rc.DeviceBackend)
				assert.Equal(t, []int{0, 2}, rc.VisibleDevices)
				assert.EqualValues(t, 16<<20, rc.DeviceMemory)
				assert.Equal(t, dir, rc.RuntimeDir)
				assert.Nil(t, rc.Devices, "a device back-end gives the runtime the host's accelerators")
			}},
		{"no devices", `{"visible_devices":[]}`,
			func(t *testing.T, rc rdt.Config) {
				assert.Equal(t, []int{}, rc.VisibleDevices)
				assert.Len(t, rc.Devices, 1, "host memory only")
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(c.in))
			require.NoError(t, err)
			rc, owned, err := cfg.rdtConfig(context.Background())
			require.NoError(t, err)
			for _, m := range owned {
				defer m.Close()
			}
			c.check(t, rc)
		})
	}
}

// A bad field is invalid_argument naming the field, with a suggestion for a
// misspelt one.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ in, field, want string }{
		{`{"encrypt":true}`, "encrypt", `did you mean "encrypt_data"`},
		{`{"psk":"00"}`, "psk", "unknown field"},
		{`{"stall_timeout":"soon"}`, "stall_timeout", "a duration"},
		{`{"cluster_key":"00"}`, "cluster_key", "64 hex digits"},
		{`{"allow_peers":["nope"]}`, "allow_peers", "not a peer ID"},
		{`{"allow_transports":["pigeon"]}`, "allow_transports", "unknown transport"},
		{`{"preset":"nope"}`, "preset", "nope"},
		{`{"host":"h9"}`, "host", "not in cluster"},
		{`{"log_level":"loud"}`, "log_level", "loud"},
		{`{"cluster_key":"` + slabKey + `","cluster_key_file":"/x"}`, "cluster_key", "not both"},
		{`{"slabs":true,"device_backend":"sim","cluster_key":"` + slabKey + `"}`, "slabs", "host memory"},
	} {
		t.Run(c.field, func(t *testing.T) {
			_, err := New().NewRuntime(context.Background(), []byte(c.in))
			require.Error(t, err)
			assert.Equal(t, "invalid_argument", Kinds[Code(err)], err.Error())
			assert.ErrorIs(t, err, ErrInvalidArgument)
			var fe *schema.FieldError
			require.ErrorAs(t, err, &fe, err.Error())
			assert.Equal(t, c.field, fe.Field)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// device_backend and visible_devices choose a runtime's GPUs from the
// config alone, with no TENSORLANE_DEVICE_BACKEND or *_VISIBLE_DEVICES (on
// the fake CUDA driver and the fake libamdhip64).
func TestDeviceBackendField(t *testing.T) {
	for _, name := range []string{backend.EnvMode, rdt.EnvDevices, "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"} {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
	for _, c := range []struct {
		config string
		setup  func(t *testing.T)
		want   []string
		dev    Device
	}{
		{`{"device_backend":"cuda","visible_devices":[0,1]}`, func(t *testing.T) {
			cudatest.NoLeaks(t)
			t.Setenv(cuda.LibraryEnv, cudatest.FakeLibrary(t))
		}, []string{"cpu:0=host", "gpu:0=cuda", "gpu:1=cuda"}, Device{Type: DLCUDA, Index: 1}},
		{`{"device_backend":"hip","visible_devices":[1]}`, func(t *testing.T) {
			hiptest.NoLeaks(t)
			t.Setenv(hip.LibraryEnv, hiptest.FakeLibrary(t))
		}, []string{"cpu:0=host", "gpu:1=hip"}, Device{Type: DLROCM, Index: 0}},
		{`{"device_backend":"sim","visible_devices":[2]}`, func(t *testing.T) {}, []string{"cpu:0=host", "gpu:2=sim"}, Device{}},
	} {
		t.Run(c.config, func(t *testing.T) {
			c.setup(t)
			_, a, _ := pair(t, c.config)
			var got []string
			for _, s := range a.Rdt().MemoryStats() {
				got = append(got, s.Device.String()+"="+s.Backend)
			}
			assert.Equal(t, c.want, got)
			if c.dev.Type == 0 {
				return
			}
			p, err := a.DeviceAlloc(context.Background(), c.dev, 64)
			require.NoError(t, err)
			require.NoError(t, a.DeviceFree(p))
		})
	}
}
