package rdma

import (
	"context"
	"encoding/hex"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/tensor"
)

// The batch frames, byte for byte: a change of the encoding shows here.
func TestBatchFramesGolden(t *testing.T) {
	obj := fabric.ObjectID{0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xbb}
	reqs := []resolveReq{
		{id: 1, claim: fabric.Claim{Object: obj, Incarnation: 7, Token: []byte("tk")}, offset: 0, length: 300},
		{id: 1 << 40, claim: fabric.Claim{Object: obj, Incarnation: 1 << 60}, offset: 5, length: 0},
	}
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"resolve batch", marshalResolveBatch(reqs),
			"0302" + "01" + "aa0102030405060708090a0b0c0d0ebb" + "0000000000000007" + "02746b" + "00" + "ac02" +
				"808080808020" + "aa0102030405060708090a0b0c0d0ebb" + "1000000000000000" + "00" + "05" + "00"},
		{"reply", marshalBatchReply([]batchItem{
			{code: peerauth.StatusOK, resp: resolveResp{length: 300, keys: []regKey{{NIC: "n0", RKey: 9, Addr: 4096}}}},
			{code: peerauth.StatusFreed, text: "gone"},
		}), "02" + "00" + "ac02" + "01" + "026e30" + "09" + "8020" + "02" + "04676f6e65"},
		{"done batch", doneMsgs([]uint64{3, 300}), "0402" + "03" + "ac02"},
		{"done of one is the plain done", doneMsgs([]uint64{3}), "0203"},
	} {
		if h := hex.EncodeToString(c.got); h != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, h, c.want)
		}
	}
}

func TestBatchFramesRoundTrip(t *testing.T) {
	reqs := []resolveReq{
		{id: 1 << 63, claim: fabric.Claim{Object: fabric.ObjectID{1}, Incarnation: 9, Token: make([]byte, maxToken)}, offset: 1 << 40, length: 1 << 41},
		{id: 2, claim: fabric.Claim{Object: fabric.ObjectID{2}}, length: 1},
	}
	got, err := decodeResolveBatch(marshalResolveBatch(reqs))
	if err != nil || len(got) != 2 {
		t.Fatalf("decode: %v %v", got, err)
	}
	for i := range reqs {
		if got[i].id != reqs[i].id || got[i].claim.Object != reqs[i].claim.Object || got[i].claim.Incarnation != reqs[i].claim.Incarnation ||
			len(got[i].claim.Token) != len(reqs[i].claim.Token) || got[i].offset != reqs[i].offset || got[i].length != reqs[i].length {
			t.Errorf("item %d: %+v, want %+v", i, got[i], reqs[i])
		}
	}
	items := []batchItem{
		{code: peerauth.StatusOK, resp: resolveResp{length: 5, keys: []regKey{{NIC: "a", RKey: 1<<32 - 1, Addr: 1 << 60}, {NIC: "b", RKey: 2, Addr: 3}}}},
		{code: peerauth.StatusUnauthorized, text: "no"},
		{code: peerauth.StatusNotFound, text: string(make([]byte, 3*maxItemText))}, // cut to maxItemText
	}
	back, err := decodeBatchReply(marshalBatchReply(items), 3)
	if err != nil {
		t.Fatal(err)
	}
	if back[0].err() != nil || back[0].resp.length != 5 || len(back[0].resp.keys) != 2 || back[0].resp.keys[0] != items[0].resp.keys[0] {
		t.Errorf("item 0: %+v", back[0])
	}
	if !errors.Is(back[1].err(), fabric.ErrUnauthorized) || !errors.Is(back[2].err(), fabric.ErrObjectNotFound) || len(back[2].text) != maxItemText {
		t.Errorf("refusals: %v, %v (%d bytes)", back[1].err(), back[2].err(), len(back[2].text))
	}
	if _, err := decodeBatchReply(marshalBatchReply(items), 2); !errors.Is(err, fabric.ErrCorrupt) {
		t.Errorf("a reply with more items than asked: %v", err)
	}
	ids, err := decodeDoneBatch(doneMsgs([]uint64{1, 1 << 63, 7}))
	if err != nil || len(ids) != 3 || ids[1] != 1<<63 {
		t.Errorf("done batch: %v %v", ids, err)
	}
}

