package rdt

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// An owner listening on more addresses than a ref carries (0.0.0.0 on a
// host with container bridges and many NICs) still writes refs that every
// reader parses and reads through (issue 29, item 8).
func TestRefFromOwnerWithManyAddresses(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, func(c *Config) {
		if c.Host != "h0" {
			return
		}
		for i := range 20 {
			c.ListenAddrs = append(c.ListenAddrs, fmt.Sprintf("/ip4/127.0.0.%d/tcp/0", i+2))
		}
	})
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	reader, err := p.b.Spawn("reader")
	require.NoError(t, err)
	x := fill(t, p.a, tensor.HostDevice, tensor.Float32, 64)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	require.Len(t, ref.Addrs, refwire.MaxAddrs)

	b, err := ref.MarshalBinary()
	require.NoError(t, err)
	var back Ref
	require.NoError(t, back.UnmarshalBinary(b))
	got, err := reader.Get(ctx, back, tensor.HostDevice)
	require.NoError(t, err)
	defer got.Release()
	sameBytes(t, x, got)

	ref.Addrs = append(ref.Addrs, "/ip4/127.0.0.1/tcp/9")
	_, err = ref.MarshalBinary()
	assert.Error(t, err, "a ref no reader could parse is refused when it is written")
}
