package acceptor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		emfileChild()
		return
	}
	goleak.VerifyTestMain(m)
}

func TestCloseAbortsHandlersAndWaits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	started := make(chan struct{}, 2)
	ended := make(chan error, 2)
	l := Start(ln, Config{}, func(c net.Conn) {
		started <- struct{}{}
		_, err := io.ReadAll(c) // blocks until Close closes the connection
		ended <- err
	})
	var clients []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		clients = append(clients, c)
		<-started
	}
	assert.Equal(t, 2, l.Len())
	require.NoError(t, l.Close())
	assert.Len(t, ended, 2, "Close returns only after every handler did")
	assert.Equal(t, 0, l.Len())
	assert.NoError(t, l.Close(), "idempotent")
	for _, c := range clients {
		c.Close()
	}
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "no longer accepting")
}

// flaky is a listener whose Accept fails with errs first.
type flaky struct {
	net.Listener
	mu   sync.Mutex
	errs []error
}

func (f *flaky) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

func echo(c net.Conn) { io.Copy(c, c) }

func roundTrip(t *testing.T, addr string) error {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if string(b[:]) != "ping" {
		return fmt.Errorf("echo %q", b)
	}
	return nil
}

// Before: any Accept error ended the loop for good. Now temporary ones are
// retried with backoff, counted and logged; a fatal one stops the loop,
// counted and logged as an error.
func TestAcceptErrors(t *testing.T) {
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	for _, tc := range []struct {
		name      string
		errs      []error
		served    bool
		temporary float64
		fatal     float64
		logs      string
	}{
		{"emfile-retried", []error{emfile, emfile, emfile}, true, 3, 0, "retrying with backoff"},
		{"enfile-and-aborted", []error{syscall.ENFILE, syscall.ECONNABORTED}, true, 2, 0, "accepting again"},
		{"fatal-stops", []error{errors.New("listener broken")}, false, 0, 1, "data listener stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			var logs strings.Builder
			var lmu sync.Mutex
			m := fabric.NewListenerMetrics(nil)
			l := Start(&flaky{Listener: inner, errs: tc.errs}, Config{Name: "t", Metrics: m,
				Logger: slog.New(slog.NewTextHandler(lockedWriter{&lmu, &logs}, nil))}, echo)
			defer l.Close()
			if tc.served {
				require.NoError(t, roundTrip(t, inner.Addr().String()))
			} else {
				// The loop counts the error, then logs it: wait for both.
				require.Eventually(t, func() bool {
					lmu.Lock()
					logged := strings.Contains(logs.String(), tc.logs)
					lmu.Unlock()
					return logged && testutil.ToFloat64(m.AcceptErrors.WithLabelValues("t", "fatal")) == 1
				}, 10*time.Second, 5*time.Millisecond)
			}
			assert.Equal(t, tc.temporary, testutil.ToFloat64(m.AcceptErrors.WithLabelValues("t", "temporary")))
			assert.Equal(t, tc.fatal, testutil.ToFloat64(m.AcceptErrors.WithLabelValues("t", "fatal")))
			lmu.Lock()
			assert.Contains(t, logs.String(), tc.logs)
			lmu.Unlock()
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// A connection past MaxConns is closed on arrival and counted; once one
// ends, the next is served.
func TestMaxConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m := fabric.NewListenerMetrics(nil)
	l := Start(ln, Config{Name: "t", Metrics: m, Limits: fabric.ListenerLimits{MaxConns: 2}}, echo)
	defer l.Close()
	assert.Equal(t, 2.0, testutil.ToFloat64(m.Limit.WithLabelValues("t", "total")))
	assert.Equal(t, float64(fabric.DefaultMaxConnsPerPeer), testutil.ToFloat64(m.Limit.WithLabelValues("t", "peer")))
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		held = append(held, c)
	}
	require.Eventually(t, func() bool { return l.Len() == 2 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 2.0, testutil.ToFloat64(m.Conns.WithLabelValues("t")))
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the third connection is closed at once")
	c.Close()
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Rejected.WithLabelValues("t", "total_cap")))
	held[0].Close()
	require.Eventually(t, func() bool { return l.Len() == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.NoError(t, roundTrip(t, ln.Addr().String()))
	held[1].Close()
}

func TestAdmitPerPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m := fabric.NewListenerMetrics(nil)
	var l *Loop
	results := make(chan error, 8)
	l = Start(ln, Config{Name: "t", Metrics: m, Limits: fabric.ListenerLimits{MaxConnsPerPeer: 2}}, func(c net.Conn) {
		var who [1]byte
		if _, err := io.ReadFull(c, who[:]); err != nil {
			return
		}
		err := l.Admit(c, string(who[:]))
		if err == nil {
			assert.NoError(t, l.Admit(c, string(who[:])), "admitting twice does nothing")
		}
		results <- err
		if err == nil {
			io.Copy(io.Discard, c)
		}
	})
	defer l.Close()
	dial := func(who string) (net.Conn, error) {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		c.Write([]byte(who))
		return c, <-results
	}
	a1, err := dial("a")
	require.NoError(t, err)
	a2, err := dial("a")
	require.NoError(t, err)
	a3, err := dial("a")
	assert.ErrorIs(t, err, ErrTooManyConns)
	a3.Close()
	b1, err := dial("b")
	assert.NoError(t, err, "another peer has its own cap")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Rejected.WithLabelValues("t", "peer_cap")))
	a1.Close()
	require.Eventually(t, func() bool { return l.Len() == 2 }, 10*time.Second, 5*time.Millisecond)
	a4, err := dial("a")
	assert.NoError(t, err, "a freed slot is usable again")
	for _, c := range []net.Conn{a2, b1, a4} {
		c.Close()
	}
}

