package fabrictest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// The abuse suite: what a hostile or broken peer does to a data listener
// (the tcp server, each rdma rail, the shm socket), run the same way
// against each. Every case checks that the listener ends the abusive
// connection within a bound, keeps no descriptor or goroutine for it, counts
// what the metrics promise, and serves an honest reader afterwards.

// AbuseConfig is what the suite asks of the listener a harness starts.
type AbuseConfig struct {
	Limits           fabric.ListenerLimits
	Metrics          *fabric.ListenerMetrics
	HandshakeTimeout time.Duration // bound on an unauthenticated connection
	// StallTimeout bounds how long the server blocks writing to a peer
	// that reads nothing (the shm server's HoldTimeout, which bounds a
	// grant never confirmed, is set to it too).
	StallTimeout time.Duration
}

// AbuseHarness adapts one data listener to the abuse suite.
type AbuseHarness struct {
	// Setup starts the listener configured by cfg, serving src and sink,
	// and registers its cleanup with t.Cleanup.
	Setup func(t testing.TB, src fabric.Source, sink fabric.Sink, cfg AbuseConfig) AbuseTarget
}

// AbuseTarget is one listener under abuse.
type AbuseTarget struct {
	// Listener is the listener's label in cfg.Metrics ("tcp", "shm",
	// "rdma/nic0").
	Listener string
	// Dial opens a raw connection to the listener: no handshake.
	Dial func(ctx context.Context) (net.Conn, error)
	// Handshake authenticates c as the attacker: one identity, the same on
	// every call, that the owner admits. It returns the connection to send
	// requests on (c itself, or a wrapper).
	Handshake func(ctx context.Context, c net.Conn) (net.Conn, error)
	// Oversized is what the attacker sends after the handshake: a request
	// whose length field is far beyond what the protocol allows.
	Oversized []byte
	// Unread sends, on an authenticated connection, requests that make the
	// server write far more than socket buffers hold (reads of big, a
	// readable object), and returns without reading anything.
	Unread func(ctx context.Context, c net.Conn, big fabric.Remote) error
	// Reader returns a fresh reader-side transport (no pooled connection:
	// each call dials anew) that reaches the listener, and Remote addresses
	// the owner (the suite fills in Claim, Offset and Length).
	Reader func(t testing.TB) fabric.Transport
	Remote fabric.Remote
	// Conns reports how many connections the listener holds now.
	Conns func() int
}

// abuseBound is how long the server may take to end an abusive connection
// beyond the timeout that applies (generous: -race on 2 loaded cores).
const abuseBound = 20 * time.Second

// abuseCfg is the configuration of every case: small caps, and timeouts
// long enough that no connection a case holds on purpose times out under
// load; the cases about a timeout shorten it (short).
var abuseCfg = AbuseConfig{
	Limits:           fabric.ListenerLimits{MaxConns: 16, MaxConnsPerPeer: 4, IdleTimeout: time.Minute},
	HandshakeTimeout: time.Minute,
	StallTimeout:     time.Second,
}

// The short timeouts of the cases about timeouts: each such case waits
// its timeout out on the wall clock (the listeners enforce them with socket
// deadlines), so it runs with a short one.
const (
	shortHandshake = 500 * time.Millisecond
	shortIdle      = 300 * time.Millisecond
	shortStall     = 300 * time.Millisecond
)

func shortHandshakeCfg(c *AbuseConfig) { c.HandshakeTimeout = shortHandshake }
func shortIdleCfg(c *AbuseConfig)      { c.Limits.IdleTimeout = shortIdle }
func shortStallCfg(c *AbuseConfig)     { c.StallTimeout = shortStall }

const fdFloodEnv = "TENSORLANE_FABRICTEST_FDFLOOD"

