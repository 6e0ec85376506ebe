package harness

import (
	"strings"
	"testing"
)

func rec(path string, size int64, c int, base string, ratio float64) Record {
	return Record{Kind: KindThroughput, Path: path, Mode: ModePull, Size: size, Concurrency: c, Baseline: base, Ratio: ratio, GBps: 1, BaselineGBps: 1 / ratio}
}

func TestCheck(t *testing.T) {
	base := []Record{
		rec("p2p", 1<<20, 1, BaseMemcpy, 0.8),
		rec("tcp", 1<<20, 1, BaseRawTCP, 0.5),
		{Kind: KindThroughput, Path: "shm", Mode: ModePull, Status: StatusNotBuilt},
	}
	tests := []struct {
		name      string
		base, cur []Record
		tol       float64
		ok        bool
		regressed []string // keys
		missing   []string
		newKeys   int
		compared  int
	}{
		{name: "identical", base: base, cur: base, ok: true, compared: 2},
		{name: "within tolerance", base: base, cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.61), rec("tcp", 1<<20, 1, BaseRawTCP, 0.38)}, ok: true, compared: 2},
		{name: "improvement passes", base: base, cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 5), rec("tcp", 1<<20, 1, BaseRawTCP, 5)}, ok: true, compared: 2},
		{name: "regression detected", base: base, cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.59), rec("tcp", 1<<20, 1, BaseRawTCP, 0.5)},
			regressed: []string{"throughput/p2p/pull/1MiB/c1/vs-memcpy"}, compared: 2},
		{name: "tighter tolerance", base: base, cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.7), rec("tcp", 1<<20, 1, BaseRawTCP, 0.5)}, tol: 0.1,
			regressed: []string{"throughput/p2p/pull/1MiB/c1/vs-memcpy"}, compared: 2},
		{name: "missing entry reported", base: base, cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.8)},
			missing: []string{"throughput/tcp/pull/1MiB/c1/vs-tcp-raw"}, compared: 1},
		{name: "skipped counts as missing", base: base, cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.8), {Kind: KindThroughput, Path: "tcp", Mode: ModePull, Size: 1 << 20, Concurrency: 1, Baseline: BaseRawTCP, Status: StatusSkipped}},
			missing: []string{"throughput/tcp/pull/1MiB/c1/vs-tcp-raw"}, compared: 1},
		{name: "new cells are not failures", base: base[:1], cur: []Record{rec("p2p", 1<<20, 1, BaseMemcpy, 0.8), rec("p2p", 4<<10, 8, BaseMemcpy, 0.1)}, ok: true, newKeys: 1, compared: 1},
		{name: "a cell's own tolerance widens its band", base: []Record{func() Record { r := rec("rdma", 1<<20, 1, BaseRawTCP, 0.5); r.Tolerance = 0.5; return r }()},
			cur: []Record{rec("rdma", 1<<20, 1, BaseRawTCP, 0.3)}, ok: true, compared: 1},
		{name: "a cell's own tolerance never narrows the flag's", base: []Record{func() Record { r := rec("rdma", 1<<20, 1, BaseRawTCP, 0.5); r.Tolerance = 0.05; return r }()},
			cur: []Record{rec("rdma", 1<<20, 1, BaseRawTCP, 0.4)}, ok: true, compared: 1},
		{name: "beyond a cell's own tolerance", base: []Record{func() Record { r := rec("rdma", 1<<20, 1, BaseRawTCP, 0.5); r.Tolerance = 0.5; return r }()},
			cur: []Record{rec("rdma", 1<<20, 1, BaseRawTCP, 0.2)}, regressed: []string{"throughput/rdma/pull/1MiB/c1/vs-tcp-raw"}, compared: 1},
		{name: "push and pull are different cells", base: []Record{func() Record { r := rec("rdma", 1<<20, 1, BaseRawTCP, 0.5); r.Mode = ModePush; return r }()},
			cur: []Record{rec("rdma", 1<<20, 1, BaseRawTCP, 0.5)}, missing: []string{"throughput/rdma/push/1MiB/c1/vs-tcp-raw"}, newKeys: 1, compared: 0},
		{name: "latency ratio", base: []Record{{Kind: KindLatency, Path: "tcp", Mode: ModePull, Size: 4096, Concurrency: 1, Baseline: BasePingPong, Ratio: 0.4}},
			cur:       []Record{{Kind: KindLatency, Path: "tcp", Mode: ModePull, Size: 4096, Concurrency: 1, Baseline: BasePingPong, Ratio: 0.2}},
			regressed: []string{"latency/tcp/pull/4KiB/c1/vs-tcp-pingpong"}, compared: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Check(tt.base, tt.cur, tt.tol)
			if res.OK() != tt.ok {
				t.Fatalf("OK() = %v, want %v: %v", res.OK(), tt.ok, res.Error())
			}
			if (res.Error() == nil) != tt.ok {
				t.Fatalf("Error() = %v with OK() = %v", res.Error(), res.OK())
			}
			if res.Compared != tt.compared {
				t.Errorf("Compared = %d, want %d", res.Compared, tt.compared)
			}
			if len(res.New) != tt.newKeys {
				t.Errorf("New = %v, want %d", res.New, tt.newKeys)
			}
			var reg, miss []string
			for _, r := range res.Regressions {
				if r.Missing {
					miss = append(miss, r.Key)
				} else {
					reg = append(reg, r.Key)
				}
			}
			if strings.Join(reg, ",") != strings.Join(tt.regressed, ",") {
				t.Errorf("regressions = %v, want %v", reg, tt.regressed)
			}
			if len(miss) != len(tt.missing) {
				t.Errorf("missing = %v, want %v", miss, tt.missing)
			}
			if !tt.ok {
				msg := res.Error().Error()
				for _, k := range append(reg, miss...) {
					if !strings.Contains(msg, k) {
						t.Errorf("error does not name %s:\n%s", k, msg)
					}
				}
			}
		})
	}
}

