package kit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
)

// Connect dials and authenticates one data connection, the way every
// reader side does it (tcp, shm, each rdma rail): dial and shake (the
// peerauth handshake, and whatever the protocol reads right after it)
// share one bound, timeout, besides ctx. ctx's end closes the connection
// at once; the connection's deadline bounds a handshake ctx does not.
//
// Errors are typed: ctx's own error when the caller gave up, the
// handshake's fabric.ErrUnauthorized, fabric.ErrBadRequest or
// fabric.ErrStalled as they are, fabric.ErrStalled when the bound passed,
// and fabric.ErrPeerClosed (naming what and addr) for the rest: a refused
// dial, a connection the owner dropped. On failure the connection is
// closed; on success its deadline is cleared and TCP_NODELAY is set on a
// TCP connection (requests are small and wait for their answers).
func Connect(ctx context.Context, timeout time.Duration, what, addr string,
	dial func(ctx context.Context) (net.Conn, error), shake func(net.Conn) error) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dial(dctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %s: dial %s: %v", fabric.ErrPeerClosed, what, addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	stop := context.AfterFunc(dctx, func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(timeout))
	err = shake(conn)
	if !stop() {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %s: handshake with %s took longer than %v", fabric.ErrStalled, what, addr, timeout)
	}
	if err != nil {
		conn.Close()
		switch {
		case errors.Is(err, fabric.ErrUnauthorized), errors.Is(err, fabric.ErrBadRequest), errors.Is(err, fabric.ErrStalled):
			return nil, err
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("%w: %s: handshake with %s took longer than %v", fabric.ErrStalled, what, addr, timeout)
		}
		return nil, fmt.Errorf("%w: %s: handshake with %s: %v", fabric.ErrPeerClosed, what, addr, err)
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// DialFrom connects to raddr from laddr (host:port, port 0 for any; ""
// lets the kernel choose), so a rail's traffic leaves through its own
// NIC's address.
func DialFrom(ctx context.Context, network, laddr, raddr string) (net.Conn, error) {
	var d net.Dialer
	if laddr != "" {
		a, err := net.ResolveTCPAddr(network, laddr)
		if err != nil {
			return nil, err
		}
		d.LocalAddr = a
	}
	return d.DialContext(ctx, network, raddr)
}

// SourceAddr is the address to dial from so that traffic leaves through
// the interface of listen (a NIC's host:port): its host with port 0, or ""
// (the kernel chooses) when listen has no host or an unspecified one.
func SourceAddr(listen string) string {
	h, _, err := net.SplitHostPort(listen)
	if err != nil || h == "" {
		return ""
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
		return ""
	}
	return net.JoinHostPort(h, "0")
}
