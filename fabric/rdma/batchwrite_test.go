package rdma

import (
	"context"
	"encoding/hex"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/tensor"
)

// The write batch frame, byte for byte: the resolve batch's items under
// kind 5.
func TestWriteBatchFrameGolden(t *testing.T) {
	obj := fabric.ObjectID{0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xbb}
	reqs := []resolveReq{
		{id: 1, push: true, claim: fabric.Claim{Object: obj, Incarnation: 7, Token: []byte("tk")}, offset: 0, length: 300},
		{id: 1 << 40, push: true, claim: fabric.Claim{Object: obj, Incarnation: 1 << 60}, offset: 5, length: 0},
	}
	got := hex.EncodeToString(marshalResolveBatch(reqs))
	want := "0502" + "01" + "aa0102030405060708090a0b0c0d0ebb" + "0000000000000007" + "02746b" + "00" + "ac02" +
		"808080808020" + "aa0102030405060708090a0b0c0d0ebb" + "1000000000000000" + "00" + "05" + "00"
	if got != want {
		t.Errorf("write batch:\n got %s\nwant %s", got, want)
	}
	back, err := decodeResolveBatch(marshalResolveBatch(reqs))
	if err != nil || len(back) != 2 {
		t.Fatalf("decode: %v %v", back, err)
	}
	for i, r := range back {
		if !r.push || r.id != reqs[i].id || r.claim.Object != obj || r.offset != reqs[i].offset || r.length != reqs[i].length {
			t.Errorf("item %d: %+v, want %+v", i, r, reqs[i])
		}
	}
	// A resolve batch's items are reads: the kind, not the item, says so.
	for _, r := range mustDecode(t, marshalResolveBatch([]resolveReq{{id: 1, length: 1}})) {
		if r.push {
			t.Error("a resolve batch decoded as pushes")
		}
	}
}

func mustDecode(t *testing.T, p []byte) []resolveReq {
	t.Helper()
	reqs, err := decodeResolveBatch(p)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestWriteBatchFrameMalformed(t *testing.T) {
	big := func(count uint64) []byte {
		e := wire.Encoder{}
		e.Byte(msgWriteBatch)
		e.Uvarint(count)
		return append(e.Buf, make([]byte, 64)...)
	}
	one := marshalResolveBatch([]resolveReq{{id: 1, push: true, length: 1}})
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"kind only", []byte{msgWriteBatch}},
		{"zero items", []byte{msgWriteBatch, 0}},
		{"count over maxBatch", big(maxBatch + 1)},
		{"count 2^63", big(1 << 63)},
		{"count the bytes cannot hold", big(200)},
		{"truncated item", one[:len(one)-1]},
		{"trailing byte", append(one, 0)},
		{"token over maxToken", marshalResolveBatch([]resolveReq{{id: 1, push: true, claim: fabric.Claim{Token: make([]byte, maxToken+1)}}})},
		{"range past 2^62", marshalResolveBatch([]resolveReq{{id: 1, push: true, offset: 1 << 62, length: 1<<62 + 1}})},
	} {
		if _, err := decodeResolveBatch(c.p); !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("write batch, %s: %v", c.name, err)
		}
	}
}

// countingSink counts sink opens; it accepts nothing.
type countingSink struct{ opens int }

func (c *countingSink) OpenSink(context.Context, fabric.Claim) (tensor.Buffer, error) {
	c.opens++
	return nil, fabric.ErrObjectNotFound
}

// A write batch with absurd counts is refused before the server allocates
// for it or opens a sink; a well-formed one to an owner without sinks
// refuses each item.
func TestWriteBatchFrameAbuse(t *testing.T) {
	sink := &countingSink{}
	s := &Server{cfg: ServerConfig{Source: &countingSource{}, Sink: sink, OpenTimeout: time.Second}, regs: map[regID]*registration{}, tombs: map[regID]time.Time{}}
	e := wire.Encoder{}
	e.Byte(msgWriteBatch)
	e.Uvarint(1 << 62)
	huge := e.Buf
	e = wire.Encoder{}
	e.Byte(msgWriteBatch)
	e.Uvarint(maxBatch)
	cramped := append(e.Buf, make([]byte, maxBatch*minBatchItem-1)...)
	for _, p := range [][]byte{huge, cramped} {
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		const runs = 100
		for range runs {
			if _, err := s.handleBatch(context.Background(), qpRef{}, "", p); !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("frame %x...: %v, want fabric.ErrBadRequest", p[:min(len(p), 8)], err)
			}
		}
		runtime.ReadMemStats(&ms1)
		if per := (ms1.TotalAlloc - ms0.TotalAlloc) / runs; per > 2<<10 {
			t.Errorf("refusing frame %x... allocated %d bytes a time", p[:min(len(p), 8)], per)
		}
	}
	if sink.opens != 0 {
		t.Errorf("the sink was opened %d times for refused frames", sink.opens)
	}
	// Well formed: each item goes to the sink (never the source) and is
	// refused on its own.
	msg := marshalResolveBatch([]resolveReq{{id: 1, push: true, length: 1}, {id: 2, push: true, length: 1}})
	reply, err := s.handleBatch(context.Background(), qpRef{}, "", msg)
	if err != nil {
		t.Fatal(err)
	}
	items, err := decodeBatchReply(reply, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if !errors.Is(it.err(), fabric.ErrObjectNotFound) {
			t.Errorf("item %d: %v, want fabric.ErrObjectNotFound", i, it.err())
		}
	}
	if sink.opens != 2 {
		t.Errorf("the sink was opened %d times for 2 items", sink.opens)
	}
	// An owner that takes no pushes refuses each item.
	s.cfg.Sink = nil
	reply, err = s.handleBatch(context.Background(), qpRef{}, "", msg)
	if err != nil {
		t.Fatal(err)
	}
	if items, err = decodeBatchReply(reply, 2); err != nil || !errors.Is(items[0].err(), fabric.ErrBadRequest) {
		t.Errorf("owner without sinks: %v %v", items, err)
	}
}

func FuzzDecodeWriteBatch(f *testing.F) {
	f.Add(marshalResolveBatch([]resolveReq{{id: 3, push: true, claim: fabric.Claim{Token: []byte("x")}, length: 10}, {id: 4, push: true}}))
	f.Add([]byte{msgWriteBatch, 1, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		reqs, err := decodeResolveBatch(p)
		if err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("untyped: %v", err)
			}
			return
		}
		if len(reqs) == 0 || len(reqs) > maxBatch {
			t.Fatalf("%d items", len(reqs))
		}
		for _, r := range reqs[1:] {
			if r.push != reqs[0].push {
				t.Fatal("a batch decoded with items both ways")
			}
		}
		if (p[0] == msgWriteBatch) != reqs[0].push {
			t.Fatalf("kind %d decoded with push %v", p[0], reqs[0].push)
		}
		again, err := decodeResolveBatch(marshalResolveBatch(reqs))
		if err != nil || len(again) != len(reqs) || again[0].push != reqs[0].push {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}
