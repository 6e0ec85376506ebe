package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// A tiny end-to-end run: every path, both baselines for tcp, latency, the
// not-built list, and the reports. No timing thresholds.
func TestRunTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var calls int
	res, err := Run(ctx, Config{
		Sizes: []int64{4 << 10, 64 << 10}, Concurrency: []int{1, 2}, MaxInFlight: 64 << 10,
		LatencySizes: []int64{4 << 10}, LatencySamples: 10,
		MinRounds: 2, MinTime: time.Millisecond, MaxRounds: 2,
		Progress: func(done, total int, _ []Record) {
			calls++
			if done != calls || done > total {
				t.Errorf("progress %d/%d on call %d", done, total, calls)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]Record{}
	for _, r := range res.Records {
		keys[r.Key()] = r
		if r.Measured() && (r.GBps <= 0 || r.BaselineGBps <= 0 || r.Ratio <= 0) {
			t.Errorf("%s: non-positive figures %+v", r.Key(), r)
		}
	}
	for _, k := range []string{
		"throughput/local/pull/4KiB/c1/vs-memcpy", "throughput/p2p/pull/4KiB/c2/vs-memcpy",
		"throughput/tcp/pull/64KiB/c1/vs-tcp-raw", "throughput/tcp/pull/64KiB/c1/vs-libp2p",
		"throughput/tcp/pull/4KiB/c2/vs-tcp-raw", "latency/tcp/pull/4KiB/c1/vs-tcp-pingpong",
	} {
		if r, ok := keys[k]; !ok || !r.Measured() {
			t.Errorf("no measured %s", k)
		}
	}
	if r := keys["throughput/p2p/pull/64KiB/c2/vs-"]; r.Status != StatusSkipped {
		t.Errorf("64KiB x2 exceeds MaxInFlight and should be skipped: %+v", r)
	}
	if r := keys["latency/tcp/pull/4KiB/c1/vs-tcp-pingpong"]; r.P50us <= 0 || r.P99us < r.P50us || r.BaselineP50us <= 0 {
		t.Errorf("latency figures: %+v", r)
	}
	if _, ok := keys["throughput/rdma/pull/0B/c0/vs-"]; !ok {
		t.Error("rdma is not listed as not built")
	}
	var tbl, md bytes.Buffer
	if err := WriteTable(&tbl, res.Records); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, res.File()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"tcp-raw", "libp2p", "tcp-pingpong", "not built"} {
		if !strings.Contains(tbl.String(), s) || !strings.Contains(md.String(), s) {
			t.Errorf("reports lack %q:\n%s\n%s", s, tbl.String(), md.String())
		}
	}
	if res.PeakRSS <= 0 {
		t.Error("no peak RSS")
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{Sizes: []int64{4096}, Concurrency: []int{1}, NoLatency: true}); err == nil {
		t.Fatal("a cancelled run returned no error")
	}
}

// Recheck re-measures only the regressed cell and keeps failing a ratio
// no machine reaches.
func TestRecheck(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Sizes: []int64{4 << 10}, Concurrency: []int{1}, Paths: []string{PathP2P}, NoLatency: true, MinRounds: 2, MinTime: time.Millisecond, MaxRounds: 2}
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	base := []Record{res.Records[0]}
	base[0].Ratio *= 1e6
	cr := Check(base, res.Records, 0)
	if cr.OK() {
		t.Fatal("a million-fold ratio passed")
	}
	recs, cr2, err := Recheck(ctx, cfg, base, res.Records, cr, 1)
	if err != nil {
		t.Fatal(err)
	}
	if cr2.OK() || len(cr2.Regressions) != 1 || len(recs) != len(res.Records) {
		t.Fatalf("after recheck: %+v", cr2)
	}
	if c := cellConfig(cfg, Record{Kind: KindLatency, Path: PathTCP, Size: 4096}); len(c.Sizes) != 0 || c.NoLatency || c.LatencySizes[0] != 4096 {
		t.Errorf("latency cell config: %+v", c)
	}
}
