package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []request{
		{op: opRead, claim: fabric.Claim{Object: fabric.ObjectID{1, 2}, Incarnation: 9, Token: []byte("tok")}, offset: 5, length: 1 << 40, have: 77},
		{op: opPush, claim: fabric.Claim{Object: fabric.ObjectID{3}}},
		{op: opRead, claim: fabric.Claim{Token: bytes.Repeat([]byte{7}, maxToken)}, offset: 1 << 62, length: 1 << 62},
	} {
		got, err := parseRequest(r.marshal())
		require.NoError(t, err)
		if len(r.claim.Token) == 0 {
			r.claim.Token = nil
		}
		assert.Equal(t, r, got)
	}
}

func TestParseRequestErrors(t *testing.T) {
	good := request{op: opRead, claim: fabric.Claim{Token: []byte("abc")}, length: 1}.marshal()
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"short", good[:requestFixed-1]},
		{"unknown op", append([]byte{9}, good[1:]...)},
		{"done is not a request", append([]byte{opDone}, good[1:]...)},
		{"token longer than the packet", good[:len(good)-1]},
		{"trailing bytes", append(append([]byte(nil), good...), 0)},
		{"token too long", request{op: opRead, claim: fabric.Claim{Token: make([]byte, maxToken+1)}}.marshal()},
		{"huge offset", request{op: opRead, offset: -1}.marshal()},
		{"huge length", request{op: opRead, length: 1<<62 + 1}.marshal()},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseRequest(c.p)
			require.ErrorIs(t, err, fabric.ErrBadRequest)
		})
	}
}

func TestParseReply(t *testing.T) {
	g := grant{flags: flagFD | flagCopy, mapID: 42, fileSize: 1 << 30, objOff: 4096, objLen: 1000, viewOff: 5000}
	got, err := parseReply(g.marshal())
	require.NoError(t, err)
	assert.Equal(t, g, got)

	for _, c := range []struct {
		name string
		p    []byte
		want error
	}{
		{"empty", nil, fabric.ErrCorrupt},
		{"short grant", g.marshal()[:grantLen-1], fabric.ErrCorrupt},
		{"flipped byte", flip(g.marshal(), 20), fabric.ErrCorrupt},
		{"object outside arena", grant{fileSize: 10, objOff: 8, objLen: 3}.marshal(), fabric.ErrCorrupt},
		{"unknown flags", grant{flags: 0x80}.marshal(), fabric.ErrCorrupt},
		{"view start past 2^62", grant{fileSize: 10, viewOff: -1}.marshal(), fabric.ErrCorrupt},
		{"hold without a slab", grant{fileSize: 10, objLen: 1, hold: 7}.marshal(), fabric.ErrCorrupt},
		{"slab and copy", grant{flags: flagSlab | flagCopy, fileSize: 10}.marshal(), fabric.ErrCorrupt},
		// Version 3 grants have no hold id: a view of a slab object would
		// not know how to give its range back.
		{"version 3 server", withVersion(g.marshal(), 3), fabric.ErrBadRequest},
		// Version 2 grants have no view start: a view's copy would be
		// read at the wrong place.
		{"version 2 server", withVersion(g.marshal(), 2), fabric.ErrBadRequest},
		// Version 1 servers acknowledged done; a client of version 2 sends
		// its next request without reading an ack, so it must refuse them.
		{"version 1 server", withVersion(g.marshal(), 1), fabric.ErrBadRequest},
		{"freed", refusal(fabric.ErrObjectFreed), fabric.ErrObjectFreed},
		{"unauthorized", refusal(fabric.ErrUnauthorized), fabric.ErrUnauthorized},
		{"stale", refusal(fabric.ErrStaleRef), fabric.ErrStaleRef},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseReply(c.p)
			require.ErrorIs(t, err, c.want)
		})
	}
	var re *peerauth.RemoteError
	_, err = parseReply(refusal(errors.New("disk on fire")))
	require.ErrorAs(t, err, &re)
	assert.Equal(t, peerauth.StatusInternal, re.Code)
}

func TestSlabGrantAndUnview(t *testing.T) {
	g := grant{flags: flagFD | flagSlab, mapID: 9, fileSize: 64 << 20, objOff: 1 << 20, objLen: 4096, hold: 77}
	got, err := parseReply(g.marshal())
	require.NoError(t, err)
	assert.Equal(t, g, got)
	id, err := parseUnview(unviewPacket(77))
	require.NoError(t, err)
	assert.EqualValues(t, 77, id)
	_, err = parseUnview(unviewPacket(77)[:5])
	require.ErrorIs(t, err, fabric.ErrBadRequest)
	r := request{op: opView, claim: fabric.Claim{Object: fabric.ObjectID{4}}, length: 10}
	back, err := parseRequest(r.marshal())
	require.NoError(t, err)
	assert.Equal(t, opView, back.op)
}

