package bench

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// PingPong is a loopback socket pair where every exchange is a real round
// trip: the client writes an 8-byte request naming a length and the server
// answers with that many bytes of src. It is the latency baseline for small
// tcp Gets, which also cost a request and a response.
type PingPong struct {
	ln     net.Listener
	client net.Conn
	done   chan error
	once   sync.Once
	err    error
}

// NewPingPong connects a loopback pair whose server side answers from src.
func NewPingPong(src []byte) (*PingPong, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &PingPong{ln: ln, done: make(chan error, 1)}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			p.done <- err
			return
		}
		defer c.Close()
		var req [8]byte
		for {
			if _, err := io.ReadFull(c, req[:]); err != nil {
				p.done <- nil // the client hung up
				return
			}
			n := binary.BigEndian.Uint64(req[:])
			if n > uint64(len(src)) {
				p.done <- fmt.Errorf("bench: ping-pong request for %d bytes, have %d", n, len(src))
				return
			}
			if _, err := c.Write(src[:n]); err != nil {
				p.done <- err
				return
			}
		}
	}()
	p.client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-p.done
		return nil, err
	}
	return p, nil
}

// Exchange sends one request and reads len(dst) bytes of answer into dst.
func (p *PingPong) Exchange(dst []byte) (time.Duration, error) {
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], uint64(len(dst)))
	start := time.Now()
	if _, err := p.client.Write(req[:]); err != nil {
		return 0, err
	}
	_, err := io.ReadFull(p.client, dst)
	return time.Since(start), err
}

// Close ends the pair and waits for its goroutine. Idempotent.
func (p *PingPong) Close() error {
	p.once.Do(func() {
		p.client.Close()
		p.ln.Close()
		p.err = <-p.done
	})
	return p.err
}
