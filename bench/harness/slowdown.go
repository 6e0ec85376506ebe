package harness

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// SlowdownEnv names the environment variable that injects a slowdown into
// the timed operation of chosen paths: "shm=0.10" adds CPU work worth 10%
// of the fastest shm transfer after every shm transfer the harness times
// (see slowed), "shm=0.1,rdma=0.05" does two. It exists so a test can
// prove that the A/B guard (bench/ab) sees a real slip of one path, in a
// binary otherwise identical to its base; nothing sets it by default.
const SlowdownEnv = "TENSORLANE_BENCH_SLOWDOWN"

// slowdowns parses SlowdownEnv: path -> fraction in (0, 10].
func slowdowns() (map[string]float64, error) {
	v := strings.TrimSpace(os.Getenv(SlowdownEnv))
	if v == "" {
		return nil, nil
	}
	out := map[string]float64{}
	for _, part := range strings.Split(v, ",") {
		path, f, ok := strings.Cut(strings.TrimSpace(part), "=")
		frac, err := strconv.ParseFloat(f, 64)
		if !ok || path == "" || err != nil || !(frac > 0 && frac <= 10) {
			return nil, fmt.Errorf("%s: %q is not path=fraction with a fraction in (0, 10] (e.g. shm=0.10)", SlowdownEnv, part)
		}
		out[path] = frac
	}
	return out, nil
}

// slowed wraps path's timed operation with the injected slowdown, if any:
// after each operation it does extra CPU work worth frac of the fastest
// time the operation has taken so far in this process. That models a path
// that does 10% more work: it slows the operation by frac only as far as
// the operation is CPU work, so on a quiet machine, where a 1 MiB shm Get
// waits on the other side much of its time, "0.10" measured a 4-6% slip,
// and on a loaded one (load average 16-66 on 2 cores) 5-15% (docs/ci.md).
// (Spinning until 1.1x the operation's own wall time measured 20-25% under
// load: a preemption near the end of the spin added a whole time slice.)
func slowed(path string, f op) (op, error) {
	s, err := slowdowns()
	if err != nil {
		return nil, err
	}
	frac := s[path]
	if frac == 0 {
		return f, nil
	}
	perNs := spinRate()
	var mu sync.Mutex
	fastest := time.Duration(math.MaxInt64)
	return func(ctx context.Context, w int) error {
		start := time.Now()
		err := f(ctx, w)
		d := time.Since(start)
		mu.Lock()
		fastest = min(fastest, d)
		extra := float64(fastest) * frac
		mu.Unlock()
		spin(int64(extra * perNs))
		return err
	}, nil
}

var spinSink uint64

// spin does n iterations of a small dependent computation the compiler
// cannot remove.
func spin(n int64) {
	x := spinSink | 1
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	atomic.AddUint64(&spinSink, x&1)
}

// spinRate is spin's iterations per nanosecond on this machine: the
// fastest of a few timings, so that load during calibration does not make
// the injected work smaller than asked.
var spinRate = sync.OnceValue(func() float64 {
	const n = 1 << 20
	best := time.Duration(math.MaxInt64)
	for range 15 {
		start := time.Now()
		spin(n)
		best = min(best, time.Since(start))
	}
	return n / float64(max(best, 1))
})

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
