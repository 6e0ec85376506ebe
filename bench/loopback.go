package bench

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// loopback is a connected loopback socket pair whose server side answers
// each request (a byte count, handed over in process) by calling serve on
// its end of the socket: the baselines that stream bytes on request
// (TCPPair, SerializePair) share it. Reading after Close, or after the
// server failed, returns an error instead of blocking.
type loopback struct {
	ln       net.Listener
	client   net.Conn
	requests chan int
	quit     chan struct{} // closed by Close
	stopped  chan struct{} // closed when the server has returned, with serr set
	serr     error
	once     sync.Once
}

func newLoopback(serve func(c net.Conn, n int) error) (*loopback, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &loopback{ln: ln, requests: make(chan int), quit: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(l.stopped)
		c, err := ln.Accept()
		if err != nil {
			l.serr = err
			return
		}
		defer c.Close()
		for {
			select {
			case n := <-l.requests:
				if err := serve(c, n); err != nil {
					l.serr = err
					return
				}
			case <-l.quit:
				return
			}
		}
	}()
	l.client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-l.stopped
		return nil, err
	}
	return l, nil
}

// request asks the server side for n bytes.
func (l *loopback) request(n int) error {
	select {
	case l.requests <- n:
		return nil
	case <-l.stopped:
		return fmt.Errorf("bench: baseline sender stopped: %v", l.serr)
	case <-l.quit:
		return net.ErrClosed
	}
}

// Close ends the pair and waits for its goroutine. Idempotent.
func (l *loopback) Close() error {
	l.once.Do(func() {
		close(l.quit)
		l.client.Close()
		l.ln.Close()
		<-l.stopped
	})
	if errors.Is(l.serr, net.ErrClosed) {
		return nil
	}
	return l.serr
}
