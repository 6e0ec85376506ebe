package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package creates.
const Prefix = "tln"

// DefaultTimeout bounds every ip/tc command run without a deadline.
const DefaultTimeout = 20 * time.Second

// ErrUnavailable reports that network namespaces cannot be used here (not
// root, or ip/tc missing).
var ErrUnavailable = errors.New("netns: network namespaces unavailable")

// ErrNoNetem reports that the kernel lacks the netem qdisc, so delay and
// loss cannot be emulated; rate shaping (tbf) still works.
var ErrNoNetem = errors.New("netns: kernel has no netem qdisc")

var labelRE = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

// Available reports whether namespaces can be created, and why not.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not running as root", ErrUnavailable)
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s(8) not found in PATH", ErrUnavailable, tool)
		}
	}
	return nil
}

var probeOnce = sync.OnceValue(func() error {
	if err := Available(); err != nil {
		return err
	}
	// Being root is not enough inside some containers: try once.
	ns, err := Create("probe")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return ns.Delete()
})

// Usable reports whether namespaces, ip and tc work here, by creating one
// the first time it is asked (being root is not enough inside some
// containers); later calls return the first answer.
func Usable() error { return probeOnce() }

// NS is a network namespace created by this package.
type NS struct {
	Name string

	mu      sync.Mutex
	deleted bool
}

// Create creates a namespace whose name contains label (lowercase letters
// and digits, at most 12), with its loopback up; the caller must Delete it
// (netnstest.New deletes it when the test ends).
func Create(label string) (*NS, error) {
	if !labelRE.MatchString(label) {
		return nil, fmt.Errorf("netns: label %q: want 1-12 lowercase letters or digits", label)
	}
	var r [4]byte
	rand.Read(r[:])
	name := fmt.Sprintf("%s%d-%s-%s", Prefix, os.Getpid(), label, hex.EncodeToString(r[:]))
	if _, err := run(context.Background(), "ip", "netns", "add", name); err != nil {
		return nil, err
	}
	ns := &NS{Name: name}
	if err := ns.IP(context.Background(), "link", "set", "lo", "up"); err != nil {
		ns.Delete()
		return nil, err
	}
	return ns, nil
}

// Delete removes the namespace and with it every interface inside (a veth
// pair dies with either end). It is idempotent.
func (ns *NS) Delete() error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.deleted {
		return nil
	}
	if _, err := run(context.Background(), "ip", "netns", "delete", ns.Name); err != nil {
		if _, serr := os.Stat(ns.path()); !os.IsNotExist(serr) {
			return err
		}
	}
	ns.deleted = true
	return nil
}

func (ns *NS) path() string { return filepath.Join("/var/run/netns", ns.Name) }

func (ns *NS) String() string { return ns.Name }

// IP runs `ip -n <ns> args...`.
func (ns *NS) IP(ctx context.Context, args ...string) error {
	_, err := run(ctx, "ip", append([]string{"-n", ns.Name}, args...)...)
	return err
}

// Exec runs a command inside the namespace (`ip netns exec`) and returns
// its combined output.
func (ns *NS) Exec(ctx context.Context, name string, args ...string) ([]byte, error) {
	return run(ctx, "ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
}

// AddAddr assigns an address in CIDR form (e.g. "10.1.0.1/24") to dev.
func (ns *NS) AddAddr(ctx context.Context, dev, cidr string) error {
	return ns.IP(ctx, "addr", "add", cidr, "dev", dev)
}

// SetLink brings dev up or down: down cuts the link mid-transfer, packets
// in flight are lost and TCP connections over it stall until it is up again.
func (ns *NS) SetLink(ctx context.Context, dev string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ns.IP(ctx, "link", "set", dev, state)
}

// Shape describes how tc shapes a link's egress. Zero fields are not
// applied; the zero Shape removes shaping.
type Shape struct {
	Rate   string        // tc rate, e.g. "1gbit" (tbf)
	Burst  string        // tbf burst; default 512kb, enough for GSO packets at 1gbit
	Delay  time.Duration // one-way delay (netem)
	Jitter time.Duration // netem jitter, with Delay
	Loss   float64       // packet loss in percent (netem)
	Limit  int           // queue length in packets for netem (default 10000)
}

// Shape applies s to dev's egress, replacing any earlier shaping. Shape
// both ends of a veth pair to shape both directions.
func (ns *NS) Shape(ctx context.Context, dev string, s Shape) error {
	// Start from the default qdisc. Deleting fails harmlessly when there is
	// no root qdisc to delete; a real problem shows in the add below.
	ns.tc(ctx, "qdisc", "del", "dev", dev, "root")
	netem := s.Delay > 0 || s.Loss > 0
	tbf := func(parent ...string) []string {
		burst := s.Burst
		if burst == "" {
			burst = "512kb"
		}
		args := append([]string{"qdisc", "add", "dev", dev}, parent...)
		return append(args, "tbf", "rate", s.Rate, "burst", burst, "latency", "100ms")
	}
	switch {
	case !netem && s.Rate == "":
		return nil
	case !netem:
		return ns.tc(ctx, tbf("root", "handle", "1:")...)
	}
	args := []string{"qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"}
	if s.Delay > 0 {
		args = append(args, "delay", tcDuration(s.Delay))
		if s.Jitter > 0 {
			args = append(args, tcDuration(s.Jitter))
		}
	}
	if s.Loss > 0 {
		args = append(args, "loss", strconv.FormatFloat(s.Loss, 'f', -1, 64)+"%")
	}
	limit := s.Limit
	if limit <= 0 {
		limit = 10000
	}
	args = append(args, "limit", strconv.Itoa(limit))
	if err := ns.tc(ctx, args...); err != nil {
		if strings.Contains(err.Error(), "qdisc kind is unknown") {
			// Some kernels are built without sch_netem (CONFIG_NET_SCH_NETEM).
			return fmt.Errorf("%w: %w: %v", ErrUnavailable, ErrNoNetem, err)
		}
		return err
	}
	if s.Rate != "" {
		// tbf as netem's child: delay first, then the rate limit.
		return ns.tc(ctx, tbf("parent", "1:1", "handle", "10:")...)
	}
	return nil
}

func tcDuration(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) + "us" }

