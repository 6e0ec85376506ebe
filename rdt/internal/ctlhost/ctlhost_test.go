package ctlhost

import (
	"crypto/rand"
	"fmt"
	"net"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/testhelp"
)

func newKey(t *testing.T) crypto.PrivKey {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	return k
}

// A port in use fails New with an error, and leaves nothing running: a
// runtime that restarts on its old address (a taken one) must not leak.
func TestListenFailureLeavesNothingRunning(t *testing.T) {
	defer goleak.VerifyNone(t, append(testhelp.Libp2pBackground(), goleak.IgnoreCurrent())...)
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port

	_, err = New(Config{Identity: newKey(t), ListenAddrs: []string{fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)}})
	require.Error(t, err)
}

func TestMalformedListenAddress(t *testing.T) {
	_, err := New(Config{Identity: newKey(t), ListenAddrs: []string{"not a multiaddr"}})
	require.ErrorContains(t, err, "not a multiaddr")
}

func TestListensOnAskedAddress(t *testing.T) {
	defer goleak.VerifyNone(t, append(testhelp.Libp2pBackground(), goleak.IgnoreCurrent())...)
	h, err := New(Config{Identity: newKey(t), ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
	require.NoError(t, err)
	defer h.Close()
	require.Len(t, h.Addrs(), 1)
	require.Contains(t, h.Addrs()[0].String(), "/ip4/127.0.0.1/tcp/")
}
