package tcp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// BenchmarkStreams reads the same object with Config.Streams 1, 2 and 4
// and over one raw socket, interleaved round by round (the order rotates),
// and reports for each stream count its median time over raw's
// (sN/raw-time, below 1 faster than raw) and both ends' CPU per GB
// (sN-cpu-ms/GB, raw-cpu-ms/GB): what to set Streams to on the cores a
// machine has.
//
//	go test -run '^$' -bench Streams -benchtime 10x ./fabric/tcp/
func BenchmarkStreams(b *testing.B) {
	for _, n := range []int64{64 << 20, 1 << 30} {
		b.Run(sizeName(n), func(b *testing.B) {
			f := newFixture(b, n, nil)
			raw := rawBeside(b, f)
			dst := f.dst(b, n)
			to, _ := tensor.BytesOf(dst)
			r := f.remote(n)
			ctx := context.Background()
			names := []string{"raw"}
			runs := []func() error{func() error { return raw.read(to) }}
			for _, s := range []int{1, 2, 4} {
				tr := f.transport(b, Config{Compression: CompressOff, Streams: s})
				names = append(names, fmt.Sprintf("s%d", s))
				runs = append(runs, func() error { _, err := tr.Read(ctx, r, dst); return err })
			}
			for _, run := range runs { // connections, pages
				require.NoError(b, run())
			}
			took := make([][]time.Duration, len(runs))
			cpu := make([]time.Duration, len(runs))
			b.SetBytes(n * int64(len(runs)))
			for i := 0; b.Loop(); i++ {
				for k := range runs {
					j := (k + i) % len(runs)
					c0, t0 := testhelp.CPUTime(), time.Now()
					if err := runs[j](); err != nil {
						b.Fatal(err)
					}
					took[j] = append(took[j], time.Since(t0))
					cpu[j] += testhelp.CPUTime() - c0
				}
			}
			gb := float64(n) * float64(len(took[0])) / 1e9
			for j, name := range names {
				b.ReportMetric(cpu[j].Seconds()*1e3/gb, name+"-cpu-ms/GB")
				if j > 0 {
					b.ReportMetric(testhelp.Median(took[j]).Seconds()/testhelp.Median(took[0]).Seconds(), name+"/raw-time")
				}
			}
		})
	}
}