// RunAbuse runs the abuse suite against h: garbage, oversized length fields,
// half handshakes, idle authenticated connections, floods past the
// connection caps and past the process's fd limit (in a child process: the
// limit is process-wide), and a peer that reads nothing.
func RunAbuse(t *testing.T, h AbuseHarness) {
	if h.Setup == nil {
		t.Fatal("fabrictest: AbuseHarness.Setup is required")
	}
	owner, err := newStore(256 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.close() })
	reader, err := tensor.NewSimMemory(tensor.GPUDevice(1), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	a := &abuse{h: h, owner: owner, reader: reader}
	if os.Getenv(fdFloodEnv) == t.Name() {
		a.fdFloodChild(t)
		return
	}
	for _, c := range []struct {
		name string
		run  func(*abuse, *testing.T, AbuseTarget, *fabric.ListenerMetrics)
		cfg  func(*AbuseConfig)
	}{
		{"Garbage", (*abuse).garbage, shortHandshakeCfg},
		{"OversizedHandshakeField", (*abuse).oversizedHandshake, shortHandshakeCfg},
		{"OversizedRequest", (*abuse).oversizedRequest, nil},
		{"HalfHandshake", (*abuse).halfHandshake, shortHandshakeCfg},
		{"IdleAuthenticated", (*abuse).idle, shortIdleCfg},
		{"FloodPastTotalCap", (*abuse).floodTotal, nil},
		{"FloodPastPeerCap", (*abuse).floodPeer, nil},
		{"ReadsNothing", (*abuse).readsNothing, shortStallCfg},
		{"FloodPastFDLimit", (*abuse).fdFlood, nil},
	} {
		leaks := goleak.IgnoreCurrent()
		ok := t.Run(c.name, func(t *testing.T) {
			m := fabric.NewListenerMetrics(nil)
			cfg := abuseCfg
			cfg.Metrics = m
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			tg := h.Setup(t, owner, owner, cfg)
			c.run(a, t, tg, m)
		})
		if ok {
			if err := goleak.Find(leaks); err != nil {
				t.Errorf("%s: goroutines left after cleanup: %v", c.name, err)
			}
		}
	}
}

type abuse struct {
	h      AbuseHarness
	owner  *store
	reader *tensor.SimMemory
}

// honest reads a small object with a fresh reader and checks its bytes.
func (a *abuse) honest(t *testing.T, tg AbuseTarget) error {
	t.Helper()
	const n = 64 << 10
	o, err := a.owner.put(context.Background(), n)
	if err != nil {
		t.Fatalf("owner: %v", err)
	}
	defer a.owner.free(o)
	dst, err := a.reader.Alloc(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Release()
	tr := tg.Reader(t)
	defer tr.Close()
	r := tg.Remote
	r.Claim, r.Offset, r.Length = a.owner.claim(o), 0, n
	ctx, cancel := context.WithTimeout(context.Background(), abuseBound)
	defer cancel()
	return within(t, abuseBound+5*time.Second, "an honest read", func() error {
		if _, err := tr.Read(ctx, r, dst); err != nil {
			return err
		}
		got, _ := tensor.BytesOf(dst)
		want, _ := tensor.BytesOf(o.buf)
		if string(got) != string(want[:n]) {
			return errors.New("fabrictest: the honest read got the wrong bytes")
		}
		return nil
	})
}

// mustServeHonest fails the test unless an honest reader is served (within
// a few tries: a listener backing off after EMFILE waits up to a second).
func (a *abuse) mustServeHonest(t *testing.T, tg AbuseTarget, after string) {
	t.Helper()
	var err error
	for range 5 {
		if err = a.honest(t, tg); err == nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("after %s, an honest reader is not served: %v", after, err)
}

// closedWithin reads from c until the server closes it (EOF or reset), and
// fails the test if that takes longer than bound. Bytes the server sends
// first (an error status) are fine.
func closedWithin(t *testing.T, c net.Conn, bound time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(bound))
	buf := make([]byte, 64<<10)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("HUNG: the server kept %s open for %v", what, bound)
		}
		return time.Since(start)
	}
}

func (a *abuse) dial(t *testing.T, tg AbuseTarget) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), abuseBound)
	defer cancel()
	c, err := tg.Dial(ctx)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (a *abuse) authed(t *testing.T, tg AbuseTarget) net.Conn {
	t.Helper()
	c := a.dial(t, tg)
	ctx, cancel := context.WithTimeout(context.Background(), abuseBound)
	defer cancel()
	ac, err := tg.Handshake(ctx, c)
	if err != nil {
		t.Fatalf("attacker handshake: %v", err)
	}
	return ac
}

// noConns waits until the listener holds no connection.
func noConns(t *testing.T, tg AbuseTarget) {
	t.Helper()
	deadline := time.Now().Add(abuseBound)
	for tg.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the listener still holds %d connections after the abuse ended", tg.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (a *abuse) garbage(t *testing.T, tg AbuseTarget, _ *fabric.ListenerMetrics) {
	c := a.dial(t, tg)
	junk := make([]byte, 64<<10)
	rand.Read(junk)
	c.SetWriteDeadline(time.Now().Add(abuseBound))
	c.Write(junk) // may fail once the server hangs up
	closedWithin(t, c, shortHandshake+abuseBound, "a connection sending garbage")
	noConns(t, tg)
	a.mustServeHonest(t, tg, "garbage")
}

