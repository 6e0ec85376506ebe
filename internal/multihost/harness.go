package multihost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/internal/netns"
	"github.com/tensorlane/tensorlane/internal/netns/netnstest"
	"github.com/tensorlane/tensorlane/internal/workerproto"
)

// The worker protocol's types (package workerproto, shared with the worker).
type (
	Request = workerproto.Request
	Reply   = workerproto.Reply
	Info    = workerproto.Info
)

// Options configure a Cluster. Zero values mean the defaults.
type Options struct {
	Hosts        int           // default 3
	Preset       string        // default dgx-h100
	DeviceMemory string        // each simulated device's arena; default 512MiB
	StallTimeout time.Duration // workers' stall detector; default 3s
	Args         []string      // extra worker flags for every host
	// NSLabel starts the label of every namespace (host and bridge), so
	// that a run's namespaces say whose they are; default none.
	NSLabel string
}

// Cluster is a set of hosts, each a network namespace plugged into one
// bridge and running a tensorlane worker process.
type Cluster struct {
	t      testing.TB
	opts   Options
	bin    string
	dir    string
	Bridge *netns.Bridge
	Hosts  []*Host
}

// Host is one simulated machine: a namespace with eth0 on the bridge and a
// worker claiming topology host ID.
type Host struct {
	c        *Cluster
	ID       string
	NS       *netns.NS
	Dev      string // the host's interface, in NS
	Port     string // its bridge port, in the bridge namespace: the "switch" side of the cable
	IP       string
	identity string
	outsider bool // not a cluster member: Options.Args do not apply
	args     []string
	W        *Worker // the current worker process
}

// Control and data ports are fixed: each namespace has its own port space,
// and a restarted worker must come back on the same addresses.
const (
	controlPort = 4001
	dataPort    = 5001
)

// New builds the cluster, starts a worker on every host and connects them.
// It skips the test where namespaces are unavailable; everything is torn
// down in t.Cleanup, even when the test fails.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	netnstest.Require(t)
	if o.Hosts <= 0 {
		o.Hosts = 3
	}
	if o.Preset == "" {
		o.Preset = "dgx-h100"
	}
	if o.DeviceMemory == "" {
		o.DeviceMemory = "512MiB"
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 3 * time.Second
	}
	c := &Cluster{t: t, opts: o, bin: Binary(t), dir: t.TempDir(), Bridge: netnstest.NewBridge(t, o.NSLabel+"br")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < o.Hosts; i++ {
		h := &Host{c: c, ID: fmt.Sprintf("h%d", i), NS: netnstest.New(t, fmt.Sprintf("%sh%d", o.NSLabel, i)), Dev: "eth0", IP: fmt.Sprintf("10.77.0.%d", i+1)}
		h.identity = filepath.Join(c.dir, h.ID+".key")
		port, err := c.Bridge.Attach(ctx, h.NS, h.Dev, h.IP+"/24")
		if err != nil {
			t.Fatalf("multihost: attach %s: %v", h.ID, err)
		}
		h.Port = port
		c.Hosts = append(c.Hosts, h)
	}
	for _, h := range c.Hosts {
		h.Start(ctx)
	}
	for i, a := range c.Hosts {
		for _, b := range c.Hosts[i+1:] {
			c.Connect(ctx, a, b)
		}
	}
	return c
}

// AddHost plugs one more namespace into the bridge at ip (in
// 10.77.0.0/24) and runs a worker there claiming topology host id, with
// extra flags args. A member also gets Options.Args (the cluster key, say);
// a non-member is a rogue process on the cluster's network without them.
func (c *Cluster) AddHost(ctx context.Context, label, id, ip string, member bool, args ...string) *Host {
	c.t.Helper()
	h := &Host{c: c, ID: id, NS: netnstest.New(c.t, label), Dev: "eth0", IP: ip, outsider: !member, args: args}
	h.identity = filepath.Join(c.dir, label+".key")
	port, err := c.Bridge.Attach(ctx, h.NS, h.Dev, h.IP+"/24")
	if err != nil {
		c.t.Fatalf("multihost: attach %s: %v", label, err)
	}
	h.Port = port
	h.Start(ctx)
	return h
}

