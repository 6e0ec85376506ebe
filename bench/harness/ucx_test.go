package harness

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeUCX puts a ucx_perftest on PATH that logs its arguments to a file
// and then fails (FAKE_UCX_FAIL set) or reports 1000 MB/s. It must be on
// PATH before the first lookup of ucx_perftest in this process, so every
// test of this package that asks for UCX shares it (the others' sizes are
// under UCXMinSize); it returns the log.
var fakeUCX = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("", "fake-ucx")
	if err != nil {
		panic(err)
	}
	log := filepath.Join(dir, "args.log")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\n" +
		"if [ -n \"$FAKE_UCX_FAIL\" ]; then echo 'fake ucx_perftest: refused' >&2; exit 3; fi\n" +
		"echo 'Final:                    4      3.615 156928.396 156928.396      1000.00     1000.00           6           6'\n"
	if err := os.WriteFile(filepath.Join(dir, "ucx_perftest"), []byte(script), 0o755); err != nil {
		panic(err)
	}
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return log
})

// A UCX baseline that fails (here a ucx_perftest that refuses at once, as
// a foreign tool may on a busy machine) loses its row; the cell, the path
// and the other baselines are still measured.
func TestUCXBaselineFailureDropsItsRow(t *testing.T) {
	fakeUCX()
	t.Setenv("FAKE_UCX_FAIL", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, noUCX := range []bool{false, true} {
		res, err := Run(ctx, Config{
			Paths: []string{PathTCP}, Push: []string{}, Sizes: []int64{UCXMinSize}, Concurrency: []int{1},
			NoLatency: true, NoUCX: noUCX, MinRounds: 2, MinTime: time.Millisecond, MaxRounds: 2,
		})
		if err != nil {
			t.Fatalf("NoUCX=%v: %v", noUCX, err)
		}
		bases := map[string]bool{}
		for _, r := range res.Records {
			bases[r.Baseline] = true
		}
		if !bases[BaseRawTCP] || bases[BaseUCXTCP] || bases[BaseUCXTCP1] {
			t.Errorf("NoUCX=%v: baselines %v, want %s and no UCX", noUCX, bases, BaseRawTCP)
		}
	}
}

// One Get in flight is compared with UCX's own window (ucx-tcp) and with
// one UCX message in flight (ucx-tcp-o1, what the goal takes); N Gets in
// flight with UCX's window only, timed for as many messages.
func TestUCXRowsByConcurrency(t *testing.T) {
	log := fakeUCX()
	os.Remove(log)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Paths: []string{PathTCP}, Push: []string{}, Sizes: []int64{UCXMinSize}, Concurrency: []int{1, 2},
		NoLatency: true, MinRounds: 2, MinTime: time.Millisecond, MaxRounds: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int][]string{}
	for _, r := range res.Records {
		if strings.HasPrefix(r.Baseline, "ucx-") {
			got[r.Concurrency] = append(got[r.Concurrency], r.Baseline)
			if r.BaselineGBps < 1.0 || r.BaselineGBps > 1.1 { // the fake's 1000 MiB/s
				t.Errorf("%s at c%d: %.3f GB/s, want the fake's 1.05", r.Baseline, r.Concurrency, r.BaselineGBps)
			}
		}
	}
	slices.Sort(got[1])
	if !slices.Equal(got[1], []string{BaseUCXTCP, BaseUCXTCP1}) || !slices.Equal(got[2], []string{BaseUCXTCP}) {
		t.Errorf("UCX rows by concurrency %v, want c1 [%s %s], c2 [%s]", got, BaseUCXTCP, BaseUCXTCP1, BaseUCXTCP)
	}
	args, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(args), "-O 1") || !strings.Contains(string(args), "-O 0") {
		t.Errorf("ucx_perftest ran with %q, want -O 0 and -O 1 runs", args)
	}
	for _, g := range Goals {
		if strings.HasPrefix(g.Baseline, "ucx-") && g.Baseline != BaseUCXTCP1 && g.Baseline != BaseUCXSM1 {
			t.Errorf("goal %+v against UCX's window, want one message in flight", g)
		}
	}
}
