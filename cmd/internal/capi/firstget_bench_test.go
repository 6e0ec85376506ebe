package capi

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// firstGets runs, per iteration, one fresh slab-mode reader per variant
// (the order rotating) and times f, its first read of an n-byte object
// over transport tr; it returns each variant's times.
func firstGets(b *testing.B, tr string, n int64, variants int, f func(r *Runtime, ref, small rdt.Ref, variant int) time.Duration) [][]time.Duration {
	b.Setenv(EnvSlabs, "")
	b.Setenv(EnvPoolBytes, "")
	cfg := `{"allow_transports":["` + tr + `"],"slabs":true,"cluster_key":"` + slabKey + `"}`
	ctx := context.Background()
	lib := New()
	defer lib.CloseAll(ctx)
	ha, err := lib.NewRuntime(ctx, []byte(cfg))
	require.NoError(b, err)
	a, _ := lib.Runtime(ha)
	p, err := a.Alloc(ctx, n)
	require.NoError(b, err)
	refBytes, err := a.Put(ctx, Region{Mem: unsafe.Slice((*byte)(p), n), DType: "uint8", Shape: []int64{n}})
	require.NoError(b, err)
	ref, err := parseRef(refBytes)
	require.NoError(b, err)
	smallBytes, err := a.Put(ctx, Region{Mem: unsafe.Slice((*byte)(p), 1), DType: "uint8", Shape: []int64{1}})
	require.NoError(b, err)
	small, err := parseRef(smallBytes)
	require.NoError(b, err)
	took := make([][]time.Duration, variants)
	b.SetBytes(n * int64(variants))
	for i := 0; b.Loop(); i++ {
		for k := range variants {
			v := (k + i) % variants
			b.StopTimer()
			hb, err := lib.NewRuntime(ctx, []byte(cfg))
			require.NoError(b, err)
			r, _ := lib.Runtime(hb)
			b.StartTimer()
			took[v] = append(took[v], f(r, ref, small, v))
			b.StopTimer()
			require.NoError(b, lib.Close(ctx, hb))
			b.StartTimer()
		}
	}
	return took
}

// BenchmarkFirstGetWarm: a fresh reader's first 64 MiB GetBatch over tcp
// (dials included) alone against with rdt's Warm started beside it (as
// capi did for a while: docs/benchmarks.md, fourth look). Reported:
// alone/warm, the median of the per-round ratios (above 1: Warm beside it
// is faster).
//
//	go test -run '^$' -bench FirstGetWarm -benchtime 8x ./cmd/internal/capi/
func BenchmarkFirstGetWarm(b *testing.B) {
	took := firstGets(b, "tcp", 64<<20, 2, func(r *Runtime, ref, _ rdt.Ref, warm int) time.Duration {
		ctx := context.Background()
		t0 := time.Now()
		var wg sync.WaitGroup
		if warm == 1 {
			wg.Go(func() { _ = r.actor.Warm(ctx, ref, tensor.HostDevice) })
		}
		items, err := r.actor.GetBatch(ctx, []rdt.Ref{ref}, tensor.HostDevice, rdt.BatchConfig{})
		d := time.Since(t0)
		wg.Wait()
		require.NoError(b, err)
		require.NoError(b, items[0].Err)
		items[0].Tensor.Release()
		return d
	})
	b.ReportMetric(medianRatio(took[0], took[1]), "alone/warm")
}

// medianRatio is the median over rounds of base[i]/other[i].
func medianRatio(base, other []time.Duration) float64 {
	r := make([]float64, len(base))
	for i := range base {
		r[i] = base[i].Seconds() / other[i].Seconds()
	}
	slices.Sort(r)
	return r[len(r)/2]
}
