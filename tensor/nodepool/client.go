package nodepool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrAbsent: no helper answers (yet); the caller allocates its own memory.
var ErrAbsent = errors.New("nodepool: no pool helper on this node")

// ErrEmpty: the helper holds nothing that large right now.
var ErrEmpty = errors.New("nodepool: the pool holds nothing that large")

// takeTimeout bounds one request: a helper that does not answer by then
// is treated as absent (the caller allocates its own memory at once).
const takeTimeout = 500 * time.Millisecond

// retryEvery is how often a client without a helper tries again.
const retryEvery = 2 * time.Second

// Client is a runtime's connection to its node's helper (see the package
// doc). Its zero value is not usable; Open makes one. Safe for concurrent
// use.
type Client struct {
	socket string
	helper []string
	log    *slog.Logger

	mu     sync.Mutex // one request at a time on conn
	conn   *net.UnixConn
	closed bool

	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	logOnce sync.Once

	hits, misses, absent atomic.Int64
	taken                atomic.Int64 // bytes handed to this client
	ready                atomic.Int64 // the helper's ready bytes at the last answer
}

// ClientStats is what a client saw.
type ClientStats struct {
	Connected bool  // a helper answers
	Hits      int64 // takes the pool served
	Misses    int64 // takes it could not serve (empty, or larger than its budget)
	Absent    int64 // takes with no helper to ask
	Taken     int64 // bytes the pool handed this client
	Ready     int64 // the helper's ready bytes at its last answer
}

