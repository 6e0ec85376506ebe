// Package acceptor is the accept loop every data listener shares (tcp, shm,
// each softrdma rail): the first piece of the kit each transport embeds.
//
// It serves each accepted connection on its own goroutine and tracks it, so
// that Close can stop accepting, abort every connection in flight and wait
// until no handler is left running. It also keeps the listener alive and
// bounded under abuse:
//   - temporary Accept errors (EMFILE, ENFILE, ENOBUFS, ECONNABORTED...) are
//     retried with a doubling backoff from 5 ms to 1 s, as net/http's Server
//     does, logged once per streak and counted; a moment of fd exhaustion
//     no longer ends the listener for good;
//   - connections past fabric.ListenerLimits.MaxConns are closed on arrival,
//     and authenticated connections past MaxConnsPerPeer right after their
//     handshake (Admit); both are counted, and the caps are exported as
//     gauges.
package acceptor

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
)

// ErrTooManyConns is Admit's answer when a peer holds its cap of
// connections already.
var ErrTooManyConns = errors.New("acceptor: too many connections from this peer")

// Backoff bounds for temporary accept errors (net/http's values).
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = time.Second
)

// warnEvery rate-limits the warnings for rejected connections.
const warnEvery = 10 * time.Second

// Config configures a Loop. Zero values mean the defaults.
type Config struct {
	// Name labels the listener in logs and metrics ("tcp", "shm",
	// "rdma/nic0").
	Name    string
	Limits  fabric.ListenerLimits
	Metrics *fabric.ListenerMetrics // nil: not counted
	Logger  *slog.Logger
}

// Loop accepts on a listener until Close.
type Loop struct {
	ln     net.Listener
	cfg    Config
	handle func(net.Conn)

	mu       sync.Mutex
	conns    map[net.Conn]string // connection -> admitted peer ("" before Admit)
	perPeer  map[string]int
	closed   bool
	wg       sync.WaitGroup
	lastWarn time.Time
	stop     chan struct{} // closed by Close: ends a backoff sleep
}

// Start accepts connections on ln and serves each with handle on a
// goroutine of its own. The connection is closed when handle returns.
func Start(ln net.Listener, cfg Config, handle func(net.Conn)) *Loop {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Name == "" {
		cfg.Name = ln.Addr().Network()
	}
	l := &Loop{ln: ln, cfg: cfg, handle: handle, conns: map[net.Conn]string{}, perPeer: map[string]int{},
		stop: make(chan struct{})}
	if m := cfg.Metrics; m != nil {
		m.Limit.WithLabelValues(cfg.Name, "total").Set(float64(cfg.Limits.MaxConns))
		m.Limit.WithLabelValues(cfg.Name, "peer").Set(float64(cfg.Limits.MaxConnsPerPeer))
		m.Conns.WithLabelValues(cfg.Name) // the series exists from the start, at 0
	}
	l.wg.Add(1)
	go l.accept()
	return l
}

// Limits returns the limits in force (defaults filled in).
func (l *Loop) Limits() fabric.ListenerLimits { return l.cfg.Limits }

// Temporary reports whether an Accept error is worth retrying: the
// listener is fine, the process or the system ran short of something, or
// one connection died in the queue.
func Temporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EPROTO, syscall.EAGAIN, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (l *Loop) accept() {
	defer l.wg.Done()
	var delay time.Duration
	streak := 0
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if l.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			if !Temporary(err) {
				l.count(func(m *fabric.ListenerMetrics) { m.AcceptErrors.WithLabelValues(l.cfg.Name, "fatal").Inc() })
				l.cfg.Logger.Error("data listener stopped: accept failed", "listener", l.cfg.Name, "err", err)
				return
			}
			l.count(func(m *fabric.ListenerMetrics) { m.AcceptErrors.WithLabelValues(l.cfg.Name, "temporary").Inc() })
			delay = max(minBackoff, min(2*delay, maxBackoff))
			if streak++; streak == 1 {
				l.cfg.Logger.Warn("data listener: accept failed, retrying with backoff", "listener", l.cfg.Name, "err", err, "retry_in", delay)
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.stop:
				t.Stop()
				return
			}
			continue
		}
		if streak > 0 {
			l.cfg.Logger.Warn("data listener: accepting again", "listener", l.cfg.Name, "failed_accepts", streak)
			streak, delay = 0, 0
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		if len(l.conns) >= l.cfg.Limits.MaxConns {
			warn := time.Since(l.lastWarn) >= warnEvery
			if warn {
				l.lastWarn = time.Now()
			}
			l.mu.Unlock()
			// Counted before the close, so whoever sees the close sees the count.
			l.count(func(m *fabric.ListenerMetrics) { m.Rejected.WithLabelValues(l.cfg.Name, "total_cap").Inc() })
			c.Close()
			if warn {
				l.cfg.Logger.Warn("data listener full: closing new connections", "listener", l.cfg.Name,
					"max_conns", l.cfg.Limits.MaxConns, "remote", c.RemoteAddr())
			}
			continue
		}
		l.conns[c] = ""
		l.wg.Add(1)
		l.mu.Unlock()
		// Inc and Dec, not Set(len): updates made outside the lock may land
		// in any order.
		l.count(func(m *fabric.ListenerMetrics) { m.Conns.WithLabelValues(l.cfg.Name).Inc() })
		go l.serve(c)
	}
}

func (l *Loop) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

func (l *Loop) count(f func(*fabric.ListenerMetrics)) {
	if l.cfg.Metrics != nil {
		f(l.cfg.Metrics)
	}
}

func (l *Loop) serve(c net.Conn) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		if p := l.conns[c]; p != "" {
			if l.perPeer[p]--; l.perPeer[p] <= 0 {
				delete(l.perPeer, p)
			}
		}
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
		l.count(func(m *fabric.ListenerMetrics) { m.Conns.WithLabelValues(l.cfg.Name).Dec() })
	}()
	l.handle(c)
}

// Admit records that c, served by this loop, was authenticated as peer. It
// refuses with ErrTooManyConns (counted, and logged at most every 10 s) when
// the peer holds MaxConnsPerPeer connections already; the handler should
// then return, which closes c. Admitting c twice does nothing.
func (l *Loop) Admit(c net.Conn, peer string) error {
	l.mu.Lock()
	p, ok := l.conns[c]
	if !ok || p != "" {
		l.mu.Unlock()
		return nil // closing, or admitted already
	}
	if l.perPeer[peer] >= l.cfg.Limits.MaxConnsPerPeer {
		warn := time.Since(l.lastWarn) >= warnEvery
		if warn {
			l.lastWarn = time.Now()
		}
		l.mu.Unlock()
		l.count(func(m *fabric.ListenerMetrics) { m.Rejected.WithLabelValues(l.cfg.Name, "peer_cap").Inc() })
		if warn {
			l.cfg.Logger.Warn("data listener: peer has too many connections, closing a new one", "listener", l.cfg.Name,
				"peer", peer, "max_conns_per_peer", l.cfg.Limits.MaxConnsPerPeer)
		}
		return ErrTooManyConns
	}
	l.conns[c] = peer
	l.perPeer[peer]++
	l.mu.Unlock()
	return nil
}

// Dropped counts (and logs at debug) an authenticated connection the server
// closed for reason ("idle", "bad_keys").
func (l *Loop) Dropped(reason string, peer string) {
	l.count(func(m *fabric.ListenerMetrics) { m.Dropped.WithLabelValues(l.cfg.Name, reason).Inc() })
	l.cfg.Logger.Debug("data connection dropped", "listener", l.cfg.Name, "reason", reason, "peer", peer)
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
	close(l.stop)
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}