// Connect opens the control channel from a's worker to b's. Right after b
// restarted, a's earlier failed dials may hold it back for a while (libp2p
// dial backoff), so it retries for up to 15 s and logs how long it took.
func (c *Cluster) Connect(ctx context.Context, a, b *Host) {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(15 * time.Second)
	for tries := 1; ; tries++ {
		r, err := a.W.Call(ctx, Request{Op: "connect", Peer: b.W.Ready.Peer, Addrs: b.W.Ready.Addrs, TimeoutMS: 10_000})
		if err == nil && r.OK {
			if tries > 1 {
				c.t.Logf("multihost: %s connected to %s after %d tries, %.2f s", a.ID, b.ID, tries, time.Since(start).Seconds())
			}
			return
		}
		if err != nil || time.Now().After(deadline) {
			c.t.Fatalf("multihost: connect %s to %s (%d tries, %.1f s): %v %s", a.ID, b.ID, tries, time.Since(start).Seconds(), err, r.Error)
		}
		t := time.NewTimer(200 * time.Millisecond) // spacing between retries, not a wait for work
		select {
		case <-ctx.Done():
			t.Stop()
			c.t.Fatalf("multihost: connect %s to %s: %v", a.ID, b.ID, ctx.Err())
		case <-t.C:
		}
	}
}

// Start runs a worker on h with the cluster's flags and extra, waits until
// it is ready and registers its teardown. The identity and addresses stay
// the same across restarts.
func (h *Host) Start(ctx context.Context, extra ...string) *Worker {
	t := h.c.t
	t.Helper()
	o := h.c.opts
	args := []string{"netns", "exec", h.NS.Name, h.c.bin, "worker",
		"--preset", o.Preset, "--hosts", fmt.Sprint(o.Hosts), "--host", h.ID,
		"--device-memory", o.DeviceMemory, "--stall-timeout", o.StallTimeout.String(),
		"--listen-addrs", fmt.Sprintf("/ip4/%s/tcp/%d", h.IP, controlPort),
		"--data-addr", fmt.Sprintf("%s:%d", h.IP, dataPort),
		"--rdma-ip", h.IP,
		"--identity-file", h.identity,
	}
	if !h.outsider {
		args = append(args, o.Args...)
	}
	args = append(append(args, h.args...), extra...)
	w, err := startWorker(ctx, h, args)
	if err != nil {
		t.Fatalf("multihost: start worker on %s: %v", h.ID, err)
	}
	t.Cleanup(func() {
		w.Stop()
		if t.Failed() {
			t.Logf("worker %s (pid %d) stderr, last lines:\n%s", h.ID, w.Pid(), w.stderr.String())
		}
	})
	h.W = w
	return w
}

// SetArgs sets extra flags for this host's later starts (e.g. a rogue
// without the cluster key).
func (h *Host) SetArgs(args ...string) { h.args = args }

// Restart kills the worker if it still runs and starts a new one under the
// same identity and addresses.
func (h *Host) Restart(ctx context.Context) *Worker {
	h.W.Kill()
	return h.Start(ctx)
}

// SetLink plugs or unplugs the host's cable at the bridge: traffic stops
// without either end seeing the interface go away.
func (h *Host) SetLink(ctx context.Context, up bool) error {
	return h.c.Bridge.NS.SetLink(ctx, h.Port, up)
}

// TxBytes is how many bytes the host has sent.
func (h *Host) TxBytes(ctx context.Context) (uint64, error) {
	s, err := h.NS.Stats(ctx, h.Dev)
	return s.TxBytes, err
}

// Worker is one running `tensorlane worker` process.
type Worker struct {
	Host   *Host
	Ready  Info
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *tailBuffer

	mu      sync.Mutex
	next    int64
	pending map[int64]chan Reply
	exited  chan struct{}
	waitErr error
	stopped bool
}

// ErrWorkerExited is returned by calls to a worker that has died.
var ErrWorkerExited = errors.New("multihost: worker exited")

func startWorker(ctx context.Context, h *Host, args []string) (*Worker, error) {
	cmd := exec.Command("ip", args...)
	// Own process group, so Kill reaches anything the worker started, and
	// death with the test process even if it crashes before its cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Each namespace is a machine of its own, with its own device claims
	// (a rogue or late joiner may reuse a topology host name; another test
	// package's workers are no conflict either). Restarts in one namespace
	// share them, as restarts on one machine do.
	cmd.Env = append(os.Environ(), "TENSORLANE_RUNTIME_DIR="+filepath.Join(h.c.dir, "claims", h.NS.Name))
	w := &Worker{Host: h, cmd: cmd, stderr: &tailBuffer{max: 16 << 10}, pending: map[int64]chan Reply{}, exited: make(chan struct{})}
	cmd.Stderr = w.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w.stdin = stdin
	if err := spawn(cmd); err != nil {
		return nil, err
	}
	ready := make(chan Info, 1)
	go w.readLoop(stdout, ready)
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case info := <-ready:
		w.Ready = info
		return w, nil
	case <-w.exited:
		return nil, fmt.Errorf("%w before it was ready: %v: %s", ErrWorkerExited, w.waitErr, w.stderr.String())
	case <-ctx.Done():
	case <-t.C:
	}
	w.Kill()
	return nil, fmt.Errorf("worker not ready in time: %s", w.stderr.String())
}

