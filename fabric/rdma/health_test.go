package rdma_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestDegradeRecover marks one of two loopback rails degraded: the next
// transfer puts no slice on it, Rails says so, the mark is counted once
// (a renewal is not); Recover (or the mark running out) gives it slices
// again; when every rail is degraded they still carry the transfer.
func TestDegradeRecover(t *testing.T) {
	const size = 16 << 20
	f := newFixture(t, size, 2, nil)
	dst, p := f.dst(t, size)
	read := func(step string) (r0, r1 float64) {
		t.Helper()
		b0 := testutil.ToFloat64(f.metrics.RailBytes.WithLabelValues("nic0->nic0"))
		b1 := testutil.ToFloat64(f.metrics.RailBytes.WithLabelValues("nic1->nic1"))
		clear(p)
		if _, err := f.tr.Read(context.Background(), f.remote(0, size), dst); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !bytes.Equal(p, f.data) {
			t.Fatalf("%s: bytes differ", step)
		}
		return testutil.ToFloat64(f.metrics.RailBytes.WithLabelValues("nic0->nic0")) - b0,
			testutil.ToFloat64(f.metrics.RailBytes.WithLabelValues("nic1->nic1")) - b1
	}
	// The first transfer connects both rails (rail 1 in the background,
	// so on a loaded machine rail 0 may carry it all).
	r0, r1 := read("both rails")
	t.Logf("first transfer: rail0 %.0f MiB, rail1 %.0f MiB", r0/(1<<20), r1/(1<<20))
	addr1 := ""
	for _, rs := range f.tr.Rails() {
		if rs.Label == "nic1->nic1" {
			addr1 = rs.Addr
		}
	}

	tests := []struct {
		name   string
		before func()
		want1  bool // rail 1 carries bytes
	}{
		{"degraded", func() {
			if got := f.tr.Degrade("nic1", addr1, time.Minute, "test: rtt"); len(got) != 1 || got[0] != "nic1->nic1" {
				t.Fatalf("Degrade marked %v", got)
			}
			f.tr.Degrade("nic1", addr1, time.Minute, "test: renewed") // not a new pause
		}, false},
		{"recovered", func() {
			if got := f.tr.Recover("nic1", addr1); len(got) != 1 {
				t.Fatalf("Recover cleared %v", got)
			}
		}, true},
		{"mark expired", func() {
			f.tr.Degrade("nic1", "", time.Millisecond, "test: short")
			time.Sleep(5 * time.Millisecond) // the mark's own duration, not work
		}, true},
		{"all degraded", func() {
			f.tr.Degrade("", "", time.Minute, "test: everything")
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.before()
			r0, r1 := read(tc.name)
			t.Logf("%s: rail0 %.0f MiB, rail1 %.0f MiB", tc.name, r0/(1<<20), r1/(1<<20))
			if (r1 > 0) != tc.want1 {
				t.Errorf("rail 1 moved %v bytes, want bytes: %v (rails %+v)", r1, tc.want1, f.tr.Rails())
			}
			if tc.name == "degraded" {
				if r0 != size {
					t.Errorf("rail 0 moved %v of %d bytes", r0, size)
				}
				for _, rs := range f.tr.Rails() {
					if rs.Degraded != (rs.Label == "nic1->nic1") {
						t.Errorf("rail %s degraded %v", rs.Label, rs.Degraded)
					}
					if rs.Degraded && rs.DegradedReason != "test: renewed" {
						t.Errorf("reason %q", rs.DegradedReason)
					}
				}
			}
		})
	}
	if n := testutil.ToFloat64(f.metrics.HealthPauses.WithLabelValues("nic1->nic1")); n != 3 {
		t.Errorf("rail 1 health pauses %v, want 3 (degraded, short, all)", n)
	}
	if got := f.tr.Degrade("nic9", "", time.Minute, "no such rail"); len(got) != 0 {
		t.Errorf("unknown NIC matched %v", got)
	}
}

// Link telemetry reports the connection under rail nic1 degraded: the
// reader marks the rail, and the next transfer goes over nic0 alone.
func ExampleTransport_Degrade() {
	ctx := context.Background()
	mem, _ := tensor.NewSimMemory(tensor.GPUDevice(0), 32<<20)
	defer mem.Close()
	obj, _ := mem.Alloc(ctx, 8<<20)
	ownerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	ownerID, _ := peer.IDFromPrivateKey(ownerKey)
	nics := []softrdma.NIC{{Name: "nic0", Addr: "127.0.0.1:0"}, {Name: "nic1", Addr: "127.0.0.1:0"}}
	ownerProv, _ := softrdma.New(softrdma.Config{NICs: nics})
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: ownerProv, Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nopRelease{obj}, nil })})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	readerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	readerProv, _ := softrdma.New(softrdma.Config{NICs: nics})
	tr, _ := rdma.New(ctx, rdma.Config{Provider: readerProv, Security: fabric.Security{Identity: readerKey}, AllowLoopback: true})
	defer tr.Close()
	src := fabric.Remote{Peer: ownerID.String(), Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Length: 8 << 20}
	dst, _ := mem.Alloc(ctx, 8<<20)

	tr.Read(ctx, src, dst) // connects the rails
	fmt.Println("marked:", tr.Degrade("nic1", "", 10*time.Second, "rtt 40ms is 800x the minimum"))
	st, _ := tr.Read(ctx, src, dst)
	fmt.Println("rails used:", st.Streams)
	for _, r := range tr.Rails() {
		fmt.Println(r.Label, "degraded:", r.Degraded)
	}
	// Output:
	// marked: [nic1->nic1]
	// rails used: 1
	// nic0->nic0 degraded: false
	// nic1->nic1 degraded: true
}
