package shm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

var goldenObj = fabric.ObjectID{0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xbb}

// The batch frames, byte for byte: a change of the encoding shows here.
func TestBatchFramesGolden(t *testing.T) {
	reqs := []request{
		{op: opRead, claim: fabric.Claim{Object: goldenObj, Incarnation: 7, Token: []byte("tk")}, offset: 1, length: 300, have: 9},
		{op: opRead, claim: fabric.Claim{Object: goldenObj, Incarnation: 1 << 60}},
	}
	items := []batchItem{
		{code: peerauth.StatusOK, g: grant{flags: flagFD, mapID: 5, fileSize: 8192, objOff: 4096, objLen: 300, viewOff: 0}},
		{code: peerauth.StatusFreed, text: "gone"},
	}
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"batch", appendBatch(nil, reqs),
			"06" + "0002" +
				"aa0102030405060708090a0b0c0d0ebb" + "0000000000000007" + "0000000000000001" + "000000000000012c" + "0000000000000009" + "02" + "746b" +
				"aa0102030405060708090a0b0c0d0ebb" + "1000000000000000" + "0000000000000000" + "0000000000000000" + "0000000000000000" + "00"},
		{"reply", marshalBatchReply(items, 1),
			"00" + "05" + "0002" + "0001" +
				"00" + "01" + "0000000000000005" + "0000000000002000" + "0000000000001000" + "000000000000012c" + "0000000000000000" +
				"02" + "04" + "676f6e65" +
				"b2fd3cac"},
		{"descriptors", fdsPacket(3), "07" + "0003"},
		// The push flag is the op: the items are encoded as for reads.
		{"push batch", appendBatch(nil, []request{{op: opPush, claim: fabric.Claim{Object: goldenObj, Incarnation: 7, Token: []byte("tk")}, offset: 1, length: 300, have: 9}}),
			"09" + "0001" +
				"aa0102030405060708090a0b0c0d0ebb" + "0000000000000007" + "0000000000000001" + "000000000000012c" + "0000000000000009" + "02" + "746b"},
	} {
		if h := hex.EncodeToString(c.got); h != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, h, c.want)
		}
	}
}

func TestBatchFramesRoundTrip(t *testing.T) {
	var reqs []request
	for i := range maxBatch {
		reqs = append(reqs, request{op: opRead, claim: fabric.Claim{Object: fabric.ObjectID{byte(i)}, Incarnation: uint64(i), Token: bytes.Repeat([]byte{byte(i)}, maxToken)},
			offset: 1 << 62, length: 1 << 62, have: uint64(i) << 40})
	}
	p := appendBatch(nil, reqs)
	require.LessOrEqual(t, len(p), maxBatchReq)
	got, err := parseBatch(p)
	require.NoError(t, err)
	assert.Equal(t, reqs, got)
	for i := range reqs {
		reqs[i].op = opPush // the same items as pushes: only the op differs
	}
	pp := appendBatch(nil, reqs)
	require.Equal(t, opBatchPush, pp[0])
	require.Equal(t, p[1:], pp[1:])
	got, err = parseBatch(pp)
	require.NoError(t, err)
	assert.Equal(t, reqs, got)

	var items []batchItem
	fds := 0
	for i := range maxBatch {
		if i%3 == 0 {
			items = append(items, batchItem{code: peerauth.StatusUnauthorized, text: string(bytes.Repeat([]byte{'x'}, maxItemText))})
			continue
		}
		g := grant{mapID: uint64(i), fileSize: 1 << 30, objOff: 4096, objLen: int64(i), viewOff: int64(i)}
		if i%2 == 0 {
			g.flags, fds = flagFD|flagSlab, fds+1
		}
		items = append(items, batchItem{code: peerauth.StatusOK, g: g})
	}
	r := marshalBatchReply(items, fds)
	require.LessOrEqual(t, len(r), maxBatchReply)
	back, n, err := parseBatchReply(r, maxBatch)
	require.NoError(t, err)
	assert.Equal(t, fds, n)
	assert.Equal(t, items, back)
	require.ErrorIs(t, back[0].err(), fabric.ErrUnauthorized)
	require.NoError(t, back[1].err())
}

