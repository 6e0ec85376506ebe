package provbase

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/kit"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provtest"
)

// upper answers a message with its bytes in upper case, or the error
// its text names; it records the queue pairs that ended.
type upper struct {
	mu     sync.Mutex
	closed []rdma.RemoteQP
	done   chan struct{}
}

func (h *upper) HandleMessage(ctx context.Context, from rdma.RemoteQP, msg []byte) ([]byte, error) {
	if string(msg) == "bad" {
		return nil, errors.Join(fabric.ErrBadRequest, errors.New("bad, as asked"))
	}
	return []byte(strings.ToUpper(string(msg))), nil
}

func (h *upper) QPClosed(from rdma.RemoteQP) {
	h.mu.Lock()
	h.closed = append(h.closed, from)
	h.mu.Unlock()
	close(h.done)
}

func newBase(t *testing.T, key crypto.PrivKey, h rdma.MessageHandler) *Base {
	cfg := rdma.OpenConfig{Security: fabric.Security{Identity: key}, Handler: h}
	if err := CheckOpen("testprov", &cfg); err != nil {
		t.Fatal(err)
	}
	d := &Base{}
	d.Init("testprov", "nic0", "127.0.0.1:0", cfg, 5*time.Second)
	return d
}

// serveLines is a provider's passive side in miniature: greet with
// "hello\n", then answer each line through the handler, one handler
// goroutine per line.
func serveLines(d *Base) func(net.Conn) {
	return func(c net.Conn) {
		from, ok := d.Accept(c, func(c net.Conn) error { _, err := io.WriteString(c, "hello\n"); return err })
		if !ok {
			return
		}
		s := d.Session(c, from, 2)
		defer s.End()
		var wmu sync.Mutex
		buf := make([]byte, 64)
		for {
			s.ArmIdle()
			n, err := c.Read(buf)
			if err != nil {
				s.Ended(err)
				return
			}
			msg := []byte(strings.TrimSpace(string(buf[:n])))
			if !s.Go(func(ctx context.Context) {
				resp, err := d.Handle(ctx, s.From, msg)
				if err != nil {
					resp = append([]byte("E"), ErrorAnswer(err)...)
				} else {
					resp = append([]byte("R"), resp...)
				}
				wmu.Lock()
				c.Write(resp)
				wmu.Unlock()
			}) {
				return
			}
		}
	}
}

