//go:build ofi

package ofi

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

func testKey(t testing.TB) crypto.PrivKey {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func loopback(t testing.TB, names ...string) *Provider {
	t.Helper()
	return loopbackWith(t, nil, names...)
}

// loopbackWith is loopback with the Config changed by set (when not nil).
func loopbackWith(t testing.TB, set func(*Config), names ...string) *Provider {
	t.Helper()
	cfg := Config{Provider: testProv()}
	if set != nil {
		set(&cfg)
	}
	for _, n := range names {
		cfg.NICs = append(cfg.NICs, NIC{Name: n, Domain: "lo", Addr: "127.0.0.1:0"})
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenClose(t *testing.T) {
	p := loopback(t, "nic0")
	t.Log(p.Fabric(), p.Devices())
	ctx := context.Background()
	d, err := p.Open(ctx, "nic0", rdma.OpenConfig{Security: fabric.Security{Identity: testKey(t)}, Listen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(d.Addr())
	pd, _ := d.AllocPD()
	buf := make([]byte, 1<<20)
	m, err := pd.RegisterMemory(buf, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(m.RKey(), m.Addr())
	m.Deregister()
	cq, err := d.CreateCQ()
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(cq, rdma.QPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	qp.Close()
	d.Close()
}

func TestReadWrite(t *testing.T) {
	ctx := context.Background()
	owner := loopback(t, "nic0")
	reader := loopback(t, "nic0")
	od, err := owner.Open(ctx, "nic0", rdma.OpenConfig{Security: fabric.Security{Identity: testKey(t)}, Listen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer od.Close()
	rd, err := reader.Open(ctx, "nic0", rdma.OpenConfig{Security: fabric.Security{Identity: testKey(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	opd, _ := od.AllocPD()
	src := make([]byte, 8<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	om, err := opd.RegisterMemory(src, rdma.AccessRemoteRead|rdma.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	rpd, _ := rd.AllocPD()
	dst := make([]byte, 8<<20)
	lm, err := rpd.RegisterMemory(dst, rdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := rd.CreateCQ()
	qp, err := rpd.CreateQP(cq, rdma.QPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Connect(ctx, od.Addr(), ""); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := retryFull(ctx, func() error {
		return qp.PostRead(rdma.WorkRequest{ID: 7, LKey: lm.LKey(), LocalAddr: lm.Addr(), Length: uint32(len(dst)), RKey: om.RKey(), RemoteAddr: om.Addr()})
	}); err != nil {
		t.Fatal(err)
	}
	wc := make([]rdma.Completion, 4)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	n := cq.Poll(wc)
	t.Logf("%d %+v in %v", n, wc[:n], time.Since(t0))
	if n != 1 || wc[0].Status != rdma.StatusSuccess || !bytes.Equal(src, dst) {
		t.Fatal("read failed")
	}
	// A bad key fails with a remote access error.
	if err := retryFull(ctx, func() error {
		return qp.PostRead(rdma.WorkRequest{ID: 8, LKey: lm.LKey(), LocalAddr: lm.Addr(), Length: 100, RKey: om.RKey() + 2, RemoteAddr: om.Addr()})
	}); err != nil {
		t.Fatal(err)
	}
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	n = cq.Poll(wc)
	t.Logf("%d %+v", n, wc[:n])
	t0 = time.Now()
	if err := retryFull(ctx, func() error {
		// The provider dropped the connection over the bad key: the
		// post waits for a new one.
		return qp.PostRead(rdma.WorkRequest{ID: 9, LKey: lm.LKey(), LocalAddr: lm.Addr(), Length: 4096, RKey: om.RKey(), RemoteAddr: om.Addr()})
	}); err != nil {
		t.Fatal(err)
	}
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	n = cq.Poll(wc)
	t.Logf("after: %d %+v in %v", n, wc[:n], time.Since(t0))
	qp.Close()
}

// retryFull posts until the queue takes the request: a post that finds
// the connection still being set up reports rdma.ErrQueueFull after
// driving progress for a while (20 ms), and callers retry, as the rdma
// transport does. Under load the set-up can take longer than one try.
func retryFull(ctx context.Context, post func() error) error {
	for {
		err := post()
		if err != rdma.ErrQueueFull || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// pair is an owner device with one registered region and a reader with
// a connected queue pair.
type pair struct {
	od, rd   rdma.Context
	src, dst []byte
	om, lm   rdma.MemoryRegion
	cq       rdma.CompletionQueue
	qp       rdma.QueuePair
}

func newPair(t *testing.T, size int) *pair {
	t.Helper()
	return newPairWith(t, size, nil)
}

// newPairWith is newPair with both providers' Config changed by set.
func newPairWith(t *testing.T, size int, set func(*Config)) *pair {
	t.Helper()
	ctx := context.Background()
	p := &pair{}
	var err error
	if p.od, err = loopbackWith(t, set, "nic0").Open(ctx, "nic0", rdma.OpenConfig{Security: fabric.Security{Identity: testKey(t)}, Listen: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.od.Close() })
	if p.rd, err = loopbackWith(t, set, "nic0").Open(ctx, "nic0", rdma.OpenConfig{Security: fabric.Security{Identity: testKey(t)}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.rd.Close() })
	p.src, p.dst = make([]byte, size), make([]byte, size)
	for i := range p.src {
		p.src[i] = byte(i*7 + i>>12)
	}
	opd, _ := p.od.AllocPD()
	if p.om, err = opd.RegisterMemory(p.src, rdma.AccessRemoteRead|rdma.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	rpd, _ := p.rd.AllocPD()
	if p.lm, err = rpd.RegisterMemory(p.dst, rdma.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	p.cq, _ = p.rd.CreateCQ()
	if p.qp, err = rpd.CreateQP(p.cq, rdma.QPConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := p.qp.Connect(ctx, p.od.Addr(), ""); err != nil {
		t.Fatal(err)
	}
	return p
}

// move reads (or writes) the whole region in slices with inflight
// outstanding at once.
func (p *pair) move(slice, inflight int, write bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	next, done, out := 0, 0, 0
	total := (len(p.dst) + slice - 1) / slice
	wc := make([]rdma.Completion, 16)
	for done < total {
		for out < inflight && next < total {
			off := next * slice
			n := min(slice, len(p.dst)-off)
			wr := rdma.WorkRequest{ID: uint64(next), LKey: p.lm.LKey(), LocalAddr: p.lm.Addr() + uint64(off), Length: uint32(n),
				RKey: p.om.RKey(), RemoteAddr: p.om.Addr() + uint64(off)}
			var err error
			if write {
				err = p.qp.PostWrite(wr)
			} else {
				err = p.qp.PostRead(wr)
			}
			if err == rdma.ErrQueueFull {
				break
			}
			if err != nil {
				return fmt.Errorf("post %d: %w", next, err)
			}
			next++
			out++
		}
		if out == 0 {
			// The queue was full before anything was posted (the first
			// post waits for the connection, 20 ms at most): retry, as the
			// rdma transport does.
			if ctx.Err() != nil {
				return fmt.Errorf("post: queue full until the deadline: %w", ctx.Err())
			}
			time.Sleep(time.Millisecond)
			continue
		}
		if err := p.cq.Wait(ctx); err != nil {
			return fmt.Errorf("wait (%d of %d done, %d out): %w", done, total, out, err)
		}
		k := p.cq.Poll(wc)
		for _, c := range wc[:k] {
			if c.Status != rdma.StatusSuccess {
				return fmt.Errorf("completion %+v", c)
			}
		}
		done += k
		out -= k
	}
	return nil
}

func TestManyInFlight(t *testing.T) {
	p := newPair(t, 256<<20)
	for range 4 {
		if err := p.move(8<<20, 8, false); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(p.src, p.dst) {
		t.Fatal("bytes differ")
	}
}

func TestTwoRailsInParallel(t *testing.T) {
	a, b := newPair(t, 128<<20), newPair(t, 128<<20)
	errs := make(chan error, 2)
	for _, p := range []*pair{a, b} {
		go func() {
			for range 8 {
				if err := p.move(8<<20, 4, false); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// testProv is the libfabric provider the tests use: TENSORLANE_OFI_PROVIDER,
// default "net" (see docs/rdma-ofi.md for why not tcp;ofi_rxm).
func testProv() string {
	if p := os.Getenv(EnvProvider); p != "" {
		return p
	}
	return "net"
}

// TestDiscovery: the default NIC list is every domain of the provider,
// named as the topology would name it, with a bootstrap address and
// what fi_getinfo says of it.
func TestDiscovery(t *testing.T) {
	p, err := New(Config{Provider: testProv()})
	if err != nil {
		t.Fatal(err)
	}
	var lo *NIC
	for _, n := range p.NICs() {
		t.Logf("%+v", n)
		if n.Domain == "lo" {
			lo = &n
		}
	}
	if lo == nil || lo.Name != "lo" || lo.Addr != "127.0.0.1:0" || lo.Fabric == "" {
		t.Fatalf("loopback domain: %+v", lo)
	}
	if _, err := New(Config{Provider: "no-such-provider"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("unknown provider: got %v, want ErrUnavailable", err)
	}
	if _, err := New(Config{Provider: testProv(), NICs: []NIC{{Domain: "no-such-domain"}}}); !errors.Is(err, rdma.ErrNoDevice) {
		t.Fatalf("unknown domain: got %v, want rdma.ErrNoDevice", err)
	}
	a := Probe(Config{Provider: testProv()})
	if !a.BuiltIn || a.Reason != "" || len(a.Providers) == 0 {
		t.Fatalf("Probe: %+v", a)
	}
}

// The provider answers the GPUDirect capability question from libfabric
// itself: here, a libfabric without a device-memory interface (as on every
// CI machine), FI_HMEM with FI_MR_HMEM finds no endpoint and device memory
// is staged, with fi_getinfo's answer as the reason. On a machine whose
// libfabric registers device memory the answer is HMEM with interfaces.
// hmemCaps maps both answers.
func TestHMEMProbe(t *testing.T) {
	p := loopback(t, "nic0")
	c := p.HMEM()
	t.Logf("%+v", c)
	if c.Provider != "ofi "+p.Fabric() {
		t.Errorf("Provider = %q", c.Provider)
	}
	if c.HMEM {
		if len(c.Ifaces) == 0 {
			t.Errorf("HMEM without interfaces: %+v", c)
		}
	} else if c.Note == "" || !strings.Contains(c.Note, "FI_HMEM") {
		t.Errorf("no HMEM and no reason: %+v", c)
	}
	if d := rdma.DecideGPUDirect(c, rdma.DeviceMemory{Iface: "cuda", GPUDirectRDMA: true}); d.Direct != c.HMEM {
		t.Errorf("decision %+v for caps %+v", d, c)
	}
	yes := hmemCaps("verbs;ofi_rxm", 0, true)
	if !yes.HMEM || !yes.DMABuf || len(yes.Ifaces) != 2 || yes.Note != "" {
		t.Errorf("hmemCaps(0) = %+v", yes)
	}
	no := hmemCaps("tcp;ofi_rxm", -61, false) // -FI_ENODATA
	if no.HMEM || no.DMABuf || !strings.Contains(no.Note, "fi_getinfo with FI_HMEM") {
		t.Errorf("hmemCaps(-FI_ENODATA) = %+v", no)
	}
}