func (a *abuse) oversizedHandshake(t *testing.T, tg AbuseTarget, _ *fabric.ListenerMetrics) {
	c := a.dial(t, tg)
	// Every handshake field is length-prefixed (two bytes): claim the most.
	c.Write([]byte{0xff, 0xff, 1, 2, 3})
	closedWithin(t, c, shortHandshake+abuseBound, "a handshake with an oversized field")
	noConns(t, tg)
	a.mustServeHonest(t, tg, "an oversized handshake field")
}

func (a *abuse) oversizedRequest(t *testing.T, tg AbuseTarget, _ *fabric.ListenerMetrics) {
	c := a.authed(t, tg)
	c.SetWriteDeadline(time.Now().Add(abuseBound))
	if _, err := c.Write(tg.Oversized); err != nil {
		t.Fatalf("sending the oversized request: %v", err)
	}
	// Closed at once: the idle timeout (a minute) is not the reason.
	closedWithin(t, c, abuseBound, "a connection after an oversized request")
	noConns(t, tg)
	a.mustServeHonest(t, tg, "an oversized request")
}

func (a *abuse) halfHandshake(t *testing.T, tg AbuseTarget, _ *fabric.ListenerMetrics) {
	var cs []net.Conn
	for i := range 4 {
		c := a.dial(t, tg)
		if i%2 == 1 {
			c.Write([]byte{0}) // half of a field's length
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		closedWithin(t, c, shortHandshake+abuseBound, "a half handshake")
	}
	noConns(t, tg)
	a.mustServeHonest(t, tg, "half handshakes")
}

func (a *abuse) idle(t *testing.T, tg AbuseTarget, m *fabric.ListenerMetrics) {
	c := a.authed(t, tg)
	d := closedWithin(t, c, shortIdle+abuseBound, "an idle authenticated connection")
	if d < shortIdle/2 {
		t.Errorf("an idle connection was closed after %v, before its idle timeout %v", d, shortIdle)
	}
	noConns(t, tg)
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues(tg.Listener, "idle")); got < 1 {
		t.Errorf("tensorlane_listener_dropped_total{reason=idle} = %v, want >= 1", got)
	}
	a.mustServeHonest(t, tg, "an idle connection")
}

func (a *abuse) floodTotal(t *testing.T, tg AbuseTarget, m *fabric.ListenerMetrics) {
	limit := abuseCfg.Limits.MaxConns
	if got := testutil.ToFloat64(m.Limit.WithLabelValues(tg.Listener, "total")); got != float64(limit) {
		t.Errorf("tensorlane_listener_connection_limit{scope=total} = %v, want %d", got, limit)
	}
	var held []net.Conn
	for range limit {
		held = append(held, a.dial(t, tg))
	}
	deadline := time.Now().Add(abuseBound)
	for tg.Conns() < limit && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	extra := 2 * limit
	for range extra {
		c := a.dial(t, tg)
		closedWithin(t, c, abuseBound, "a connection past the cap")
	}
	if got := testutil.ToFloat64(m.Rejected.WithLabelValues(tg.Listener, "total_cap")); got < float64(extra) {
		t.Errorf("tensorlane_listener_rejected_total{reason=total_cap} = %v, want >= %d", got, extra)
	}
	if n := tg.Conns(); n > limit {
		t.Errorf("the listener holds %d connections, cap %d", n, limit)
	}
	for _, c := range held {
		c.Close()
	}
	noConns(t, tg)
	a.mustServeHonest(t, tg, "a flood past the connection cap")
}

