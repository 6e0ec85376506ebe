package linkstat

import (
	"context"
	"net"
	"time"
)

// Dial connects like net.Dialer and tracks the connection, labelled with
// its transport name and peer address. It fits fabric/tcp's Config.Dial, so
// every data connection the transport makes is measured:
//
//	tcp.New(tcp.Config{..., Dial: mon.Dial})
//
// A connection that cannot be tracked (not TCP) is still returned, with a
// log line. Closed connections drop out at the next refresh.
func (m *Monitor) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.DialFunc(nil, func(network, addr string) Labels {
		return Labels{Link: addr, Transport: network, Peer: addr}
	})(ctx, network, addr)
}

// DialFunc wraps a dial function (nil: a net.Dialer with a 10 s timeout,
// which ctx may shorten) so that every
// connection it makes is tracked under the labels that label returns.
func (m *Monitor) DialFunc(dial func(ctx context.Context, network, addr string) (net.Conn, error),
	label func(network, addr string) Labels) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if _, err := m.Track(c, label(network, addr)); err != nil {
			m.log.Warn("linkstat: connection not tracked", "addr", addr, "err", err)
		}
		return c, nil
	}
}
