package linkstat

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func suffix() string {
	var b [3]byte
	rand.Read(b[:])
	return fmt.Sprintf("%d%s", os.Getpid()%100000, hex.EncodeToString(b[:]))
}

// childCgroup creates a cgroup v2 directory for this test process and
// moves the process into it, so the sock_ops program sees only this
// process's sockets; cleanup moves it back and removes the directory.
func childCgroup(t testing.TB) string {
	t.Helper()
	mount, err := cgroup2Mount()
	if err != nil {
		t.Skipf("eBPF mode needs a cgroup v2 hierarchy: %v", err)
	}
	orig, err := selfCgroup2(mount)
	if err != nil {
		t.Skipf("eBPF mode: %v", err)
	}
	dir := filepath.Join(mount, "tensorlane-linkstat-"+suffix())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("eBPF mode needs to create a cgroup (run as root): %v", err)
	}
	pid := []byte(fmt.Sprint(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		os.Remove(dir)
		t.Skipf("eBPF mode: cannot move the test into its cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(filepath.Join(orig, "cgroup.procs"), pid, 0); err != nil {
			t.Errorf("move back to %s: %v", orig, err)
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	})
	return dir
}

// tcpPair returns both ends of a TCP connection made through ln.
func tcpPair(t testing.TB, ln net.Listener, dial func() (net.Conn, error)) (client, server net.Conn) {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		accepted <- c
	}()
	client, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-accepted:
	case err := <-errc:
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func loopbackPair(t testing.TB) (client, server net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return tcpPair(t, ln, func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) })
}

// send writes n bytes from a to b and waits until b has read them all.
func send(t testing.TB, a, b net.Conn, n int64) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, b, n)
		done <- err
	}()
	buf := make([]byte, 64<<10)
	for left := n; left > 0; {
		k := min(left, int64(len(buf)))
		if _, err := a.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		left -= k
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// nsPair is two network namespaces joined by a veth pair, for a link this
// test may shape (lo is never shaped).
type nsPair struct {
	a, b     string // namespace names
	vethA    string
	ipA, ipB string
	shaped   bool
}

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newNSPair(t *testing.T) *nsPair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (iproute2): %v", tool, err)
		}
	}
	s := suffix()
	p := &nsPair{a: "tlls-a-" + s, b: "tlls-b-" + s, vethA: "tla" + s[len(s)-6:], ipA: "10.213.7.1", ipB: "10.213.7.2"}
	vethB := "tlb" + s[len(s)-6:]
	run(t, "ip", "netns", "add", p.a)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", p.a).Run() })
	run(t, "ip", "netns", "add", p.b)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", p.b).Run() })
	run(t, "ip", "link", "add", p.vethA, "netns", p.a, "type", "veth", "peer", "name", vethB, "netns", p.b)
	run(t, "ip", "-n", p.a, "addr", "add", p.ipA+"/24", "dev", p.vethA)
	run(t, "ip", "-n", p.b, "addr", "add", p.ipB+"/24", "dev", vethB)
	for _, ns := range []string{p.a, p.b} {
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", p.a, "link", "set", p.vethA, "up")
	run(t, "ip", "-n", p.b, "link", "set", vethB, "up")
	return p
}

// shape limits a's egress with a token bucket: a small queue turns a bulk
// transfer into queueing delay (RTT) and tail drops (retransmissions).
// This kernel has no netem, so delay and loss come from the bottleneck.
func (p *nsPair) shape(t *testing.T, rate, burst, limit string) {
	run(t, "ip", "netns", "exec", p.a, "tc", "qdisc", "add", "dev", p.vethA, "root", "tbf", "rate", rate, "burst", burst, "limit", limit)
	p.shaped = true
}

// in runs fn with the calling thread in namespace ns: sockets fn creates
// live in ns for their whole life.
func (p *nsPair) in(t *testing.T, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("setns %s: %v", ns, err)
	}
	fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: Go retires it with this goroutine, so
		// no other goroutine runs in the wrong namespace.
		t.Fatalf("setns back: %v", err)
	}
	runtime.UnlockOSThread()
}

// connect makes a TCP connection from namespace a to namespace b.
func (p *nsPair) connect(t *testing.T) (client, server net.Conn) {
	t.Helper()
	var ln net.Listener
	p.in(t, p.b, func() {
		var err error
		ln, err = net.Listen("tcp", p.ipB+":0")
		if err != nil {
			t.Fatal(err)
		}
	})
	defer ln.Close()
	var c net.Conn
	var derr error
	p.in(t, p.a, func() { c, derr = net.Dial("tcp", ln.Addr().String()) })
	return tcpPair(t, ln, func() (net.Conn, error) { return c, derr })
}
