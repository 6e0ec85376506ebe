package softrdma

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// sgl is a scatter-gather list of the pieces (off, n) of p's local region.
func (p *pair) sgl(pieces ...[2]int) []rdma.Segment {
	out := make([]rdma.Segment, len(pieces))
	for i, pc := range pieces {
		out[i] = rdma.Segment{LKey: p.local.LKey(), Addr: p.local.Addr() + uint64(pc[0]), Length: uint32(pc[1])}
	}
	return out
}

// gatherWR is a WRITE of sgl's concatenation to remote offset at.
func (p *pair) gatherWR(id uint64, at int, sgl []rdma.Segment) rdma.WorkRequest {
	var n uint32
	for _, s := range sgl {
		n += s.Length
	}
	return rdma.WorkRequest{ID: id, Length: n, RKey: p.remote.RKey(), RemoteAddr: p.remote.Addr() + uint64(at), SGL: sgl}
}

// TestGatheredWrite: a WRITE of several segments lands their
// concatenation at the remote range, whatever the pieces (out of order,
// repeated, empty, one byte, spanning the 64 KiB frames of the test
// provider), and nothing outside it.
func TestGatheredWrite(t *testing.T) {
	const size = 1 << 20
	p := newPair(t, size, 0)
	if got := rdma.MaxSGE(p.client); got != DefaultMaxSGE {
		t.Fatalf("MaxSGE = %d, want %d", got, DefaultMaxSGE)
	}
	for i := range p.localBuf {
		p.localBuf[i] = byte(i*7 + i>>10)
	}
	for i, pieces := range [][][2]int{
		{{0, 4096}, {8192, 4096}, {16384, 4096}},
		{{900000, 100}, {3, 1}, {3, 1}, {500, 0}, {200000, 150000}, {10, 70000}},
		{{size - 1, 1}},
	} {
		clear(p.remoteBuf)
		sgl := p.sgl(pieces...)
		var want []byte
		for _, pc := range pieces {
			want = append(want, p.localBuf[pc[0]:pc[0]+pc[1]]...)
		}
		const at = 777
		if err := p.qp.PostWrite(p.gatherWR(uint64(i+1), at, sgl)); err != nil {
			t.Fatal(err)
		}
		wc := p.wait(t)
		if wc.Status != rdma.StatusSuccess || wc.ID != uint64(i+1) || wc.Bytes != len(want) {
			t.Fatalf("list %d: completion %+v, want success of %d bytes", i, wc, len(want))
		}
		if !bytes.Equal(p.remoteBuf[at:at+len(want)], want) {
			t.Fatalf("list %d: the remote does not hold the segments' concatenation", i)
		}
		if bytes.ContainsFunc(p.remoteBuf[:at], func(r rune) bool { return r != 0 }) ||
			bytes.ContainsFunc(p.remoteBuf[at+len(want):], func(r rune) bool { return r != 0 }) {
			t.Fatalf("list %d: bytes written outside the remote range", i)
		}
	}
}

// TestGatheredWriteErrors: a segment outside its region, or of an unknown
// key, completes with a local protection error and writes nothing; a list
// longer than MaxSGE, whose lengths do not add up to Length, or on a READ
// is refused by the post (rdma.ErrBadSGL). The queue pair works on after.
func TestGatheredWriteErrors(t *testing.T) {
	const size = 64 << 10
	p := newPair(t, size, 0)
	clear(p.remoteBuf)
	for i, sgl := range [][]rdma.Segment{
		p.sgl([2]int{0, 100}, [2]int{size - 10, 11}),
		append(p.sgl([2]int{0, 100}), rdma.Segment{LKey: p.local.LKey() ^ 0x5a5a, Addr: p.local.Addr(), Length: 10}),
		append(p.sgl([2]int{0, 100}), rdma.Segment{LKey: p.local.LKey(), Addr: p.local.Addr() - 1, Length: 10}),
	} {
		if err := p.qp.PostWrite(p.gatherWR(uint64(i+1), 0, sgl)); err != nil {
			t.Fatalf("list %d: post: %v", i, err)
		}
		if wc := p.wait(t); wc.Status != rdma.StatusLocalProtection {
			t.Fatalf("list %d: completion %+v, want a local protection error", i, wc)
		}
	}
	var many [][2]int
	for k := range DefaultMaxSGE + 1 {
		many = append(many, [2]int{k * 8, 4})
	}
	short := p.gatherWR(9, 0, p.sgl([2]int{0, 100}, [2]int{200, 100}))
	short.Length--
	read := p.gatherWR(10, 0, p.sgl([2]int{0, 100}, [2]int{200, 100}))
	for name, post := range map[string]func() error{
		"more than MaxSGE":        func() error { return p.qp.PostWrite(p.gatherWR(8, 0, p.sgl(many...))) },
		"lengths short of Length": func() error { return p.qp.PostWrite(short) },
		"a READ":                  func() error { return p.qp.PostRead(read) },
	} {
		if err := post(); !errors.Is(err, rdma.ErrBadSGL) {
			t.Errorf("%s: post: %v, want rdma.ErrBadSGL", name, err)
		}
	}
	if bytes.ContainsFunc(p.remoteBuf, func(r rune) bool { return r != 0 }) {
		t.Fatal("a refused WRITE wrote remote bytes")
	}
	ok := p.sgl(many[:DefaultMaxSGE]...)
	if err := p.qp.PostWrite(p.gatherWR(11, 0, ok)); err != nil {
		t.Fatal(err)
	}
	if wc := p.wait(t); wc.Status != rdma.StatusSuccess {
		t.Fatalf("a WRITE of MaxSGE segments after the refusals: %+v", wc)
	}
}