// TestBootstrap runs the shared bootstrap over real sockets: the
// passive side authenticates, greets, answers through the handler
// (errors as status codes that match their sentinel), and tells the
// handler once the queue pair ended; the active side dials from its
// NIC's address and checks the owner's identity.
func TestBootstrap(t *testing.T) {
	ownerKey, ownerID := provtest.Key(t)
	readerKey, readerID := provtest.Key(t)
	h := &upper{done: make(chan struct{})}
	owner := newBase(t, ownerKey, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	owner.Serve(ln, serveLines(owner))
	defer owner.CloseListener()
	if owner.Addr() == "" || owner.Device().Name != "nic0" || owner.Label != "rdma/nic0" {
		t.Fatalf("device %+v label %q", owner.Device(), owner.Label)
	}
	reader := newBase(t, readerKey, nil)
	if reader.Addr() != "" {
		t.Fatalf("a device that does not listen has address %q", reader.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The wrong owner: refused with a typed error.
	_, otherID := provtest.Key(t)
	if _, err := reader.Dial(ctx, owner.Addr(), otherID, kit.DialFrom, nil); err == nil {
		t.Fatal("dialled an owner that is not the one wanted")
	}

	var greeting string
	c, err := reader.Dial(ctx, owner.Addr(), ownerID, kit.DialFrom, func(c net.Conn) error {
		b := make([]byte, 6)
		_, err := io.ReadFull(c, b)
		greeting = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if greeting != "hello\n" {
		t.Fatalf("greeting %q", greeting)
	}
	call := func(msg string) string {
		if _, err := io.WriteString(c, msg+"\n"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
	if got := call("ping"); got != "RPING" {
		t.Fatalf("answer %q", got)
	}
	got := call("bad")
	if got[0] != 'E' || !errors.Is(RemoteError([]byte(got[1:])), fabric.ErrBadRequest) {
		t.Fatalf("error answer %q: %v", got, RemoteError([]byte(got[1:])))
	}
	c.Close()
	select {
	case <-h.done:
	case <-ctx.Done():
		t.Fatal("QPClosed not called")
	}
	h.mu.Lock()
	// Queue pair 1 was the refused dial: ids are taken before the
	// handshake, and never reused.
	if len(h.closed) != 1 || h.closed[0].Peer != readerID || h.closed[0].ID != 2 {
		t.Fatalf("closed %+v, want queue pair 2 of %s", h.closed, readerID)
	}
	h.mu.Unlock()

	// A closed device accepts nothing more.
	if !owner.MarkClosed() || owner.MarkClosed() {
		t.Fatal("MarkClosed: want true once, then false")
	}
	if !errors.Is(owner.Live(), fabric.ErrClosed) || reader.Live() != nil {
		t.Fatalf("Live: %v, %v", owner.Live(), reader.Live())
	}
	if c2, err := reader.Dial(ctx, owner.Addr(), ownerID, kit.DialFrom, nil); err == nil {
		// The accept loop may take the connection; the device drops it.
		c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c2.Read(make([]byte, 1)); err == nil {
			t.Fatal("a closed device served a queue pair")
		}
		c2.Close()
	}
}

// TestHandleWithoutHandler: a device without a handler refuses
// messages with a bad request, which survives the wire.
func TestHandleWithoutHandler(t *testing.T) {
	key, _ := provtest.Key(t)
	d := newBase(t, key, nil)
	_, err := d.Handle(context.Background(), rdma.RemoteQP{}, []byte("x"))
	if !errors.Is(err, fabric.ErrBadRequest) || !strings.Contains(err.Error(), "testprov") {
		t.Fatalf("err %v", err)
	}
	if !errors.Is(RemoteError(ErrorAnswer(err)), fabric.ErrBadRequest) {
		t.Fatal("the refusal does not match ErrBadRequest after the wire")
	}
}

func TestErrorAnswerTruncates(t *testing.T) {
	long := errors.New(strings.Repeat("x", 10*peerauth.MaxMessage))
	if n := len(ErrorAnswer(long)); n != 1+peerauth.MaxMessage {
		t.Fatalf("answer of %d bytes", n)
	}
	if err := RemoteError(nil); err == nil {
		t.Fatal("an empty answer decoded to no error")
	}
}

// TestFault: a queue pair breaks once; the first reason and status
// stay, Broken is closed whether asked for before or after, and
// BreakUnder's take runs once, under the lock.
func TestFault(t *testing.T) {
	var f Fault
	before := f.Broken()
	if f.Err() != nil {
		t.Fatal("a fresh queue pair is broken")
	}
	var mu sync.Mutex
	takes := 0
	take := func() {
		if mu.TryLock() {
			t.Error("take ran without the lock")
		}
		takes++
	}
	first := errors.New("first")
	if !f.BreakUnder(&mu, first, rdma.StatusFlushed, take) {
		t.Fatal("BreakUnder did not break")
	}
	if f.BreakUnder(&mu, errors.New("second"), rdma.StatusRetryExceeded, take) || f.Break(errors.New("third"), rdma.StatusCorrupt) {
		t.Fatal("broke twice")
	}
	err, st := f.Why()
	if err != first || st != rdma.StatusFlushed || f.Err() != first || takes != 1 {
		t.Fatalf("why %v %v, takes %d", err, st, takes)
	}
	for _, ch := range []<-chan struct{}{before, f.Broken()} {
		select {
		case <-ch:
		default:
			t.Fatal("Broken not closed")
		}
	}
}

func TestQPConfig(t *testing.T) {
	if c := QPConfig(rdma.QPConfig{}); c.MaxOutstanding != 128 || c.Timeout != 10*time.Second {
		t.Fatalf("defaults %+v", c)
	}
	if c := QPConfig(rdma.QPConfig{MaxOutstanding: 3, Timeout: time.Second}); c.MaxOutstanding != 3 || c.Timeout != time.Second {
		t.Fatalf("kept %+v", c)
	}
}

// TestCompletions: completions come out in order, in batches of the
// caller's size; Wait returns when one is ready, on ctx, and with
// ErrClosed once closed and drained.
func TestCompletions(t *testing.T) {
	var c Completions
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on an empty queue: %v", err)
	}
	for i := range 3 {
		c.Push(rdma.Completion{ID: uint64(i)})
	}
	if err := c.Wait(context.Background()); err != nil || c.Len() != 3 {
		t.Fatalf("Wait %v, Len %d", err, c.Len())
	}
	wc := make([]rdma.Completion, 2)
	if n := c.Poll(wc); n != 2 || wc[0].ID != 0 || wc[1].ID != 1 {
		t.Fatalf("Poll %d %+v", n, wc)
	}
	c.Close()
	if err := c.Wait(context.Background()); err != nil {
		t.Fatalf("Wait with one ready after Close: %v", err)
	}
	if n := c.Poll(wc); n != 1 || wc[0].ID != 2 {
		t.Fatalf("Poll %d %+v", n, wc)
	}
	if err := c.Wait(context.Background()); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("Wait on a closed, empty queue: %v", err)
	}
	select {
	case <-c.Notify():
	default:
		t.Fatal("no token after Close")
	}
}

// ExampleFault shows the break-once state of a queue pair.
func ExampleFault() {
	var f Fault
	f.Break(fabric.ErrClosed, rdma.StatusFlushed)
	f.Break(fabric.ErrPeerClosed, rdma.StatusRetryExceeded) // too late: it broke already
	err, status := f.Why()
	fmt.Println(err == fabric.ErrClosed, status)
	// Output: true flushed
}

// TestCallsRound: a call gets its answer, a message too long is a bad
// request before anything is sent, a send that cannot post returns its
// reason, ctx and a break end the wait; the id is gone afterwards
// (Take finds nothing, a late answer has nowhere to go).
func TestCallsRound(t *testing.T) {
	var f Fault
	var c Calls[string]
	ctx := context.Background()
	got, err := c.Round(ctx, &f, 3, 8, func(id uint64) error {
		go func() { c.Take(id) <- "answer" }()
		return nil
	})
	if err != nil || got != "answer" || c.Len() != 0 {
		t.Fatalf("Round: %q %v, %d left", got, err, c.Len())
	}
	sent := false
	if _, err := c.Round(ctx, &f, 9, 8, func(uint64) error { sent = true; return nil }); !errors.Is(err, fabric.ErrBadRequest) || sent {
		t.Fatalf("a message too long: %v (sent %v)", err, sent)
	}
	if _, err := c.Round(ctx, &f, 1, 8, func(uint64) error { return rdma.ErrQueueFull }); !errors.Is(err, rdma.ErrQueueFull) || c.Len() != 0 {
		t.Fatalf("a send that failed: %v, %d left", err, c.Len())
	}
	var last uint64
	cctx, cancel := context.WithCancel(ctx)
	if _, err := c.Round(cctx, &f, 1, 8, func(id uint64) error { last = id; cancel(); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled call: %v", err)
	}
	if c.Take(last) != nil {
		t.Fatal("a given-up call is still registered")
	}
	if _, err := c.Round(ctx, &f, 1, 8, func(uint64) error {
		if n := len(c.Flush()); n != 1 {
			t.Errorf("Flush: %d calls", n)
		}
		f.Break(fabric.ErrPeerClosed, rdma.StatusFlushed)
		return nil
	}); !errors.Is(err, fabric.ErrPeerClosed) {
		t.Fatalf("a call on a queue pair that broke: %v", err)
	}
}

func TestCheckOpen(t *testing.T) {
	if err := CheckOpen("testprov", &rdma.OpenConfig{}); !errors.Is(err, fabric.ErrNoIdentity) {
		t.Fatalf("no identity: %v", err)
	}
	key, _ := provtest.Key(t)
	cfg := rdma.OpenConfig{Security: fabric.Security{Identity: key, EncryptData: true}}
	if err := CheckOpen("testprov", &cfg); !errors.Is(err, rdma.ErrEncrypt) {
		t.Fatalf("Encrypt: %v", err)
	}
}