func TestMedian(t *testing.T) {
	a := []Record{rec("p2p", 4096, 1, BaseMemcpy, 0.9), {Path: "shm", Status: StatusNotBuilt}}
	b := []Record{rec("p2p", 4096, 1, BaseMemcpy, 0.1)}
	c := []Record{rec("p2p", 4096, 1, BaseMemcpy, 0.5)}
	m := Median(a, b, c)
	if len(m) != 2 || m[0].Ratio != 0.5 || m[1].Status != StatusNotBuilt {
		t.Fatalf("Median = %+v", m)
	}
	if m[0].Tolerance != MaxCellTolerance {
		t.Errorf("runs 0.1..0.9 around 0.5: tolerance %v, want the cap %v", m[0].Tolerance, MaxCellTolerance)
	}
	// Cells bound by scheduling get a floor whatever their spread.
	c8 := Median([]Record{rec("tcp", 1<<20, 8, BaseRawTCP, 0.6)}, []Record{rec("tcp", 1<<20, 8, BaseRawTCP, 0.6)}, []Record{rec("tcp", 1<<20, 8, BaseRawTCP, 0.6)})
	if c8[0].Tolerance != 0.45 || !strings.Contains(c8[0].Note, "in flight") {
		t.Errorf("8 in flight: %+v", c8[0])
	}
	big := Median([]Record{rec("shm", 64<<20, 1, BaseMemcpy, 0.9)}, []Record{rec("shm", 64<<20, 1, BaseMemcpy, 0.9)}, []Record{rec("shm", 64<<20, 1, BaseMemcpy, 0.9)})
	if big[0].Tolerance != 0 {
		t.Errorf("a bandwidth-bound cell keeps the default: %+v", big[0])
	}
	if m := Median(a); m[0].Ratio != 0.9 || m[0].Tolerance != 0 {
		t.Fatalf("Median of one run = %+v", m)
	}
	// Runs within 10% of each other keep the default tolerance.
	tight := Median([]Record{rec("shm", 4096, 1, BaseMemcpy, 0.95)}, []Record{rec("shm", 4096, 1, BaseMemcpy, 1)}, []Record{rec("shm", 4096, 1, BaseMemcpy, 1.05)})
	if tight[0].Ratio != 1 || tight[0].Tolerance != 0 {
		t.Errorf("tight runs: %+v", tight[0])
	}
	// A spread of 0.7..1 around 1 gets 2*(1-0.7) = 0.6, capped at 0.5; 0.85 gets 0.3.
	mid := Median([]Record{rec("shm", 4096, 1, BaseMemcpy, 0.85)}, []Record{rec("shm", 4096, 1, BaseMemcpy, 1)}, []Record{rec("shm", 4096, 1, BaseMemcpy, 1.2)})
	if mid[0].Tolerance != 0.3 {
		t.Errorf("spread 0.85..1.2: tolerance %v, want 0.3", mid[0].Tolerance)
	}
}
