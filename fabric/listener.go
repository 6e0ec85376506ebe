package fabric

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of ListenerLimits. Why these values:
//   - DefaultMaxConns bounds the descriptors and goroutines one data listener
//     can be made to hold (each connection costs one of each, plus buffers),
//     far below a default fd limit, while leaving room for 16 readers each
//     at their default pool size.
//   - DefaultMaxConnsPerPeer is twice the largest per-owner pool a reader of
//     ours opens by default (tcp: 64), so a well-behaved reader never meets it
//     while one authenticated peer cannot take the whole listener.
//   - DefaultIdleTimeout is well above every reader's own pool idle timeout
//     (tcp: 90 s), so pooled connections are closed by the reader first and
//     the server only reaps connections a reader forgot or parked on purpose.
const (
	DefaultMaxConns        = 1024
	DefaultMaxConnsPerPeer = 128
	DefaultIdleTimeout     = 5 * time.Minute
)

// ListenerLimits bounds what the connections of one data listener (the tcp
// server, each rdma rail, the shm socket) may hold. The zero value means the
// defaults above.
type ListenerLimits struct {
	// MaxConns is the most connections the listener holds at once,
	// handshakes included; one past it is accepted and closed at once.
	MaxConns int
	// MaxConnsPerPeer is the most authenticated connections of one peer
	// identity; one past it is closed right after its handshake.
	MaxConnsPerPeer int
	// IdleTimeout closes an authenticated connection that sends no request
	// for that long.
	IdleTimeout time.Duration
}

// WithDefaults returns l with zero fields set to the defaults.
func (l ListenerLimits) WithDefaults() ListenerLimits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxConnsPerPeer <= 0 {
		l.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	return l
}

// ListenerMetrics counts what happens on data listeners, labelled by
// listener ("tcp", "shm", "rdma/<nic>"). One set per runtime, shared by all
// of its listeners.
type ListenerMetrics struct {
	Conns        *prometheus.GaugeVec   // tensorlane_listener_connections{listener}
	Limit        *prometheus.GaugeVec   // tensorlane_listener_connection_limit{listener,scope="total"|"peer"}
	AcceptErrors *prometheus.CounterVec // tensorlane_listener_accept_errors_total{listener,kind="temporary"|"fatal"}
	Rejected     *prometheus.CounterVec // tensorlane_listener_rejected_total{listener,reason="total_cap"|"peer_cap"}
	Dropped      *prometheus.CounterVec // tensorlane_listener_dropped_total{listener,reason="idle"|"bad_keys"}
	BadKeys      *prometheus.CounterVec // tensorlane_listener_bad_keys_total{listener}
}

// NewListenerMetrics creates the metrics and registers them on reg (nil:
// not registered).
func NewListenerMetrics(reg prometheus.Registerer) *ListenerMetrics {
	m := &ListenerMetrics{
		Conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tensorlane_listener_connections", Help: "Connections a data listener holds now.",
		}, []string{"listener"}),
		Limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tensorlane_listener_connection_limit", Help: "Connection cap of a data listener, in total and per peer.",
		}, []string{"listener", "scope"}),
		AcceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_listener_accept_errors_total", Help: "Accept errors: temporary ones (EMFILE, ENFILE...) are retried with backoff, fatal ones stop the listener.",
		}, []string{"listener", "kind"}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_listener_rejected_total", Help: "Connections closed on arrival because a cap was reached.",
		}, []string{"listener", "reason"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_listener_dropped_total", Help: "Authenticated connections the server closed: idle too long, or too many bad memory keys.",
		}, []string{"listener", "reason"}),
		BadKeys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_listener_bad_keys_total", Help: "Remote memory accesses with a key that was never issued to the peer (guesses).",
		}, []string{"listener"}),
	}
	if reg != nil {
		reg.MustRegister(m.Conns, m.Limit, m.AcceptErrors, m.Rejected, m.Dropped, m.BadKeys)
	}
	return m
}
