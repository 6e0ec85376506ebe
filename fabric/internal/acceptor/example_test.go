package acceptor_test

import (
	"fmt"
	"io"
	"net"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/acceptor"
)

// A listener served by the shared accept loop: an echo server that holds
// at most two connections, and admits one per peer once its "handshake"
// (here: the peer's name, one line) has said who it is.
func ExampleStart() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	var loop *acceptor.Loop
	loop = acceptor.Start(ln, acceptor.Config{Name: "echo", Limits: fabric.ListenerLimits{MaxConns: 2, MaxConnsPerPeer: 1}},
		func(c net.Conn) {
			var who [1]byte
			if _, err := io.ReadFull(c, who[:]); err != nil {
				return
			}
			if err := loop.Admit(c, string(who[:])); err != nil {
				return // the loop closes c
			}
			io.Copy(c, c)
		})
	defer loop.Close()

	ask := func(who, msg string) string {
		c, _ := net.Dial("tcp", ln.Addr().String())
		defer c.Close()
		c.Write([]byte(who + msg))
		b := make([]byte, len(msg))
		if _, err := io.ReadFull(c, b); err != nil {
			return "closed"
		}
		return string(b)
	}
	fmt.Println(ask("a", "hello"))
	fmt.Println(loop.Limits().IdleTimeout)
	// Output:
	// hello
	// 5m0s
}
