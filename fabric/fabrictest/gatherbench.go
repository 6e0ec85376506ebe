package fabrictest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// PushWriter is a transport that pushes both ways: plain writes and
// gathered writes of runs.
type PushWriter interface {
	fabric.Writer
	fabric.GatherWriter
}

// BenchWriteRuns is a transport's BenchmarkWriteRuns loop: the push of
// runs of src (filling dst) three ways in turn, "packed" (the runs copied
// into a buffer, then Write: reshard's pack path), "gathered" (WriteRuns)
// and "plain" (Write of as many contiguous bytes of src: the unsharded
// push). It reports plain's median time and the medians of each round's
// ratios to plain (packed/plain, gathered/plain).
func BenchWriteRuns(b *testing.B, w PushWriter, src tensor.Buffer, runs []fabric.Run, dst fabric.Remote) {
	ctx := context.Background()
	from, err := tensor.BytesOf(src)
	if err != nil {
		b.Fatal(err)
	}
	pack, err := tensor.NewHostMemory(0).Alloc(ctx, dst.Length)
	if err != nil {
		b.Fatal(err)
	}
	defer pack.Release()
	packed, _ := tensor.BytesOf(pack)
	if _, err := w.Write(ctx, src, dst); err != nil { // connections (rails) up
		b.Fatal(err)
	}
	var pk, ga, pl []float64
	b.SetBytes(dst.Length)
	for b.Loop() {
		t0 := time.Now()
		at := 0
		for _, r := range runs {
			at += copy(packed[at:], from[r.Off:r.Off+r.Len])
		}
		if _, err := w.Write(ctx, pack, dst); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := w.WriteRuns(ctx, src, runs, dst); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := w.Write(ctx, src, dst); err != nil {
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
