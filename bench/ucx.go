package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// UCX is the baseline of the people who move tensors for a living: UCX's
// own ucx_perftest (tag bandwidth, a server and a client process on this
// host) over one UCX transport. It runs when ucx_perftest is installed
// (Debian: ucx-utils) and is skipped otherwise.
//
// Each Round starts a fresh pair of processes, so it reports the
// bandwidth UCX itself measured over its timed iterations (after warm-up
// ones), never the processes' start-up: a tensorlane path timed beside it
// is compared with UCX's best case.
type UCX struct {
	// TLS is UCX_TLS: "tcp" for the socket transport, "sm" for shared
	// memory between processes (posix and cma; "posix" alone is
	// pathologically slow for large messages).
	TLS string
	// Size is the message size in bytes.
	Size int64
	// Timeout bounds one round (both processes); default 2 minutes.
	Timeout time.Duration
	// Outstanding is how many sends the client keeps in flight (perftest's
	// -O); 0: tag_bw's default window, 32 messages (UCXWindow). A Get is
	// one request and its answer, so 1 is its like.
	Outstanding int
}

// UCXWindow is how many messages ucx_perftest's tag_bw keeps in flight
// when not told otherwise (-O 0: the test's window, 32 in UCX's tests
// table). A round of fewer messages has them all in flight at once.
const UCXWindow = 32

// ErrNoUCX says ucx_perftest is not installed.
var ErrNoUCX = errors.New("bench: ucx_perftest not found (install ucx-utils)")

// ErrUCX wraps a failed ucx_perftest run; its output tail is in the message.
var ErrUCX = errors.New("bench: ucx_perftest failed")

var ucxPath = sync.OnceValues(func() (string, error) {
	p, err := exec.LookPath("ucx_perftest")
	if err != nil {
		return "", ErrNoUCX
	}
	return p, nil
})

// UCXAvailable reports whether ucx_perftest can be run.
func UCXAvailable() bool {
	_, err := ucxPath()
	return err == nil
}

// Name is the baseline's name in records: "ucx-" and the transport, and
// "-o" and the window when it is not UCX's default ("ucx-tcp-o1": one
// message in flight).
func (u UCX) Name() string {
	if u.Outstanding > 0 {
		return "ucx-" + u.TLS + "-o" + strconv.Itoa(u.Outstanding)
	}
	return "ucx-" + u.TLS
}

// ucxMinBytes is the least a round moves through UCX, so a small message
// size still gets enough iterations for UCX's overall figure to settle.
const ucxMinBytes = 256 << 20

// Round measures UCX moving k messages of Size and returns the time they
// take at the bandwidth UCX reported (over at least ucxMinBytes, after
// warm-up iterations).
func (u UCX) Round(ctx context.Context, k int) (time.Duration, error) {
	d, _, err := u.RoundCPU(ctx, k)
	return d, err
}

// RoundCPU is Round with the CPU time (user and system) both ucx_perftest
// processes spent on those k messages. It is an estimate: both processes'
// CPU divided by the life of the client that ran the test (start-up,
// connection, warm-up, the timed iterations; the server waits for it in a
// blocking accept) gives the cores they kept busy (UCX polls, so that
// share is steady), and that times Round's duration is the CPU of the k
// messages.
func (u UCX) RoundCPU(ctx context.Context, k int) (wall, cpu time.Duration, err error) {
	bps, cores, err := u.run(ctx, max(k, int((ucxMinBytes+u.Size-1)/u.Size)))
	if err != nil {
		return 0, 0, err
	}
	wall = time.Duration(float64(k) * float64(u.Size) / bps * float64(time.Second))
	return wall, time.Duration(cores * float64(wall)), nil
}

// Bandwidth runs iters timed iterations (after two warm-up ones, one from
// 256 MiB) and
// returns UCX's overall bandwidth in bytes per second.
func (u UCX) Bandwidth(ctx context.Context, iters int) (float64, error) {
	bps, _, err := u.run(ctx, iters)
	return bps, err
}

