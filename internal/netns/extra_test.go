package netns_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"testing"
	"time"
)

// TestDropRandom sends data over a link that drops 5% of its packets: TCP
// recovers every byte, and the dropper counted what it dropped.
func TestDropRandom(t *testing.T) {
	a, b := pair(t)
	ctx := ctxT(t)
	if _, err := b.DropRandom("rb", 101); err == nil {
		t.Fatal("a drop share over 100% was accepted")
	}
	d, err := b.DropRandom("rb", 5)
	if err != nil {
		t.Skipf("skipping: no tcx BPF here: %v", err)
	}
	defer d.Close()
	before, err := b.Stats(ctx, "rb")
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.Listen(ctx, "tcp", "10.9.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		p, _ := io.ReadAll(c)
		got <- p
	}()
	defer l.Close()
	c, err := b.Dial(ctx, "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// Enough packets (GSO segments of ~46 KB on a veth) that a 5% drop
	// share drops some: with 2 MiB (45 packets) it dropped none one run
	// in ten (0.95^45); 16 MiB is ~275 packets, none dropped about one run
	// in a million.
	msg := make([]byte, 16<<20)
	rand.Read(msg)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if p := <-got; !bytes.Equal(p, msg) {
		t.Fatalf("received %d bytes, want the %d sent", len(p), len(msg))
	}
	if d.Dropped() == 0 {
		t.Error("the dropper dropped nothing")
	}
	after, err := b.Stats(ctx, "rb")
	if err != nil {
		t.Fatal(err)
	}
	if after.TxBytes-before.TxBytes < uint64(len(msg)) {
		t.Errorf("tx bytes grew by %d, want at least %d", after.TxBytes-before.TxBytes, len(msg))
	}
	t.Logf("dropped %d of %d packets", d.Dropped(), after.TxPackets-before.TxPackets)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal("Close is not idempotent:", err)
	}
}
