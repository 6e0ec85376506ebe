package bench

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParseUCXBandwidth(t *testing.T) {
	final := []byte(`+--------------+--------------+------------------------------+---------------------+-----------------------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                    20      3.615 156928.396 156928.396      407.83     512.00           6           6
`)
	bw, err := parseUCXBandwidth(final)
	if err != nil || bw != 512*(1<<20) {
		t.Fatalf("Final line: %g, %v; want %d", bw, err, 512<<20)
	}
	threads := []byte("[thread 0]               100 335668.582 508341.074 542291.200      125.90     118.00           2           2\n")
	if bw, err := parseUCXBandwidth(threads); err != nil || bw != 118*(1<<20) {
		t.Fatalf("thread line: %g, %v", bw, err)
	}
	for _, bad := range []string{"", "Final:\n", "Final: 1 2 3\n", "Final: 20 1 1 1 0 0 1 1\n", "UCX ERROR client failed\n"} {
		if bw, err := parseUCXBandwidth([]byte(bad)); err == nil {
			t.Errorf("%q parsed as %g", bad, bw)
		}
	}
}

func TestUCXRefusesBadInput(t *testing.T) {
	if !UCXAvailable() {
		t.Skip("ucx_perftest not installed (ucx-utils)")
	}
	for _, u := range []UCX{{TLS: "tcp"}, {TLS: "", Size: 4096}, {TLS: "tcp posix", Size: 4096}, {TLS: "tcp", Size: 4096, Outstanding: -1}} {
		if _, err := u.Bandwidth(context.Background(), 1); !errors.Is(err, ErrUCX) {
			t.Errorf("%+v: %v, want ErrUCX", u, err)
		}
	}
	// A transport UCX does not know fails the run with its message,
	// within the timeout.
	u := UCX{TLS: "nosuchtransport", Size: 4096, Timeout: 30 * time.Second}
	if _, err := u.Bandwidth(context.Background(), 1); !errors.Is(err, ErrUCX) {
		t.Errorf("unknown transport: %v, want ErrUCX", err)
	}
}

// TestUCXRound runs the real ucx_perftest over its tcp transport (no
// threshold: the figure depends on the machine).
func TestUCXRound(t *testing.T) {
	if !UCXAvailable() {
		t.Skip("ucx_perftest not installed (ucx-utils)")
	}
	// UCX's default window and one message in flight (a Get's like).
	for _, out := range []int{0, 1} {
		u := UCX{TLS: "tcp", Size: 1 << 20, Timeout: time.Minute, Outstanding: out}
		d, cpu, err := u.RoundCPU(context.Background(), 4)
		if err != nil {
			t.Fatal(err)
		}
		if d <= 0 || cpu <= 0 {
			t.Fatalf("round of %v, %v of CPU", d, cpu)
		}
		t.Logf("%s: 4 x 1 MiB in %v (%.2f GB/s), %v of CPU (%.2f GB per CPU second)", u.Name(), d, 4*float64(1<<20)/d.Seconds()/1e9, cpu, 4*float64(1<<20)/cpu.Seconds()/1e9)
	}
}

func TestUCXName(t *testing.T) {
	for _, tc := range []struct {
		u    UCX
		want string
	}{
		{UCX{TLS: "tcp"}, "ucx-tcp"},
		{UCX{TLS: "tcp", Outstanding: 1}, "ucx-tcp-o1"},
		{UCX{TLS: "sm", Outstanding: 4}, "ucx-sm-o4"},
	} {
		if got := tc.u.Name(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.u, got, tc.want)
		}
	}
}