func flip(p []byte, i int) []byte { p[i] ^= 1; return p }

// withVersion rewrites a grant's version byte and its checksum.
func withVersion(p []byte, v byte) []byte {
	p[1] = v
	binary.BigEndian.PutUint32(p[grantLen-4:], crc32.Checksum(p[:grantLen-4], castagnoli))
	return p
}

func FuzzParseRequest(f *testing.F) {
	f.Add(request{op: opRead, claim: fabric.Claim{Object: fabric.ObjectID{1}, Incarnation: 2, Token: []byte("token")}, offset: 3, length: 4, have: 5}.marshal())
	f.Add(request{op: opPush}.marshal())
	f.Add([]byte{opDone, 0})
	f.Add(request{op: opView, length: 1}.marshal())
	f.Add(unviewPacket(3))
	f.Fuzz(func(t *testing.T, p []byte) {
		if id, err := parseUnview(p); err == nil && !bytes.Equal(unviewPacket(id), p) {
			t.Fatalf("unview %d does not round-trip", id)
		}
		r, err := parseRequest(p)
		if err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if r.offset < 0 || r.length < 0 || len(r.claim.Token) > maxToken {
			t.Fatalf("accepted a bad request %+v", r)
		}
		if !bytes.Equal(r.marshal(), p) {
			t.Fatalf("request does not round-trip: %x", p)
		}
		// The client encodes into a reused buffer: the same bytes.
		if prefix := []byte("xyz"); !bytes.Equal(r.appendTo(prefix)[len(prefix):], p) {
			t.Fatalf("appendTo differs from marshal: %x", p)
		}
	})
}

func FuzzParseReply(f *testing.F) {
	f.Add(grant{flags: flagFD, mapID: 1, fileSize: 1 << 20, objOff: 4096, objLen: 100}.marshal(), true)
	f.Add(refusal(fabric.ErrObjectFreed), false)
	f.Add([]byte{peerauth.StatusOK}, false)
	f.Fuzz(func(t *testing.T, p []byte, fixCRC bool) {
		if fixCRC && len(p) == grantLen {
			p = bytes.Clone(p) // the fuzzer's input is not ours to change
			// Reach the checks behind the checksum, which random bytes
			// almost never pass.
			binary.BigEndian.PutUint32(p[grantLen-4:], crc32.Checksum(p[:grantLen-4], castagnoli))
		}
		g, err := parseReply(p)
		if err != nil {
			return
		}
		if g.objOff < 0 || g.objLen < 0 || g.objOff+g.objLen > g.fileSize || g.flags&^flagFD != 0 {
			t.Fatalf("accepted an inconsistent grant %+v", g)
		}
		if !bytes.Equal(g.marshal(), p) {
			t.Fatalf("grant does not round-trip: %x", p)
		}
	})
}

func TestAnnounceRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slabs []announced
	}{
		{"none", nil},
		{"two", []announced{{mapID: 7, size: 64 << 20}, {mapID: 1 << 63, size: 4096}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := announcePacket(tc.slabs)
			got, err := parseAnnounce(p, len(tc.slabs))
			require.NoError(t, err)
			assert.Equal(t, len(tc.slabs), len(got))
			for i := range got {
				assert.Equal(t, tc.slabs[i], got[i])
			}
			_, err = parseAnnounce(p, len(tc.slabs)+1)
			assert.ErrorIs(t, err, fabric.ErrCorrupt, "descriptors must match the count")
		})
	}
	_, err := parseAnnounce(refusal(errNoScope), 0)
	assert.Error(t, err)
}

func FuzzParseAnnounce(f *testing.F) {
	f.Add(announcePacket([]announced{{mapID: 3, size: 1 << 20}}), 1, true)
	f.Add(announcePacket(nil), 0, false)
	f.Add(refusal(errNoScope), 0, false)
	f.Fuzz(func(t *testing.T, p []byte, nfds int, fixCRC bool) {
		if fixCRC && len(p) >= announceMin {
			p = bytes.Clone(p)
			binary.BigEndian.PutUint32(p[len(p)-4:], crc32.Checksum(p[:len(p)-4], castagnoli))
		}
		got, err := parseAnnounce(p, nfds)
		if err != nil {
			return
		}
		if len(got) != nfds || len(got) > maxAnnounce {
			t.Fatalf("accepted %d slabs with %d descriptors", len(got), nfds)
		}
		for _, a := range got {
			if a.mapID == 0 || a.size <= 0 {
				t.Fatalf("accepted slab %+v", a)
			}
		}
		if !bytes.Equal(announcePacket(got), p) {
			t.Fatalf("announcement does not round-trip: %x", p)
		}
	})
}