// The EMFILE test drives a real listener through fd exhaustion. The
// listener runs in a child process (this test binary again) whose
// RLIMIT_NOFILE is lowered to a few descriptors above what it has open;
// the parent floods it with connections until it logs that Accept fails,
// lets them go, and then a new reader must be served. Before the fix the
// accept loop returned on the first EMFILE and the new reader was never
// answered.
const childEnv = "TENSORLANE_ACCEPTOR_EMFILE_CHILD"

func emfileChild() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	m := fabric.NewListenerMetrics(nil)
	l := Start(ln, Config{Name: "child", Metrics: m, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}, echo)
	fds, _ := os.ReadDir("/proc/self/fd")
	lim := uint64(len(fds) + 4)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("addr", ln.Addr().String(), "nofile", lim)
	io.Copy(io.Discard, os.Stdin) // the parent closes stdin when done
	fmt.Println("temporary_accept_errors", testutil.ToFloat64(m.AcceptErrors.WithLabelValues("child", "temporary")))
	l.Close()
}

func TestEMFILESubprocess(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	out := bufio.NewScanner(stdout)
	require.True(t, out.Scan(), "child says where it listens")
	var addr string
	var nofile int
	_, err = fmt.Sscanf(out.Text(), "addr %s nofile %d", &addr, &nofile)
	require.NoError(t, err, out.Text())

	failing, recovered := make(chan struct{}), make(chan struct{})
	var logs strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		var f, r sync.Once
		for sc.Scan() {
			line := sc.Text()
			logs.WriteString(line + "\n")
			if strings.Contains(line, "too many open files") {
				f.Do(func() { close(failing) })
			}
			if strings.Contains(line, "accepting again") {
				r.Do(func() { close(recovered) })
			}
		}
	}()

	// Flood: more connections than the child has descriptors left.
	var flood []net.Conn
	deadline := time.After(30 * time.Second)
	func() {
		for {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err == nil {
				flood = append(flood, c)
			}
			select {
			case <-failing:
				return
			case <-deadline:
				t.Fatalf("the child never ran out of descriptors after %d connections", len(flood))
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	assert.Greater(t, len(flood), 0)
	for _, c := range flood {
		c.Close()
	}
	// A new reader is served once descriptors are free again.
	require.Eventually(t, func() bool { return roundTrip(t, addr) == nil }, 30*time.Second, 50*time.Millisecond,
		"the listener serves new readers after EMFILE")
	select {
	case <-recovered:
	case <-time.After(10 * time.Second):
		t.Error("no 'accepting again' log line")
	}
	stdin.Close()
	require.True(t, out.Scan())
	var n float64
	_, err = fmt.Sscanf(out.Text(), "temporary_accept_errors %g", &n)
	require.NoError(t, err, out.Text())
	assert.Greater(t, n, 0.0, "EMFILE counted")
	require.NoError(t, cmd.Wait())
}
