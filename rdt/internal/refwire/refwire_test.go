package refwire

import (
	"fmt"
	"testing"

	"github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAddrsRanksAndCaps(t *testing.T) {
	var ms []multiaddr.Multiaddr
	add := func(s string) { ms = append(ms, multiaddr.StringCast(s)) }
	add("/ip4/127.0.0.1/tcp/1")
	add("/ip4/169.254.0.9/tcp/1")
	for i := range 20 {
		add(fmt.Sprintf("/ip4/10.1.0.%d/tcp/1", i+1))
	}
	add("/ip4/10.1.0.1/tcp/1") // a duplicate
	got := Addrs(ms)
	require.Len(t, got, MaxAddrs)
	assert.Equal(t, "/ip4/10.1.0.1/tcp/1", got[0], "routable addresses first, in their order")
	assert.NotContains(t, got, "/ip4/127.0.0.1/tcp/1", "loopback is the first to go when there are too many")

	few := Addrs(ms[:2])
	assert.Equal(t, []string{"/ip4/169.254.0.9/tcp/1", "/ip4/127.0.0.1/tcp/1"}, few)
}
