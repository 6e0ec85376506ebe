//go:build ofi

package rdma_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/faults"
	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// BenchmarkLatency4KiB times single 4 KiB reads over one loopback rail,
// through the software provider and through libfabric (net provider,
// TENSORLANE_OFI_PROVIDER to change it; ofi-poll: Config.NoWait;
// ofi-pollfd: Config.PollWaitFD, the wait fd slept on in poll(2)),
// interleaved read by read (the order rotating) so that load from other
// processes hits all alike. It reports each provider's p50 and p90 in µs
// and the ratio of libfabric's p50 to softrdma's (ofi/soft-p50; the goal
// is at most 1.5):
//
//	go test -tags ofi -run '^$' -bench Latency4KiB -benchtime 2000x ./fabric/rdma/
func BenchmarkLatency4KiB(b *testing.B) {
	providers := map[string]func(t testing.TB, names ...string) testProvider{
		"soft": func(t testing.TB, names ...string) testProvider {
			sim := new(faults.Sim)
			p, err := softrdma.New(softrdma.Config{NICs: loopbackNICs(names...), Faults: sim})
			if err != nil {
				t.Fatal(err)
			}
			return testProvider{p, sim}
		},
		"ofi":        ofiProvider(false),
		"ofi-poll":   ofiProvider(true),
		"ofi-pollfd": ofiProviderWith(func(c *ofi.Config) { c.PollWaitFD = true }),
	}
	names := []string{"soft", "ofi", "ofi-poll", "ofi-pollfd"}
	saved := newTestProvider
	defer func() { newTestProvider = saved }()
	const n = 4 << 10
	ctx := context.Background()
	reads := make([]func() time.Duration, len(names))
	for i, name := range names {
		newTestProvider = providers[name]
		f := newFixtureTB(b, 1<<20, 1)
		dst, err := f.mem.Alloc(ctx, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dst.Release() })
		r := f.remote(0, n)
		if _, err := f.tr.Read(ctx, r, dst); err != nil { // connect the rail
			b.Fatal(err)
		}
		reads[i] = func() time.Duration {
			t0 := time.Now()
			if _, err := f.tr.Read(ctx, r, dst); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}
	}
	took := make([][]time.Duration, len(names))
	b.SetBytes(n * int64(len(names)))
	it := 0
	for b.Loop() {
		for k := range names {
			i := (k + it) % len(names)
			took[i] = append(took[i], reads[i]())
		}
		it++
	}
	p50 := make([]float64, len(names))
	for i, name := range names {
		slices.Sort(took[i])
		q := func(p float64) float64 {
			return float64(took[i][int(p*float64(len(took[i])-1))].Nanoseconds()) / 1e3
		}
		p50[i] = q(0.5)
		b.ReportMetric(p50[i], name+"-p50-µs")
		b.ReportMetric(q(0.9), name+"-p90-µs")
	}
	b.ReportMetric(p50[1]/p50[0], "ofi/soft-p50")
}

// ofiProvider makes libfabric providers for the rdma tests; poll: the
// completion queues poll with backoff instead of sleeping in fi_cq_sread.
func ofiProvider(poll bool) func(t testing.TB, names ...string) testProvider {
	return ofiProviderWith(func(c *ofi.Config) { c.NoWait = poll })
}

// ofiProviderWith is ofiProvider with the Config changed by set.
func ofiProviderWith(set func(*ofi.Config)) func(t testing.TB, names ...string) testProvider {
	return func(t testing.TB, names ...string) testProvider {
		cfg := ofi.FromEnv()
		set(&cfg)
		if cfg.Provider == "" {
			cfg.Provider = "net"
		}
		for _, n := range names {
			cfg.NICs = append(cfg.NICs, ofi.NIC{Name: n, Domain: "lo", Addr: "127.0.0.1:0"})
		}
		cfg.Faults = new(faults.Sim)
		p, err := ofi.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return testProvider{p, cfg.Faults}
	}
}

// BenchmarkWriteRunsOFI is BenchmarkWriteRuns over libfabric (net
// provider unless TENSORLANE_OFI_PROVIDER says otherwise; two loopback
// rails), for 4 KiB and 128 KiB runs: the domain's iov_limit segments per
// WRITE (the default: fi_writemsg with an iov; the transport still packs
// runs too short for them, gathers) against one (sge=1: the transport
// packs).
//
//	go test -tags ofi -run '^$' -bench WriteRunsOFI -benchtime 20x ./fabric/rdma/
func BenchmarkWriteRunsOFI(b *testing.B) {
	const n = 16 << 20
	for _, runs := range []struct {
		name string
		runs []fabric.Run
	}{{"4KiB", rows(n)}, {"128KiB", longRows(n)}} {
		for _, sge := range []int{1, 0} {
			name := runs.name + "/sge=iov_limit"
			if sge == 1 {
				name = runs.name + "/sge=1"
			}
			b.Run(name, func(b *testing.B) {
				mk := ofiProviderWith(func(c *ofi.Config) { c.MaxSGE = sge })
				benchWriteRuns(b, newPushFixtureOver(b, n, func(t testing.TB, names ...string) rdma.Provider {
					return mk(t, names...).Provider
				}, nil), runs.runs)
			})
		}
	}
}
