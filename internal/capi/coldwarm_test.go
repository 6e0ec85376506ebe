package capi

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// BenchmarkColdWarmGet measures issue 15's cold transfer: the first Get of
// a fresh reader (into memory it never used) against later ones, between
// two runtimes of one host over shm, per-object grants against slab mode
// (the reader's destination comes from its pre-faulted pool, and it maps
// the owner's slab once). Each iteration is a fresh reader that Gets four
// objects over the same 64 MiB: the first is cold (fresh reader memory, and
// the source's pages never mapped here); it reports the cold and the
// median warm Get and their ratio (goal: cold <= 1.5x warm).
//
//	go test -run '^$' -bench ColdWarm -benchtime 3x ./internal/capi/
func BenchmarkColdWarmGet(b *testing.B) {
	const n = 64 << 20
	for _, mode := range []struct{ name, config string }{
		{"per-object", `{"allow":["shm"],"cluster_key":"` + slabKey + `"}`},
		{"slabs", `{"allow":["shm"],"slabs":true,"pool_bytes":134217728,"cluster_key":"` + slabKey + `"}`},
	} {
		b.Run(mode.name, func(b *testing.B) {
			b.Setenv(EnvSlabs, "")
			b.Setenv(EnvPoolBytes, "")
			ctx := context.Background()
			lib := New()
			defer lib.CloseAll(ctx)
			ha, err := lib.NewRuntime(ctx, []byte(mode.config))
			require.NoError(b, err)
			a, _ := lib.Runtime(ha)
			p, err := a.Alloc(ctx, n)
			require.NoError(b, err)
			src := unsafe.Slice((*byte)(p), n)
			for i := range src {
				src[i] = byte(i)
			}
			var cold, warm time.Duration
			b.SetBytes(n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				hb, err := lib.NewRuntime(ctx, []byte(mode.config))
				require.NoError(b, err)
				r, _ := lib.Runtime(hb)
				// The first Get pays the connection too: get it out of the
				// way with a one-byte object, as a warmed-up reader has.
				small, err := a.Put(ctx, Region{Mem: src[:1], DType: "uint8", Shape: []int64{1}})
				require.NoError(b, err)
				sp, _, _, err := r.Get(ctx, small, 0, time.Minute)
				require.NoError(b, err)
				r.FreeMemory(sp)
				// Four objects over the same bytes: each Get takes its own
				// lease and grant, as a new object's would, and the cold one
				// is the first into this reader's memory.
				var refs [][]byte
				for j := 0; j < 4; j++ {
					ref, err := a.Put(ctx, Region{Mem: src, DType: "uint8", Shape: []int64{n}})
					require.NoError(b, err)
					refs = append(refs, ref)
				}
				b.StartTimer()
				var times []time.Duration
				for _, ref := range refs {
					t0 := time.Now()
					dp, _, _, err := r.Get(ctx, ref, 0, time.Minute)
					times = append(times, time.Since(t0))
					require.NoError(b, err)
					require.NoError(b, r.FreeMemory(dp))
				}
				b.StopTimer()
				cold += times[0]
				warm += median(times[1:])
				require.NoError(b, lib.Close(ctx, hb))
				a.Free(ctx, small, time.Minute)
				for _, ref := range refs {
					a.Free(ctx, ref, time.Minute)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(cold.Milliseconds())/float64(b.N), "cold-ms")
			b.ReportMetric(float64(warm.Milliseconds())/float64(b.N), "warm-ms")
			b.ReportMetric(float64(cold)/float64(warm), "cold/warm")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
