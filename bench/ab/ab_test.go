package ab

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noisy returns n samples of a figure around mean with multiplicative
// noise (a loaded machine), from a fixed seed.
func noisy(r *rand.Rand, n int, mean, sd float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = mean * math.Exp(r.NormFloat64()*sd)
	}
	return out
}

func TestPairedSeesAShiftAndNotNoise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := noisy(r, 40, 5, 0.15)
	same := noisy(r, 40, 5, 0.15)
	e := Paired(base, same, 0.99)
	if !(e.Lo < 1 && e.Hi > 1) {
		t.Errorf("A/A: interval [%.3f, %.3f] excludes 1", e.Lo, e.Hi)
	}
	slow := make([]float64, len(base))
	for i, b := range base {
		slow[i] = b / 1.1 * math.Exp(r.NormFloat64()*0.05)
	}
	e = Paired(base, slow, 0.99)
	if !(e.Hi < 1) || math.Abs(e.Ratio-1/1.1) > 0.03 {
		t.Errorf("10%% slower: ratio %.3f [%.3f, %.3f], want about 0.909 with the interval below 1", e.Ratio, e.Lo, e.Hi)
	}
	if e.Confidence < 0.99 || e.P > 0.01 || e.N != 40 {
		t.Errorf("estimate %+v", e)
	}
}

func TestPairedEdges(t *testing.T) {
	if e := Paired(nil, nil, 0.9); !math.IsNaN(e.Ratio) || e.N != 0 {
		t.Errorf("no pairs: %+v", e)
	}
	if e := Paired([]float64{1}, []float64{2}, 0.9); e.Ratio != 2 || !math.IsInf(e.Hi, 1) {
		t.Errorf("one pair: %+v", e)
	}
	// Zero and negative samples are dropped, not logged.
	if e := Paired([]float64{1, 0, -1, 2}, []float64{1, 1, 1, 2}, 0.5); e.N != 2 {
		t.Errorf("bad samples kept: %+v", e)
	}
	// Identical samples: ratio 1, p 1.
	if e := Paired([]float64{1, 2, 3, 4, 5, 6}, []float64{1, 2, 3, 4, 5, 6}, 0.9); e.Ratio != 1 || e.P != 1 {
		t.Errorf("identical: %+v", e)
	}
	// The exact signed-rank distribution sums to 2^n.
	sum := 0.0
	for _, c := range signedRankCounts(12) {
		sum += c
	}
	if sum != 4096 {
		t.Errorf("signed-rank counts for 12 sum to %g", sum)
	}
}

// fakeSession returns figures from a function of the build.
type fakeSession struct {
	next   func() float64
	closed *int
	mu     *sync.Mutex
}

func (f fakeSession) Sample(context.Context) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next(), nil
}

func (f fakeSession) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.closed++
	return nil
}

