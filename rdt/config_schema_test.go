package rdt

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt/schema"
)

// goTypes is the Go type of each schema type in rdt.Config (by kind where
// a named type stands in, as peer.ID does for a string).
func goTypeFits(t schema.Type, rt reflect.Type) bool {
	switch t {
	case schema.String:
		return rt.Kind() == reflect.String
	case schema.Bool:
		return rt.Kind() == reflect.Bool
	case schema.Int:
		return rt.Kind() == reflect.Int
	case schema.Strings:
		return rt.Kind() == reflect.Slice && rt.Elem().Kind() == reflect.String
	case schema.Ints:
		return rt == reflect.TypeFor[[]int]()
	case schema.ByteSize:
		return rt.Kind() == reflect.Int64
	case schema.Duration:
		return rt == reflect.TypeFor[time.Duration]()
	case schema.HexKey:
		return rt == reflect.TypeFor[[]byte]()
	}
	return false
}

// rdt.Config holds exactly the schema's Go fields (by their Go names, in
// types that fit) and the live objects schema.GoOnly names.
func TestConfigMatchesSchema(t *testing.T) {
	ct := reflect.TypeFor[Config]()
	var have []string
	for f := range ct.Fields() {
		have = append(have, f.Name)
	}
	var want []string
	for _, f := range schema.Of(schema.Go) {
		want = append(want, f.GoName())
		sf, ok := ct.FieldByName(f.GoName())
		if assert.True(t, ok, "rdt.Config has no field %s (schema %s)", f.GoName(), f.Name) {
			assert.True(t, goTypeFits(f.Type, sf.Type), "rdt.Config.%s is %s, the schema says %s", sf.Name, sf.Type, f.Type)
		}
	}
	want = append(want, schema.GoOnly...)
	slices.Sort(have)
	slices.Sort(want)
	assert.Equal(t, want, have, "rdt.Config's fields and the schema's Go fields (plus schema.GoOnly) differ")
}

// The transport fields that need no fabric import reach the stack's
// config; one setting given two different ways is a typed error naming it.
func TestFlatTransportFields(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		want  stack.Config
		field string // the FieldError's field when refused
	}{
		{name: "none"},
		{name: "flat", cfg: Config{AllowTransports: []string{"tcp", "shm"}, DenyTransports: []string{"rdma"}, DataAddr: "127.0.0.1:7000", DisableRDMA: true, RDMAProvider: "soft"},
			want: stack.Config{Allow: []string{"tcp", "shm"}, Deny: []string{"rdma"}, DataAddr: "127.0.0.1:7000", DisableRDMA: true, RDMAProviderKind: "soft"}},
		{name: "old field still works", cfg: Config{Transports: stack.Config{Allow: []string{"tcp"}, DataAddr: "127.0.0.1:7001"}},
			want: stack.Config{Allow: []string{"tcp"}, DataAddr: "127.0.0.1:7001"}},
		{name: "both agreeing", cfg: Config{AllowTransports: []string{"tcp"}, Transports: stack.Config{Allow: []string{"tcp"}}},
			want: stack.Config{Allow: []string{"tcp"}}},
		{name: "both differing", cfg: Config{AllowTransports: []string{"tcp"}, Transports: stack.Config{Allow: []string{"shm"}}}, field: "allow_transports"},
		{name: "data addr twice", cfg: Config{DataAddr: "127.0.0.1:1", Transports: stack.Config{DataAddr: "127.0.0.1:2"}}, field: "data_addr"},
		{name: "unknown transport", cfg: Config{DenyTransports: []string{"carrier-pigeon"}}, field: "deny_transports"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.IgnoreEnv = true
			got, err := c.cfg.withDefaults()
			if c.field != "" {
				require.ErrorIs(t, err, ErrInvalidArgument)
				var fe *schema.FieldError
				require.ErrorAs(t, err, &fe)
				assert.Equal(t, c.field, fe.Field)
				return
			}
			require.NoError(t, err)
			tr := got.Transports
			assert.Equal(t, c.want.Allow, tr.Allow)
			assert.Equal(t, c.want.Deny, tr.Deny)
			assert.Equal(t, c.want.DisableRDMA, tr.DisableRDMA)
			assert.Equal(t, c.want.RDMAProviderKind, tr.RDMAProviderKind)
			if c.want.DataAddr != "" {
				assert.Equal(t, c.want.DataAddr, tr.DataAddr)
			}
		})
	}
}

// Invalid fields are typed errors naming the field.
func TestConfigFieldErrors(t *testing.T) {
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{Host: "h9"}, "host"},
		{Config{ClusterKey: []byte("short")}, "cluster_key"},
		{Config{LeaseRenew: time.Second, LeaseExpiry: time.Second}, "lease_expiry"},
	} {
		c.cfg.IgnoreEnv = true
		_, err := c.cfg.withDefaults()
		var fe *schema.FieldError
		require.True(t, errors.As(err, &fe), "%v", err)
		assert.Equal(t, c.field, fe.Field)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		assert.ErrorIs(t, err, schema.ErrBadValue)
	}
}

// The environment variables the runtime reads are the schema's.
func TestEnvNamesAreTheSchemas(t *testing.T) {
	assert.Equal(t, schema.EnvDevices, EnvDevices)
	assert.Equal(t, schema.EnvRuntimeDir, EnvRuntimeDir)
	assert.Equal(t, schema.EnvDeviceBackend, EnvDeviceBackend)
	assert.Equal(t, schema.EnvTransports, stack.EnvTransports)
	assert.Equal(t, schema.EnvRDMAProvider, stack.EnvRDMAProvider)
}
