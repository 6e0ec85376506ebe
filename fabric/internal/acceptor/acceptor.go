// Package acceptor is the accept loop every data server shares (tcp, shm):
// each accepted connection is served on its own goroutine and tracked, so
// that Close can stop accepting, abort every connection in flight and wait
// until no handler is left running.
package acceptor

import (
	"net"
	"sync"
)

// Loop accepts on a listener until Close.
type Loop struct {
	ln     net.Listener
	handle func(net.Conn)

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start accepts connections on ln and serves each with handle on a
// goroutine of its own. The connection is closed when handle returns.
func Start(ln net.Listener, handle func(net.Conn)) *Loop {
	l := &Loop{ln: ln, handle: handle, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l
}

func (l *Loop) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // listener closed
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(c)
	}
}

func (l *Loop) serve(c net.Conn) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
	}()
	l.handle(c)
}

// Len is the number of connections being served.
func (l *Loop) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Close stops accepting, closes every connection (aborting its handler's
// I/O) and waits for the handlers. It returns the listener's close error;
// later calls do nothing and return nil.
func (l *Loop) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}
