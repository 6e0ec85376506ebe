package harness

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The issue fixes these field names for --json; tools read them.
func TestRecordJSONShape(t *testing.T) {
	var buf bytes.Buffer
	recs := []Record{
		rec("tcp", 64<<20, 8, BaseRawTCP, 0.5),
		{Kind: KindLatency, Path: "tcp", Mode: ModePull, Size: 4096, Concurrency: 1, Baseline: BasePingPong, GBps: 0.1, BaselineGBps: 0.2, Ratio: 0.5, P50us: 40, P99us: 100, BaselineP50us: 20, BaselineP99us: 50},
	}
	if err := WriteJSONLines(&buf, recs); err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != len(recs) {
		t.Fatalf("%d lines for %d records:\n%s", len(lines), len(recs), buf.String())
	}
	want := []string{"path", "mode", "size", "concurrency", "gbps", "baseline", "baseline_gbps", "ratio"}
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		keys := want
		if i == 1 {
			keys = append(slices.Clone(want), "p50_us", "p99_us", "baseline_p50_us", "baseline_p99_us")
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d lacks %q: %s", i, k, line)
			}
		}
		if _, ok := m["size"].(float64); !ok {
			t.Errorf("size is not a number: %s", line)
		}
	}
}

func TestFileRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "b.json")
	f := Result{Quick: true, Records: []Record{rec("p2p", 4096, 1, BaseMemcpy, 0.1),
		{Kind: KindThroughput, Path: "p2p", Mode: ModePull, Size: 1 << 30, Concurrency: 64, Status: StatusSkipped, Note: "too big"}}, Elapsed: time.Second}.File()
	if err := WriteFile(p, f); err != nil {
		t.Fatal(err)
	}
	g, err := ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Records) != len(f.Records) || g.Records[0] != f.Records[0] || !g.Quick {
		t.Fatalf("round trip changed the file: %+v", g)
	}
	if res := Check(g.Records, f.Records, 0); !res.OK() || res.Compared != 1 {
		t.Fatalf("a file checked against itself: %+v", res)
	}
}

