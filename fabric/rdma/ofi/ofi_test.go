//go:build ofi

package ofi

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

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
	cfg := Config{Provider: "tcp"}
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
	d, err := p.Open(ctx, "nic0", rdma.OpenConfig{Identity: testKey(t), Listen: true})
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
	od, err := owner.Open(ctx, "nic0", rdma.OpenConfig{Identity: testKey(t), Listen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer od.Close()
	rd, err := reader.Open(ctx, "nic0", rdma.OpenConfig{Identity: testKey(t)})
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
	if err := qp.PostRead(rdma.WorkRequest{ID: 7, LKey: lm.LKey(), LocalAddr: lm.Addr(), Length: uint32(len(dst)), RKey: om.RKey(), RemoteAddr: om.Addr()}); err != nil {
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
	qp.PostRead(rdma.WorkRequest{ID: 8, LKey: lm.LKey(), LocalAddr: lm.Addr(), Length: 100, RKey: om.RKey() + 2, RemoteAddr: om.Addr()})
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	n = cq.Poll(wc)
	t.Logf("%d %+v", n, wc[:n])
	t0 = time.Now()
	if err := qp.PostRead(rdma.WorkRequest{ID: 9, LKey: lm.LKey(), LocalAddr: lm.Addr(), Length: 4096, RKey: om.RKey(), RemoteAddr: om.Addr()}); err != nil {
		t.Fatal(err)
	}
	if err := cq.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	n = cq.Poll(wc)
	t.Logf("after: %d %+v in %v", n, wc[:n], time.Since(t0))
	qp.Close()
}
