package acceptor

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCloseAbortsHandlersAndWaits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	started := make(chan struct{}, 2)
	ended := make(chan error, 2)
	l := Start(ln, func(c net.Conn) {
		started <- struct{}{}
		_, err := io.ReadAll(c) // blocks until Close closes the connection
		ended <- err
	})
	var clients []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		clients = append(clients, c)
		<-started
	}
	assert.Equal(t, 2, l.Len())
	require.NoError(t, l.Close())
	assert.Len(t, ended, 2, "Close returns only after every handler did")
	assert.Equal(t, 0, l.Len())
	assert.NoError(t, l.Close(), "idempotent")
	for _, c := range clients {
		c.Close()
	}
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "no longer accepting")
}