func TestParseBatchErrors(t *testing.T) {
	one := appendBatch(nil, []request{{op: opRead, claim: fabric.Claim{Token: []byte("abc")}, length: 1}})
	count := func(p []byte, n uint16) []byte {
		p = bytes.Clone(p)
		binary.BigEndian.PutUint16(p[1:3], n)
		return p
	}
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"not a batch", request{op: opRead}.marshal()},
		{"no items", count(one, 0)},
		{"more items than a batch may have", count(append(bytes.Clone(one), make([]byte, 300*batchItemMin)...), maxBatch+1)},
		{"more items than the packet holds", count(one, 2)},
		{"absurd count", count(one, 0xffff)},
		{"token longer than the packet", one[:len(one)-1]},
		{"trailing bytes", append(bytes.Clone(one), 0)},
		{"token too long", func() []byte { p := bytes.Clone(one); p[batchHead+batchItemMin-1] = maxToken + 1; return p }()},
		{"huge range", appendBatch(nil, []request{{op: opRead, offset: -1}})},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseBatch(c.p)
			require.ErrorIs(t, err, fabric.ErrBadRequest)
		})
	}
	// An absurd count is refused before anything is allocated for it.
	absurd := count(one, 0xffff)
	allocs := testing.AllocsPerRun(100, func() { parseBatch(absurd) })
	assert.LessOrEqual(t, allocs, 4.0, "allocations to refuse a count of 65535")
}

func TestParseBatchReplyErrors(t *testing.T) {
	items := []batchItem{{code: peerauth.StatusOK, g: grant{flags: flagFD, mapID: 1, fileSize: 10, objLen: 10}}, {code: peerauth.StatusFreed, text: "x"}}
	good := marshalBatchReply(items, 1)
	_, _, err := parseBatchReply(good, 2)
	require.NoError(t, err)
	// recrc rewrites a reply's checksum, to reach the checks behind it.
	recrc := func(p []byte) []byte {
		p = bytes.Clone(p)
		binary.BigEndian.PutUint32(p[len(p)-4:], crc32.Checksum(p[:len(p)-4], castagnoli))
		return p
	}
	set := func(i int, b byte) []byte { p := bytes.Clone(good); p[i] = b; return recrc(p) }
	for _, c := range []struct {
		name string
		p    []byte
		want int
		err  error
	}{
		{"empty", nil, 2, fabric.ErrCorrupt},
		{"short", good[:replyHead], 2, fabric.ErrCorrupt},
		{"flipped byte", flip(bytes.Clone(good), 12), 2, fabric.ErrCorrupt},
		{"fewer items than asked", good, 3, fabric.ErrCorrupt},
		{"more descriptors than announced", marshalBatchReply(items, 0), 2, fabric.ErrCorrupt},
		{"descriptors beyond the items", marshalBatchReply(items, 3), 2, fabric.ErrCorrupt},
		{"version 4", set(1, 4), 2, fabric.ErrBadRequest},
		{"object outside its file", marshalBatchReply([]batchItem{{g: grant{fileSize: 10, objOff: 8, objLen: 3}}}, 0), 1, fabric.ErrCorrupt},
		{"unknown flags", marshalBatchReply([]batchItem{{g: grant{flags: 0x80 | flagDevice>>1}}}, 0), 1, fabric.ErrCorrupt},
		{"message longer than the reply", set(replyHead+itemGrantLen+1, 200), 2, fabric.ErrCorrupt},
		{"trailing bytes", recrc(append(good[:len(good)-4:len(good)-4], 0, 0, 0, 0, 0)), 2, fabric.ErrCorrupt},
		{"whole batch refused", refusal(fabric.ErrBadRequest), 2, fabric.ErrBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := parseBatchReply(c.p, c.want)
			require.ErrorIs(t, err, c.err)
		})
	}
	for _, p := range [][]byte{nil, {opFDs, 0, 0}, {opFDs, 0, 254}, {opDone, 0, 1}, {opFDs, 0, 1, 0}} {
		_, err := parseFDs(p)
		require.ErrorIs(t, err, fabric.ErrCorrupt, "%x", p)
	}
	n, err := parseFDs(fdsPacket(maxFDsPerPacket))
	require.NoError(t, err)
	assert.Equal(t, maxFDsPerPacket, n)
}