func (w *Worker) readLoop(stdout io.Reader, ready chan<- Info) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r Reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		if r.Event == "ready" && r.Info != nil {
			ready <- *r.Info
			continue
		}
		w.mu.Lock()
		ch := w.pending[r.ID]
		delete(w.pending, r.ID)
		w.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	err := w.cmd.Wait()
	w.mu.Lock()
	w.waitErr = err
	w.mu.Unlock()
	close(w.exited)
}

// Pdeathsig fires when the OS thread that forked the child exits, not the
// process, and Go ends a thread whenever a goroutine exits locked to it
// (netns.Do does exactly that). So every worker is forked from one thread
// that lives as long as the test process.
var spawnCh = sync.OnceValue(func() chan spawnReq {
	ch := make(chan spawnReq)
	go spawner(ch)
	return ch
})

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func spawner(ch chan spawnReq) {
	runtime.LockOSThread() // never unlocked: this goroutine never returns
	for r := range ch {
		r.done <- r.cmd.Start()
	}
}

func spawn(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawnCh() <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// Pid is the worker's process id.
func (w *Worker) Pid() int { return w.cmd.Process.Pid }

// Go sends a request and returns a channel that receives its reply, or an
// error when the worker dies first.
func (w *Worker) Go(req Request) <-chan Result {
	out := make(chan Result, 1)
	ch := make(chan Reply, 1)
	w.mu.Lock()
	w.next++
	req.ID = w.next
	w.pending[req.ID] = ch
	w.mu.Unlock()
	b, _ := json.Marshal(req)
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		out <- Result{Err: w.exitError(err), At: time.Now()}
		return out
	}
	go func() {
		select {
		case r := <-ch:
			out <- Result{Reply: r, At: time.Now()}
		case <-w.exited:
			out <- Result{Err: w.exitError(nil), At: time.Now()}
		}
	}()
	return out
}

// exitError describes the worker's death: exit status and last words.
func (w *Worker) exitError(cause error) error {
	select {
	case <-w.exited:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%w: %v", ErrWorkerExited, cause)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Errorf("%w (%s, pid %d): %v; stderr: %s", ErrWorkerExited, w.Host.ID, w.cmd.Process.Pid, w.waitErr, w.stderr.String())
}

// Result is a reply or the worker's death, with when it arrived.
type Result struct {
	Reply
	Err error
	At  time.Time
}

// Call sends a request and waits for its reply, at most until ctx ends.
func (w *Worker) Call(ctx context.Context, req Request) (Reply, error) {
	select {
	case r := <-w.Go(req):
		return r.Reply, r.Err
	case <-ctx.Done():
		return Reply{}, ctx.Err()
	}
}

// Info asks the worker for its identity and memory.
func (w *Worker) Info(ctx context.Context) (Info, error) {
	r, err := w.Call(ctx, Request{Op: "info"})
	if err != nil {
		return Info{}, err
	}
	if r.Info == nil {
		return Info{}, fmt.Errorf("multihost: info reply without info: %s", r.Error)
	}
	return *r.Info, nil
}

// Kill sends SIGKILL to the worker's process group and waits for it to be
// gone: the abrupt death of a host. It is idempotent.
func (w *Worker) Kill() {
	select {
	case <-w.exited:
		return
	default:
	}
	syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
	<-w.exited
}

// Stop shuts the worker down cleanly (closing its stdin), and kills it if
// it has not exited within 10 s.
func (w *Worker) Stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	w.mu.Unlock()
	w.stdin.Close()
	start := time.Now()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-w.exited:
		if d := time.Since(start); d > 2*time.Second {
			w.Host.c.t.Logf("multihost: worker %s took %.1f s to shut down", w.Host.ID, d.Seconds())
		}
	case <-t.C:
		w.Host.c.t.Logf("multihost: worker %s did not shut down within 10 s of its stdin closing; killed", w.Host.ID)
		w.Kill()
	}
}

// Exited is closed when the worker process has ended.
func (w *Worker) Exited() <-chan struct{} { return w.exited }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// Binary builds the tensorlane command once per test process and returns
// its path. Cleanup removes it (call it from TestMain).
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "tensorlane-multihost-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "tensorlane")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", buildBin, "github.com/tensorlane/tensorlane/cmd/tensorlane").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tensorlane: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("multihost: %v", buildErr)
	}
	return buildBin
}

// Cleanup removes the binary Binary built.
func Cleanup() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// WaitFor polls cond until it holds or ctx ends; it returns ctx's error
// then. For conditions another process changes (memory back to baseline,
// bytes on the wire), where there is nothing to block on.
func WaitFor(ctx context.Context, every time.Duration, cond func() bool) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
