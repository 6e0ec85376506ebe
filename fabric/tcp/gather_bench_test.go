package tcp

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkWriteRuns: a push of a resharded move's bytes (4 KiB rows of a
// row shard, 8 KiB apart: one tensor-parallel half of each row) three
// ways, in turn, owner and pusher in this process: "packed" copies the
// runs into a buffer and Writes it (reshard's pack path), "gathered" is
// WriteRuns, "plain" Writes the same number of contiguous bytes (the
// unsharded push). Reported: the medians of each round's ratios to plain.
func BenchmarkWriteRuns(b *testing.B) {
	const n = 16 << 20
	pf := newPushFixtureWith(b, 2*n, nil)
	src, _ := tensor.BytesOf(pf.src)
	tr := pf.transport(b, Config{Compression: CompressOff, StripeMin: 8 << 20})
	ctx := context.Background()
	var runs []fabric.Run
	for off := int64(0); off < 2*n; off += 8192 {
		runs = append(runs, fabric.Run{Off: off, Len: 4096})
	}
	pack, err := tensor.NewHostMemory(0).Alloc(ctx, n)
	if err != nil {
		b.Fatal(err)
	}
	defer pack.Release()
	packed, _ := tensor.BytesOf(pack)
	var pk, ga, pl []float64
	b.SetBytes(n)
	for b.Loop() {
		t0 := time.Now()
		at := 0
		for _, r := range runs {
			at += copy(packed[at:], src[r.Off:r.Off+r.Len])
		}
		if _, err := tr.Write(ctx, pack, pf.target(0, n)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := tr.WriteRuns(ctx, pf.src, runs, pf.target(0, n)); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := tr.Write(ctx, pf.src, pf.target(0, n)); err != nil {
			b.Fatal(err)
		}
		pk, ga, pl = append(pk, float64(t1.Sub(t0))), append(ga, float64(t2.Sub(t1))), append(pl, float64(time.Since(t2)))
	}
	rp, rg := make([]float64, len(pl)), make([]float64, len(pl))
	for i := range pl {
		rp[i], rg[i] = pk[i]/pl[i], ga[i]/pl[i]
	}
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(med(pl)/1e6, "plain-ms")
	b.ReportMetric(med(rp), "packed/plain")
	b.ReportMetric(med(rg), "gathered/plain")
}