func (ns *NS) tc(ctx context.Context, args ...string) error {
	_, err := run(ctx, "tc", append([]string{"-n", ns.Name}, args...)...)
	return err
}

// Do runs fn on an OS thread that has entered the namespace. Sockets fn
// creates belong to the namespace for their whole life, wherever they are
// used afterwards. The thread is discarded after fn (never returned to the
// Go scheduler in the namespace), so no other goroutine runs there by
// accident.
func (ns *NS) Do(fn func() error) error {
	f, err := os.Open(ns.path())
	if err != nil {
		return fmt.Errorf("netns: open %s: %w", ns.Name, err)
	}
	defer f.Close()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's exit terminates the thread, so the
		// namespace switch cannot leak to other goroutines.
		runtime.LockOSThread()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netns: setns %s: %w", ns.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Listen creates a listener inside the namespace.
func (ns *NS) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := ns.Do(func() error {
		var err error
		l, err = (&net.ListenConfig{}).Listen(ctx, network, addr)
		return err
	})
	return l, err
}

// Dial connects from inside the namespace; the connection stays there.
func (ns *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// DialFunc returns a dial function that connects from inside the
// namespace, in the shape net.Dialer.DialContext has.
func (ns *NS) DialFunc() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return ns.Dial
}

// Veth joins a and b with a veth pair: aDev in a, bDev in b (interface names
// of at most 15 bytes; they only need to be unique within each namespace).
// Both ends are brought up; when aCIDR/bCIDR are not empty they are
// assigned. The pair disappears with either namespace.
func Veth(ctx context.Context, a *NS, aDev, aCIDR string, b *NS, bDev, bCIDR string) error {
	if len(aDev) > 15 || len(bDev) > 15 || aDev == "" || bDev == "" {
		return fmt.Errorf("netns: interface names %q, %q: want 1-15 bytes", aDev, bDev)
	}
	if err := a.IP(ctx, "link", "add", aDev, "type", "veth", "peer", "name", bDev, "netns", b.Name); err != nil {
		return err
	}
	for _, e := range []struct {
		ns        *NS
		dev, cidr string
	}{{a, aDev, aCIDR}, {b, bDev, bCIDR}} {
		if e.cidr != "" {
			if err := e.ns.AddAddr(ctx, e.dev, e.cidr); err != nil {
				return err
			}
		}
		if err := e.ns.SetLink(ctx, e.dev, true); err != nil {
			return err
		}
	}
	return nil
}

// Bridge is a namespace holding a Linux bridge that other namespaces attach
// to, like hosts plugged into one switch.
type Bridge struct {
	NS  *NS
	Dev string
	n   int
	mu  sync.Mutex
}

// CreateBridge creates a bridge namespace with a bridge device "br0" that
// is up; the caller must Delete b.NS (netnstest.NewBridge deletes it when
// the test ends).
func CreateBridge(label string) (*Bridge, error) {
	ns, err := Create(label)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	err = ns.IP(ctx, "link", "add", "br0", "type", "bridge")
	if err == nil {
		err = ns.SetLink(ctx, "br0", true)
	}
	if err != nil {
		ns.Delete()
		return nil, err
	}
	return &Bridge{NS: ns, Dev: "br0"}, nil
}

// Attach plugs host into the bridge with a veth pair: dev (with cidr) in
// host, an enslaved port in the bridge namespace, whose name it returns
// (cut it with b.NS.SetLink to isolate host).
func (b *Bridge) Attach(ctx context.Context, host *NS, dev, cidr string) (port string, err error) {
	b.mu.Lock()
	b.n++
	port = fmt.Sprintf("p%d", b.n)
	b.mu.Unlock()
	if err := Veth(ctx, b.NS, port, "", host, dev, cidr); err != nil {
		return "", err
	}
	return port, b.NS.IP(ctx, "link", "set", port, "master", b.Dev)
}

// Sweep deletes namespaces this package created in processes that no
// longer run (a test binary that crashed before its cleanup). Namespaces
// of live processes are left alone. It returns the names it deleted.
func Sweep() []string {
	out, err := run(context.Background(), "ip", "netns", "list")
	if err != nil {
		return nil
	}
	var deleted []string
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		pid, ok := ownerPID(name)
		if !ok || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		if _, err := run(context.Background(), "ip", "netns", "delete", name); err == nil {
			deleted = append(deleted, name)
		}
	}
	return deleted
}

// ownerPID extracts the pid from a name this package made.
func ownerPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return 0, false
	}
	p, rest, ok := strings.Cut(rest, "-")
	if !ok || strings.Count(rest, "-") != 1 {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// run executes a command with a bounded default timeout and returns its
// combined output; a failure carries the command line and its output.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("netns: %s %s: %v: %s", name, strings.Join(args, " "), err,
			strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}