// Open returns a client of the helper at socket and starts connecting in
// the background; when none answers and helper is not empty, it starts
// one by running helper with "--socket", socket appended (the command
// must detach, returning once the helper runs; a second helper for the
// same socket exits at once). Takes before a helper answers return
// ErrAbsent.
func Open(socket string, helper []string, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{socket: socket, helper: helper, log: log, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go c.connectLoop()
	return c
}

// SocketPath is the helper's socket in runtime directory dir.
func SocketPath(dir string) string { return dir + "/" + SocketName }

// HostSocketPath is the helper's socket in runtime directory dir for the
// runtimes of host ("": SocketPath). A node pool is one host's memory, so
// runtimes that name different hosts use different helpers even when they
// share a kernel and a directory (simulated hosts: network namespaces with
// their own host names). Names unfit for a file name, or long enough to
// overflow a unix socket's path, are hashed.
func HostSocketPath(dir, host string) string {
	if host == "" {
		return SocketPath(dir)
	}
	name := host
	if len(name) > 32 || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 || strings.HasPrefix(name, ".") {
		h := fnv.New64a()
		h.Write([]byte(host))
		name = fmt.Sprintf("h%016x", h.Sum64())
	}
	return dir + "/" + strings.TrimSuffix(SocketName, ".sock") + "." + name + ".sock"
}

// connectLoop connects whenever the client has no connection, starting a
// helper when none answers, until Close.
func (c *Client) connectLoop() {
	defer close(c.done)
	spawned := time.Time{}
	for {
		c.mu.Lock()
		need := c.conn == nil && !c.closed
		c.mu.Unlock()
		if need {
			conn, err := dial(c.socket)
			if err != nil && len(c.helper) > 0 && time.Since(spawned) > 10*time.Second {
				spawned = time.Now()
				if err := c.spawn(); err != nil {
					c.log.Warn("nodepool: cannot start the pool helper; allocating without it", "err", err)
				}
				// The helper takes a moment to listen (a Python start).
				for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); {
					select {
					case <-c.stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					conn, err = dial(c.socket)
				}
			}
			if err == nil {
				c.mu.Lock()
				if c.closed {
					conn.Close()
				} else {
					c.conn = conn
				}
				c.mu.Unlock()
				c.log.Debug("nodepool: connected", "socket", c.socket)
			}
		}
		select {
		case <-c.stop:
			return
		case <-c.kick:
		case <-time.After(retryEvery):
		}
	}
}

func dial(socket string) (*net.UnixConn, error) {
	return net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
}

// spawn starts the helper; its launcher is reaped in the background (it
// returns once the helper runs detached).
func (c *Client) spawn() error {
	args := append(append([]string{}, c.helper[1:]...), "--socket", c.socket)
	cmd := exec.Command(c.helper[0], args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // no terminal's signals, not the caller's process group
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	if err := cmd.Start(); err != nil {
		return err
	}
	c.log.Info("nodepool: started the node's pool helper", "cmd", c.helper, "socket", c.socket)
	go cmd.Wait()
	return nil
}

// Take asks the pool for a memfd of at least size bytes with its pages
// resident. It returns the descriptor (the caller owns it) and its size,
// or ErrAbsent or ErrEmpty (counted; the caller allocates its own memory,
// as it would without a pool). The first fallback is logged.
func (c *Client) Take(ctx context.Context, size int64) (fd int, n int64, err error) {
	fd, n, err = c.take(ctx, size)
	switch {
	case err == nil:
		c.hits.Add(1)
		c.taken.Add(n)
	case errors.Is(err, ErrEmpty):
		c.misses.Add(1)
	default:
		c.absent.Add(1)
	}
	if err != nil {
		c.logOnce.Do(func() {
			c.log.Info("nodepool: allocating fresh memory without the node pool (counted in stats: node_pool)", "bytes", size, "err", err)
		})
	}
	return fd, n, err
}

func (c *Client) take(ctx context.Context, size int64) (int, int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return -1, 0, ErrAbsent
	}
	resp, fd, err := c.roundTrip(ctx, opTake, size)
	if err != nil {
		return -1, 0, fmt.Errorf("%w: %w", ErrAbsent, err)
	}
	switch resp[0] {
	case statusOK:
	case statusEmpty, statusLarge:
		return -1, 0, ErrEmpty
	default:
		return -1, 0, fmt.Errorf("%w: status %d", ErrAbsent, resp[0])
	}
	n := int64(binary.LittleEndian.Uint64(resp[1:]))
	var st unix.Stat_t
	if fd < 0 || unix.Fstat(fd, &st) != nil || st.Size != n || n < size {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, 0, fmt.Errorf("%w: the helper sent no memory file of %d bytes", ErrAbsent, size)
	}
	return fd, n, nil
}

// roundTrip sends one request and reads its answer; c.mu is held. A
// failure drops the connection (the connect loop makes a new one).
func (c *Client) roundTrip(ctx context.Context, op byte, size int64) ([]byte, int, error) {
	req := make([]byte, reqLen)
	req[0] = op
	binary.LittleEndian.PutUint64(req[1:], uint64(size))
	deadline := time.Now().Add(takeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.conn.SetDeadline(deadline)
	fail := func(err error) ([]byte, int, error) {
		c.conn.Close()
		c.conn = nil
		select {
		case c.kick <- struct{}{}:
		default:
		}
		return nil, -1, err
	}
	if _, err := c.conn.Write(req); err != nil {
		return fail(err)
	}
	resp := make([]byte, respLen)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.conn.ReadMsgUnix(resp, oob)
	if err != nil {
		return fail(err)
	}
	fd := -1
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil && len(msgs) == 1 {
			if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
				fd = fds[0]
			}
		}
	}
	if n != respLen {
		if fd >= 0 {
			unix.Close(fd)
		}
		return fail(fmt.Errorf("short answer (%d bytes)", n))
	}
	c.ready.Store(int64(binary.LittleEndian.Uint64(resp[9:])))
	return resp, fd, nil
}

// ServerStats asks the helper for its counters.
func (c *Client) ServerStats(ctx context.Context) (ServerStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return ServerStats{}, ErrAbsent
	}
	resp, fd, err := c.roundTrip(ctx, opStats, 0)
	if err != nil {
		return ServerStats{}, fmt.Errorf("%w: %w", ErrAbsent, err)
	}
	if fd >= 0 {
		unix.Close(fd)
	}
	return ServerStats{
		Ready:  int64(binary.LittleEndian.Uint64(resp[9:])),
		Hits:   int64(binary.LittleEndian.Uint64(resp[17:])),
		Misses: int64(binary.LittleEndian.Uint64(resp[25:])),
	}, nil
}

// Stats returns what the client saw.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	connected := c.conn != nil
	c.mu.Unlock()
	return ClientStats{Connected: connected, Hits: c.hits.Load(), Misses: c.misses.Load(), Absent: c.absent.Load(),
		Taken: c.taken.Load(), Ready: c.ready.Load()}
}

// Connected waits until a helper answers, or ctx ends.
func (c *Client) Connected(ctx context.Context) error {
	for {
		c.mu.Lock()
		ok := c.conn != nil
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrAbsent, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Close hangs up (the helper counts one client less) and stops the
// connect loop. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	c.mu.Unlock()
	close(c.stop)
	<-c.done
	return nil
}