func TestSizeString(t *testing.T) {
	for n, want := range map[int64]string{4096: "4KiB", 1 << 20: "1MiB", 1 << 30: "1GiB", 1000: "1000B", 3 << 19: "1536KiB"} {
		if got := SizeString(n); got != want {
			t.Errorf("SizeString(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	full, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if full.Sizes[0] != 4<<10 || full.Sizes[len(full.Sizes)-1] != 1<<30 || !slices.Equal(full.Concurrency, []int{1, 8, 64}) {
		t.Errorf("full defaults: %v %v", full.Sizes, full.Concurrency)
	}
	if !slices.Equal(full.Paths, AllPaths) || !slices.Equal(full.Push, PushPaths) {
		t.Errorf("full paths: pull %v push %v", full.Paths, full.Push)
	}
	q, _ := Config{Quick: true}.withDefaults()
	if !slices.Equal(q.Sizes, []int64{1 << 20, 64 << 20}) || !slices.Equal(q.Concurrency, []int{1, 8}) || q.MaxInFlight != 64<<20 {
		t.Errorf("quick defaults: %v %v %v", q.Sizes, q.Concurrency, q.MaxInFlight)
	}
	if !slices.Equal(q.Paths, AllPaths) || !slices.Equal(q.Push, []string{PathP2PIPC, PathRDMA}) {
		t.Errorf("quick paths: pull %v push %v", q.Paths, q.Push)
	}
	if none, _ := (Config{Push: []string{}}).withDefaults(); len(none.Push) != 0 {
		t.Errorf("an empty Push selects none, got %v", none.Push)
	}
	for _, bad := range []Config{{Paths: []string{"nvme"}}, {Push: []string{PathLocal}}, {Push: []string{PathTCPZ}}, {Sizes: []int64{7}}, {Concurrency: []int{0}}} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	recs := []Record{
		rec("tcp", 4096, 1, BaseRawTCP, 0.3), rec("tcp", 1<<20, 1, BaseRawTCP, 0.5),
		rec("tcp", 4096, 1, BaseLibp2p, 0.6), rec("tcp", 1<<20, 1, BaseLibp2p, 2),
		rec("p2p", 4096, 1, BaseMemcpy, 0.1), // one size: no line, no file
	}
	files, err := WritePlots(dir, recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || filepath.Base(files[0]) != "throughput-tcp.png" {
		t.Fatalf("files = %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("not a PNG: %v", err)
	}
	// One panel (pull, one in flight) and the legend to its right, outside
	// the plot area: something is drawn right of the panel.
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	bounds := img.Bounds()
	panel := 326 // 3.4 inch panel width in pixels at vgimg's 96 dpi
	if bounds.Dx() <= panel {
		t.Fatalf("image %v has no room for a legend beside its one panel", bounds)
	}
	inked := false
	for x := panel + 4; x < bounds.Max.X && !inked; x++ {
		for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r < 0x8000 || g < 0x8000 || bl < 0x8000 {
				inked = true
				break
			}
		}
	}
	if !inked {
		t.Fatal("no legend right of the panel")
	}
}

func TestCheckGoals(t *testing.T) {
	recs := []Record{
		rec(PathTCP, 64<<20, 1, BaseRawTCP, 1.2),
		rec(PathTCP, 1<<30, 1, BaseRawTCP, 0.8),
		rec(PathTCP, 1<<20, 1, BaseRawTCP, 0.3),  // too small: latency-bound, no goal
		rec(PathTCP, 64<<20, 8, BaseRawTCP, 0.1), // 8 in flight: no goal
		rec(PathTCP, 64<<20, 1, BaseLibp2p, 3),   // another baseline
		rec(PathSHM, 64<<20, 1, BaseMemcpy, 0.71),
	}
	got := CheckGoals(recs)
	if len(got) != 3 {
		t.Fatalf("want 3 judged cells, got %v", got)
	}
	if !got[0].Met || got[0].Path != PathSHM {
		t.Errorf("shm 0.71 meets 0.7: %v", got[0])
	}
	if !got[1].Met || got[2].Met {
		t.Errorf("tcp 1.2 meets 0.9, 0.8 does not: %v %v", got[1], got[2])
	}
	var md strings.Builder
	if err := WriteMarkdown(&md, Result{Records: recs}.File()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "## Fabric goals") || !strings.Contains(md.String(), "**not met**") {
		t.Errorf("report lacks the goals:\n%s", md.String())
	}
}

// TestCPUColumns: the reports print CPU per GB of the path and of its
// baseline and their ratio (baseline's CPU per byte over the path's), and
// a dash where a figure is missing.
func TestCPUColumns(t *testing.T) {
	for _, c := range []struct {
		path, base float64
		ms, bms    string
		ratio      string
	}{
		{2, 4, "500", "250", "0.50x"},
		{4, 2, "250", "500", "2.00x"},
		{2, 0, "500", "-", "-"},
		{0, 0, "-", "-", "-"},
	} {
		r := Record{Kind: KindThroughput, Path: PathTCP, Mode: ModePull, Size: 64 << 20, Concurrency: 1, GBps: 1,
			Baseline: BaseRawTCP, BaselineGBps: 1, Ratio: 1, CPUGBps: c.path, BaselineCPUGBps: c.base}
		if got := cpuMs(r.CPUGBps) + " " + cpuMs(r.BaselineCPUGBps) + " " + cpuRatioString(r); got != c.ms+" "+c.bms+" "+c.ratio {
			t.Errorf("%v/%v: %q, want %q", c.path, c.base, got, c.ms+" "+c.bms+" "+c.ratio)
		}
		var md, tbl strings.Builder
		if err := WriteMarkdown(&md, Result{Records: []Record{r}}.File()); err != nil {
			t.Fatal(err)
		}
		if err := WriteTable(&tbl, []Record{r}); err != nil {
			t.Fatal(err)
		}
		want := "| " + c.ms + " | " + c.bms + " | " + c.ratio + " |"
		if !strings.Contains(md.String(), want) || !strings.Contains(tbl.String(), c.ratio) {
			t.Errorf("reports lack %q:\n%s\n%s", want, md.String(), tbl.String())
		}
	}
}