func (a *abuse) floodPeer(t *testing.T, tg AbuseTarget, m *fabric.ListenerMetrics) {
	per, extra := abuseCfg.Limits.MaxConnsPerPeer, 3
	// The attacker authenticates per+extra connections. Which ones the
	// server admits depends on the order its handlers get there, so the
	// suite counts: extra are closed right after their handshakes (or
	// during them), per stay.
	var held []net.Conn
	for range per + extra {
		c := a.dial(t, tg)
		ctx, cancel := context.WithTimeout(context.Background(), abuseBound)
		ac, err := tg.Handshake(ctx, c)
		cancel()
		if err == nil {
			held = append(held, ac)
		}
	}
	rejected := func() float64 { return testutil.ToFloat64(m.Rejected.WithLabelValues(tg.Listener, "peer_cap")) }
	deadline := time.Now().Add(abuseBound)
	for rejected() < float64(extra) || tg.Conns() > per {
		if time.Now().After(deadline) {
			t.Fatalf("after %d connections of one peer (cap %d): %v rejected, %d held by the listener",
				per+extra, per, rejected(), tg.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := rejected(); got != float64(extra) {
		t.Errorf("tensorlane_listener_rejected_total{reason=peer_cap} = %v, want %d", got, extra)
	}
	if got := testutil.ToFloat64(m.Limit.WithLabelValues(tg.Listener, "peer")); got != float64(per) {
		t.Errorf("tensorlane_listener_connection_limit{scope=peer} = %v, want %d", got, per)
	}
	// Another identity is still served.
	a.mustServeHonest(t, tg, "a flood past the per-peer cap")
	for _, c := range held {
		c.Close()
	}
	noConns(t, tg)
}

func (a *abuse) readsNothing(t *testing.T, tg AbuseTarget, _ *fabric.ListenerMetrics) {
	if tg.Unread == nil {
		t.Skip("the harness sets no Unread")
	}
	const n = 64 << 20
	o, err := a.owner.put(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.owner.free(o)
	r := tg.Remote
	r.Claim, r.Offset, r.Length = a.owner.claim(o), 0, n
	c := a.authed(t, tg)
	ctx, cancel := context.WithTimeout(context.Background(), abuseBound)
	defer cancel()
	if err := tg.Unread(ctx, c, r); err != nil {
		t.Fatalf("Unread: %v", err)
	}
	// The server gives up on the connection within its stall timeout; the
	// suite sees it as connections and pins going away (it never reads).
	noConns(t, tg)
	deadline := time.Now().Add(pinBound)
	for a.owner.pins.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the owner still holds %d pins for a peer that reads nothing", a.owner.pins.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.mustServeHonest(t, tg, "a peer that reads nothing")
}

// fdFlood reruns this case in a child process (this test binary, only this
// test), where lowering RLIMIT_NOFILE cannot starve other tests.
func (a *abuse) fdFlood(t *testing.T, _ AbuseTarget, _ *fabric.ListenerMetrics) {
	parent := t.Name()[:strings.LastIndex(t.Name(), "/")]
	var pat []string
	for _, p := range strings.Split(parent, "/") {
		pat = append(pat, "^"+regexp.QuoteMeta(p)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pat, "/"), "-test.v", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), fdFloodEnv+"="+parent)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fd flood: served after EMFILE") {
		t.Fatalf("the fd-limit flood failed in the child (%v):\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "fd flood:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// fdFloodChild runs in the child: it fills the descriptor table with
// connections to the listener until its Accept fails with EMFILE, lets
// them go, and checks that an honest reader is served afterwards.
func (a *abuse) fdFloodChild(t *testing.T) {
	m := fabric.NewListenerMetrics(nil)
	cfg := AbuseConfig{Metrics: m, HandshakeTimeout: time.Minute, StallTimeout: abuseCfg.StallTimeout}
	tg := a.h.Setup(t, a.owner, a.owner, cfg)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// Ballast: descriptors to hand back one at a time.
	var ballast []*os.File
	for range 4 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		ballast = append(ballast, f)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	maxFD := 0
	for _, e := range fds {
		var n int
		fmt.Sscan(e.Name(), &n)
		maxFD = max(maxFD, n)
	}
	lim := uint64(maxFD + 1 + 16)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old)
			restored = true
		}
	}
	defer restore()
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	temporary := func() float64 { return testutil.ToFloat64(m.AcceptErrors.WithLabelValues(tg.Listener, "temporary")) }
	deadline := time.Now().Add(abuseBound)
	for temporary() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("fd flood: the listener never hit EMFILE (%d connections, limit %d)", len(flood), lim)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := tg.Dial(ctx)
		cancel()
		if err == nil {
			flood = append(flood, c)
			continue
		}
		if !errors.Is(err, syscall.EMFILE) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// The table is full: free one descriptor, which the next dial
		// takes, so accepting its connection must fail.
		if len(ballast) == 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		ballast[len(ballast)-1].Close()
		ballast = ballast[:len(ballast)-1]
	}
	errs, conns := temporary(), len(flood)
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	for _, f := range ballast {
		f.Close()
	}
	restore()
	a.mustServeHonest(t, tg, "fd exhaustion")
	noConns(t, tg)
	fmt.Printf("fd flood: served after EMFILE (%d connections, %v temporary accept errors, nofile %d)\n", conns, errs, lim)
}