func TestBatchFramesMalformed(t *testing.T) {
	big := func(kind byte, count uint64) []byte {
		e := wire.Encoder{}
		e.Byte(kind)
		e.Uvarint(count)
		return append(e.Buf, make([]byte, 64)...)
	}
	one := marshalResolveBatch([]resolveReq{{id: 1, length: 1}})
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"kind only", []byte{msgResolveBatch}},
		{"zero items", []byte{msgResolveBatch, 0}},
		{"count over maxBatch", big(msgResolveBatch, maxBatch+1)},
		{"count 2^63", big(msgResolveBatch, 1<<63)},
		{"count the bytes cannot hold", big(msgResolveBatch, 200)},
		{"truncated item", one[:len(one)-1]},
		{"trailing byte", append(one, 0)},
		{"token over maxToken", marshalResolveBatch([]resolveReq{{id: 1, claim: fabric.Claim{Token: make([]byte, maxToken+1)}}})},
		{"range past 2^62", marshalResolveBatch([]resolveReq{{id: 1, offset: 1 << 62, length: 1<<62 + 1}})},
	} {
		if _, err := decodeResolveBatch(c.p); !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("resolve batch, %s: %v", c.name, err)
		}
	}
	for _, p := range [][]byte{nil, {msgDoneBatch}, big(msgDoneBatch, maxBatch+1), big(msgDoneBatch, 200), append(doneMsgs([]uint64{1, 2}), 9)} {
		if _, err := decodeDoneBatch(p); !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("done batch %x: %v", p, err)
		}
	}
	for _, p := range [][]byte{nil, {5}, {1, 0}, {1, 0, 1}, {1, 7}, {0xff, 0xff, 0xff, 0xff, 0x0f}} {
		if _, err := decodeBatchReply(p, 1); !errors.Is(err, fabric.ErrCorrupt) {
			t.Errorf("reply %x: %v", p, err)
		}
	}
}

// countingSource counts opens; it serves nothing.
type countingSource struct{ opens int }

func (c *countingSource) Open(context.Context, fabric.Claim) (tensor.Buffer, error) {
	c.opens++
	return nil, fabric.ErrObjectNotFound
}

// A batch frame with absurd counts or lengths is refused before the
// server allocates for it or opens anything.
func TestBatchFrameAbuse(t *testing.T) {
	src := &countingSource{}
	s := &Server{cfg: ServerConfig{Source: src, OpenTimeout: 1}, regs: map[regID]*registration{}, tombs: map[regID]time.Time{}}

	e := wire.Encoder{}
	e.Byte(msgResolveBatch)
	e.Uvarint(1 << 62)
	huge := e.Buf
	e = wire.Encoder{}
	e.Byte(msgResolveBatch)
	e.Uvarint(maxBatch)
	cramped := append(e.Buf, make([]byte, maxBatch*minBatchItem-1)...)
	e = wire.Encoder{}
	e.Byte(msgDoneBatch)
	e.Uvarint(1 << 40)
	doneHuge := e.Buf
	for _, p := range [][]byte{huge, cramped, doneHuge} {
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
	if src.opens != 0 {
		t.Errorf("the source was opened %d times for refused frames", src.opens)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(marshalResolveBatch([]resolveReq{{id: 3, claim: fabric.Claim{Token: []byte("x")}, length: 10}, {id: 4}}))
	f.Add(doneMsgs([]uint64{1, 2, 3}))
	f.Add(marshalBatchReply([]batchItem{{code: peerauth.StatusOK, resp: resolveResp{length: 5, keys: []regKey{{NIC: "n", RKey: 1, Addr: 2}}}}, {code: 2, text: "x"}}))
	f.Fuzz(func(t *testing.T, p []byte) {
		if reqs, err := decodeResolveBatch(p); err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("untyped: %v", err)
			}
		} else {
			again, err := decodeResolveBatch(marshalResolveBatch(reqs))
			if err != nil || len(again) != len(reqs) || len(reqs) > maxBatch {
				t.Fatalf("re-encoding differs: %v", err)
			}
		}
		if ids, err := decodeDoneBatch(p); err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("untyped: %v", err)
			}
		} else if len(ids) > maxBatch {
			t.Fatalf("%d ids", len(ids))
		}
		for _, want := range []int{1, 2, 3} {
			items, err := decodeBatchReply(p, want)
			if err != nil {
				if !errors.Is(err, fabric.ErrCorrupt) {
					t.Fatalf("untyped: %v", err)
				}
				continue
			}
			if len(items) != want {
				t.Fatalf("%d items for %d", len(items), want)
			}
			for _, it := range items {
				if len(it.resp.keys) > MaxRails {
					t.Fatalf("%d keys", len(it.resp.keys))
				}
			}
		}
	})
}