// run is Bandwidth that also returns the cores both processes kept busy
// while the client that ran the test lived (CPU time over wall time).
func (u UCX) run(ctx context.Context, iters int) (bps, cores float64, err error) {
	bin, err := ucxPath()
	if err != nil {
		return 0, 0, err
	}
	if u.Size <= 0 || iters <= 0 || u.TLS == "" || strings.ContainsAny(u.TLS, " \t\n") || u.Outstanding < 0 {
		return 0, 0, fmt.Errorf("%w: size %d, %d iterations, transport %q, %d outstanding", ErrUCX, u.Size, iters, u.TLS, u.Outstanding)
	}
	timeout := u.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	port, err := freePort()
	if err != nil {
		return 0, 0, err
	}
	warm := 2
	if u.Size >= 256<<20 {
		warm = 1 // a warm-up of 256 MiB faults and connects as well as two
	}
	args := []string{"-p", strconv.Itoa(port), "-t", "tag_bw", "-s", strconv.FormatInt(u.Size, 10),
		"-n", strconv.Itoa(iters), "-w", strconv.Itoa(warm), "-O", strconv.Itoa(u.Outstanding)}
	env := append(os.Environ(), "UCX_TLS="+u.TLS, "UCX_WARN_UNUSED_ENV_VARS=n")
	server := exec.CommandContext(ctx, bin, args...)
	server.Env = env
	var sout bytes.Buffer
	server.Stdout, server.Stderr = &sout, &sout
	server.WaitDelay = time.Second
	if err := server.Start(); err != nil {
		return 0, 0, fmt.Errorf("%w: start server: %v", ErrUCX, err)
	}
	waited := false
	defer func() {
		if !waited {
			server.Process.Kill()
			server.Wait()
		}
	}()
	// The client fails at once while the server is not listening yet;
	// it is retried until the server is, or the round's time is up.
	var out []byte
	var cpu time.Duration  // of every client run and the server
	var life time.Duration // of the client that ran the test
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		client := exec.CommandContext(ctx, bin, append([]string{"127.0.0.1"}, args...)...)
		client.Env = env
		client.WaitDelay = time.Second
		began := time.Now()
		out, err = client.CombinedOutput()
		life = time.Since(began)
		cpu += procCPU(client.ProcessState)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0, 0, fmt.Errorf("%w: %v (server: %s)", ErrUCX, ctx.Err(), tail(sout.Bytes()))
		}
		if !bytes.Contains(out, []byte("onnect")) { // "connect failed", "Connection refused"
			return 0, 0, fmt.Errorf("%w: %v: %s", ErrUCX, err, tail(out))
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	bw, err := parseUCXBandwidth(out)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v: %s", ErrUCX, err, tail(out))
	}
	// The server ends with its client; its CPU counts once it has.
	stop := time.AfterFunc(5*time.Second, func() { server.Process.Kill() })
	server.Wait()
	stop.Stop()
	waited = true
	cpu += procCPU(server.ProcessState)
	return bw, cpu.Seconds() / life.Seconds(), nil
}

// procCPU is the user and system time of a process that ended (0 for one
// that never started).
func procCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// parseUCXBandwidth reads the overall bandwidth off ucx_perftest's final
// line ("Final:" or, with threads, "[thread 0]"): iterations, three
// latencies, then bandwidth average and overall in MB/s (UCX's MB is
// 2^20 bytes), then two message rates.
func parseUCXBandwidth(out []byte) (float64, error) {
	var last []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && (f[0] == "Final:" || f[0] == "[thread") {
			last = f
		}
	}
	var nums []float64
	for _, s := range last {
		if v, err := strconv.ParseFloat(s, 64); err == nil {
			nums = append(nums, v)
		}
	}
	if len(nums) < 7 {
		return 0, errors.New("no final bandwidth line")
	}
	mbps := nums[len(nums)-3]
	if mbps <= 0 {
		return 0, fmt.Errorf("bandwidth %g MB/s", mbps)
	}
	return mbps * (1 << 20), nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("%w: find a free port: %v", ErrUCX, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return string(b)
}
