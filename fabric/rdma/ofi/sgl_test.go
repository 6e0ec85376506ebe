//go:build ofi

package ofi

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// TestGatheredWrite: a WRITE of several local segments (fi_writemsg with
// an iov) lands their concatenation at the remote range; a segment outside
// its region completes with a local protection error; more segments than
// the device takes (the domain's iov_limit; Config.MaxSGE) are refused by
// the post (rdma.ErrBadSGL).
func TestGatheredWrite(t *testing.T) {
	const size = 1 << 20
	one := newPairWith(t, 4096, func(c *Config) { c.MaxSGE = 1 })
	if got := rdma.MaxSGE(one.rd); got != 1 {
		t.Fatalf("MaxSGE with Config.MaxSGE 1 = %d", got)
	}
	two := rdma.WorkRequest{ID: 9, Length: 20, RKey: one.om.RKey(), RemoteAddr: one.om.Addr(), SGL: []rdma.Segment{
		{LKey: one.lm.LKey(), Addr: one.lm.Addr(), Length: 10}, {LKey: one.lm.LKey(), Addr: one.lm.Addr() + 100, Length: 10}}}
	if err := one.qp.PostWrite(two); !errors.Is(err, rdma.ErrBadSGL) {
		t.Fatalf("two segments where the device takes one: %v, want rdma.ErrBadSGL", err)
	}
	p := newPair(t, size)
	max := rdma.MaxSGE(p.rd)
	t.Logf("MaxSGE %d (%s)", max, testProv())
	if max < 2 {
		t.Skipf("the provider's domain takes %d segment per WRITE", max)
	}
	for i := range p.dst {
		p.dst[i] = byte(i*5 + i>>9)
	}
	clear(p.src)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wait := func() rdma.Completion {
		t.Helper()
		var wc [1]rdma.Completion
		for p.cq.Poll(wc[:]) == 0 {
			if err := p.cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return wc[0]
	}
	var sgl []rdma.Segment
	var want []byte
	var n uint32
	for k := range max {
		off, l := (max-k)*10000+k, 4096+k
		sgl = append(sgl, rdma.Segment{LKey: p.lm.LKey(), Addr: p.lm.Addr() + uint64(off), Length: uint32(l)})
		want = append(want, p.dst[off:off+l]...)
		n += uint32(l)
	}
	const at = 333
	wr := rdma.WorkRequest{ID: 1, Length: n, RKey: p.om.RKey(), RemoteAddr: p.om.Addr() + at, SGL: sgl}
	if err := retryFull(ctx, func() error { return p.qp.PostWrite(wr) }); err != nil {
		t.Fatal(err)
	}
	if wc := wait(); wc.Status != rdma.StatusSuccess || wc.Bytes != int(n) {
		t.Fatalf("completion %+v, want success of %d bytes", wc, n)
	}
	if !bytes.Equal(p.src[at:at+int(n)], want) {
		t.Fatal("the remote does not hold the segments' concatenation")
	}

	bad := wr
	bad.ID, bad.SGL = 2, append([]rdma.Segment{{LKey: p.lm.LKey(), Addr: p.lm.Addr() + size - 10, Length: 11}}, sgl[1:]...)
	bad.Length = n - sgl[0].Length + 11
	if err := retryFull(ctx, func() error { return p.qp.PostWrite(bad) }); err != nil {
		t.Fatal(err)
	}
	if wc := wait(); wc.Status != rdma.StatusLocalProtection {
		t.Fatalf("a segment outside its region: %+v, want a local protection error", wc)
	}
	many := wr
	many.ID, many.SGL = 3, append(sgl, sgl[0])
	many.Length += sgl[0].Length
	if err := p.qp.PostWrite(many); !errors.Is(err, rdma.ErrBadSGL) {
		t.Fatalf("%d segments: %v, want rdma.ErrBadSGL", len(many.SGL), err)
	}
}
