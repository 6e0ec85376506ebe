package harness

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A UCX baseline that fails (here a ucx_perftest that refuses at once, as
// a foreign tool may on a busy machine) loses its row; the cell, the path
// and the other baselines are still measured. The fake must be on PATH
// before the first lookup of ucx_perftest in this process: no earlier
// test in this package asks for UCX (their sizes are under UCXMinSize).
func TestUCXBaselineFailureDropsItsRow(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "ucx_perftest")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'fake ucx_perftest: refused' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
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
		if !bases[BaseRawTCP] || bases[BaseUCXTCP] {
			t.Errorf("NoUCX=%v: baselines %v, want %s and no %s", noUCX, bases, BaseRawTCP, BaseUCXTCP)
		}
	}
}
