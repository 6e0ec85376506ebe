package softrdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"testing"
	"testing/iotest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/faults"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var newKey = provtest.Key

type echoHandler struct{ closed chan rdma.RemoteQP }

func (h *echoHandler) HandleMessage(ctx context.Context, from rdma.RemoteQP, msg []byte) ([]byte, error) {
	switch string(msg) {
	case "fail":
		return nil, fabric.ErrObjectFreed
	case "block":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return append([]byte("echo:"), msg...), nil
}

func (h *echoHandler) QPClosed(from rdma.RemoteQP) {
	select {
	case h.closed <- from:
	default:
	}
}

// pair is a responder device with one registered region and a connected
// requester queue pair.
type pair struct {
	prov      *Provider
	faults    *faults.Sim // the provider's
	server    rdma.Context
	client    rdma.Context
	remote    rdma.MemoryRegion
	remoteBuf []byte
	local     rdma.MemoryRegion
	localBuf  []byte
	qp        rdma.QueuePair
	cq        rdma.CompletionQueue
	handler   *echoHandler
	clientID  peer.ID
}

func newPair(t *testing.T, size int, timeout time.Duration) *pair {
	t.Helper()
	return newPairWith(t, size, timeout, nil)
}

// newPairWith is newPair with the server device's OpenConfig adjusted by
// server (when not nil).
func newPairWith(t *testing.T, size int, timeout time.Duration, server func(*rdma.OpenConfig)) *pair {
	t.Helper()
	sim := new(faults.Sim)
	prov, err := New(Config{NICs: []NIC{{Name: "s0", Addr: "127.0.0.1:0"}, {Name: "c0", Addr: "127.0.0.1:0"}}, ChunkSize: 64 << 10, Faults: sim})
	if err != nil {
		t.Fatal(err)
	}
	sk, sid := newKey(t)
	ck, cid := newKey(t)
	p := &pair{prov: prov, faults: sim, handler: &echoHandler{closed: make(chan rdma.RemoteQP, 4)}, clientID: cid}
	ctx := context.Background()
	scfg := rdma.OpenConfig{Security: fabric.Security{Identity: sk}, Listen: true, Handler: p.handler}
	if server != nil {
		server(&scfg)
	}
	p.server, err = prov.Open(ctx, "s0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.server.Close() })
	p.client, err = prov.Open(ctx, "c0", rdma.OpenConfig{Security: fabric.Security{Identity: ck}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.client.Close() })
	spd, _ := p.server.AllocPD()
	p.remoteBuf = make([]byte, size)
	for i := range p.remoteBuf {
		p.remoteBuf[i] = byte(i*31 + i>>9)
	}
	p.remote, err = spd.RegisterMemory(p.remoteBuf, rdma.AccessRemoteRead|rdma.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	cpd, _ := p.client.AllocPD()
	p.localBuf = make([]byte, size)
	p.local, _ = cpd.RegisterMemory(p.localBuf, rdma.AccessLocalWrite)
	p.cq, _ = p.client.CreateCQ()
	p.qp, err = cpd.CreateQP(p.cq, rdma.QPConfig{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.qp.Connect(ctx, p.server.Addr(), sid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.qp.Close() })
	return p
}

func (p *pair) wait(t *testing.T) rdma.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]rdma.Completion
	for p.cq.Poll(wc[:]) == 0 {
		if err := p.cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
	return wc[0]
}

func (p *pair) readWR(id uint64, off, n int) rdma.WorkRequest {
	return rdma.WorkRequest{ID: id, LKey: p.local.LKey(), LocalAddr: p.local.Addr() + uint64(off), Length: uint32(n),
		RKey: p.remote.RKey(), RemoteAddr: p.remote.Addr() + uint64(off)}
}

func TestReadWrite(t *testing.T) {
	const size = 1<<20 + 333
	p := newPair(t, size, 0)
	for _, tc := range []struct{ off, n int }{{0, size}, {0, 0}, {5, 1}, {4097, 300000}, {size - 1, 1}} {
		clear(p.localBuf)
		if err := p.qp.PostRead(p.readWR(7, tc.off, tc.n)); err != nil {
			t.Fatal(err)
		}
		wc := p.wait(t)
		if wc.Status != rdma.StatusSuccess || wc.ID != 7 || wc.Op != rdma.OpRead || wc.Bytes != tc.n {
			t.Fatalf("READ [%d,+%d): completion %+v", tc.off, tc.n, wc)
		}
		if !bytes.Equal(p.localBuf[tc.off:tc.off+tc.n], p.remoteBuf[tc.off:tc.off+tc.n]) {
			t.Fatalf("READ [%d,+%d): bytes differ", tc.off, tc.n)
		}
	}
	// WRITE back a changed pattern.
	for i := range p.localBuf {
		p.localBuf[i] = ^byte(i)
	}
	wr := p.readWR(8, 100, 500000)
	if err := p.qp.PostWrite(wr); err != nil {
		t.Fatal(err)
	}
	if wc := p.wait(t); wc.Status != rdma.StatusSuccess || wc.Op != rdma.OpWrite || wc.Bytes != 500000 {
		t.Fatalf("WRITE: %+v", wc)
	}
	if !bytes.Equal(p.remoteBuf[100:500100], p.localBuf[100:500100]) {
		t.Fatal("WRITE: remote bytes differ")
	}
}

func TestManyOutstanding(t *testing.T) {
	const size, slice = 4 << 20, 64 << 10
	p := newPair(t, size, 0)
	for i := 0; i < size/slice; i++ {
		if err := p.qp.PostRead(p.readWR(uint64(i), i*slice, slice)); err != nil {
			t.Fatal(err)
		}
	}
	for range size / slice {
		if wc := p.wait(t); wc.Status != rdma.StatusSuccess {
			t.Fatalf("%+v", wc)
		}
	}
	if !bytes.Equal(p.localBuf, p.remoteBuf) {
		t.Fatal("bytes differ")
	}
}

func TestAccessErrors(t *testing.T) {
	const size = 256 << 10
	p := newPair(t, size, 0)
	spd, _ := p.server.AllocPD()
	readOnly, _ := spd.RegisterMemory(make([]byte, 4096), rdma.AccessRemoteRead)
	for _, tc := range []struct {
		name  string
		write bool
		wr    func() rdma.WorkRequest
		want  rdma.Status
	}{
		{"wrong rkey", false, func() rdma.WorkRequest { w := p.readWR(1, 0, 10); w.RKey ^= 0x5a5a; return w }, rdma.StatusRemoteAccess},
		{"past the end", false, func() rdma.WorkRequest {
			w := p.readWR(2, 0, 11)
			w.RemoteAddr += size - 10
			return w
		}, rdma.StatusRemoteAccess},
		{"before the start", false, func() rdma.WorkRequest { w := p.readWR(3, 0, 10); w.RemoteAddr--; return w }, rdma.StatusRemoteAccess},
		{"huge length", false, func() rdma.WorkRequest {
			w := p.readWR(4, 0, 10)
			w.Length = 1<<32 - 1
			w.LocalAddr = p.local.Addr()
			return w
		}, rdma.StatusLocalProtection},
		{"write to read-only", true, func() rdma.WorkRequest {
			w := p.readWR(5, 0, 100)
			w.RKey, w.RemoteAddr = readOnly.RKey(), readOnly.Addr()
			return w
		}, rdma.StatusRemoteAccess},
		{"wrong lkey", false, func() rdma.WorkRequest { w := p.readWR(6, 0, 10); w.LKey ^= 1 << 20; return w }, rdma.StatusLocalProtection},
		{"local range", false, func() rdma.WorkRequest { w := p.readWR(7, 0, 10); w.LocalAddr += size; return w }, rdma.StatusLocalProtection},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(p.localBuf)
			post := p.qp.PostRead
			if tc.write {
				post = p.qp.PostWrite
			}
			if err := post(tc.wr()); err != nil {
				t.Fatal(err)
			}
			if wc := p.wait(t); wc.Status != tc.want {
				t.Fatalf("completion %+v, want %v", wc, tc.want)
			}
			if !tc.write && bytes.ContainsFunc(p.localBuf, func(r rune) bool { return r != 0 }) {
				t.Fatal("a refused READ delivered data")
			}
		})
	}
	// The queue pair still works after refused requests.
	if err := p.qp.PostRead(p.readWR(9, 0, 100)); err != nil {
		t.Fatal(err)
	}
	if wc := p.wait(t); wc.Status != rdma.StatusSuccess {
		t.Fatalf("after refusals: %+v", wc)
	}
}

func TestRevokedKey(t *testing.T) {
	p := newPair(t, 64<<10, 0)
	wr := p.readWR(1, 0, 64<<10)
	if err := p.remote.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := p.remote.Deregister(); err != nil {
		t.Fatalf("second Deregister: %v", err)
	}
	clear(p.localBuf)
	p.qp.PostRead(wr)
	if wc := p.wait(t); wc.Status != rdma.StatusRemoteAccess {
		t.Fatalf("READ with a revoked key: %+v", wc)
	}
	if bytes.ContainsFunc(p.localBuf, func(r rune) bool { return r != 0 }) {
		t.Fatal("a revoked key delivered data")
	}
	// A new registration of the same memory gets a different address.
	spd, _ := p.server.AllocPD()
	again, _ := spd.RegisterMemory(p.remoteBuf, rdma.AccessRemoteRead)
	if again.Addr() == wr.RemoteAddr {
		t.Error("a new registration reused the revoked address")
	}
}

func TestCall(t *testing.T) {
	p := newPair(t, 4096, 0)
	ctx := context.Background()
	got, err := p.qp.Call(ctx, []byte("hi"))
	if err != nil || string(got) != "echo:hi" {
		t.Fatalf("Call = %q, %v", got, err)
	}
	if _, err := p.qp.Call(ctx, []byte("fail")); !errors.Is(err, fabric.ErrObjectFreed) {
		t.Fatalf("handler error: got %v, want fabric.ErrObjectFreed", err)
	}
	if _, err := p.qp.Call(ctx, make([]byte, MaxMessage+1)); !errors.Is(err, fabric.ErrBadRequest) {
		t.Fatalf("oversized message: %v", err)
	}
	// Cancel: the call returns at once, and the queue pair stays usable.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.qp.Call(cctx, []byte("block")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled call: %v", err)
	}
	if got, err := p.qp.Call(ctx, []byte("again")); err != nil || string(got) != "echo:again" {
		t.Fatalf("Call after a cancelled one = %q, %v", got, err)
	}
}

