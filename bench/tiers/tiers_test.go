package tiers

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCollectAppendPlot(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Collect(dir, "pr", "", time.Now()); !errors.Is(err, ErrNoSteps) {
		t.Fatalf("no steps.tsv: %v", err)
	}
	write("steps.tsv", "ci\tok\t250.5\nab-release\tskipped: no release tag (v*) yet\t0.1\n")
	write("ab.json", `{"cells":[{"cell":"shm/pull/1MiB/c1","ratio":0.98}]}`)
	write("soak.json", `{"transfers": 1200, "hung": 0, "seed": 7, "name": "x"}`)
	write("env.json", `{"go":"go1.26.8"}`)
	s, err := Collect(dir, "nightly", "abc", time.Unix(100, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Pass || len(s.Steps) != 2 || s.Figures["seconds/ci"] != 250.5 || s.Figures["ab/shm/pull/1MiB/c1"] != 0.98 || s.Figures["soak/transfers"] != 1200 {
		t.Errorf("summary %+v", s)
	}
	if string(s.Env) != `{"go":"go1.26.8"}` {
		t.Errorf("env %s", s.Env)
	}
	hist := filepath.Join(dir, "h", "nightly.jsonl")
	for i := range 3 {
		s.Time = time.Unix(int64(100+i), 0)
		s.Figures["seconds/ci"] = 250 + float64(i)
		if err := Append(hist, s); err != nil {
			t.Fatal(err)
		}
	}
	h, err := ReadHistory(hist)
	if err != nil || len(h) != 3 || h[2].Figures["seconds/ci"] != 252 || h[0].Env != nil {
		t.Fatalf("history %v %+v", err, h)
	}
	png := filepath.Join(dir, "history.png")
	if err := Plot(png, "nightly", h); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(png); err != nil || st.Size() < 1000 {
		t.Errorf("plot: %v %v", st, err)
	}
	write("steps.tsv", "ci\tfailed (rc 1)\t10\n")
	if s, err := Collect(dir, "pr", "", time.Now()); err != nil || s.Pass {
		t.Errorf("a failed step: pass %v, %v", s.Pass, err)
	}
	if err := os.WriteFile(hist, []byte("{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadHistory(hist); err == nil {
		t.Error("a broken history line: no error")
	}
}
