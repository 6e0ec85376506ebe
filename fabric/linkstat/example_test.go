package linkstat_test

import (
	"fmt"
	"io"
	"net"

	"github.com/tensorlane/tensorlane/fabric/linkstat"
)

// A transport tracks its data connections and asks for their figures (and
// health) when it plans or stripes a transfer.
func Example() {
	m, err := linkstat.New(linkstat.Config{ForceTCPInfo: true})
	if err != nil {
		panic(err)
	}
	defer m.Close()

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	conn, _ := net.Dial("tcp", ln.Addr().String())
	defer conn.Close()
	link, _ := m.Track(conn, linkstat.Labels{Link: "h0->h1 stream 0", Transport: "tcp"})
	conn.Write(make([]byte, 1<<20))
	m.Refresh()
	s := link.Stats()
	fmt.Println(m.Mode(), s.Link, s.State, s.RTT > 0, s.Degraded)
	// Output: tcp_info h0->h1 stream 0 established true false
}
