package harness

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
)

// A tiny end-to-end run: every path in both modes, every baseline (the
// serialize one on every path), latency, and the reports. No timing
// thresholds.
func TestRunTiny(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	want := []string{"latency/tcp/pull/4KiB/c1/vs-tcp-pingpong"}
	for _, p := range AllPaths {
		base := BaseMemcpy
		if network(p) {
			base = BaseRawTCP
			want = append(want, "throughput/"+p+"/pull/64KiB/c1/vs-"+BaseLibp2p)
		}
		want = append(want, "throughput/"+p+"/pull/4KiB/c1/vs-"+base, "throughput/"+p+"/pull/4KiB/c2/vs-"+base,
			"throughput/"+p+"/pull/4KiB/c2/vs-"+BaseSerialize)
		if slices.Contains(PushPaths, p) {
			want = append(want, "throughput/"+p+"/push/4KiB/c2/vs-"+base, "throughput/"+p+"/push/64KiB/c1/vs-"+base)
		}
	}
	for _, k := range want {
		if r, ok := keys[k]; !ok || !r.Measured() {
			t.Errorf("no measured %s", k)
		}
	}
	if r := keys["throughput/tcp-z/pull/64KiB/c1/vs-tcp-raw"]; r.WireRatio <= 0 || r.WireRatio >= 1 {
		t.Errorf("tcp-z on bf16 normal weights should shrink: wire ratio %v", r.WireRatio)
	}
	if r := keys["throughput/p2p-ipc/push/64KiB/c2/vs-"]; r.Status != StatusSkipped {
		t.Errorf("64KiB x2 exceeds MaxInFlight and should be skipped: %+v", r)
	}
	if r := keys["latency/tcp/pull/4KiB/c1/vs-tcp-pingpong"]; r.P50us <= 0 || r.P99us < r.P50us || r.BaselineP50us <= 0 {
		t.Errorf("latency figures: %+v", r)
	}
	for _, r := range res.Records {
		if r.Status == StatusNotBuilt {
			t.Errorf("part of the matrix listed as not built: %+v", r)
		}
	}
	var tbl, md bytes.Buffer
	if err := WriteTable(&tbl, res.Records); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, res.File()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"tcp-raw", "libp2p", "tcp-pingpong", "serialize", "p2p-ipc", "push", "tcp-z"} {
		if !strings.Contains(tbl.String(), s) || !strings.Contains(md.String(), s) {
			t.Errorf("reports lack %q:\n%s\n%s", s, tbl.String(), md.String())
		}
	}
	if res.PeakRSS <= 0 {
		t.Error("no peak RSS")
	}
}

// A transfer that reports another transport than its cell's fails the
// cell with ErrWrongPath: the tcp cell once measured rdma unnoticed.
func TestCheckPath(t *testing.T) {
	tests := []struct {
		path, mode, got string
		ok              bool
	}{
		{PathTCP, ModePull, "tcp", true},
		{PathTCP, ModePull, "rdma", false},
		{PathTCPZ, ModePull, "tcp", true},
		{PathP2PIPC, ModePush, "p2p", true},
		{PathP2PIPC, ModePush, "shm", false},
		{PathSHM, ModePull, "shm", true},
		{PathRDMA, ModePush, "tcp", false},
		{PathLocal, ModePull, "local", true},
		{PathP2P, ModePull, "", false},
	}
	for _, tt := range tests {
		g := &group{spec: cellSpec{tt.path, tt.mode}}
		err := g.checkPath(rdt.Transfer{Stats: fabric.Stats{Transport: tt.got}})
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrWrongPath)) {
			t.Errorf("%s %s took %q: %v", tt.path, tt.mode, tt.got, err)
		}
	}
}

// The tcp-z source is bf16 with weight-like values: finite, centred,
// with the standard deviation asked for.
func TestFillBF16Normal(t *testing.T) {
	p := make([]byte, 1<<16)
	fillBF16Normal(p)
	var sum, sq float64
	n := len(p) / 2
	for i := 0; i < len(p); i += 2 {
		v := float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(p[i:])) << 16))
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("value %d is %v", i/2, v)
		}
		sum += v
		sq += v * v
	}
	mean, sd := sum/float64(n), math.Sqrt(sq/float64(n))
	if math.Abs(mean) > 0.002 || sd < 0.018 || sd > 0.022 {
		t.Errorf("mean %v sd %v, want about 0 and 0.02", mean, sd)
	}
}

// wireLog adds up only the tcp transport's transfer records.
func TestWireLog(t *testing.T) {
	h := &wireLog{}
	l := slog.New(h).With("runtime", "h1")
	l.Debug("tcp transfer", "bytes", int64(1000), "wire", int64(600), "compressed", true)
	l.Debug("tcp transfer", "bytes", int64(500), "wire", int64(500), "compressed", false)
	l.Info("something else", "bytes", int64(7))
	raw, wire, plain := h.counts()
	if raw != 1000 || wire != 600 || plain != 500 {
		t.Errorf("counts = %v %v %v", raw, wire, plain)
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
	cfg := Config{Sizes: []int64{4 << 10}, Concurrency: []int{1}, Paths: []string{PathP2P}, Push: []string{}, NoLatency: true, MinRounds: 2, MinTime: time.Millisecond, MaxRounds: 2}
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
	if c := cellConfig(cfg, Record{Kind: KindThroughput, Path: PathRDMA, Mode: ModePush, Size: 4096, Concurrency: 8}); len(c.Paths) != 0 || !slices.Equal(c.Push, []string{PathRDMA}) || c.Concurrency[0] != 8 {
		t.Errorf("push cell config: %+v", c)
	}
	if c := cellConfig(cfg, Record{Kind: KindLatency, Path: PathTCP, Size: 4096}); len(c.Sizes) != 0 || c.NoLatency || c.LatencySizes[0] != 4096 {
		t.Errorf("latency cell config: %+v", c)
	}
}
