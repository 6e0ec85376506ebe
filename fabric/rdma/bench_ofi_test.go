//go:build ofi

package rdma_test

import (
	"context"
	"testing"

	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// BenchmarkLatency4KiB times single 4 KiB reads over one loopback rail,
// through the software provider and through libfabric (net provider,
// TENSORLANE_OFI_PROVIDER to change it), in one run so the two compare:
//
//	go test -tags ofi -run '^$' -bench Latency4KiB -benchtime 2000x ./fabric/rdma/
func BenchmarkLatency4KiB(b *testing.B) {
	providers := map[string]func(t testing.TB, names ...string) testProvider{
		"soft": func(t testing.TB, names ...string) testProvider {
			p, err := softrdma.New(softrdma.Config{NICs: loopbackNICs(names...)})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		"ofi":      ofiProvider(false),
		"ofi-poll": ofiProvider(true),
	}
	saved := newTestProvider
	defer func() { newTestProvider = saved }()
	for _, name := range []string{"soft", "ofi", "ofi-poll"} {
		b.Run(name, func(b *testing.B) {
			newTestProvider = providers[name]
			const n = 4 << 10
			f := newFixtureTB(b, 1<<20, 1)
			dst, err := f.mem.Alloc(context.Background(), n)
			if err != nil {
				b.Fatal(err)
			}
			defer dst.Release()
			r := f.remote(0, n)
			if _, err := f.tr.Read(context.Background(), r, dst); err != nil { // connect the rail
				b.Fatal(err)
			}
			b.SetBytes(n)
			b.ResetTimer()
			for range b.N {
				if _, err := f.tr.Read(context.Background(), r, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ofiProvider makes libfabric providers for the rdma tests; poll: the
// completion queues poll with backoff instead of sleeping in fi_cq_sread.
func ofiProvider(poll bool) func(t testing.TB, names ...string) testProvider {
	return func(t testing.TB, names ...string) testProvider {
		cfg := ofi.FromEnv()
		cfg.NoWait = poll
		if cfg.Provider == "" {
			cfg.Provider = "net"
		}
		for _, n := range names {
			cfg.NICs = append(cfg.NICs, ofi.NIC{Name: n, Domain: "lo", Addr: "127.0.0.1:0"})
		}
		p, err := ofi.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}
