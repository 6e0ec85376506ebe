package rdma

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
)

func TestControlRoundTrip(t *testing.T) {
	req := resolveReq{id: 1<<63 + 5, push: true, claim: fabric.Claim{Object: fabric.ObjectID{1, 2, 3}, Incarnation: 9, Token: []byte("tok")},
		offset: 12345, length: 1 << 40}
	got, done, err := decodeControl(req.marshal())
	if err != nil || done != 0 || got == nil {
		t.Fatalf("decode: %v %v %v", got, done, err)
	}
	if got.id != req.id || got.push != req.push || got.claim.Object != req.claim.Object || got.claim.Incarnation != 9 ||
		!bytes.Equal(got.claim.Token, req.claim.Token) || got.offset != req.offset || got.length != req.length {
		t.Fatalf("decoded %+v, want %+v", got, req)
	}
	if r, id, err := decodeControl(doneMsg(42)); err != nil || r != nil || id != 42 {
		t.Fatalf("done: %v %v %v", r, id, err)
	}
	resp := resolveResp{length: 99, keys: []regKey{{NIC: "nic0", RKey: 0xffffffff, Addr: 1 << 50}, {NIC: "b", RKey: 1, Addr: 2}}}
	back, err := decodeResolveResp(resp.marshal())
	if err != nil || back.length != 99 || len(back.keys) != 2 || back.keys[0] != resp.keys[0] || back.keys[1] != resp.keys[1] {
		t.Fatalf("reply: %+v %v", back, err)
	}
	for _, bad := range [][]byte{nil, {0}, {msgResolve}, {msgDone}, append(doneMsg(1), 0), {msgResolve, 1, 2}} {
		if _, _, err := decodeControl(bad); !errors.Is(err, fabric.ErrBadRequest) {
			t.Errorf("decodeControl(%x): %v", bad, err)
		}
	}
}

func FuzzDecodeControl(f *testing.F) {
	f.Add(resolveReq{id: 3, claim: fabric.Claim{Token: []byte("x")}, length: 10}.marshal())
	f.Add(doneMsg(7))
	f.Add(resolveResp{length: 5, keys: []regKey{{NIC: "n", RKey: 1, Addr: 2}}}.marshal())
	f.Fuzz(func(t *testing.T, p []byte) {
		if r, _, err := decodeControl(p); err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("untyped: %v", err)
			}
		} else if r != nil {
			again, _, err := decodeControl(r.marshal())
			if err != nil || again.id != r.id || again.offset != r.offset || again.length != r.length {
				t.Fatalf("re-encoding differs: %v", err)
			}
		}
		if resp, err := decodeResolveResp(p); err != nil {
			if !errors.Is(err, fabric.ErrCorrupt) {
				t.Fatalf("untyped: %v", err)
			}
		} else if len(resp.keys) > MaxRails {
			t.Fatalf("%d keys", len(resp.keys))
		}
	})
}
