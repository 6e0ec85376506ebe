package softrdma

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/fabrictest"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/provtest"
	"github.com/tensorlane/tensorlane/internal/wire"
)

// The rdma rail's listener is a softrdma device; the harness serves it with
// the real rdma.Server (one rail, "nic0").
func abuseHarness() fabrictest.AbuseHarness {
	return fabrictest.AbuseHarness{Setup: func(t testing.TB, src fabric.Source, sink fabric.Sink, cfg fabrictest.AbuseConfig) fabrictest.AbuseTarget {
		ownerKey, _ := newKey(t)
		attacker, _ := newKey(t)
		prov, err := New(Config{NICs: []NIC{{Name: "nic0", Addr: "127.0.0.1:0"}},
			HandshakeTimeout: cfg.HandshakeTimeout, StallTimeout: cfg.StallTimeout})
		if err != nil {
			t.Fatal(err)
		}
		tg := provtest.NewAbuse(t, prov, ownerKey, attacker, src, sink, cfg, nil).Target
		// A frame header, checksum and all, announcing a 1 GiB payload
		// (the most is 1 MiB).
		var oversized [headerLen]byte
		(&frame{op: opCall, id: 1, flags: flagLast, payloadLen: 1 << 30}).putHeader(&oversized)
		tg.Oversized = oversized[:]
		tg.Unread = func(ctx context.Context, c net.Conn, big fabric.Remote) error {
			key, raddr, err := resolveRaw(ctx, c, big)
			if err != nil {
				return err
			}
			// Ask for the object four times over; read none of it.
			for i := range 4 {
				if err := writeFrame(c, frame{op: opReadReq, id: uint64(10 + i), rkey: key, addr: raddr,
					length: uint32(big.Length)}, nil, false); err != nil {
					return err
				}
			}
			return nil
		}
		tg.Reader = func(t testing.TB) fabric.Transport {
			readerKey, _ := newKey(t)
			rp, err := New(Config{NICs: []NIC{{Name: "nic0", Addr: "127.0.0.1:0"}}})
			if err != nil {
				t.Fatal(err)
			}
			return provtest.Reader(t, rp, readerKey)
		}
		return tg
	}}
}

// resolveRaw asks the owner's rdma.Server for the keys of big with a raw
// control Call (the format of fabric/rdma's control.go, written out here as
// an attacker would) and reads the answer.
func resolveRaw(ctx context.Context, c net.Conn, big fabric.Remote) (uint32, uint64, error) {
	e := wire.Encoder{}
	e.Byte(1) // resolve
	e.Uvarint(1)
	e.Byte(0) // a read
	e.Fixed(big.Claim.Object[:])
	e.Uint64(big.Claim.Incarnation)
	e.Bytes(big.Claim.Token)
	e.Uvarint(uint64(big.Offset))
	e.Uvarint(uint64(big.Length))
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
		defer c.SetDeadline(time.Time{})
	}
	if err := writeFrame(c, frame{op: opCall, id: 1, flags: flagLast, payloadLen: uint32(len(e.Buf))}, e.Buf, false); err != nil {
		return 0, 0, err
	}
	var h [headerLen]byte
	br := bufio.NewReader(c)
	f, err := readHeader(br, &h)
	if err != nil {
		return 0, 0, err
	}
	p := make([]byte, f.payloadLen)
	if err := readPayload(br, &h, f, p); err != nil {
		return 0, 0, err
	}
	if f.op != opCallResp || f.status != 0 {
		return 0, 0, fmt.Errorf("resolve refused: %q", p)
	}
	d := wire.NewDecoder(p)
	d.Uvarint() // length
	if d.Count(8) != 1 {
		return 0, 0, errors.New("resolve: not one key")
	}
	d.String(64)
	key, raddr := d.Uvarint(), d.Uvarint()
	return uint32(key), raddr, d.Finish()
}

// TestAbuse runs the listener abuse suite against an rdma rail.
func TestAbuse(t *testing.T) { fabrictest.RunAbuse(t, abuseHarness()) }