func TestPeerClose(t *testing.T) {
	p := newPair(t, 8<<20, 0)
	for i := range 8 {
		p.qp.PostRead(p.readWR(uint64(i), i<<20, 1<<20))
	}
	p.server.Close()
	flushedOrOK := 0
	for range 8 {
		wc := p.wait(t)
		if wc.Status == rdma.StatusSuccess || wc.Status == rdma.StatusFlushed || wc.Status == rdma.StatusRemoteAccess {
			flushedOrOK++
		} else {
			t.Errorf("completion after the peer closed: %+v", wc)
		}
	}
	// The queue pair is broken now: posting fails with a typed error.
	deadline := time.Now().Add(10 * time.Second)
	for p.qp.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.qp.PostRead(p.readWR(99, 0, 10)); !errors.Is(err, fabric.ErrPeerClosed) {
		t.Fatalf("post on a broken queue pair: %v", err)
	}
}

func TestCloseFlushes(t *testing.T) {
	p := newPair(t, 8<<20, 0)
	for i := range 8 {
		p.qp.PostRead(p.readWR(uint64(i), i<<20, 1<<20))
	}
	p.qp.Close()
	p.qp.Close()
	for range 8 {
		if wc := p.wait(t); wc.Status != rdma.StatusSuccess && wc.Status != rdma.StatusFlushed {
			t.Fatalf("%+v", wc)
		}
	}
	if err := p.qp.PostRead(p.readWR(1, 0, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("post after Close: %v", err)
	}
	select {
	case <-p.handler.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the responder did not report the queue pair closed")
	}
}

func TestCorruptFrame(t *testing.T) {
	p := newPair(t, 1<<20, 0)
	p.faults.CorruptNext()
	clear(p.localBuf)
	p.qp.PostRead(p.readWR(1, 0, 1<<20))
	wc := p.wait(t)
	if wc.Status != rdma.StatusCorrupt || !errors.Is(wc.Err, fabric.ErrCorrupt) {
		t.Fatalf("corrupted READ: %+v", wc)
	}
	// The chunk was read straight into the region (as a NIC's DMA would
	// place it), so its bytes are undefined now, as after any failed
	// READ; what matters is that the request failed and the queue pair,
	// whose stream can no longer be trusted, broke.
	if err := p.qp.Err(); err == nil {
		t.Fatal("the queue pair still works after a corrupt frame")
	}
}

// TestCorruptHeaderNeverSteersData flips a bit in each byte of a WRITE
// frame's header: the responder refuses the frame before its payload
// touches any memory.
func TestCorruptHeaderNeverSteersData(t *testing.T) {
	for i := range headerLen {
		f := frame{op: opWriteReq, id: 1, rkey: 7, addr: 1 << 40, length: 4, flags: flagLast}
		enc := appendFrame(nil, f, []byte("data"))
		enc[i] ^= 0x04
		var h [headerLen]byte
		if _, err := readHeader(bytes.NewReader(enc), &h); !errors.Is(err, fabric.ErrCorrupt) {
			t.Fatalf("flipped bit in header byte %d: %v", i, err)
		}
	}
}

func TestStalledResponderTimesOut(t *testing.T) {
	// A listener that authenticates nothing and never answers: the queue
	// pair cannot even connect within the context.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	prov, _ := New(Config{NICs: []NIC{{Name: "c", Addr: "127.0.0.1:0"}}})
	k, _ := newKey(t)
	dev, _ := prov.Open(context.Background(), "c", rdma.OpenConfig{Security: fabric.Security{Identity: k}})
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ()
	q, _ := pd.CreateQP(cq, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := q.Connect(ctx, ln.Addr().String(), ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("connect to a silent peer: %v", err)
	}
	(<-accepted).Close()
	q.Close()
}

func TestRetryExceeded(t *testing.T) {
	p := newPair(t, 1<<20, 300*time.Millisecond)
	// Make the responder unable to answer: "block" keeps its handler busy
	// while a call is outstanding, with no progress.
	_, err := p.qp.Call(context.Background(), []byte("block"))
	if !errors.Is(err, fabric.ErrStalled) {
		t.Fatalf("a call without progress: got %v, want fabric.ErrStalled", err)
	}
	if err := p.qp.PostRead(p.readWR(1, 0, 1)); !errors.Is(err, fabric.ErrStalled) {
		t.Fatalf("post on a timed-out queue pair: %v", err)
	}
}

func TestBadConfig(t *testing.T) {
	for _, nics := range [][]NIC{{{Name: "", Addr: "1.2.3.4:1"}}, {{Name: "a", Addr: "nope"}}, {{Name: "a", Addr: ":1"}, {Name: "a", Addr: ":2"}}} {
		if _, err := New(Config{NICs: nics}); err == nil {
			t.Errorf("New(%v) succeeded", nics)
		}
	}
	prov, _ := New(Config{})
	k, _ := newKey(t)
	if _, err := prov.Open(context.Background(), "x", rdma.OpenConfig{Security: fabric.Security{Identity: k}}); !errors.Is(err, rdma.ErrNoDevice) {
		t.Errorf("Open of an unknown device: %v", err)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	f := frame{op: opReadResp, status: 2, flags: flagLast, id: 77, rkey: 0xabcdef, addr: 1 << 41, length: 9}
	enc := appendFrame(nil, f, []byte("payload!!"))
	got, payload, n, err := decodeFrame(enc)
	if err != nil || n != len(enc) || string(payload) != "payload!!" {
		t.Fatalf("decode: %+v %q %d %v", got, payload, n, err)
	}
	f.payloadLen = 9
	if got != f {
		t.Fatalf("decoded %+v, want %+v", got, f)
	}
	for i := range enc {
		bad := bytes.Clone(enc)
		bad[i] ^= 0x01
		if _, _, _, err := decodeFrame(bad); err == nil {
			t.Fatalf("flipped bit in byte %d went unnoticed", i)
		}
	}
	if _, _, _, err := decodeFrame(enc[:len(enc)-1]); !errors.Is(err, fabric.ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendFrame(nil, frame{op: opReadReq, id: 1, rkey: 2, addr: 3, length: 4}, nil))
	f.Add(appendFrame(nil, frame{op: opCall, id: 9}, []byte("hello")))
	f.Add([]byte{frameMagic, 2, 0, 1})
	f.Fuzz(func(t *testing.T, p []byte) {
		fr, payload, n, err := decodeFrame(p)
		if err != nil {
			if !errors.Is(err, fabric.ErrCorrupt) {
				t.Fatalf("untyped decode error: %v", err)
			}
			return
		}
		if n > len(p) || len(payload) != int(fr.payloadLen) || len(payload) > MaxPayload {
			t.Fatalf("inconsistent decode: n=%d len=%d payload=%d", n, len(p), len(payload))
		}
		// Whatever decodes re-encodes to the same bytes.
		if re := appendFrame(nil, fr, payload); !bytes.Equal(re, p[:n]) {
			t.Fatalf("re-encoding differs")
		}
		// The stream decoder agrees.
		var h [headerLen]byte
		fr2, payload2, err := readFrame(bytes.NewReader(p), &h, make([]byte, MaxPayload+trailerLen))
		if err != nil || fr2 != fr || !bytes.Equal(payload2, payload) {
			t.Fatalf("readFrame disagrees: %v", err)
		}
		// Also when the payload arrives in pieces (checksummed piece by
		// piece).
		fr3, payload3, err := readFrame(iotest.HalfReader(bytes.NewReader(p)), &h, make([]byte, MaxPayload+trailerLen))
		if err != nil || fr3 != fr || !bytes.Equal(payload3, payload) {
			t.Fatalf("readFrame over short reads disagrees: %v", err)
		}
	})
}

func TestAuthorizeRefuses(t *testing.T) {
	prov, _ := New(Config{NICs: []NIC{{Name: "s", Addr: "127.0.0.1:0"}, {Name: "c", Addr: "127.0.0.1:0"}}})
	sk, sid := newKey(t)
	ck, _ := newKey(t)
	ctx := context.Background()
	srv, err := prov.Open(ctx, "s", rdma.OpenConfig{Security: fabric.Security{Identity: sk, AllowPeer: func(peer.ID) error { return errors.New("not on the list") }}, Listen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, _ := prov.Open(ctx, "c", rdma.OpenConfig{Security: fabric.Security{Identity: ck}})
	defer cli.Close()
	pd, _ := cli.AllocPD()
	cq, _ := cli.CreateCQ()
	q, _ := pd.CreateQP(cq, rdma.QPConfig{})
	defer q.Close()
	if err := q.Connect(ctx, srv.Addr(), sid); !errors.Is(err, fabric.ErrUnauthorized) {
		t.Fatalf("connect as a refused peer: got %v, want fabric.ErrUnauthorized", err)
	}
	// And a server that is not the peer the reader expects is refused too.
	q2, _ := pd.CreateQP(cq, rdma.QPConfig{})
	defer q2.Close()
	_, other := newKey(t)
	if err := q2.Connect(ctx, srv.Addr(), other); !errors.Is(err, fabric.ErrUnauthorized) {
		t.Fatalf("connect to an impostor: got %v, want fabric.ErrUnauthorized", err)
	}
}

// With a cluster key, a queue pair connects only when both ends hold the
// same key; either end without it, or with another, is refused.
func TestClusterKeyOnQueuePairs(t *testing.T) {
	k1, k2 := make([]byte, 32), make([]byte, 32)
	rand.Read(k1)
	rand.Read(k2)
	tests := []struct {
		name           string
		server, client []byte
		ok             bool
	}{
		{"same key", k1, k1, true},
		{"no key anywhere", nil, nil, true},
		{"client lacks the key", k1, nil, false},
		{"server lacks the key", nil, k1, false},
		{"other key", k1, k2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prov, _ := New(Config{NICs: []NIC{{Name: "s", Addr: "127.0.0.1:0"}, {Name: "c", Addr: "127.0.0.1:0"}}})
			sk, sid := newKey(t)
			ck, _ := newKey(t)
			ctx := context.Background()
			srv, err := prov.Open(ctx, "s", rdma.OpenConfig{Security: fabric.Security{Identity: sk, ClusterKey: tc.server}, Listen: true, Handler: &echoHandler{}})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cli, _ := prov.Open(ctx, "c", rdma.OpenConfig{Security: fabric.Security{Identity: ck, ClusterKey: tc.client}})
			defer cli.Close()
			pd, _ := cli.AllocPD()
			cq, _ := cli.CreateCQ()
			q, _ := pd.CreateQP(cq, rdma.QPConfig{})
			defer q.Close()
			err = q.Connect(ctx, srv.Addr(), sid)
			if tc.ok {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				if _, err := q.Call(ctx, []byte("hi")); err != nil {
					t.Fatalf("call over the keyed queue pair: %v", err)
				}
				return
			}
			if !errors.Is(err, fabric.ErrUnauthorized) {
				t.Fatalf("connect: got %v, want fabric.ErrUnauthorized", err)
			}
		})
	}
}

// TestResponderDropsCorruptFrame sends a frame with a bad checksum to a
// responder: it drops the queue pair (and its registrations stay intact).
func TestResponderDropsCorruptFrame(t *testing.T) {
	p := newPair(t, 4096, 0)
	ck, _ := newKey(t)
	c, err := net.Dial("tcp", p.server.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := peerauth.Client(c, ck, ""); err != nil {
		t.Fatal(err)
	}
	bad := appendFrame(nil, frame{op: opReadReq, id: 1, rkey: p.remote.RKey(), addr: p.remote.Addr(), length: 16}, nil)
	bad[len(bad)-1] ^= 0xff
	if _, err := c.Write(bad); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("the responder answered a corrupt frame with %d bytes", n)
	}
	select {
	case <-p.handler.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the responder did not drop the queue pair")
	}
	// The well-behaved queue pair is unaffected.
	if err := p.qp.PostRead(p.readWR(2, 0, 16)); err != nil {
		t.Fatal(err)
	}
	if wc := p.wait(t); wc.Status != rdma.StatusSuccess {
		t.Fatalf("%+v", wc)
	}
}

// TestDeregisterAbortsStalledTransfer: a requester asks for a large READ
// and stops reading, so the responder blocks writing straight from the
// region. Deregister does not wait for the peer's timeout: after its
// grace it drops that queue pair, and returns.
func TestDeregisterAbortsStalledTransfer(t *testing.T) {
	p := newPair(t, 32<<20, 0)
	ck, _ := newKey(t)
	c, err := net.Dial("tcp", p.server.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(64 << 10)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := peerauth.Client(c, ck, ""); err != nil {
		t.Fatal(err)
	}
	req := appendFrame(nil, frame{op: opReadReq, id: 1, rkey: p.remote.RKey(), addr: p.remote.Addr(), length: 32 << 20}, nil)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	// Read one chunk so the responder is surely in the stream, then stop.
	var h [headerLen]byte
	if _, err := readHeader(c, &h); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the socket buffers fill
	start := time.Now()
	done := make(chan struct{})
	go func() {
		p.remote.Deregister()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Deregister waits on a requester that stopped reading")
	}
	t.Logf("Deregister returned after %v", time.Since(start))
	select {
	case <-p.handler.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled queue pair was not dropped")
	}
	// The well-behaved queue pair now gets access errors, never data.
	if err := p.qp.PostRead(p.readWR(2, 0, 16)); err != nil {
		t.Fatal(err)
	}
	if wc := p.wait(t); wc.Status != rdma.StatusRemoteAccess {
		t.Fatalf("READ of a deregistered region: %+v", wc)
	}
}