func TestRunVerdicts(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	closed, opened := 0, 0
	var mu sync.Mutex // the two builds' sessions open concurrently
	cfg := Config{
		Base: Build{Name: "a", Exe: "/a"}, Head: Build{Name: "b", Exe: "/b"},
		Cells: []Cell{{Path: "shm", Mode: "pull", Size: 1 << 20, Concurrency: 1}, {Path: "tcp", Mode: "pull", Size: 1 << 20, Concurrency: 1}},
		Reps:  30, Rounds: 5,
		open: func(_ context.Context, b Build, c Cell) (session, error) {
			mu.Lock()
			defer mu.Unlock()
			opened++
			mean := 10.0
			if b.Name == "b" && c.Path == "shm" {
				mean = 9 // head is 10% slower on shm only
			}
			return fakeSession{next: func() float64 { return mean * math.Exp(r.NormFloat64()*0.1) }, closed: &closed, mu: &mu}, nil
		},
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if opened != 2*2*30 || closed != opened {
		t.Errorf("opened %d sessions, closed %d; want a fresh pair per sample, all closed", opened, closed)
	}
	if rep.Cells[0].Verdict != Regressed || rep.Cells[1].Verdict != Same {
		t.Errorf("verdicts %s, %s; want REGRESSED, same", rep.Cells[0].Verdict, rep.Cells[1].Verdict)
	}
	err = rep.Err()
	if !errors.Is(err, ErrRegressed) || !strings.Contains(err.Error(), "shm/pull/1MiB/c1 0.9") {
		t.Errorf("Err() = %v", err)
	}
}

func TestRunBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Base: Build{Exe: "x"}, Head: Build{Exe: "y"}, Reps: 3},
		{Base: Build{Exe: "x"}, Head: Build{Exe: "y"}, Alpha: 2},
		{Base: Build{Exe: "x"}, Head: Build{Exe: "y"}, Metric: "speed"},
		{Base: Build{Exe: "x"}, Head: Build{Exe: "y"}, Mode: "thread"},
	} {
		if _, err := Run(t.Context(), cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("Run(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

// script writes an executable shell script standing in for a build.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tensorlane")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeSessionProtocol runs real child processes that speak (or do
// not speak) the serve protocol.
func TestServeSessionProtocol(t *testing.T) {
	good := script(t, `echo "tensorlane-ab 1 1000"
while read req; do
  [ "$req" = q ] && exit 0
  echo "500 400"
done`)
	cfg := Config{Base: Build{Name: "a", Exe: good}, Head: Build{Name: "b", Exe: good}, Reps: 6, Rounds: 2, Timeout: 10 * time.Second,
		Cells: []Cell{{Path: "shm", Mode: "pull", Size: 1 << 20, Concurrency: 1}}}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Cells[0]; c.Ratio != 1 || c.Base[0] != 2 || c.Verdict != Same {
		t.Errorf("cell %+v; want 1000 bytes in 500 ns = 2 GB/s on both sides", c)
	}
	cfg.Metric = MetricCPU
	if rep, err = Run(t.Context(), cfg); err != nil || rep.Cells[0].Base[0] != 2.5 {
		t.Errorf("cpu metric: %v %+v", err, rep.Cells)
	}

	old := script(t, `echo "Error: unknown flag: --ab-serve" >&2; exit 1`)
	cfg.Metric, cfg.Base.Exe = "", old
	if _, err := Run(t.Context(), cfg); !errors.Is(err, ErrMeasure) || !strings.Contains(err.Error(), "--ab-mode process") {
		t.Errorf("a build without --ab-serve: %v", err)
	}

	hang := script(t, `echo "tensorlane-ab 1 1000"; exec sleep 600`)
	cfg.Base.Exe, cfg.Timeout = hang, 300*time.Millisecond
	start := time.Now()
	_, err = Run(t.Context(), cfg)
	if !errors.Is(err, ErrMeasure) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a build that stops answering: %v", err)
	}
	if time.Since(start) > time.Minute {
		t.Errorf("a hung build held the run %v", time.Since(start))
	}
}

func TestResolve(t *testing.T) {
	ctx := t.Context()
	exe := script(t, "exit 0")
	b, err := Resolve(ctx, exe, ".", t.TempDir())
	if err != nil || b.Exe != exe {
		t.Fatalf("Resolve(executable) = %+v, %v", b, err)
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(ctx, plain, ".", t.TempDir()); !errors.Is(err, ErrBadConfig) {
		t.Errorf("not executable: %v", err)
	}
	if _, err := Resolve(ctx, "no-such-revision-xyz", ".", t.TempDir()); !errors.Is(err, ErrBadConfig) {
		t.Errorf("no such revision: %v", err)
	}
}

func TestQuantileOf(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for q, want := range map[float64]float64{0.5: 3, 1: 5, 0.8: 4, 0.01: 1} {
		if got := quantileOf(xs, q); got != want {
			t.Errorf("quantileOf(%v, %g) = %g, want %g", xs, q, got, want)
		}
	}
	if xs[0] != 5 {
		t.Error("quantileOf sorted its argument")
	}
}
