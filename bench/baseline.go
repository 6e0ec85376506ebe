// Package bench holds tensorlane's benchmark harness and the baselines every
// measured path is compared with in the same run: a single-thread memcpy
// (the limit for on-host paths), a raw Go TCP socket over loopback (the
// limit for tcp and the software rdma), the same bytes through a libp2p
// stream (what sending tensors through the control channel would cost), and
// the object-store way: the tensor serialized into protobuf chunk messages
// and deserialized into the destination, over a socket between hosts or in
// memory on one host (Serializer, SerializePair).
// Absolute numbers drift on shared machines; ratios measured side by side
// do not.
package bench

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptcp "github.com/libp2p/go-libp2p/p2p/transport/tcp"
)

// Memcpy copies src into dst once, single-threaded, and returns the time.
func Memcpy(dst, src []byte) time.Duration {
	start := time.Now()
	copy(dst, src)
	return time.Since(start)
}

// TCPPair is a connected loopback socket pair whose server side writes n
// bytes of src on request: the raw-socket baseline.
type TCPPair struct{ *loopback }

// NewTCPPair connects a loopback socket pair whose server side writes src.
func NewTCPPair(src []byte) (*TCPPair, error) {
	l, err := newLoopback(func(c net.Conn, n int) error {
		_, err := c.Write(src[:n])
		return err
	})
	if err != nil {
		return nil, err
	}
	return &TCPPair{l}, nil
}

// Read moves len(dst) bytes from the server side into dst.
func (p *TCPPair) Read(dst []byte) (time.Duration, error) {
	start := time.Now()
	if err := p.request(len(dst)); err != nil {
		return 0, err
	}
	_, err := io.ReadFull(p.client, dst)
	return time.Since(start), err
}

// Libp2pPair is two libp2p hosts (Noise, yamux, TCP on loopback) with one
// stream between them: the control-channel baseline.
type Libp2pPair struct {
	a, b   interface{ Close() error }
	stream network.Stream
	reqs   chan int
	done   chan struct{}
}

const benchProto = "/tensorlane/bench/1"

// NewLibp2pPair starts two hosts; the second writes from src on request.
func NewLibp2pPair(ctx context.Context, src []byte) (*Libp2pPair, error) {
	opts := []libp2p.Option{
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"),
		libp2p.Transport(libp2ptcp.NewTCPTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableRelay(),
		libp2p.ResourceManager(&network.NullResourceManager{}),
	}
	a, err := libp2p.New(opts...)
	if err != nil {
		return nil, err
	}
	b, err := libp2p.New(opts...)
	if err != nil {
		a.Close()
		return nil, err
	}
	p := &Libp2pPair{a: a, b: b, reqs: make(chan int), done: make(chan struct{})}
	b.SetStreamHandler(benchProto, func(s network.Stream) {
		defer close(p.done)
		defer s.Close()
		var req [8]byte
		for {
			if _, err := io.ReadFull(s, req[:]); err != nil {
				return
			}
			n := int(uint64(req[0])<<56 | uint64(req[1])<<48 | uint64(req[2])<<40 | uint64(req[3])<<32 |
				uint64(req[4])<<24 | uint64(req[5])<<16 | uint64(req[6])<<8 | uint64(req[7]))
			if _, err := s.Write(src[:n]); err != nil {
				return
			}
		}
	})
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		p.Close()
		return nil, err
	}
	p.stream, err = a.NewStream(ctx, b.ID(), benchProto)
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Read moves len(dst) bytes through the stream into dst.
func (p *Libp2pPair) Read(dst []byte) (time.Duration, error) {
	start := time.Now()
	n := uint64(len(dst))
	req := []byte{byte(n >> 56), byte(n >> 48), byte(n >> 40), byte(n >> 32), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	if _, err := p.stream.Write(req); err != nil {
		return 0, err
	}
	_, err := io.ReadFull(p.stream, dst)
	return time.Since(start), err
}

// Close stops both hosts.
func (p *Libp2pPair) Close() error {
	if p.stream != nil {
		p.stream.Close()
	}
	p.a.Close()
	p.b.Close()
	return nil
}
