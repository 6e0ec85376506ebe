package netns_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/netns"
	"github.com/tensorlane/tensorlane/internal/netns/netnstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pair builds A <-> B over one veth pair 10.9.0.1/24 <-> 10.9.0.2/24.
func pair(t *testing.T) (a, b *netns.NS) {
	netnstest.Require(t)
	a, b = netnstest.New(t, "a"), netnstest.New(t, "b")
	if err := netns.Veth(ctxT(t), a, "ra", "10.9.0.1/24", b, "rb", "10.9.0.2/24"); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// echo serves one connection: it copies what it reads back.
func echo(t *testing.T, l net.Listener) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	t.Cleanup(func() { l.Close(); <-done })
}

func roundTrip(c net.Conn, msg string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	got := make([]byte, len(msg))
	_, err := io.ReadFull(c, got)
	return string(got), err
}

func TestSocketsBetweenNamespaces(t *testing.T) {
	a, b := pair(t)
	ctx := ctxT(t)
	l, err := a.Listen(ctx, "tcp", "10.9.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, l)
	c, err := b.Dial(ctx, "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello across namespaces"); err != nil || got != "hello across namespaces" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != "10.9.0.2" {
		t.Errorf("dialer local address %s, want 10.9.0.2 (inside B)", got)
	}
	// The root namespace of this process cannot reach 10.9.0.1.
	d := net.Dialer{Timeout: 300 * time.Millisecond}
	if c2, err := d.DialContext(ctx, "tcp", l.Addr().String()); err == nil {
		c2.Close()
		t.Errorf("dial from the root namespace reached a listener inside %s", a)
	}
}

func TestLinkDownCutsTraffic(t *testing.T) {
	a, b := pair(t)
	ctx := ctxT(t)
	l, err := a.Listen(ctx, "tcp", "10.9.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, l)
	c, err := b.Dial(ctx, "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLink(ctx, "rb", false); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	io.WriteString(c, "during")
	if _, err := io.ReadFull(c, make([]byte, 6)); err == nil {
		t.Fatal("read succeeded over a link that is down")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Logf("read over the cut link: %v", err)
	}
	if err := b.SetLink(ctx, "rb", true); err != nil {
		t.Fatal(err)
	}
	// TCP retransmits once the link is back: the echo arrives.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 6)); err != nil {
		t.Fatalf("after the link came back: %v", err)
	}
}

func TestShape(t *testing.T) {
	a, _ := pair(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name  string
		shape netns.Shape
		want  []string
	}{
		{"rate", netns.Shape{Rate: "1gbit"}, []string{"tbf", "rate 1Gbit"}},
		{"delay+loss", netns.Shape{Delay: 5 * time.Millisecond, Loss: 1.5}, []string{"netem", "delay 5ms", "loss 1.5%"}},
		{"all", netns.Shape{Rate: "100mbit", Delay: time.Millisecond, Jitter: 100 * time.Microsecond},
			[]string{"netem", "tbf", "rate 100Mbit"}},
		{"none", netns.Shape{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := a.Shape(ctx, "ra", tc.shape); errors.Is(err, netns.ErrNoNetem) {
				t.Skipf("skipping: %v", err)
			} else if err != nil {
				t.Fatal(err)
			}
			out, err := a.Exec(ctx, "tc", "qdisc", "show", "dev", "ra")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("tc qdisc show: %q lacks %q", out, w)
				}
			}
			if tc.want == nil && (strings.Contains(string(out), "tbf") || strings.Contains(string(out), "netem")) {
				t.Errorf("zero Shape left shaping in place: %q", out)
			}
		})
	}
}

func TestBridge(t *testing.T) {
	netnstest.Require(t)
	ctx := ctxT(t)
	br := netnstest.NewBridge(t, "sw")
	hosts := make([]*netns.NS, 3)
	for i := range hosts {
		hosts[i] = netnstest.New(t, fmt.Sprintf("h%d", i))
		if _, err := br.Attach(ctx, hosts[i], "eth0", fmt.Sprintf("192.168.77.%d/24", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := hosts[0].Listen(ctx, "tcp", "192.168.77.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 2)
	go func() {
		for range 2 {
			c, err := l.Accept()
			if err != nil {
				accepted <- err
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
			accepted <- nil
		}
	}()
	for _, h := range hosts[1:] {
		c, err := h.Dial(ctx, "tcp", l.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if got, err := roundTrip(c, h.Name); err != nil || got != h.Name {
			t.Errorf("%s: round trip %q, %v", h, got, err)
		}
		c.Close()
	}
	for range 2 {
		if err := <-accepted; err != nil {
			t.Fatal(err)
		}
	}
}

func TestExec(t *testing.T) {
	a, _ := pair(t)
	out, err := a.Exec(ctxT(t), "ip", "-o", "addr", "show", "dev", "ra")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "10.9.0.1/24") {
		t.Errorf("ip addr inside the namespace: %q", out)
	}
	if _, err := a.Exec(ctxT(t), "false"); err == nil {
		t.Error("a failing command reported no error")
	}
}

func TestCreateRejectsBadLabels(t *testing.T) {
	for _, l := range []string{"", "UPPER", "with-dash", "waytoolonglabel1"} {
		if ns, err := netns.Create(l); err == nil {
			ns.Delete()
			t.Errorf("Create(%q) succeeded", l)
		}
	}
	netnstest.Require(t)
	err := netns.Veth(ctxT(t), netnstest.New(t, "x"), "thisnameistoolong", "", netnstest.New(t, "y"), "b", "")
	if err == nil {
		t.Error("Veth accepted a 17-byte interface name")
	}
}

func TestDeleteIdempotentAndSweep(t *testing.T) {
	netnstest.Require(t)
	ns, err := netns.Create("idem")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := ns.Delete(); err != nil {
			t.Fatal(err)
		}
	}
	// A leftover of a process that no longer exists: pid_max is at most
	// 2^22, so this pid cannot be live.
	dead := fmt.Sprintf("%s%d-left-00000000", netns.Prefix, 1<<23)
	if out, err := exec.Command("ip", "netns", "add", dead).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", dead).Run() })
	live := netnstest.New(t, "live")
	deleted := netns.Sweep()
	if !contains(deleted, dead) {
		t.Errorf("Sweep deleted %v, want %s among them", deleted, dead)
	}
	if contains(deleted, live.Name) {
		t.Errorf("Sweep deleted %s of this live process", live.Name)
	}
	if _, err := os.Stat("/var/run/netns/" + live.Name); err != nil {
		t.Errorf("live namespace gone: %v", err)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func TestDoReportsSetnsFailure(t *testing.T) {
	netnstest.Require(t)
	ns := &netns.NS{Name: "tln-does-not-exist"}
	err := ns.Do(func() error { return nil })
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Do in a missing namespace: %v", err)
	}
}

func Example() {
	if netns.Available() != nil {
		fmt.Println("connected over a veth pair: true")
		return
	}
	ctx := context.Background()
	a, _ := netns.Create("exa")
	defer a.Delete()
	b, _ := netns.Create("exb")
	defer b.Delete()
	netns.Veth(ctx, a, "va", "10.8.0.1/30", b, "vb", "10.8.0.2/30")
	l, _ := a.Listen(ctx, "tcp", "10.8.0.1:0")
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := b.Dial(ctx, "tcp", l.Addr().String())
	if err == nil {
		c.Close()
	}
	fmt.Println("connected over a veth pair:", err == nil)
	// Output: connected over a veth pair: true
}
