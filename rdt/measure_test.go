package rdt

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/tensor"
)

// TestMeasureFreshTCPGets logs how long the first Gets of incompressible
// bf16-shaped data take on fresh tcp pairs (issue 19.8: the second used to
// take 11-18 ms against 0.3 ms warm, compressing once, and calibrating the
// codec on 1 MiB, before learning it did not pay). A measurement, not a
// check: it runs with TENSORLANE_MEASURE=1 and asserts nothing about time.
//
//	TENSORLANE_MEASURE=1 go test -run TestMeasureFreshTCPGets -v ./rdt/
func TestMeasureFreshTCPGets(t *testing.T) {
	if os.Getenv("TENSORLANE_MEASURE") == "" {
		t.Skip("a measurement: set TENSORLANE_MEASURE=1")
	}
	ctx := context.Background()
	for round := range 3 {
		p := newPair(t, func(c *Config) { c.Transports.Allow = []string{"tcp", "local"} })
		owner, _ := p.a.Spawn("owner")
		reader, _ := p.b.Spawn("reader")
		x := fill(t, p.a, tensor.GPUDevice(0), tensor.BFloat16, 1<<19)
		b, _ := x.SpanBytes()
		rand.Read(b)
		ref, _ := owner.Put(ctx, x)
		var ds []time.Duration
		for range 4 {
			start := time.Now()
			g, err := reader.Get(ctx, ref, tensor.GPUDevice(1))
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start).Round(time.Microsecond))
			g.Release()
		}
		t.Logf("fresh pair %d: 1 MiB of random bf16 over tcp, Gets 1-4: %v", round, ds)
	}
}
