package tcp

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkReadCached: reads of a sealed object whose block checksums the
// owner serves from its cache, against the same reads checksummed at send
// and a raw socket's, interleaved (the order rotating each round). CPU is
// both ends' together (one process), per byte, over raw's:
// cpu-cached/raw, cpu-computed/raw; cpu-cached/computed is what the cache
// saves; speed-cached/computed and speed-cached/raw are the medians of
// the rounds' speed ratios (higher: the cached reads faster).
//
//	go test -run '^$' -bench ReadCached -benchtime 10x ./fabric/tcp/
func BenchmarkReadCached(b *testing.B) {
	for _, n := range []int64{64 << 20, 1 << 30} {
		b.Run(sizeName(n), func(b *testing.B) {
			var sums atomic.Pointer[tensor.ChunkSums]
			f := newFixture(b, n, func(c *ServerConfig) { c.Source = sealedSource(c.Source, &sums) })
			cache := tensor.NewChunkSums(0, n)
			cache.Fill(f.data)
			tr := f.transport(b, Config{Compression: CompressOff, StripeMin: 8 << 20})
			raw := rawBeside(b, f)
			dst := f.dst(b, n)
			to, _ := tensor.BytesOf(dst)
			r := f.remote(n)
			ctx := context.Background()
			require.NoError(b, raw.read(to))
			_, err := tr.Read(ctx, r, dst)
			require.NoError(b, err)

			const kinds = 3 // raw, computed, cached
			var took [kinds][]time.Duration
			var cpu [kinds]time.Duration
			run := func(k int) {
				c0, t0 := testhelp.CPUTime(), time.Now()
				var err error
				switch k {
				case 0:
					err = raw.read(to)
				case 1:
					sums.Store(nil)
					_, err = tr.Read(ctx, r, dst)
				case 2:
					sums.Store(cache)
					_, err = tr.Read(ctx, r, dst)
				}
				if err != nil {
					b.Fatal(err)
				}
				took[k] = append(took[k], time.Since(t0))
				cpu[k] += testhelp.CPUTime() - c0
			}
			before := f.srv.SendSums()
			b.SetBytes(kinds * n)
			round := 0
			for b.Loop() {
				for i := range kinds {
					run((i + round) % kinds)
				}
				round++
			}
			after := f.srv.SendSums()
			if after.Cached-before.Cached != int64(round)*blocks(n) || after.Stored != before.Stored {
				b.Fatalf("cached reads took %d cached checksums, want %d", after.Cached-before.Cached, int64(round)*blocks(n))
			}
			b.ReportMetric(cpu[2].Seconds()/cpu[0].Seconds(), "cpu-cached/raw")
			b.ReportMetric(cpu[1].Seconds()/cpu[0].Seconds(), "cpu-computed/raw")
			b.ReportMetric(cpu[2].Seconds()/cpu[1].Seconds(), "cpu-cached/computed")
			b.ReportMetric(medianRatio(took[1], took[2]), "speed-cached/computed")
			b.ReportMetric(medianRatio(took[0], took[2]), "speed-cached/raw")
			for k, name := range []string{"raw", "computed", "cached"} {
				b.ReportMetric(cpu[k].Seconds()*1e3/(float64(len(took[k]))*float64(n)/1e9), name+"-cpu-ms/GB")
			}
		})
	}
}