func FuzzParseBatch(f *testing.F) {
	f.Add(appendBatch(nil, []request{{op: opRead, claim: fabric.Claim{Object: goldenObj, Incarnation: 2, Token: []byte("token")}, offset: 3, length: 4, have: 5}}))
	f.Add(appendBatch(nil, []request{{op: opRead}, {op: opRead, length: 1}}))
	f.Add([]byte{opBatch, 0xff, 0xff})
	f.Add(appendBatch(nil, []request{{op: opPush, claim: fabric.Claim{Object: goldenObj, Incarnation: 2, Token: []byte("t")}, length: 4}, {op: opPush}}))
	f.Add([]byte{opBatchPush, 0, 1})
	f.Fuzz(func(t *testing.T, p []byte) {
		reqs, err := parseBatch(p)
		if err != nil {
			if !errors.Is(err, fabric.ErrBadRequest) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(reqs) == 0 || len(reqs) > maxBatch {
			t.Fatalf("accepted a batch of %d items", len(reqs))
		}
		op := opRead
		if p[0] == opBatchPush {
			op = opPush // the push flag: every item a push, none a read
		}
		for _, r := range reqs {
			if r.op != op || r.offset < 0 || r.length < 0 || len(r.claim.Token) > maxToken {
				t.Fatalf("accepted a bad item %+v", r)
			}
		}
		if !bytes.Equal(appendBatch(nil, reqs), p) {
			t.Fatalf("batch does not round-trip: %x", p)
		}
	})
}

func FuzzParseBatchReply(f *testing.F) {
	f.Add(marshalBatchReply([]batchItem{{g: grant{flags: flagFD, mapID: 1, fileSize: 1 << 20, objOff: 4096, objLen: 100}}, {code: peerauth.StatusFreed, text: "freed"}}, 1), 2, true)
	f.Add(refusal(fabric.ErrObjectFreed), 1, false)
	f.Add([]byte{peerauth.StatusOK, batchVersion, 0, 1, 0, 0}, 1, true)
	f.Fuzz(func(t *testing.T, p []byte, want int, fixCRC bool) {
		if fixCRC && len(p) >= 4 {
			p = bytes.Clone(p)
			binary.BigEndian.PutUint32(p[len(p)-4:], crc32.Checksum(p[:len(p)-4], castagnoli))
		}
		items, fds, err := parseBatchReply(p, want)
		if err != nil {
			var re *peerauth.RemoteError
			if !errors.Is(err, fabric.ErrCorrupt) && !errors.Is(err, fabric.ErrBadRequest) && !errors.As(err, &re) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(items) != want || fds > len(items) {
			t.Fatalf("%d items (%d descriptors) for %d claims", len(items), fds, want)
		}
		for _, it := range items {
			g := it.g
			if it.code == peerauth.StatusOK && (g.objOff < 0 || g.objLen < 0 || g.objOff+g.objLen > g.fileSize || g.hold != 0) {
				t.Fatalf("accepted an inconsistent grant %+v", g)
			}
		}
		if !bytes.Equal(marshalBatchReply(items, fds), p) {
			t.Fatalf("reply does not round-trip: %x", p)
		}
	})
}
